"""Binding template for NCCL-class collective libraries (NCCL, CoreX NCCL, MCCL …).

They share NCCL's shapes: a 128-byte unique id, ``<p>CommInitRank(comm*, nranks,
id, rank)``, collectives taking (buffers, count, datatype, [op], [root], comm,
stream), group start/end.  :class:`CclSpec` holds what differs.
"""

from __future__ import annotations

import ctypes
from ctypes import POINTER, byref, c_int, c_size_t, c_void_p
from dataclasses import dataclass, field

from .._errors import InvalidArgument, InvalidUsage, RemoteError
from ._dl import BoundLibrary, LibrarySearch
from ._status import check_status

NCCL_STATUS = {
    0: "ncclSuccess",
    1: "ncclUnhandledCudaError",
    2: "ncclSystemError",
    3: "ncclInternalError",
    4: "ncclInvalidArgument",
    5: "ncclInvalidUsage",
    6: "ncclRemoteError",
    7: "ncclInProgress",
}
# uniccl DType -> ncclDataType_t (codes 0-9 coincide; NCCL has no 16-bit integers)
NCCL_DTYPES = {d: d for d in range(10)}
NCCL_OPS = {o: o for o in range(5)}  # sum, prod, max, min, avg


class _UniqueId(ctypes.Structure):
    _fields_ = [("internal", ctypes.c_char * 128)]


@dataclass(frozen=True)
class CclSpec:
    vendor: str  # "NCCL"
    prefix: str  # "nccl"
    search: LibrarySearch
    statuses: dict = field(default_factory=lambda: dict(NCCL_STATUS))
    classes: dict = field(default_factory=lambda: {4: InvalidArgument, 5: InvalidUsage, 6: RemoteError})
    dtypes: dict = field(default_factory=lambda: dict(NCCL_DTYPES))
    ops: dict = field(default_factory=lambda: dict(NCCL_OPS))
    id_bytes: int = 128
    # non-empty: no other plugin's library with this prefix may share the process, and why
    # ("MetaX and Moore MCCL share symbol names"); see _dl.ccl_conflict
    exclusive: str = ""

    def load(self):
        """(bound library or None, reason when None)."""
        return CclLibrary.load(self)


# every NCCL-class library's functions (without the prefix) and their argument types, all
# returning an int status; the compiled call path calls those whose binding matches these by address
SIGNATURES = {
    "GetVersion": [POINTER(c_int)],
    "GetUniqueId": [POINTER(_UniqueId)],
    "CommInitRank": [POINTER(c_void_p), c_int, _UniqueId, c_int],
    "CommDestroy": [c_void_p],
    "CommAbort": [c_void_p],
    "CommGetAsyncError": [c_void_p, POINTER(c_int)],
    "AllReduce": [c_void_p, c_void_p, c_size_t, c_int, c_int, c_void_p, c_void_p],
    "Broadcast": [c_void_p, c_void_p, c_size_t, c_int, c_int, c_void_p, c_void_p],
    "Reduce": [c_void_p, c_void_p, c_size_t, c_int, c_int, c_int, c_void_p, c_void_p],
    "AllGather": [c_void_p, c_void_p, c_size_t, c_int, c_void_p, c_void_p],
    "ReduceScatter": [c_void_p, c_void_p, c_size_t, c_int, c_int, c_void_p, c_void_p],
    "Send": [c_void_p, c_size_t, c_int, c_int, c_void_p, c_void_p],
    "Recv": [c_void_p, c_size_t, c_int, c_int, c_void_p, c_void_p],
    "GroupStart": [],
    "GroupEnd": [],
}


class CclLibrary(BoundLibrary):
    """The collective library, bound; the same call shapes for every NCCL-class library."""

    REQUIRED = ("GetUniqueId", "CommInitRank", "CommDestroy", "AllReduce")

    def signatures(self) -> dict:
        return dict(SIGNATURES)

    def check(self, status: int, name: str, op=None, rank=None) -> None:
        """Raise the typed error of a failed ``status`` returned by ``<prefix><name>``."""
        check_status(
            status,
            self.spec.prefix + name,
            self.spec.vendor,
            self.spec.statuses,
            classes=self.spec.classes,
            op=op,
            rank=rank,
        )

    def call(self, name: str, *args, op=None, rank=None) -> None:
        fn = self._fns.get(name)
        if fn is None:
            raise InvalidUsage(f"{self.spec.prefix}{name} is not exported by {self.path}", op=op, rank=rank)
        self.check(fn(*args), name, op, rank)

    def version(self) -> int | None:
        v = c_int(0)
        fn = self._fns.get("GetVersion")
        return v.value if fn is not None and fn(byref(v)) == 0 else None

    def unique_id(self) -> bytes:
        uid = _UniqueId()
        self.call("GetUniqueId", byref(uid), op="init")
        return bytes(uid)  # all 128 bytes (the char array attribute would stop at a NUL)

    def comm_init(self, nranks: int, uid: bytes, rank: int, device: int) -> int | None:
        """This rank's communicator (the caller has made ``device`` current)."""
        comm, u = c_void_p(), _UniqueId()
        ctypes.memmove(ctypes.addressof(u), uid, min(len(uid), ctypes.sizeof(u)))
        self.call("CommInitRank", byref(comm), nranks, u, rank, op="init", rank=rank)
        return comm.value

    def destroy(self, comm: int) -> None:
        self.call("CommDestroy", c_void_p(comm))

    def abort(self, comm: int) -> None:
        self.call("CommAbort", c_void_p(comm))

    def async_error(self, comm: int) -> int:
        st = c_int(0)
        fn = self._fns.get("CommGetAsyncError")
        if fn is None or fn(c_void_p(comm), byref(st)) != 0:
            return 0
        return st.value

    def dtype(self, dtype: int) -> int | None:
        return self.spec.dtypes.get(dtype)
