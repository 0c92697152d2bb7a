"""One rank of a communicator that grows 2 -> 3 -> 4 (tests/test_grow.py).

The job's ranks (``uniccl run -n 2 grow.py DIR``) run a step, then for each new size rank 0
makes a unique id, gives it to the others (broadcast_object) and to the test (DIR/uid-<size>,
which starts the joiner), and every rank calls ``comm.grow(size, uid)``.  A joiner
(``python grow.py DIR --join RANK --platform P``) reads DIR/uid-<RANK+1> and calls
``uniccl.Communicator(uid, RANK, RANK + 1, platform=P)``, then grows on with the others.
Each step's all_reduce is checked against numpy (float64), on the new communicator and on the
old one (which keeps working).  MODE "mismatch": rank 1 passes another size.
Prints one JSON line per rank."""

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

import uniccl

ap = argparse.ArgumentParser()
ap.add_argument("dir", type=Path)
ap.add_argument("--join", type=int)
ap.add_argument("--platform")
ap.add_argument("--mode", default="ok")
args = ap.parse_args()
FINAL = 4


def step(comm, label):
    """An all_reduce of every rank's (rank + 1) * arange, checked; the ranks' platforms."""
    x = (comm.rank + 1.0) * np.arange(1000)
    comm.all_reduce(x)
    want = sum((r + 1.0) * np.arange(1000, dtype=np.float64) for r in range(comm.size))
    if not np.array_equal(x, want):
        sys.exit(f"rank {comm.rank}: {label} at {comm.size} ranks: wrong sum {x[:3]} != {want[:3]}")
    return comm.all_gather_object(comm.platform)


def read_uid(size):
    path = args.dir / f"uid-{size}"
    deadline = time.monotonic() + 60
    while not path.exists():
        if time.monotonic() > deadline:
            sys.exit(f"no {path}")
        time.sleep(0.02)
    return uniccl.UniqueId.from_bytes(path.read_bytes())


if args.join is None:
    comm = uniccl.init()
else:
    comm = uniccl.Communicator(read_uid(args.join + 1), args.join, args.join + 1, platform=args.platform)
row = {"rank": comm.rank, "platform": comm.platform, "sizes": [comm.size], "platforms": step(comm, "start")}
if args.mode == "mismatch":
    try:
        comm.grow(3 + comm.rank, uniccl.get_unique_id())
        row["error"] = "grew"
    except uniccl.InvalidUsage as exc:
        row["error"] = str(exc)
    print(json.dumps(row), flush=True)
    sys.exit(0)
while comm.size < FINAL:
    size = comm.size + 1
    uid = comm.broadcast_object(uniccl.get_unique_id() if comm.rank == 0 else None)
    if comm.rank == 0:
        tmp = args.dir / f".uid-{size}"
        tmp.write_bytes(bytes(uid))
        os.replace(tmp, args.dir / f"uid-{size}")  # the test starts the joiner
    new = comm.grow(size, uid)
    row["sizes"].append(new.size)
    row["platforms"] = step(new, "grown")
    step(comm, "old")  # the old communicator keeps working
    comm.destroy()
    comm = new
comm.destroy()
print(json.dumps(row), flush=True)
