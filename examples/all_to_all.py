"""all_to_all: block j of rank i's send buffer becomes block i of rank j's receive buffer.

Like a distributed matrix transpose: rank i sends size blocks of COUNT values,
block j to rank j, and receives one block from every rank in rank order.

    uniccl run -n 4 examples/all_to_all.py
"""

import sys

import numpy as np

import uniccl

COUNT = 250


def data(rank, size):
    """Rank ``rank``'s send buffer as size x COUNT blocks, reproducible from the rank."""
    return np.random.default_rng(rank).standard_normal((size, COUNT))


comm = uniccl.init()
r, n = comm.rank, comm.size

received = np.empty((n, COUNT))
comm.all_to_all(data(r, n), received)

expected = np.array([data(k, n)[r] for k in range(n)])  # block r of every rank
bad = [k for k in range(n) if not np.array_equal(received[k], expected[k])]
ok = not bad
print(f"rank {r}/{n}: all_to_all " + ("OK" if ok else f"MISMATCH in the blocks from ranks {bad}"), flush=True)
comm.destroy()
sys.exit(0 if ok else 1)
