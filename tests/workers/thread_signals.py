"""Every thread this rank has besides the main one, after a communicator over TCP with async
work, the status writer, the flight recorder's signal watcher and a cpu stream: its name and
whether it blocks SIGINT and SIGTERM (/proc/self/task/*/status).  One JSON line per rank."""

import json
import os
import signal
import sys
import threading

import numpy as np

import uniccl

out = sys.argv[1]
with uniccl.init() as comm:
    x = np.ones(1 << 16, np.float32)
    comm.all_reduce(x, async_op=True).wait()  # the executor's thread
    comm.all_reduce(x)
    before = set(os.listdir("/proc/self/task"))
    stream = comm._backend.stream_create(0)  # the cpu plugin's native worker thread
    stream_threads = set(os.listdir("/proc/self/task")) - before
    names = {t.native_id: t.name for t in threading.enumerate()}
    rows = []
    for tid in sorted(os.listdir("/proc/self/task"), key=int):
        if int(tid) == os.getpid():
            continue
        with open(f"/proc/self/task/{tid}/status") as f:
            fields = dict(line.rstrip("\n").split(":\t", 1) for line in f if ":\t" in line)
        blocked = int(fields["SigBlk"], 16)
        rows.append(
            {
                "name": names.get(int(tid), "cpu-stream" if tid in stream_threads else "other native"),
                "SIGINT": bool(blocked >> (signal.SIGINT - 1) & 1),
                "SIGTERM": bool(blocked >> (signal.SIGTERM - 1) & 1),
            }
        )
    comm._backend.stream_destroy(stream)
    comm.barrier()
    with open(os.path.join(out, f"{comm.rank}.json"), "w") as f:
        json.dump(rows, f)
