"""One rank of a job whose communicator rank 0 revokes from a watchdog thread (tests/test_revoke.py).

Every rank learns a shape first (two all_reduces: the compiled path serves the third).  Then
ranks 0..n-2 call all_reduce while rank n-1 is late (it sleeps, as a hung rank would); rank 0's
watchdog thread revokes the communicator 0.3 s into the call.  Every rank records when its call
raised Revoked (the late rank's when it arrives), then calls once more (Revoked at once), and
then the revoked communicator still works for shrink() and split(): each new communicator's
all_reduce is checked against numpy (float64).  Prints one JSON line per rank."""

import json
import sys
import threading
import time

import numpy as np

import uniccl

REASON = "watchdog: step 3 took too long"
comm = uniccl.init()
rank, size = comm.rank, comm.size
x = np.arange(4096, dtype=np.float64) + rank
for _ in range(2):
    x[:] = np.arange(4096) + rank
    comm.all_reduce(x)
assert np.array_equal(x, sum(np.arange(4096, dtype=np.float64) + r for r in range(size)))
comm.barrier()
row = {"rank": rank}
if rank == 0:

    def watchdog():
        time.sleep(0.3)
        row["t_revoke"] = time.time()
        comm.revoke(REASON)

    threading.Thread(target=watchdog, daemon=True).start()
if rank == size - 1:
    time.sleep(2.0)  # not in the call when it is revoked
t0 = time.time()
try:
    comm.all_reduce(x)
    sys.exit(f"rank {rank}: the all_reduce of a revoked communicator returned")
except uniccl.Revoked as exc:
    row.update(t_raised=time.time(), waited=time.time() - t0, remote_rank=exc.remote_rank, text=str(exc))
t1 = time.time()
try:
    comm.broadcast(x, root=0)
    sys.exit(f"rank {rank}: the broadcast after the revoke returned")
except uniccl.Revoked as exc:
    row.update(again=time.time() - t1, again_text=str(exc))
new = comm.shrink()
y = np.full(1000, rank + 1.0)
new.all_reduce(y)
row.update(shrunk_size=new.size, shrunk_ok=bool(np.array_equal(y, np.full(1000, size * (size + 1) / 2))))
half = comm.split(rank % 2)
z = np.full(10, float(rank))
half.all_reduce(z)
want = float(sum(r for r in range(size) if r % 2 == rank % 2))
row.update(split_size=half.size, split_ok=bool(np.array_equal(z, np.full(10, want))))
half.destroy()
new.destroy()
comm.destroy()
print(json.dumps(row), flush=True)
