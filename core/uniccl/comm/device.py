"""Device buffers: host staging, and the native (NCCL-class) path.

A device buffer that the communicator's platform claims becomes a
:class:`Staged` buffer.  While the call is checked its ``ptr`` is the device
address (so overlap checks work in device space); when it runs, ``ptr`` points
at a cached pinned host mirror and the host algorithms run unchanged:

- *stage in* before the ranks agree (so a failing copy becomes this rank's error
  in the agreement, and every peer raises RemoteError instead of waiting),
- *stage out* afterwards for buffers the collective writes.

Copies run on the stream the buffer came with (DLPack/CUDA Array Interface
producer stream) and are waited for, so the op is ordered after earlier work on
that stream.  When every rank's buffers are device buffers of a platform with a
native collective library, the ranks agree on the native path instead and the
library runs the collective on the device, on that stream.
"""

from __future__ import annotations

from .._types import MemcpyKind

# Collectives the NCCL-class libraries have natively (the rest stage through the host).
NATIVE = frozenset(("all_reduce", "broadcast", "reduce", "all_gather", "reduce_scatter"))


class Staged:
    """A device buffer standing in for a host one (same attributes as a BufferView)."""

    __slots__ = (
        "obj",
        "ptr",
        "nbytes",
        "count",
        "dtype",
        "readonly",
        "device_type",
        "device_id",
        "stream",
        "dev_ptr",
        "device",
        "slot",
        "writable",
    )

    def __init__(self, view, device: int, slot: str, writable: bool):
        self.obj, self.nbytes, self.count, self.dtype = view.obj, view.nbytes, view.count, view.dtype
        self.readonly, self.device_type, self.device_id = view.readonly, view.device_type, view.device_id
        self.stream = view.stream if isinstance(view.stream, int) and view.stream > 2 else None
        self.ptr = self.dev_ptr = view.ptr
        self.device, self.slot, self.writable = device, slot, writable


def stage(comm, view, device: int, argument: str, writable: bool) -> Staged:
    """A claimed device buffer of the call being checked on ``comm`` (the plan gets the
    calling thread's list of them), staged through a host mirror unless the native path runs."""
    staged = Staged(view, device, argument, writable)
    if comm._staging.list is None:
        comm._staging.list = []
    comm._staging.list.append(staged)
    return staged


class Slots:
    """Buffers kept per slot, grown as needed: no allocation per call in steady state.  By
    default host buffers from a platform's ``host_alloc`` (pinned on device platforms): the
    communicator's scratch space and its device buffers' mirrors; ``on_device`` makes the
    device scratch of the staged reductions."""

    def __init__(self, backend, on_device: int | None = None):
        if on_device is None:
            self._alloc, self._free = backend.host_alloc, backend.host_free
        else:
            self._alloc = lambda n: backend.mem_alloc(on_device, n)
            self._free = lambda p: backend.mem_free(on_device, p)
        self._slots: dict = {}

    def get(self, slot, nbytes: int) -> int:
        ptr, size = self._slots.get(slot, (0, 0))
        if size < nbytes:
            if ptr:
                self._free(ptr)
            size = max(nbytes, 2 * size, 4096)
            ptr = self._alloc(size)
            self._slots[slot] = (ptr, size)
        return ptr

    __call__ = get

    def free(self) -> None:
        for ptr, _ in self._slots.values():
            self._free(ptr)
        self._slots.clear()


def stage_in(backend, mirrors: Slots, staged: list) -> None:
    """Point each staged buffer at its mirror and copy the device data there."""
    seen: dict[int, int] = {}
    for s in staged:
        if s.dev_ptr in seen:  # in place: send and recv are one buffer, one mirror
            s.ptr = seen[s.dev_ptr]
            continue
        s.ptr = seen[s.dev_ptr] = mirrors.get(s.slot, s.nbytes)
        if s.nbytes:
            backend.memcpy(s.ptr, s.dev_ptr, s.nbytes, int(MemcpyKind.DEVICE_TO_HOST), s.stream)
    for stream in {s.stream for s in staged if s.stream is not None}:
        backend.stream_synchronize(stream)


def stage_out(backend, staged: list) -> None:
    done = set()
    for s in staged:
        if s.writable and s.nbytes and s.dev_ptr not in done:
            done.add(s.dev_ptr)
            backend.memcpy(s.dev_ptr, s.ptr, s.nbytes, int(MemcpyKind.HOST_TO_DEVICE), s.stream)
    for stream in {s.stream for s in staged if s.stream is not None and s.writable}:
        backend.stream_synchronize(stream)


def on_device(comm, plan) -> bool:
    """Every buffer ``plan``'s call reads or writes is a staged device buffer of this rank's
    device (``comm.device``, where the library's communicator, the device kernels and their
    scratch live): its sendbuf (a broadcast's buf), and its recvbuf unless that is None, the
    sendbuf itself (in place) or a reduce's non-root's (unused).  Otherwise the host path runs:
    beside a host buffer the library and the kernels would write the device buffer in its
    place.  ``plan.args`` are the builder's, ``(comm, sendbuf, recvbuf, ...)`` for every
    collective but broadcast."""
    staged = plan.staged or ()
    if not staged or any(s.device != comm.device for s in staged):
        return False
    slots = {s.slot: s for s in staged}
    send = slots.get("sendbuf") or slots.get("buf")
    if send is None:
        return False
    if plan.name == "broadcast" or "recvbuf" in slots:
        return True
    if len(plan.args) < 3:
        return False  # (no builder's arguments to tell: the host path is right for any)
    recvbuf = plan.args[2]
    return recvbuf is None or recvbuf is send.obj or (plan.name == "reduce" and comm.rank != plan.root)


def native_args(comm, plan) -> dict | None:
    """The native library's arguments for ``plan``, or None when it has no native form."""
    if plan.name not in NATIVE or not on_device(comm, plan):
        return None
    by_slot = {s.slot: s for s in plan.staged}
    send = by_slot.get("sendbuf") or by_slot["buf"]
    recv = by_slot.get("recvbuf") or send
    if recv.stream != send.stream:
        return None  # the library takes one stream; staging waits for each buffer's own
    return {
        "send": send.dev_ptr,
        "recv": recv.dev_ptr,
        "count": plan.count,
        "dtype": plan.dtype,
        "op": plan.op,
        "root": max(plan.root, 0),
        "stream": send.stream,
        "device": send.device,
        "result": recv.obj,
    }
