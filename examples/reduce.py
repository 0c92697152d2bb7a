"""reduce: the element-wise reduction of all ranks' arrays lands on the root only.

Rank r contributes int64 values seeded by r; root (rank size // 2) gets their SUM
in its receive buffer and checks it exactly; every rank checks that its send
buffer was left untouched (the reduction is out of place).

    uniccl run -n 4 examples/reduce.py
"""

import sys

import numpy as np

import uniccl

COUNT = 1000


def data(rank):
    """Rank ``rank``'s contribution, reproducible from the rank alone."""
    return np.random.default_rng(rank).integers(-1000, 1000, COUNT, dtype=np.int64)


comm = uniccl.init()
r, n = comm.rank, comm.size
root = n // 2

send = data(r)
result = np.zeros(COUNT, np.int64) if r == root else None  # only the root needs one
comm.reduce(send, result, op=uniccl.SUM, root=root)

ok = np.array_equal(send, data(r))
if r == root:
    expected = np.sum([data(k) for k in range(n)], axis=0)
    ok = ok and np.array_equal(result, expected)
print(
    f"rank {r}/{n}: reduce " + ("OK" if ok else "MISMATCH (wrong sum on the root or send buffer changed)"), flush=True
)
comm.destroy()
sys.exit(0 if ok else 1)
