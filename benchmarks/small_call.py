"""Per-call time of an 8-byte all_reduce on the default path (``uniccl run``: shared memory),
for A/B checks of the call path between two builds, beside the shared-memory engine's own
Python method on the same buffer in the same processes (what the API's overhead is measured
over; since 2026-12-05 the compiled API is the cheaper of the two: the method parses Python
arguments the compiled path has already checked), and a persistent all_reduce (``comm.all_reduce_init``: ``start()`` then ``wait()``) where the
build has one.

    uniccl run -n 2 python benchmarks/small_call.py

500 warm-up calls, then 7 blocks of 3000 of each, alternating; rank 0 prints the median
block's microseconds per call.  To compare with another commit, build it (``pip wheel
--no-deps -w DIR .``), unpack the wheel into a folder and run the same command with
``PYTHONPATH=<folder>``, alternating runs.
"""

import statistics
import time

import numpy as np

import uniccl
from uniccl._types import DType, ReduceOp

CALLS = 3000

with uniccl.init() as comm:
    x = np.ones(2, np.float32)
    ptr = x.ctypes.data
    engine = comm._engine

    def api():
        for _ in range(CALLS):
            comm.all_reduce(x)

    def bare():
        for _ in range(CALLS):
            engine.all_reduce(ptr, ptr, 2, int(DType.FLOAT32), int(ReduceOp.SUM))

    req = comm.all_reduce_init(x) if hasattr(comm, "all_reduce_init") else None

    def persistent():
        start, wait = req.start, req.wait
        for _ in range(CALLS):
            start()
            wait()

    for _ in range(500):
        comm.all_reduce(x)
    blocks = {"api": [], "engine": [], "persistent": []}
    for _ in range(7):
        for name, fn in (("api", api), ("engine", bare), ("persistent", persistent)):
            if (name == "engine" and engine is None) or (name == "persistent" and req is None):
                continue
            comm.barrier()
            t0 = time.perf_counter()
            fn()
            blocks[name].append((time.perf_counter() - t0) / CALLS * 1e6)
    if comm.rank == 0:
        a = statistics.median(blocks["api"])
        line = f"{uniccl.__file__}: median {a:.2f} us per 8-byte all_reduce"
        if blocks["engine"]:
            e = statistics.median(blocks["engine"])
            line += f"; the engine's own call {e:.2f} us; the API adds {a - e:.2f} us"
        if blocks["persistent"]:
            line += f"; persistent start+wait {statistics.median(blocks['persistent']):.2f} us"
        print(line, flush=True)
