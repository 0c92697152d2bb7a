"""Streams keep issue order, events order work across streams, and failures of
asynchronous work reach the caller."""

import os
import time

import numpy as np
import pytest
from cpu_helpers import addr

from uniccl._errors import InvalidArgument, InvalidUsage
from uniccl._types import DType, MemcpyKind, ReduceOp

F32, I64 = int(DType.FLOAT32), int(DType.INT64)
SUM, PROD = int(ReduceOp.SUM), int(ReduceOp.PROD)
H2H = int(MemcpyKind.HOST_TO_HOST)
BIG = 1 << 22  # float32 elements (16 MiB): a few ms per reduce


@pytest.fixture
def stream(plugin):
    s = plugin.uniccl_stream_create(0)
    yield s
    plugin.uniccl_stream_destroy(s)


def slow_increments(plugin, x, times, stream):
    """Enqueue x += 1 ``times`` times (each one pass over 48 MiB)."""
    one = np.ones_like(x)
    for _ in range(times):
        plugin.uniccl_reduce(addr(x), addr(x), addr(one), x.size, F32, SUM, stream)
    return one  # keep it alive until the caller synchronizes


def test_work_on_one_stream_runs_in_issue_order(plugin, stream):
    n, steps = 1000, 300
    acc, two, tmp = np.zeros(n, np.int64), np.full(n, 2, np.int64), np.empty(n, np.int64)
    sources = [np.full(n, k, np.int64) for k in range(steps)]
    for src in sources:  # acc = acc * 2 + k: any reordering changes the result
        plugin.uniccl_reduce(addr(acc), addr(acc), addr(two), n, I64, PROD, stream)
        plugin.uniccl_memcpy(addr(tmp), addr(src), tmp.nbytes, H2H, stream)
        plugin.uniccl_reduce(addr(acc), addr(acc), addr(tmp), n, I64, SUM, stream)
    plugin.uniccl_stream_synchronize(stream)
    expected = 0
    for k in range(steps):
        expected = (expected * 2 + k) % 2**64
    assert (acc == np.uint64(expected).astype(np.int64)).all()


def test_synchronize_waits_for_everything_enqueued(plugin, stream):
    x = np.zeros(BIG, np.float32)
    one = slow_increments(plugin, x, 8, stream)
    scaled = np.empty_like(x)
    plugin.uniccl_scale(addr(scaled), addr(x), x.size, F32, 4, stream)
    plugin.uniccl_memcpy(addr(x), addr(one), 0, H2H, stream)  # empty work is still work
    plugin.uniccl_stream_synchronize(stream)
    assert (x == 8).all() and (scaled == 2).all() and (one == 1).all()


def test_event_record_query_synchronize(plugin, stream):
    event = plugin.uniccl_event_create(0)
    assert plugin.uniccl_event_query(event)  # never recorded
    x = np.zeros(BIG, np.float32)
    one = slow_increments(plugin, x, 30, stream)  # ~100 ms of queued work (one: alive until synced)  # noqa: F841
    plugin.uniccl_event_record(event, stream)
    assert not plugin.uniccl_event_query(event)
    plugin.uniccl_event_synchronize(event)
    assert plugin.uniccl_event_query(event)
    assert (x == 30).all()
    plugin.uniccl_event_destroy(event)


def test_stream_waits_for_event_recorded_on_another_stream(plugin):
    a, b = plugin.uniccl_stream_create(0), plugin.uniccl_stream_create(0)
    event = plugin.uniccl_event_create(0)
    x, y = np.zeros(BIG, np.float32), np.zeros(BIG, np.float32)
    one = slow_increments(plugin, x, 10, a)  # alive until synchronized: the stream reads it  # noqa: F841
    plugin.uniccl_event_record(event, a)
    plugin.uniccl_stream_wait_event(b, event)
    plugin.uniccl_memcpy(addr(y), addr(x), x.nbytes, H2H, b)
    plugin.uniccl_stream_synchronize(b)  # only b: its copy must have waited for a
    assert (y == 10).all()
    for s in (a, b):
        plugin.uniccl_stream_destroy(s)
    plugin.uniccl_event_destroy(event)


def test_wait_keeps_the_record_current_when_it_was_issued(plugin):
    """Re-recording the event elsewhere must not release an earlier wait (CUDA semantics)."""
    a, b, c = (plugin.uniccl_stream_create(0) for _ in range(3))
    event = plugin.uniccl_event_create(0)
    x, y = np.zeros(BIG, np.float32), np.zeros(BIG, np.float32)
    one = slow_increments(plugin, x, 10, a)  # alive until synchronized: the stream reads it  # noqa: F841
    plugin.uniccl_event_record(event, a)
    plugin.uniccl_stream_wait_event(b, event)
    plugin.uniccl_event_record(event, c)  # c is idle: this record completes at once
    plugin.uniccl_memcpy(addr(y), addr(x), x.nbytes, H2H, b)
    plugin.uniccl_stream_synchronize(b)
    assert (y == 10).all()
    for s in (a, b, c):
        plugin.uniccl_stream_destroy(s)
    plugin.uniccl_event_destroy(event)


def test_none_stream_means_synchronous(plugin):
    event = plugin.uniccl_event_create(0)
    plugin.uniccl_event_record(event, None)
    assert plugin.uniccl_event_query(event)
    plugin.uniccl_stream_wait_event(None, event)
    plugin.uniccl_stream_synchronize(None)
    plugin.uniccl_event_destroy(event)


def test_event_destroyed_while_its_record_is_pending(plugin, stream):
    event = plugin.uniccl_event_create(0)
    x = np.zeros(BIG, np.float32)
    one = slow_increments(plugin, x, 3, stream)  # alive until synchronized: the stream reads it  # noqa: F841
    plugin.uniccl_event_record(event, stream)
    plugin.uniccl_event_destroy(event)
    plugin.uniccl_stream_synchronize(stream)
    assert (x == 3).all()
    with pytest.raises(InvalidUsage):
        plugin.uniccl_event_query(event)


def test_async_failure_is_raised_by_the_next_synchronize(plugin, stream):
    a = np.ones(16, np.float32)
    stream.reduce(addr(a), addr(a), addr(a), 16, 42, SUM)  # unchecked enqueue
    plugin.uniccl_reduce(addr(a), addr(a), addr(a), 16, F32, SUM, stream)  # later work still runs
    with pytest.raises(InvalidArgument) as info:
        plugin.uniccl_stream_synchronize(stream)
    assert (info.value.op, info.value.argument) == ("reduce", "dtype")
    assert (a == 2).all()
    plugin.uniccl_stream_synchronize(stream)  # reported once


def test_destroy_raises_an_unreported_failure(plugin):
    s = plugin.uniccl_stream_create(0)
    a = np.ones(16, np.float32)
    s.scale(addr(a), addr(a), 16, F32, 0)
    with pytest.raises(InvalidArgument, match="divisor"):
        plugin.uniccl_stream_destroy(s)
    with pytest.raises(InvalidUsage):
        plugin.uniccl_stream_synchronize(s)


def test_hooks_reject_bad_arguments_before_enqueueing(plugin, stream):
    a = np.ones(16, np.float32)
    with pytest.raises(InvalidArgument, match="op"):
        plugin.uniccl_reduce(addr(a), addr(a), addr(a), 16, F32, int(ReduceOp.AVG), stream)
    with pytest.raises(InvalidArgument, match="divisor"):
        plugin.uniccl_scale(addr(a), addr(a), 16, F32, 0, stream)
    with pytest.raises(InvalidArgument, match="count"):
        plugin.uniccl_reduce(addr(a), addr(a), addr(a), -1, F32, SUM, stream)
    with pytest.raises(InvalidArgument, match="nbytes"):
        plugin.uniccl_memcpy(addr(a), addr(a), -1, H2H, stream)
    with pytest.raises(InvalidArgument, match="device"):
        plugin.uniccl_stream_create(1)
    plugin.uniccl_stream_synchronize(stream)  # nothing failed asynchronously


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="needs Linux /proc")
def test_destroy_finishes_work_and_joins_the_worker(plugin):
    def threads():  # the streams' workers, by the name they give themselves (other threads of the
        count = 0  # process, uniccl's or a library's, come and go)
        for t in os.listdir("/proc/self/task"):
            try:
                with open(f"/proc/self/task/{t}/comm") as f:
                    count += f.read().strip() == "uniccl-stream"
            except OSError:  # it ended meanwhile
                pass
        return count

    def settled(want):  # a Python thread of an earlier test that is just ending is briefly counted
        deadline = time.monotonic() + 5
        while threads() != want and time.monotonic() < deadline:
            time.sleep(0.01)
        return threads()

    deadline = time.monotonic() + 5
    before = threads()
    while time.monotonic() < deadline:  # wait until no ending thread of another test is counted
        time.sleep(0.05)
        now = threads()
        if now == before:
            break
        before = now
    streams = [plugin.uniccl_stream_create(0) for _ in range(4)]
    assert settled(before + 4) == before + 4
    xs = [np.zeros(1 << 20, np.float32) for _ in streams]
    ones = [slow_increments(plugin, x, 3, s) for x, s in zip(xs, streams)]
    for s in streams:
        plugin.uniccl_stream_destroy(s)
    assert threads() == before  # destroy joined them: no wait needed here
    assert all((x == 3).all() for x in xs) and len(ones) == 4
    collected = plugin.uniccl_stream_create(0)
    assert settled(before + 1) == before + 1
    del collected  # dropped without destroy: the worker is still joined
    assert threads() == before
