"""One rank of a shrink run: all ranks loop all_reduce until one dies (UNICCL_FAULT_INJECT
kill_at/kill_rank); the survivors shrink to a new communicator, check an all_reduce on it,
then abort the old one.  (environment as tests/workers/chaos.py)"""

import json
import os
import time

import numpy as np

import uniccl
from uniccl import UniqueId

rank, size = int(os.environ["UNICCL_TEST_RANK"]), int(os.environ["UNICCL_TEST_SIZE"])
comm = uniccl.Communicator(
    UniqueId.from_bytes(bytes.fromhex(os.environ["UNICCL_TEST_UID"])), rank, size, platform="cpu"
)
x = np.ones(1 << 16, np.float32)
row = {"rank": rank}
try:
    for _ in range(100):
        comm.all_reduce(x)
except uniccl.RemoteError as exc:
    row.update(error=type(exc).__name__, remote_rank=exc.remote_rank)
t = time.monotonic()
new = comm.shrink()
row["shrink_s"] = round(time.monotonic() - t, 3)
y = np.full(8, float(new.rank + 1), np.float64)
new.all_reduce(y)
row.update(new_rank=new.rank, new_size=new.size, sum=float(y[0]), transport=new._tuner.transport)
comm.abort("shrunk")
new.barrier()
new.destroy()
print(json.dumps(row), flush=True)
