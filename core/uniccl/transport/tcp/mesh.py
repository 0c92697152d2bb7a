"""The TCP mesh (:class:`Mesh`): the connections of one job (made at first use and
authenticated then, TLS under ``UNICCL_TCP_TLS=1``: :mod:`.heal`), read by at most four reader
threads that always drain their sockets (:mod:`.poller`), and the
matching of what arrives to the receives posted: the oldest message of a (peer, context, tag)
to the oldest receive of it.  The Mesh is made of parts: :mod:`.sender`, :mod:`.integrity`
and :mod:`.control` (their common state: :mod:`.base`); the overview is the package's
docstring (:mod:`uniccl.transport.tcp`).
"""

from __future__ import annotations

import atexit
import collections
import ctypes
import json
import os
import socket
import threading
import time
import weakref
from collections.abc import Generator

from ... import _env, _threads
from ..._errors import RemoteError, Revoked, Timeout
from ...bootstrap.rendezvous import bind_address, rendezvous, tree_children, tree_parent
from ...observability.log import logger
from ...reliability import procs
from ...reliability.timeout import default_timeout
from ..net import host_key, route_address
from ..record import RECORD_BYTES
from .base import _SENT, _Flushed, _Payload, _PerPeer, _Recv
from .control import _Control
from .heal import _Healer, _Link
from .integrity import _checksums, _Integrity, _Kept, _RxState
from .poller import READERS
from .sender import _Out, _Sender
from .tls import _TLSIdentity
from .wire import (
    _ABORT_TAG,
    _ASKED,
    _CHECKED,
    _CTRL_TAG_BASE,
    _FLUSH_TAG,
    _GONE,
    _HDR,
    _HEAD,
    _NACK,
    _NACK_TAG,
    _PROBE_TAG,
    _PROBED_TAG,
    _REC_BASE,
    _RETRANSMIT,
    _STAMPED,
    _SYNCED_TAG,
    _TABLE_TAG,
    _TIMED_BYTES,
    CTRL,
    DATA,
    _take,
    _view,
)


class Mesh(_Sender, _Integrity, _Control, _Healer):
    """Sockets to every other rank of the job and the matching of incoming messages; its parts
    send (:class:`_Sender`), check and keep copies (:class:`_Integrity`), handle control
    messages (:class:`_Control`) and redial broken connections (:class:`_Healer`)."""

    def __init__(self, uid, rank: int, size: int, timeout: float, facts: list | None = None):
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
            "start": procs.start_time(),
        }
        if tls is not None:
            payload["tls"] = tls.public()
        if facts is not None:
            payload["facts"] = facts  # for the world over it (transport.factory.world_from_env)
        try:
            known = rendezvous(uid, rank, size, payload, timeout, spread=True, every=("host", "facts"))
        except BaseException:
            listener.close()
            if tls is not None:
                tls.discard()
            raise
        # rank 0 has the table; the others know their tree neighbours until it comes (_spread_table)
        entries = known.entries
        self.table: list = entries if isinstance(entries, list) else [entries.get(p) for p in range(size)]
        self.table[rank] = payload
        self.hosts: list = known.every["host"]  # every rank's host key, known at once
        self.facts: list = known.every["facts"]  # ... and what it told of itself (None: nothing)
        self._known = threading.Event()  # set once the whole table is here
        # a pair connects when a call first needs it (heal.py): nothing is dialled here
        self.socks: list = [None] * size
        # per peer, made at its first use (base._PerPeer): the sending side, its lock, the link, the reading side
        self._outs = _PerPeer(lambda p: _Out(p, None))
        self.send_locks = _PerPeer(lambda p: threading.Lock())
        self._tls = tls  # kept (its key in memory) for the connections made later: heal.py
        self._secret = uid.secret
        self._links = _PerPeer(lambda p: _Link())
        self._lock = threading.Lock()
        self._posted: dict = {}  # (peer, ctx, tag) -> deque of _Recv
        self._unexpected: dict = {}  # (peer, ctx, tag) -> deque of bytearray
        self._dead: dict = {}  # peer -> reason
        self._aborted: dict = {}  # context base -> error: that communicator was aborted (here or by a peer)
        # context base -> weakref to f(peer, text): told (by the reader thread) when peer revokes it
        self.on_revoke: dict = {}
        self._notified: set = set()  # context bases whose members this rank has told why it gave up
        self._tl = threading.local()  # per-thread wait limit (the call running on that thread)
        self._expect: dict = {}  # data context -> (data tag, record) of the call running there
        self._early: dict = {}  # (data context, tag) -> the record stamped on what came before that call
        self._alarm: dict = {}  # data context -> tag of its call whose records were found to differ
        self._begun: dict = {}  # data context -> number of the last call begun there (for probes)
        self.live = 0  # transports over this mesh not yet aborted
        self.checksums, self._crc, self._crc_at = _checksums()
        self._heals = self.checksums  # broken connections are redialled (heal.py): the copies are kept
        self._kept = _Kept(_env.size("UNICCL_TCP_RETAIN_BYTES"), size)
        self._next_id = [0] * size
        self._rx = _PerPeer(lambda p: _RxState())
        self._pollers: list = [None] * READERS  # the reader threads, started as connections need them
        self._poller_of = [-1] * size
        self._polled = 0
        self.stats = {"checksum_failures": 0, "retransmit_requests": 0, "retransmits": 0}
        from ...observability.telemetry import enabled

        # per peer: bytes and ns sent, bytes and ns received, retransmissions sent, checksum failures,
        # bytes sent and received in timed messages (>= _TIMED_BYTES: two clock reads per message
        # would cost more than a small message's whole trip through Python; its bytes are counted)
        self.links = [[0] * 8 for _ in range(size)] if enabled() else None
        self.tracer = None  # uniccl.observability.trace.Tracer under UNICCL_TRACE: a span per message
        self.waiting: tuple[int, float] | None = None  # (peer, since) of a wait in progress
        from ...reliability.faults import from_env

        self.faults = from_env(rank)
        self.worlds = 0  # world communicators made by init(): the n-th has the same context everywhere
        self._pid = os.getpid()
        _at_exit(self)
        # the lower rank of each pair listens for the higher one's dial (first use, or redial)
        self._listener = listener if size > 1 else None
        if self._listener is None:
            listener.close()
            if tls is not None:
                tls.discard()
        else:
            _threads.start(self._serve_redials, args=(listener,), name=f"uniccl-tcp-listen{rank}")
        whole = isinstance(entries, list)
        if whole:
            self._known.set()
        if size > 1:  # init goes on meanwhile: a rank needs a peer's entry only to dial it
            _threads.start(self._spread_table, args=(timeout, whole), name=f"uniccl-tcp-table{rank}")

    def _spread_table(self, timeout: float, whole: bool) -> None:
        """(its own thread: init() does not wait for it) The table of the job comes down the
        binomial tree rooted at rank 0 (from the parent, on to the children, the largest subtree
        first: ceil(log2 n) rounds, over links the control exchanges use anyway), not from the
        rendezvous to every rank: that server sends O(n log n) bytes, not n tables (``whole``:
        this rank got it there, rank 0).  Until it is here, what needs a peer's entry beyond the
        tree neighbours waits for it (:meth:`wait_table`)."""
        try:
            if whole:
                data = json.dumps(self.table).encode()
            else:
                req = self.post(tree_parent(self.rank), 0, _TABLE_TAG, None, 0)
                deadline = time.monotonic() + timeout
                while not req.done.wait(0.25):
                    if self.closed or time.monotonic() > deadline:
                        raise Timeout(f"rank {self.rank}: the table did not come from rank {tree_parent(self.rank)}")
                if req.error is not None:
                    raise req.error
                data = req.data
                self.table = json.loads(data)
                self._known.set()
            for child in reversed(tree_children(self.rank, self.size)):
                self.send(child, 0, _TABLE_TAG, None, len(data), data)
        except Exception as exc:  # the ranks that needed it say so, naming the peer they could not reach
            if not self.closed:
                logger.warning("rank %d: passing the job's table down the tree failed: %s", self.rank, exc)

    def wait_table(self, limit: float) -> bool:
        """Whether every rank's entry is here, waiting up to ``limit`` s for it (_spread_table)."""
        return self._known.wait(limit)

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
                if self.socks[peer] is None and peer != self.rank:
                    self._start_reader(peer)  # first use: the link is made meanwhile (a death is then seen)
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
            rxs = list(self._rx.values())
            busy = [rx.current for rx in rxs if rx.current is not None and rx.current.ptr is not None]
        deadline = time.monotonic() + 5.0
        for req in busy:  # a message being read straight into its buffer: wait for its last byte
            while not req.done.wait(0.01) and time.monotonic() < deadline and any(rx.current is req for rx in rxs):
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

    def _steps(self, peer: int, sock):
        """(generator, run by a reader thread: poller.py) Read and handle the messages ``peer``
        sends on ``sock`` (a poller._Buffered, or a _TLS) until it fails (OSError, ConnectionError); yields whenever the socket
        is empty, or a monotonic time to be resumed at (a message held)."""
        hdr = bytearray(_HEAD)
        hview = memoryview(hdr)
        rx = self._rx[peer]
        while True:
            # wait for the next message's first bytes (its reader thread serves the other peers
            # meanwhile), unless the stream holds some already (poller._Buffered, or TLS's)
            if not sock.buffered():
                yield
            yield from _take(sock, hview)
            ctx, tag, n, crc, flags, msg_id = _HDR.unpack_from(hdr)
            stamp = bytes(hview[_HDR.size :]) if flags & _STAMPED else None
            if tag == _ABORT_TAG:
                raw = bytearray(n)
                yield from _take(sock, memoryview(raw))
                told = self._notice_error(peer, raw)
                self._abort_local(peer, ctx, told)
                if isinstance(told, Revoked):
                    self._revoked(peer, ctx, told.message)
                continue
            if tag in _ASKED:
                raw = bytearray(n)
                yield from _take(sock, memoryview(raw))
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
                yield from _take(sock, memoryview(raw))
                self._resend(peer, _NACK.unpack(raw)[0])
                continue
            if flags & _GONE:
                self._unrecoverable(peer, rx, msg_id, "is no longer held by the sender")
                continue
            if msg_id < rx.next_id and flags & _CHECKED:  # delivered already (sent again after a redial)
                if n:
                    yield from _take(sock, memoryview(bytearray(n)))
                continue
            if rx.awaiting is not None and not (flags & _RETRANSMIT and msg_id == rx.awaiting):
                payload = bytearray(n)  # after a corrupted message: held until its copy arrives
                yield from _take(sock, memoryview(payload))
                rx.held.append((ctx, tag, n, crc, flags, msg_id, stamp, payload))
                continue
            timed = self.tracer is not None or (self.links is not None and n >= _TIMED_BYTES)
            if timed:
                clock = time.perf_counter_ns if self.tracer is None else time.time_ns
                t0 = clock()
            ok = yield from self._receive(peer, rx, ctx, tag, n, crc, flags, msg_id, stamp, sock=sock)
            if timed:
                self._received(peer, ctx, tag, n, t0, clock())
            elif self.links is not None:
                self.links[peer][2] += n
            if ok and flags & _CHECKED:
                rx.next_id = msg_id + 1
            if ok and flags & _RETRANSMIT:
                rx.awaiting = None
                while rx.held and rx.awaiting is None:  # replay, in order, what came meanwhile
                    ctx, tag, n, crc, flags, msg_id, stamp, payload = rx.held.popleft()
                    if (yield from self._receive(peer, rx, ctx, tag, n, crc, flags, msg_id, stamp, payload=payload)):
                        rx.next_id = msg_id + 1
                if rx.sync and rx.awaiting is None:
                    rx.sync = False
                    self._answer_sync(peer)

    def _revoked(self, peer: int, ctx: int, text: str) -> None:
        """Tell the communicator of ``ctx`` that ``peer`` revoked it (it may be gone)."""
        ref = self.on_revoke.get(ctx & ~3)
        hook = ref() if ref is not None else None
        if hook is not None:
            try:
                hook(peer, text)
            except Exception:  # never the reader's end: it serves every communicator
                logger.exception("rank %d: handling rank %d's revoke", self.rank, peer)

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
        it, checksum failures of what came from it, and how often the connection was redialled."""
        if self.links is None:
            return {}
        tx_b, tx_ns, rx_b, rx_ns, resent, bad, tx_timed, rx_timed = self.links[peer]
        return {
            "peer_host": (self.table[peer] or {}).get("hostname", "?"),
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
            "reconnects": self.reconnects(peer),
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
    ) -> Generator[float | None, None, bool]:
        """(generator) Read one message (from ``sock``, or take ``payload`` already read), verify
        it, deliver it; False when it is corrupted (it was asked for again)."""
        key = rx.key = (peer, ctx, tag)
        with self._lock:
            if stamp is not None:
                self._observe(ctx, tag, stamp[:RECORD_BYTES])
            req = rx.current = self._take_posted(key)
        fault = self.faults.on_message(peer) if self.faults is not None and flags & _CHECKED else ""
        if fault == "disconnect" and sock is not None:  # the connection breaks, both processes live on
            assert self.faults is not None  # a fault: injection is on
            self.faults.injected[fault] += 1
            self.socks[peer].shutdown(socket.SHUT_RDWR)
            raise ConnectionError("connection reset (injected: disconnect)")
        if fault == "delay":
            assert self.faults is not None  # a fault: injection is on (no check on the path without)
            self.faults.injected["delay"] += 1
            yield time.monotonic() + self.faults.delay_s  # held: its reader thread reads the other peers meanwhile
        if req is None or req.ptr is None:
            if payload is None:
                payload = bytearray(n) if stamp is None else _Payload(n)
                yield from _take(sock, memoryview(payload))
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
                yield from _take(sock, _view(req.ptr, m))
            if n > m:  # longer than the buffer: drain the rest, report truncation
                rest = bytearray(n - m)
                yield from _take(sock, memoryview(rest))
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

    def _peer_lost(self, peer: int, exc, current=None, error=None) -> None:
        """``peer`` is lost for good (``exc``: why; ``error``: what its calls raise, if not the
        RemoteError saying that it exited or was killed): every receive from it fails."""
        if error is None:
            error = RemoteError(
                f"lost the connection to {self.where(peer)}: {exc} (it exited or was killed)",
                rank=self.rank,
                remote_rank=peer,
                remote_type="ConnectionError",
            )
        with self._lock:
            error = self._dead.setdefault(peer, error)  # (the first verdict stays)
            keys = [k for k in self._posted if k[0] == peer]
            reqs = [r for k in keys for r in self._posted.pop(k)]
        link = self._links[peer]
        with link.cv:  # senders waiting for the link give up (after _dead says why)
            link.dead = True
            link.cv.notify_all()
        if current is not None and not current.done.is_set():
            reqs.append(current)  # half received when the connection dropped
        for req in reqs:
            req.error = error
            req.done.set()

    def close(self) -> None:
        """Shut every connection (abort of the last communicator over this mesh), after at most
        1 s for what is still owed to the peers (notices behind a full socket)."""
        self.closed = True
        if self._listener is not None:  # first: a peer's redial is then refused, as for a dead rank
            try:
                self._listener.shutdown(socket.SHUT_RDWR)  # (wakes the accept; close alone does not)
            except OSError:
                pass
            self._listener.close()
            self._listener = None
        deadline = time.monotonic() + 1.0
        for peer, out in list(self._outs.items()):
            if out.sock is None:
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
        for link in list(self._links.values()):  # waits for a first connection end
            with link.cv:
                link.cv.notify_all()
        for poller in self._pollers:  # (each ends once its connections have)
            if poller is not None:
                poller.stop()
        if self._tls is not None:
            self._tls.discard()

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
            down = self.broken_for(req.peer) if req.peer >= 0 else 0.0
            if down:
                who += f" (its connection broke {down:.1f} s ago and is being redialled)"
            stopped = self._stopped(req.peer) if req.peer >= 0 else ""
            if stopped:  # the cause, on this host (/proc)
                who += f", which {stopped}"
            raise Timeout(
                f"rank {self.rank} timed out after {limit:g} s waiting for a message from {who}",
                rank=self.rank,
                missing_ranks=[req.peer] if req.peer >= 0 else [],
            )
        if req.error is not None:
            raise req.error


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
