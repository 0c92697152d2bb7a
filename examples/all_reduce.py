"""all_reduce: every rank ends up with the element-wise reduction of all ranks' arrays.

Shows an in-place SUM and an out-of-place MAX.  Each rank's input is random data
seeded by its rank, so every rank can rebuild all inputs and check the result
against a float64 numpy reference.

    uniccl run -n 4 examples/all_reduce.py
"""

import sys

import numpy as np

import uniccl

COUNT = 1000


def data(rank):
    """Rank ``rank``'s input, reproducible from the rank alone."""
    return np.random.default_rng(rank).standard_normal(COUNT).astype(np.float32)


comm = uniccl.init()
r, n = comm.rank, comm.size

x = data(r)
comm.all_reduce(x, op=uniccl.SUM)  # in place: x becomes the sum
biggest = np.zeros(COUNT, np.float32)
comm.all_reduce(data(r), biggest, op=uniccl.MAX)  # out of place

inputs = np.array([data(k) for k in range(n)], np.float64)
sum_err = np.abs(x - inputs.sum(axis=0)).max()
ok = sum_err < 1e-4 * n and np.array_equal(biggest, inputs.max(axis=0))
print(
    f"rank {r}/{n}: all_reduce "
    + ("OK" if ok else f"MISMATCH (sum error {sum_err:.3g}, max equal: {np.array_equal(biggest, inputs.max(axis=0))})"),
    flush=True,
)
comm.destroy()
sys.exit(0 if ok else 1)
