"""Rank 1 finds the last message of the job from rank 0 damaged (a flip injected into exactly that
message, seen late) while rank 0, whose part is done, exits at once: rank 1 must still get its copy.
One JSON line per rank.   usage: tcp_last_copy.py BYTES   (uniccl run -n 2, UNICCL_TRANSPORT=tcp)"""

import json
import sys
import time

import numpy as np

import uniccl
from uniccl.reliability.faults import Faults

comm = uniccl.init()
r, n = comm.rank, comm.size
count = int(sys.argv[1]) // 4
x = np.full(count, r + 1, np.float32)
comm.all_reduce(x)  # every connection up
mesh = comm._t.mesh
if r == 1:  # the next checked message this rank receives arrives with one bit flipped, and its
    # reader is slow to see it (0.5 s): rank 0 is done with its part, and exiting, long before
    faults = Faults("seed=1", r)
    shots = [True]
    faults.on_message = lambda peer: "flip" if shots and shots.pop() else ""
    flip = faults.flip_bit

    def slow_flip(view, peer):
        time.sleep(0.5)
        flip(view, peer)

    faults.flip_bit = slow_flip
    mesh.faults = faults
out = np.zeros(n * count, np.float32)
comm.all_gather(np.full(count, r + 1, np.float32), out)  # rank 0 has all once rank 1's block is in
ok = bool(np.array_equal(out, np.repeat(np.arange(1, n + 1, dtype=np.float32), count)))
print(json.dumps({"rank": r, "ok": ok, "checksum_failures": comm.stats().get("checksum_failures")}), flush=True)
comm.destroy()  # and exit: rank 0 does not wait for anyone
