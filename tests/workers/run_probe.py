"""Worker for the launcher tests.  usage: run_probe.py MODE [PIDDIR]

MODE ok: report the rank variables and transport (one JSON line), check an all_reduce.
MODE fail: rank 2 prints a last words line and exits 3; the others wait in a barrier.
MODE kill: rank 1 SIGKILLs itself in the middle of an all_reduce loop.
MODE hang: every rank sleeps (for --timeout and signal tests).
PIDDIR: each rank writes its pid there, so tests can check nobody survives.
"""

import json
import os
import signal
import socket
import sys
import time

import numpy as np
from _pidfile import write_pid

import uniccl

mode = sys.argv[1]
if len(sys.argv) > 2:
    me = os.environ.get("UNICCL_RANK", os.environ.get("PMI_RANK", "x"))  # PMI_RANK: plain mpiexec
    write_pid(os.path.join(sys.argv[2], f"{me}.pid"))
comm = uniccl.init()
r, n = comm.rank, comm.size
if mode == "ok":
    x = np.arange(1000, dtype=np.float64) * (r + 1)
    comm.all_reduce(x)
    ok = np.array_equal(x, np.arange(1000, dtype=np.float64) * (n * (n + 1) // 2))
    env = {
        k: os.environ.get(k)
        for k in ("UNICCL_RANK", "UNICCL_WORLD_SIZE", "UNICCL_LOCAL_RANK", "UNICCL_LOCAL_SIZE", "UNICCL_NODE_RANK")
    }
    print(
        json.dumps(
            {
                "rank": r,
                "size": n,
                "env": env,
                "p2p": comm._t.name,
                "transport": comm._tuner.transport,
                "mpi_loaded": "mpi4py.MPI" in sys.modules,
                "host": socket.gethostname(),
                "ok": bool(ok),
            }
        ),
        flush=True,
    )
    sys.exit(0 if ok else 1)
if mode == "fail":
    if r == 2:
        print("rank 2: last words before exit 3", flush=True)
        sys.exit(3)
    comm.barrier()
    time.sleep(60)
if mode == "kill":
    x = np.ones(1 << 16)
    for i in range(10**6):
        comm.all_reduce(x)
        if r == 1 and i == 20:
            os.kill(os.getpid(), signal.SIGKILL)
if mode == "hang":
    print("sleeping", flush=True)
    time.sleep(120)
