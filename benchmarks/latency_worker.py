"""One rank of benchmarks/compare.py's latency sweep (``--latency``): small-message time per
call of every collective, plain and persistent, for uniccl or for the MPI under it (mpi4py).

    mpiexec -n N python latency_worker.py uniccl|mpi SIZES OUT.json

SIZES: comma list of bytes.  For each collective, size and form (``call``: the ordinary
call; ``persistent``: uniccl's ``*_init`` / MPI 4's ``MPI_*_init``, then start + wait) on
buffers made once: warm-up calls, then BLOCKS blocks of back-to-back calls, each block after
a barrier; a rank's figure is its median block's time per call, and the row is the mean
over ranks.  Size is the buffer every rank sends for all_reduce, broadcast and reduce, the
receive buffer of all_gather and gather, the send buffer of reduce_scatter, all_to_all and
scatter (float32, sum, root 0; a block of at least one element per rank).  Rank 0 writes
OUT: {"library": ..., "rows": [[collective, size, form, us], ...]}.
"""

import json
import statistics
import sys
import time

import numpy as np

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce", "all_to_all", "gather", "scatter")
BLOCKS, WARMUP = 7, 200
ROOT = 0


def calls_per_block(size: int) -> int:
    return 1000 if size <= 4096 else 300


class Uniccl:
    def __init__(self):
        import uniccl

        self.comm = uniccl.init()
        self.rank, self.size = self.comm.rank, self.comm.size
        self.library = f"uniccl {uniccl.__version__} (transport {self.comm._tuner.transport})"

    def forms(self, coll, s, r, blk):
        c = self.comm
        args = {
            "all_reduce": (s, r),
            "all_gather": (s[:blk], r),
            "reduce_scatter": (s, r[:blk]),
            "broadcast": (r,),
            "reduce": (s, r),
            "all_to_all": (s, r),
            "gather": (s[:blk], r if c.rank == ROOT else None),
            "scatter": (s if c.rank == ROOT else None, r[:blk]),
        }[coll]
        call = getattr(c, coll)
        req = getattr(c, f"{coll}_init")(*args)
        return (lambda: call(*args)), req.start, req.wait, req.free

    def barrier(self):
        self.comm.barrier()

    def mean(self, value):
        return sum(self.comm.all_gather_object(value)) / self.size


class Mpi:
    def __init__(self):
        from mpi4py import MPI

        self.MPI, self.comm = MPI, MPI.COMM_WORLD
        self.rank, self.size = self.comm.rank, self.comm.size
        # (Open MPI's version string ends with a NUL)
        self.library = MPI.Get_library_version().replace("\x00", "").strip().splitlines()[0]

    def forms(self, coll, s, r, blk):
        c, SUM = self.comm, self.MPI.SUM
        name, args = {
            "all_reduce": ("Allreduce", (s, r, SUM)),
            "all_gather": ("Allgather", (s[:blk], r)),
            "reduce_scatter": ("Reduce_scatter_block", (s, r[:blk], SUM)),
            "broadcast": ("Bcast", (r, ROOT)),
            "reduce": ("Reduce", (s, r, SUM, ROOT)),
            "all_to_all": ("Alltoall", (s, r)),
            "gather": ("Gather", (s[:blk], r, ROOT)),
            "scatter": ("Scatter", (s, r[:blk], ROOT)),
        }[coll]
        call = getattr(c, name)
        req = getattr(c, f"{name}_init")(*args)
        return (lambda: call(*args)), req.Start, req.Wait, req.Free

    def barrier(self):
        self.comm.Barrier()

    def mean(self, value):
        return self.comm.allreduce(value) / self.size


def timed(lib, fn, k):
    for _ in range(WARMUP):
        fn()
    blocks = []
    for _ in range(BLOCKS):
        lib.barrier()
        t0 = time.perf_counter()
        for _ in range(k):
            fn()
        blocks.append((time.perf_counter() - t0) / k * 1e6)
    return lib.mean(statistics.median(blocks))


def main():
    which, sizes, out = sys.argv[1], [int(x) for x in sys.argv[2].split(",")], sys.argv[3]
    lib = Uniccl() if which == "uniccl" else Mpi()
    n, rows = lib.size, []
    for coll in COLLECTIVES:
        for size in sizes:
            blk = max(
                1,
                size // 4 // (n if coll in ("all_gather", "reduce_scatter", "all_to_all", "gather", "scatter") else 1),
            )
            total = blk * n if coll in ("all_gather", "reduce_scatter", "all_to_all", "gather", "scatter") else blk
            s, r = np.ones(total, np.float32), np.zeros(total, np.float32)
            call, start, wait, free = lib.forms(coll, s, r, blk)
            k = calls_per_block(size)

            def persistent(start=start, wait=wait):
                start()
                wait()

            rows.append([coll, size, "call", timed(lib, call, k)])
            rows.append([coll, size, "persistent", timed(lib, persistent, k)])
            free()
    if lib.rank == 0:
        with open(out, "w") as f:
            json.dump({"library": lib.library, "ranks": n, "rows": rows}, f)


if __name__ == "__main__":
    main()
