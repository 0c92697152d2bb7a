"""barrier: no rank leaves before every rank has entered.

The last rank arrives 0.2 s late.  Every rank notes when it entered and left
the barrier (wall clock, shared by the ranks of one host); all_gather collects
the entry times and each rank checks that it left after the last one entered.

    uniccl run -n 4 examples/barrier.py
"""

import sys
import time

import numpy as np

import uniccl

comm = uniccl.init()
r, n = comm.rank, comm.size

if r == n - 1:
    time.sleep(0.2)
entered = time.time()
comm.barrier()
left = time.time()

entries = np.empty(n)
comm.all_gather(np.array([entered]), entries)
ok = left >= entries.max() - 0.01  # 10 ms of slack for clocks of different hosts
print(
    f"rank {r}/{n}: barrier "
    + ("OK" if ok else f"MISMATCH (left {entries.max() - left:.3f} s before the last rank entered)"),
    flush=True,
)
comm.destroy()
sys.exit(0 if ok else 1)
