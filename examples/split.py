"""Communicator.split: carve the world into sub-communicators by colour.

Even and odd ranks form two groups (colour = rank % 2); ``key=-rank`` orders each
group in reverse.  Each group sums its members' world ranks with all_reduce, and
rank 0 opts out of a second split with ``uniccl.UNDEFINED``.

    uniccl run -n 4 examples/split.py
"""

import sys

import numpy as np

import uniccl

comm = uniccl.init()
r, n = comm.rank, comm.size
problems = []

sub = comm.split(color=r % 2, key=-r)
members = [q for q in range(n) if q % 2 == r % 2]
if (sub.size, sub.rank) != (len(members), sorted(members, reverse=True).index(r)):
    problems.append(f"sub rank {sub.rank}/{sub.size}")
total = np.array([r], np.int64)
sub.all_reduce(total)
if total[0] != sum(members):
    problems.append(f"sum of ranks {total[0]}, expected {sum(members)}")
sub.destroy()

rest = comm.split(uniccl.UNDEFINED if r == 0 else 0)  # everyone but rank 0
if r == 0 and rest is not None:
    problems.append("UNDEFINED colour gave a communicator")
if r > 0:
    ones = np.ones(3)
    rest.all_reduce(ones)
    if rest.size != n - 1 or not np.all(ones == n - 1):
        problems.append(f"second split: size {rest.size}, sum {ones[0]}, expected {n - 1}")
    rest.destroy()

ok = not problems
print(f"rank {r}/{n}: split " + ("OK" if ok else "MISMATCH (" + "; ".join(problems) + ")"), flush=True)
comm.destroy()
sys.exit(0 if ok else 1)
