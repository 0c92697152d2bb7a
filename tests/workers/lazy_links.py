"""A job over uniccl's own TCP transport whose ranks hold links only to the peers their calls
use (transport/tcp/heal.py: a pair connects at first use).  Each rank runs all_reduce and
broadcast at 8 B and 64 KiB (checked against numpy, float64) and a barrier, and then reports
what it holds: established TCP
sockets (its /proc/self/fd sockets found in /proc/self/net/tcp*, counted by the kernel, not by
uniccl), the mesh's links, and its reader threads.  One JSON line per rank.

usage: lazy_links.py   (under UNICCL_TRANSPORT=tcp uniccl run -n N)"""

import json
import os
import threading

import numpy as np

import uniccl


def established_tcp() -> int:
    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            link = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:  # (listdir's own fd, closed meanwhile)
            continue
        if link.startswith("socket:["):
            inodes.add(link[8:-1])
    count = 0
    for table in ("/proc/self/net/tcp", "/proc/self/net/tcp6"):
        with open(table) as f:
            next(f)
            count += sum(1 for line in f if line.split()[3] == "01" and line.split()[9] in inodes)  # 01: ESTABLISHED
    return count


comm = uniccl.init()
r, n = comm.rank, comm.size
ok = True
for count in (2, 16384):  # 8 B and 64 KiB of float32
    base = (np.arange(count) % 251).astype(np.float64)
    x = (base * (r + 1)).astype(np.float32)
    comm.all_reduce(x)
    want = base * (n * (n + 1) / 2)  # every rank's base * (rank + 1), summed in float64
    ok = ok and bool(np.allclose(x, want, rtol=1e-6))
    b = base.astype(np.float32) + 7 if r == 0 else np.zeros(count, np.float32)
    comm.broadcast(b, root=0)  # a binomial tree; its records go round by dissemination beyond 8 ranks
    ok = ok and bool(np.array_equal(b, (base + 7).astype(np.float32)))
comm.barrier()  # records only: a ring, then dissemination (rank +- 2^k)
comm.barrier()  # (no rank exits before every rank has counted: at exit a rank syncs with its links)
mesh = comm._t.mesh
row = {
    "rank": r,
    "ok": ok,
    "transport": comm._t.name,
    "tcp_established": established_tcp(),
    "links": sum(s is not None for s in mesh.socks),
    "peers": [p for p, s in enumerate(mesh.socks) if s is not None],
    "readers": sum(
        t.name.startswith(f"uniccl-tcp-r{r}-poll") for t in threading.enumerate()
    ),  # (not handshakes, not link threads)
    "threads": threading.active_count(),
}
print(json.dumps(row), flush=True)
comm.destroy()
