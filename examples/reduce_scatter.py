"""reduce_scatter: sum every rank's array, then rank i keeps only block i of the sum.

Each rank sends size x COUNT values (seeded by its rank) and receives COUNT:
block r of the element-wise sum over all ranks, checked against numpy in float64.

    uniccl run -n 4 examples/reduce_scatter.py
"""

import sys

import numpy as np

import uniccl

COUNT = 500


def data(rank, size):
    """Rank ``rank``'s send buffer, reproducible from the rank alone."""
    return np.random.default_rng(rank).standard_normal(size * COUNT).astype(np.float32)


comm = uniccl.init()
r, n = comm.rank, comm.size

mine = np.empty(COUNT, np.float32)
comm.reduce_scatter(data(r, n), mine, op=uniccl.SUM)

total = np.sum([data(k, n).astype(np.float64) for k in range(n)], axis=0)
expected = total[r * COUNT : (r + 1) * COUNT]
err = np.abs(mine - expected).max()
ok = err < 1e-4 * n
print(f"rank {r}/{n}: reduce_scatter " + ("OK" if ok else f"MISMATCH (max error {err:.3g})"), flush=True)
comm.destroy()
sys.exit(0 if ok else 1)
