"""Per-call time of an 8-byte all_reduce on the default path (``uniccl run``: shared memory),
for A/B checks of the call path between two builds.

    uniccl run -n 2 python benchmarks/small_call.py

500 warm-up calls, then 7 blocks of 3000; rank 0 prints the median block's microseconds per
call.  To compare with another commit, build it (``pip wheel --no-deps -w DIR .``), unpack the
wheel into a folder and run the same command with ``PYTHONPATH=<folder>``, alternating runs.
"""

import statistics
import time

import numpy as np

import uniccl

with uniccl.init() as comm:
    x = np.ones(2, np.float32)
    for _ in range(500):
        comm.all_reduce(x)
    blocks = []
    for _ in range(7):
        comm.barrier()
        t0 = time.perf_counter()
        for _ in range(3000):
            comm.all_reduce(x)
        blocks.append((time.perf_counter() - t0) / 3000 * 1e6)
    if comm.rank == 0:
        print(f"{uniccl.__file__}: median {statistics.median(blocks):.2f} us per 8-byte all_reduce", flush=True)
