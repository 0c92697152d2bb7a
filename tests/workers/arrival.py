"""One rank of a job in which rank 1 is late to every call (UNICCL_FAULT_INJECT slow=, tests/test_arrival.py):
all_reduce in a loop until DIR/stop exists (rank 0's word, broadcast), then its arrival counts as
comm.stats() gives them, one JSON line per rank.  usage: arrival.py DIR"""

import json
import os
import sys

import numpy as np

import uniccl

comm = uniccl.init()
x = np.ones(256, np.float32)
stop = np.zeros(1, np.int64)
calls = 0
while not stop[0] and calls < 20000:
    for _ in range(20):
        comm.all_reduce(x)
    calls += 20
    if calls == 100:
        open(os.path.join(sys.argv[1], f"{comm.rank}.ready"), "w").close()
    stop[0] = os.path.exists(os.path.join(sys.argv[1], "stop"))
    comm.broadcast(stop, root=0)
arrival = comm.stats()["arrival"]
arrival.pop("hist_log2_ns")
print(json.dumps({"rank": comm.rank, **arrival}), flush=True)
