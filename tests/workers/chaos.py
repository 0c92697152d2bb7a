"""One rank of a chaos run: every rank loops one collective; the victim kills itself
(SIGKILL, from a thread, while its main thread is inside the collective).  Each survivor
prints how long it took to raise, what it raised, and how long abort() took.

usage: chaos.py COLLECTIVE VICTIM KILL_AFTER_S STAMP_FILE
  (environment: UNICCL_TEST_UID = hex of a uniccl unique id, UNICCL_TEST_RANK, UNICCL_TEST_SIZE)
"""

import json
import os
import signal
import sys
import threading
import time

import numpy as np

import uniccl
from uniccl import UniqueId

coll, victim, kill_after, stamp = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
rank, size = int(os.environ["UNICCL_TEST_RANK"]), int(os.environ["UNICCL_TEST_SIZE"])
comm = uniccl.Communicator(
    UniqueId.from_bytes(bytes.fromhex(os.environ["UNICCL_TEST_UID"])), rank, size, platform="cpu"
)
n = 1 << 20  # 4 MiB of float32 per rank: long enough to be caught mid-operation
x, big = np.ones(n, np.float32), np.zeros(n * size, np.float32)
calls = {
    "all_reduce": lambda: comm.all_reduce(x),
    "broadcast": lambda: comm.broadcast(x, root=0),
    "reduce": lambda: comm.reduce(x, root=0),
    "all_gather": lambda: comm.all_gather(x, big),
    "reduce_scatter": lambda: comm.reduce_scatter(big, x),
    "all_to_all": lambda: comm.all_to_all(big, np.empty_like(big)),
    "gather": lambda: comm.gather(x, big if rank == 0 else None, root=0),
    "scatter": lambda: comm.scatter(big if rank == 0 else None, x, root=0),
    "barrier": lambda: comm.barrier(),
}
call = calls[coll]
call()  # everyone is in
if rank == victim:

    def die():
        time.sleep(kill_after)
        with open(stamp, "w") as f:
            f.write(repr(time.time()))
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=die, daemon=True).start()
row = {"rank": rank, "collective": coll, "victim": victim}
try:
    while True:
        call()
except uniccl.UnicclError as exc:
    t = time.time()
    row.update(error=type(exc).__name__, remote_rank=getattr(exc, "remote_rank", None), message=str(exc)[:300])
    try:
        with open(stamp) as f:
            row["detect_s"] = round(t - float(f.read()), 3)
    except (OSError, ValueError):
        row["detect_s"] = None
t = time.monotonic()
comm.abort("chaos: a peer died")
row["abort_s"] = round(time.monotonic() - t, 3)
print(json.dumps(row), flush=True)
