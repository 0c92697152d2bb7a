"""Memory, copies, streams and events of the platform, through its hooks."""

import numpy as np
import pytest
from _platform import DeviceArray

H2H, H2D, D2H, D2D = 0, 1, 2, 3


def test_probe_reports_devices(backend):
    probe = backend.record.probe
    assert probe["available"] and probe["devices"], probe
    assert all(d["total_memory"] >= 0 and d["name"] for d in probe["devices"])
    assert isinstance(probe.get("kernels"), str)


@pytest.mark.parametrize("nbytes", [1, 4096, 3 << 20])
def test_alloc_copy_round_trip(backend, nbytes):
    data = np.random.default_rng(nbytes).integers(0, 255, nbytes, dtype=np.uint8)
    a = DeviceArray(backend, data)
    b = DeviceArray(backend, np.zeros_like(data))
    try:
        backend.memcpy(b.ptr, a.ptr, nbytes, D2D, None)
        assert np.array_equal(b.download(), data)
        host = backend.host_alloc(nbytes)
        try:
            backend.memcpy(host, a.ptr, nbytes, D2H, None)
            out = np.empty_like(data)
            backend.memcpy(out.ctypes.data, host, nbytes, H2H, None)
            assert np.array_equal(out, data)
        finally:
            backend.host_free(host)
    finally:
        a.free()
        b.free()


def test_device_pointers_are_claimed(backend):
    a = DeviceArray(backend, np.arange(16, dtype=np.float32))
    try:
        types = backend.dlpack_device_types()
        assert backend.claim_pointer(a.ptr, types[0], 0) == 0
        assert backend.claim_pointer(a.ptr, 99, 0) is None  # a device type it does not own
        if backend.name != "cpu":
            host = np.zeros(4)
            assert backend.claim_pointer(host.ctypes.data, types[0], 0) is None  # not its memory
    finally:
        a.free()


def test_stream_orders_async_copies_and_events(backend):
    n = 1 << 20
    src = np.random.default_rng(1).standard_normal(n)
    a, b = DeviceArray(backend, src), DeviceArray(backend, np.zeros(n))
    s = backend.stream_create(0)
    e0, e1 = backend.event_create(0), backend.event_create(0)
    try:
        backend.event_record(e0, s)
        for _ in range(4):  # in order: the last copy sees the first's result
            backend.memcpy(b.ptr, a.ptr, src.nbytes, D2D, s)
            backend.memcpy(a.ptr, b.ptr, src.nbytes, D2D, s)
        backend.event_record(e1, s)
        backend.event_synchronize(e1)
        assert backend.event_query(e1) and backend.event_query(e0)
        s2 = backend.stream_create(0)
        backend.stream_wait_event(s2, e1)
        backend.stream_synchronize(s2)
        backend.stream_synchronize(s)
        backend.stream_destroy(s2)
        assert np.array_equal(b.download(), src)
    finally:
        backend.event_destroy(e0)
        backend.event_destroy(e1)
        backend.stream_destroy(s)
        a.free()
        b.free()
