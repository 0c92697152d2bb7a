"""The Cambricon plugin's CNRT and CNCL bindings against the emulated Neuware ABI
(tests/emulation kind cambricon): what differs from the CUDA-like vendors — queue and
notifier calls, copy directions, cnrtErrorBusy, the async copy's fallback names, clique
ids, CNCL's data types — checked call by call.  The collectives themselves are covered by
tests/conformance --uniccl-platform=cambricon and the mixed-vendor tests."""

import sys
from importlib import metadata
from pathlib import Path

import _emulation
import numpy as np
import pytest

from uniccl import InvalidArgument, VendorError
from uniccl.kit import DevicePlugin

pytestmark = pytest.mark.skipif(
    "cambricon" not in {ep.name for ep in metadata.entry_points(group="uniccl.plugins")},
    reason="uniccl-cambricon is not installed",
)


@pytest.fixture
def plugin(monkeypatch):
    info = _emulation.require("cambricon")
    monkeypatch.setenv("NEUWARE_HOME", info["root"])
    module = pytest.importorskip("uniccl_cambricon")
    emu = _emulation.load("cambricon")
    emu.clear()
    real = module.plugin  # a fresh, unprobed instance with the installed plugin's settings
    yield (
        DevicePlugin(
            "cambricon",
            module.__version__,
            module.RUNTIME,
            module.CNCL,
            priority=10,
            dlpack_types=real.dlpack_types,
            kernels_dir=real.kernels_dir,
            kernels_prefix=real.kernels_prefix,
        ),
        emu,
    )
    emu.clear()


def test_probe_reports_cnrt_cncl_and_devices(plugin):
    p, _ = plugin
    probe = p.uniccl_probe()
    assert probe["available"], probe
    assert probe["versions"]["runtime"].startswith("6.14.1 (") and probe["versions"]["driver"] == "6.2.5"
    assert probe["versions"]["cncl"].startswith("1.25.0 (")
    assert [d["name"] for d in probe["devices"]] == ["Cambricon emulated MLU 0", "Cambricon emulated MLU 1"]
    assert all(d["total_memory"] == 1 << 30 for d in probe["devices"])  # cnrtAttrTotalMemSize, MB


def test_no_device_is_named(plugin, monkeypatch):
    p, emu = plugin
    emu.fail("cnrtGetDeviceCount", 100004)
    probe = p.uniccl_probe()
    assert not probe["available"]
    assert probe["reason"] == "no Cambricon CNRT device: cnrtGetDeviceCount returned cnrtErrorNoDevice (100004)"


def test_copies_take_cnrt_directions_through_the_newest_async_copy(plugin):
    p, emu = plugin
    rt = p.runtime()
    assert rt.async_copy == "MemcpyAsync_V2"  # the emulation exports no _V3
    q = p.uniccl_stream_create(0)
    src = np.arange(1000, dtype=np.float32)
    out = np.zeros_like(src)
    dev = p.uniccl_mem_alloc(0, src.nbytes)
    dev2 = p.uniccl_mem_alloc(0, src.nbytes)
    try:
        p.uniccl_memcpy(dev, src.ctypes.data, src.nbytes, 1, q)  # host to device
        p.uniccl_memcpy(dev2, dev, src.nbytes, 3, q)  # device to device
        p.uniccl_memcpy(out.ctypes.data, dev2, src.nbytes, 2, q)  # device to host
        p.uniccl_stream_synchronize(q)
        assert np.array_equal(out, src)
        assert emu.calls("cnrtMemcpyAsync_V2") == 3 and emu.calls("cnrtMemcpyAsync") == 0
        # a direction that contradicts the pointers is refused by CNRT with its own status
        with pytest.raises(VendorError) as info:
            p.uniccl_memcpy(out.ctypes.data, dev, src.nbytes, 1, None)  # "host to device" into host memory
        assert info.value.call == "cnrtMemcpy" and info.value.status_name == "cnrtErrorArgsInvalid"
        assert p.uniccl_claim_pointer(dev, 2, 0) == 0 and p.uniccl_claim_pointer(src.ctypes.data, 2, 0) is None
        assert p.uniccl_claim_pointer(dev, 12, 0) == 0 and p.uniccl_claim_pointer(dev, 3, 0) is None
    finally:
        p.uniccl_mem_free(0, dev)
        p.uniccl_mem_free(0, dev2)
        p.uniccl_stream_destroy(q)


def test_busy_notifier_is_not_ready_not_an_error(plugin):
    p, emu = plugin
    n = p.uniccl_event_create(0)
    q = p.uniccl_stream_create(0)
    try:
        p.uniccl_event_record(n, q)
        emu.fail("cnrtQueryNotifier", 632014, 0, 1)  # cnrtErrorBusy: still pending
        assert p.uniccl_event_query(n) is False
        p.uniccl_stream_wait_event(q, n)  # cnrtQueueWaitNotifier(notifier, queue, 0)
        p.uniccl_event_synchronize(n)
        assert p.uniccl_event_query(n) is True
        assert emu.calls("cnrtQueueWaitNotifier") == 1 and emu.calls("cnrtPlaceNotifier") == 1
        emu.fail("cnrtQueryNotifier", 632006, 0, 1)  # a real failure stays one
        with pytest.raises(VendorError, match=r"cnrtQueryNotifier failed: cnrtErrorDevice \(632006\)"):
            p.uniccl_event_query(n)
    finally:
        p.uniccl_event_destroy(n)
        p.uniccl_stream_destroy(q)


def test_cncl_types_and_clique_id(plugin):
    p, emu = plugin
    native = p.uniccl_native_collectives()
    assert native is not None and native.name == "cncl"
    assert native.supports(7, 0) and native.supports(10, 2) and native.supports(9, 1)  # float32, int16, bf16
    assert not native.supports(8, 0)  # no float64 in CNCL: staged through host memory
    assert not native.supports(7, 4)  # no average: staged
    ccl, _ = p.ccl()
    uid = ccl.unique_id()
    assert len(uid) == 136  # data[128] and the hash: both travel to the other ranks
    comm = native.create(1, 0, 0, lambda obj, root: obj)
    try:
        a = np.arange(64, dtype=np.int16)
        dev = p.uniccl_mem_alloc(0, a.nbytes)
        p.uniccl_memcpy(dev, a.ctypes.data, a.nbytes, 1, None)
        native.run("all_reduce", comm, {"dtype": 10, "op": 0, "send": dev, "recv": dev, "count": 64}, None, 0)
        p.uniccl_stream_synchronize(None)
        out = np.zeros_like(a)
        p.uniccl_memcpy(out.ctypes.data, dev, a.nbytes, 2, None)
        assert np.array_equal(out, a) and emu.calls("cnclAllReduce") == 1
        emu.fail("cnclAllReduce", 0x07, 0, 1)
        with pytest.raises(InvalidArgument, match=r"cnclAllReduce failed: CNCL_RET_ERR_ARGUMENTS \(7\)") as info:
            native.run("all_reduce", comm, {"dtype": 7, "op": 0, "send": dev, "recv": dev, "count": 4}, None, 3)
        assert info.value.rank == 3 and info.value.op == "all_reduce"
        p.uniccl_mem_free(0, dev)
    finally:
        native.destroy(comm)
    # a clique id whose hash does not match its data is refused by cnclInitComms
    bad = bytearray(uid)
    bad[0] ^= 1
    with pytest.raises(InvalidArgument, match="cnclInitComms"):
        ccl.comm_init(1, bytes(bad), 0, 0)


def test_bang_kernels_need_cncc_or_a_named_build(plugin, monkeypatch):
    p, _ = plugin
    sys.path.insert(0, str(Path(__file__).parent / "conformance"))
    import _platform

    monkeypatch.setenv("UNICCL_CAMBRICON_KERNELS", _platform.host_kernels("cambricon"))
    p.kernels_env = "UNICCL_CAMBRICON_KERNELS"
    assert p.kernels().info.startswith("host emulation (g++")
    a = np.array([1.5, np.nan, -2.0], np.float32)
    b = np.array([2.0, 1.0, np.nan], np.float32)
    da, db = (p.uniccl_mem_alloc(0, 12) for _ in range(2))
    try:
        p.uniccl_memcpy(da, a.ctypes.data, 12, 1, None)
        p.uniccl_memcpy(db, b.ctypes.data, 12, 1, None)
        p.uniccl_reduce(da, da, db, 3, 7, 2, None)  # max, NaN propagates like np.maximum
        out = np.zeros(3, np.float32)
        p.uniccl_memcpy(out.ctypes.data, da, 12, 2, None)
        np.testing.assert_array_equal(out, np.maximum(a, b))
    finally:
        p.uniccl_mem_free(0, da)
        p.uniccl_mem_free(0, db)
