"""A rank of ``uniccl run`` that prints where the job's rendezvous is, waits until GO_FILE
exists (the test attacks that port meanwhile), then joins the world and all_reduces.
usage: wait_go.py GO_FILE [LATE_RANK LATE_FILE]  (LATE_RANK also waits for LATE_FILE)"""

import os
import sys
import time

import numpy as np

import uniccl

print("rendezvous", os.environ["UNICCL_RENDEZVOUS"], "pid", os.getpid(), flush=True)
waits = [sys.argv[1]]
if len(sys.argv) > 3 and int(os.environ["UNICCL_RANK"]) == int(sys.argv[2]):
    waits.append(sys.argv[3])
deadline = time.monotonic() + 120
while not all(os.path.exists(w) for w in waits):
    assert time.monotonic() < deadline, "no go"
    time.sleep(0.05)
t0 = time.monotonic()
with uniccl.init() as comm:
    x = np.arange(100, dtype=np.float64) + comm.rank
    comm.all_reduce(x)
    assert (x == comm.size * np.arange(100) + sum(range(comm.size))).all(), x[:4]
    print(f"rank {comm.rank} joined in {time.monotonic() - t0:.2f} s, all_reduce checked", flush=True)
