"""What every launcher of ``uniccl run`` shares: the job's rendezvous, signal forwarding, the
exit status of a stopped job, and the few address helpers (``run`` and ``remote`` import this;
it imports neither)."""

from __future__ import annotations

import signal
import socket
import sys

from ..bootstrap.rendezvous import get_unique_id

TIMEOUT_STATUS = 124  # a job stopped by --timeout, as timeout(1) exits


def free_port() -> int:
    """A TCP port free on this host now (for torch's TCPStore, which rank 0 listens on)."""
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def torch_env(addr: str, port: int | None = None) -> dict:
    """torch's rendezvous names (init_process_group's default env://): rank 0 hosts its store."""
    return {"MASTER_ADDR": addr, "MASTER_PORT": str(port or free_port())}


def host_address(host: str) -> str:
    """``host``'s IPv4 address as this host resolves it (the name itself if it does not)."""
    try:
        return socket.getaddrinfo(host, None, socket.AF_INET)[0][4][0]
    except (OSError, IndexError):
        return host


def say(msg: str) -> None:
    sys.stderr.write(f"uniccl run: {msg}\n")
    sys.stderr.flush()


class Rendezvous:
    """The job's rendezvous, hosted by the launcher so it outlives any rank."""

    def __init__(self, addr: str, timeout: float):
        self.uid = get_unique_id(timeout, host=addr)  # listens on addr only (loopback for a local job)
        self.env = {"UNICCL_RENDEZVOUS": f"{addr}:{self.uid.port}"}
        self.secret = self.uid.secret.hex()


def forward_signals(handler) -> dict:
    old = {}
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        old[sig] = signal.signal(sig, handler)
    return old


def rank_signal(sig: int) -> int:
    """What the ranks get for a signal to the launcher: Ctrl-C stays SIGINT, the rest SIGTERM."""
    return signal.SIGINT if sig == signal.SIGINT else signal.SIGTERM


def finish(state: str, failure, timeout, caught) -> int:
    if state == "done":
        return 0
    if state == "failed":
        return failure.get("exit_status") or 1
    if state == "timeout":
        say(f"timeout: the job did not finish within {timeout:g} s; stopped every rank")
        return TIMEOUT_STATUS
    sig = caught[0] if caught else signal.SIGTERM
    say(f"stopped by {signal.Signals(sig).name}; stopped every rank")
    return 128 + int(sig)
