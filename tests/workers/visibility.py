"""Telemetry, traces and metrics of a real job.  usage: visibility.py MODE [DIR]

stats  known calls, then prints this rank's comm.stats() as one JSON line
serve  (UNICCL_METRICS_PORT set) known calls, then DIR/ready-<rank>; waits for DIR/done
loop   all_reduces until DIR/done appears; the last rank sleeps 0.2 s before each (a slow rank)
report all_reduces and all_gathers of 1 KiB to 4 MiB (for uniccl report)
"""

import json
import os
import sys
import time

import numpy as np

import uniccl

mode = sys.argv[1]
comm = uniccl.init()
x = np.ones(1 << 16, np.float32)  # 256 KiB
for _ in range(7):
    comm.all_reduce(x)
for _ in range(3):
    comm.broadcast(np.ones(2, np.float64), root=0)
comm.all_gather(np.ones(4, np.float32), np.zeros(4 * comm.size, np.float32))
if mode == "stats":
    print(json.dumps(comm.stats()), flush=True)
elif mode == "serve":
    d = sys.argv[2]
    open(os.path.join(d, f"ready-{comm.rank}"), "w").close()
    deadline = time.monotonic() + 60
    while not os.path.exists(os.path.join(d, "done")) and time.monotonic() < deadline:
        time.sleep(0.05)
elif mode == "report":
    for k in range(10, 23, 2):
        y = np.ones((1 << k) // 4, np.float32)
        for _ in range(4):
            comm.all_reduce(y)
        comm.all_gather(np.ones((1 << k) // 16, np.float32), np.zeros((1 << k) // 16 * comm.size, np.float32))
elif mode == "loop":
    d = sys.argv[2]
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        if comm.rank == comm.size - 1:
            time.sleep(0.2)
        comm.all_reduce(x)
        stop = np.array([os.path.exists(os.path.join(d, "done"))], np.int32)
        comm.all_reduce(stop, op="max")
        if stop[0]:
            break
comm.barrier()
comm.destroy()
