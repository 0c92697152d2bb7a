"""A stopped peer over MPI (under mpiexec, UNICCL_TRANSPORT=mpi): the last rank stops itself
with SIGSTOP right after a barrier; every other rank's next call, with timeout=3, must raise
uniccl.Timeout within timeout + 2 s naming the stopped rank.  usage: mpi_stopped_peer.py OP BYTES OUT
Each rank writes OUT-<rank>.json (the stopped one its pid, first); the test then continues
the stopped rank (SIGCONT)."""

import json
import os
import signal
import sys
import time

import numpy as np

import uniccl

op, nbytes, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]


def write(row):
    with open(f"{out}-{row['rank']}.json.part", "w") as f:
        json.dump(row, f)
    os.replace(f"{out}-{row['rank']}.json.part", f"{out}-{row['rank']}.json")


with uniccl.init(timeout=3) as comm:
    n, r = comm.size, comm.rank
    comm.barrier()
    if r == n - 1:
        write({"rank": r, "stopping": os.getpid()})
        os.kill(os.getpid(), signal.SIGSTOP)
        sys.exit(0)  # continued by the test: leave without calling anything more
    count = max(1, nbytes // 8)
    t0 = time.monotonic()
    row = {"rank": r}
    try:
        if op == "all_reduce":
            comm.all_reduce(np.ones(count))
        elif op == "broadcast":
            comm.broadcast(np.ones(count), root=0)
        elif op == "all_gather":
            comm.all_gather(np.ones(count), np.empty(count * n))
        elif op == "recv":
            comm.recv(np.empty(count), n - 1)
        row["error"] = None
    except uniccl.UnicclError as exc:
        row.update(error=type(exc).__name__, message=str(exc), missing=getattr(exc, "missing_ranks", None))
    row["seconds"] = time.monotonic() - t0
    write(row)
    deadline = time.monotonic() + 60  # stay until every survivor has written (the test says so):
    while not os.path.exists(out + "-done") and time.monotonic() < deadline:  # a rank that leaves
        time.sleep(0.05)  # early makes mpiexec kill the rest before their own timeouts
    os._exit(0)  # the communicator timed out: nothing to tear down with the stopped rank
