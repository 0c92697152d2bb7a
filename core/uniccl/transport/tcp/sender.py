"""The sending side of the TCP mesh: one :class:`_Out` per peer (its socket, its TLS state,
what a timed-out send left owed to the stream) and :class:`_Sender`, the Mesh's part that
puts messages on the streams.  A send goes out in the caller's thread, under the peer's send
lock; it waits for a peer that takes no data (stopped, hung) at most the call's timeout, then
raises Timeout naming it; what it left unsent is kept and goes out first when the peer takes
data again, so the stream to it is never left with half a message.  Whatever must not block
(notices, answers and copies sent for the reader threads, what is owed) goes through the
peer's sender thread.
"""

from __future__ import annotations

import collections
import ctypes
import socket
import threading
import time
from typing import Any

from ... import _threads
from ..._errors import RemoteError, Timeout, UnicclError
from .base import _MeshBase, _Payload, _PerPeer
from .wire import _INLINE, _STAMPED, _TIMED_BYTES, _TLS_SLICE, CTRL, _head, _push, _view

_LAZY = object()  # a send's deadline, computed only if the send has to wait


class _Stalled(Exception):
    """A send's deadline passed while the peer took no data; ``started``: part of the message
    went out (the rest is owed: it goes out first, whoever sends next)."""

    def __init__(self, started: bool):
        super().__init__()
        self.started = started


class _Out:
    """The sending side of the connection to one peer: its socket, its TLS state (None: plain
    TCP), what is owed to the stream (``pending``: [plaintext?, view], the rest of a message a
    timed-out send left; it goes out before anything else) -- both under the peer's send lock --
    and the jobs of its sender thread (under ``cv``)."""

    __slots__ = ("peer", "sock", "gen", "tls", "pending", "jobs", "cv", "thread")

    def __init__(self, peer: int, sock, tls=None):
        self.peer, self.sock, self.tls = peer, sock, tls
        self.gen = 0  # the connection's generation (heal.py: one more per redial)
        self.pending: collections.deque[tuple[bool, memoryview]] = collections.deque()
        self.jobs: collections.deque[list] = collections.deque()  # [pieces, None] or [None, message id]
        self.cv = threading.Condition(threading.Lock())
        self.thread = None


class _Sender(_MeshBase):
    """The Mesh's part that sends: in the caller's thread (``send``), and through each peer's
    sender thread what must not wait for the peer."""

    send_locks: _PerPeer  # per peer: a threading.Lock, held while a message goes on the stream to it
    tracer: Any  # uniccl.observability.trace.Tracer under UNICCL_TRACE: a span per message (else None)
    timeout: Any  # seconds: the limit of waits outside calls
    _tl: threading.local  # per-thread wait limit (the call running on that thread)

    # ------------------------------------------------------------------ sending
    def send(self, peer: int, ctx: int, tag: int, ptr, nbytes: int, data=None, stamp=None) -> None:
        if peer == self.rank:
            payload = _Payload(data if data is not None else _view(ptr, nbytes))
            payload.stamp = stamp
            self._arrived(peer, ctx, tag, payload)
            return
        tracer, links = self.tracer, self.links
        if tracer is None and (links is None or nbytes < _TIMED_BYTES):  # counted, not timed
            if links is not None:
                links[peer][0] += nbytes
            return self._send(peer, ctx, tag, ptr, nbytes, data, stamp)
        clock = time.perf_counter_ns if tracer is None else time.time_ns
        t0 = clock()
        self._send(peer, ctx, tag, ptr, nbytes, data, stamp)
        t1 = clock()
        if links is not None:
            link = links[peer]
            link[0] += nbytes
            if nbytes >= _TIMED_BYTES:
                link[1] += t1 - t0
                link[6] += nbytes
        if tracer is not None and ctx & 3 != CTRL:
            tracer.span("message", f"send to rank {peer}", t0, t1, {"bytes": nbytes, "tag": tag})

    def _send(self, peer: int, ctx: int, tag: int, ptr, nbytes: int, data, stamp) -> None:
        if self.socks[peer] is None:  # its first use: connect (heal.py), within the call's limit
            self._ensure(peer, self._deadline())
        lock = self.send_locks[peer]
        deadline, gen = _LAZY, -1
        try:
            if not lock.acquire(False):  # another thread sends to that peer: wait for it, within the limit
                deadline = self._deadline()
                if not lock.acquire(timeout=-1 if deadline is None else max(0.0, deadline - time.monotonic())):
                    raise _Stalled(False)
            try:
                if self.checksums:  # a copy is kept: the receiver may ask for it again
                    pieces = self._checked(peer, ctx, tag, ptr, nbytes, data, stamp)
                else:
                    head = _head(ctx, tag, nbytes, 0, _STAMPED if stamp else 0, 0, stamp)
                    if data is not None:
                        pieces = (head + data,)
                    elif nbytes <= _INLINE:
                        pieces = (head + ctypes.string_at(ptr, nbytes),)
                    else:
                        pieces = (head, _view(ptr, nbytes))
                out = self._outs[peer]
                gen = out.gen
                if out.pending or out.tls is not None:
                    self._write(out, pieces, deadline)
                else:  # _write's own loop, inlined: every call's path
                    sock = out.sock
                    for piece in pieces:
                        try:
                            sent = sock.send(piece)
                        except BlockingIOError:  # full for a whole slice
                            sent = 0
                        if sent < len(piece):
                            deadline = self._wait_out(out, pieces, piece, sent, deadline)
            finally:
                lock.release()
        except _Stalled as exc:
            raise self._send_timeout(peer, exc.started) from None
        except OSError as exc:
            # the connection broke: once it is redialled, the message goes again with all from the
            # first one the peer did not get (heal.py)
            if gen >= 0 and self.can_heal(peer):
                if self.await_link(peer, gen, self._deadline() if deadline is _LAZY else deadline):
                    return
            # a peer that gave up on this communicator (a death it saw, a timeout, an abort) says so
            # before it closes: wait for its reader to deliver that, and report it instead
            deadline = time.monotonic() + 1.0
            while time.monotonic() < deadline and (ctx & ~3) not in self._aborted and peer not in self._dead:
                time.sleep(0.005)
            told = self._aborted.get(ctx & ~3)
            if told is not None:
                raise told from None
            raise RemoteError(
                f"cannot send to {self.where(peer)}: {exc} (did it exit?)",
                rank=self.rank,
                remote_rank=peer,
                remote_type="ConnectionError",
            ) from None

    def _deadline(self):
        """The calling thread's deadline for a wait that begins now (monotonic; None: no limit)."""
        limit = getattr(self._tl, "timeout", self.timeout)
        return time.monotonic() + limit if limit else None

    def _write(self, out, pieces, deadline) -> None:
        """Put ``pieces`` (one message) on the stream to the peer, after what is owed to it (its
        send lock held).  ``deadline``: monotonic, None (none) or _LAZY (the calling thread's limit,
        from the moment it has to wait).  Raises _Stalled when it passes with the peer taking no
        data; a message begun is then owed whole (copied: the caller's memory is free)."""
        if out.pending:
            if deadline is _LAZY:
                deadline = self._deadline()
            if not self._flush(out, deadline):
                raise _Stalled(False)
        if out.tls is not None:
            return self._write_tls(out, pieces, deadline)
        sock = out.sock
        for piece in pieces:
            try:
                sent = sock.send(piece)
            except BlockingIOError:  # full for a whole slice
                sent = 0
            if sent < len(piece):
                deadline = self._wait_out(out, pieces, piece, sent, deadline)

    def _wait_out(self, out, pieces, piece, sent: int, deadline):
        """The peer did not take all of ``piece`` (one of ``pieces``) at once: go on until it
        does (the deadline, now resolved, is returned for the next pieces) or raise _Stalled."""
        if deadline is _LAZY:
            deadline = self._deadline()
        sent = _push(out.sock, piece, sent, deadline)
        if sent < len(piece):
            i = next(j for j, p in enumerate(pieces) if p is piece)
            if i == 0 and sent == 0:
                raise _Stalled(False)
            self._owe(out, [memoryview(piece)[sent:], *pieces[i + 1 :]])
            raise _Stalled(True)
        return deadline

    def _write_tls(self, out, pieces, deadline) -> None:
        """_write over TLS: each slice is encrypted, then sent; once encrypted it is owed."""
        sock, tls = out.sock, out.tls
        for i, piece in enumerate(pieces):
            view = memoryview(piece)
            for off in range(0, len(view), _TLS_SLICE):
                raw = tls.encrypt(view[off : off + _TLS_SLICE])
                try:
                    sent = sock.send(raw)
                except BlockingIOError:
                    sent = 0
                if sent < len(raw):
                    if deadline is _LAZY:
                        deadline = self._deadline()
                    sent = _push(sock, raw, sent, deadline)
                    if sent < len(raw):
                        out.pending.append((False, memoryview(raw)[sent:]))
                        self._owe(out, [view[off + _TLS_SLICE :], *pieces[i + 1 :]])
                        raise _Stalled(True)

    def _owe(self, out, views, kick: bool = True) -> None:
        """Copy ``views`` (the unsent rest of a message) to what is owed to the peer: it goes out
        before anything else, by whoever sends next or by the peer's sender thread (send lock held)."""
        plain = out.tls is not None  # TLS: owed as plaintext until encrypted
        for v in views:
            if len(v):
                out.pending.append((plain, memoryview(bytes(v))))
        if kick:
            self._kick(out)

    def _flush(self, out, deadline, flags: int = 0) -> bool:
        """Send what is owed to the peer (send lock held): True when all of it is out."""
        pending, sock = out.pending, out.sock
        while pending:
            plain, view = pending[0]
            if plain:  # TLS: encrypt the next slice; from now on it is owed as it goes on the wire
                if len(view) > _TLS_SLICE:
                    pending[0] = (True, view[_TLS_SLICE:])
                else:
                    pending.popleft()
                pending.appendleft((False, memoryview(out.tls.encrypt(view[:_TLS_SLICE]))))
                continue
            sent = _push(sock, view, 0, deadline, flags)
            if sent < len(view):
                pending[0] = (False, view[sent:])
                return False
            pending.popleft()
        return True

    def _send_timeout(self, peer: int, started: bool) -> Timeout:
        limit = getattr(self._tl, "timeout", self.timeout)
        why = self._stopped(peer) or "takes no data (its process may be stopped or hung)"
        rest = "; the rest of the message goes to it when it reads again" if started else ""
        return Timeout(
            f"rank {self.rank} timed out after {limit:g} s sending to {self.where(peer)}: it {why}{rest}",
            rank=self.rank,
            missing_ranks=[peer],
        )

    # ------------------------------------------------------ the sender threads
    def _kick(self, out, job=None) -> None:
        """Wake the peer's sender thread (start it the first time), with ``job`` for it: [pieces
        of a message, None] or [None, message id] (a kept copy to send again).  Never blocks on
        the peer: the reader thread hands its sends over this way."""
        with out.cv:
            if job is not None:
                out.jobs.append(job)
            if out.thread is None:
                out.thread = _threads.thread(self._sender, args=(out,), name=f"uniccl-tcp-s{self.rank}-to{out.peer}")
                out.thread.start()
            else:
                out.cv.notify_all()

    def _sender(self, out) -> None:
        """The peer's sender thread: the jobs handed to it and what a timed-out send left owed,
        each as a whole message between the others (under the send lock)."""
        peer, lock = out.peer, self.send_locks[out.peer]
        while True:
            with out.cv:
                while not out.jobs and not out.pending:
                    if self.closed:
                        return
                    out.cv.notify_all()  # idle: close() may wait for this
                    out.cv.wait()
                job = out.jobs[0] if out.jobs else None
            if out.sock is None:  # a notice to a peer not connected yet: connect first
                try:
                    self._ensure(peer, self._deadline())
                except UnicclError:  # lost, or silent for the whole limit: nothing goes to it
                    with lock, out.cv:
                        out.pending.clear()
                        out.jobs.clear()
                    continue
            broke = -1
            with lock:
                try:
                    broke = out.gen
                    if job is None:
                        self._flush(out, None)
                        continue
                    if job[0] is None:
                        job[0] = self._copy_of(peer, job[1])
                    self._write(out, job[0], None)
                    broke = -1
                    with out.cv:
                        out.jobs.popleft()
                except OSError:  # the connection broke: below, outside the lock (a redial takes it)
                    pass
                except Exception:  # a bug: say so, and keep serving (a lost job would hang its peer)
                    from ...observability.log import logger

                    logger.exception("rank %d: the sender thread to rank %d dropped a message", self.rank, peer)
                    broke = -1
                    if job is None:
                        out.pending.clear()
                    with out.cv:
                        if out.jobs and out.jobs[0] is job:
                            out.jobs.popleft()
            if broke < 0:
                continue
            if self.can_heal(peer) and self.await_link(peer, broke, None):
                if job is not None and job[1] is not None:  # a copy: the resumed stream sends it anyway
                    with out.cv:
                        if out.jobs and out.jobs[0] is job:
                            out.jobs.popleft()
                continue  # what is owed was replaced by the resumed stream; the job goes on the new one
            with lock:  # the peer is lost: its reader reports it
                out.pending.clear()
                with out.cv:
                    out.jobs.clear()

    def _notice(self, peer: int, data: bytes) -> None:
        """Put ``data`` (a whole message) on the stream to ``peer`` without waiting for the peer:
        now if its socket takes it, else after what is owed, by its sender thread."""
        out, lock = self._outs[peer], self.send_locks[peer]
        if out.sock is None or not lock.acquire(False):  # not connected yet, or a send to it is in progress
            self._kick(out, [(data,), None])
            return
        job = None
        try:
            self._owe(out, [data], kick=False)
            done = self._flush(out, None, socket.MSG_DONTWAIT)
        except OSError:  # broken: its sender thread sends it once the connection is back
            done = not self.can_heal(peer)  # (else gone: its reader sees the connection drop)
            job = None if done else [(data,), None]
        finally:
            lock.release()
        if not done:
            self._kick(out, job)

    def _try_send(self, peer: int, data: bytes, wait: float) -> bool:
        """Send ``data`` (a whole message) if the peer takes it within ``wait`` seconds."""
        if self.socks[peer] is None:
            try:
                self._ensure(peer, time.monotonic() + wait)
            except UnicclError:
                return False
        lock = self.send_locks[peer]
        if not lock.acquire(timeout=wait):
            return False
        try:
            self._write(self._outs[peer], (data,), time.monotonic() + wait)
            return True
        except _Stalled:
            return False
        except OSError:
            return True  # gone: its reader reports it
        finally:
            lock.release()
