"""What the parts of the :class:`~uniccl.transport.tcp.mesh.Mesh` share: the receive requests
it matches, what it knows of its peers' processes, and :class:`_MeshBase`, which declares the
state the parts (sender, integrity, control, the mesh itself) read in common and the methods
one part calls in another.  :class:`Mesh` combines them; its ``__init__`` sets all the state.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from ...reliability import procs


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


class _PerPeer(dict):
    """Per-peer state made at the peer's first use (``d[peer]`` makes it then), so a rank of a
    job of n ranks pays for the peers it talks to, not for n.  Iterate over a snapshot
    (``list(d.values())``): other threads may add peers meanwhile."""

    __slots__ = ("_make",)

    def __init__(self, make):
        super().__init__()
        self._make = make

    def __missing__(self, peer: int):
        return self.setdefault(peer, self._make(peer))  # (two threads at once: one object wins, both get it)


_SENT = None  # sends complete in the caller's thread: their request is nothing to wait for


class _MeshBase:
    """The state and methods the Mesh's parts use in common (declared here, set by
    ``Mesh.__init__``; what only one part reads, that part declares), and what a rank
    knows of its peers: where they are, whether their process is stopped."""

    rank: int
    size: int
    table: list  # per job rank: what it published through the rendezvous (address, host, pid, ...; None: not known yet)
    _known: threading.Event  # set once the whole table is here (Mesh._spread_table)
    _host: str  # this host (host_key())
    closed: bool
    checksums: bool
    links: list[list[int]] | None
    _outs: _PerPeer  # per peer: _Out, the sending side of its connection
    _lock: threading.Lock  # held while the matching state changes (_posted, _unexpected, _dead, _aborted, ...)
    _posted: dict  # (peer, ctx, tag) -> deque of _Recv
    _dead: dict  # peer -> reason
    _aborted: dict  # context base -> error
    _rx: _PerPeer  # per peer: integrity._RxState, what its reader knows of its stream
    socks: list  # per peer: the socket of its connection (None: not made yet)
    timeout: float  # seconds: the limit of waits outside calls
    _tl: threading.local  # per-thread wait limit (the call running on that thread)

    def where(self, peer: int) -> str:
        t = self.table[peer]
        if t is None:  # (not known yet: the table is still coming, Mesh._spread_table)
            return f"rank {peer}"
        return f"rank {peer} ({t['hostname']} {t['addr']}, pid {t['pid']})"

    def _stopped(self, peer: int) -> str:
        """'is stopped (...)' when ``peer`` runs on this host and its process is stopped (SIGSTOP,
        a debugger), else ''."""
        t = self.table[peer]
        if t is None or t.get("host") != self._host:
            return ""
        state = procs.state(t["pid"], t.get("start"))
        if procs.stopped(state):
            return f"is stopped (state {state} in /proc/{t['pid']}/stat: a SIGSTOP or a debugger)"
        return ""

    if TYPE_CHECKING:  # defined by one part, called by another (Mesh combines them)
        # mesh.Mesh: the matching of messages to receives
        def post(self, peer: int, ctx: int, tag: int, ptr, nbytes: int) -> _Recv: ...

        def _arrived(self, peer, ctx, tag, payload) -> None: ...

        # sender._Sender: the sending side of the connections
        def _kick(self, out, job=None) -> None: ...

        def _notice(self, peer: int, data: bytes) -> None: ...

        def _try_send(self, peer: int, data: bytes, wait: float) -> bool: ...

        # integrity._Integrity: the copies kept for retransmission
        def _checked(self, peer: int, ctx: int, tag: int, ptr, nbytes: int, data, stamp) -> tuple: ...

        def _copy_of(self, peer: int, msg_id: int) -> tuple: ...

        def _kept_message(self, peer: int, msg_id: int) -> list | None: ...

        # control._Control: the answers to a peer's questions
        def _answer_sync(self, peer: int) -> None: ...

        # sender._Sender
        def _owe(self, out, views, kick: bool = True) -> None: ...

        # mesh.Mesh
        def _peer_lost(self, peer: int, exc, current=None, error=None) -> None: ...

        def _steps(self, peer: int, sock): ...

        # heal._Healer: connections made again
        def can_heal(self, peer: int) -> bool: ...

        def await_link(self, peer: int, gen: int, deadline) -> bool: ...

        def _ensure(self, peer: int, deadline) -> None: ...

        def _start_reader(self, peer: int, stream=None, gen: int = 0) -> None: ...

        def _stream_broke(self, peer: int, gen: int, exc) -> None: ...

        def broken_for(self, peer: int) -> float: ...
