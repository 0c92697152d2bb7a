"""uniccl.group(): batch point-to-point calls (and collectives) so that any order works.

Inside ``with uniccl.group():`` calls are only recorded; at the end of the block
all sends and receives start together, so each rank can post its receives before
its sends without deadlocking.  Here every rank exchanges a block with every rank
(a hand-made all_to_all out of send/recv) and an all_reduce rides in the same group.

    uniccl run -n 4 examples/groups.py
"""

import sys

import numpy as np

import uniccl

COUNT = 4096


def block(src, dst):
    """The block rank ``src`` sends to rank ``dst``."""
    return np.random.default_rng([src, dst]).standard_normal(COUNT).astype(np.float32)


comm = uniccl.init()
r, n = comm.rank, comm.size

received = np.zeros((n, COUNT), np.float32)
count = np.array([1], np.int64)
with uniccl.group():
    works = [comm.recv(received[p], p) for p in range(n)]  # receives first: fine in a group
    works += [comm.send(block(r, p), p) for p in range(n)]
    works.append(comm.all_reduce(count))
done = all(w.is_completed() for w in works)  # everything finished when the block ended

bad = [p for p in range(n) if not np.array_equal(received[p], block(p, r))]
ok = done and not bad and count[0] == n
print(f"rank {r}/{n}: groups " + ("OK" if ok else f"MISMATCH (blocks from {bad}, count {count[0]})"), flush=True)
comm.destroy()
sys.exit(0 if ok else 1)
