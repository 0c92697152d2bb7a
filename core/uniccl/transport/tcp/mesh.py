"""TCP as a transport: ranks connect without MPI, on one host or across hosts.

The *mesh* is one authenticated socket per pair of ranks of a job, set up once
from a rendezvous (:mod:`uniccl.bootstrap.rendezvous`): every rank listens, publishes its
address, connects to the lower ranks and accepts the higher ones.  A reader
thread per peer always drains its socket (it never sends: what it must send --
requests for a copy, the copies, answers to probes -- goes to that peer's sender
thread), so a sender always makes progress while the peer runs, and ``isend`` can
simply send in the caller's thread.  A send waits for a peer that takes no data
(stopped, hung) at most the call's timeout, then raises Timeout naming it; what a
timed-out send left unsent is kept and goes out first when the peer takes data
again, so the stream to it is never left with half a message.

``UNICCL_TCP_TLS=1``: every connection is TLS 1.3 (Python's ``ssl`` over memory BIOs)
between ephemeral self-signed certificates, each rank's published through the
rendezvous and pinned by its SHA-256 on the other side, and bound to the job secret
by an HMAC over both fingerprints (see :class:`_TLSIdentity`).

Messages carry (context, tag, length); a receive matches the oldest message of
its (peer, context, tag), as MPI matches (source, tag, communicator).  Every
communicator (the world, each ``split``) is a :class:`TCPTransport` with its own
contexts over the same mesh.  A peer whose connection drops fails every pending
and later receive from it at once, naming the rank and host: a dead rank never
leaves the others hanging.

Integrity (on by default; ``UNICCL_TCP_CHECKSUM=0`` turns it off): every message
carries the CRC-32C of its payload, verified on receipt.  The sender keeps a copy of
what it sent (``UNICCL_TCP_RETAIN_BYTES`` per peer, default 64 MiB, oldest dropped
first); a receiver that finds a mismatch asks for that message again and holds what the
peer sent after it until the copy arrives, so order is kept.  Counters:
``Mesh.stats``; after 3 failed copies of one message the communicator fails with a
typed error.  At exit a rank waits (at most 3 s) until its peers have checked all it sent,
so that a copy asked for late is still sent.  Fault injection for tests: :mod:`uniccl.reliability.faults`.
"""

from __future__ import annotations

import atexit
import collections
import ctypes
import hashlib
import hmac
import json
import os
import pickle
import secrets
import socket
import struct
import threading
import time
import weakref
from collections.abc import Callable
from typing import cast

import numpy as np

from .. import _env
from .._errors import InternalError, InvalidArgument, InvalidUsage, PlatformUnavailable, RemoteError, Timeout
from ..bootstrap.rendezvous import bind_address, rendezvous
from ..reliability.timeout import default_timeout
from .net import host_key, route_address

_HDR = struct.Struct("<QIQIIQ")  # context, tag, payload bytes, CRC-32C, flags, message id (per sender and peer)
_CHECKED, _RETRANSMIT, _GONE = 1, 2, 4  # flags: the CRC is valid; a message sent again; asked for but no longer held
_NACK = struct.Struct("<Q")  # the payload of a request to send message id again
_MAX_RETRIES = 3  # a message corrupted this many times in a row fails the communicator
_HELLO = struct.Struct("<I32s")  # connecting rank, HMAC(secret, acceptor nonce + rank)
_INLINE = 64 * 1024  # payloads up to this size go out in one send with their header
_TIMED_BYTES = 32 * 1024  # telemetry times messages from this size on (their clock reads cost < 1 %)
DATA, P2P, CTRL = 0, 1, 2  # channels of one communicator, like MPITransport's three dup'ed comms
_CTRL_TAG_BASE = 1 << 30
_ABORT_TAG = 0xFFFFFFFF  # "this communicator was aborted by its sender": fail its receives from that peer
_NACK_TAG = 0xFFFFFFFE  # "message <id> reached me corrupted: send it again"
_FLUSH_TAG = 0xFFFFFFFD  # "nothing more of the call that failed its agreement follows from me"
_PROBE_TAG = 0xFFFFFFFC  # "have you begun call <seq> of this communicator?" (asked after a timeout)
_PROBED_TAG = 0xFFFFFFFB  # the answer: the last call begun there
_SYNC_TAG = 0xFFFFFFFA  # "answer once all I sent you before this is checked" (asked at exit: see Mesh.linger)
_SYNCED_TAG = 0xFFFFFFF9  # the answer
_ASKED = frozenset((_PROBE_TAG, _PROBED_TAG, _SYNC_TAG, _SYNCED_TAG))  # the reader answers or delivers them
_Q = struct.Struct("<q")
_MASK = struct.Struct("<Q")  # a stamp's ranks (bit r: rank r's record matched)
_STAMPED = 8  # flag: the stamp area holds a stamp (the call's record, the ranks matched so far)
_STAMP = 72  # bytes: the 64-byte record and a 64-bit mask of ranks
_NO_STAMP = bytes(_STAMP)
_HEAD = _HDR.size + _STAMP  # every message starts so: one read gets the header and the stamp
_REC_BASE, _SLOW_BASE = 1 << 28, 1 << 29  # control-context tags of a call's records: base + data tag
_T = struct.Struct("<I")  # a flush marker's payload: the data tag of the call it ends
_SLICE_US = 100_000  # a blocked send returns from the kernel after this long (SO_SNDTIMEO) to look at its deadline
_LAZY = object()  # a send's deadline, computed only if the send has to wait
_TLS_SLICE = 256 * 1024  # plaintext bytes encrypted at a time (then sent) over TLS
_SILENT = "does not answer (alive? its process may be stopped or hung)"


def _head(ctx: int, tag: int, n: int, crc: int, flags: int, msg_id: int, stamp=None) -> bytes:
    return _HDR.pack(ctx, tag, n, crc, flags, msg_id) + (stamp or _NO_STAMP)


def _view(ptr: int, nbytes: int) -> memoryview:
    return memoryview((ctypes.c_char * nbytes).from_address(ptr)).cast("B")


def _recv_into(sock, view: memoryview) -> None:
    while view.nbytes:
        got = sock.recv_into(view)
        if not got:
            raise ConnectionError("connection closed")
        view = view[got:]


class _Stalled(Exception):
    """A send's deadline passed while the peer took no data; ``started``: part of the message
    went out (the rest is owed: it goes out first, whoever sends next)."""

    def __init__(self, started: bool):
        super().__init__()
        self.started = started


def _push(sock, view, sent: int, deadline, flags: int = 0) -> int:
    """Send ``view`` from byte ``sent`` on until all of it is out, or ``deadline`` (monotonic;
    None: none) has passed, or (``flags`` MSG_DONTWAIT) the socket is full: the bytes sent.
    The socket's SO_SNDTIMEO returns a blocked send every _SLICE_US to look at the clock."""
    view = memoryview(view)
    n = len(view)
    while sent < n:
        try:
            sent += sock.send(view[sent:], flags)
            if sent >= n:
                break
        except BlockingIOError:  # nothing could be sent within the slice
            if flags:
                break
        if deadline is not None and time.monotonic() >= deadline:
            break
    return sent


def _proc_state(pid: int, start) -> str:
    """The state letter of process ``pid`` in /proc ('T': stopped), "" when it is not there or
    is another process than the one started at ``start`` (clock ticks since boot)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return ""
    if start is not None and (len(fields) < 20 or int(fields[19]) != start):
        return ""
    return fields[0].decode()


def _start_time() -> int | None:
    """This process's start time in /proc (clock ticks since boot): with the pid, names it."""
    try:
        with open("/proc/self/stat", "rb") as f:
            return int(f.read().rsplit(b")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


class _Recv:
    """A posted receive: into memory at ``ptr`` (``nbytes`` max) or, ptr None, into bytes."""

    __slots__ = ("ptr", "nbytes", "done", "error", "truncated", "data", "peer", "stamp")

    def __init__(self, ptr, nbytes, peer=-1):
        self.ptr, self.nbytes, self.peer = ptr, nbytes, peer
        self.done = threading.Event()
        self.error = None
        self.truncated = False
        self.data = None
        self.stamp = None


class _Payload(bytearray):
    """A message that arrived before its receive was posted, with the stamp it came with."""

    __slots__ = ("stamp",)
    stamp: bytes | None


class _Flushed(Exception):
    """A receive ended because the ranks' records of its call differ (see TCPTransport)."""


_SENT = None  # sends complete in the caller's thread: their request is nothing to wait for


class Mesh:
    """Sockets to every other rank of the job and the matching of incoming messages."""

    def __init__(self, uid, rank: int, size: int, timeout: float):
        self.rank, self.size = rank, size
        self.timeout = default_timeout()  # waits outside calls (set-up); calls set their own
        self.closed = False
        tls = _TLSIdentity() if _env.flag("UNICCL_TCP_TLS") else None  # before anything is opened
        addr = route_address(uid.host)
        listener = socket.create_server((bind_address(addr), 0), backlog=max(8, size))  # only where peers reach us
        self._host = host_key()
        payload = {
            "addr": addr,
            "port": listener.getsockname()[1],
            "host": self._host,
            "hostname": socket.gethostname(),
            "pid": os.getpid(),
            "start": _start_time(),
        }
        if tls is not None:
            payload["tls"] = tls.public()
        self.table = rendezvous(uid, rank, size, payload, timeout)
        self.socks: list = [None] * size
        self._outs: list = [None] * size  # per peer: _Out, the sending side of its connection
        self.send_locks = [threading.Lock() for _ in range(size)]
        try:
            self._connect(uid.secret, listener, timeout, tls)
        finally:
            listener.close()
            if tls is not None:
                tls.discard()
        self._lock = threading.Lock()
        self._posted: dict = {}  # (peer, ctx, tag) -> deque of _Recv
        self._unexpected: dict = {}  # (peer, ctx, tag) -> deque of bytearray
        self._dead: dict = {}  # peer -> reason
        self._aborted: dict = {}  # context base -> error: that communicator was aborted (here or by a peer)
        self._notified: set = set()  # context bases whose members this rank has told why it gave up
        self._tl = threading.local()  # per-thread wait limit (the call running on that thread)
        self._expect: dict = {}  # data context -> (data tag, record) of the call running there
        self._early: dict = {}  # (data context, tag) -> the record stamped on what came before that call
        self._alarm: dict = {}  # data context -> tag of its call whose records were found to differ
        self._begun: dict = {}  # data context -> number of the last call begun there (for probes)
        self.live = 0  # transports over this mesh not yet aborted
        self.checksums, self._crc, self._crc_at = _checksums()
        self._kept = _Kept(_env.size("UNICCL_TCP_RETAIN_BYTES"), size)
        self._next_id = [0] * size
        self._rx = [_RxState() for _ in range(size)]
        self.stats = {"checksum_failures": 0, "retransmit_requests": 0, "retransmits": 0}
        from ..observability.telemetry import enabled

        # per peer: bytes and ns sent, bytes and ns received, retransmissions sent, checksum failures,
        # bytes sent and received in timed messages (>= _TIMED_BYTES: two clock reads per message
        # would cost more than a small message's whole trip through Python; its bytes are counted)
        self.links = [[0] * 8 for _ in range(size)] if enabled() else None
        self.tracer = None  # uniccl.observability.trace.Tracer under UNICCL_TRACE: a span per message
        self.waiting: tuple[int, float] | None = None  # (peer, since) of a wait in progress
        from ..reliability.faults import from_env

        self.faults = from_env(rank)
        self.worlds = 0  # world communicators made by init(): the n-th has the same context everywhere
        self._pid = os.getpid()
        _at_exit(self)
        for peer, sock in enumerate(self.socks):
            if sock is not None:
                stream = self._outs[peer].tls or sock  # TLS: the reader decrypts as it reads
                threading.Thread(
                    target=self._reader, args=(peer, stream), daemon=True, name=f"uniccl-tcp-r{rank}-from{peer}"
                ).start()

    def where(self, peer: int) -> str:
        t = self.table[peer]
        return f"rank {peer} ({t['hostname']} {t['addr']}, pid {t['pid']})"

    def _connect(self, secret: bytes, listener, timeout: float, tls=None) -> None:
        deadline = time.monotonic() + timeout
        for peer in range(self.rank):  # connect to the lower ranks ...
            t = self.table[peer]
            try:
                sock = socket.create_connection((t["addr"], t["port"]), timeout=max(1, deadline - time.monotonic()))
                nonce: bytes | bytearray = bytearray(16)
                _recv_into(sock, memoryview(nonce))
                proof = hmac.new(secret, bytes(nonce) + struct.pack("<I", self.rank), hashlib.sha256).digest()
                sock.sendall(_HELLO.pack(self.rank, proof))
                stream = None if tls is None else tls.handshake(self, sock, peer, False, secret)
            except OSError as exc:
                raise InternalError(f"cannot connect to {self.where(peer)}: {exc}", op="init", rank=self.rank) from None
            self._adopt(peer, sock, stream)
        while any(s is None for r, s in enumerate(self.socks) if r > self.rank):  # ... accept the higher
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                missing = [r for r, s in enumerate(self.socks) if s is None and r > self.rank]
                raise Timeout(f"ranks {missing} did not connect within {timeout:.0f} s", op="init", rank=self.rank)
            listener.settimeout(remaining)
            try:
                sock, _ = listener.accept()
                sock.settimeout(10)
                nonce = secrets.token_bytes(16)
                sock.sendall(nonce)
                hello = bytearray(_HELLO.size)
                _recv_into(sock, memoryview(hello))
                peer, proof = _HELLO.unpack(hello)
                expect = hmac.new(secret, nonce + struct.pack("<I", peer), hashlib.sha256).digest()
            except OSError:
                continue
            if not hmac.compare_digest(proof, expect) or not self.rank < peer < self.size or self.socks[peer]:
                sock.close()  # not one of ours: ignore it, keep waiting for the real peer
                continue
            stream = None
            if tls is not None:  # a rank of the job (it proved the secret): it must hold the certificate it published
                try:
                    stream = tls.handshake(self, sock, peer, True, secret)
                except OSError as exc:
                    sock.close()
                    raise InternalError(
                        f"cannot connect to {self.where(peer)}: {exc}", op="init", rank=self.rank
                    ) from None
            self._adopt(peer, sock, stream)

    def _adopt(self, peer: int, sock, tls=None) -> None:
        sock.settimeout(None)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        # a send blocked on a full socket returns every _SLICE_US: sends can keep a deadline
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, struct.pack("ll", 0, _SLICE_US))
        self.socks[peer] = sock
        self._outs[peer] = _Out(peer, sock, tls)

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
        lock = self.send_locks[peer]
        deadline = _LAZY
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

    def _stopped(self, peer: int) -> str:
        """'is stopped (...)' when ``peer`` runs on this host and its process is stopped (SIGSTOP,
        a debugger), else ''."""
        t = self.table[peer]
        if t.get("host") != self._host:
            return ""
        state = _proc_state(t["pid"], t.get("start"))
        if state in ("T", "t"):
            return f"is stopped (state {state} in /proc/{t['pid']}/stat: a SIGSTOP or a debugger)"
        return ""

    # ------------------------------------------------------ the sender threads
    def _kick(self, out, job=None) -> None:
        """Wake the peer's sender thread (start it the first time), with ``job`` for it: [pieces
        of a message, None] or [None, message id] (a kept copy to send again).  Never blocks on
        the peer: the reader thread hands its sends over this way."""
        with out.cv:
            if job is not None:
                out.jobs.append(job)
            if out.thread is None:
                out.thread = threading.Thread(
                    target=self._sender, args=(out,), daemon=True, name=f"uniccl-tcp-s{self.rank}-to{out.peer}"
                )
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
            with lock:
                try:
                    if job is None:
                        self._flush(out, None)
                        continue
                    if job[0] is None:
                        job[0] = self._copy_of(peer, job[1])
                    self._write(out, job[0], None)
                    with out.cv:
                        out.jobs.popleft()
                except OSError:  # the connection is gone: its reader reports it
                    out.pending.clear()
                    with out.cv:
                        out.jobs.clear()
                except Exception:  # a bug: say so, and keep serving (a lost job would hang its peer)
                    from ..observability.log import logger

                    logger.exception("rank %d: the sender thread to rank %d dropped a message", self.rank, peer)
                    if job is None:
                        out.pending.clear()
                    with out.cv:
                        if out.jobs and out.jobs[0] is job:
                            out.jobs.popleft()

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

    def _resend(self, peer: int, msg_id: int) -> None:
        """``peer`` got message ``msg_id`` corrupted: its sender thread sends the kept copy (the
        reader thread that read the request goes on reading)."""
        self._kick(self._outs[peer], [None, msg_id])

    def _notice(self, peer: int, data: bytes) -> None:
        """Put ``data`` (a whole message) on the stream to ``peer`` without waiting for the peer:
        now if its socket takes it, else after what is owed, by its sender thread."""
        out, lock = self._outs[peer], self.send_locks[peer]
        if not lock.acquire(False):  # a send to it is in progress: the message goes after it
            self._kick(out, [(data,), None])
            return
        try:
            self._owe(out, [data], kick=False)
            done = self._flush(out, None, socket.MSG_DONTWAIT)
        except OSError:
            done = True  # gone: its reader sees the connection drop
        finally:
            lock.release()
        if not done:
            self._kick(out)

    def _try_send(self, peer: int, data: bytes, wait: float) -> bool:
        """Send ``data`` (a whole message) if the peer takes it within ``wait`` seconds."""
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

    # ---------------------------------------------------------------- receiving
    def post(self, peer: int, ctx: int, tag: int, ptr, nbytes: int) -> _Recv:
        req = _Recv(ptr, nbytes, peer)
        key = (peer, ctx, tag)
        with self._lock:
            aborted = self._aborted.get(ctx & ~3)
            if aborted is not None:
                req.error = aborted
                req.done.set()
                return req
            if self._alarm and self._alarmed(ctx, tag):
                req.error = _Flushed()
                req.done.set()
                return req
            queue = self._unexpected.get(key)
            if queue:
                payload = queue.popleft()
                if not queue:
                    del self._unexpected[key]
            else:
                if peer in self._dead:
                    req.error = self._dead[peer]
                    req.done.set()
                    return req
                self._posted.setdefault(key, collections.deque()).append(req)
                return req
        self._fill(req, payload)
        return req

    @staticmethod
    def _fill(req: _Recv, payload) -> None:
        if type(payload) is _Payload:
            req.stamp = payload.stamp
        if req.ptr is None:
            req.data = bytes(payload)
        else:
            n = min(len(payload), req.nbytes)
            if n:
                ctypes.memmove(req.ptr, (ctypes.c_char * n).from_buffer(payload), n)
            req.truncated = len(payload) > req.nbytes
        req.done.set()

    # ---------------------------------------------- the agreement of announced calls
    # A call announced on a data context (TCPTransport.announce) stamps its data with the
    # caller's record; the readers compare each stamp or record with the one expected there
    # and, at the first difference, end that call's receives here (_alarm) so the waiting
    # thread judges it.  All under self._lock.
    def _observe(self, dctx: int, tag: int, record: bytes) -> None:
        exp = self._expect.get(dctx)
        if exp is not None and exp[0] == tag:
            if record != exp[1]:
                self._alarm_call(dctx, tag)
            return
        prev = self._early.get((dctx, tag))  # before this rank made that call: kept for it
        if prev is None:
            self._early[(dctx, tag)] = record
        elif prev != record:
            self._early[(dctx, tag)] = b""  # two peers differ: whatever this rank calls, it mismatches

    def _alarmed(self, ctx: int, tag: int) -> bool:
        """Is (ctx, tag) a receive of a call whose records were found to differ?"""
        if ctx & 3 == DATA:
            return self._alarm.get(ctx) == tag
        return ctx & 3 == CTRL and _REC_BASE <= tag < _SLOW_BASE and self._alarm.get(ctx & ~3) == tag - _REC_BASE

    def _alarm_call(self, dctx: int, tag: int) -> None:
        self._alarm[dctx] = tag
        for key in [
            k for k in self._posted if k[1] == dctx and k[2] == tag or k[1] == dctx + CTRL and k[2] == _REC_BASE + tag
        ]:
            for req in self._posted.pop(key):
                req.error = _Flushed()
                req.done.set()

    def _agreement_message(self, peer: int, ctx: int, tag: int, payload) -> None:
        """A record, a report of a failed agreement, or a flush marker arrived (reader thread)."""
        with self._lock:
            if tag == _FLUSH_TAG:  # all that ``peer`` sent for that call came before: drop it
                t = _T.unpack(bytes(payload[:4]))[0]
                for key in [
                    k
                    for k in self._unexpected
                    if k[0] == peer and (k[1] == ctx and k[2] == t or k[1] == ctx + CTRL and k[2] == _REC_BASE + t)
                ]:
                    del self._unexpected[key]
                for key in [k for k in self._posted if k[0] == peer and k[1] == ctx and k[2] == t]:
                    for req in self._posted.pop(key):
                        req.error = _Flushed()
                        req.done.set()
            elif tag >= _SLOW_BASE:  # a peer judges that call: so must this rank
                self._alarm_call(ctx & ~3, tag - _SLOW_BASE)
            else:
                self._observe(ctx & ~3, tag - _REC_BASE, bytes(payload))

    def begin(self, dctx: int, seq: int, tag: int, record: bytes) -> bool:
        """This rank starts call ``seq`` (data tag ``tag``) on ``dctx``; True if it is already
        known to mismatch."""
        with self._lock:
            self._begun[dctx] = seq
            self._expect[dctx] = (tag, record)
            early = self._early.pop((dctx, tag), None)
            return self._alarm.get(dctx) == tag or (early is not None and early != record)

    def end(self, dctx: int, tag: int) -> None:
        with self._lock:
            self._expect.pop(dctx, None)
            self._early.pop((dctx, tag), None)
            if self._alarm.get(dctx) == tag:
                del self._alarm[dctx]

    def _answer_sync(self, peer: int) -> None:
        """(reader thread) Tell ``peer`` that all it sent before its question is checked."""
        self._kick(self._outs[peer], [(_head(0, _SYNCED_TAG, 0, 0, 0, 0),), None])

    def linger(self, timeout: float) -> None:
        """Before this process exits: wait, at most ``timeout`` s, until every live peer has
        checked all that this rank sent it, so that a peer still asking for a copy of a damaged
        last message gets it (this rank's reader and sender threads serve it meanwhile).  A
        healthy peer answers from its reader thread at once, wherever its caller is."""
        if self.closed or not self.checksums or os.getpid() != self._pid:
            return  # aborted; no copies to ask for; a forked child (the connections are its parent's)
        peers = [p for p, out in enumerate(self._outs) if out is not None and p not in self._dead]
        reqs = [self.post(p, 0, _SYNCED_TAG, None, 0) for p in peers]
        ask = _head(0, _SYNC_TAG, 0, 0, 0, 0)
        for p in peers:
            self._notice(p, ask)
        deadline = time.monotonic() + timeout
        for req in reqs:
            req.done.wait(max(0.0, deadline - time.monotonic()))

    def _answer_probe(self, peer: int, dctx: int) -> None:
        """(reader thread) The answer goes through the peer's sender thread: never a blocking send here."""
        with self._lock:
            begun = self._begun.get(dctx, -1)
        self._kick(self._outs[peer], [(_head(dctx, _PROBED_TAG, _Q.size, 0, 0, 0) + _Q.pack(begun),), None])

    def probe(self, dctx: int, seq: int, peers: list, wait: float) -> dict:
        """After a timeout, who of ``peers`` (job ranks) is in the way of call ``seq`` on ``dctx``,
        and why: {peer: what it does} for those that answered that they have not begun the call
        (their readers answer, wherever their callers are), whose connection is lost, whose
        process is stopped (on this host: /proc), that take no data, and (_SILENT) those that did
        not answer within ``wait`` seconds."""
        found, reqs = {}, []
        ask = _head(dctx, _PROBE_TAG, 0, 0, 0, 0)
        for p in peers:
            if p in self._dead:
                found[p] = "is gone (its connection was lost)"
                continue
            stopped = self._stopped(p)
            if stopped:
                found[p] = stopped
                continue
            req = self.post(p, dctx, _PROBED_TAG, None, 0)
            if not self._try_send(p, ask, min(wait, 0.25)):  # its socket is full: it reads nothing
                found[p] = self._stopped(p) or "takes no data (its process may be stopped or hung)"
                continue
            reqs.append((p, req))
        deadline = time.monotonic() + wait
        for p, req in reqs:
            if req.done.wait(max(0.0, deadline - time.monotonic())):
                if req.error is None:
                    if _Q.unpack(req.data)[0] < seq:
                        found[p] = "has not made the call"
                elif p in self._dead:
                    found[p] = "is gone (its connection was lost)"
            else:
                found[p] = self._stopped(p) or _SILENT
        return found

    def cancel(self, dctx: int, tag: int) -> None:
        """Withdraw this rank's receives of call ``tag``; return once no reader still writes
        into the memory of one (nothing lands in the caller's buffers after this)."""
        with self._lock:
            for key in [
                k
                for k in self._posted
                if k[1] == dctx and k[2] == tag or k[1] == dctx + CTRL and k[2] == _REC_BASE + tag
            ]:
                del self._posted[key]
            busy = [rx.current for rx in self._rx if rx.current is not None and rx.current.ptr is not None]
        deadline = time.monotonic() + 5.0
        for req in busy:  # a message being read straight into its buffer: wait for its last byte
            while not req.done.wait(0.01) and time.monotonic() < deadline and any(rx.current is req for rx in self._rx):
                pass

    def _take_posted(self, key):
        queue = self._posted.get(key)
        if not queue:
            return None
        req = queue.popleft()
        if not queue:
            del self._posted[key]
        return req

    def _arrived(self, peer, ctx, tag, payload) -> None:
        key = (peer, ctx, tag)
        with self._lock:
            req = self._take_posted(key)
            if req is None:
                self._unexpected.setdefault(key, collections.deque()).append(payload)
                return
        self._fill(req, payload)

    def _reader(self, peer: int, sock) -> None:
        hdr = bytearray(_HEAD)
        hview = memoryview(hdr)
        rx = self._rx[peer]
        try:
            while True:
                _recv_into(sock, hview)
                ctx, tag, n, crc, flags, msg_id = _HDR.unpack_from(hdr)
                stamp = bytes(hview[_HDR.size :]) if flags & _STAMPED else None
                if tag == _ABORT_TAG:
                    raw = bytearray(n)
                    _recv_into(sock, memoryview(raw))
                    self._abort_local(peer, ctx, self._notice_error(peer, raw))
                    continue
                if tag in _ASKED:
                    raw = bytearray(n)
                    _recv_into(sock, memoryview(raw))
                    if tag == _PROBED_TAG or tag == _SYNCED_TAG:
                        self._arrived(peer, ctx, tag, raw)
                    elif tag == _PROBE_TAG:  # answered by this thread: the caller's thread may be anywhere
                        self._answer_probe(peer, ctx)
                    elif rx.awaiting is None:  # _SYNC_TAG: all before it is checked
                        self._answer_sync(peer)
                    else:  # a copy is still awaited: answered once it is in
                        rx.sync = True
                    continue
                if tag == _NACK_TAG:
                    raw = bytearray(n)
                    _recv_into(sock, memoryview(raw))
                    self._resend(peer, _NACK.unpack(raw)[0])
                    continue
                if flags & _GONE:
                    self._unrecoverable(peer, rx, msg_id, "is no longer held by the sender")
                    continue
                if rx.awaiting is not None and not (flags & _RETRANSMIT and msg_id == rx.awaiting):
                    payload = bytearray(n)  # after a corrupted message: held until its copy arrives
                    _recv_into(sock, memoryview(payload))
                    rx.held.append((ctx, tag, n, crc, flags, msg_id, stamp, payload))
                    continue
                timed = self.tracer is not None or (self.links is not None and n >= _TIMED_BYTES)
                if timed:
                    clock = time.perf_counter_ns if self.tracer is None else time.time_ns
                    t0 = clock()
                ok = self._receive(peer, rx, ctx, tag, n, crc, flags, msg_id, stamp, sock=sock)
                if timed:
                    self._received(peer, ctx, tag, n, t0, clock())
                elif self.links is not None:
                    self.links[peer][2] += n
                if ok and flags & _RETRANSMIT:
                    rx.awaiting = None
                    while rx.held and rx.awaiting is None:  # replay, in order, what came meanwhile
                        ctx, tag, n, crc, flags, msg_id, stamp, payload = rx.held.popleft()
                        self._receive(peer, rx, ctx, tag, n, crc, flags, msg_id, stamp, payload=payload)
                    if rx.sync and rx.awaiting is None:
                        rx.sync = False
                        self._answer_sync(peer)
        except (OSError, ConnectionError) as exc:
            self._peer_lost(peer, exc, rx.current)

    def _received(self, peer: int, ctx: int, tag: int, n: int, t0: int, t1: int) -> None:
        """Telemetry and trace of one message read from ``peer`` (reader thread)."""
        if self.links is not None:
            link = self.links[peer]
            link[2] += n
            if n >= _TIMED_BYTES:
                link[3] += t1 - t0
                link[7] += n
        if self.tracer is not None and ctx & 3 != CTRL:
            self.tracer.span("message", f"recv from rank {peer}", t0, t1, {"bytes": n, "tag": tag})

    def link_stats(self, peer: int) -> dict:
        """What crossed the connection to (job rank) ``peer``: bytes sent and received, seconds
        spent sending (in sendall) and receiving (a message's header to its last byte) the
        messages of _TIMED_BYTES or more and the bandwidths those show, retransmissions sent to
        it and checksum failures of what came from it."""
        if self.links is None:
            return {}
        tx_b, tx_ns, rx_b, rx_ns, resent, bad, tx_timed, rx_timed = self.links[peer]
        return {
            "peer_host": self.table[peer]["hostname"],
            "sent_bytes": tx_b,
            "sent_seconds": tx_ns * 1e-9,
            "sent_timed_bytes": tx_timed,
            "send_GBps": tx_timed / tx_ns if tx_ns else 0.0,
            "recv_bytes": rx_b,
            "recv_seconds": rx_ns * 1e-9,
            "recv_timed_bytes": rx_timed,
            "recv_GBps": rx_timed / rx_ns if rx_ns else 0.0,
            "retransmits": resent,
            "checksum_failures": bad,
        }

    def _receive(
        self,
        peer: int,
        rx,
        ctx: int,
        tag: int,
        n: int,
        crc: int,
        flags: int,
        msg_id: int,
        stamp,
        sock=None,
        payload=None,
    ) -> bool:
        """Read one message (from ``sock``, or take ``payload`` already read), verify it, deliver
        it; False when it is corrupted (it was asked for again)."""
        key = (peer, ctx, tag)
        with self._lock:
            if stamp is not None:
                self._observe(ctx, tag, stamp[:64])
            req = rx.current = self._take_posted(key)
        fault = self.faults.on_message(peer) if self.faults is not None and flags & _CHECKED else ""
        if fault == "delay":
            assert self.faults is not None  # a fault: injection is on (no check on the path without)
            self.faults.injected["delay"] += 1
            time.sleep(self.faults.delay_s)
        if req is None or req.ptr is None:
            if payload is None:
                payload = bytearray(n) if stamp is None else _Payload(n)
                _recv_into(sock, memoryview(payload))
            if fault in ("flip", "drop"):
                assert self.faults is not None  # a fault: injection is on
                self.faults.injected[fault] += 1
                payload = bytearray(payload)  # a held payload may be replayed: damage a copy
                if fault == "flip":
                    self.faults.flip_bit(memoryview(payload), peer)
            if flags & _CHECKED and (fault == "drop" or self._crc(payload) != crc):
                return self._corrupted(peer, rx, key, req, msg_id)
            rx.current = None
            if _REC_BASE <= tag < _CTRL_TAG_BASE and ctx & 3 == CTRL or tag == _FLUSH_TAG and ctx & 3 == DATA:
                self._agreement_message(peer, ctx, tag, payload)
            if stamp is not None:
                if type(payload) is not _Payload:
                    payload = _Payload(payload)
                payload.stamp = stamp
            if req is None:
                self._arrived(peer, ctx, tag, payload)
            else:
                self._fill(req, payload)
            return True
        req.stamp = stamp
        m, rest = min(n, req.nbytes), None  # straight into the receiver's memory, no copy
        if payload is None:
            if m:
                _recv_into(sock, _view(req.ptr, m))
            if n > m:  # longer than the buffer: drain the rest, report truncation
                rest = bytearray(n - m)
                _recv_into(sock, memoryview(rest))
        else:
            if m:
                ctypes.memmove(req.ptr, (ctypes.c_char * m).from_buffer(payload), m)
            rest = payload[m:] if n > m else None
        if fault == "flip":
            assert self.faults is not None  # a fault: injection is on
            self.faults.injected[fault] += 1
            self.faults.flip_bit(_view(req.ptr, m) if m else memoryview(rest or bytearray()), peer)
        elif fault == "drop":
            assert self.faults is not None  # a fault: injection is on
            self.faults.injected[fault] += 1
        if flags & _CHECKED:
            got = self._crc_at(req.ptr, m) if m else self._crc(b"")
            if rest is not None:
                got = self._crc(rest, got)
            if fault == "drop" or got != crc:
                return self._corrupted(peer, rx, key, req, msg_id)
        req.truncated = n > m
        rx.current = None
        req.done.set()
        return True

    def _corrupted(self, peer: int, rx, key, req, msg_id: int) -> bool:
        """Message ``msg_id`` from ``peer`` failed its checksum: put its receive back first in
        line, hold what follows, and ask for a copy (or give up after _MAX_RETRIES)."""
        from ..observability.log import logger

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

    def _peer_lost(self, peer: int, exc, current=None) -> None:
        error = RemoteError(
            f"lost the connection to {self.where(peer)}: {exc} (it exited or was killed)",
            rank=self.rank,
            remote_rank=peer,
            remote_type="ConnectionError",
        )
        with self._lock:
            self._dead[peer] = error
            keys = [k for k in self._posted if k[0] == peer]
            reqs = [r for k in keys for r in self._posted.pop(k)]
        if current is not None and not current.done.is_set():
            reqs.append(current)  # half received when the connection dropped
        for req in reqs:
            req.error = error
            req.done.set()

    def _abort_local(self, peer: int, ctx: int, error) -> None:
        """Fail every receive, pending or later, in the communicator of context ``ctx``: it was
        aborted (or timed out) on ``peer``, so no member can complete a call in it."""
        base = ctx & ~3
        with self._lock:
            self._aborted.setdefault(base, error)
            keys = [k for k in self._posted if k[1] & ~3 == base]
            reqs = [r for k in keys for r in self._posted.pop(k)]
        for req in reqs:
            req.error = error
            req.done.set()

    def _notice_error(self, peer: int, raw: bytes | bytearray):
        """The error a peer's abort notice means here: its timeout (naming the ranks it
        waited for) or its abort."""
        try:
            notice = json.loads(bytes(raw))
            kind, text, missing = notice["kind"], str(notice["text"]), list(notice.get("missing") or ())
        except (ValueError, KeyError, TypeError):
            kind, text, missing = "abort", bytes(raw).decode(errors="replace"), []
        if kind == "timeout":
            return Timeout(text, rank=self.rank, missing_ranks=missing, remote_rank=peer)
        if kind == "died" and missing:  # the peer saw rank missing[0] die: so it is for us too
            return RemoteError(
                f"{text} (seen by rank {peer})", rank=self.rank, remote_rank=missing[0], remote_type="died"
            )
        return RemoteError(
            f"{self.where(peer)} aborted the communicator: {text}",
            rank=self.rank,
            remote_rank=peer,
            remote_type="aborted",
        )

    def abort(self, ctx: int, members: list, reason: str, kind: str = "abort", missing=()) -> None:
        """This rank gives up on the communicator of ``ctx``: its own waits end at once and
        every member is told, so that theirs end too (never waits for anyone).  ``kind``
        "timeout": peers raise Timeout naming ``missing`` (job ranks) instead."""
        mine = (
            Timeout(reason, rank=self.rank, missing_ranks=list(missing))
            if kind == "timeout"
            else InvalidUsage(f"the communicator was aborted on rank {self.rank}", rank=self.rank, aborted=True)
        )
        self._abort_local(self.rank, ctx, mine)
        with self._lock:
            if ctx & ~3 in self._notified:
                return  # the members were told once (the first verdict is the one that counts)
            self._notified.add(ctx & ~3)
        data = json.dumps({"kind": kind, "text": reason[:2000], "missing": list(missing)}).encode()
        notice = _head(ctx & ~3, _ABORT_TAG, len(data), 0, 0, 0) + data
        for peer in members:
            if peer == self.rank or peer in self._dead:
                continue
            self._notice(peer, notice)  # never waits: a peer that takes no data gets it when it reads again

    def close(self) -> None:
        """Shut every connection (abort of the last communicator over this mesh), after at most
        1 s for what is still owed to the peers (notices behind a full socket)."""
        self.closed = True
        deadline = time.monotonic() + 1.0
        for peer, out in enumerate(self._outs):
            if out is None:
                continue
            with out.cv:
                out.cv.notify_all()
                while (out.jobs or out.pending) and peer not in self._dead and time.monotonic() < deadline:
                    out.cv.wait(max(0.0, min(0.05, deadline - time.monotonic())))
        for sock in self.socks:
            if sock is not None:
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                sock.close()

    def set_timeout(self, seconds: float) -> None:
        self._tl.timeout = seconds

    def wait(self, req: _Recv) -> None:
        if req is _SENT:
            return
        limit = getattr(self._tl, "timeout", self.timeout)
        if req.done.is_set():
            ok = True
        else:  # (peer, since): what `uniccl top` shows this rank waiting on
            self.waiting = (req.peer, time.monotonic())
            ok = req.done.wait(limit or None)
            self.waiting = None
        if not ok:
            who = self.where(req.peer) if req.peer >= 0 else "a peer"
            raise Timeout(
                f"rank {self.rank} timed out after {limit:g} s waiting for a message from {who}",
                rank=self.rank,
                missing_ranks=[req.peer] if req.peer >= 0 else [],
            )
        if req.error is not None:
            raise req.error


class TCPTransport:
    """One communicator's view of the mesh: its ranks (world ranks in communicator
    order) and its contexts.  Same interface as :class:`uniccl.transport.mpi.MPITransport`."""

    name = "tcp"
    tag_ub = (1 << 30) - 1
    data, p2p = DATA, P2P
    # the announced call (see announce): None until the first one
    _seq: int | None
    _tag: int | None
    _own: bytes | None  # this rank's record of it
    _full: bytes | None  # ... with its error, if any
    _recs: list[_Recv | None] | None  # the receives of the others' records (not light)
    _mismatched: Callable[[], object] | None  # judges (and raises) once the records differ
    _stamp: bytes | None  # what its data messages carry

    def __init__(self, mesh: Mesh, members: list[int], ctx: int):
        self.mesh = mesh
        self.members = members
        self.rank = members.index(mesh.rank)
        self.size = len(members)
        self.ctx = ctx
        self._ctrl_seq = 0
        self._splits = 0
        self._shrinks = 0
        self.active = False  # an announced call is running (see announce)
        self._seq = self._tag = self._own = self._full = self._recs = self._mismatched = self._stamp = None
        self._light, self._mask, self._full_mask = False, 0, (1 << self.size) - 1
        # stamps carry a 64-bit set of matched ranks: beyond 64 ranks no call is "light" (see
        # Communicator._run_announced) and the sets are not kept
        self._masked = self.size <= 64
        self._own_mask = _MASK.pack(1 << self.rank if self._masked else 0)
        mesh.live += 1

    def set_timeout(self, seconds: float) -> None:
        """Seconds each wait of the calling thread may take (0: forever)."""
        self.mesh.set_timeout(seconds)

    def abort(self, reason: str) -> None:
        """End this communicator's waits here and on every member at once; the last aborted
        communicator over the mesh closes its sockets."""
        self.mesh.abort(self.ctx, self.members, reason)
        self.mesh.live -= 1
        if self.mesh.live <= 0:
            self.mesh.close()

    def fail(self, reason: str, missing) -> None:
        """After a timeout: this communicator is finished here; every member's waits end now
        with a Timeout naming the same ranks (``missing``: this communicator's ranks)."""
        self.mesh.abort(self.ctx, self.members, reason, "timeout", [self.members[m] for m in missing])

    def failed(self, reason: str) -> None:
        """This rank failed in the middle of a call: every member's waits end now with a
        RemoteError naming this rank (they would otherwise wait for its data)."""
        self.mesh.abort(self.ctx, self.members, reason, "abort")

    def peer_died(self, reason: str, dead: int) -> None:
        """After losing rank ``dead`` mid-call: every member's waits end now with a RemoteError
        naming it (a survivor may be waiting for another survivor, not for the dead rank)."""
        self.mesh.abort(self.ctx, self.members, reason, "died", [self.members[dead]])

    def _local(self, exc):
        """A mesh error (Timeout, RemoteError) naming this communicator's ranks, not the job's."""
        extra = dict(exc.extra)
        if "missing_ranks" in extra:
            extra["missing_ranks"] = [self.members.index(p) for p in extra["missing_ranks"] if p in self.members]
        if extra.get("remote_rank") in self.members:
            extra["remote_rank"] = self.members.index(extra["remote_rank"])
        else:
            extra.pop("remote_rank", None)
        return type(exc)(exc.message, rank=self.rank, **extra)

    # -------------------------------------------------------- point to point
    def isend(self, ptr: int, nbytes: int, peer: int, tag: int, comm=None):
        try:
            self.mesh.send(
                self.members[peer],
                self.ctx + (comm or DATA),
                tag,
                ptr,
                nbytes,
                stamp=self._stamp if self.active and not comm else None,
            )
        except Timeout as exc:  # the peer took no data within the call's limit: it is named
            raise self._local(exc) from None
        return _SENT

    def irecv(self, ptr: int, nbytes: int, peer: int, tag: int, comm=None):
        return self.mesh.post(self.members[peer], self.ctx + (comm or DATA), tag, ptr, nbytes)

    def wait(self, req) -> None:
        try:
            self.mesh.wait(req)
        except _Flushed:  # some rank found that the call's records differ: judge them here too
            self._mismatch()
        except Timeout as exc:  # this rank's own (a peer's verdict, told to it, names the ranks already)
            own = self.active and exc.extra.get("remote_rank") is None
            raise (self._missing(exc) if own else self._local(exc)) from None
        except RemoteError as exc:
            raise self._local(exc) from None
        if self.active and req is not _SENT:  # data is used only once its stamp matches (see announce)
            stamp = req.stamp
            if stamp is None or not stamp.startswith(self._own):
                self._mismatch()
            if self._masked and self._mask != self._full_mask:
                mask = self._mask | _MASK.unpack_from(stamp, 64)[0]
                if mask != self._mask:
                    self._mask = mask
                    self._stamp = cast(bytes, self._own) + _MASK.pack(mask)  # (active: announced)

    def waitall(self, reqs) -> None:
        for req in reqs:
            self.wait(req)

    def finish_p2p(self, req, peer: int, nbytes: int, op: str, rank: int) -> None:
        try:
            self.mesh.wait(req)
        except Timeout as exc:
            raise self._local(exc) from None
        except RemoteError as exc:
            raise RemoteError(exc.message, op=op, rank=rank, remote_rank=peer, remote_type="ConnectionError") from None
        if req is not _SENT and req.truncated:
            raise InvalidArgument(
                f"message from rank {peer} is longer than the receive buffer ({nbytes} bytes)",
                op=op,
                rank=rank,
                argument="buf",
            )

    # ------------------------------------- agreement alongside the data (TCP only)
    # A round trip of records before every call costs more than the check is worth over TCP.
    # Instead each data message of a call carries a stamp: the sender's record of the call and
    # the set of ranks whose records it has matched (its own, and those of every stamp it
    # accepted).  The ring and doubling algorithms pass stamps around until every rank has
    # matched every other ("light" calls: no extra message at all); other calls also send
    # their record to every rank and check all of them before returning.  At the first
    # difference, seen by any rank, every rank exchanges full records, judges, drops what was
    # sent ahead (flush) and raises alike, and the communicator stays usable.
    def announce(self, seq: int, tag: int, record: bytes, full: bytes, light: bool, mismatched) -> None:
        """Start call ``seq`` (data tag ``tag``): ``record`` (64 bytes) is what must agree, ``full``
        adds this rank's error if it has one; ``mismatched()`` judges (and raises) once records differ."""
        mesh, me = self.mesh, self.rank
        self._seq, self._tag, self._own, self._full, self._light = seq, tag, record, full, light
        self._mismatched = mismatched
        self._mask = 1 << me
        self._stamp = record + self._own_mask
        self.active = True
        known_bad = mesh.begin(self.ctx + DATA, seq, tag, record)
        if not light:
            self._recs = self._to_all(self.ctx + CTRL, _REC_BASE + tag, full)
        if known_bad or full is not record:
            self._mismatch()

    def finish(self) -> None:
        """End of an announced call's data: returns when every rank's record matched."""
        if self._light:
            if self._mask != self._full_mask:
                self._mismatch()
        else:
            for _p, req in enumerate(cast("list[_Recv | None]", self._recs)):  # (not light: posted)
                if req is None:
                    continue
                try:
                    self.mesh.wait(req)
                except _Flushed:
                    self._mismatch()
                except Timeout as exc:
                    raise self._not_arrived(self._recs, exc=exc) from None
                except RemoteError as exc:
                    raise self._local(exc) from None
                if req.data != self._full:
                    self._mismatch()
        self.active = False
        self.mesh.end(self.ctx + DATA, cast(int, self._tag))

    def abandon(self) -> None:
        """The call failed otherwise (timeout, dead peer, abort): forget its agreement."""
        self.active = False
        if self._tag is not None:
            self.mesh.end(self.ctx + DATA, self._tag)

    def _to_all(self, ctx: int, tag: int, data: bytes) -> list:
        """Post a receive from every other member, then send ``data`` to each: the receives, in
        rank order (None for this rank)."""
        mesh, me = self.mesh, self.rank
        reqs = [None if p == me else mesh.post(self.members[p], ctx, tag, None, 0) for p in range(self.size)]
        try:
            for p in range(self.size):
                if p != me:
                    mesh.send(self.members[p], ctx, tag, None, len(data), data)
        except Timeout as exc:
            raise self._local(exc) from None
        return reqs

    def _missing(self, exc: Timeout) -> Timeout:
        """A wait of an announced call timed out: the peer it waited for may itself wait for
        another; name the ranks that have not begun the call (asked now), if any."""
        peers = [m for m in self.members if m != self.mesh.rank]
        assert self._seq is not None  # a wait of an announced call
        found = self.mesh.probe(self.ctx + DATA, self._seq, peers, 1.0)
        told = self.mesh._aborted.get(self.ctx & ~3)
        if isinstance(told, Timeout) and all(why is _SILENT for why in found.values()):
            return self._local(told)  # a peer's verdict, told meanwhile, names the ranks
        if not found:  # all here (or gave up)
            return self._local(exc)
        missing = sorted(self.members.index(m) for m in found)
        return Timeout(f"{exc.message}; {_why(found, self.members)}", rank=self.rank, missing_ranks=missing)

    def _mismatch(self):
        self.active = False
        self._mismatched()  # raises
        raise InternalError("the ranks' records of a call differ, yet their judgement passed", rank=self.rank)

    def _not_arrived(self, reqs, what: str = "to make the call", exc=None) -> Timeout:
        """A wait for the ranks' records (``reqs``) timed out: the ranks whose record is missing,
        or a peer's verdict (``exc`` told by it), or who is in the way (asked now)."""
        if exc is not None and exc.extra.get("remote_rank") is not None:
            return self._local(exc)  # a peer timed out first and told this rank whom it found missing
        missing = [p for p, r in enumerate(reqs) if r is not None and not r.done.is_set()]
        limit = getattr(self.mesh._tl, "timeout", self.mesh.timeout)
        if not missing:  # they all came meanwhile
            return self._missing(
                Timeout(
                    f"rank {self.rank} timed out after {limit:g} s waiting for the ranks' records of the call",
                    rank=self.rank,
                )
            )
        stopped = "".join(f"; rank {p} {why}" for p in missing if (why := self.mesh._stopped(self.members[p])))
        return Timeout(
            f"rank {self.rank} timed out after {limit:g} s waiting for "
            f"rank{'s' if len(missing) > 1 else ''} {', '.join(map(str, missing))} {what}{stopped}",
            rank=self.rank,
            missing_ranks=missing,
        )

    def records(self) -> list:
        """Every member's full record of the failing call, in rank order (all ranks call this)."""
        assert self._tag is not None and self._full is not None  # (of the announced call)
        reqs = self._to_all(self.ctx + CTRL, _SLOW_BASE + self._tag, self._full)
        for req in reqs:
            if req is not None:
                try:
                    self.mesh.wait(req)
                except Timeout as exc:
                    raise self._not_arrived(reqs, "to report their call", exc) from None
                except RemoteError as exc:
                    raise self._local(exc) from None
        return [self._full if req is None else req.data for req in reqs]

    def flush(self) -> None:
        """After a judged mismatch (every member judges alike, and calls this): drop what was
        sent ahead for the call, here and on the way, so the communicator stays usable."""
        dctx, tag = self.ctx + DATA, self._tag
        assert tag is not None  # (of the announced call)
        self.mesh.cancel(dctx, tag)
        # the marker goes after everything this rank sent for the call (one ordered stream per peer)
        for req in self._to_all(dctx, _FLUSH_TAG, _T.pack(tag)):
            if req is None:
                continue
            try:  # each peer's marker: its reader dropped what came before it
                self.mesh.wait(req)
            except (Timeout, RemoteError) as exc:
                raise self._local(exc) from None
        self.mesh.end(dctx, tag)

    # ------------------------------------------------- control (small, pickled)
    def _ctrl_tag(self) -> int:
        self._ctrl_seq += 1
        return _CTRL_TAG_BASE + self._ctrl_seq % _CTRL_TAG_BASE

    def _exchange(self, payloads: dict, sources) -> dict:
        """Send ``payloads[peer]`` (bytes) to each peer, return {source: bytes}."""
        tag, ctx = self._ctrl_tag(), self.ctx + CTRL
        reqs = {src: self.mesh.post(self.members[src], ctx, tag, None, 0) for src in sources}
        try:
            for peer, data in payloads.items():
                self.mesh.send(self.members[peer], ctx, tag, None, len(data), data)
        except Timeout as exc:
            raise self._local(exc) from None
        out = {}
        for src, req in reqs.items():
            self.wait(req)
            out[src] = req.data
        return out

    def bcast_obj(self, obj, root: int = 0):
        if self.rank == root:
            data = pickle.dumps(obj)
            self._exchange({p: data for p in range(self.size) if p != root}, ())
            return obj
        return pickle.loads(self._exchange({}, (root,))[root])

    def allgather_obj(self, obj) -> list:
        data = pickle.dumps(obj)
        got = self._exchange(
            {p: data for p in range(self.size) if p != self.rank}, [p for p in range(self.size) if p != self.rank]
        )
        return [obj if p == self.rank else pickle.loads(got[p]) for p in range(self.size)]

    def allgather_array(self, arr, out) -> None:
        """``out[i] = arr`` of rank i (numpy arrays; ``out`` has ``size`` rows)."""
        data = arr.tobytes()
        got = self._exchange(
            {p: data for p in range(self.size) if p != self.rank}, [p for p in range(self.size) if p != self.rank]
        )
        out[self.rank] = arr
        for p, raw in got.items():
            out[p] = np.frombuffer(raw, dtype=arr.dtype).reshape(arr.shape)

    def split(self, color: int, key: int) -> TCPTransport | None:
        """Ranks of one ``color`` ordered by (key, rank); UNDEFINED (-1) gets None."""
        pairs = self.allgather_obj((color, key))
        self._splits += 1
        if color < 0:
            return None
        members = [self.members[r] for _, r in sorted((k, r) for r, (c, k) in enumerate(pairs) if c == color)]
        return TCPTransport(self.mesh, members, derive_context(self.ctx, self._splits, color))

    def shrink(self, timeout: float) -> TCPTransport:
        """The ranks of this communicator still alive, as a new transport (collective over the
        survivors).  Each survivor sends its view of who is alive (peers whose connection did
        not drop) to the others; those it cannot hear from within ``timeout`` or that drop
        meanwhile are left out; the intersection is confirmed in a second round."""
        if getattr(self.mesh, "closed", False):
            raise InvalidUsage(
                "the connections were closed by abort(): call shrink() before abort()", op="shrink", rank=self.rank
            )
        self._shrinks += 1
        ctx = derive_context(self.ctx, self._shrinks, -2) + CTRL  # a context of its own: the old one is aborted
        me = self.mesh.rank
        alive = [m for m in self.members if m == me or m not in self.mesh._dead]
        views = self._shrink_round(ctx, 1, alive, alive, timeout)
        common = [m for m in self.members if all(m in v for v in views.values())]  # in communicator order
        confirm = self._shrink_round(ctx, 2, common, common, timeout)
        if any(v != common for v in confirm.values()):
            raise InternalError(
                f"the survivors disagree on who is alive ({confirm}); call shrink() again", op="shrink", rank=self.rank
            )
        return TCPTransport(self.mesh, common, derive_context(ctx, 0, 0))

    def _shrink_round(self, ctx: int, tag: int, peers: list, view: list, timeout: float) -> dict:
        """Send ``view`` to every other job rank in ``peers``; {job rank: its view} of those heard
        from (mine included); a peer that is dead or silent for ``timeout`` is left out."""
        me, mesh = self.mesh.rank, self.mesh
        data = json.dumps(view).encode()
        reqs = {p: mesh.post(p, ctx, tag, None, 0) for p in peers if p != me}
        for p in reqs:
            try:
                mesh.send(p, ctx, tag, None, len(data), data)
            except (RemoteError, InternalError, Timeout):
                pass  # it died (its receive fails too), or takes no data: left out
        out = {me: list(view)}
        deadline = time.monotonic() + timeout
        for p, req in reqs.items():
            if req.done.wait(max(0.0, deadline - time.monotonic())) and req.error is None:
                out[p] = json.loads(req.data)
        return out

    def node(self) -> tuple[int, int]:
        """(local rank, local size): position among this communicator's ranks on this host."""
        hosts = [self.mesh.table[m]["host"] for m in self.members]
        mine = hosts[self.rank]
        same = [r for r, h in enumerate(hosts) if h == mine]
        return same.index(self.rank), len(same)

    def free(self) -> None:
        pass  # the mesh outlives communicators: peers may still be reading our last messages


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
        self._index: list[collections.OrderedDict[int, list]] = [collections.OrderedDict() for _ in range(size)]
        # msg id -> (ctx, tag, crc, bytes, stamp)
        self._small: list[collections.OrderedDict[int, tuple]] = [collections.OrderedDict() for _ in range(size)]
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
                from .shm._shm import crc32c_copy

                self._copy = crc32c_copy
                self._ring = bytearray(self.budget)
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
    """What one reader knows about its peer's stream: the message being filled (failed if the
    connection drops), the corrupted message awaited again and what arrived after it."""

    __slots__ = ("current", "awaiting", "held", "tries", "sync")

    def __init__(self):
        self.current = None
        self.awaiting = None
        self.held = collections.deque()
        self.tries = 0
        self.sync = False  # the peer asked to be told once nothing is awaited from it (Mesh.linger)


def _why(found: dict, members: list) -> str:
    """'rank 1 is stopped (...); ranks 2, 3 have not made the call': ``found`` ({job rank: what
    it does}, from Mesh.probe) in this communicator's ranks."""
    groups: dict = {}
    for p, why in found.items():
        groups.setdefault(why, []).append(members.index(p))
    parts = []
    for why, ranks in groups.items():
        ranks.sort()
        if len(ranks) == 1:
            parts.append(f"rank {ranks[0]} {why}")
        else:
            verb, _, rest = why.partition(" ")
            verb = {"has": "have", "is": "are", "does": "do", "takes": "take"}.get(verb, verb)
            parts.append(f"ranks {', '.join(map(str, ranks))} {verb} {rest}")
    return "; ".join(parts)


class _Out:
    """The sending side of the connection to one peer: its socket, its TLS state (None: plain
    TCP), what is owed to the stream (``pending``: [plaintext?, view], the rest of a message a
    timed-out send left; it goes out before anything else) -- both under the peer's send lock --
    and the jobs of its sender thread (under ``cv``)."""

    __slots__ = ("peer", "sock", "tls", "pending", "jobs", "cv", "thread")

    def __init__(self, peer: int, sock, tls=None):
        self.peer, self.sock, self.tls = peer, sock, tls
        self.pending: collections.deque[tuple[bool, memoryview]] = collections.deque()
        self.jobs: collections.deque[list] = collections.deque()  # [pieces, None] or [None, message id]
        self.cv = threading.Condition(threading.Lock())
        self.thread = None


_NO_CHECK_TIME = 0x200000  # X509_V_FLAG_NO_CHECK_TIME: a pinned certificate's dates (two hosts' clocks) do not matter


class _TLS:
    """One TLS 1.3 connection through memory BIOs over a plain socket: the reader thread decrypts
    (``recv_into``, as a socket's), senders encrypt under the send lock (``encrypt``, then send
    the bytes themselves, so that a send keeps its deadline); ``lock`` keeps them off the SSL
    object at the same time (it is not thread-safe), socket I/O happens outside it."""

    __slots__ = ("sock", "obj", "inc", "out", "lock", "_buf", "_want")

    def __init__(self, sock, obj, inc, out):
        import ssl

        self.sock, self.obj, self.inc, self.out = sock, obj, inc, out
        self.lock = threading.Lock()
        self._buf = memoryview(bytearray(256 << 10))
        self._want = ssl.SSLWantReadError

    def recv_into(self, view) -> int:
        while True:
            with self.lock:
                try:
                    return self.obj.read(len(view), view)
                except self._want:  # a record is not all here yet
                    pass
            got = self.sock.recv_into(self._buf)
            if not got:
                return 0
            with self.lock:
                self.inc.write(self._buf[:got])

    def encrypt(self, view) -> bytes:
        with self.lock:
            self.obj.write(view)
            return self.out.read()

    def flush_blocking(self) -> None:
        """Send what the SSL object wrote (set-up: the socket has a timeout)."""
        with self.lock:
            data = self.out.read()
        if data:
            self.sock.sendall(data)

    def version(self) -> str | None:
        return self.obj.version()

    def cipher(self):
        return self.obj.cipher()


class _TLSIdentity:
    """This rank's ephemeral TLS identity under UNICCL_TCP_TLS=1: a P-256 key and a self-signed
    certificate, made by the ``openssl`` program at start-up (the key in memory: a memfd, never
    on disk).  The certificate goes to the peers through the rendezvous; each connection is TLS
    1.3 with both certificates required, each side trusting exactly the one its peer published
    (and checking its SHA-256); then each side proves the job secret by an HMAC over both
    fingerprints, so a forged rendezvous answer cannot put a stranger in the middle."""

    def __init__(self):
        import shutil
        import ssl
        import subprocess

        def unavailable(why: str) -> PlatformUnavailable:
            return PlatformUnavailable(f"UNICCL_TCP_TLS=1 {why}", op="init", argument="UNICCL_TCP_TLS")

        if not getattr(ssl, "HAS_TLSv1_3", False):
            raise unavailable(f"needs TLS 1.3, which this Python's ssl module ({ssl.OPENSSL_VERSION}) lacks")
        exe = shutil.which("openssl")
        if exe is None or not hasattr(os, "memfd_create"):
            raise unavailable(
                "needs the openssl program to make this rank's certificate: none on PATH "
                "(install OpenSSL, or unset UNICCL_TCP_TLS)"
            )
        self._fds = [os.memfd_create("uniccl-tls-key"), os.memfd_create("uniccl-tls-cert")]
        self._key, self._cert = (f"/proc/self/fd/{fd}" for fd in self._fds)
        try:
            res = subprocess.run(
                [
                    exe,
                    "req",
                    "-x509",
                    "-newkey",
                    "ec",
                    "-pkeyopt",
                    "ec_paramgen_curve:P-256",
                    "-nodes",
                    "-sha256",
                    "-days",
                    "30",
                    "-subj",
                    "/CN=uniccl",
                    "-batch",
                    "-keyout",
                    self._key,
                    "-out",
                    self._cert,
                ],
                pass_fds=self._fds,
                capture_output=True,
                text=True,
                timeout=60,
            )
            why = res.stderr.strip()[-300:] if res.returncode else ""
        except (OSError, subprocess.SubprocessError) as exc:
            why = str(exc)
        self.pem = os.pread(self._fds[1], 1 << 20, 0).decode(errors="replace")
        if why or "BEGIN CERTIFICATE" not in self.pem:
            self.discard()
            raise unavailable(f"could not make this rank's certificate with {exe}: {why or 'no certificate written'}")
        self.sha256 = hashlib.sha256(ssl.PEM_cert_to_DER_cert(self.pem)).hexdigest()

    def public(self) -> dict:
        """What the peers learn through the rendezvous."""
        return {"sha256": self.sha256, "cert": self.pem}

    def discard(self) -> None:
        """The key is not needed once every connection is made (each context loaded it)."""
        for fd in self._fds:
            try:
                os.close(fd)
            except OSError:
                pass
        self._fds = []

    def handshake(self, mesh: Mesh, sock, peer: int, server_side: bool, secret: bytes) -> _TLS:
        """TLS 1.3 on ``sock`` (connected, with a timeout) to ``peer``, which must hold the
        certificate it published; OSError (ConnectionRefusedError: refused) otherwise."""
        import ssl

        theirs = mesh.table[peer].get("tls")
        if not isinstance(theirs, dict) or not isinstance(theirs.get("cert"), str):
            raise ConnectionRefusedError("it runs without UNICCL_TCP_TLS=1 (set it alike on every rank)")
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER if server_side else ssl.PROTOCOL_TLS_CLIENT)
        ctx.minimum_version = ctx.maximum_version = ssl.TLSVersion.TLSv1_3
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_REQUIRED
        ctx.load_cert_chain(self._cert, self._key)
        try:
            ctx.load_verify_locations(cadata=theirs["cert"])
        except (ssl.SSLError, ValueError) as exc:
            raise ConnectionRefusedError(f"TLS: it published no usable certificate ({exc})") from None
        ctx.verify_flags |= _NO_CHECK_TIME
        if server_side:
            ctx.num_tickets = 0
        inc, out = ssl.MemoryBIO(), ssl.MemoryBIO()
        stream = _TLS(sock, ctx.wrap_bio(inc, out, server_side=server_side), inc, out)
        try:
            while True:
                try:
                    stream.obj.do_handshake()
                    break
                except ssl.SSLWantReadError:
                    stream.flush_blocking()
                    data = sock.recv(1 << 16)
                    if not data:
                        raise ConnectionError("it closed the connection during the TLS handshake") from None
                    inc.write(data)
            stream.flush_blocking()
        except ssl.SSLCertVerificationError as exc:
            try:
                stream.flush_blocking()  # the alert: the peer learns why at once
            except OSError:
                pass
            raise ConnectionRefusedError(
                f"TLS: it does not hold the certificate it published ({exc.verify_message})"
            ) from None
        got = hashlib.sha256(stream.obj.getpeercert(binary_form=True)).hexdigest()
        if not hmac.compare_digest(got, str(theirs.get("sha256", ""))):
            raise ConnectionRefusedError(f"TLS: its certificate (SHA-256 {got[:16]}...) is not the one it published")
        client, server = (got, self.sha256) if server_side else (self.sha256, got)

        def proof(role: str) -> bytes:
            return hmac.new(secret, f"uniccl-tls/{role}/{client}/{server}".encode(), hashlib.sha256).digest()

        sock.sendall(stream.encrypt(proof("server" if server_side else "client")))
        heard = bytearray(32)
        try:
            _recv_into(stream, memoryview(heard))
        except ssl.SSLError as exc:  # TLS 1.3: a server that refuses our certificate says so only now
            if "ALERT" not in str(exc).upper():
                raise
            raise ConnectionRefusedError(f"TLS: it refused this rank's certificate ({exc.reason or exc})") from None
        if not hmac.compare_digest(bytes(heard), proof("client" if server_side else "server")):
            raise ConnectionRefusedError("TLS: it does not prove the job secret over this connection")
        return stream


_meshes: weakref.WeakSet[Mesh] = weakref.WeakSet()
_lingering: list[bool] = []  # [True] once the exit hook is registered


def _at_exit(mesh: Mesh) -> None:
    """Linger at this process's exit for the peers of ``mesh`` (see Mesh.linger)."""
    if not _lingering:
        _lingering.append(True)
        atexit.register(_linger_all)
    _meshes.add(mesh)


def _linger_all() -> None:
    for mesh in list(_meshes):
        try:
            mesh.linger(3.0)
        except Exception:  # exiting: never an error of its own
            pass


def _checksums():
    """(on?, crc32c(bytes, crc=0), crc32c_at(ptr, n, crc=0)): CRC-32C from the core's C code."""
    on = _env.flag("UNICCL_TCP_CHECKSUM")
    try:
        from .shm._shm import crc32c, crc32c_at
    except ImportError:  # the compiled core is missing: no checksums (a plain-Python build)
        return False, None, None
    return on, crc32c, crc32c_at


def derive_context(parent: int, n: int, color: int) -> int:
    """Context id of a new communicator, the same on each of its members however many
    other communicators each of them made (a hash of its lineage, 2 low bits free)."""
    digest = hashlib.sha256(f"{parent}/{n}/{color}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ~3
