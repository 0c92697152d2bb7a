"""Worker for tests/test_link_heal.py: collectives over TCP while the test breaks connections
under them (``ss -K``, a veth taken down, or UNICCL_FAULT_INJECT=disconnect); every result is
checked against numpy (float64 sums).  One JSON line per rank at the end, with the links'
reconnections.

usage: link_heal.py loop DIR     calls of 8 B .. 8 MiB, and send/recv, until DIR/stop exists
                                 (each rank writes DIR/<rank>.pid once under way)
       link_heal.py big DIR MiB  one all_reduce of that many MiB (DIR/<rank>.pid just before it)
       link_heal.py fault N      N rounds of every collective, 8 B .. 1 MiB"""

import json
import os
import sys
import time

import numpy as np
from _pidfile import write_pid

import uniccl
from uniccl.transport.tcp import host_key

comm = uniccl.init(timeout=60)
r, n = comm.rank, comm.size
mode = sys.argv[1]
row = {"rank": r, "host": host_key(), "transport": comm.tuner.transport, "calls": 0, "wrong": []}


def marker(directory):
    write_pid(os.path.join(directory, f"{r}.pid"))


def check(name, got, want):
    row["calls"] += 1
    if not np.array_equal(got, want):
        row["wrong"].append(name)


def all_reduce(count, step):
    x = (np.arange(count, dtype=np.float64) % 1000 + r * 7 + step).astype(np.float32)
    comm.all_reduce(x)
    want = sum((np.arange(count, dtype=np.float64) % 1000 + q * 7 + step) for q in range(n))
    check(f"all_reduce {count}", x, want.astype(np.float32))


def every_collective(count, step):
    all_reduce(count, step)
    g = np.empty(count * n, np.int64)
    comm.all_gather(np.full(count, r + step, np.int64), g)
    check(f"all_gather {count}", g, np.repeat(np.arange(n, dtype=np.int64) + step, count))
    b = np.full(count, float(step if r == 1 % n else -1))
    comm.broadcast(b, root=1 % n)
    check(f"broadcast {count}", b, np.full(count, float(step)))
    send = np.repeat(np.arange(n, dtype=np.int32) + 100 * r + step, count)  # block j goes to rank j
    recv = np.empty_like(send)
    comm.all_to_all(send, recv)
    check(f"all_to_all {count}", recv, np.repeat(100 * np.arange(n, dtype=np.int32) + r + step, count))
    msg = np.full(count, float(r * 10 + step))
    got = np.empty(count)
    with uniccl.group():
        comm.send(msg, (r + 1) % n)
        comm.recv(got, (r - 1) % n)
    check(f"send/recv {count}", got, np.full(count, float(((r - 1) % n) * 10 + step)))


t0 = time.monotonic()
if mode == "loop":
    step, stop = 0, np.zeros(1, np.int64)
    while not stop[0] and step < 2000:
        for count in (1, 1 << 10, 1 << 16, 1 << 21):
            all_reduce(count, step)
        if step == 1:
            marker(sys.argv[2])
        step += 1
        stop[0] = os.path.exists(os.path.join(sys.argv[2], "stop"))
        comm.broadcast(stop, root=0)  # rank 0's word: every rank stops after the same step
elif mode == "big":
    count = int(sys.argv[3]) << 18  # float32 elements in that many MiB
    comm.barrier()
    marker(sys.argv[2])
    t1 = time.monotonic()
    all_reduce(count, 3)
    row["big_s"] = round(time.monotonic() - t1, 3)
else:
    for step in range(int(sys.argv[2])):
        for count in (1, 100, 1 << 14, 1 << 17):
            every_collective(count, step)
    row["injected"] = comm.mesh.faults.injected if comm.mesh.faults is not None else {}
row["seconds"] = round(time.monotonic() - t0, 3)
row["reconnects"] = {str(k): v for k, v in comm.reconnects().items()}
comm.destroy()
print(json.dumps(row), flush=True)
sys.exit(1 if row["wrong"] else 0)
