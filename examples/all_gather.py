"""all_gather: every rank receives every rank's block, concatenated in rank order.

Rank r contributes COUNT values seeded by r; the result on every rank is the
size x COUNT array of all contributions, checked against numpy.

    uniccl run -n 4 examples/all_gather.py
"""

import sys

import numpy as np

import uniccl

COUNT = 500


def data(rank):
    """Rank ``rank``'s block, reproducible from the rank alone."""
    return np.random.default_rng(rank).standard_normal(COUNT).astype(np.float32)


comm = uniccl.init()
r, n = comm.rank, comm.size

gathered = np.empty(n * COUNT, np.float32)
comm.all_gather(data(r), gathered)

expected = np.concatenate([data(k) for k in range(n)]).astype(np.float64)
ok = np.array_equal(gathered.astype(np.float64), expected)  # pure copies: exact
bad = [k for k in range(n) if not np.array_equal(gathered[k * COUNT : (k + 1) * COUNT], data(k))]
print(f"rank {r}/{n}: all_gather " + ("OK" if ok else f"MISMATCH in the blocks of ranks {bad}"), flush=True)
comm.destroy()
sys.exit(0 if ok else 1)
