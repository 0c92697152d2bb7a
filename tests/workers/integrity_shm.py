"""Shared-memory checksums: every collective (or one large all_reduce) on seeded data; prints a
hash of each rank's results and the integrity counters, or the typed error.
usage: integrity_shm.py all|big   (UNICCL_SHM_CHECKSUM / UNICCL_FAULT_INJECT set by the test)"""

import hashlib
import json
import sys

import numpy as np

import uniccl

comm = uniccl.init()
r, n = comm.rank, comm.size
h = hashlib.sha256()
row = {"rank": r}
try:
    if sys.argv[1] == "big":
        x = np.random.default_rng(r).standard_normal((256 << 20) // 4).astype(np.float32)
        comm.all_reduce(x)
        h.update(x.tobytes())
    else:
        for nbytes in (100, 5000, 1 << 20, 9 << 20):
            m = nbytes // 4
            b = m // n
            x = np.random.default_rng(r * 7 + nbytes).standard_normal(m).astype(np.float32)
            outs = [
                x.copy(),
                np.empty(m * n, np.float32),
                x.copy(),
                np.empty(b, np.float32),
                np.empty(b * n, np.float32),
                np.empty(b, np.float32),
                x.copy(),
            ]
            comm.all_reduce(outs[0])
            comm.all_gather(x, outs[1])
            comm.broadcast(outs[2], root=1 % n)
            comm.reduce_scatter(np.tile(x[:b], n), outs[3])
            comm.all_to_all(x[: b * n], outs[4])
            comm.scatter(np.tile(x[:b], n) if r == 0 else None, outs[5], root=0)
            comm.reduce(outs[6], root=0)
            gathered = np.empty(m * n, np.float32) if r == 0 else None
            comm.gather(x, gathered, root=0)
            for o in outs[:6] + ([outs[6], gathered] if r == 0 else []):
                h.update(o.tobytes())
    row["hash"] = h.hexdigest()
except uniccl.UnicclError as exc:
    row.update(error=type(exc).__name__, message=str(exc)[:300], remote_rank=getattr(exc, "remote_rank", None))
row.update({k: v for k, v in comm.stats().items() if k.startswith("shm_")})
print(json.dumps(row), flush=True)
