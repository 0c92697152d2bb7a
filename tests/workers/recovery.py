"""One rank of a job under ``uniccl run --enable-recovery``: ten steps of all_reduce, rank 2
SIGKILLs itself at step 5; the survivors see RemoteError naming it, shrink, and finish the
steps on the smaller communicator, each step's sum checked against numpy (float64).

usage: recovery.py [MODE]   MODE "ok" (default), or "survivor-fails": after shrinking, the
last survivor exits with code 3 at the end (the job's exit code is then the survivors').
Each survivor prints one JSON line."""

import json
import os
import signal
import sys

import numpy as np

import uniccl

mode = sys.argv[1] if len(sys.argv) > 1 else "ok"
comm = uniccl.init()
me = comm.rank  # the job's rank (kept across the shrink)
alive = list(range(comm.size))
x = np.empty(1000, np.float64)
row = {"rank": me, "steps": 0, "errors": []}
step = 0
while step < 10:
    if me == 2 and step == 5:
        os.kill(os.getpid(), signal.SIGKILL)
    x[:] = (me + 1) * (step + 1) + np.arange(1000)
    try:
        comm.all_reduce(x)
    except uniccl.RemoteError as exc:
        row["errors"].append({"step": step, "remote_rank": exc.remote_rank, "text": str(exc)[:200]})
        old = comm
        comm = old.shrink()
        alive = [r for r in alive if r != exc.remote_rank]
        old.abort("shrunk")
        continue  # the step again, on the survivors
    want = sum((r + 1) * (step + 1) + np.arange(1000, dtype=np.float64) for r in alive)
    if not np.array_equal(x, want):
        sys.exit(f"rank {me}: step {step} wrong: {x[:3]} != {want[:3]}")
    row["steps"] += 1
    step += 1
row.update(size=comm.size, new_rank=comm.rank)
print(json.dumps(row), flush=True)
comm.destroy()
if mode == "survivor-fails" and me == 3:
    sys.exit(3)
