"""broadcast: the root's buffer is copied into every rank's buffer.

The root is the last rank (any rank can be the root); the other ranks start with
zeros and must end with exactly the root's int64 values.

    uniccl run -n 4 examples/broadcast.py
"""

import sys

import numpy as np

import uniccl

COUNT = 1000


def data(rank):
    """What rank ``rank`` would broadcast, reproducible from the rank alone."""
    return np.random.default_rng(rank).integers(-(10**12), 10**12, COUNT, dtype=np.int64)


comm = uniccl.init()
r, n = comm.rank, comm.size
root = n - 1

buf = data(r) if r == root else np.zeros(COUNT, np.int64)
comm.broadcast(buf, root=root)

wrong = np.count_nonzero(buf != data(root))
ok = wrong == 0
print(
    f"rank {r}/{n}: broadcast " + ("OK" if ok else f"MISMATCH ({wrong} of {COUNT} values differ from root {root}'s)"),
    flush=True,
)
comm.destroy()
sys.exit(0 if ok else 1)
