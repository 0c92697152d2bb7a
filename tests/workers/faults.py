"""Fault scenarios on one communicator; one JSON line per rank.

usage: faults.py SCENARIO   (under uniccl run or mpiexec; the last rank is the odd one)
  skip_return  the last rank skips an all_reduce, then calls barrier: everyone raises Timeout
  skip_exit    the last rank skips the all_reduce and exits: the others raise Timeout
  abort_hung   rank 0 aborts from a watchdog thread while its all_reduce waits for the last
               rank (which is busy elsewhere); rank 1 waits in the same all_reduce
"""

import json
import os
import sys
import threading
import time

import numpy as np

import uniccl

scenario = sys.argv[1]
comm = uniccl.init()
r, n, last = comm.rank, comm.size, comm.size - 1
x = np.ones(1000, np.float32)
comm.all_reduce(x)  # call #0: everyone
row = {"rank": r, "scenario": scenario, "pid": os.getpid()}
t0 = time.monotonic()


def failed(exc):
    row.update(
        error=type(exc).__name__,
        message=str(exc),
        missing=getattr(exc, "missing_ranks", None),
        remote=getattr(exc, "remote_rank", None),
        seq=getattr(exc, "seq", None),
    )


try:
    if scenario == "skip_return":
        if r == last:
            time.sleep(4)
            comm.barrier(timeout=10)
        else:
            comm.all_reduce(x, timeout=2)
    elif scenario == "skip_exit":
        if r == last:
            time.sleep(3)
            print(json.dumps(row), flush=True)
            os._exit(0)
        comm.all_reduce(x, timeout=1.5)
    elif scenario == "abort_hung":
        if r == last:
            time.sleep(4)  # busy elsewhere; then finds the communicator aborted
            comm.all_reduce(x, timeout=10)
        else:
            if r == 0:

                def watchdog():
                    time.sleep(1.0)
                    t = time.monotonic()
                    comm.abort("watchdog: all_reduce stuck")
                    row["abort_s"] = round(time.monotonic() - t, 3)

                threading.Thread(target=watchdog, daemon=True).start()
            comm.all_reduce(x, timeout=30)
    row["error"] = None
except uniccl.UnicclError as exc:
    failed(exc)
row["t"] = round(time.monotonic() - t0, 2)
if scenario == "abort_hung" and r == 0:
    time.sleep(0.3)  # the watchdog's timing
    # the process stays usable: new calls fail at once, numpy and uniccl keep working
    try:
        comm.all_reduce(x)
        row["after"] = "no error"
    except uniccl.InvalidUsage as exc:
        row["after"] = type(exc).__name__
    row["usable"] = bool(np.all(np.ones(4) + 1 == 2))
print(json.dumps(row), flush=True)
