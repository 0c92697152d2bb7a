"""Jobs over the TCP mesh under UNICCL_TCP_TLS=1.  One JSON line per rank.

usage: tcp_tls.py MODE [ARG]   (under UNICCL_TRANSPORT=tcp uniccl run -n N)
  check        collectives at several sizes against numpy; what each connection is (TLS version,
               cipher, the peer certificate's SHA-256 against the one it published)
  canary HEX   rank 0 broadcasts 4 MiB of the ASCII pattern HEX repeated (the test looks for it on the wire)
  wrong-cert   the last rank publishes another certificate than the one it holds: it must be refused
  die          all_reduce in a loop; UNICCL_FAULT_INJECT=kill_at=..,kill_rank=.. kills one rank mid-job"""

import hashlib
import json
import sys

import numpy as np

import uniccl
from uniccl.transport import tcp as _tcp

mode = sys.argv[1]
row: dict = {"mode": mode}

if mode == "wrong-cert":  # this process publishes a fresh certificate but keeps its own key and certificate
    import os

    if os.environ.get("UNICCL_RANK") == str(int(os.environ["UNICCL_WORLD_SIZE"]) - 1):
        other = _tcp._TLSIdentity()
        forged = other.public()
        other.discard()
        _tcp._TLSIdentity.public = lambda self: forged

try:
    comm = uniccl.init()
except uniccl.UnicclError as exc:
    row.update(error=type(exc).__name__, message=str(exc))
    print(json.dumps(row), flush=True)
    sys.exit(3)
r, n = comm.rank, comm.size
row["rank"] = r
mesh = comm._t.mesh
try:
    if mode == "check":
        ok = True
        for count in (1, 1000, 65536 + 3, 1 << 20, 5 << 20):
            base = (np.arange(count) % 977).astype(np.float32)
            x = base + r
            comm.all_reduce(x)
            ok &= bool(np.array_equal(x, base * n + sum(range(n))))
            b = base + 7 if r == n - 1 else np.zeros(count, np.float32)
            comm.broadcast(b, root=n - 1)
            ok &= bool(np.array_equal(b, base + 7))
            out = np.zeros(n * count, np.float32)
            comm.all_gather(base + r, out)
            ok &= bool(np.array_equal(out, np.concatenate([base + p for p in range(n)])))
        row["ok"] = ok
        links = {}
        for p in range(n):
            if p == r:
                continue
            tls = mesh._outs[p].tls
            links[p] = (
                None
                if tls is None
                else {
                    "version": tls.version(),
                    "cipher": tls.cipher()[0],
                    "socket": type(tls.sock).__name__,
                    "pinned": hashlib.sha256(tls.obj.getpeercert(binary_form=True)).hexdigest()
                    == mesh.table[p]["tls"]["sha256"],
                }
            )
        row["links"] = links
    elif mode == "canary":
        pattern = sys.argv[2].encode()
        want = np.frombuffer((pattern * ((4 << 20) // len(pattern) + 1))[: 4 << 20], np.uint8)
        buf = want.copy() if r == 0 else np.zeros(want.size, np.uint8)
        for _ in range(3):
            comm.broadcast(buf, root=0)
        row["ok"] = bool(np.array_equal(buf, want))
    elif mode == "wrong-cert":  # init() links no one: the first call meets the refusal
        comm.all_reduce(np.ones(4, np.float32), timeout=30)
        row["ok"] = True
    elif mode == "die":
        x = np.ones(1 << 18, np.float32)
        for _i in range(20):
            comm.all_reduce(x)
        row["ok"] = True
    else:
        raise SystemExit(f"unknown mode {mode}")
except uniccl.UnicclError as exc:
    row.update(error=type(exc).__name__, message=str(exc), remote=getattr(exc, "remote_rank", None))
print(json.dumps(row), flush=True)
if mode == "wrong-cert" and "error" in row:
    sys.exit(3)  # (as at init: the job fails)
comm.destroy()
