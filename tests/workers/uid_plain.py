"""One of N plain python processes (no launcher at all) joining one unique id, NCCL style:
rank 0 writes ``bytes(uniccl.get_unique_id())`` to a file, the others read it there.
usage: uid_plain.py RANK SIZE UID_FILE OUT_JSON [TIMEOUT]  (the communicator's timeout=; 0: no limit)
Each rank all_reduces, broadcasts and all_gathers values made from its rank and writes them,
with the transport its communicator took, to OUT_JSON."""

import json
import os
import sys
import time

import numpy as np

import uniccl

rank, size, uid_file, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
if rank == 0:
    with open(uid_file + ".part", "wb") as f:
        f.write(bytes(uniccl.get_unique_id()))
    os.replace(uid_file + ".part", uid_file)  # the others never read half an id
else:
    deadline = time.monotonic() + 120
    while not os.path.exists(uid_file):
        if time.monotonic() > deadline:
            sys.exit(f"rank {rank}: no unique id in {uid_file}")
        time.sleep(0.05)
with open(uid_file, "rb") as f:
    uid = f.read()
kwargs = {"timeout": float(sys.argv[5])} if len(sys.argv) > 5 else {}
with uniccl.Communicator(uid, rank, size, **kwargs) as comm:
    x = np.arange(1000, dtype=np.float64) * (rank + 1)
    comm.all_reduce(x)
    b = np.full(7, rank, np.int32)
    comm.broadcast(b, root=size - 1)
    g = np.empty(3 * size, np.int64)
    comm.all_gather(np.arange(3, dtype=np.int64) + 10 * rank, g)
    result = {
        "rank": comm.rank,
        "size": comm.size,
        "transport": comm._tuner.transport,
        "timeout": comm.timeout,
        "all_reduce": x.tolist(),
        "broadcast": b.tolist(),
        "all_gather": g.tolist(),
    }
with open(out, "w") as f:
    json.dump(result, f)
