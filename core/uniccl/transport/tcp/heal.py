"""Links made on first use, and links that heal.

No connection is made at init: a pair of ranks connects when a call first needs it (the first
send to a peer, or the first receive posted from it), so a rank holds sockets only for the peers
its algorithms use (a ring: 2; recursive doubling: log2 n; the control exchanges' binomial tree:
its parent and children), read by at most four reader threads (:mod:`.poller`).  While a link
is made or made again, a short-lived thread of its own dials or pokes (``uniccl-tcp-link*``).  The first connection is generation 1 of the protocol below, made the
same way as a redial: the higher rank dials; the lower rank, when it needs the link first,
pokes the higher one, which then dials.  A peer that cannot be reached at its first use is
reported as a lost one is; a TLS peer that does not hold the certificate it published is
refused (InternalError on both sides), as it was at init before.

A connection that breaks while both processes live (a reset, a NAT or firewall
that drops it, an interface down for longer than TCP waits) is made again, and each stream
resumes where its receiver stands: no message lost, none delivered twice.

Each pair of ranks has a *generation*: 0 for the connection made at init, one more per redial.
Only the higher rank dials, to the lower rank's listener (kept open after init); a lower rank
whose side broke *pokes* the higher one (a short connection that says "generation g broke here"),
so a break seen on either side is healed.  The dial's handshake is authenticated as init's (an
HMAC of the job secret over the acceptor's nonce) and carries what each side has received from
the other: the id of the next message it expects (ids number a sender's checked messages to one
peer, :mod:`.integrity`).  Each side then owes the other, from its kept copies, every message
from that id on, before anything new; a receiver drops a message whose id it already delivered.

A dial or poke that is refused means the peer's listener is gone: its process died (or closed
the mesh); it is reported at once, as a broken connection was before.  A peer that cannot be
reached is tried again until UNICCL_TIMEOUT; calls waiting on it meanwhile end at their own
timeouts, saying that the link is being redialled.

Needs the kept copies (checksums on, the default): with ``UNICCL_TCP_CHECKSUM=0`` a broken
connection is a lost peer, as before.  Under ``UNICCL_TCP_TLS=1`` a redialled connection is TLS
again, between the same pinned certificates (each rank keeps its key in memory for that).  A message larger than a quarter of
``UNICCL_TCP_RETAIN_BYTES`` is not kept: a break while one is unread loses the peer.  Control
notices (aborts, probes) that were in flight when a connection broke are not sent again.
"""

from __future__ import annotations

import collections
import hashlib
import hmac
import os
import random
import secrets
import socket
import struct
import threading
import time
from typing import Any

from ... import _threads
from ..._errors import InternalError, RemoteError, Timeout
from ...bootstrap.rendezvous import dial
from ...observability.log import logger
from ...reliability import procs
from .base import _MeshBase, _PerPeer
from .poller import READERS, _Poller
from .wire import _SLICE_US, _recv_into

_RESUME = struct.Struct("<IIQQ")  # the caller's rank, _DIAL or _POKE, a generation, the next message id it expects
_ANSWER = struct.Struct("<IQ")  # _LATER / _TAKEN / _LOST, the next message id the acceptor expects
_DIAL, _POKE = 1, 2
_LATER, _TAKEN, _LOST = 0, 1, 2
_HANDSHAKE_S = 5.0  # the most a handshake step may take (a peer that does not answer: try again)
_PARK_S = 5.0  # the most an acceptor waits for its reader to leave the broken connection
_POKE_S = 1.0  # a lower rank pokes this often while its link is down
_FIRST_POKE_S = 5.0  # ... and this often while its first connection is awaited (one poke starts the dial)
_HANDLERS = 32  # handshakes served at once (more connections wait in the listen backlog)


class _Refused(Exception):
    """The peer's listener refused: its process is gone, or it gave that link up."""


class _Link:
    """The connection to one peer beyond its socket: its generation (0: not made yet), since when
    it is broken (monotonic; 0: up), whether no reader reads it (``parked``: it never connected,
    or its reader has left the broken connection), whether the peer is lost for good (``dead``),
    whether it is read or being made (``reader``: given to a reader thread, or a link thread
    makes it), and how many times it was redialled."""

    __slots__ = ("gen", "broken", "parked", "dead", "reader", "cv", "reconnects", "busy")

    def __init__(self):
        self.gen = 0
        self.broken = 0.0
        self.parked = True
        self.dead = self.reader = False
        self.cv = threading.Condition(threading.Lock())
        self.reconnects = 0
        self.busy = threading.Lock()  # one redial at a time is answered


class _Healer(_MeshBase):
    """The Mesh's part that redials broken connections (see the module)."""

    _links: _PerPeer  # per peer: its _Link
    _heals: bool  # copies are kept: links can heal
    _secret: bytes
    _tls: Any  # this rank's _TLSIdentity under UNICCL_TCP_TLS=1, else None
    _listener: Any  # the socket the lower ranks listen on for redials (None: closed)
    _pid: int
    socks: list
    send_locks: _PerPeer  # per peer: a threading.Lock
    timeout: float
    _kept: Any
    _next_id: list[int]
    _pollers: list  # the reader threads (poller._Poller), made as connections need them
    _poller_of: list[int]  # per peer: the index of the reader thread its connections go to (-1: none yet)
    _polled: int  # peers given a reader thread so far

    def can_heal(self, peer: int) -> bool:
        return self._heals and not self.closed and not self._links[peer].dead and os.getpid() == self._pid

    def can_link(self, peer: int) -> bool:
        """A dial from ``peer`` may be taken: it heals the link, or makes it for the first time."""
        first = self.socks[peer] is None and not self.closed and not self._links[peer].dead
        return self.can_heal(peer) or (first and os.getpid() == self._pid)

    # ------------------------------------------------------------------ first use
    def _start_reader(self, peer: int, stream=None, gen: int = 0) -> None:
        """Have ``peer``'s connection read unless it is (or is being made): ``stream`` (of
        generation ``gen``) from now on, or, None, once the first connection is made (by a
        thread of its own: the higher rank dials, the lower one pokes)."""
        link = self._links[peer]
        with link.cv:
            if link.reader or link.dead or self.closed:
                return
            link.reader = True
        if stream is None:
            _threads.start(self._relink, args=(peer, 0, None), name=f"uniccl-tcp-link{self.rank}-to{peer}")
        else:
            self._poll(peer, stream, gen)

    def _poll(self, peer: int, stream, gen: int) -> None:
        """Give ``stream`` to a reader thread (poller.py): ``peer``'s own, or the next in turn."""
        with self._lock:
            k = self._poller_of[peer]
            if k < 0:
                k = self._poller_of[peer] = self._polled % READERS
                self._polled += 1
            poller = self._pollers[k]
            if poller is None:
                poller = self._pollers[k] = _Poller(self, k)
        poller.add(peer, stream, gen)

    def _relink(self, peer: int, gen: int, exc) -> None:
        """(a thread of its own, while ``peer``'s link is down) Make the connection after
        generation ``gen`` (broken by ``exc``; None: the first one), then have it read."""
        stream, gen = self._redial(peer, gen, exc)
        if stream is not None:
            self._poll(peer, stream, gen)

    def _stream_broke(self, peer: int, gen: int, exc) -> None:
        """(a reader thread) ``peer``'s connection of generation ``gen`` failed with ``exc``
        (it left its reader): heal it in a thread of its own, or report the peer lost."""
        if not self.can_heal(peer):
            self._peer_lost(peer, exc, self._rx[peer].current)
            return
        self._break(peer, gen)
        self._park(peer)
        logger.warning("rank %d: the connection to %s broke (%s); redialling", self.rank, self.where(peer), exc)
        _threads.start(self._relink, args=(peer, gen, exc), name=f"uniccl-tcp-link{self.rank}-to{peer}")

    def _ensure(self, peer: int, deadline) -> None:
        """A send to ``peer`` needs its link: make it if it is not made (its first use) and wait
        for it until ``deadline`` (monotonic; None: no limit): Timeout naming the peer, or the
        error that lost it."""
        self._start_reader(peer)
        link = self._links[peer]
        with link.cv:
            while self.socks[peer] is None and not link.dead and not self.closed:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    why = self._stopped(peer) or "does not answer (its process may be stopped or hung)"
                    limit = getattr(self._tl, "timeout", self.timeout)
                    raise Timeout(
                        f"rank {self.rank} timed out after {limit:g} s connecting to {self.where(peer)}: it {why}",
                        rank=self.rank,
                        missing_ranks=[peer],
                    )
                link.cv.wait(1.0 if left is None else min(left, 1.0))
        if self.socks[peer] is None:
            raise self._dead.get(peer) or RemoteError(
                f"cannot connect to {self.where(peer)}: the connections were closed",
                rank=self.rank,
                remote_rank=peer,
                remote_type="ConnectionError",
            )

    def reconnects(self, peer: int) -> int:
        """Times the connection to ``peer`` broke and was made again."""
        link = self._links.get(peer)  # (a peer never linked: nothing made for it)
        return 0 if link is None else link.reconnects

    def broken_for(self, peer: int) -> float:
        """Seconds the connection to ``peer`` has been down (0: up)."""
        link = self._links.get(peer)
        since = link.broken if link is not None else 0.0
        return time.monotonic() - since if since else 0.0

    def _break(self, peer: int, gen: int) -> None:
        """The connection of generation ``gen`` to ``peer`` broke: shut it, so that its reader and
        any send on it stop at once (nothing if a later generation is up already)."""
        link = self._links[peer]
        with link.cv:
            sock = self.socks[peer]
            if link.gen != gen or sock is None:  # (None: not made yet, nothing to break)
                return
            if not link.broken:
                link.broken = time.monotonic()
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    # -------------------------------------------------------------- the dialling side
    def _redial(self, peer: int, gen: int, exc) -> tuple:
        """(``peer``'s link thread) Dial or poke until generation ``gen`` is followed by a
        newer one: (its stream, its generation), or (None, gen) once the peer is lost (reported).
        ``exc``: why generation ``gen`` broke (None: it is the first connection)."""
        link = self._links[peer]
        deadline = time.monotonic() + self.timeout if self.timeout else None
        delay, attempt = 0.01, gen
        try:
            while True:
                with link.cv:
                    if link.gen > gen:  # healed (by the acceptor's thread, or by ours below)
                        link.parked = False
                        return self._outs[peer].tls or self.socks[peer], link.gen
                if link.dead or self.closed:
                    raise _Refused("the mesh was closed" if self.closed else "it was given up")
                if deadline is not None and time.monotonic() > deadline:
                    raise _Refused(
                        f"it could not be reached{'' if exc is None else ' again'} within {self.timeout:g} s"
                    )
                if self._gone(peer):
                    raise _Refused("its process is gone")
                if peer < self.rank:  # each dial a new generation: one whose answer was lost is not taken again
                    attempt += 1
                    if self._dial(peer, attempt):
                        continue
                    wait = delay
                else:  # once the higher rank heard the poke, it redials: wait for that
                    wait = (_POKE_S if exc is not None else _FIRST_POKE_S) if self._poke(peer, gen) else delay
                # (a dying peer's listener may still take a connection; at a job's first calls many
                # ranks dial at once: spread their tries)
                delay = min(0.5 if exc is not None else 2.0, delay * 2) * random.uniform(0.75, 1.25)
                with link.cv:
                    if link.gen == gen and not link.dead:
                        link.cv.wait(wait)
        except _Refused as why:
            if exc is None:
                self._peer_lost(peer, f"cannot connect to it: {why}")
            else:
                self._peer_lost(peer, f"{exc}; redialling failed: {why}")
            return None, gen

    def _gone(self, peer: int) -> bool:
        """On this host: ``peer``'s process has exited (no longer in /proc, or a zombie), so no
        redial can reach it (elsewhere its listener's refusal says so)."""
        t = self.table[peer]
        return t is not None and t.get("host") == self._host and procs.gone(procs.state(t["pid"], t.get("start")))

    def _park(self, peer: int) -> None:
        """(a reader thread) Leave the broken connection: a message half read waits to come again,
        nothing is awaited or held any more (it all comes again, from the first id not delivered)."""
        rx = self._rx[peer]
        req = rx.current
        if req is not None and not req.done.is_set():
            with self._lock:
                self._posted.setdefault(rx.key, collections.deque()).appendleft(req)
        rx.current, rx.awaiting, rx.tries = None, None, 0
        rx.held.clear()
        if rx.sync:  # a sync asked while a copy was awaited: all it sent before is delivered again first
            rx.sync = False
            self._answer_sync(peer)
        link = self._links[peer]
        with link.cv:
            link.parked = True
            link.cv.notify_all()

    def _connect_to(self, peer: int, kind: int, gen: int):
        """A connection to ``peer``'s listener, the handshake done: (socket, what it answered)."""
        t = self.table[peer]
        if t is None:  # beyond the tree neighbours, its entry comes with the table (Mesh._spread_table)
            self._known.wait(_HANDSHAKE_S)
            t = self.table[peer]
            if t is None:
                return None, None  # (as for a refused dial: tried again until the wait's end)
        try:
            sock = dial(t["addr"], t["port"], _HANDSHAKE_S)
        except ConnectionRefusedError:
            raise _Refused("its listener refused (its process is gone)") from None
        except OSError:
            return None, None
        try:
            nonce = bytearray(16)
            _recv_into(sock, memoryview(nonce))
            head = _RESUME.pack(self.rank, kind, gen, self._rx[peer].next_id)
            sock.sendall(head + hmac.new(self._secret, bytes(nonce) + head, hashlib.sha256).digest())
            answer = bytearray(_ANSWER.size)
            _recv_into(sock, memoryview(answer))
        except (OSError, ConnectionError):
            sock.close()
            return None, None
        return sock, _ANSWER.unpack(answer)

    def _dial(self, peer: int, gen: int) -> bool:
        """(the higher rank's link thread) Connect again as generation ``gen``: True once healed."""
        sock, answer = self._connect_to(peer, _DIAL, gen)
        if sock is None:
            return False
        status, want = answer
        if status == _LOST:
            sock.close()
            raise _Refused("it gave the link up")
        if status != _TAKEN:
            sock.close()
            return False
        stream = self._secure(peer, sock, False)
        return stream is not None and self._adopt_link(peer, sock, gen, want, stream)

    def _poke(self, peer: int, gen: int) -> bool:
        """(the lower rank's link thread) Tell the higher rank that generation ``gen`` broke here:
        True once it answered."""
        sock, answer = self._connect_to(peer, _POKE, gen)
        if sock is None:
            return False
        sock.close()
        if answer[0] == _LOST:
            raise _Refused("it gave the link up")
        return True

    # ----------------------------------------------------------- the acceptor's side
    def _serve_redials(self, listener) -> None:
        """(thread) Answer the redials and pokes of peers, each handshake in a thread of its own."""
        slots = threading.BoundedSemaphore(_HANDLERS)
        while True:
            try:
                sock, _ = listener.accept()
            except OSError:
                return  # closed (the mesh was)
            if not slots.acquire(timeout=_HANDSHAKE_S):  # (the others wait in the listen backlog)
                sock.close()  # a flood: the real peer tries again
                continue
            _threads.start(self._answer, args=(sock, slots), name=f"uniccl-tcp-handshake{self.rank}")

    def _answer(self, sock, slots) -> None:
        try:
            sock.settimeout(_HANDSHAKE_S)
            nonce = secrets.token_bytes(16)
            sock.sendall(nonce)
            raw = bytearray(_RESUME.size + 32)
            _recv_into(sock, memoryview(raw))
            peer, kind, gen, want = _RESUME.unpack_from(raw)
            head = bytes(raw[: _RESUME.size])
            expect = hmac.new(self._secret, nonce + head, hashlib.sha256).digest()
            if not hmac.compare_digest(bytes(raw[_RESUME.size :]), expect) or not 0 <= peer < self.size:
                sock.close()  # not one of ours
                return
            if self.table[peer] is None and not self._known.wait(_HANDSHAKE_S):  # (its entry comes with the table)
                sock.sendall(_ANSWER.pack(_LATER, 0))
                sock.close()
                return
            if peer == self.rank or not self.can_link(peer):
                sock.sendall(_ANSWER.pack(_LOST, 0))
                sock.close()
                return
            link = self._links[peer]
            if kind == _POKE:  # the lower rank needs the link first, or its side broke: the reader dials
                sock.sendall(_ANSWER.pack(_LATER, 0))
                sock.close()
                if self.socks[peer] is None:
                    self._start_reader(peer)
                else:
                    self._break(peer, gen)
                return
            if kind != _DIAL or peer < self.rank or not link.busy.acquire(blocking=False):
                sock.sendall(_ANSWER.pack(_LATER, 0))
                sock.close()
                return
            try:
                self._take_dial(peer, sock, gen, want)
            finally:
                link.busy.release()
        except (OSError, ConnectionError, _Refused):  # (_Refused: given up, its reader reports it)
            sock.close()
        finally:
            slots.release()

    def _take_dial(self, peer: int, sock, gen: int, want: int) -> None:
        """A higher rank dialled as generation ``gen``, expecting message ``want`` next."""
        link = self._links[peer]
        with link.cv:
            current = link.gen
        if gen <= current:
            sock.sendall(_ANSWER.pack(_LATER, 0))  # stale
            sock.close()
            return
        self._break(peer, current)  # it broke on the other side: here too
        with link.cv:
            link.cv.wait_for(lambda: link.parked or link.dead, _PARK_S)
            parked = link.parked and not link.dead
        if not parked:
            sock.sendall(_ANSWER.pack(_LATER, 0))
            sock.close()
            return
        if self._owed(peer, want) is None:  # (checked again under the send lock, then sent)
            sock.sendall(_ANSWER.pack(_LOST, 0))
            sock.close()
            self._give_up(peer, want)
            return
        sock.sendall(_ANSWER.pack(_TAKEN, self._rx[peer].next_id))
        stream = self._secure(peer, sock, True)
        if stream is not None:
            self._adopt_link(peer, sock, gen, want, stream)

    # ------------------------------------------------------------------ both sides
    def _secure(self, peer: int, sock, server_side: bool):
        """Under TLS, the handshake on the new connection (the stream, None if it failed: the
        dialer tries again); plain TCP: False, no stream.  A peer refused at its first connection
        (it holds another certificate than it published) is lost: _Refused."""
        if self._tls is None:
            return False
        try:
            return self._tls.handshake(self, sock, peer, server_side, self._secret)
        except ConnectionRefusedError as exc:
            sock.close()
            if self.socks[peer] is not None:
                logger.warning("rank %d: TLS on the redialled connection to rank %d failed: %s", self.rank, peer, exc)
                return None
            error = InternalError(f"cannot connect to {self.where(peer)}: {exc}", rank=self.rank)
            self._peer_lost(peer, exc, error=error)
            raise _Refused(str(exc)) from None
        except (OSError, ConnectionError) as exc:
            logger.warning("rank %d: TLS on the redialled connection to rank %d failed: %s", self.rank, peer, exc)
            sock.close()
            return None

    def _owed(self, peer: int, want: int) -> list | None:
        """The pieces of every message to ``peer`` from id ``want`` on, as first sent; None when
        one is no longer kept."""
        if want > self._next_id[peer]:
            return None
        owed = [self._kept_message(peer, i) for i in range(want, self._next_id[peer])]
        return None if any(m is None for m in owed) else owed

    def _give_up(self, peer: int, want: int) -> None:
        link = self._links[peer]
        with link.cv:
            link.dead = True
            link.cv.notify_all()
        logger.warning(
            "rank %d: the connection to %s cannot resume: message %d or a later one is no longer kept "
            "(larger than a quarter of UNICCL_TCP_RETAIN_BYTES, or overwritten)",
            self.rank,
            self.where(peer),
            want,
        )

    def _adopt_link(self, peer: int, sock, gen: int, want: int, stream) -> bool:
        """Make ``sock`` (``stream``: its TLS, or False) the connection of generation ``gen`` to
        ``peer``, owing it every kept message from id ``want`` on (sent by its sender thread,
        before anything new)."""
        sock.settimeout(None)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        # a send blocked on a full socket returns every _SLICE_US: sends can keep a deadline
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, struct.pack("ll", 0, _SLICE_US))
        link, out = self._links[peer], self._outs[peer]
        with self.send_locks[peer]:  # no send goes on the old stream any more
            owed = self._owed(peer, want)
            if owed is None:
                sock.close()
                self._give_up(peer, want)
                raise _Refused(f"message {want} or a later one is no longer kept")
            with link.cv:  # the socket and its generation change together (_break reads both)
                old, self.socks[peer], out.sock, out.gen = self.socks[peer], sock, sock, gen
                out.tls = stream or None
                out.pending.clear()  # the rest of a message begun on the old stream: it comes again whole
                for pieces in owed:
                    self._owe(out, pieces, kick=False)
                link.gen, link.broken, link.parked = gen, 0.0, False
                link.reconnects += old is not None
                link.cv.notify_all()
        self._start_reader(peer, stream or sock, gen)  # made here, by a dial, before this rank needed it
        if out.thread is not None or out.pending:  # (a sender thread only where one is needed)
            self._kick(out)
        if old is None:  # the first connection
            return True
        try:
            old.close()
        except OSError:
            pass
        logger.warning(
            "rank %d: the connection to %s is back (redial %d); %d message(s) sent again",
            self.rank,
            self.where(peer),
            gen,
            len(owed),
        )
        return True

    def await_link(self, peer: int, gen: int, deadline) -> bool:
        """(a sender whose write on generation ``gen`` failed) Wait until the link is redialled
        (True) or the peer is lost (False); Timeout when ``deadline`` (monotonic) passes first."""
        self._break(peer, gen)
        link = self._links[peer]
        with link.cv:
            while link.gen <= gen and not link.dead:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise Timeout(
                        f"rank {self.rank}: the connection to {self.where(peer)} broke "
                        f"{self.broken_for(peer):.1f} s ago and is not redialled yet",
                        rank=self.rank,
                        missing_ranks=[peer],
                    )
                link.cv.wait(left)
            return not link.dead
