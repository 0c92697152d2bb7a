"""A deliberately wrong example: its all_reduce check expects one more than the true sum,
so it prints a mismatch and exits 1 on every rank.  `uniccl examples` must call it FAIL."""
import sys

import numpy as np

import uniccl

comm = uniccl.init()
r, n = comm.rank, comm.size
x = np.full(16, r + 1.0)
comm.all_reduce(x)
expected = n * (n + 1) / 2 + 1  # wrong on purpose
ok = np.all(x == expected)
print(f"rank {r}/{n}: wrong_sum " + ("OK" if ok else f"MISMATCH (got {x[0]:g}, expected {expected:g})"),
      flush=True)
comm.destroy()
sys.exit(0 if ok else 1)
