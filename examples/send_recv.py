"""send / recv: a ring exchange with blocking point-to-point calls.

Every rank sends its array to the next rank and receives the previous rank's.
Blocking calls must be ordered so that no cycle of ranks waits on each other:
even ranks send first, odd ranks receive first.  On a single rank the ring is
rank 0 talking to itself, which is only allowed inside ``uniccl.group()``.

    uniccl run -n 4 examples/send_recv.py
"""

import sys

import numpy as np

import uniccl

COUNT = 1000


def data(rank):
    """What rank ``rank`` sends, reproducible from the rank alone."""
    return np.random.default_rng(rank).standard_normal(COUNT).astype(np.float32)


comm = uniccl.init()
r, n = comm.rank, comm.size
right, left = (r + 1) % n, (r - 1) % n

got = np.zeros(COUNT, np.float32)
if n == 1:
    with uniccl.group():
        comm.send(data(r), right)
        comm.recv(got, left)
elif r % 2 == 0:
    comm.send(data(r), right)
    comm.recv(got, left)
else:
    comm.recv(got, left)
    comm.send(data(r), right)

ok = np.array_equal(got, data(left))
print(f"rank {r}/{n}: send_recv " + ("OK" if ok else f"MISMATCH (did not get rank {left}'s data)"), flush=True)
comm.destroy()
sys.exit(0 if ok else 1)
