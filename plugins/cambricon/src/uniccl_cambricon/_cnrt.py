"""CNRT (Cambricon's runtime, libcnrt) bound with ctypes over the kit's DeviceRuntime (checked
calls, memory, queues and notifiers by symbol name), in the shape DevicePlugin expects.

CNRT 6.x differs from the CUDA-like runtimes in more than a prefix: queues and
notifiers instead of streams and events, ``cnrtGetDeviceCount(unsigned *)``, copies
taking ``(dst, src, bytes, queue, dir)`` with its own direction values, notifier-first
arguments (``cnrtPlaceNotifier(n, q)``, ``cnrtQueueWaitNotifier(n, q, 0)``),
``cnrtErrorBusy`` (or ``cnrtErrorNotReady``) for "not done yet", versions as three
ints.  Values are from the public cnrt.h of CNRT 6.0.2 and 6.14.1.
"""

from __future__ import annotations

import ctypes
from ctypes import POINTER, byref, c_float, c_int, c_size_t, c_uint, c_void_p
from dataclasses import dataclass, field

from uniccl.kit import DeviceRuntime, LibrarySearch

# cnrtRet_t (CNRT 6.x)
CNRT_STATUS = {
    0: "cnrtSuccess",
    1: "cnrtErrorNotReady",
    100002: "cnrtErrorInit",
    100004: "cnrtErrorNoDevice",
    100005: "cnrtErrorDeviceInvalid",
    100006: "cnrtErrorArgsInvalid",
    100007: "cnrtErrorSys",
    100010: "cnrtErrorSysNoMem",
    100014: "cnrtErrorInvalidResourceHandle",
    100015: "cnrtErrorIllegalState",
    100050: "cnrtErrorNotSupport",
    100051: "cnrtErrorOpsNotPermitted",
    100060: "cnrtErrorQueue",
    100100: "cnrtErrorNoMem",
    100128: "cnrtErrorAssert",
    100132: "cnrtErrorKernelTrap",
    100133: "cnrtErrorKernelUserTrap",
    100301: "cnrtErrorNotFound",
    100302: "cnrtErrorInvalidKernel",
    632002: "cnrtErrorSetOnActiveProcess",
    632006: "cnrtErrorDevice",
    632009: "cnrtErrorNoAttribute",
    632013: "cnrtErrorMemcpyDirectionInvalid",
    632014: "cnrtErrorBusy",
    632015: "cnrtErrorCndrvFuncCall",
    632017: "cnrtErrorCndevFuncCall",
    632019: "cnrtErrorNoCnrtContext",
    632020: "cnrtErrorCndrvFuncNotFound",
    999991: "cnrtErrorUnknown",
}


class _PointerAttributes(ctypes.Structure):  # cnrtPointerAttributes_t, 48 bytes
    _fields_ = [
        ("type", c_int),
        ("device", c_int),
        ("size", c_size_t),
        ("devicePointer", c_void_p),
        ("hostPointer", c_void_p),
        ("cacheMode", c_int),
        ("deviceBasePointer", c_void_p),
    ]


@dataclass(frozen=True)
class CnrtSpec:
    vendor: str
    search: LibrarySearch
    prefix: str = "cnrt"
    statuses: dict = field(default_factory=lambda: dict(CNRT_STATUS))
    not_ready: tuple = (632014, 1)  # cnrtErrorBusy (documented for Query calls), cnrtErrorNotReady
    no_device: tuple = (100004,)
    memcpy_kinds: tuple = (3, 0, 2, 1, 5)  # H2H, H2D, D2H, D2D, Default -> cnrtMemTransDir_t
    memory_type_device: int = 2  # cnrtMemTypeDevice
    total_memory_attr: int = 0x405  # cnrtAttrTotalMemSize, in MB

    def load(self):
        """(bound runtime or None, reason when None)."""
        return CnrtRuntime.load(self)


class CnrtRuntime(DeviceRuntime):
    NAME_FN = "GetErrorName"
    POINTER_ATTRIBUTES = _PointerAttributes
    SYMBOLS = {
        **DeviceRuntime.SYMBOLS,
        "malloc_host": "HostMalloc",
        "stream_create": "QueueCreate",
        "stream_destroy": "QueueDestroy",
        "stream_synchronize": "QueueSync",
        "event_create": "NotifierCreate",
        "event_destroy": "NotifierDestroy",
        "event_record": "PlaceNotifier",
        "event_query": "QueryNotifier",
        "event_synchronize": "WaitNotifier",
    }  # notifier first: PlaceNotifier(n, q) as EventRecord(e, s)
    REQUIRED = (
        "GetDeviceCount",
        "SetDevice",
        "Malloc",
        "Free",
        "Memcpy",
        "QueueCreate",
        "QueueSync",
        "NotifierCreate",
        "PlaceNotifier",
    )
    # the async copy: the newest name this libcnrt exports (all three take the same arguments;
    # CNRT 6.14 deprecates the plain and _V2 names for _V3)
    ASYNC_COPIES = ("MemcpyAsync_V3", "MemcpyAsync_V2", "MemcpyAsync")
    PROPS = ("GetDeviceProperties_V3", "GetDeviceProperties_V2", "GetDeviceProperties")

    def signatures(self) -> dict:
        V, I3 = c_void_p, [POINTER(c_int)] * 3
        sig = {
            "GetDeviceCount": [POINTER(c_uint)],
            "SetDevice": [c_int],
            "GetDevice": [POINTER(c_int)],
            "GetLibVersion": I3,
            "DriverGetVersion": I3,
            "SyncDevice": [],
            "GetLastError": [],
            "MemGetInfo": [POINTER(c_size_t), POINTER(c_size_t)],
            "DeviceGetAttribute": [POINTER(c_int), c_int, c_int],
            "Malloc": [POINTER(V), c_size_t],
            "Free": [V],
            "HostMalloc": [POINTER(V), c_size_t],
            "FreeHost": [V],
            "Memcpy": [V, V, c_size_t, c_int],
            "QueueCreate": [POINTER(V)],
            "QueueDestroy": [V],
            "QueueSync": [V],
            "QueueQuery": [V],
            "QueueWaitNotifier": [V, V, c_uint],
            "NotifierCreate": [POINTER(V)],
            "NotifierDestroy": [V],
            "PlaceNotifier": [V, V],
            "QueryNotifier": [V],
            "WaitNotifier": [V],
            "NotifierElapsedTime": [V, V, POINTER(c_float)],
            "PointerGetAttributes": [POINTER(_PointerAttributes), V],
        }
        sig.update({name: [V, V, c_size_t, V, c_int] for name in self.ASYNC_COPIES})
        sig.update({name: [V, c_int] for name in self.PROPS})
        return sig

    def __init__(self, spec, lib, path):
        super().__init__(spec, lib, path)
        self.async_copy = next((n for n in self.ASYNC_COPIES if self._fns.get(n) is not None), None)
        if self.async_copy is None:
            raise OSError(f"{path} lacks cnrtMemcpyAsync (and its _V2, _V3)")

    # ---------------------------------------------------------------- devices
    def device_count(self) -> tuple[int, int]:
        n = c_uint(0)
        st = self._fns["GetDeviceCount"](byref(n))
        return (n.value if st == 0 else 0), st

    def version(self, which: str = "RuntimeGetVersion") -> str | None:
        fn = self._fns.get("GetLibVersion" if which == "RuntimeGetVersion" else "DriverGetVersion")
        v = [c_int(0) for _ in range(3)]
        return ".".join(str(x.value) for x in v) if fn is not None and fn(*map(byref, v)) == 0 else None

    def device_info(self, device: int) -> dict:
        name, total = f"{self.spec.vendor} device {device}", 0
        fn = next((self._fns[n] for n in self.PROPS if self._fns.get(n) is not None), None)
        buf = ctypes.create_string_buffer(4096)  # larger than any CNRT's cnrtDeviceProp_t; name[256] first
        if fn is not None and fn(buf, device) == 0:
            name = buf.raw[:256].split(b"\0", 1)[0].decode(errors="replace") or name
        mb, attr = c_int(0), self._fns.get("DeviceGetAttribute")
        if attr is not None and attr(byref(mb), self.spec.total_memory_attr, device) == 0:
            total = mb.value << 20
        return {"index": device, "name": name, "total_memory": total}

    # ----------------------------------------------------------------- memory
    def memcpy(self, dst: int, src: int, nbytes: int, kind: int, stream=None, op: str | None = None) -> None:
        direction = self.spec.memcpy_kinds[kind]
        if stream is None:
            self.call("Memcpy", c_void_p(dst), c_void_p(src), nbytes, direction, op=op)
        else:
            self.call(self.async_copy, c_void_p(dst), c_void_p(src), nbytes, c_void_p(stream), direction, op=op)

    # ----------------------------------------------------- queues, notifiers
    def stream_wait_event(self, stream, event: int) -> bool:
        self.call("QueueWaitNotifier", c_void_p(event), c_void_p(stream or 0), 0)
        return True

    def elapsed_ms(self, start: int, end: int) -> float:
        ms = c_float()
        self.call("NotifierElapsedTime", c_void_p(start), c_void_p(end), byref(ms))
        return ms.value
