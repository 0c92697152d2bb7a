"""scatter: block i of the root's buffer goes to rank i.

The root (the last rank) holds size x COUNT int32 values; every rank receives
its own block of COUNT values and checks it exactly.

    uniccl run -n 4 examples/scatter.py
"""

import sys

import numpy as np

import uniccl

COUNT = 500


def root_data(size):
    """The root's whole buffer, size x COUNT, reproducible by any rank."""
    return np.random.default_rng(1234).integers(0, 2**31 - 1, (size, COUNT), dtype=np.int32)


comm = uniccl.init()
r, n = comm.rank, comm.size
root = n - 1

mine = np.full(COUNT, -1, np.int32)
comm.scatter(root_data(n) if r == root else None, mine, root=root)  # only the root sends

wrong = np.count_nonzero(mine != root_data(n)[r])
ok = wrong == 0
print(f"rank {r}/{n}: scatter " + ("OK" if ok else f"MISMATCH ({wrong} of {COUNT} values wrong)"), flush=True)
comm.destroy()
sys.exit(0 if ok else 1)
