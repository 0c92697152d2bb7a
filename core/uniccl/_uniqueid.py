"""NCCL-style initialisation: ``uid = get_unique_id(); Communicator(uid, rank, size)``.

``get_unique_id`` starts a small rendezvous server in the calling process (as
``ncclGetUniqueId`` starts its bootstrap root); the id carries its address and
a random secret.  Each rank proves it knows the secret (HMAC of a server nonce,
so the secret never crosses the wire), reports its MPI world rank, and gets
every rank's back.  Inside one MPI job the ranks then form their MPI
communicator with ``MPI_Comm_create_group`` over just those world ranks;
otherwise (``uniccl run``'s own launchers, or processes started any other way)
they connect a TCP mesh among themselves (:mod:`uniccl._tcp`).
"""
from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
import socket
import struct
import threading
import time

from ._errors import InvalidArgument, InvalidUsage, Timeout

UID_BYTES = 128  # as NCCL_UNIQUE_ID_BYTES
DEFAULT_TIMEOUT = 120.0


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
    def from_bytes(cls, raw: bytes) -> "UniqueId":
        try:
            port, hlen = struct.unpack_from("!HH", raw)
            host = raw[4:4 + hlen].decode()
            secret = raw[4 + hlen:4 + hlen + 32]
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


def get_unique_id(timeout: float = DEFAULT_TIMEOUT) -> UniqueId:
    """Start a rendezvous for one communicator; share the result with every rank."""
    sock = socket.create_server(("", 0))
    uid = UniqueId(_host_address(), sock.getsockname()[1], secrets.token_bytes(32))
    threading.Thread(target=_serve, args=(sock, uid.secret, timeout), daemon=True,
                     name="uniccl-rendezvous").start()
    return uid


def _serve(sock, secret: bytes, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    clients: dict[int, tuple] = {}
    size = None
    with sock:
        while size is None or len(clients) < size:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                missing = sorted(set(range(size or 0)) - set(clients))
                for conn, _ in clients.values():
                    _reply(conn, {"error": f"ranks {missing} did not join within {timeout:.0f} s"})
                return
            sock.settimeout(remaining)
            try:
                conn, _ = sock.accept()
            except OSError:
                continue
            try:
                conn.settimeout(10)
                nonce = secrets.token_hex(16)
                _send(conn, {"nonce": nonce})
                msg = _recv(conn)
                expect = hmac.new(secret, nonce.encode(), hashlib.sha256).hexdigest()
                if not hmac.compare_digest(str(msg.get("proof", "")), expect):
                    _reply(conn, {"error": "wrong unique id secret"})
                    continue
                rank, nranks = int(msg["rank"]), int(msg["size"])
                problem = None
                if size is not None and nranks != size:
                    problem = f"rank {rank} passed size {nranks}, others passed {size}"
                elif rank in clients:
                    problem = f"rank {rank} joined twice"
                if problem:
                    _reply(conn, {"error": problem})
                    continue
                size = nranks
                clients[rank] = (conn, msg["payload"])
            except (OSError, ValueError, KeyError):
                conn.close()
    table = [clients[r][1] for r in range(size)]
    for conn, _ in clients.values():
        _reply(conn, {"table": table})


def _reply(conn, obj) -> None:
    try:
        _send(conn, obj)
    except OSError:
        pass
    conn.close()


def rendezvous(uid: UniqueId, rank: int, size: int, payload, timeout: float) -> list:
    """Join the rendezvous; return every rank's payload, indexed by rank."""
    deadline = time.monotonic() + timeout
    while True:  # the server may not be listening yet on a slow start
        try:
            sock = socket.create_connection((uid.host, uid.port), timeout=5)
            break
        except OSError as exc:
            if time.monotonic() > deadline:
                raise Timeout(f"cannot reach the rendezvous at {uid.host}:{uid.port}: {exc}",
                              op="init", rank=rank) from None
            time.sleep(0.05)
    with sock:
        sock.settimeout(max(1.0, deadline - time.monotonic()))
        try:
            nonce = _recv(sock)["nonce"]
            proof = hmac.new(uid.secret, nonce.encode(), hashlib.sha256).hexdigest()
            _send(sock, {"proof": proof, "rank": rank, "size": size, "payload": payload})
            answer = _recv(sock)
        except socket.timeout:
            raise Timeout(f"rendezvous at {uid.host}:{uid.port} did not complete within {timeout:.0f} s",
                          op="init", rank=rank) from None
    if "error" in answer:
        raise InvalidUsage(f"rendezvous failed: {answer['error']}", op="init", rank=rank)
    return answer["table"]


def transport_from_unique_id(uid, rank: int, size: int, timeout: float | None):
    """The transport of the ranks that joined ``uid``: MPI inside an MPI job, else TCP."""
    from ._init import unique_id_bootstrap

    if isinstance(uid, (bytes, bytearray)):
        uid = UniqueId.from_bytes(bytes(uid))
    if not isinstance(uid, UniqueId):
        raise InvalidArgument(f"expected a uniccl.UniqueId, got {type(uid).__name__}", op="init",
                              argument="uid")
    for name, value in (("size", size), ("rank", rank)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise InvalidArgument(f"must be an int, got {value!r}", op="init", argument=name)
    if size < 1 or not 0 <= rank < size:
        raise InvalidArgument(f"rank must be in [0, size) with size >= 1, got rank={rank} size={size}",
                              op="init", rank=rank, argument="rank")
    timeout = DEFAULT_TIMEOUT if timeout is None else timeout
    if unique_id_bootstrap() == "tcp":
        from ._tcp import Mesh, TCPTransport, derive_context

        return TCPTransport(Mesh(uid, rank, size, timeout), list(range(size)), derive_context(1, 0, 0))
    from ._mpi import MPITransport, mpi

    MPI = mpi()
    world = MPI.COMM_WORLD
    table = rendezvous(uid, rank, size, {"world_rank": world.Get_rank(), "world_size": world.Get_size(),
                                         "host": socket.gethostname()}, timeout)
    world_ranks = [t["world_rank"] for t in table]
    if len(set(world_ranks)) != size or len({t["world_size"] for t in table}) != 1:
        raise InvalidUsage("the ranks of this unique id are not processes of one MPI job (world ranks "
                           f"{world_ranks}); start them with one launcher (mpiexec or uniccl run)",
                           op="init", rank=rank)
    group = world.Get_group().Incl(world_ranks)
    try:
        comm = world.Create_group(group, tag=0)
    finally:
        group.Free()
    try:
        return MPITransport(comm)
    finally:
        comm.Free()
