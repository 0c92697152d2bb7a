"""TCP as a transport: ranks connect without MPI, on one host or across hosts.

The *mesh* is one authenticated socket per pair of ranks of a job, set up once
from a rendezvous (:mod:`uniccl._uniqueid`): every rank listens, publishes its
address, connects to the lower ranks and accepts the higher ones.  A reader
thread per peer always drains its socket, so a sender blocked in ``sendall``
always makes progress and ``isend`` can simply send in the caller's thread.

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
typed error.  Fault injection for tests: :mod:`uniccl._faults`.
"""
from __future__ import annotations

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

import numpy as np

from . import _env
from ._errors import InternalError, InvalidArgument, InvalidUsage, RemoteError, Timeout
from ._timeout import default_timeout

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
_Q = struct.Struct("<q")
_MASK = struct.Struct("<Q")  # a stamp's ranks (bit r: rank r's record matched)
_STAMPED = 8  # flag: the stamp area holds a stamp (the call's record, the ranks matched so far)
_STAMP = 72  # bytes: the 64-byte record and a 64-bit mask of ranks
_NO_STAMP = bytes(_STAMP)
_HEAD = _HDR.size + _STAMP  # every message starts so: one read gets the header and the stamp
_REC_BASE, _SLOW_BASE = 1 << 28, 1 << 29  # control-context tags of a call's records: base + data tag
_T = struct.Struct("<I")  # a flush marker's payload: the data tag of the call it ends


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


def host_key() -> str:
    """What makes two ranks "on one host": the hostname and the network namespace
    (namespaces on one machine act as separate hosts, as in the launcher's tests)."""
    try:
        ns = os.stat("/proc/self/ns/net").st_ino
    except OSError:
        ns = 0
    return f"{socket.gethostname()}/{ns}"


def route_address(target_host: str) -> str:
    """This machine's address on the route to ``target_host`` (what peers can reach)."""
    forced = _env.text("UNICCL_HOST_ADDR")
    if forced:
        return forced
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((target_host, 9))  # UDP connect sends nothing; it only picks the route
            return s.getsockname()[0]
    except OSError:
        return "127.0.0.1"


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


class _Flushed(Exception):
    """A receive ended because the ranks' records of its call differ (see TCPTransport)."""


_SENT = None  # sends complete in the caller's thread: their request is nothing to wait for


class Mesh:
    """Sockets to every other rank of the job and the matching of incoming messages."""

    def __init__(self, uid, rank: int, size: int, timeout: float):
        from ._uniqueid import bind_address, rendezvous

        self.rank, self.size = rank, size
        self.timeout = default_timeout()  # waits outside calls (set-up); calls set their own
        addr = route_address(uid.host)
        listener = socket.create_server((bind_address(addr), 0), backlog=max(8, size))  # only where peers reach us
        payload = {"addr": addr, "port": listener.getsockname()[1], "host": host_key(),
                   "hostname": socket.gethostname(), "pid": os.getpid()}
        self.table = rendezvous(uid, rank, size, payload, timeout)
        self.socks: list = [None] * size
        self.send_locks = [threading.Lock() for _ in range(size)]
        try:
            self._connect(uid.secret, listener, timeout)
        finally:
            listener.close()
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
        from ._telemetry import enabled

        # per peer: bytes and ns sent, bytes and ns received, retransmissions sent, checksum failures,
        # bytes sent and received in timed messages (>= _TIMED_BYTES: two clock reads per message
        # would cost more than a small message's whole trip through Python; its bytes are counted)
        self.links = [[0] * 8 for _ in range(size)] if enabled() else None
        self.tracer = None  # uniccl._trace.Tracer under UNICCL_TRACE: a span per message
        self.waiting = None  # (peer, since) of a wait in progress
        from ._faults import from_env

        self.faults = from_env(rank)
        self.worlds = 0  # world communicators made by init(): the n-th has the same context everywhere
        for peer, sock in enumerate(self.socks):
            if sock is not None:
                threading.Thread(target=self._reader, args=(peer, sock), daemon=True,
                                 name=f"uniccl-tcp-r{rank}-from{peer}").start()

    def where(self, peer: int) -> str:
        t = self.table[peer]
        return f"rank {peer} ({t['hostname']} {t['addr']}, pid {t['pid']})"

    def _connect(self, secret: bytes, listener, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        for peer in range(self.rank):  # connect to the lower ranks ...
            t = self.table[peer]
            try:
                sock = socket.create_connection((t["addr"], t["port"]), timeout=max(1, deadline - time.monotonic()))
                nonce = bytearray(16)
                _recv_into(sock, memoryview(nonce))
                proof = hmac.new(secret, bytes(nonce) + struct.pack("<I", self.rank), hashlib.sha256).digest()
                sock.sendall(_HELLO.pack(self.rank, proof))
            except OSError as exc:
                raise InternalError(f"cannot connect to {self.where(peer)}: {exc}", op="init",
                                    rank=self.rank) from None
            self._adopt(peer, sock)
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
            self._adopt(peer, sock)

    def _adopt(self, peer: int, sock) -> None:
        sock.settimeout(None)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.socks[peer] = sock

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
        sock = self.socks[peer]
        try:
            with self.send_locks[peer]:
                if self.checksums:  # a copy is kept: the receiver may ask for it again
                    self._send_checked(peer, sock, ctx, tag, ptr, nbytes, data, stamp)
                    return
                head = _head(ctx, tag, nbytes, 0, _STAMPED if stamp else 0, 0, stamp)
                if data is not None:
                    sock.sendall(head + data)
                elif nbytes <= _INLINE:
                    sock.sendall(head + ctypes.string_at(ptr, nbytes))
                else:
                    sock.sendall(head)
                    sock.sendall(_view(ptr, nbytes))
        except OSError as exc:
            # a peer that gave up on this communicator (a death it saw, a timeout, an abort) says so
            # before it closes: wait for its reader to deliver that, and report it instead
            deadline = time.monotonic() + 1.0
            while time.monotonic() < deadline and (ctx & ~3) not in self._aborted and peer not in self._dead:
                time.sleep(0.005)
            told = self._aborted.get(ctx & ~3)
            if told is not None:
                raise told from None
            raise RemoteError(f"cannot send to {self.where(peer)}: {exc} (did it exit?)", rank=self.rank,
                              remote_rank=peer, remote_type="ConnectionError") from None

    def _send_checked(self, peer: int, sock, ctx: int, tag: int, ptr, nbytes: int, data, stamp) -> None:
        """Send with the payload's CRC, from a kept copy (for a retransmission); send lock held."""
        msg_id = self._next_id[peer]
        self._next_id[peer] += 1
        flags = _CHECKED | _STAMPED if stamp else _CHECKED
        if nbytes <= _INLINE:  # small: the bytes object itself is the kept copy
            body = bytes(data) if data is not None else ctypes.string_at(ptr, nbytes)
            crc = self._crc(body)
            self._kept.keep_small(peer, msg_id, (ctx, tag, crc, body, stamp))
            sock.sendall(_head(ctx, tag, nbytes, crc, flags, msg_id, stamp) + body)
            return
        body, crc = self._kept.keep(peer, msg_id, ctx, tag, ptr, nbytes, data, stamp)
        if body is None:  # larger than a quarter of the budget: checked, sent from where it is, not kept
            body = data if data is not None else _view(ptr, nbytes)
            crc = self._crc(body)
        sock.sendall(_head(ctx, tag, nbytes, crc, flags, msg_id, stamp))
        sock.sendall(body)

    def _resend(self, peer: int, msg_id: int) -> None:
        """``peer`` got message ``msg_id`` corrupted: send the kept copy (reader thread)."""
        sock = self.socks[peer]
        with self.send_locks[peer]:
            kept = self._kept.get(peer, msg_id)
            try:
                if kept is None:  # overwritten or never kept: the receiver fails with a typed error
                    sock.sendall(_head(0, 0, 0, 0, _GONE, msg_id))
                    return
                ctx, tag, crc, body, stamp = kept
                self.stats["retransmits"] += 1
                if self.links is not None:
                    self.links[peer][4] += 1
                flags = _CHECKED | _RETRANSMIT | (_STAMPED if stamp else 0)
                sock.sendall(_head(ctx, tag, len(body), crc, flags, msg_id, stamp))
                sock.sendall(body)
            except OSError:
                pass  # its reader sees the connection drop

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
        for key in [k for k in self._posted if k[1] == dctx and k[2] == tag
                    or k[1] == dctx + CTRL and k[2] == _REC_BASE + tag]:
            for req in self._posted.pop(key):
                req.error = _Flushed()
                req.done.set()

    def _agreement_message(self, peer: int, ctx: int, tag: int, payload) -> None:
        """A record, a report of a failed agreement, or a flush marker arrived (reader thread)."""
        with self._lock:
            if tag == _FLUSH_TAG:  # all that ``peer`` sent for that call came before: drop it
                t = _T.unpack(bytes(payload[:4]))[0]
                for key in [k for k in self._unexpected if k[0] == peer and (
                        k[1] == ctx and k[2] == t or k[1] == ctx + CTRL and k[2] == _REC_BASE + t)]:
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

    def _answer_probe(self, peer: int, dctx: int) -> None:
        with self._lock:
            begun = self._begun.get(dctx, -1)
        try:
            with self.send_locks[peer]:
                self.socks[peer].sendall(_head(dctx, _PROBED_TAG, _Q.size, 0, 0, 0) + _Q.pack(begun))
        except OSError:
            pass  # the asker is gone

    def probe(self, dctx: int, seq: int, peers: list, wait: float) -> list:
        """The ``peers`` (job ranks) that answered that they have not begun call ``seq`` on
        ``dctx``, and those whose connection is lost: after a timeout, who is missing (their
        readers answer, wherever their callers are).  A peer that does not answer within
        ``wait`` seconds is not named: it may have given up on the call and closed (it began it)."""
        reqs = [(p, self.post(p, dctx, _PROBED_TAG, None, 0)) for p in peers if p not in self._dead]
        missing = [p for p in peers if p in self._dead]
        for p, _ in reqs:
            try:
                with self.send_locks[p]:
                    self.socks[p].sendall(_head(dctx, _PROBE_TAG, 0, 0, 0, 0))
            except OSError:
                pass
        deadline = time.monotonic() + wait
        for p, req in reqs:
            if req.done.wait(max(0.0, deadline - time.monotonic())):
                if req.error is None and _Q.unpack(req.data)[0] < seq:
                    missing.append(p)
                elif req.error is not None and p in self._dead:
                    missing.append(p)
        return sorted(missing)

    def cancel(self, dctx: int, tag: int) -> None:
        """Withdraw this rank's receives of call ``tag``; return once no reader still writes
        into the memory of one (nothing lands in the caller's buffers after this)."""
        with self._lock:
            for key in [k for k in self._posted if k[1] == dctx and k[2] == tag
                        or k[1] == dctx + CTRL and k[2] == _REC_BASE + tag]:
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
                stamp = bytes(hview[_HDR.size:]) if flags & _STAMPED else None
                if tag == _ABORT_TAG:
                    raw = bytearray(n)
                    _recv_into(sock, memoryview(raw))
                    self._abort_local(peer, ctx, self._notice_error(peer, raw))
                    continue
                if tag == _PROBE_TAG or tag == _PROBED_TAG:
                    raw = bytearray(n)
                    _recv_into(sock, memoryview(raw))
                    if tag == _PROBED_TAG:
                        self._arrived(peer, ctx, tag, raw)
                    else:  # answered by this thread: the caller's thread may be anywhere
                        self._answer_probe(peer, ctx)
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
                        *fields, payload = rx.held.popleft()
                        self._receive(peer, rx, *fields, payload=payload)
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
        return {"peer_host": self.table[peer]["hostname"], "sent_bytes": tx_b, "sent_seconds": tx_ns * 1e-9,
                "sent_timed_bytes": tx_timed, "send_GBps": tx_timed / tx_ns if tx_ns else 0.0,
                "recv_bytes": rx_b, "recv_seconds": rx_ns * 1e-9, "recv_timed_bytes": rx_timed,
                "recv_GBps": rx_timed / rx_ns if rx_ns else 0.0, "retransmits": resent, "checksum_failures": bad}

    def _receive(self, peer: int, rx, ctx: int, tag: int, n: int, crc: int, flags: int, msg_id: int,
                 stamp, sock=None, payload=None) -> bool:
        """Read one message (from ``sock``, or take ``payload`` already read), verify it, deliver
        it; False when it is corrupted (it was asked for again)."""
        key = (peer, ctx, tag)
        with self._lock:
            if stamp is not None:
                self._observe(ctx, tag, stamp[:64])
            req = rx.current = self._take_posted(key)
        fault = self.faults.on_message(peer) if self.faults is not None and flags & _CHECKED else ""
        if fault == "delay":
            self.faults.injected["delay"] += 1
            time.sleep(self.faults.delay_s)
        if req is None or req.ptr is None:
            if payload is None:
                payload = bytearray(n) if stamp is None else _Payload(n)
                _recv_into(sock, memoryview(payload))
            if fault in ("flip", "drop"):
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
            self.faults.injected[fault] += 1
            self.faults.flip_bit(_view(req.ptr, m) if m else memoryview(rest or bytearray()), peer)
        elif fault == "drop":
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
        from ._log import logger

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
        logger.warning("rank %d: message %d from rank %d failed its CRC-32C check; asking for it again (%d)",
                       self.rank, msg_id, peer, rx.tries)
        try:
            with self.send_locks[peer]:
                self.socks[peer].sendall(_head(0, _NACK_TAG, _NACK.size, 0, 0, 0) + _NACK.pack(msg_id))
        except OSError:
            pass  # the peer is gone: its reader reports that
        return False

    def _unrecoverable(self, peer: int, rx, msg_id: int, why: str) -> None:
        """A corrupted message cannot be had again: every receive from that peer fails."""
        error = InternalError(f"message {msg_id} from {self.where(peer)} arrived corrupted and {why}",
                              rank=self.rank, remote_rank=peer)
        rx.awaiting, rx.held = None, collections.deque()
        with self._lock:
            self._dead[peer] = error
            keys = [k for k in self._posted if k[0] == peer]
            reqs = [r for k in keys for r in self._posted.pop(k)]
        for req in reqs:
            req.error = error
            req.done.set()

    def _peer_lost(self, peer: int, exc, current=None) -> None:
        error = RemoteError(f"lost the connection to {self.where(peer)}: {exc} (it exited or was killed)",
                            rank=self.rank, remote_rank=peer, remote_type="ConnectionError")
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

    def _notice_error(self, peer: int, raw: bytes):
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
            return RemoteError(f"{text} (seen by rank {peer})", rank=self.rank, remote_rank=missing[0],
                               remote_type="died")
        return RemoteError(f"{self.where(peer)} aborted the communicator: {text}", rank=self.rank,
                           remote_rank=peer, remote_type="aborted")

    def abort(self, ctx: int, members: list, reason: str, kind: str = "abort", missing=()) -> None:
        """This rank gives up on the communicator of ``ctx``: its own waits end at once and
        every member is told, so that theirs end too (never waits for anyone).  ``kind``
        "timeout": peers raise Timeout naming ``missing`` (job ranks) instead."""
        mine = (Timeout(reason, rank=self.rank, missing_ranks=list(missing)) if kind == "timeout" else
                InvalidUsage(f"the communicator was aborted on rank {self.rank}", rank=self.rank, aborted=True))
        self._abort_local(self.rank, ctx, mine)
        with self._lock:
            if ctx & ~3 in self._notified:
                return  # the members were told once (the first verdict is the one that counts)
            self._notified.add(ctx & ~3)
        data = json.dumps({"kind": kind, "text": reason[:2000], "missing": list(missing)}).encode()
        for peer in members:
            if peer == self.rank or peer in self._dead:
                continue
            sock = self.socks[peer]
            if not self.send_locks[peer].acquire(timeout=1.0):
                continue  # a send to it is stuck (its buffers are full): its reader will see the socket close
            try:
                sock.settimeout(1.0)
                sock.sendall(_head(ctx & ~3, _ABORT_TAG, len(data), 0, 0, 0) + data)
            except OSError:
                pass
            finally:
                sock.settimeout(None)
                self.send_locks[peer].release()

    def close(self) -> None:
        """Shut every connection (abort of the last communicator over this mesh)."""
        self.closed = True
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
            raise Timeout(f"rank {self.rank} timed out after {limit:g} s waiting for a message from {who}",
                          rank=self.rank,
                          missing_ranks=[req.peer] if req.peer >= 0 else [])
        if req.error is not None:
            raise req.error


class TCPTransport:
    """One communicator's view of the mesh: its ranks (world ranks in communicator
    order) and its contexts.  Same interface as :class:`uniccl._mpi.MPITransport`."""

    name = "tcp"
    tag_ub = (1 << 30) - 1
    data, p2p = DATA, P2P

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
        self.mesh.send(self.members[peer], self.ctx + (comm or DATA), tag, ptr, nbytes,
                       stamp=self._stamp if self.active and not comm else None)
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
                    self._stamp = self._own + _MASK.pack(mask)

    def waitall(self, reqs) -> None:
        for req in reqs:
            self.wait(req)

    def finish_p2p(self, req, peer: int, nbytes: int, op: str, rank: int) -> None:
        try:
            self.mesh.wait(req)
        except Timeout as exc:
            raise self._local(exc) from None
        except RemoteError as exc:
            raise RemoteError(exc.message, op=op, rank=rank, remote_rank=peer,
                              remote_type="ConnectionError") from None
        if req is not _SENT and req.truncated:
            raise InvalidArgument(f"message from rank {peer} is longer than the receive buffer "
                                  f"({nbytes} bytes)", op=op, rank=rank, argument="buf")

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
            for p, req in enumerate(self._recs):
                if req is None:
                    continue
                try:
                    self.mesh.wait(req)
                except _Flushed:
                    self._mismatch()
                except Timeout:
                    raise self._not_arrived(self._recs) from None
                except RemoteError as exc:
                    raise self._local(exc) from None
                if req.data != self._full:
                    self._mismatch()
        self.active = False
        self.mesh.end(self.ctx + DATA, self._tag)

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
        for p in range(self.size):
            if p != me:
                mesh.send(self.members[p], ctx, tag, None, len(data), data)
        return reqs

    def _missing(self, exc: Timeout) -> Timeout:
        """A wait of an announced call timed out: the peer it waited for may itself wait for
        another; name the ranks that have not begun the call (asked now), if any."""
        peers = [m for m in self.members if m != self.mesh.rank]
        missing = [self.members.index(m) for m in self.mesh.probe(self.ctx + DATA, self._seq, peers, 1.0)]
        if not missing:  # all here (or gave up): a peer's verdict told meanwhile names the ranks
            told = self.mesh._aborted.get(self.ctx & ~3)
            return self._local(told if isinstance(told, Timeout) else exc)
        who = f"rank{'s' if len(missing) > 1 else ''} {', '.join(map(str, missing))}"
        return Timeout(f"{exc.message}; {who} {'have' if len(missing) > 1 else 'has'} not made the call",
                       rank=self.rank, missing_ranks=missing)

    def _mismatch(self):
        self.active = False
        self._mismatched()  # raises
        raise InternalError("the ranks' records of a call differ, yet their judgement passed", rank=self.rank)

    def _not_arrived(self, reqs, what: str = "to make the call") -> Timeout:
        missing = [p for p, r in enumerate(reqs) if r is not None and not r.done.is_set()]
        limit = getattr(self.mesh._tl, "timeout", self.mesh.timeout)
        return Timeout(f"rank {self.rank} timed out after {limit:g} s waiting for "
                       f"rank{'s' if len(missing) > 1 else ''} {', '.join(map(str, missing))} {what}",
                       rank=self.rank, missing_ranks=missing)

    def records(self) -> list:
        """Every member's full record of the failing call, in rank order (all ranks call this)."""
        reqs = self._to_all(self.ctx + CTRL, _SLOW_BASE + self._tag, self._full)
        for req in reqs:
            if req is not None:
                try:
                    self.mesh.wait(req)
                except Timeout:
                    raise self._not_arrived(reqs, "to report their call") from None
                except RemoteError as exc:
                    raise self._local(exc) from None
        return [self._full if req is None else req.data for req in reqs]

    def flush(self) -> None:
        """After a judged mismatch (every member judges alike, and calls this): drop what was
        sent ahead for the call, here and on the way, so the communicator stays usable."""
        dctx, tag = self.ctx + DATA, self._tag
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
        for peer, data in payloads.items():
            self.mesh.send(self.members[peer], ctx, tag, None, len(data), data)
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
        got = self._exchange({p: data for p in range(self.size) if p != self.rank},
                             [p for p in range(self.size) if p != self.rank])
        return [obj if p == self.rank else pickle.loads(got[p]) for p in range(self.size)]

    def allgather_array(self, arr, out) -> None:
        """``out[i] = arr`` of rank i (numpy arrays; ``out`` has ``size`` rows)."""
        data = arr.tobytes()
        got = self._exchange({p: data for p in range(self.size) if p != self.rank},
                             [p for p in range(self.size) if p != self.rank])
        out[self.rank] = arr
        for p, raw in got.items():
            out[p] = np.frombuffer(raw, dtype=arr.dtype).reshape(arr.shape)

    def split(self, color: int, key: int) -> "TCPTransport | None":
        """Ranks of one ``color`` ordered by (key, rank); UNDEFINED (-1) gets None."""
        pairs = self.allgather_obj((color, key))
        self._splits += 1
        if color < 0:
            return None
        members = [self.members[r] for _, r in sorted((k, r) for r, (c, k) in enumerate(pairs) if c == color)]
        return TCPTransport(self.mesh, members, derive_context(self.ctx, self._splits, color))

    def shrink(self, timeout: float) -> "TCPTransport":
        """The ranks of this communicator still alive, as a new transport (collective over the
        survivors).  Each survivor sends its view of who is alive (peers whose connection did
        not drop) to the others; those it cannot hear from within ``timeout`` or that drop
        meanwhile are left out; the intersection is confirmed in a second round."""
        if getattr(self.mesh, "closed", False):
            raise InvalidUsage("the connections were closed by abort(): call shrink() before abort()", op="shrink",
                               rank=self.rank)
        self._shrinks += 1
        ctx = derive_context(self.ctx, self._shrinks, -2) + CTRL  # a context of its own: the old one is aborted
        me = self.mesh.rank
        alive = [m for m in self.members if m == me or m not in self.mesh._dead]
        views = self._shrink_round(ctx, 1, alive, alive, timeout)
        common = [m for m in self.members if all(m in v for v in views.values())]  # in communicator order
        confirm = self._shrink_round(ctx, 2, common, common, timeout)
        if any(v != common for v in confirm.values()):
            raise InternalError(f"the survivors disagree on who is alive ({confirm}); call shrink() again",
                                op="shrink", rank=self.rank)
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
            except (RemoteError, InternalError):
                pass  # it died: its receive fails too
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
        self._index = [collections.OrderedDict() for _ in range(size)]  # msg id -> [ctx, tag, crc, start, n, stamp]
        self._small = [collections.OrderedDict() for _ in range(size)]  # msg id -> (ctx, tag, crc, bytes, stamp)
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
                from ._shm import crc32c_copy

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
        return memoryview(self._ring)[off:off + nbytes], crc

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
            return ctx, tag, crc, bytes(self._ring[off:off + n]), stamp


class _RxState:
    """What one reader knows about its peer's stream: the message being filled (failed if the
    connection drops), the corrupted message awaited again and what arrived after it."""

    __slots__ = ("current", "awaiting", "held", "tries")

    def __init__(self):
        self.current = None
        self.awaiting = None
        self.held = collections.deque()
        self.tries = 0


def _checksums():
    """(on?, crc32c(bytes, crc=0), crc32c_at(ptr, n, crc=0)): CRC-32C from the core's C code."""
    on = _env.flag("UNICCL_TCP_CHECKSUM")
    try:
        from ._shm import crc32c, crc32c_at
    except ImportError:  # the compiled core is missing: no checksums (a plain-Python build)
        return False, None, None
    return on, crc32c, crc32c_at


def derive_context(parent: int, n: int, color: int) -> int:
    """Context id of a new communicator, the same on each of its members however many
    other communicators each of them made (a hash of its lineage, 2 low bits free)."""
    digest = hashlib.sha256(f"{parent}/{n}/{color}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ~3


_world_mesh = None
_world_lock = threading.Lock()


def world_from_env() -> TCPTransport:
    """The transport over every rank of a ``uniccl run`` job (local, ssh or slurm launcher):
    rank, size and rendezvous come from the environment the launcher set."""
    from ._uniqueid import UniqueId

    global _world_mesh
    with _world_lock:
        if _world_mesh is None:
            launcher = ("UNICCL_RANK", "UNICCL_WORLD_SIZE", "UNICCL_RENDEZVOUS", "UNICCL_JOB_SECRET")
            rank, size, rdv, secret = (_env.get(name) for name in launcher)  # malformed: InvalidArgument
            missing = [name for name in launcher if not _env.is_set(name)]
            if missing:
                raise InvalidArgument(f"the launcher's environment is incomplete (no {', '.join(missing)}); start "
                                      "the job with 'uniccl run'", op="init", argument="UNICCL_RENDEZVOUS")
            host, _, port = rdv.rpartition(":")
            secret = bytes.fromhex(secret)
            timeout = float(_env.number("UNICCL_INIT_TIMEOUT"))
            _world_mesh = Mesh(UniqueId(host, int(port), secret), rank, size, timeout)
        _world_mesh.worlds += 1
        return TCPTransport(_world_mesh, list(range(_world_mesh.size)),
                            derive_context(0, _world_mesh.worlds, 0))
