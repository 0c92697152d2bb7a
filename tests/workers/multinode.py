"""Worker for the multi-host tests: all_reduce, all_gather and all_to_all checked
against numpy; one JSON line per rank.  usage: multinode.py [kill RANK PIDDIR]"""

import json
import os
import signal
import sys

import numpy as np
from _pidfile import write_pid

import uniccl
from uniccl.transport.tcp import host_key

comm = uniccl.init()
r, n = comm.rank, comm.size
if len(sys.argv) > 1 and sys.argv[1] == "kill":
    victim, piddir = int(sys.argv[2]), sys.argv[3]
    write_pid(os.path.join(piddir, f"{r}.pid"))
    x = np.ones(1 << 14)
    for i in range(10**6):
        comm.all_reduce(x)
        if r == victim and i == 20:
            os.kill(os.getpid(), signal.SIGKILL)
m = 1000
x = np.arange(m, dtype=np.float64) + r
comm.all_reduce(x)
ok_ar = np.array_equal(x, n * np.arange(m, dtype=np.float64) + n * (n - 1) / 2)
g = np.empty(n * m, np.int64)
comm.all_gather(np.full(m, r, np.int64), g)
ok_ag = np.array_equal(g, np.repeat(np.arange(n, dtype=np.int64), m))
send = np.array([100 * r + j for j in range(n) for _ in range(7)], np.int32)  # block j goes to rank j
recv = np.empty_like(send)
comm.all_to_all(send, recv)
ok_a2a = np.array_equal(recv, np.array([100 * j + r for j in range(n) for _ in range(7)], np.int32))
print(
    json.dumps(
        {
            "rank": r,
            "size": n,
            "host": host_key(),
            "transport": comm._tuner.transport,
            "all_reduce": bool(ok_ar),
            "all_gather": bool(ok_ag),
            "all_to_all": bool(ok_a2a),
        }
    ),
    flush=True,
)
sys.exit(0 if ok_ar and ok_ag and ok_a2a else 1)
