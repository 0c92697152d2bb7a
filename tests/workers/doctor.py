"""One rank of a job that goes wrong in one way, for ``uniccl doctor`` (tests/test_doctor.py), under
``uniccl run`` with the user's UNICCL_DUMP_DIR (and UNICCL_TRACE where the verdict needs it).

usage: doctor.py SCENARIO [DIR]
  dead           the last rank SIGKILLs itself at call #5; the others go on to their RemoteError
  mismatch       rank 1 calls broadcast where the others call all_reduce, as call #3
  p2p            ranks 0 and 1 each wait to receive from the other
  stopped DIR    the last rank SIGSTOPs itself before call #3 (DIR/<rank>.pid: the test sends
                 SIGCONT once the others' dumps are there)
  inside DIR     the last rank SIGSTOPs itself 5 ms into a 128 MiB all_reduce (DIR/<rank>.pid)
  calls          30 rounds of all_reduce, 256 KiB (a straggler, a slow link, flipped bits)
Prints one JSON line per rank: what its failing call raised, if one did."""

import json
import os
import signal
import sys
import threading
import time

import numpy as np
from _pidfile import write_pid

import uniccl

scenario = sys.argv[1]
comm = uniccl.init()  # (the tests set UNICCL_TIMEOUT=3)
r, n = comm.rank, comm.size
row = {"rank": r}
x = np.ones(1000, np.float32)
try:
    if scenario == "dead":
        for step in range(50):
            if r == n - 1 and step == 5:
                os.kill(os.getpid(), signal.SIGKILL)
            comm.all_reduce(x)
    elif scenario == "mismatch":
        for step in range(5):
            if step == 3 and r == 1:
                comm.broadcast(x, root=0)
            else:
                comm.all_reduce(x)
    elif scenario == "p2p":
        if r < 2:
            comm.recv(np.empty(10), 1 - r)  # each waits for the other: nobody sends
    elif scenario == "stopped":
        write_pid(os.path.join(sys.argv[2], f"{r}.pid"))
        for step in range(5):
            if step == 3 and r == n - 1:
                os.kill(os.getpid(), signal.SIGSTOP)  # until the test's SIGCONT
                break
            comm.all_reduce(x)
    elif scenario == "inside":  # the last rank stops itself 5 ms into a 128 MiB all_reduce
        write_pid(os.path.join(sys.argv[2], f"{r}.pid"))
        big = np.ones(32 << 20, np.float32)
        comm.all_reduce(big)  # (pages touched: the next call moves data at once)
        if r == n - 1:
            # 5 ms: the call takes 18-20 ms at 3 ranks on 2026-12-06's VM (30 ms came after it)
            threading.Timer(0.005, os.kill, args=(os.getpid(), signal.SIGSTOP)).start()
        comm.all_reduce(big)
    elif scenario == "calls":
        y = np.ones(1 << 16, np.float32)
        for _ in range(30):
            comm.all_reduce(y)
        comm.barrier()
except uniccl.UnicclError as exc:
    row.update(error=type(exc).__name__, message=str(exc)[:300])
    time.sleep(0.2)  # (the others' dumps too, before the launcher ends the job)
print(json.dumps(row), flush=True)
