"""Six ranks over TCP; rank 0 is connected to five peers, read by four reader threads, so two
of them share one (links are given to the threads in turn, in the order they are made).
The later of those two (the victim) sends rank 0 a 256 MiB message, which rank 0 stops (SIGSTOP)
as soon as its first bytes have come; then (told by rank 0) the four others each send 16 MiB.  Rank 0 must get all four whole (one of them
read by the same thread as the stopped stream) and a Timeout naming the victim for its
message.  One JSON line per rank: first {"ready", "pid"}, then the victim's {"victim"}, then
rank 0's outcome.  The test resumes the victim and ends the job."""

import json
import os
import signal
import sys
import time

import numpy as np

import uniccl

BIG, SMALL = 256 << 20, 16 << 20
comm = uniccl.init()
r, n = comm.rank, comm.size
assert n == 6, n
side = comm.split(0, r)  # the victim's message goes here: calls on one communicator run one at a time
print(json.dumps({"ready": r, "pid": os.getpid()}), flush=True)
token = np.zeros(2, np.int64)
if r == 0:  # every link to rank 0 made, then the two peers that share a reader thread
    for p in range(1, n):
        comm.recv(token, p)
        comm.send(token, p)
    mesh = comm._t.mesh
    by_thread: dict = {}
    for p in range(1, n):
        by_thread.setdefault(mesh._poller_of[p], []).append(p)
    token[:] = next(peers for peers in by_thread.values() if len(peers) > 1)[:2]  # (partner, victim)
else:
    comm.send(token, 0)
    comm.recv(token, 0)
comm.broadcast(token, root=0)
partner, victim = int(token[0]), int(token[1])


def pattern(p: int, nbytes: int) -> np.ndarray:
    return (np.arange(nbytes // 4, dtype=np.int64) * (p + 3) % 65521 + 1).astype(np.float32)


data = pattern(r, BIG if r == victim else SMALL) if r else None
comm.barrier()


if r == 0:
    big = np.zeros(BIG // 4, np.float32)
    pending = side.recv(big, victim, async_op=True, timeout=8)  # read straight into ``big`` as it comes
    deadline = time.monotonic() + 30
    while big[0] == 0 and time.monotonic() < deadline:  # its first bytes are in: stop it now
        time.sleep(0.001)
    os.kill(comm._t.mesh.table[victim]["pid"], signal.SIGSTOP)
    row: dict = {"rank": 0, "victim": victim, "shares_with": partner, "whole": [], "wrong": []}
    row["begun"] = bool(big[0] != 0)
    for p in range(1, n):  # now the others send
        if p != victim:
            comm.send(token, p)
    for p in range(1, n):
        if p == victim:
            continue
        buf = np.zeros(SMALL // 4, np.float32)
        comm.recv(buf, p, timeout=20)
        (row["whole"] if np.array_equal(buf, pattern(p, SMALL)) else row["wrong"]).append(p)
    row["big_done_before"] = pending.is_completed()
    try:
        pending.wait()
        row["big"] = "completed"
    except uniccl.UnicclError as exc:
        row.update(big=type(exc).__name__, message=str(exc), missing=getattr(exc, "missing_ranks", None))
    print(json.dumps(row), flush=True)
elif r == victim:
    print(json.dumps({"victim": r, "pid": os.getpid()}), flush=True)
    try:  # (rank 0 stops this process once the first bytes have come)
        side.send(data, 0, timeout=60)
    except uniccl.UnicclError:
        pass  # (resumed after rank 0 gave up on it)
else:
    comm.recv(token, 0, timeout=60)  # the victim is stopped, its message begun
    comm.send(data, 0, timeout=20)
sys.stdout.flush()
time.sleep(3 if r else 0)
os._exit(0)  # (no linger with a peer that may still be stopped)
