"""Data-parallel training of a linear model: gradients averaged with all_reduce.

Every rank builds the same synthetic regression dataset from a seed, keeps only
its shard of the rows, and runs STEPS of full-batch gradient descent on the mean
squared error.  Each step, the shard gradients (each scaled by 1/N, so their sum
is the full-data average) are summed with all_reduce and every rank applies the
same update in float32.  The final weights must match a single-process float64
run on the whole dataset, and the loss must have gone down.

    uniccl run -n 4 examples/train_linear.py
"""

import sys

import numpy as np

import uniccl

N, D, STEPS, LR = 1000, 8, 50, 0.1


def dataset():
    """The full dataset, identical on every rank: y = X w_true + noise."""
    rng = np.random.default_rng(42)
    x = rng.standard_normal((N, D))
    return x, x @ rng.standard_normal(D) + 0.01 * rng.standard_normal(N)


def reference(x, y):
    """Single-process float64 gradient descent on the whole dataset."""
    w = np.zeros(D)
    for _ in range(STEPS):
        w -= LR * 2 / N * x.T @ (x @ w - y)
    return w


comm = uniccl.init()
r, n = comm.rank, comm.size
x_all, y_all = dataset()
rows = np.array_split(np.arange(N), n)[r]  # this rank's shard (sizes may differ by one)
x, y = x_all[rows].astype(np.float32), y_all[rows].astype(np.float32)

w = np.zeros(D, np.float32)
losses = []
for _ in range(STEPS):
    err = x @ w - y
    grad = (2 / N) * (x.T @ err)  # this shard's share of the mean gradient
    loss = np.array([err @ err / N], np.float32)  # this shard's share of the mean loss
    comm.all_reduce(grad)  # sum of shares = full-data gradient
    comm.all_reduce(loss)
    w -= LR * grad
    losses.append(float(loss[0]))

w_ref = reference(x_all, y_all)
w_err = np.abs(w - w_ref).max()
ok = w_err < 1e-4 and losses[-1] < 0.01 * losses[0]
print(
    f"rank {r}/{n}: train_linear "
    + ("OK" if ok else "MISMATCH")
    + f" (loss {losses[0]:.3f} -> {losses[-1]:.5f}, max weight error vs float64 {w_err:.2g})",
    flush=True,
)
comm.destroy()
sys.exit(0 if ok else 1)
