"""The transport interface: what a communicator asks of the transport that moves its bytes
(gloo's ``transport::Pair``/``Device`` split, in one class: a transport is one communicator's
view of its connections).  ``TCPTransport`` and ``MPITransport`` implement it; the
shared-memory engine is the other half, :class:`CollectiveEngine` (whole collectives in one
call), which a communicator on one host uses beside its transport.

What differs between transports is declared as members, never probed: ``can_abort``,
``can_shrink``, ``announces`` and ``mesh``.  A method a transport cannot serve keeps the
default below (a no-op where doing nothing is right, else ``InvalidUsage``).

Requests: ``isend``/``irecv`` return an object only the same transport's ``wait``/``waitall``
and ``finish_p2p`` take.  Buffers are (address, byte count) pairs.
"""

from __future__ import annotations

import abc
from collections.abc import Callable
from typing import Any, Protocol

from .._errors import InvalidUsage


class Transport(abc.ABC):
    name: str  # "tcp" or "mpi": what the flight recorder, traces and telemetry call it
    rank: int  # this rank in the communicator
    size: int
    tag_ub: int  # the largest tag isend/irecv take
    #: peers' waits can be ended at once (abort notices on the wire); without it an aborted
    #: rank's peers find out when their own timeout ends
    can_abort: bool = False
    #: ``shrink`` can rebuild the communicator over the survivors of a dead rank
    can_shrink: bool = False
    #: ``announce`` carries each call's record with its data (so a call with every rank's record
    #: already seen is "light"); else the records go before the data (``records``)
    announces: bool = True
    #: the connections under it, for link telemetry (TCP's mesh); None where the library owns them
    mesh: Any = None
    # per member, what each rank told the rendezvous of itself (native.rank_facts: the first
    # world of a uniccl run job); None: init exchanges them
    facts: list | None = None
    #: with a ``mesh``: the mesh rank of each of this communicator's ranks
    members: list[int]

    # --------------------------------------------------------------- point to point
    @abc.abstractmethod
    def set_timeout(self, seconds: float) -> None:
        """Seconds each wait of the calling thread may take (0: forever)."""

    @abc.abstractmethod
    def isend(self, ptr: int, nbytes: int, peer: int, tag: int, comm=None) -> Any:
        """Start sending ``nbytes`` at ``ptr`` to ``peer`` (``comm``: the p2p context for the user's
        send/recv, else collective traffic); a request for ``wait``."""

    @abc.abstractmethod
    def irecv(self, ptr: int, nbytes: int, peer: int, tag: int, comm=None) -> Any:
        """Start receiving at most ``nbytes`` from ``peer`` into ``ptr``; a request for ``wait``."""

    @abc.abstractmethod
    def wait(self, req) -> None:
        """Until ``req`` completes (``uniccl.Timeout`` naming the peer after the timeout)."""

    @abc.abstractmethod
    def waitall(self, reqs) -> None:
        """Until every request of ``reqs`` completes."""

    @abc.abstractmethod
    def finish_p2p(self, req, peer: int, nbytes: int, op: str, rank: int) -> None:
        """Wait for a user send/recv and check it moved ``nbytes`` (typed error naming ``op``)."""

    # ------------------------------------------------------------ the call record
    @abc.abstractmethod
    def announce(self, seq: int, tag: int, record: bytes, full: bytes, light: bool, mismatched: Callable) -> None:
        """Start call ``seq``: ``record`` (``transport.record``) is what must agree, ``full`` adds
        this rank's error; ``mismatched()`` judges (and raises) once the records differ."""

    @abc.abstractmethod
    def finish(self) -> None:
        """The announced call's data is done: check every record arrived and agreed."""

    @abc.abstractmethod
    def abandon(self) -> None:
        """The announced call failed otherwise (timeout, dead peer): forget its agreement."""

    @abc.abstractmethod
    def records(self) -> list:
        """Every rank's record of the announced call (for the error that names who differs)."""

    @abc.abstractmethod
    def flush(self) -> None:
        """Complete what earlier calls left in flight before the communicator changes (split, free)."""

    # --------------------------------------------------------------- control
    @abc.abstractmethod
    def bcast_obj(self, obj, root: int = 0) -> Any:
        """A picklable object from ``root`` to every rank (set-up, not data)."""

    @abc.abstractmethod
    def allgather_obj(self, obj) -> list:
        """Every rank's picklable object, in rank order."""

    @abc.abstractmethod
    def allgather_array(self, arr, out) -> None:
        """Every rank's numpy array ``arr`` into ``out`` (size x arr), in rank order."""

    @abc.abstractmethod
    def split(self, color: int, key: int) -> Transport | None:
        """The transport of this rank's part of ``Communicator.split`` (None: color < 0)."""

    @abc.abstractmethod
    def host_keys(self) -> list[str]:
        """Per member, what names its host (``net.host_key``): equal keys, one host (collective
        where the transport does not know them already)."""

    @abc.abstractmethod
    def node(self) -> tuple[int, int]:
        """(this rank's index among the ranks of its host, how many ranks its host has)."""

    @abc.abstractmethod
    def free(self) -> None:
        """Release what this communicator holds (its contexts, its duplicated communicators)."""

    def verdict(self):
        """The error this communicator was given up with, here or by a member who told this
        rank (a Timeout naming the ranks waited for, a RemoteError ...), in its own ranks; None
        while it was not (and where the transport hears no such notice: MPI)."""
        return None

    def processes(self) -> list[dict]:
        """Each rank's process: ``host`` (its name), ``pid``, ``start`` (/proc's start time, or
        None) and ``local`` (on this host: its /proc is readable here), in rank order."""
        return []

    # ------------------------------------------------- failures (capabilities above)
    def abort(self, reason: str) -> None:
        """End this communicator's waits here and, with ``can_abort``, on every member at once."""
        return None  # without can_abort: nothing to tell the peers

    def revoke(self, text: str) -> None:
        """Every member's calls end with ``Revoked`` saying ``text``, with ``can_abort`` at once;
        the connections stay for split, shrink and destroy."""
        return None  # without can_abort: the peers learn it from the engine, or not at all

    def watch_revoke(self, hook: Callable[[int, str], object]) -> None:
        """With ``can_abort``: ``hook(peer, text)`` (``peer`` in ``members``) is called from another
        thread as soon as a member's revoke is heard, even while no call runs (held weakly)."""
        return None  # without can_abort: a revoke is learnt from a call's error

    def fail(self, reason: str, missing) -> None:
        """After a timeout, with ``can_abort``: every member's waits end with a Timeout naming
        ``missing`` (this communicator's ranks)."""
        return None  # without can_abort: nothing to tell the peers

    def failed(self, reason: str) -> None:
        """This rank failed mid-call, with ``can_abort``: every member's waits end naming it."""
        return None  # without can_abort: nothing to tell the peers

    def peer_died(self, reason: str, dead: int) -> None:
        """After losing rank ``dead`` mid-call, with ``can_abort``: every member's waits end naming it."""
        return None  # without can_abort: nothing to tell the peers

    def shrink(self, timeout: float) -> Transport:
        """The transport over the survivors of a failure (``can_shrink``)."""
        raise InvalidUsage(
            f"shrink needs a transport that can rebuild itself over the survivors; the {self.name} transport cannot",
            op="shrink",
            rank=self.rank,
        )


class CollectiveEngine(Protocol):
    """Whole collectives in one GIL-free call over shared memory (``transport.shm._shm.ShmEngine``):
    the ranks of one host, beside the communicator's ``Transport``.  Each method takes
    addresses, a count, uniccl's dtype and op codes, like the C engine it wraps."""

    size: int

    def agree(self, header, out) -> bool: ...

    def barrier(self) -> None: ...

    def all_reduce(self, send: int, recv: int, count: int, dtype: int, op: int) -> None: ...

    def close(self) -> None: ...

    def revoke(self, why: str) -> None: ...
