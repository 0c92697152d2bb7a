"""API behaviour across real ranks: async, groups, send/recv, split, unique-id init,
from_mpi, barrier, return values.  usage: api.py CASE [CASE ...]; exit 1 on failure."""

from __future__ import annotations

import sys
import time
import traceback

import numpy as np

import uniccl

world = None  # MPI.COMM_WORLD, set in main() (importing this file must not start MPI)


def case_async_returns_before_completion(comm):
    # the last rank joins late: everyone else's async call must return at once
    x = np.full(1 << 16, comm.rank + 1.0)
    y = np.full(100, float(comm.rank))
    late = comm.rank == comm.size - 1 and comm.size > 1
    if late:
        time.sleep(0.5)
    t0 = time.monotonic()
    w1 = comm.all_reduce(x, async_op=True)
    w2 = comm.broadcast(y, root=0, async_op=True)
    issued = time.monotonic() - t0
    if comm.size > 1 and not late:
        assert issued < 0.2, f"async call blocked for {issued:.3f} s"
        assert not w1.is_completed(), "completed although a peer had not joined yet"
    assert w1.wait() is x and w2.wait() is y
    assert w1.is_completed() and w2.is_completed()
    assert np.all(x == comm.size * (comm.size + 1) / 2) and np.all(y == 0)


def case_async_many_in_order(comm):
    bufs = [np.full(1000 + i, float(i + comm.rank)) for i in range(8)]
    works = [comm.all_reduce(b, async_op=True) for b in bufs]
    sync = np.ones(3)
    comm.all_reduce(sync)  # a blocking call queued behind the async ones
    for i, (w, b) in enumerate(zip(works, bufs)):
        w.wait(timeout=30)
        expect = comm.size * i + comm.size * (comm.size - 1) / 2
        assert np.all(b == expect), (i, b[:3], expect)
    assert np.all(sync == comm.size)


def case_send_recv(comm):
    if comm.size < 2:
        return
    if comm.rank == 0:
        for k in range(3):  # matched in order
            comm.send(np.full(10, k, np.int32), 1)
    elif comm.rank == 1:
        for k in range(3):
            got = np.zeros(10, np.int32)
            assert comm.recv(got, 0) is got
            assert np.all(got == k), got


def case_group_ring_exchange(comm):
    n, r = comm.size, comm.rank
    out = np.full(5, r, np.int64)
    inc = np.full(5, -1, np.int64)
    total = np.ones(4)
    with uniccl.group():
        # receive first, send second: would deadlock for large messages without the group
        wr = comm.recv(inc, (r - 1) % n)
        ws = comm.send(out, (r + 1) % n)
        wa = comm.all_reduce(total)
        assert not wa.is_completed()
    for w in (wr, ws, wa):
        assert w.is_completed()
        w.wait()
    assert np.all(inc == (r - 1) % n), inc
    assert np.all(total == n)


def case_group_large_pairwise(comm):
    n, r = comm.size, comm.rank
    sends = [np.full(1 << 18, r * 100 + p, np.float32) for p in range(n)]
    recvs = [np.zeros(1 << 18, np.float32) for _ in range(n)]
    with uniccl.group():
        for p in range(n):
            comm.send(sends[p], p)
        for p in range(n):
            comm.recv(recvs[p], p)
    for p in range(n):
        assert np.all(recvs[p] == p * 100 + r), (p, recvs[p][:2])


def case_split(comm):
    n, r = comm.size, comm.rank
    sub = comm.split(r % 2, key=-r)  # reversed order inside each color
    members = [q for q in range(n) if q % 2 == r % 2]
    assert sub.size == len(members)
    assert sub.rank == sorted(members, reverse=True).index(r)
    x = np.array([float(r)])
    sub.all_reduce(x)
    assert x[0] == sum(members)
    sub.destroy()
    none = comm.split(uniccl.UNDEFINED if r == 0 else 0)
    if r == 0:
        assert none is None
    else:
        assert none.size == n - 1
        none.destroy()


def case_unique_id(comm):
    n, r = comm.size, comm.rank
    uid = world.bcast(uniccl.get_unique_id() if r == 0 else None, root=0)
    with uniccl.Communicator(uid, n - 1 - r, n) as c:  # reversed ranks
        assert (c.rank, c.size) == (n - 1 - r, n)
        x = np.array([float(c.rank)])
        c.all_reduce(x)
        assert x[0] == n * (n - 1) / 2
        y = np.array([c.rank], np.int64)
        c.broadcast(y, root=0)
        assert y[0] == 0
    # a subset: only even world ranks take part; bytes(uid) works like ncclUniqueId
    raw = world.bcast(bytes(uniccl.get_unique_id()) if r == 0 else None, root=0)
    evens = list(range(0, n, 2))
    if r in evens:
        with uniccl.Communicator(raw, evens.index(r), len(evens)) as c:
            x = np.ones(3)
            c.all_reduce(x)
            assert np.all(x == len(evens))


def case_from_mpi(comm):
    from _world import has_mpi

    if not has_mpi():
        return  # a job without MPI (uniccl run's own launchers) has no MPI communicator to wrap
    sub = world.Split(0, world.rank)
    with uniccl.Communicator.from_mpi(sub) as c:
        x = np.full(7, 2, np.int16)
        assert c.all_reduce(x, op=uniccl.PROD) is x
        assert np.all(x == 2**c.size)
    sub.Free()


def case_barrier(comm):
    if comm.rank == 0:
        time.sleep(0.3)
    t0 = time.monotonic()
    comm.barrier()
    waited = time.monotonic() - t0
    if comm.rank != 0 and comm.size > 1:
        assert waited > 0.2, waited


def _terms(comm, q: int, count: int, dtype) -> np.ndarray:
    """Rank q's send buffer of the ring-order cases: values ten orders of magnitude apart
    (sums of three or more then depend on the order of the terms)."""
    g = np.random.default_rng(1000 + q)
    return (g.standard_normal(comm.size * count) * 10.0 ** g.uniform(-5, 5, comm.size * count)).astype(dtype)


def case_reduce_scatter_ring_order(comm):
    """ring_order=True: block b is ((x[b-1] + x[b-2]) + ...) + x[b], bit for bit, on every
    transport (numpy adds the terms one at a time in that order for the reference)."""
    n, me = comm.size, comm.rank
    for dtype in (np.float64, np.float32, np.float16):
        for count in (1, 7, 1000, (1 << 20) // np.dtype(dtype).itemsize + 5):  # the last: the engine's CMA path
            xs = [_terms(comm, q, count, dtype) for q in range(n)]
            for op, fn in (("sum", np.add), ("prod", np.multiply)):
                if op == "prod" and count > 1000:
                    continue
                blk = slice(me * count, (me + 1) * count)
                expect = xs[(me - 1) % n][blk].copy()
                for j in range(2, n + 1):  # ranks me-2, ..., me+1, then me
                    expect = fn(expect, xs[(me - j) % n][blk]).astype(dtype)
                out = np.zeros(count, dtype)
                comm.reduce_scatter(xs[me], out, op, ring_order=True)
                assert out.tobytes() == expect.tobytes(), (dtype, count, op, np.flatnonzero(out != expect)[:5])
                inplace = xs[me].copy()  # in place: recvbuf is block `rank` of sendbuf
                comm.reduce_scatter(inplace, inplace[blk], op, ring_order=True)
                assert inplace[blk].tobytes() == expect.tobytes(), (dtype, count, op, "in place")


def case_ring_order_must_agree(comm):
    """One rank asking for gloo's ring order and the others not is a mismatch, named."""
    if comm.size < 2:
        return
    x, out = np.ones(4 * comm.size), np.zeros(4)
    try:
        comm.reduce_scatter(x, out, ring_order=comm.rank == 0)
    except uniccl.InvalidUsage as exc:
        assert "gloo's ring order" in str(exc), exc
    else:
        raise AssertionError("a reduce_scatter whose ranks asked for different orders passed")
    comm.reduce_scatter(x, out, ring_order=True)  # the communicator goes on
    assert (out == comm.size).all()


def case_float_avg_does_not_overflow(comm):
    """A float AVG whose mean is representable comes out as numpy's mean, though the sum of the
    terms overflows the type (float16 30000 x 4, bfloat16 / float32 near 3e38, float64 1e308):
    each rank's input is divided first, as NCCL pre-multiplies.  Integer AVG still truncates."""
    from fractions import Fraction

    import ml_dtypes

    n, r = comm.size, comm.rank
    cases = [(np.float16, 30000.0), (ml_dtypes.bfloat16, 3e38), (np.float32, 3e38), (np.float64, 1e308)]
    for dt, big in cases:
        terms = [np.full(64, big * (1 - 0.01 * q), np.float64).astype(dt) for q in range(n)]
        exact = sum(Fraction(float(t[0])) for t in terms) / n  # the mean in exact rationals
        want = np.full(64, float(exact))
        tol = 4 * float(np.finfo(dt).eps) * big
        x = terms[r].copy()
        comm.all_reduce(x, op=uniccl.AVG)
        assert np.all(np.isfinite(x.astype(np.float64))), (dt, x[:2])
        np.testing.assert_allclose(x.astype(np.float64), want, rtol=0, atol=tol, err_msg=f"all_reduce {dt}")
        out = np.zeros(64, dt)
        src = terms[r].copy()
        comm.all_reduce(src, out, op=uniccl.AVG)
        assert np.array_equal(src.view(np.uint8), terms[r].view(np.uint8)), "sendbuf changed"
        np.testing.assert_allclose(out.astype(np.float64), want, rtol=0, atol=tol)
        red = np.zeros(64, dt) if r == 0 else None
        comm.reduce(terms[r].copy(), red, op=uniccl.AVG, root=0)
        if r == 0:
            np.testing.assert_allclose(red.astype(np.float64), want, rtol=0, atol=tol, err_msg=f"reduce {dt}")
        whole = np.concatenate([terms[r]] * n)
        part = np.zeros(64, dt)
        comm.reduce_scatter(whole, part, op=uniccl.AVG)
        np.testing.assert_allclose(part.astype(np.float64), want, rtol=0, atol=tol, err_msg=f"reduce_scatter {dt}")
    i = np.full(8, 7 + r, np.int32)  # integers: the sum, then a division truncating toward zero
    comm.all_reduce(i, op=uniccl.AVG)
    assert np.all(i == int(sum(7 + q for q in range(n)) / n)), i


def case_ranks_and_returns(comm):
    assert (comm.rank, comm.size) == (world.rank, world.size)
    assert comm.local_size == comm.size and comm.local_rank == comm.rank  # one host
    assert comm.platform == "cpu" and comm.device == 0
    n = comm.size
    a = np.ones(4, np.float32)
    assert comm.all_reduce(a, op="sum") is a
    r = np.zeros(4, np.float32)
    assert comm.reduce(np.ones(4, np.float32), r, op=uniccl.MAX, root=0) is (r if comm.rank == 0 else None)
    g = np.zeros(4 * n, np.float32)
    assert comm.all_gather(np.ones(4, np.float32), g) is g
    assert comm.gather(np.ones(4, np.float32), g if comm.rank == 0 else None) is (g if comm.rank == 0 else None)
    s = np.zeros(4, np.float32)
    assert comm.scatter(np.ones(4 * n, np.float32) if comm.rank == 0 else None, s) is s
    assert comm.reduce_scatter(np.ones(4 * n, np.float32), s, op=0) is s
    t = np.zeros(4 * n, np.float32)
    assert comm.all_to_all(np.ones(4 * n, np.float32), t) is t
    assert comm.barrier() is None


def case_dlpack_and_buffer_protocol(comm):
    import array

    a = array.array("d", [comm.rank + 1.0] * 5)
    comm.all_reduce(a)
    assert list(a) == [comm.size * (comm.size + 1) / 2] * 5
    m = memoryview(bytearray(np.full(4, comm.rank, np.int32).tobytes())).cast("i")
    comm.all_reduce(m, op="max")
    assert list(m) == [comm.size - 1] * 4
    try:
        import torch
    except ImportError:
        return
    t = torch.full((3, 4), float(comm.rank), dtype=torch.bfloat16)
    comm.all_reduce(t)
    assert torch.all(t == float(comm.size * (comm.size - 1) / 2))


def case_context_manager_and_destroy(comm):
    with uniccl.init() as c:
        c.barrier()
    c.destroy()  # idempotent
    try:
        c.barrier()
    except uniccl.InvalidUsage:
        pass
    else:
        raise AssertionError("use after destroy did not raise")


def main() -> int:
    global world
    import _world

    world = _world.world()
    failures = 0
    with uniccl.init() as comm:
        for name in sys.argv[1:]:
            try:
                globals()[f"case_{name}"](comm)
            except Exception:
                failures += 1
                print(f"[rank {comm.rank}] FAIL {name}\n{traceback.format_exc()}", flush=True)
            world.Barrier()
    total = world.allreduce(failures)
    if world.rank == 0:
        print(f"api on {world.size} ranks: {len(sys.argv) - 1} cases, {total} failures")
    return 1 if total else 0


CASES = sorted(n[len("case_") :] for n in list(globals()) if n.startswith("case_"))

if __name__ == "__main__":
    sys.exit(main())
