"""The compiled steady-state all_reduce (uniccl.comm._fastpath) against numpy, as users call
it: repeated calls of one shape are served compiled, anything else takes the general path, and
both give the same results, errors, flight-recorder entries and telemetry.

usage: fastpath.py MODE   (run under ``uniccl run -n N``)
MODE basic: the checks below, one line "rank R: ok SERVED" per rank.
MODE kill: rank 1 SIGKILLs itself inside a loop of served calls; the others must raise
RemoteError naming rank 1 (printed "rank R: RemoteError ...").
MODE misuse (2 ranks): what a served call must not do that the general path does not, "rank R:
misuse ok" per rank: learn from a call queued in a group (and then serve a call the checks
refuse, writing past a buffer), raise inside the group, run a call matched in one thread with
the shape another thread learnt meanwhile, start a persistent call on a buffer resized, retyped
or made read-only since init, take a buffer wrapper for a scalar because of its module's name,
stop serving a shape once called in a group, or let a persistent call start inside a group.
"""

import os
import signal
import sys
import time
import tracemalloc

import numpy as np

import uniccl
from uniccl.observability import flight

mode = sys.argv[1]
comm = uniccl.init()
r, n = comm.rank, comm.size
fast = comm._fast
assert fast is not None, "no compiled path on a shared-memory communicator"
tri = n * (n + 1) // 2  # sum over ranks of (rank + 1)


def expect(base, op="sum"):
    per_rank = np.array([base * (q + 1) for q in range(n)], dtype=np.float64)
    return {"sum": per_rank.sum(0), "max": per_rank.max(0), "min": per_rank.min(0), "prod": per_rank.prod(0)}[op]


if mode == "kill":
    # the launcher stops the job (SIGTERM) as soon as rank 1 dies: the survivors stay to report
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    x = np.ones(4, np.float64)
    try:
        for i in range(100000):
            comm.all_reduce(x)  # KILL-SITE
            if r == 1 and i == 500:
                os.kill(os.getpid(), signal.SIGKILL)
    except uniccl.RemoteError as exc:
        last = comm._flight.snapshot()["ops"][-1]  # the served call's row, now the recorder's failed entry
        assert last["op"] == "all_reduce" and last["state"] == "failed" and last["seq"] == comm._seq - 1, last
        line = next(i for i, t in enumerate(open(__file__), 1) if t.rstrip().endswith("# KILL-SITE") and "comm" in t)
        assert last["site"].endswith(f"fastpath.py:{line} (<module>)"), (last, line)
        print(f"rank {r}: RemoteError served={fast.served} {exc}", flush=True)
        sys.exit(0)
    sys.exit(f"rank {r}: no error")

if mode == "misuse":
    import threading

    assert n == 2
    # a. a call refused inside a group (float32 recvbuf for float64 data; a recvbuf of 4 for
    #    16384), then the same call outside it: refused again, every time, the buffers untouched
    for recv in (np.zeros(16384, np.float32), np.zeros(4, np.float64)):
        send = np.ones(16384, np.float64)
        for attempt in range(3):
            try:
                if attempt == 0:
                    with uniccl.group():
                        comm.all_reduce(send, recv)
                else:
                    comm.all_reduce(send, recv)
                sys.exit(f"rank {r}: all_reduce into {recv.dtype}[{recv.size}] was not refused")
            except uniccl.InvalidArgument as exc:
                assert exc.argument == "recvbuf", exc
            assert not recv.any() and (send == 1).all(), (attempt, recv[:4])
    # b. a bad op inside a group on rank 0 only: the group raises on every rank at its end
    #    (rank 0 InvalidArgument; rank 1 RemoteError naming it at once), nobody waits a timeout
    x = np.ones(8, np.float64)
    t0, raised = time.monotonic(), uniccl.InvalidArgument if r == 0 else uniccl.RemoteError
    try:
        with uniccl.group():
            comm.all_reduce(x, None, "bogus" if r == 0 else "sum")
        sys.exit(f"rank {r}: the group with a bad op did not raise")
    except raised as exc:
        assert "bogus" in str(exc) and time.monotonic() - t0 < 5, exc
    # c. thread A's call matches the learnt shape, then waits for the lock while this thread's
    #    call of another shape runs and is learnt: A must still reduce a, and b only once
    a = np.ones(8, np.float64)
    comm.all_reduce(a)
    comm.all_reduce(a)
    a[:] = r + 1.0
    b = np.full(1 << 17, r + 1.0)
    comm._lock.acquire()  # (reentrant: this thread's call below takes it again)
    ta = threading.Thread(target=comm.all_reduce, args=(a,))
    ta.start()
    time.sleep(0.3)  # A matched and waits at the lock
    comm.all_reduce(b)
    comm._lock.release()
    ta.join()
    assert np.array_equal(a, np.full(8, 3.0)) and np.array_equal(b, np.full(1 << 17, 3.0)), (a[:2], b[:2])
    # d. a persistent all_reduce whose buffer changed since init: start() as the ordinary call
    #    (checked again) -- resized (its memory moved), made read-only, retyped in place
    for change in ("resize", "readonly", "retype"):
        y = np.full(1 << 16, r + 1.0)
        req = comm.all_reduce_init(y)
        req.start()
        req.wait()
        assert np.array_equal(y, np.full(1 << 16, 3.0))
        if change == "resize":
            y.resize(1 << 17, refcheck=False)
            y[:] = r + 1.0
            req.start()
            assert req.wait() is y and np.array_equal(y, np.full(1 << 17, 3.0)), y[[0, -1]]
        elif change == "readonly":
            y.flags.writeable = False
            try:
                req.start()
                sys.exit(f"rank {r}: a start on a read-only buffer ran")
            except uniccl.InvalidArgument as exc:
                assert exc.argument == "sendbuf", exc
            assert np.array_equal(y, np.full(1 << 16, 3.0)), y[:2]
        else:
            y.dtype = np.float32  # the same bytes, twice the elements
            y[:] = r + 1.0
            req.start()
            req.wait()
            assert np.array_equal(y, np.full(1 << 17, 3.0, np.float32)), y[:4]
        req.free()

    # e. a buffer wrapper (DLPack) from a module whose name starts with "uniccl": its memory is
    #    read at every call, not the wrapper taken for a scalar compared by identity
    class Buf:
        __module__ = "uniccl_userbuf"

        def __init__(self, arr):
            self.arr = arr

        def __dlpack__(self, **kw):
            return self.arr.__dlpack__(**kw)

        def __dlpack_device__(self):
            return self.arr.__dlpack_device__()

    w = Buf(np.full(8, r + 1.0))
    comm.all_gather(np.ones(2), np.zeros(4))  # (another collective's shape between)
    for k in range(4):
        w.arr = np.full(8, (r + 1.0) * (k + 1))
        comm.reduce(w, None, "sum", 0)
        if r == 0:
            assert np.array_equal(w.arr, np.full(8, 3.0 * (k + 1))), (k, w.arr[:2])
    # f. a shape called once inside a group (queued there, not run) is served again after it
    x = np.zeros(1024)
    for _ in range(3):
        comm.broadcast(x, root=0)
    with uniccl.group():
        comm.broadcast(x, root=0)
    before = fast.served
    for k in range(50):
        x[:] = k if r == 0 else -1.0
        comm.broadcast(x, root=0)
        assert (x == k).all(), (k, x[:2])
    assert fast.served - before >= 49, fast.served - before
    # g. a persistent start inside a group: InvalidUsage on every rank (a group would only queue
    #    it: its wait() would return before anything moved), nothing moved; it starts after
    y = np.full(4, r + 1.0)
    req = comm.broadcast_init(y, root=1)
    try:
        with uniccl.group():
            req.start()
        sys.exit(f"rank {r}: a persistent start inside a group was taken")
    except uniccl.InvalidUsage as exc:
        assert "inside uniccl.group()" in str(exc), exc
    assert np.array_equal(y, np.full(4, r + 1.0)) and req.test(), y
    req.start()
    assert req.wait() is y and np.array_equal(y, np.full(4, 2.0)), y
    req.free()
    print(f"rank {r}: misuse ok", flush=True)
    comm.destroy()
    sys.exit(0)

# 1. in place, fresh values every call: each result checked against float64 numpy
base = np.arange(7, dtype=np.float64) + 0.5
x = np.empty(7, np.float64)
before = fast.served
for i in range(300):
    x[:] = base * (r + 1) + i
    assert comm.all_reduce(x) is x
    want = expect(base) + n * i
    assert np.array_equal(x, want), (i, x, want)
assert fast.served - before == 299, fast.served - before  # the first call learnt the shape

# 2. out of place, several ops; sendbuf untouched
for op in ("max", "min", "prod", "sum"):
    src = (np.arange(5, dtype=np.float32) + 1) * (r + 1)
    out = np.full(5, -1, np.float32)
    before = fast.served
    for _ in range(20):
        assert comm.all_reduce(src, out, op=op) is out
        assert np.array_equal(out, expect(np.arange(5) + 1.0, op).astype(np.float32)), (op, out)
        assert np.array_equal(src, (np.arange(5, dtype=np.float32) + 1) * (r + 1))
    assert fast.served - before == 19, (op, fast.served - before)

# 3. AVG is never served compiled (its scaling is the general path's), and is right
y = np.full(3, 2.0 * (r + 1))
before = fast.served
for _ in range(5):
    y[:] = 2.0 * (r + 1)
    comm.all_reduce(y, op="avg")
    assert np.allclose(y, 2.0 * tri / n), y
assert fast.served == before

# 4. another array of the same shape: a miss, then served again, results right
z = np.empty(7, np.float64)
for _ in range(3):
    z[:] = base * (r + 1)
    comm.all_reduce(z)
    assert np.array_equal(z, expect(base))

# 5. the learnt address, now read-only: InvalidArgument naming recvbuf, not a compiled write
out = np.zeros(5, np.float32)
src = np.ones(5, np.float32)
comm.all_reduce(src, out)
comm.all_reduce(src, out)
ro = out.view()
ro.flags.writeable = False
try:
    comm.all_reduce(src, ro)
    sys.exit(f"rank {r}: a read-only recvbuf was accepted")
except uniccl.InvalidArgument as exc:
    assert exc.argument == "recvbuf" and exc.op == "all_reduce", exc

# 6. a mismatch after the shape was learnt: InvalidUsage on every rank, then calls are right
a = np.ones(6)
comm.all_reduce(a)
comm.all_reduce(a)
b = np.ones(6) if r == 0 else np.ones(5)
try:
    comm.all_reduce(b if r else a)
    sys.exit(f"rank {r}: a mismatched count was not caught")
except uniccl.InvalidUsage as exc:
    assert "mismatched call" in str(exc) and "count" in str(exc), exc
a[:] = r + 1
comm.all_reduce(a)
assert np.array_equal(a, np.full(6, float(tri))), a

# 7. the flight recorder: served calls recorded like general ones (numbers, states, call site)
seq0 = fast.served
w = np.ones(2)
t_before = time.time()
for _ in range(4):
    comm.all_reduce(w)  # SITE
t_after = time.time()
line = next(i for i, t in enumerate(open(__file__), 1) if t.rstrip().endswith("# SITE") and "comm" in t)
ops = comm._flight.snapshot()["ops"][-4:]
# the compiled path's own clock (the TSC where the kernel keeps time by it) on time.time()'s scale,
# 1 ms allowed, and again after a re-anchor (every 0.25 s)
for o in ops:
    assert t_before - 1e-3 <= o["t_enqueued"] <= o["t_completed"] <= t_after + 1e-3, (o, t_before, t_after)
time.sleep(0.3)
comm.all_reduce(w)
t_later = time.time()
o = comm._flight.snapshot()["ops"][-1]
assert t_after - 1e-3 <= o["t_enqueued"] <= o["t_completed"] <= t_later + 1e-3, (o, t_after, t_later)
assert [o["state"] for o in ops] == ["completed"] * 4, ops
assert [o["seq"] for o in ops] == list(range(ops[0]["seq"], ops[0]["seq"] + 4)), ops
assert all(o["site"].endswith(f"fastpath.py:{line} (<module>)") for o in ops), (ops, line)
assert all(o["op"] == "all_reduce" and o["count"] == 2 for o in ops), ops
assert fast.served - seq0 >= 3

# 8. telemetry (UNICCL_TELEMETRY=1): every call counted, served or not
if comm._telemetry is not None:
    from uniccl.observability import telemetry

    calls = telemetry.summary(comm._telemetry)["all_reduce"]["calls"]
    assert calls == comm._seq - comm._telemetry.failed.get("all_reduce", 0) - 0, (calls, comm._seq)
    # the served calls' durations (the compiled path's clock) against perf_counter around them
    s0 = telemetry.summary(comm._telemetry)["all_reduce"]["seconds"]
    t0 = time.perf_counter()
    for _ in range(2000):
        comm.all_reduce(w)
    loop = time.perf_counter() - t0
    inside = telemetry.summary(comm._telemetry)["all_reduce"]["seconds"] - s0
    assert 0.2 * loop < inside <= 1.02 * loop + 1e-4, (inside, loop)

# 9. no allocation per served call: tracemalloc over 10^4 calls
# (traced from before the flight recorder's ring turned over once: its entries are traced too)
v = np.ones(2, np.float32)
tracemalloc.start()
for _ in range(flight.DEFAULT_CAPACITY + 500):
    comm.all_reduce(v)
first = tracemalloc.take_snapshot()
for _ in range(10000):
    comm.all_reduce(v)
second = tracemalloc.take_snapshot()
tracemalloc.stop()
blocks = sum(s.count_diff for s in second.compare_to(first, "filename"))
assert blocks < 100, f"{blocks} blocks more after 10^4 calls"  # one a call would be 10^4 (the few: the snapshot itself)

# 10. a forked child may not use its parent's communicator, compiled or not
pid = os.fork()
if pid == 0:
    try:
        comm.all_reduce(v)
        os._exit(3)
    except uniccl.InvalidUsage:
        os._exit(0)
    except BaseException:
        os._exit(4)
assert os.waitpid(pid, 0)[1] == 0, "the forked child used its parent's communicator"

# 10b. a learnt shape inside ``with uniccl.group()``: recorded by the general path and run at the
# block's end (NCCL group semantics), never served on the spot; served again after the block
g = np.empty(3)
for _ in range(3):
    g[:] = r + 1
    comm.all_reduce(g)
before = fast.served
g[:] = r + 1
with uniccl.group():
    work = comm.all_reduce(g)
    assert fast.served == before, "a call inside a group was served compiled"
    assert np.array_equal(g, np.full(3, r + 1.0)), g  # not run yet
work.wait()
assert np.array_equal(g, np.full(3, float(tri))), g
g[:] = r + 1
comm.all_reduce(g)
assert fast.served == before + 1 and np.array_equal(g, np.full(3, float(tri))), (fast.served - before, g)

# 11. the other collectives: the second and later calls of a shape are served compiled; every
# result against numpy, and each returns what the general path returned on the first call
m = 3


def block(q, i):
    return np.arange(m, dtype=np.float64) + 10 * q + i


def check_loop(name, call, want):
    before = fast.served
    for i in range(6):
        got, ret, expected_ret = call(i)
        assert np.array_equal(got, want(i)), (name, i, got, want(i))
        assert ret is expected_ret, (name, i, ret)
    assert fast.served - before == 5, (name, fast.served - before)


for root in (0, n - 1):
    bbuf = np.empty(m)

    def bcast(i, root=root, bbuf=bbuf):
        bbuf[:] = block(r, i)
        return bbuf, comm.broadcast(bbuf, root=root), bbuf

    check_loop("broadcast", bcast, lambda i, root=root: block(root, i))

    rsend, rrecv = np.empty(m), np.empty(m)

    def red(i, root=root, rsend=rsend, rrecv=rrecv):
        rsend[:] = block(r, i)
        ret = comm.reduce(rsend, rrecv if r == root else None, root=root)
        return (rrecv if r == root else rsend), ret, (rrecv if r == root else None)

    check_loop(
        "reduce",
        red,
        lambda i, root=root: sum(block(q, i) for q in range(n)) if r == root else block(r, i),
    )

gsend, grecv = np.empty(m), np.empty(m * n)


def ag(i):
    gsend[:] = block(r, i)
    return grecv, comm.all_gather(gsend, grecv), grecv


check_loop("all_gather", ag, lambda i: np.concatenate([block(q, i) for q in range(n)]))

inpl = np.empty(m * n)


def ag_inplace(i):  # a new view of block r each call: same address, served
    inpl[r * m : (r + 1) * m] = block(r, i)
    return inpl, comm.all_gather(inpl[r * m : (r + 1) * m], inpl), inpl


check_loop("all_gather in place", ag_inplace, lambda i: np.concatenate([block(q, i) for q in range(n)]))

rs_send, rs_recv = np.empty(m * n), np.empty(m)


def rs(i):
    rs_send[:] = np.concatenate([block(r, i + b) for b in range(n)])
    return rs_recv, comm.reduce_scatter(rs_send, rs_recv, op="max"), rs_recv


check_loop("reduce_scatter", rs, lambda i: np.max([block(q, i + r) for q in range(n)], axis=0))

a2a_send, a2a_recv = np.empty(m * n), np.empty(m * n)


def a2a(i):
    a2a_send[:] = np.concatenate([block(r, i + 100 * b) for b in range(n)])
    return a2a_recv, comm.all_to_all(a2a_send, a2a_recv), a2a_recv


check_loop("all_to_all", a2a, lambda i: np.concatenate([block(q, i + 100 * r) for q in range(n)]))

ga_send, ga_recv = np.empty(m), np.zeros(m * n)


def ga(i):
    ga_send[:] = block(r, i)
    ret = comm.gather(ga_send, ga_recv if r == 0 else None, root=0)
    return ga_recv, ret, (ga_recv if r == 0 else None)


check_loop(
    "gather",
    ga,
    lambda i: np.concatenate([block(q, i) for q in range(n)]) if r == 0 else np.zeros(m * n),
)

sc_send, sc_recv = np.empty(m * n), np.empty(m)


def sc(i):
    sc_send[:] = np.concatenate([block(b, i) for b in range(n)])
    ret = comm.scatter(sc_send if r == 0 else None, sc_recv, root=0)
    return sc_recv, ret, sc_recv


check_loop("scatter", sc, lambda i: block(r, i))
before = fast.served
for _ in range(4):
    assert comm.barrier() is None
assert fast.served - before == 3


# 12. the record rides on every collective's data: ranks that call different collectives (or
# roots) as one call, at a size on the slots and one read single-copy, all raise InvalidUsage
# naming both, and nothing moved: the next calls are right
def mover(name, elems):
    s, rv = np.full(elems, r + 1.0), np.zeros(elems * n)
    return {
        "broadcast": lambda: comm.broadcast(s, root=0),
        "broadcast1": lambda: comm.broadcast(s, root=n - 1),
        "all_gather": lambda: comm.all_gather(s, rv),
        "gather": lambda: comm.gather(s, rv if r == 0 else None, root=0),
        "scatter": lambda: comm.scatter(rv if r == 0 else None, s, root=0),
        "all_to_all": lambda: comm.all_to_all(rv, np.zeros(elems * n)),
        "reduce_scatter": lambda: comm.reduce_scatter(rv, s),
        "reduce": lambda: comm.reduce(s, np.zeros(elems) if r == 0 else None, root=0),
        "all_reduce": lambda: comm.all_reduce(s),
        "barrier": lambda: comm.barrier(),
    }[name]


pairs = [
    ("broadcast", "gather"),
    ("broadcast", "broadcast1"),
    ("all_gather", "scatter"),
    ("all_to_all", "reduce"),
    ("reduce_scatter", "all_gather"),
    ("gather", "all_reduce"),
    ("scatter", "barrier"),
]
for elems in (4, 1 << 17):  # 32 B, and 1 MiB blocks (single-copy reads, or several slot chunks)
    for mine, theirs in pairs:
        calls = {name: mover(name, elems) for name in (mine, theirs)}
        for name in (mine, theirs, mine, theirs):  # each learnt: compiled on every rank from here
            calls[name]()
        try:
            calls[mine if r == 0 else theirs]()
            sys.exit(f"rank {r}: {mine} against {theirs} ({elems} elements) was not caught")
        except uniccl.InvalidUsage as exc:
            assert "mismatched call" in str(exc), (mine, theirs, exc)
        t = np.full(5, r + 1.0)
        comm.all_reduce(t)
        assert np.array_equal(t, np.full(5, float(tri))), (mine, theirs, elems, t)

served = fast.served
comm.destroy()
try:
    comm.all_reduce(v)
    sys.exit(f"rank {r}: a destroyed communicator ran a call")
except uniccl.InvalidUsage:
    pass
print(f"rank {r}: ok {served} blocks={blocks}", flush=True)
