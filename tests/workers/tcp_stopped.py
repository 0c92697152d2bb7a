"""One collective with ``timeout=`` while the test holds one rank stopped (SIGSTOP): the
others must raise uniccl.Timeout naming it.  One JSON line per rank: first {"ready"} with the
pid (the test stops the victim then), after GO_FILE exists the call's outcome; the survivors
then wait for DONE_FILE (so that their connections stay up while the victim, resumed, ends
its own call), the victim prints its outcome too.

usage: tcp_stopped.py OP NBYTES TIMEOUT GO_FILE DONE_FILE
       (OP: a collective; NBYTES: the buffer each rank passes, or receives in all)"""

import json
import os
import sys
import time

import numpy as np

import uniccl

op, nbytes, limit, go, done = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), sys.argv[4], sys.argv[5]
comm = uniccl.init()
r, n = comm.rank, comm.size
comm.all_reduce(np.ones(4, np.float32))  # every connection is up and in use
count = max(1, nbytes // 4)
block = max(1, count // n)  # all_gather, reduce_scatter, all_to_all, gather, scatter: NBYTES in all
buf = np.full(count, r + 1, np.float32)
small, big = np.full(block, r, np.float32), np.zeros(block * n, np.float32)
print(json.dumps({"ready": r, "pid": os.getpid()}), flush=True)


def wait_for(path):
    deadline = time.monotonic() + 300
    while not os.path.exists(path):  # the test writes it (no data moves meanwhile)
        if time.monotonic() > deadline:
            sys.exit(f"rank {r}: {path} never appeared")
        time.sleep(0.02)


wait_for(go)
row = {"rank": r, "error": None}
t0 = time.monotonic()
try:
    if op == "broadcast":
        comm.broadcast(buf, root=0, timeout=limit)
    elif op == "all_gather":
        comm.all_gather(small, big, timeout=limit)
    elif op == "all_reduce":
        comm.all_reduce(buf, timeout=limit)
    elif op == "reduce":
        comm.reduce(buf, root=0, timeout=limit)
    elif op == "reduce_scatter":
        comm.reduce_scatter(big, small, timeout=limit)
    elif op == "all_to_all":
        comm.all_to_all(big, np.zeros_like(big), timeout=limit)
    elif op == "gather":
        comm.gather(small, big if r == 0 else None, root=0, timeout=limit)
    elif op == "scatter":
        comm.scatter(big if r == 0 else None, small, root=0, timeout=limit)
    elif op == "barrier":
        comm.barrier(timeout=limit)
    else:
        raise SystemExit(f"unknown op {op}")
except uniccl.UnicclError as exc:
    row.update(error=type(exc).__name__, message=str(exc), missing=getattr(exc, "missing_ranks", None))
row["seconds"] = round(time.monotonic() - t0, 3)
print(json.dumps(row), flush=True)
wait_for(done)
try:
    comm.abort("test done")
except uniccl.UnicclError:
    pass
