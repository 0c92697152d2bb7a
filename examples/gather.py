"""gather: the root receives every rank's block, concatenated in rank order.

Rank r sends COUNT float64 values seeded by r; only rank 0 (the root) passes a
receive buffer and checks it against the blocks it rebuilds itself.

    uniccl run -n 4 examples/gather.py
"""

import sys

import numpy as np

import uniccl

COUNT = 500


def data(rank):
    """Rank ``rank``'s block, reproducible from the rank alone."""
    return np.random.default_rng(rank).standard_normal(COUNT)


comm = uniccl.init()
r, n = comm.rank, comm.size
root = 0

gathered = np.empty((n, COUNT)) if r == root else None  # only the root receives
comm.gather(data(r), gathered, root=root)

bad = []
if r == root:
    bad = [k for k in range(n) if not np.array_equal(gathered[k], data(k))]
ok = not bad
print(f"rank {r}/{n}: gather " + ("OK" if ok else f"MISMATCH in the blocks of ranks {bad}"), flush=True)
comm.destroy()
sys.exit(0 if ok else 1)
