"""CNCL (Cambricon's collective library, libcncl) bound with ctypes, in the shape the
kit's NativeNccl expects of a collective library (the methods of kit.CclLibrary).

What differs from NCCL: a 136-byte ``cnclCliqueId`` (data[128], then a hash) made by
``cnclGetCliqueId`` and passed by pointer to ``cnclInitComms(comms, num_comm,
dev_list, rank_list, nrank, clique_id)`` (one communicator per process here),
``cnclFreeComm``/``cnclAbortComm``, its own data-type and result codes, no float64
and no average (uniccl stages those through host memory, or sums then scales),
``cnclGetLibVersion(major, minor, patch)``.  Values from the public cncl.h of CNCL 1.25.
"""

from __future__ import annotations

import ctypes
from ctypes import POINTER, byref, c_char, c_int, c_size_t, c_uint64, c_void_p
from dataclasses import dataclass, field

from uniccl import InvalidArgument, InvalidUsage, RemoteError
from uniccl.kit import LibrarySearch, check_status
from uniccl.kit._dl import BoundLibrary

CNCL_STATUS = {
    0x00: "CNCL_RET_SUCCESS",
    0x01: "CNCL_RET_ERR_INTERNAL",
    0x11: "CNCL_RET_ERR_UNSUPPORTED",
    0x21: "CNCL_RET_ERR_NULL_POINTER",
    0x31: "CNCL_RET_ERR_BUILD_RING",
    0x41: "CNCL_RET_ERR_BUILD_TREE",
    0x51: "CNCL_RET_ERR_INIT",
    0x61: "CNCL_RET_ERR_NOT_INIT",
    0x71: "CNCL_RET_ERR_REINIT",
    0x81: "CNCL_RET_ERR_NO_ALGO",
    0x91: "CNCL_RET_ERR_INVALID_VERSION",
    0x02: "CNCL_RET_ERR_SYSTEM",
    0x12: "CNCL_RET_ERR_SYS_MALLOC",
    0x22: "CNCL_RET_ERR_SYS_SOCKET",
    0x32: "CNCL_RET_ERR_SYS_IBV",
    0x03: "CNCL_RET_ERR_MLU_RUNTIME",
    0x13: "CNCL_RET_ERR_CNRT_DEVICE",
    0x23: "CNCL_RET_ERR_CNRT_MEMCOPY",
    0x33: "CNCL_RET_ERR_CNRT_MALLOC",
    0x04: "CNCL_RET_ERR_MLU_DEVICE",
    0x06: "CNCL_RET_ASYNC_IN_PROGRESS",
    0x16: "CNCL_RET_ASYNC_ERROR",
    0x26: "CNCL_RET_ASYNC_UNKNOWN_ERROR",
    0x07: "CNCL_RET_ERR_ARGUMENTS",
    0x08: "CNCL_RET_ERR_MLU_ALLOCATE",
    0x18: "CNCL_RET_ERR_MLU_DEALLOCATE",
}
# uniccl DType -> cnclDataType_t (no float64)
CNCL_DTYPES = {0: 0x20, 1: 0x30, 2: 0x22, 3: 0x32, 4: 0x23, 5: 0x33, 6: 0x10, 7: 0x12, 9: 0x11, 10: 0x21, 11: 0x31}
CNCL_OPS = {0: 0, 1: 1, 2: 2, 3: 3}  # sum, prod, max, min (no avg)


class _CliqueId(ctypes.Structure):
    _fields_ = [("data", c_char * 128), ("hash", c_uint64)]


@dataclass(frozen=True)
class CnclSpec:
    vendor: str
    search: LibrarySearch
    prefix: str = "cncl"
    statuses: dict = field(default_factory=lambda: dict(CNCL_STATUS))
    # a peer that died or left surfaces as a socket error; bad arguments and misuse as their own
    classes: dict = field(
        default_factory=lambda: {0x07: InvalidArgument, 0x21: InvalidArgument, 0x11: InvalidUsage, 0x22: RemoteError}
    )
    dtypes: dict = field(default_factory=lambda: dict(CNCL_DTYPES))
    ops: dict = field(default_factory=lambda: dict(CNCL_OPS))
    exclusive: str = ""

    def load(self):
        """(bound library or None, reason when None)."""
        return CnclLibrary.load(self)


class CnclLibrary(BoundLibrary):
    KIND = "collective library"
    NAME_FN = "GetErrorStr"
    REQUIRED = ("GetCliqueId", "InitComms", "FreeComm", "AllReduce")

    def signatures(self) -> dict:
        V, S, I = c_void_p, c_size_t, c_int  # noqa: E741 (the C types, one letter each)
        return {
            "GetLibVersion": [POINTER(I)] * 3,
            "GetCliqueId": [POINTER(_CliqueId)],
            "InitComms": [POINTER(V), I, POINTER(I), POINTER(I), I, POINTER(_CliqueId)],
            "FreeComm": [V],
            "AbortComm": [V],
            "GetCommAsyncError": [V],
            "AllReduce": [V, V, S, I, I, V, V],
            "Broadcast": [V, V, S, I, I, V, V],
            "Reduce": [V, V, S, I, I, I, V, V],
            "AllGather": [V, V, S, I, V, V],
            "ReduceScatter": [V, V, S, I, I, V, V],
            "Send": [V, S, I, I, V, V],
            "Recv": [V, S, I, I, V, V],
            "GroupStart": [],
            "GroupEnd": [],
        }

    def call(self, name: str, *args, op=None, rank=None) -> None:
        fn = self._fns.get(name)
        if fn is None:
            raise InvalidUsage(f"cncl{name} is not exported by {self.path}", op=op, rank=rank)
        self.check(fn(*args), name, op, rank)

    def check(self, status: int, name: str, op=None, rank=None) -> None:
        """Raise the typed error of a failed ``status`` returned by ``cncl<name>``."""
        check_status(
            status,
            "cncl" + name,
            self.spec.vendor,
            self.spec.statuses,
            classes=self.spec.classes,
            name_of=self.name_of,
            op=op,
            rank=rank,
        )

    def version(self) -> str | None:
        fn, v = self._fns.get("GetLibVersion"), [c_int(0) for _ in range(3)]
        return ".".join(str(x.value) for x in v) if fn is not None and fn(*map(byref, v)) == 0 else None

    def unique_id(self) -> bytes:
        cid = _CliqueId()
        self.call("GetCliqueId", byref(cid), op="init")
        return ctypes.string_at(ctypes.addressof(cid), ctypes.sizeof(cid))  # all 136 bytes, hash included

    def comm_init(self, nranks: int, uid: bytes, rank: int, device: int) -> int:
        comm, cid = c_void_p(), _CliqueId()
        ctypes.memmove(ctypes.addressof(cid), uid, min(len(uid), ctypes.sizeof(cid)))
        dev, me = c_int(device), c_int(rank)
        self.call("InitComms", byref(comm), 1, byref(dev), byref(me), nranks, byref(cid), op="init", rank=rank)
        return comm.value

    def destroy(self, comm: int) -> None:
        self.call("FreeComm", c_void_p(comm))

    def abort(self, comm: int) -> None:
        self.call("AbortComm", c_void_p(comm))

    def async_error(self, comm: int) -> int:
        fn = self._fns.get("GetCommAsyncError")
        return fn(c_void_p(comm)) if fn is not None else 0

    def dtype(self, dtype: int) -> int | None:
        return self.spec.dtypes.get(dtype)
