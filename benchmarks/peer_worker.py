"""One rank of a peer library's sweep for benchmarks/compare.py (not uniccl: that one
runs through ``uniccl bench``).

    mpiexec -n N python peer_worker.py SPEC.json OUT.json          # spec backend "mpi"
    RANK=.. WORLD_SIZE=.. MASTER_ADDR=.. MASTER_PORT=.. python peer_worker.py SPEC OUT  # "gloo"

SPEC: {"backend": "mpi"|"gloo", "collectives": {name: [[nbytes, total, count, iters,
warmup], ...]}} with the rows already planned by compare.py (the same rounding as
``uniccl bench``).  Timing is ``uniccl bench``'s (nccl-tests'): warm up, barrier, time
``iters`` back-to-back calls, mean per call, then the mean over ranks.  Buffers are
allocated once at the largest size and written (not left as lazily mapped zero pages)
so every call reads real memory.  Rank 0 rewrites OUT after every collective, so a
timeout still leaves the finished ones; a collective that raises on every rank (an API
the backend lacks) is recorded as an error and the sweep goes on.
"""

import json
import os
import sys
import time

import numpy as np

ROOT = 0


class Mpi:
    """mpi4py buffer-interface collectives (MPI_Allreduce & co.), out of place."""

    def __init__(self):
        from mpi4py import MPI

        self.MPI, self.comm = MPI, MPI.COMM_WORLD
        self.rank, self.size = self.comm.rank, self.comm.size
        self.library = MPI.Get_library_version().strip().splitlines()[0]
        self.notes = {}

    def buffers(self, n):
        send, recv = np.empty(n, np.float32), np.empty(n, np.float32)
        send.fill(1.0)
        recv.fill(0.0)
        return send, recv

    def call(self, collective, send, recv, total, count):
        c, SUM = self.comm, self.MPI.SUM
        s, r = send[:total], recv[:total]
        return {
            "all_reduce": lambda: c.Allreduce(s, r, SUM),
            "all_gather": lambda: c.Allgather(send[:count], r),
            "reduce_scatter": lambda: c.Reduce_scatter_block(s, recv[:count], SUM),
            "broadcast": lambda: c.Bcast(r, ROOT),
            "reduce": lambda: c.Reduce(s, r, SUM, ROOT),
            "all_to_all": lambda: c.Alltoall(s, r),
        }[collective]

    def barrier(self):
        self.comm.Barrier()

    def mean(self, value):
        return self.comm.allreduce(value) / self.size

    def finish(self):
        pass


class Gloo:
    """torch.distributed on the gloo backend (env:// rendezvous).  torch has no
    out-of-place all_reduce/reduce/broadcast: those run in place on a zero buffer
    (zeros stay zeros, so values never grow)."""

    def __init__(self):
        import torch
        import torch.distributed as dist

        torch.set_num_threads(1)  # gloo does its own work; torch's pool only competes for 2 cores
        dist.init_process_group("gloo")
        self.torch, self.dist = torch, dist
        self.rank, self.size = dist.get_rank(), dist.get_world_size()
        self.library = f"torch {torch.__version__} gloo"
        self.notes = {}

    def buffers(self, n):
        t = self.torch
        return t.empty(n, dtype=t.float32).fill_(1.0), t.empty(n, dtype=t.float32).fill_(0.0)

    def call(self, collective, send, recv, total, count):
        d, SUM = self.dist, self.dist.ReduceOp.SUM
        s, r = send[:total], recv[:total]
        # torch 2.13 renamed the single-tensor forms *_single (the *_tensor names warn)
        gather = getattr(d, "all_gather_single", None) or d.all_gather_into_tensor
        scatter = getattr(d, "reduce_scatter_single", None) or d.reduce_scatter_tensor
        if collective == "all_gather":
            return self._fallback(
                collective,
                lambda: gather(r, send[:count]),
                lambda: d.all_gather(list(r.chunk(self.size)), send[:count]),
                "all_gather (list of views)",
            )
        if collective == "reduce_scatter":
            return self._fallback(
                collective,
                lambda: scatter(recv[:count], s, SUM),
                lambda: d.reduce_scatter(recv[:count], list(s.chunk(self.size)), SUM),
                "reduce_scatter (list of views)",
            )
        return {
            "all_reduce": lambda: d.all_reduce(r, SUM),
            "broadcast": lambda: d.broadcast(r, ROOT),
            "reduce": lambda: d.reduce(r, ROOT, SUM),
            "all_to_all": lambda: d.all_to_all_single(r, s),
        }[collective]

    def _fallback(self, collective, tensor_api, list_api, what):
        """The single-tensor API, or the list API where gloo lacks it (noted in the output).
        Probed once per collective with a real call: it fails the same way on every rank."""
        if collective not in self.notes:
            try:
                tensor_api()
                self.notes[collective] = None
            except (RuntimeError, NotImplementedError) as exc:
                self.notes[collective] = f"gloo lacks the single-tensor API ({_short(exc)}): timed {what}"
        return list_api if self.notes[collective] else tensor_api

    def barrier(self):
        self.dist.barrier()

    def mean(self, value):
        t = self.torch.tensor([value], dtype=self.torch.float64)
        self.dist.all_reduce(t)
        return float(t[0]) / self.size

    def finish(self):
        self.dist.destroy_process_group()


def _short(exc):
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:160]


def time_loop(be, run, iters, warmup):
    for _ in range(warmup):
        run()
    be.barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        run()
    return (time.perf_counter() - t0) / iters


def main():
    spec_path, out_path = sys.argv[1], sys.argv[2]
    with open(spec_path) as f:
        spec = json.load(f)
    be = Gloo() if spec["backend"] == "gloo" else Mpi()
    most = max(row[1] for rows in spec["collectives"].values() for row in rows)
    send, recv = be.buffers(most)
    result = {"library": be.library, "nranks": be.size, "rows": [], "errors": {}, "notes": be.notes}
    for collective, rows in spec["collectives"].items():
        try:
            for nbytes, total, count, iters, warmup in rows:
                run = be.call(collective, send, recv, total, count)
                sec = be.mean(time_loop(be, run, iters, warmup))
                result["rows"].append(
                    {
                        "collective": collective,
                        "size": nbytes,
                        "count": count,
                        "time_us": sec * 1e6,
                        "algbw": nbytes / sec / 1e9,
                    }
                )
        except (
            Exception
        ) as exc:  # the same on every rank (an unsupported call); a one-rank failure hangs, and the timeout catches it
            result["errors"][collective] = _short(exc)
            be.barrier()
        if be.rank == 0:
            with open(out_path + ".tmp", "w") as f:
                json.dump(result, f)
            os.replace(out_path + ".tmp", out_path)
    be.finish()


if __name__ == "__main__":
    main()
