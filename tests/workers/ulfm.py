"""One rank of an MPI job under ULFM (``mpiexec --with-ft ulfm``, tests/test_ulfm.py): every rank
loops all_reduce; the last rank SIGKILLs itself at step 5.  The survivors' call raises
RemoteError naming it (no job abort), they shrink() to a communicator of the survivors and run
an all_reduce on it, checked against numpy (float64).  Prints one JSON line per survivor."""

import faulthandler
import json
import os
import signal
import sys
import time

import numpy as np

import uniccl

faulthandler.dump_traceback_later(60, exit=True)  # a hang says where, inside the test's 120 s
comm = uniccl.init(timeout=30)
rank, size = comm.rank, comm.size
victim = size - 1
row = {"rank": rank, "transport": comm.tuner.transport, "can_shrink": comm._t.can_shrink}
row["async_finalize"] = os.environ.get("OMPI_MCA_async_mpi_finalize")  # uniccl's, before MPI_Init
x = np.empty(1 << 14)
t_fail = None
try:
    for step in range(100):
        if rank == victim and step == 5:
            os.kill(os.getpid(), signal.SIGKILL)
        x[:] = np.arange(x.size) + rank + step
        t0 = time.monotonic()
        comm.all_reduce(x)
        want = sum(np.arange(x.size, dtype=np.float64) + r + step for r in range(size))
        assert np.array_equal(x, want), f"rank {rank} step {step}: wrong sum"
    sys.exit(f"rank {rank}: no call failed although rank {victim} was killed")
except uniccl.RemoteError as exc:
    row.update(error=type(exc).__name__, remote_rank=exc.remote_rank, text=str(exc), step=step)
    row["detect_s"] = round(time.monotonic() - t0, 3)
t = time.monotonic()
new = comm.shrink()
row["shrink_s"] = round(time.monotonic() - t, 3)
y = np.full(1000, new.rank + 1.0)
new.all_reduce(y)
row.update(new_rank=new.rank, new_size=new.size, sum_ok=bool(np.array_equal(y, np.full(1000, 3.0))))
new.destroy()
comm.destroy()
print(json.dumps(row), flush=True)
