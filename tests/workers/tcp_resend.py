"""Two ranks that each must resend to the other at once: an all_gather of large blocks under
UNICCL_FAULT_INJECT=flip=P (the receiver of a damaged block asks for it again, so both ranks'
retransmissions of kept 32 MiB blocks cross).  One JSON line per rank.

usage: tcp_resend.py TOTAL_BYTES CALLS   (under UNICCL_TRANSPORT=tcp uniccl run -n 2)"""

import json
import sys
import time

import numpy as np

import uniccl

total, calls = int(sys.argv[1]), int(sys.argv[2])
comm = uniccl.init()
n, r = comm.size, comm.rank
block = total // n // 4  # float32 elements per rank
ok, t0 = True, time.monotonic()
for i in range(calls):
    mine = (np.arange(block, dtype=np.float32) * (r + 1) + i).astype(np.float32)
    out = np.zeros(n * block, np.float32)
    comm.all_gather(mine, out)
    want = np.concatenate([(np.arange(block, dtype=np.float32) * (p + 1) + i).astype(np.float32) for p in range(n)])
    ok = ok and bool(np.array_equal(out, want))
stats = comm.stats()
print(
    json.dumps(
        {
            "rank": r,
            "ok": ok,
            "seconds": round(time.monotonic() - t0, 2),
            "retransmits": stats.get("retransmits"),
            "retransmit_requests": stats.get("retransmit_requests"),
            "checksum_failures": stats.get("checksum_failures"),
        }
    ),
    flush=True,
)
comm.destroy()
