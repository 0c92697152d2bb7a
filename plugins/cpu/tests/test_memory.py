"""Page-aligned allocation and copies."""

import numpy as np
import pytest
from cpu_helpers import view

from uniccl._errors import InternalError, InvalidArgument
from uniccl._types import MemcpyKind


@pytest.mark.parametrize("nbytes", [0, 1, 4095, 4097, 1 << 20])
def test_allocations_are_page_aligned_and_usable(plugin, nbytes):
    for ptr, free in [
        (plugin.uniccl_mem_alloc(0, nbytes), lambda p: plugin.uniccl_mem_free(0, p)),
        (plugin.uniccl_host_alloc(nbytes), plugin.uniccl_host_free),
    ]:
        assert ptr != 0 and ptr % 4096 == 0
        buf = view(ptr, nbytes, np.uint8)
        buf[:] = 0xA5  # writable over its whole length
        assert (buf == 0xA5).all()
        free(ptr)


def test_zero_byte_allocations_are_distinct(plugin):
    ptrs = [plugin.uniccl_host_alloc(0) for _ in range(3)]
    assert len(set(ptrs)) == 3
    for p in ptrs:
        plugin.uniccl_host_free(p)


def test_bad_sizes_and_devices(plugin):
    with pytest.raises(InvalidArgument) as info:
        plugin.uniccl_mem_alloc(0, -1)
    assert info.value.argument == "nbytes"
    with pytest.raises(InvalidArgument):
        plugin.uniccl_host_alloc(-4096)
    with pytest.raises(InvalidArgument) as info:
        plugin.uniccl_mem_alloc(1, 16)
    assert info.value.argument == "device"
    with pytest.raises(InternalError, match="out of host memory"):
        plugin.uniccl_mem_alloc(0, 1 << 62)


@pytest.mark.parametrize("kind", list(MemcpyKind), ids=lambda k: k.name)
def test_memcpy_every_kind(plugin, kind):
    n = 3 * 4096 + 5
    src = plugin.uniccl_mem_alloc(0, n)
    dst = plugin.uniccl_host_alloc(n)
    data = np.random.default_rng(int(kind)).integers(0, 256, n, dtype=np.uint8)
    view(src, n, np.uint8)[:] = data
    plugin.uniccl_memcpy(dst, src, n, int(kind), None)
    np.testing.assert_array_equal(view(dst, n, np.uint8), data)
    plugin.uniccl_mem_free(0, src)
    plugin.uniccl_host_free(dst)


def test_memcpy_unaligned_ranges_and_zero_bytes(plugin):
    src = np.arange(1000, dtype=np.uint8)
    dst = np.zeros(1000, np.uint8)
    plugin.uniccl_memcpy(dst.ctypes.data + 3, src.ctypes.data + 7, 901, int(MemcpyKind.DEFAULT), None)
    np.testing.assert_array_equal(dst[3:904], src[7:908])
    assert not dst[:3].any() and not dst[904:].any()
    plugin.uniccl_memcpy(0, 0, 0, int(MemcpyKind.HOST_TO_HOST), None)


def test_memcpy_rejects_bad_arguments(plugin):
    a = np.zeros(8, np.uint8)
    with pytest.raises(InvalidArgument, match="nbytes"):
        plugin.uniccl_memcpy(a.ctypes.data, a.ctypes.data, -1, 0, None)
    with pytest.raises(InvalidArgument) as info:
        plugin.uniccl_memcpy(a.ctypes.data, a.ctypes.data, 8, 7, None)
    assert info.value.argument == "kind"
