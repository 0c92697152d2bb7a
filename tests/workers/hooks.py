"""One rank of a job with hooks (tests/test_hooks.py): every rank adds uniccl.hooks.nan_check and
a recording hook; rank 1's input to call #2 holds a NaN.  Then a persistent all_reduce with the
hooks on, and again after they are removed.  Prints one JSON line per rank."""

import json

import numpy as np

import uniccl
import uniccl.hooks

comm = uniccl.init()
r, n = comm.rank, comm.size
seen = []
compiled = comm._fast is not None  # (shared memory: the compiled path; TCP has none)
check = comm.add_hook(pre=uniccl.hooks.nan_check)
record = comm.add_hook(
    pre=lambda c: seen.append(("pre", c.op, c.seq, c.dtype, c.count, len(c.inputs))),
    post=lambda c, res: seen.append(("post", c.op, c.seq)),
    on_error=lambda c, exc: seen.append(("error", c.op, c.seq, type(exc).__name__)),
)
row = {"rank": r}
want = lambda k: sum(np.arange(8, dtype=np.float64) + q + k for q in range(n))  # noqa: E731
for k in range(2):
    x = np.arange(8, dtype=np.float32) + r + k
    comm.all_reduce(x)
    assert np.array_equal(x, want(k)), (k, x)
x = np.arange(8, dtype=np.float32) + r + 2
if r == 1:
    x[5] = np.nan
before = x.copy()
try:
    comm.all_reduce(x)
    row["raised"] = None
except uniccl.UnicclError as exc:
    row.update(raised=type(exc).__name__, message=str(exc), remote=getattr(exc, "remote_rank", None))
row["unchanged"] = bool(np.array_equal(x, before, equal_nan=True))  # nothing moved (shared memory)
row["no_nan_here"] = r == 1 or bool(np.isfinite(x).all())  # the NaN never left rank 1
x = np.arange(8, dtype=np.float32) + r + 3
comm.all_reduce(x)  # the communicator goes on
row["after_ok"] = bool(np.array_equal(x, want(3)))
y = np.arange(8, dtype=np.float32) + r + 4
req = comm.all_reduce_init(y)
req.start()
req.wait()
row["persistent_ok"] = bool(np.array_equal(y, want(4)))
check.remove()
record.remove()
z = np.arange(8, dtype=np.float32) + r + 5
comm.all_reduce(z)
comm.all_reduce(z)  # (the compiled path again: no hook sees these)
row["seen"] = seen
row["compiled_again"] = (comm._fast is not None) == compiled
comm.destroy()
print(json.dumps(row), flush=True)
