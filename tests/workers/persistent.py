"""Persistent collectives (``comm.all_reduce_init`` and kin, MPI 4's ``*_init``) as users call
them: made once, started many times on buffers the program refills, every result checked
against float64 numpy; misuse and mismatches raise typed errors on every rank.

usage: persistent.py   (under ``mpiexec -n N`` or ``uniccl run -n N``, any transport)
Prints "rank R: ok SERVED" (SERVED: starts that took the compiled shared-memory path).
"""

import sys
import tracemalloc

import numpy as np

import uniccl
from uniccl.observability import flight

comm = uniccl.init()
r, n = comm.rank, comm.size
fast = comm._fast
served0 = fast.served if fast is not None else 0
m = 5


def block(q, i):
    return np.arange(m, dtype=np.float64) + 10 * q + i


def loop(req, refill, want, out):
    for i in range(8):
        refill(i)
        req.start()
        ret = req.wait()
        assert ret is out, (req, ret)
        got = out if out is not None else None
        if got is not None:
            assert np.array_equal(got, want(i)), (req, i, got, want(i))
    assert req.test()


# every collective, every result against numpy
x = np.empty(m)
req = comm.all_reduce_init(x)
loop(req, lambda i: x.__setitem__(slice(None), block(r, i)), lambda i: sum(block(q, i) for q in range(n)), x)

s, y = np.empty(m, np.float32), np.empty(m, np.float32)
req = comm.all_reduce_init(s, y, op=uniccl.ReduceOp.MAX)
loop(req, lambda i: s.__setitem__(slice(None), block(r, i)), lambda i: block(n - 1, i).astype(np.float32), y)

for root in (0, n - 1):
    b = np.empty(m)
    req = comm.broadcast_init(b, root=root)
    loop(req, lambda i: b.__setitem__(slice(None), block(r, i)), lambda i, root=root: block(root, i), b)

    rs, rr = np.empty(m), np.empty(m)
    req = comm.reduce_init(rs, rr if r == root else None, root=root)
    for i in range(4):
        rs[:] = block(r, i)
        req.start()
        assert req.wait() is (rr if r == root else None)
        if r == root:
            assert np.array_equal(rr, sum(block(q, i) for q in range(n))), rr

gs, gr = np.empty(m), np.empty(m * n)
req = comm.all_gather_init(gs, gr)
loop(
    req,
    lambda i: gs.__setitem__(slice(None), block(r, i)),
    lambda i: np.concatenate([block(q, i) for q in range(n)]),
    gr,
)

rss, rsr = np.empty(m * n), np.empty(m)
req = comm.reduce_scatter_init(rss, rsr, op="min")
loop(
    req,
    lambda i: rss.__setitem__(slice(None), np.concatenate([block(r, i + b) for b in range(n)])),
    lambda i: np.min([block(q, i + r) for q in range(n)], axis=0),
    rsr,
)

a2s, a2r = np.empty(m * n), np.empty(m * n)
req = comm.all_to_all_init(a2s, a2r)
loop(
    req,
    lambda i: a2s.__setitem__(slice(None), np.concatenate([block(r, i + 100 * b) for b in range(n)])),
    lambda i: np.concatenate([block(q, i + 100 * r) for q in range(n)]),
    a2r,
)

gas, gar = np.empty(m), np.zeros(m * n)
req = comm.gather_init(gas, gar if r == 0 else None, root=0)
for i in range(4):
    gas[:] = block(r, i)
    req.start()
    assert req.wait() is (gar if r == 0 else None)
    if r == 0:
        assert np.array_equal(gar, np.concatenate([block(q, i) for q in range(n)])), gar

scs, scr = np.empty(m * n), np.empty(m)
req = comm.scatter_init(scs if r == 0 else None, scr, root=0)
loop(
    req,
    lambda i: scs.__setitem__(slice(None), np.concatenate([block(b, i) for b in range(n)])),
    lambda i: block(r, i),
    scr,
)

req = comm.barrier_init()
for _ in range(3):
    req.start()
    assert req.wait() is None

# a start queued (async_op=True), then waited for; two persistent calls in turn
p1, p2 = np.empty(m), np.empty(m)
q1, q2 = comm.all_reduce_init(p1), comm.broadcast_init(p2, root=0)
for i in range(3):
    p1[:], p2[:] = block(r, i), block(r, i + 1)
    q1.start(async_op=True)
    q2.start()
    assert q1.wait() is p1 and q2.wait() is p2
    assert np.array_equal(p1, sum(block(q, i) for q in range(n))) and np.array_equal(p2, block(0, i + 1))

# misuse: typed errors naming the call, on this rank only (nothing was sent)
for bad, what in ((lambda: q1.wait(), "not started"), (lambda: (q1.start(), q1.start()), "still active")):
    try:
        bad()
        sys.exit(f"rank {r}: {what} was accepted")
    except uniccl.InvalidUsage as exc:
        assert what in str(exc) and exc.op == "all_reduce" and exc.rank == r, exc
q1.wait()
q1.free()
try:
    q1.start()
    sys.exit(f"rank {r}: a freed persistent call started")
except uniccl.InvalidUsage as exc:
    assert "freed" in str(exc), exc

# a bad argument at init: InvalidArgument here, RemoteError naming rank 0 everywhere else
try:
    comm.all_reduce_init(np.ones(3), np.ones(2) if r == 0 else None)
    sys.exit(f"rank {r}: a bad init was accepted")
except uniccl.InvalidArgument as exc:
    assert r == 0 and exc.argument == "recvbuf" and exc.op == "all_reduce", exc
except uniccl.RemoteError as exc:
    assert r != 0 and exc.remote_rank == 0, exc

# ranks that init different counts: InvalidUsage on every rank, at init
if n > 1:
    try:
        comm.all_reduce_init(np.ones(3 if r == 0 else 4))
        sys.exit(f"rank {r}: mismatched inits were accepted")
    except uniccl.InvalidUsage as exc:
        assert "mismatched call" in str(exc) and "count" in str(exc), exc

    # started out of order: rank 0 starts the all_reduce, the others the broadcast
    u, w = np.ones(m), np.ones(m)
    ru, rw = comm.all_reduce_init(u), comm.broadcast_init(w, root=0)
    try:
        (ru if r == 0 else rw).start()
        sys.exit(f"rank {r}: persistent calls started out of order were not caught")
    except uniccl.InvalidUsage as exc:
        assert "mismatched call" in str(exc) and "all_reduce" in str(exc) and "broadcast" in str(exc), exc
    u[:] = r + 1
    ru.start()
    ru.wait()
    assert np.array_equal(u, np.full(m, n * (n + 1) / 2)), u

# no allocation per start in steady state (tracemalloc over 10^4 starts)
v = np.ones(2, np.float32)
rv = comm.all_reduce_init(v)
tracemalloc.start()  # before the flight recorder's ring turns over: its entries are traced too
for _ in range(flight.DEFAULT_CAPACITY + 500):
    rv.start()
    rv.wait()
first = tracemalloc.take_snapshot()
for _ in range(10000):
    rv.start()
    rv.wait()
second = tracemalloc.take_snapshot()
tracemalloc.stop()
blocks = sum(st.count_diff for st in second.compare_to(first, "filename"))
served = (fast.served if fast is not None else 0) - served0
comm.destroy()
print(f"rank {r}: ok {served} blocks={blocks}", flush=True)
