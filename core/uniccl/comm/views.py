"""What a communicator shows of itself: the read-only properties, ``stats()`` and the flight
recorder, as :class:`~uniccl.comm.communicator.Communicator` inherits them from
:class:`CommunicatorViews`.  Tools and ``observability`` (status files, metrics, the trace)
read a communicator through these, never through its private attributes.
"""

from __future__ import annotations

import os
import socket
import time
from typing import Any

from .._plugins import Backend
from ..hookspecs import NativeCollectives
from ..observability import telemetry as _tel
from ..observability.flight import FlightRecorder
from ..transport.base import Transport
from .tuner import Tuner


class CommunicatorViews:
    """The communicator's read-only views (its state is set up by ``Communicator._setup``)."""

    rank: int
    size: int
    _backend: Backend
    _native: NativeCollectives | None
    _name: str
    _destroyed: bool
    _seq: int
    _tuner: Tuner
    _telemetry: Any  # observability.telemetry.Telemetry (compiled), or None: off
    _flight: FlightRecorder
    _t: Transport  # TCP or MPI (transport.base: capabilities are its members)
    _engine: Any  # the shared-memory engine, or None

    @property
    def platform(self) -> str:
        """The platform plugin that carries this communicator ("cpu", "nvidia", ...)."""
        return self._backend.name

    @property
    def platform_probe(self) -> dict:
        """What that plugin's probe found on this host (its "devices", "kernels", ...)."""
        return self._backend.record.probe

    @property
    def native_library(self) -> str | None:
        """The vendor collective library (e.g. "nccl") that device buffers of this platform
        go through, or None when none spans the communicator."""
        return self._native.name if self._native is not None else None

    @property
    def name(self) -> str:
        """This communicator's name: "world", "mpi", "uid-<port>", "<parent>.<color>" for
        :meth:`split`, "<parent>.shrink<n>" for :meth:`shrink`; it names the flight
        recorder's file, the metrics' ``communicator`` label and ``stats()["communicator"]``."""
        return self._name

    @property
    def destroyed(self) -> bool:
        """Whether :meth:`destroy` or :meth:`abort` ended this communicator."""
        return self._destroyed

    @property
    def calls(self) -> int:
        """How many collectives this rank has started on this communicator (the next one's
        sequence number; point-to-point calls are not counted)."""
        return self._seq

    @property
    def bootstrap(self) -> str:
        """How the ranks met and exchange control messages: "tcp" or "mpi"."""
        return self._t.name

    @property
    def tuner(self) -> Tuner:
        """What picks each call's transport and algorithm: ``tuner.transport`` ("shm", "tcp",
        "mpi"; "local": one rank) and ``tuner.transport_why`` for the collectives' data,
        ``tuner.choose(collective, nbytes)`` for one call."""
        return self._tuner

    @property
    def telemetry(self) -> Any:
        """This rank's live telemetry counters (UNICCL_TELEMETRY; None: off); read them, or take
        :meth:`stats` for a plain copy."""
        return self._telemetry

    @property
    def mesh(self):
        """The TCP connections (shared by the job's communicators) that this communicator's
        messages travel over: their counters and links; None under MPI."""
        return self._t.mesh

    def waiting_on(self) -> tuple[int, float] | None:
        """(rank, seconds) of the member of this communicator that this process's TCP
        connections are waiting for now, or None (not waiting, not a member, or no TCP)."""
        mesh = self.mesh
        waiting = mesh.waiting if mesh is not None else None
        if waiting is None or waiting[0] not in self._t.members:
            return None
        return self._t.members.index(waiting[0]), max(0.0, time.monotonic() - waiting[1])

    def reconnects(self) -> dict[int, int]:
        """{rank: times the TCP connection to that member was broken and redialled} for the
        members whose connection ever was (empty under MPI, or with no break)."""
        mesh = self.mesh
        if mesh is None:
            return {}
        return {r: n for r, m in enumerate(self._t.members) if (n := mesh.reconnects(m))}

    def last_operation(self) -> list | None:
        """The flight recorder's newest entry (None: recorder off, or no call yet): a list
        indexed by :mod:`uniccl.observability.flight`'s field constants (``OP``, ``SEQ``,
        ``STATE``, ``PATH``, ...): the general path's live entry, which the recorder fills in
        while the call runs, or a copy of a compiled call's row."""
        return self._flight.newest()

    def stats(self) -> dict:
        """This rank's telemetry as a plain dict: per operation (``ops``: calls, bytes, seconds,
        algbw/busbw in GB/s, p50/p99 latency, and the same per message-size bucket under
        ``by_size``), per peer link over TCP (``links``: bytes and seconds sent and received,
        retransmissions, checksum failures, reconnections: the job's connections, shared by its
        communicators), and the integrity counters."""
        out = {
            "communicator": self._name,
            "rank": self.rank,
            "size": self.size,
            "platform": self.platform,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "transport": self._tuner.transport,
            "calls": self._seq,
            "telemetry": self._telemetry is not None,
            "ops": _tel.summary(self._telemetry) if self._telemetry is not None else {},
        }
        mesh = self._t.mesh
        if mesh is not None:
            out.update(mesh.stats)
            out["links"] = {str(p): mesh.link_stats(m) for p, m in enumerate(self._t.members) if p != self.rank}
        if self._engine is not None and not self._engine.closed:
            out.update(self._engine.integrity)
        arrival = self.arrivals()
        if arrival is not None:
            out["arrival"] = arrival
        return out

    def arrivals(self) -> dict | None:
        """Over shared memory, this rank's arrivals at its calls' first rendezvous: in how many it
        was the last (``last``, ``last_share``) and how long it waited for the last rank otherwise
        (``wait_mean_us``, ``wait_p50_us``, ``wait_p99_us``); None without the engine.  Counted in
        the engine at every call (a rank that waits reads the clock as it waits)."""
        engine = self._engine
        if engine is None or engine.closed:
            return None
        return _tel.arrivals(engine.arrivals(), self.size)

    def dump_flight_recorder(self, directory: str | None = None) -> str | None:
        """Write this rank's record of the communicator's last operations as JSON to
        ``directory`` (default $UNICCL_DUMP_DIR); returns the path (None: no directory)."""
        return self._flight.dump(directory, reason="on demand")

    def flight_recorder(self) -> dict:
        """This rank's record of the communicator's last operations (what a dump contains)."""
        return self._flight.snapshot()
