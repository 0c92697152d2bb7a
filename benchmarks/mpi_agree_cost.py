"""What the MPI transport's per-call agreement could cost: an MPI Allgather of the 8-word record
(what it does) against an Allreduce of two words with MPI.BOR (x and ~x: equal everywhere iff
both come back unchanged) and with MPI.MAX, each timed over 20 000 calls of mpi4py.

usage: mpiexec -n N python benchmarks/mpi_agree_cost.py   (rank 0 prints microseconds per call, twice)
"""

import time

import numpy as np
from mpi4py import MPI

comm = MPI.COMM_WORLD.Dup()
record, records = np.arange(8, dtype=np.int64), np.empty((comm.size, 8), np.int64)
pair, out = np.arange(2, dtype=np.int64), np.empty(2, np.int64)


def per_call(fn, calls=20000) -> float:
    for _ in range(200):
        fn()
    comm.Barrier()
    t = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - t) / calls * 1e6


for _ in range(2):
    gather = per_call(lambda: comm.Allgather(record, records))
    bor = per_call(lambda: comm.Allreduce(pair, out, MPI.BOR))
    mx = per_call(lambda: comm.Allreduce(pair, out, MPI.MAX))
    if comm.rank == 0:
        print(
            f"{comm.size} ranks: Allgather of the record {gather:.2f} us, Allreduce BOR {bor:.2f} us, "
            f"Allreduce MAX {mx:.2f} us",
            flush=True,
        )
