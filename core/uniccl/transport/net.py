"""Addresses: this host's identity and its address on the route to a peer (TCP transport,
rendezvous and launchers share them)."""

from __future__ import annotations

import os
import socket

from .. import _env


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
