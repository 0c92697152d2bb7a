"""NCCL-style initialisation: ``uid = get_unique_id(); Communicator(uid, rank, size)``.

``get_unique_id`` starts a small rendezvous server in the calling process (as
``ncclGetUniqueId`` starts its bootstrap root); the id carries its address and
a random secret.  Each rank proves it knows the secret (HMAC of a server nonce,
so the secret never crosses the wire), reports its MPI world rank, and gets
every rank's back.  Inside one MPI job the ranks then form their MPI
communicator with ``MPI_Comm_create_group`` over just those world ranks;
otherwise (``uniccl run``'s own launchers, or processes started any other way)
they connect a TCP mesh among themselves (:mod:`uniccl.transport.tcp`).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
import selectors
import socket
import struct
import time
from typing import Literal, NamedTuple, overload

from .. import _threads
from .._env import DEFAULT_TIMEOUT
from .._errors import InvalidArgument, InvalidUsage, Timeout

UID_BYTES = 128  # as NCCL_UNIQUE_ID_BYTES


class UniqueId:
    """Opaque, picklable id of one rendezvous; ``bytes(uid)`` is 128 bytes."""

    __slots__ = ("host", "port", "secret")

    def __init__(self, host: str, port: int, secret: bytes):
        self.host, self.port, self.secret = host, port, secret

    def __bytes__(self) -> bytes:
        host = self.host.encode()
        raw = struct.pack("!HH", self.port, len(host)) + host + self.secret
        return raw.ljust(UID_BYTES, b"\0")

    @classmethod
    def from_bytes(cls, raw: bytes) -> UniqueId:
        try:
            port, hlen = struct.unpack_from("!HH", raw)
            host = raw[4 : 4 + hlen].decode()
            secret = raw[4 + hlen : 4 + hlen + 32]
        except (struct.error, UnicodeDecodeError) as exc:
            raise InvalidArgument(f"not a uniccl unique id: {exc}", op="init", argument="uid") from None
        if len(raw) != UID_BYTES or len(secret) != 32:
            raise InvalidArgument(f"a unique id has {UID_BYTES} bytes, got {len(raw)}", op="init", argument="uid")
        return cls(host, port, secret)

    def __reduce__(self):
        return (UniqueId.from_bytes, (bytes(self),))

    def __repr__(self):
        return f"<uniccl.UniqueId {self.host}:{self.port}>"


def _host_address() -> str:
    host = os.environ.get("UNICCL_HOST_ADDR")
    if host:
        return host
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"


def _send(sock, obj) -> None:
    data = json.dumps(obj).encode()
    sock.sendall(struct.pack("!I", len(data)) + data)


def _recv(sock):
    head = _recv_exact(sock, 4)
    return json.loads(_recv_exact(sock, struct.unpack("!I", head)[0]))


def _recv_exact(sock, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("peer closed the connection")
        buf += chunk
    return bytes(buf)


# Limits that keep the rendezvous serving the job whatever else connects to its port (any
# local user can): a client that has not proved the secret within HANDSHAKE_S, or sends a
# frame over MAX_FRAME bytes or anything malformed, is dropped without effect on the job.
HANDSHAKE_S = 10.0
MAX_FRAME = 1 << 20  # a rank's payload is a few hundred bytes of JSON
# unauthenticated connections held at once (more: the oldest are dropped); above the job sizes
# one machine may host at once, whose ranks all connect together and wait in the backlog
MAX_PENDING = 4096
_BACKLOG = 65535  # connections the kernel queues before the server accepts them


def bind_address(host: str) -> str:
    """Listen only where the ranks reach us: on the advertised address (loopback for a job of
    one host), or on every interface when that address is not one of this machine's (NAT)."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind((host, 0))
        return host
    except OSError:
        return ""


def dial(host: str, port: int, timeout: float) -> socket.socket:
    """A TCP connection to ``host:port``.  A numeric address is connected to directly:
    ``socket.create_connection`` would go through getaddrinfo, whose first use in a process
    imports the idna codec (several ms of a rank's init, for an address that needs no lookup)."""
    for family in (socket.AF_INET, socket.AF_INET6):
        try:
            socket.inet_pton(family, host)
        except (OSError, ValueError):
            continue
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.settimeout(timeout)
            sock.connect((host, port))
        except BaseException:
            sock.close()
            raise
        return sock
    return socket.create_connection((host, port), timeout=timeout)


def torch_job_host() -> str | None:
    """Loopback when torch's launcher says every rank of the job is on this host
    (LOCAL_WORLD_SIZE == WORLD_SIZE, as torchrun sets them): its rendezvous then listens
    there only; None (this host's address) otherwise."""
    local, world = os.environ.get("LOCAL_WORLD_SIZE"), os.environ.get("WORLD_SIZE")
    return "127.0.0.1" if local and local == world and not os.environ.get("UNICCL_HOST_ADDR") else None


def get_unique_id(timeout: float = DEFAULT_TIMEOUT, *, host: str | None = None) -> UniqueId:
    """Start a rendezvous for one communicator; share the result with every rank.

    ``host``: the address the ranks reach it at (default $UNICCL_HOST_ADDR, else this
    host's); it listens on that address only."""
    host = host or _host_address()
    # every rank connects at once: a backlog shorter than the job drops SYNs, whose retries
    # back off 1, 3, 7 s (a 1024-rank job on one machine idled 10 s so); the kernel caps it
    # at net.core.somaxconn
    sock = socket.create_server((bind_address(host), 0), backlog=_BACKLOG)
    uid = UniqueId(host, sock.getsockname()[1], secrets.token_bytes(32))
    _threads.start(_Server(sock, uid.secret, timeout).serve, name="uniccl-rendezvous")
    return uid


class _Conn:
    """One client of the rendezvous: its socket, what it has sent so far, its deadline."""

    __slots__ = ("sock", "nonce", "inbuf", "outbuf", "deadline", "rank", "payload", "spread", "every")

    def __init__(self, sock, nonce: str, deadline: float):
        self.sock, self.nonce, self.deadline = sock, nonce, deadline
        self.inbuf = bytearray()
        self.outbuf = bytearray(_frame({"nonce": nonce}))
        self.rank = self.payload = None  # set once it has proved the secret
        self.spread = False  # it takes its tree neighbours' entries, the table coming down the tree
        self.every: list = []  # ... and these fields of every rank's entry, at once (_every)


def _frame(obj) -> bytes:
    return _framed(json.dumps(obj))


def _framed(text: str) -> bytes:
    data = text.encode()
    return struct.pack("!I", len(data)) + data


class _Server:
    """The rendezvous of one unique id, serving every client at once from one thread (a
    selector, non-blocking sockets): nothing a client does or fails to do holds up another."""

    def __init__(self, sock, secret: bytes, timeout: float):
        self.sock, self.secret = sock, secret
        self.deadline = time.monotonic() + timeout
        self.timeout = timeout
        self.size = None
        self.ranks: dict[int, _Conn] = {}  # rank -> its authenticated connection
        self.spoilt: str | None = None  # a proved rank passed another size: every rank is told this
        self.sel = selectors.DefaultSelector()
        # socket -> its unproved connection, oldest first (deadlines are set at accept, so they ascend)
        self.pending: dict = {}

    def serve(self) -> None:
        try:
            self._loop()
        except Exception as exc:  # never silently: a rank then times out with this reason logged
            from ..observability.log import logger

            logger.warning("uniccl rendezvous stopped: %r", exc)
        finally:
            self.sel.close()
            self.sock.close()

    def _loop(self) -> None:
        self.sock.setblocking(False)
        self.sel.register(self.sock, selectors.EVENT_READ, None)
        while self.size is None or len(self.ranks) < self.size:
            if self.spoilt is not None:
                self._answer_all({"error": self.spoilt})
                return
            now = time.monotonic()
            if now >= self.deadline:
                missing = sorted(set(range(self.size or 0)) - set(self.ranks))
                self._answer_all({"error": f"ranks {missing} did not join within {self.timeout:.0f} s"})
                return
            # the unproved clients in the order they came, so by deadline: the expired ones lead
            while self.pending and next(iter(self.pending.values())).deadline <= now:
                self._drop(next(iter(self.pending.values())))  # a slow or silent client: its time is up
            wait = self.deadline - now
            if self.pending:
                wait = min(wait, next(iter(self.pending.values())).deadline - now)
            for key, events in self.sel.select(max(0.0, min(wait, 1.0))):
                if key.data is None:
                    self._accept()
                else:
                    self._service(key.data, events)
        table = [self.ranks[r].payload for r in range(self.size)]
        if len({c.spread for c in self.ranks.values()}) > 1:
            self._answer_all({"error": "the ranks joined for different transports (TCP and MPI)"})
        elif self.ranks[0].spread:  # (a TCP mesh) rank 0 the table, the others their tree neighbours
            n = self.size
            # each entry encoded once, each answer joined from them (this thread shares the
            # machine with the ranks: its CPU per answer is what a thousand of them wait for)
            entries = [json.dumps(e) for e in table]
            tail = ', "every": ' + json.dumps(_every(table, self.ranks[0].every)) + "}"

            def answer(r: int) -> bytes:
                if r == 0:
                    return _framed('{"table": [' + ", ".join(entries) + "]}")
                near = ", ".join(f'"{p}": {entries[p]}' for p in (tree_parent(r), *tree_children(r, n)))
                return _framed('{"peers": {' + near + "}" + tail)

            self._answer_all(answer, encoded=True)
        else:
            self._answer_all({"table": table})

    def _accept(self) -> None:
        """Every connection waiting in the backlog (a job's ranks come at once: one wakeup for
        many), each sent its nonce at once (a few bytes into an empty socket buffer)."""
        for _ in range(MAX_PENDING):
            try:
                sock, _ = self.sock.accept()
            except OSError:  # (BlockingIOError: none left)
                return
            if len(self.pending) >= MAX_PENDING:  # a flood: the oldest unproved client makes room
                self._drop(next(iter(self.pending.values())))
            sock.setblocking(False)
            conn = _Conn(sock, secrets.token_hex(16), min(self.deadline, time.monotonic() + HANDSHAKE_S))
            try:
                del conn.outbuf[: sock.send(conn.outbuf)]
            except OSError:
                sock.close()
                continue
            self.sel.register(sock, selectors.EVENT_READ | (selectors.EVENT_WRITE if conn.outbuf else 0), conn)
            self.pending[sock] = conn

    def _drop(self, conn: _Conn, answer=None) -> None:
        """Forget ``conn``; tell it ``answer`` first (a best-effort reply, never waited on)."""
        self.pending.pop(conn.sock, None)
        try:
            self.sel.unregister(conn.sock)
        except (KeyError, ValueError):
            pass
        if answer is not None:
            try:
                conn.sock.send(_frame(answer))  # non-blocking: a client that does not read loses it
            except OSError:
                pass
        conn.sock.close()

    def _service(self, conn: _Conn, events: int) -> None:
        try:
            if events & selectors.EVENT_WRITE and conn.outbuf:
                sent = conn.sock.send(conn.outbuf)
                del conn.outbuf[:sent]
                if not conn.outbuf:
                    self.sel.modify(conn.sock, selectors.EVENT_READ, conn)
            if events & selectors.EVENT_READ:
                chunk = conn.sock.recv(65536)
                if not chunk:
                    raise ConnectionError("closed")
                if conn.rank is not None:
                    raise ConnectionError("an authenticated rank sends nothing more")
                conn.inbuf += chunk
                if len(conn.inbuf) >= 4:
                    (length,) = struct.unpack_from("!I", conn.inbuf)
                    if length > MAX_FRAME:
                        raise ValueError(f"frame of {length} bytes")
                    if len(conn.inbuf) >= 4 + length:
                        self._hello(conn, json.loads(conn.inbuf[4 : 4 + length]))
        except (OSError, ValueError, TypeError, KeyError) as exc:
            if conn.rank is not None:  # a joined rank went away: it will not get the table
                from ..observability.log import logger

                logger.warning("uniccl rendezvous: rank %d left before every rank joined: %r", conn.rank, exc)
                del self.ranks[conn.rank]
            self._drop(conn)

    def _hello(self, conn: _Conn, msg) -> None:
        """A client's one message: the proof, its rank and size, its payload.  A wrong proof
        or shape drops it; a proved rank with a wrong size or a rank taken is told why."""
        if not isinstance(msg, dict):
            raise ValueError("not a JSON object")
        expect = hmac.new(self.secret, conn.nonce.encode(), hashlib.sha256).hexdigest()
        proof = msg.get("proof")
        if not isinstance(proof, str) or not hmac.compare_digest(proof.encode(), expect.encode()):
            self._drop(conn, {"error": "wrong unique id secret"})  # no effect on the job
            return
        rank, nranks = msg.get("rank"), msg.get("size")
        if (
            not all(isinstance(v, int) and not isinstance(v, bool) for v in (rank, nranks))
            or not 0 <= rank < nranks
            or "payload" not in msg
        ):
            self._refuse(conn, f"malformed join (rank {rank!r}, size {nranks!r})")
            return
        if self.size is not None and nranks != self.size:  # a bug in the job: no rank waits for the others
            others = sorted(self.ranks)
            self.spoilt = (
                f"the ranks passed different sizes: rank {rank} passed {nranks}, "
                f"rank{'s' if len(others) > 1 else ''} {', '.join(map(str, others))} passed {self.size}"
            )
            self._refuse(conn, self.spoilt)
            return
        if rank in self.ranks:
            self._refuse(conn, f"rank {rank} joined twice")
            return
        self.size = nranks
        del self.pending[conn.sock]  # proved: no deadline any more
        conn.rank, conn.payload, conn.spread = rank, msg["payload"], msg.get("spread") is True
        every = msg.get("every")
        conn.every = [f for f in every if isinstance(f, str)] if isinstance(every, list) else []
        self.ranks[rank] = conn

    def _refuse(self, conn: _Conn, why: str) -> None:
        self._drop(conn, {"error": why})

    def _answer_all(self, answer, encoded: bool = False) -> None:
        """``answer`` (the table, or the error; a function of the rank: each its own, ``encoded``:
        its framed bytes) to every joined rank, all at once (non-blocking writes from this
        thread), within HANDSHAKE_S."""
        for key in list(self.sel.get_map().values()):  # no one else is served any more
            if key.data is None or key.data.rank is None:
                self.sel.unregister(key.fileobj)
                if key.data is not None:
                    key.data.sock.close()
        shared = None if callable(answer) else memoryview(_frame(answer))  # (encoded once)
        left = {}
        for conn in self.ranks.values():
            if shared is not None:
                buf = shared
            else:
                buf = memoryview(answer(conn.rank) if encoded else _frame(answer(conn.rank)))
            try:  # at once: most answers fit the socket's buffer whole
                buf = buf[conn.sock.send(buf) :]
            except OSError:  # gone: it will not get the answer
                buf = memoryview(b"")
            if buf:
                conn.outbuf = buf
                self.sel.modify(conn.sock, selectors.EVENT_WRITE, conn)
                left[conn.rank] = conn
            else:
                self.sel.unregister(conn.sock)
                conn.sock.close()
        deadline = time.monotonic() + HANDSHAKE_S
        while left and time.monotonic() < deadline:
            for key, _ in self.sel.select(max(0.0, min(1.0, deadline - time.monotonic()))):
                conn = key.data
                try:
                    conn.outbuf = conn.outbuf[conn.sock.send(conn.outbuf) :]
                except OSError:  # gone: it will not get the answer
                    conn.outbuf = memoryview(b"")
                if not conn.outbuf:
                    del left[conn.rank]
                    self.sel.unregister(conn.sock)
                    conn.sock.close()
        for conn in left.values():  # a rank that did not read its answer within HANDSHAKE_S
            self.sel.unregister(conn.sock)
            conn.sock.close()


def _every(table: list, fields: list) -> dict:
    """``fields`` of every entry of ``table``, compactly: {field: [its distinct values, the index
    of each rank's value]}, the index list one number when every rank has the same value (a
    job's ranks share a few hosts and one plugin: O(n) bytes per rank at most, O(1) mostly)."""
    out = {}
    for f in fields:
        keys = [json.dumps(e.get(f) if isinstance(e, dict) else None, sort_keys=True) for e in table]
        index: dict = {}
        of = [index.setdefault(k, len(index)) for k in keys]
        out[f] = [[json.loads(k) for k in index], of[0] if len(index) == 1 else of]
    return out


def _every_of(packed: dict, n: int) -> dict:
    """:func:`_every`'s answer as {field: the value of each of the n ranks}."""
    out = {}
    for f, (values, of) in packed.items():
        out[f] = [values[of]] * n if isinstance(of, int) else [values[i] for i in of]
    return out


class Spread(NamedTuple):
    """What a TCP mesh's rank gets from the rendezvous (``rendezvous(spread=True)``)."""

    entries: list | dict  # rank 0: every rank's payload; another: {rank: payload} of its tree neighbours
    every: dict  # {field: the value of each rank} of the fields asked for (``every=``)


def tree_parent(rank: int) -> int:
    """The parent of ``rank`` (> 0) in the binomial tree rooted at rank 0: rank without its
    lowest set bit (the tree of TCPTransport.bcast_obj, and of the table's spread: Mesh)."""
    return rank & (rank - 1)


def tree_children(rank: int, n: int) -> list[int]:
    """The children of ``rank`` in that tree of ``n`` ranks: rank + 2^k below its lowest set bit."""
    out, mask = [], 1
    while mask < n and not rank & mask:
        if rank + mask < n:
            out.append(rank + mask)
        mask <<= 1
    return out


@overload
def rendezvous(
    uid: UniqueId, rank: int, size: int, payload, timeout: float, spread: Literal[False] = ..., every: tuple = ...
) -> list: ...
@overload
def rendezvous(
    uid: UniqueId, rank: int, size: int, payload, timeout: float, spread: Literal[True], every: tuple = ...
) -> Spread: ...
def rendezvous(
    uid: UniqueId, rank: int, size: int, payload, timeout: float, spread: bool = False, every: tuple = ()
) -> list | Spread:
    """Join the rendezvous; return every rank's payload, indexed by rank.  ``spread`` (a TCP
    mesh, whose ranks pass the table down the binomial tree rooted at rank 0 themselves): a
    :class:`Spread`, where rank 0 gets the table, every other rank {rank: payload} of its parent
    and children only, and every rank the payloads' fields ``every`` of every rank (compactly),
    so the server sends O(n log n) bytes, not n tables."""
    deadline = time.monotonic() + timeout
    while True:  # the server may not be listening yet on a slow start, or may have shed us in a flood
        try:
            sock = dial(uid.host, uid.port, 5)
        except OSError as exc:
            if time.monotonic() > deadline:
                raise Timeout(
                    f"cannot reach the rendezvous at {uid.host}:{uid.port}: {exc}", op="init", rank=rank
                ) from None
            time.sleep(0.05)
            continue
        with sock:
            sock.settimeout(max(1.0, min(HANDSHAKE_S, deadline - time.monotonic())))
            try:
                nonce = _recv(sock)["nonce"]
            except (OSError, ValueError, KeyError):  # dropped before the handshake began: again
                if time.monotonic() > deadline:
                    raise Timeout(
                        f"the rendezvous at {uid.host}:{uid.port} did not answer within {timeout:.0f} s",
                        op="init",
                        rank=rank,
                    ) from None
                time.sleep(0.05)
                continue
            try:
                proof = hmac.new(uid.secret, nonce.encode(), hashlib.sha256).hexdigest()
                hello = {"proof": proof, "rank": rank, "size": size, "payload": payload}
                if spread:
                    hello["spread"], hello["every"] = True, list(every)
                _send(sock, hello)
                sock.settimeout(max(1.0, deadline - time.monotonic()))
                answer = _recv(sock)
            except TimeoutError:
                raise Timeout(
                    f"rendezvous at {uid.host}:{uid.port} did not complete within {timeout:.0f} s", op="init", rank=rank
                ) from None
            except (OSError, ValueError) as exc:
                if time.monotonic() < deadline:  # shed as an unproved client in a flood: again
                    time.sleep(0.05)
                    continue
                raise InvalidUsage(
                    f"the rendezvous at {uid.host}:{uid.port} closed the connection: {exc}", op="init", rank=rank
                ) from None
        break
    if "error" in answer:
        raise InvalidUsage(f"rendezvous failed: {answer['error']}", op="init", rank=rank)
    if "peers" in answer:
        return Spread({int(p): entry for p, entry in answer["peers"].items()}, _every_of(answer["every"], size))
    if spread:
        table = answer["table"]
        return Spread(table, {f: [e.get(f) for e in table] for f in every})
    return answer["table"]


def init_wait(timeout: float | None) -> float:
    """Seconds the set-up may wait for the other ranks, from a communicator's ``timeout``:
    None the default, 0 no limit (as for calls; 1e9 s, the largest timeout accepted)."""
    if timeout is None:
        return DEFAULT_TIMEOUT
    return 1e9 if timeout == 0 else timeout
