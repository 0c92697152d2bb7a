"""What the always-on mismatch check costs: the per-call agreement (every rank's operation,
dtype, count, op and root exchanged and compared before any data moves) timed alone, against
the whole all_reduce it guards.

usage: uniccl run -n 4 python benchmarks/check_cost.py [BYTES]   (default 1 MiB; UNICCL_TRANSPORT=tcp for TCP)
Rank 0 prints one line: median microseconds of the agreement and of the all_reduce, and the ratio.
"""
import statistics
import sys
import time

import numpy as np

import uniccl
from uniccl._communicator import Plan

nbytes = int(sys.argv[1]) if len(sys.argv) > 1 else 1 << 20
comm = uniccl.init()
x = np.ones(nbytes // 4, np.float32)
plan = Plan("all_reduce", int(uniccl.DType.FLOAT32), x.size, int(uniccl.SUM))
reps, inner = 15, 50


def timed(fn) -> float:
    out = []
    for _ in range(reps):
        comm.barrier()
        t = time.perf_counter()
        for _ in range(inner):
            fn()
        out.append((time.perf_counter() - t) / inner * 1e6)
    return statistics.median(out)


for _ in range(20):
    comm.all_reduce(x)
agree = timed(lambda: comm._agree(plan, 0))
full = timed(lambda: comm.all_reduce(x))
if comm.rank == 0:
    transport = "shm" if comm._engine is not None else comm._t.name
    print(f"{comm.size} ranks, {transport}, {nbytes} B all_reduce: agreement {agree:.1f} us, "
          f"all_reduce {full:.1f} us, check = {100 * agree / full:.2f}% of the call", flush=True)
comm.destroy()
