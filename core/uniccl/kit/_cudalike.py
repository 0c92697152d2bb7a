"""One binding template for the CUDA-like runtimes: CUDA, CoreX, MACA (``mc*``), MUSA.

They share function shapes (``<prefix>Malloc(void**, size_t)``, ``<prefix>MemcpyAsync
(dst, src, n, kind, stream)`` …) and differ in symbol prefix, library names,
status codes and enum values: a :class:`CudaLikeSpec` holds those differences and
:class:`CudaLikeRuntime` binds the library with ctypes once.
"""

from __future__ import annotations

import ctypes
from ctypes import POINTER, byref, c_float, c_int, c_size_t, c_uint, c_void_p
from dataclasses import dataclass, field

from ._dl import LibrarySearch
from ._runtime import DeviceRuntime
from ._status import check_status

# The CUDA runtime's values; other vendors override what differs.
CUDA_STATUS = {
    0: "cudaSuccess",
    1: "cudaErrorInvalidValue",
    2: "cudaErrorMemoryAllocation",
    3: "cudaErrorInitializationError",
    21: "cudaErrorInvalidMemcpyDirection",
    35: "cudaErrorInsufficientDriver",
    100: "cudaErrorNoDevice",
    101: "cudaErrorInvalidDevice",
    400: "cudaErrorInvalidResourceHandle",
    600: "cudaErrorNotReady",
    700: "cudaErrorIllegalAddress",
    719: "cudaErrorLaunchFailure",
    801: "cudaErrorNotSupported",
    999: "cudaErrorUnknown",
}


class _PointerAttributes(ctypes.Structure):
    """cudaPointerAttributes since CUDA 11; newer runtimes append reserved words (CUDA 13:
    seen writing past the four fields), so room is left for them."""

    _fields_ = [
        ("type", c_int),
        ("device", c_int),
        ("devicePointer", c_void_p),
        ("hostPointer", c_void_p),
        ("reserved", ctypes.c_long * 32),
    ]


@dataclass(frozen=True)
class CudaLikeSpec:
    vendor: str  # "NVIDIA CUDA"
    prefix: str  # "cuda"
    search: LibrarySearch  # where the runtime library is
    statuses: dict = field(default_factory=lambda: dict(CUDA_STATUS))
    not_ready: tuple = (600,)  # "work pending" from Query calls
    not_supported: int = 801
    no_device: tuple = (100, 35)  # statuses of GetDeviceCount that mean "no usable device"
    memcpy_kinds: tuple = (0, 1, 2, 3, 4)  # vendor values of H2H, H2D, D2H, D2D, Default
    memory_type_device: int = 2  # PointerAttributes.type of device memory
    props_symbol: str = "GetDeviceProperties_v2"  # name at offset 0, total memory at props_total_offset
    props_total_offset: int = 288

    def load(self):
        """(bound runtime or None, reason when None)."""
        return CudaLikeRuntime.load(self)


class CudaLikeRuntime(DeviceRuntime):
    """The runtime library, bound.  Every call checks its status; ``load`` returns
    (runtime or None, reason) and never raises for a missing library."""

    NAME_FN = "GetErrorName"
    POINTER_ATTRIBUTES = _PointerAttributes
    REQUIRED = (
        "GetDeviceCount",
        "SetDevice",
        "Malloc",
        "Free",
        "MemcpyAsync",
        "StreamCreate",
        "StreamSynchronize",
        "EventCreate",
        "EventRecord",
    )

    def signatures(self) -> dict:
        return {
            "GetDeviceCount": [POINTER(c_int)],
            "SetDevice": [c_int],
            "GetDevice": [POINTER(c_int)],
            "RuntimeGetVersion": [POINTER(c_int)],
            "DriverGetVersion": [POINTER(c_int)],
            "MemGetInfo": [POINTER(c_size_t), POINTER(c_size_t)],
            "DeviceSynchronize": [],
            "Malloc": [POINTER(c_void_p), c_size_t],
            "Free": [c_void_p],
            "MallocHost": [POINTER(c_void_p), c_size_t],
            "FreeHost": [c_void_p],
            "Memcpy": [c_void_p, c_void_p, c_size_t, c_int],
            "MemcpyAsync": [c_void_p, c_void_p, c_size_t, c_int, c_void_p],
            "StreamCreate": [POINTER(c_void_p)],
            "StreamDestroy": [c_void_p],
            "StreamSynchronize": [c_void_p],
            "StreamQuery": [c_void_p],
            "StreamWaitEvent": [c_void_p, c_void_p, c_uint],
            "EventCreate": [POINTER(c_void_p)],
            "EventDestroy": [c_void_p],
            "EventRecord": [c_void_p, c_void_p],
            "EventQuery": [c_void_p],
            "EventSynchronize": [c_void_p],
            "EventElapsedTime": [POINTER(c_float), c_void_p, c_void_p],
            "PointerGetAttributes": [POINTER(_PointerAttributes), c_void_p],
            self.spec.props_symbol: [c_void_p, c_int],
            "GetDeviceProperties": [c_void_p, c_int],  # runtimes older than CUDA 12 (CoreX) lack _v2
        }

    # ------------------------------------------------------------------ calls
    def device_count(self) -> tuple[int, int]:
        """(count, status): a status in ``spec.no_device`` means no usable device."""
        n = c_int(0)
        get_count = self._fns["GetDeviceCount"]
        assert get_count is not None  # REQUIRED: bound, or the runtime did not load
        st = get_count(byref(n))
        return (n.value if st == 0 else 0), st

    def version(self, which: str = "RuntimeGetVersion") -> int | None:
        fn, v = self._fns.get(which), c_int(0)
        return v.value if fn is not None and fn(byref(v)) == 0 else None

    def device_info(self, device: int) -> dict:
        fn = self._fns.get(self.spec.props_symbol) or self._fns.get("GetDeviceProperties")
        buf = ctypes.create_string_buffer(8192)
        name, total = f"{self.spec.vendor} device {device}", 0
        if fn is not None and fn(buf, device) == 0:
            name = buf.raw[:256].split(b"\0", 1)[0].decode(errors="replace") or name
            total = c_size_t.from_buffer(buf, self.spec.props_total_offset).value
        return {"index": device, "name": name, "total_memory": total}

    def memcpy(self, dst: int, src: int, nbytes: int, kind: int, stream=None, op: str | None = None) -> None:
        vkind = self.spec.memcpy_kinds[kind]
        if stream is None:
            self.call("Memcpy", c_void_p(dst), c_void_p(src), nbytes, vkind, op=op)
        else:
            self.call("MemcpyAsync", c_void_p(dst), c_void_p(src), nbytes, vkind, c_void_p(stream), op=op)

    def elapsed_ms(self, start: int, end: int) -> float:
        ms = c_float()
        self.call("EventElapsedTime", byref(ms), c_void_p(start), c_void_p(end))
        return ms.value

    def stream_wait_event(self, stream, event: int) -> bool:
        """Order ``stream`` after ``event``; False where the runtime lacks it (CoreX reports
        NotSupported): the caller then waits on the host instead."""
        fn = self._fns.get("StreamWaitEvent")
        if fn is None:
            return False
        st = fn(c_void_p(stream or 0), c_void_p(event), 0)
        if st == self.spec.not_supported:
            return False
        check_status(
            st, self.spec.prefix + "StreamWaitEvent", self.spec.vendor, self.spec.statuses, name_of=self.name_of
        )
        return True

    def _after_failed_query(self) -> None:
        get_count = self._fns["GetDeviceCount"]
        assert get_count is not None  # REQUIRED: bound, or the runtime did not load
        get_count(byref(c_int()))  # clears the sticky "last error" of old runtimes
