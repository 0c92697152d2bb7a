"""What the MPI transport's deadline-bounded waits cost (MPI has no timed wait: with a timeout
uniccl polls its requests against the deadline; with timeout=0 it calls MPI_Wait as before).

    UNICCL_TRANSPORT=mpi mpiexec -n 2 python benchmarks/mpi_wait_cost.py

all_reduce of 8 B and 1 MiB, the two arms in alternating blocks, three blocks each; rank 0
prints each arm's per-call median in microseconds and the blocks' values.
"""

import statistics
import time

import numpy as np

import uniccl

comm = uniccl.init()
res = {}
for size in (8, 1 << 20):
    x = np.ones(max(1, size // 8))
    for arm in ("wait", "poll") * 3:
        t = 0 if arm == "wait" else 120
        n = 2000 if size == 8 else 200
        for _ in range(20):
            comm.all_reduce(x, timeout=t)
        comm.barrier()
        t0 = time.perf_counter()
        for _ in range(n):
            comm.all_reduce(x, timeout=t)
        dt = (time.perf_counter() - t0) / n * 1e6
        res.setdefault((size, arm), []).append(dt)
if comm.rank == 0:
    for (size, arm), v in sorted(res.items()):
        print(size, arm, "median us", round(statistics.median(v), 2), [round(a, 1) for a in v])
