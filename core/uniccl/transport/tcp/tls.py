"""TLS for the TCP mesh (``UNICCL_TCP_TLS=1``): every connection is TLS 1.3 (Python's ``ssl``
over memory BIOs, :class:`_TLS`) between ephemeral self-signed certificates, each rank's
published through the rendezvous and pinned by its SHA-256 on the other side, and bound to
the job secret by an HMAC over both fingerprints (see :class:`_TLSIdentity`).
"""

from __future__ import annotations

import hashlib
import hmac
import os
import threading

from ..._errors import PlatformUnavailable
from .base import _MeshBase
from .wire import _recv_into

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

    def recv_into(self, view, nbytes: int = 0, flags: int = 0) -> int:
        """As a socket's (``nbytes`` ignored): MSG_DONTWAIT raises BlockingIOError when no
        whole record has come yet."""
        while True:
            with self.lock:
                try:
                    return self.obj.read(len(view), view)
                except self._want:  # a record is not all here yet
                    pass
            got = self.sock.recv_into(self._buf, 0, flags)
            if not got:
                return 0
            with self.lock:
                self.inc.write(self._buf[:got])

    def buffered(self) -> bool:
        """Bytes came from the socket that no read has taken yet (a reader must not wait for
        the socket before it takes them)."""
        with self.lock:
            return bool(self.inc.pending or self.obj.pending())

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

    def handshake(self, mesh: _MeshBase, sock, peer: int, server_side: bool, secret: bytes) -> _TLS:
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
