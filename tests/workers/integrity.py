"""Payload integrity over TCP: one all_reduce with fault injection off, the same with it on
(UNICCL_TEST_INJECT: an UNICCL_FAULT_INJECT spec, applied after set-up); prints whether the
results are bitwise equal and the counters.  usage: integrity.py BYTES"""

import json
import os
import sys

import numpy as np

import uniccl
from uniccl.reliability.faults import Faults

comm = uniccl.init()
mesh = comm._t.mesh
faults = Faults(os.environ["UNICCL_TEST_INJECT"], comm.rank)  # the clean run first, then these
n = int(sys.argv[1]) // 4
x = np.random.default_rng(comm.rank).standard_normal(n).astype(np.float32)
clean = x.copy()
comm.all_reduce(clean)
mesh.faults = faults
row = {"rank": comm.rank}
try:
    for _ in range(3 if n < 1 << 20 else 1):  # small sizes: a few calls, so that drops happen
        y = x.copy()
        comm.all_reduce(y, timeout=20)
    row["equal"] = bool(np.array_equal(y.view(np.uint32), clean.view(np.uint32)))
    comm.barrier(timeout=20)  # a peer may still ask this rank for a copy: stay until all are done
except uniccl.UnicclError as exc:
    row.update(error=type(exc).__name__, message=str(exc)[:300], remote_rank=getattr(exc, "remote_rank", None))
row.update(comm.stats(), injected=faults.injected if faults else None)
print(json.dumps(row), flush=True)
