"""What every bound accelerator runtime does alike: checked calls, device memory, pinned
host memory, streams (queues) and events (notifiers).

A runtime binding (:class:`uniccl.kit.CudaLikeRuntime`, Cambricon's ``CnrtRuntime``) names
its symbols in ``SYMBOLS`` (role -> name without the prefix) and gives what differs
(signatures, copies, device queries); its spec carries ``prefix``, ``vendor``,
``statuses`` and ``not_ready`` (the statuses that mean "work still pending").
"""

from __future__ import annotations

from collections.abc import Callable
from ctypes import Structure, byref, c_void_p
from typing import cast

from ._dl import BoundLibrary
from ._status import check_status


class DeviceRuntime(BoundLibrary):
    KIND = "runtime"
    SYMBOLS = {
        "set_device": "SetDevice",
        "malloc": "Malloc",
        "free": "Free",
        "malloc_host": "MallocHost",
        "free_host": "FreeHost",
        "stream_create": "StreamCreate",
        "stream_destroy": "StreamDestroy",
        "stream_synchronize": "StreamSynchronize",
        "event_create": "EventCreate",
        "event_destroy": "EventDestroy",
        "event_record": "EventRecord",
        "event_query": "EventQuery",
        "event_synchronize": "EventSynchronize",
    }

    def call(self, name: str, *args, op: str | None = None) -> None:
        fn = self._fns.get(name)
        if fn is None:
            from .._errors import VendorError

            raise VendorError(
                f"{self.spec.prefix}{name} is not exported by {self.path}",
                op=op,
                call=self.spec.prefix + name,
                code=-1,
                status_name="missing symbol",
            )
        check_status(
            fn(*args), self.spec.prefix + name, self.spec.vendor, self.spec.statuses, name_of=self.name_of, op=op
        )

    def status(self, name: str, *args) -> int:
        """Raw status (for Query calls where "not ready" is an answer, not an error)."""
        return cast("Callable[..., int]", self._fns[name])(*args)  # callers name a symbol that is bound

    def _new_handle(self, role: str, *args, op: str | None = None) -> int:
        h = c_void_p()
        self.call(self.SYMBOLS[role], byref(h), *args, op=op)
        return h.value or 0

    def set_device(self, device: int, op: str | None = None) -> None:
        self.call(self.SYMBOLS["set_device"], device, op=op)

    def malloc(self, nbytes: int, op: str | None = None) -> int:
        return self._new_handle("malloc", max(1, nbytes), op=op)

    def free(self, ptr: int, op: str | None = None) -> None:
        self.call(self.SYMBOLS["free"], c_void_p(ptr), op=op)

    def malloc_host(self, nbytes: int, op: str | None = None) -> int:
        return self._new_handle("malloc_host", max(1, nbytes), op=op)

    def free_host(self, ptr: int, op: str | None = None) -> None:
        self.call(self.SYMBOLS["free_host"], c_void_p(ptr), op=op)

    def stream_create(self) -> int:
        return self._new_handle("stream_create")

    def stream_destroy(self, stream: int) -> None:
        self.call(self.SYMBOLS["stream_destroy"], c_void_p(stream))

    def stream_synchronize(self, stream, op: str | None = None) -> None:
        self.call(self.SYMBOLS["stream_synchronize"], c_void_p(stream or 0), op=op)

    def event_create(self) -> int:
        return self._new_handle("event_create")

    def event_destroy(self, event: int) -> None:
        self.call(self.SYMBOLS["event_destroy"], c_void_p(event))

    def event_record(self, event: int, stream) -> None:
        self.call(self.SYMBOLS["event_record"], c_void_p(event), c_void_p(stream or 0))

    def event_query(self, event: int) -> bool:
        """True when the event's work is done; "not ready" statuses are an answer, not an error."""
        name = self.SYMBOLS["event_query"]
        st = self.status(name, c_void_p(event))
        if st in self.spec.not_ready:
            return False
        check_status(st, self.spec.prefix + name, self.spec.vendor, self.spec.statuses, name_of=self.name_of)
        return True

    def event_synchronize(self, event: int) -> None:
        self.call(self.SYMBOLS["event_synchronize"], c_void_p(event))

    # the runtime's pointer-attributes struct (``type`` and ``device`` fields)
    POINTER_ATTRIBUTES: type[Structure] | None = None

    def pointer_device(self, ptr: int) -> int | None:
        """The device owning ``ptr`` according to the runtime, or None when not device memory."""
        fn = self._fns.get("PointerGetAttributes")
        if fn is None or self.POINTER_ATTRIBUTES is None:
            return None
        attrs = self.POINTER_ATTRIBUTES()
        if fn(byref(attrs), c_void_p(ptr)) != 0:
            self._after_failed_query()
            return None
        return attrs.device if attrs.type == self.spec.memory_type_device else None

    def _after_failed_query(self) -> None:
        """Runtimes with a sticky "last error" clear it here."""
