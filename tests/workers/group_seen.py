"""Point-to-point calls inside ``uniccl.group()`` are seen like any call (under ``uniccl run``).
usage: group_seen.py ROUNDS [METRICS_PORT]
Each round: a ring exchange of 1 KiB inside a group block, checked.  Prints one JSON line per
rank: its stats' send/recv entries, its flight-recorder states, and (with METRICS_PORT, which
the test also exports as UNICCL_METRICS_PORT) the send/recv call counts Prometheus serves."""

import json
import re
import sys
import urllib.request

import numpy as np

import uniccl

rounds = int(sys.argv[1])
with uniccl.init() as comm:
    r, n = comm.rank, comm.size
    for i in range(rounds):
        got = np.empty(256, np.float32)
        with uniccl.group():
            comm.send(np.full(256, 100 * i + r, np.float32), (r + 1) % n)
            comm.recv(got, (r - 1) % n)
        assert (got == 100 * i + (r - 1) % n).all(), (i, got[:4])
    comm.barrier()
    ops = comm.stats()["ops"]
    states = [(e["op"], e["state"]) for e in comm.flight_recorder()["ops"]]
    served = {}
    if len(sys.argv) > 2:
        text = (
            urllib.request.urlopen(f"http://127.0.0.1:{int(sys.argv[2]) + comm.local_rank}/metrics", timeout=10)
            .read()
            .decode()
        )
        for op in ("send", "recv"):
            counts = re.findall(r'uniccl_calls_total\{[^}]*op="%s"[^}]*\} (\S+)' % op, text)
            served[op] = sum(float(c) for c in counts)
    print(
        json.dumps({"rank": r, "send": ops.get("send"), "recv": ops.get("recv"), "states": states, "served": served}),
        flush=True,
    )
