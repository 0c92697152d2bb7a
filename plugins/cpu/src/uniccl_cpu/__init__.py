"""uniccl platform plugin for the host CPU.

Memory is page-aligned host memory, every copy is a plain memcpy, streams are
native worker threads and the reduction kernels are vectorized C dispatched at
run time (AVX-512, AVX2 or baseline x86-64).  The hook implementations below are
what the entry point ``uniccl.plugins: cpu = uniccl_cpu`` registers.
"""

from __future__ import annotations

import pluggy

from uniccl._errors import InvalidArgument

from . import _kernels, _memory, _stream
from ._probe import cpu_name, total_memory

__version__ = "0.1.0"

#: The plugin API versions (uniccl.hookspecs) these implementations follow: [lowest, highest].
UNICCL_PLUGIN_API = (2, 2)

# Same marker as uniccl.hookimpl, built here so that the plugin does not need the
# core to be importable at build time.
hookimpl = pluggy.HookimplMarker("uniccl")

_DLPACK_CPU = 1
_MEMCPY_KINDS = frozenset(range(5))  # uniccl._types.MemcpyKind: all plain memcpy on the host


def _check_device(device: int, op: str) -> None:
    if device != 0:
        raise InvalidArgument(f"the cpu platform has one device (0), got {device}", op=op, argument="device")


# ------------------------------------------------------------------------- probe
@hookimpl
def uniccl_platform_info() -> dict:
    return {
        "name": "cpu",
        "version": __version__,
        "api_version": UNICCL_PLUGIN_API,
        "priority": 0,
        "description": "host CPU: aligned host memory, native worker-thread streams, vectorized C reduction kernels",
    }


@hookimpl
def uniccl_probe() -> dict:
    return {
        "available": True,
        "reason": "",
        "devices": [{"index": 0, "name": cpu_name(), "total_memory": total_memory()}],
        "versions": {"compiler": _kernels.compiler()},
        "kernels": f"native C -O3, {_kernels.variant()} dispatched at run time "
        f"(usable here: {', '.join(_kernels.available())})",
    }


# ------------------------------------------------------------------------ memory
@hookimpl
def uniccl_mem_alloc(device: int, nbytes: int) -> int:
    _check_device(device, "mem_alloc")
    return _memory.alloc(nbytes)


@hookimpl
def uniccl_mem_free(device: int, ptr: int) -> None:
    _check_device(device, "mem_free")
    _memory.free(ptr)


@hookimpl
def uniccl_host_alloc(nbytes: int) -> int:
    return _memory.alloc(nbytes)


@hookimpl
def uniccl_host_free(ptr: int) -> None:
    _memory.free(ptr)


@hookimpl
def uniccl_memcpy(dst: int, src: int, nbytes: int, kind: int, stream) -> None:
    if kind not in _MEMCPY_KINDS:
        raise InvalidArgument(f"unknown memcpy kind {kind}", op="memcpy", argument="kind")
    if stream is None:
        _memory.copy(dst, src, nbytes)
    else:
        stream.copy(dst, src, nbytes)


# ------------------------------------------------------------ streams and events
# A None stream means "synchronous": there is never pending work to wait for.
@hookimpl
def uniccl_stream_create(device: int):
    _check_device(device, "stream_create")
    return _stream.Stream()


@hookimpl
def uniccl_stream_destroy(stream) -> None:
    stream.destroy()


@hookimpl
def uniccl_stream_synchronize(stream) -> None:
    if stream is not None:
        stream.synchronize()


@hookimpl
def uniccl_stream_wait_event(stream, event) -> None:
    if stream is None:
        event.synchronize()
    else:
        stream.wait(event)


@hookimpl
def uniccl_event_create(device: int):
    _check_device(device, "event_create")
    return _stream.Event()


@hookimpl
def uniccl_event_destroy(event) -> None:
    event.destroy()


@hookimpl
def uniccl_event_record(event, stream) -> None:
    if stream is None:
        event.record_now()
    else:
        stream.record(event)


@hookimpl
def uniccl_event_query(event) -> bool:
    return event.query()


@hookimpl
def uniccl_event_synchronize(event) -> None:
    event.synchronize()


# ----------------------------------------------------------------------- kernels
@hookimpl
def uniccl_reduce(dst: int, a: int, b: int, count: int, dtype: int, op: int, stream) -> None:
    if stream is None:
        _kernels.reduce(dst, a, b, count, dtype, op)
    else:
        _kernels.check_reduce(dtype, op)
        stream.reduce(dst, a, b, count, dtype, op)


@hookimpl
def uniccl_host_reduce_kernel() -> int:
    return _kernels.reduce_kernel_address()


@hookimpl
def uniccl_scale(dst: int, src: int, count: int, dtype: int, divisor: int, stream) -> None:
    if stream is None:
        _kernels.scale(dst, src, count, dtype, divisor)
    else:
        _kernels.check_scale(dtype, divisor)
        stream.scale(dst, src, count, dtype, divisor)


# ------------------------------------------------------------------ buffer claim
@hookimpl
def uniccl_dlpack_device_types() -> list:
    return [_DLPACK_CPU]


@hookimpl
def uniccl_claim_pointer(ptr: int, device_type: int, device_id: int):
    return 0 if device_type == _DLPACK_CPU else None


# -------------------------------------------------------------- collectives
@hookimpl
def uniccl_native_collectives():
    return None
