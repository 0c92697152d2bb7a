"""Integrity of the TCP mesh's messages: CRC-32C checksums (``UNICCL_TCP_CHECKSUM``), the
copies a sender keeps for retransmission (``UNICCL_TCP_RETAIN_BYTES`` per peer, oldest
dropped first: :class:`_Kept`), and on the receiving side what to do with a message that
fails its check: ask for a copy and hold what the peer sent after it until the copy
arrives, so order is kept (:class:`_RxState`); after ``_MAX_RETRIES`` failed copies of one
message every receive from that peer fails with a typed error.
"""

from __future__ import annotations

import collections
import ctypes
import mmap
import threading
from typing import Any

from ... import _env
from ..._errors import InternalError
from .base import _MeshBase, _PerPeer
from .wire import _CHECKED, _GONE, _INLINE, _NACK, _NACK_TAG, _RETRANSMIT, _STAMPED, _head, _view

_MAX_RETRIES = 3  # a message corrupted this many times in a row fails the communicator


def _checksums():
    """(on?, crc32c(bytes, crc=0), crc32c_at(ptr, n, crc=0)): CRC-32C from the core's C code."""
    on = _env.flag("UNICCL_TCP_CHECKSUM")
    try:
        from ..shm._shm import crc32c, crc32c_at
    except ImportError:  # the compiled core is missing: no checksums (a plain-Python build)
        return False, None, None
    return on, crc32c, crc32c_at


class _Kept:
    """Copies of sent messages for retransmission: one preallocated ring of ``budget`` bytes
    shared by all peers (so copying costs a memcpy, not an allocation), newest overwriting
    oldest; a record is valid while the ring has not wrapped over it."""

    def __init__(self, budget: int, size: int):
        self._copy = None  # crc32c_copy of the compiled core, imported at first use
        self.budget = max(0, budget)
        self._ring = None
        self._pos = 0  # bytes handed out so far (absolute)
        self._lock = threading.Lock()
        # msg id -> [ctx, tag, crc, start, n, stamp]
        self._index = _PerPeer(lambda p: collections.OrderedDict())
        # msg id -> (ctx, tag, crc, bytes, stamp)
        self._small = _PerPeer(lambda p: collections.OrderedDict())
        self._small_bytes = [0] * size

    def keep_small(self, peer, msg_id, record) -> None:
        """Keep a small message's bytes object itself: the newest 1024 per peer, within 1/16 of the
        budget (the peer's send lock is held: no other writer)."""
        small = self._small[peer]
        small[msg_id] = record
        self._small_bytes[peer] += len(record[3])
        while len(small) > 1024 or (self._small_bytes[peer] > self.budget // 16 and len(small) > 1):
            self._small_bytes[peer] -= len(small.popitem(last=False)[1][3])

    def keep(self, peer, msg_id, ctx, tag, ptr, nbytes, data, stamp):
        """Copy the payload into the ring: (view of the copy, its CRC); (None, 0) when it is too
        large to keep."""
        if nbytes > self.budget // 4:
            return None, 0
        with self._lock:
            if self._ring is None:
                from ..shm._shm import crc32c_copy

                self._copy = crc32c_copy
                self._ring = mmap.mmap(-1, self.budget)  # zero pages mapped as they are first written, not all at once
                self._base = ctypes.addressof((ctypes.c_char * self.budget).from_buffer(self._ring))
            off = self._pos % self.budget
            if off + nbytes > self.budget:  # no wrap inside a record: skip the tail
                self._pos += self.budget - off
                off = 0
            start = self._pos
            self._pos += nbytes
            index = self._index[peer]
            index[msg_id] = rec = [ctx, tag, 0, start, nbytes, stamp]
            while index and self._pos - next(iter(index.values()))[3] > self.budget:
                index.popitem(last=False)  # overwritten
        tmp = None
        if data is not None and nbytes:
            tmp = (ctypes.c_char * nbytes).from_buffer_copy(data)  # kept alive until the copy is done
            ptr = ctypes.addressof(tmp)
        crc = self._copy(self._base + off, ptr or 0, nbytes)  # copy and checksum in one pass, GIL released
        rec[2] = crc
        del tmp
        return memoryview(self._ring)[off : off + nbytes], crc

    def get(self, peer, msg_id):
        """(ctx, tag, crc, bytes, stamp) of a kept message, or None when it was overwritten."""
        small = self._small[peer].get(msg_id)
        if small is not None:
            return small
        with self._lock:
            rec = self._index[peer].get(msg_id)
            if rec is None or self._pos - rec[3] > self.budget:
                return None
            ctx, tag, crc, start, n, stamp = rec
            off = start % self.budget
            return ctx, tag, crc, bytes(self._ring[off : off + n]), stamp


class _RxState:
    """What one reader knows about its peer's stream: the message being filled (``key``: its
    (peer, context, tag); failed if the connection drops, or waits for it again if it heals), the
    id of the next checked message it expects (those before it were delivered), the corrupted
    message awaited again and what arrived after it."""

    __slots__ = ("current", "key", "next_id", "awaiting", "held", "tries", "sync")

    def __init__(self):
        self.current = None
        self.key = None
        self.next_id = 0
        self.awaiting = None
        self.held = collections.deque()
        self.tries = 0
        self.sync = False  # the peer asked to be told once nothing is awaited from it (Mesh.linger)


class _Integrity(_MeshBase):
    """The Mesh's part that checksums messages, keeps copies of them, sends a copy asked for,
    and on a corrupted message asks for one (or gives up)."""

    _kept: _Kept
    _next_id: list[int]  # per peer: the id of the next message sent to it
    _crc: Any  # crc32c(bytes, crc=0) of the compiled core (None without it: checksums are off)
    stats: dict[str, int]

    def _checked(self, peer: int, ctx: int, tag: int, ptr, nbytes: int, data, stamp) -> tuple:
        """The pieces of a message with its payload's CRC; a copy is kept for a retransmission
        (send lock held)."""
        msg_id = self._next_id[peer]
        self._next_id[peer] += 1
        flags = _CHECKED | _STAMPED if stamp else _CHECKED
        body: bytes | memoryview | None
        if nbytes <= _INLINE:  # small: the bytes object itself is the kept copy
            body = bytes(data) if data is not None else ctypes.string_at(ptr, nbytes)
            crc = self._crc(body)
            self._kept.keep_small(peer, msg_id, (ctx, tag, crc, body, stamp))
            return (_head(ctx, tag, nbytes, crc, flags, msg_id, stamp) + body,)
        body, crc = self._kept.keep(peer, msg_id, ctx, tag, ptr, nbytes, data, stamp)
        if body is None:  # larger than a quarter of the budget: checked, sent from where it is, not kept
            body = data if data is not None else _view(ptr, nbytes)
            crc = self._crc(body)
        return _head(ctx, tag, nbytes, crc, flags, msg_id, stamp), body

    def _copy_of(self, peer: int, msg_id: int) -> tuple:
        """The pieces of the kept copy of message ``msg_id`` to ``peer``, asked for again (send
        lock held); overwritten or never kept: a marker that fails the receiver's wait typed."""
        kept = self._kept.get(peer, msg_id)
        if kept is None:
            return (_head(0, 0, 0, 0, _GONE, msg_id),)
        ctx, tag, crc, body, stamp = kept
        self.stats["retransmits"] += 1
        if self.links is not None:
            self.links[peer][4] += 1
        flags = _CHECKED | _RETRANSMIT | (_STAMPED if stamp else 0)
        return _head(ctx, tag, len(body), crc, flags, msg_id, stamp), body

    def _kept_message(self, peer: int, msg_id: int) -> list | None:
        """The pieces of message ``msg_id`` to ``peer`` as first sent, from its kept copy (a
        healed connection's stream resumes with them); None when it is no longer kept."""
        kept = self._kept.get(peer, msg_id)
        if kept is None:
            return None
        ctx, tag, crc, body, stamp = kept
        return [_head(ctx, tag, len(body), crc, _CHECKED | (_STAMPED if stamp else 0), msg_id, stamp), body]

    def _resend(self, peer: int, msg_id: int) -> None:
        """``peer`` got message ``msg_id`` corrupted: its sender thread sends the kept copy (the
        reader thread that read the request goes on reading)."""
        self._kick(self._outs[peer], [None, msg_id])

    def _corrupted(self, peer: int, rx, key, req, msg_id: int) -> bool:
        """Message ``msg_id`` from ``peer`` failed its checksum: put its receive back first in
        line, hold what follows, and ask for a copy (or give up after _MAX_RETRIES)."""
        from ...observability.log import logger

        rx.current = None
        if req is not None:
            with self._lock:
                self._posted.setdefault(key, collections.deque()).appendleft(req)
        rx.tries = rx.tries + 1 if rx.awaiting == msg_id else 1
        self.stats["checksum_failures"] += 1
        if self.links is not None:
            self.links[peer][5] += 1
        if rx.tries > _MAX_RETRIES:
            self._unrecoverable(peer, rx, msg_id, f"failed its checksum {rx.tries} times")
            return False
        rx.awaiting = msg_id
        self.stats["retransmit_requests"] += 1
        logger.warning(
            "rank %d: message %d from rank %d failed its CRC-32C check; asking for it again (%d)",
            self.rank,
            msg_id,
            peer,
            rx.tries,
        )
        # through the peer's sender thread: this reader must go on reading (the peer may be
        # sending to us while it is asked for a copy itself)
        self._kick(self._outs[peer], [(_head(0, _NACK_TAG, _NACK.size, 0, 0, 0) + _NACK.pack(msg_id),), None])
        return False

    def _unrecoverable(self, peer: int, rx, msg_id: int, why: str) -> None:
        """A corrupted message cannot be had again: every receive from that peer fails."""
        error = InternalError(
            f"message {msg_id} from {self.where(peer)} arrived corrupted and {why}", rank=self.rank, remote_rank=peer
        )
        rx.awaiting, rx.held = None, collections.deque()
        if rx.sync:  # nothing more will be asked of it
            rx.sync = False
            self._answer_sync(peer)
        with self._lock:
            self._dead[peer] = error
            keys = [k for k in self._posted if k[0] == peer]
            reqs = [r for k in keys for r in self._posted.pop(k)]
        for req in reqs:
            req.error = error
            req.done.set()
