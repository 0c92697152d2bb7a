"""The Communicator: argument checks, cross-rank agreement, execution.

Every collective goes through three steps:
1. *plan* (caller's thread): convert and check the arguments locally.  A bad
   argument does not raise yet: it is recorded in the plan.
2. *agree* (all ranks): a tiny allgather of each rank's call header (ok/error,
   operation, dtype, count, op, root).  If any rank's arguments were bad, every
   rank raises (the culprit its own error, the others ``RemoteError`` naming it);
   if the headers disagree, every rank raises ``InvalidUsage`` naming both sides.
   So bad input never leaves a peer hanging.
3. *run*: the algorithm moves and reduces the data.
Async operations run the same steps on the communicator's in-order executor.
"""

from __future__ import annotations

import functools
import os
import pickle
import socket
import struct
import sys
import threading
import time
import zlib
from collections.abc import Callable
from time import perf_counter_ns
from typing import Any, cast

import numpy as np

from .. import _env
from .._errors import InvalidArgument, InvalidUsage, RemoteError, Timeout, UnicclError
from .._plugins import manager
from .._types import FLOATING, DType, MemcpyKind, ReduceOp, dtype_name
from ..hookspecs import NativeCollectives
from ..observability import flight as _fl
from ..observability import log as _log
from ..observability import metrics as _metrics
from ..observability import status as _status
from ..observability import telemetry as _tel
from ..observability import trace as _trace
from ..observability.flight import FlightRecorder
from ..observability.log import configure as configure_logging
from ..observability.log import logger
from ..reliability import faults as _faults
from ..reliability.timeout import check_timeout as _check_timeout
from ..reliability.timeout import default_timeout
from ..transport.mpi import MPITransport
from ..transport.shm.attach import shm_attach as _shm_attach
from . import algorithms as alg
from . import checks as chk
from . import device as _device
from . import group as _group
from . import staged_reduce as _staged_reduce
from .executor import SerialExecutor, Work
from .tuner import Tuner

#: color for ``split`` meaning "not in any new communicator" (returns None).
UNDEFINED = -1

_COLL_IDS = {
    name: i
    for i, name in enumerate(
        (
            "barrier",
            "all_reduce",
            "reduce",
            "broadcast",
            "all_gather",
            "reduce_scatter",
            "all_to_all",
            "gather",
            "scatter",
        )
    )
}
_COLL_NAMES = {i: n for n, i in _COLL_IDS.items()}
# Header fields every rank must agree on, per collective (indexes into the header).
_H_ERR, _H_COLL, _H_DTYPE, _H_COUNT, _H_OP, _H_ROOT, _H_NATIVE, _H_DEVRED = range(8)
HEADER_WORDS = 8  # the record the shm engine exchanges
_RING_ORDER = -2  # a reduce_scatter's root field when it combines in gloo's ring order
_SHM_RING_ORDER = 0x100  # ... and the flag on its op for the shm engine (shm_engine.h UC_SHM_RING_ORDER)
# _H_NATIVE: the vendor library this rank would run the call with (0: none); _H_DEVRED: 1 when
# this rank would reduce staged device buffers with its kernels.  Ranks of a mixed-vendor job
# may differ in both: a path is taken only when every rank asks for the same one.
_FIELD_NAMES = {_H_DTYPE: "dtype", _H_COUNT: "count", _H_OP: "op", _H_ROOT: "root"}
_AGREE = {
    "barrier": (),
    "all_reduce": (_H_DTYPE, _H_COUNT, _H_OP),
    "reduce": (_H_DTYPE, _H_COUNT, _H_OP, _H_ROOT),
    "broadcast": (_H_DTYPE, _H_COUNT, _H_ROOT),
    "all_gather": (_H_DTYPE, _H_COUNT),
    "reduce_scatter": (_H_DTYPE, _H_COUNT, _H_OP, _H_ROOT),  # root: -1, or _RING_ORDER
    "all_to_all": (_H_DTYPE, _H_COUNT),
    "gather": (_H_DTYPE, _H_COUNT, _H_ROOT),
    "scatter": (_H_DTYPE, _H_COUNT, _H_ROOT),
}
_RECORD = struct.Struct(f"<{HEADER_WORDS}q")  # a call's record as bytes (TCP: fields not agreed on are -1)
# Algorithms over which the stamps of a TCP call reach every rank (see TCPTransport.announce).
_COVERING = {
    "all_reduce": ("ring", "recursive_doubling"),
    "all_gather": ("ring",),
    "reduce_scatter": ("ring",),
    "all_to_all": ("pairwise",),
}


class Plan:
    """A checked call, ready to run (or carrying the error that its checks found)."""

    __slots__ = (
        "name",
        "dtype",
        "count",
        "op",
        "root",
        "run",
        "shm",
        "nbytes",
        "error",
        "p2p",
        "post",
        "finish",
        "staged",
        "native",
        "args",
        "timeout",
        "entry",
        "shm_agreed",
    )

    def __init__(self, name, dtype=-1, count=-1, op=-1, root=-1, run=None, shm=None, nbytes=0, p2p=False):
        self.name, self.dtype, self.count, self.op, self.root = name, dtype, count, op, root
        self.run = run  # run(OpContext): point-to-point algorithms (and the size-1 case)
        self.shm = shm  # shm(engine): the same collective on the shared-memory engine
        self.shm_agreed = None  # shm_agreed(engine) -> (agreed, result): the agreement rides on the data
        self.nbytes = nbytes  # what the tuner decides on
        self.error, self.p2p = None, p2p
        self.post = None  # point-to-point only: start the transfer, return its request
        self.finish = None  # ... and complete it
        self.staged = None  # device buffers seen through host mirrors (_device.Staged)
        self.native = None  # point-to-point through this vendor library (NativeNccl)
        self.args = ()  # the caller's arguments (the hierarchical path re-issues the call)
        self.timeout = None  # seconds (None: the communicator's)
        self.entry = None  # its flight-recorder entry


class Communicator:
    """A group of ranks that run collectives together.

    Make one with :func:`uniccl.init` (the launcher's world), :meth:`from_mpi`,
    :meth:`split`, or NCCL-style ``Communicator(uid, rank, size)`` with a
    :func:`uniccl.get_unique_id` shared by the caller.
    """

    # set in _setup
    _timeout_set: float | None  # what the transports were last told
    _native: NativeCollectives | None  # the vendor library's collectives (None: none)
    _native_comm: int | None  # its communicator
    _hier: tuple[Communicator, Communicator | None] | None  # (vendor group, leaders or None)
    _announced: tuple[Plan, int] | None  # (plan, seq) of the running announced call

    def __init__(self, uid, rank: int, size: int, *, platform: str | None = None, timeout: float | None = None):
        from ..transport.factory import transport_from_unique_id

        self._setup(
            transport_from_unique_id(uid, rank, size, timeout),
            platform,
            timeout,
            f"uid-{uid.port if hasattr(uid, 'port') else 0}",
        )

    @classmethod
    def from_mpi(cls, mpi_comm, *, platform: str | None = None, timeout: float | None = None) -> Communicator:
        """A communicator over the ranks of an mpi4py communicator (which is duplicated,
        so the caller's keeps working independently)."""
        return cls._over(MPITransport(mpi_comm), platform, timeout, "mpi")

    @classmethod
    def _over(
        cls, transport, platform: str | None = None, timeout: float | None = None, name: str = "world"
    ) -> Communicator:
        self = cls.__new__(cls)
        self._setup(transport, platform, timeout, name)
        return self

    def _setup(self, transport, platform, timeout=None, name="world") -> None:
        """Take ownership of ``transport`` (MPITransport or TCPTransport).  ``timeout``: the
        seconds each call may wait for its peers (None: UNICCL_TIMEOUT, else DEFAULT_TIMEOUT)."""
        _env.check_all()  # every UNICCL_* variable set: a bad value is an InvalidArgument here, at startup
        # (no rank yet: None, which check_timeout's ``rank: int`` does not admit, outside this package)
        self.timeout = default_timeout() if timeout is None else _check_timeout(timeout, "init", None)
        self._timeout_set = None  # what the transports were last told
        mgr = manager()
        record, why = mgr.choose(platform)
        self._backend = mgr.backend(record)
        # host memory work (scratch, host reductions, staged mirrors' algorithms) is the cpu
        # plugin's even when a device platform carries the communicator
        self._hostb = self._backend if record.name == "cpu" else mgr.host_backend(self._backend)
        self.platform_reason = why
        self._t = transport
        configure_logging(self._t.rank)
        self.local_rank, self.local_size = transport.node()
        self.rank, self.size = self._t.rank, self._t.size
        ndev = max(1, len(record.probe.get("devices") or ()))
        self.device = self.local_rank % ndev
        self._scratch = _device.Slots(self._hostb)  # algorithms' scratch space
        self._mirrors = _device.Slots(self._backend)  # device buffers' host mirrors
        self._device_scratch = (
            _device.Slots(self._backend, on_device=self.device)
            if self._backend.mem_alloc is not None and record.name != "cpu"
            else None
        )
        self._native, self._native_comm = None, None
        if self._backend.native_collectives is not None:
            self._native = self._backend.native_collectives()
        self._native_id = 0
        self._init_native()
        self._staging = threading.local()
        self._executor = SerialExecutor(f"uniccl-comm-r{self.rank}")
        self._lock = threading.RLock()
        self._seq = 0
        self._tag_span = min(self._t.tag_ub, 1 << 20) - 1
        self._hdr = np.zeros(HEADER_WORDS, np.int64)
        self._hdrs = np.zeros((self.size, HEADER_WORDS), np.int64)
        self._hdr_view = memoryview(self._hdr)  # element writes without numpy's per-call overhead
        single_host = self.local_size == self.size
        self._chunk_bytes = alg.chunk_bytes()  # UNICCL_CHUNK_BYTES, read once here: not per call
        self._faults = _faults.from_env(self.rank)  # UNICCL_FAULT_INJECT (tests): None, and free, otherwise
        self._engine, shm_reason = _shm_attach(self, single_host)
        self._tuner = Tuner(self.size, transport.name, self._engine is not None, shm_reason)
        self._name = name
        self._flight = FlightRecorder(name, self.rank, self.size)
        # (collective, dtype, count, op, root, bytes, has a host path) -> (its record, whether
        # it rides on the data alone): a call's announcement is made once per shape
        self._announce: dict = {}
        self._announced = None  # (plan, seq) of the running announced call (TCP, MPI)
        self._in_data = False  # the running call is past its agreement
        logger.info(
            "communicator rank %d/%d: platform %s (%s), transport %s (%s)",
            self.rank,
            self.size,
            self.platform,
            why,
            self._tuner.transport,
            self._tuner.transport_why,
        )
        self._destroyed = False
        self._pid = os.getpid()
        self._hier = None  # (vendor group, leaders or None) of a mixed-vendor communicator
        self._telemetry = self._tracer = None  # (attach's clock alignment calls are not counted)
        self._tracer = _trace.attach(self)  # UNICCL_TRACE (None: off); the first one aligns clocks
        _fl.arm_signal_dumps()  # UNICCL_TRACE / UNICCL_DUMP_DIR: SIGTERM and Ctrl-C still leave the files
        self._telemetry = _tel.Telemetry(self.size) if _tel.enabled() else None  # UNICCL_TELEMETRY
        _metrics.serve(self)  # UNICCL_METRICS_PORT: Prometheus (a warning now if it cannot be served)
        _status.watch(self)  # UNICCL_STATUS_DIR: what `uniccl top` shows
        for var in ("UNICCL_TRACE", "UNICCL_DUMP_DIR", "UNICCL_STATUS_DIR"):
            _log.check_writable_dir(var)  # a side channel that cannot be written: a warning now, not at exit
        mesh = getattr(self._t, "mesh", None)
        if mesh is not None and self._tracer is not None:
            mesh.tracer = self._tracer  # spans per message
        if self._engine is not None and self._tracer is not None:
            self._engine.trace(1 << 16)  # spans per transfer with each peer, taken after each call
        ids = self._rank_native_ids
        if self.size > 2 and len(set(ids)) > 1 and any(i and ids.count(i) > 1 for i in set(ids)):
            self._make_hierarchy(ids)

    # ------------------------------------------------------------------ basics
    @property
    def platform(self) -> str:
        return self._backend.name

    def __repr__(self):
        state = "destroyed" if self._destroyed else f"platform={self.platform}"
        return f"<uniccl.Communicator rank {self.rank}/{self.size} {state}>"

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if os.getpid() == self._pid:  # a forked child leaving the block: its parent's, left alone
            self.destroy()

    def destroy(self) -> None:
        """Finish pending work and release this communicator's resources (idempotent)."""
        self._owned("destroy")
        if self._destroyed:
            return
        self._executor.close()
        if self._tracer is not None:
            self._tracer.final.append(self.stats())  # written with the trace at exit
        with self._lock:
            self._destroyed = True
            self._scratch.free()
            self._mirrors.free()
            if self._device_scratch is not None:
                self._device_scratch.free()
            if self._native_comm is not None:
                assert self._native is not None  # it made the communicator
                try:
                    self._native.destroy(self._native_comm)
                finally:
                    self._native_comm = None
            if self._engine is not None:
                self._engine.close()
            self._t.free()
        for sub in self._hier or ():
            if sub is not None:
                sub.destroy()
        _status.closed(self)  # its last counts, for `uniccl top`

    def abort(self, reason: str = "aborted by the user") -> None:
        """Give up on this communicator now, without waiting for anyone (any thread; idempotent).

        Never blocks on peers: a call hung on another thread ends with ``InvalidUsage``
        within about 50 ms, every peer's waits on this communicator end at once with
        ``RemoteError`` naming this rank (shared memory: its abort record; TCP: a notice on
        each connection), the vendor library's communicator is aborted, shared memory is
        unmapped and, once every communicator over them is gone, sockets are closed.  The
        process stays usable; over MPI, point-to-point waits of the MPI library itself
        cannot be cancelled (see docs/reliability.md).
        """
        import time

        self._owned("abort")
        if self._destroyed:
            return
        self._destroyed = True  # no new call starts (checked before and under the lock)
        why = f"rank {self.rank} aborted the communicator: {reason}"
        logger.warning("%s", why)
        if self._engine is not None:
            self._engine.abort(why)
        abort = getattr(self._t, "abort", None)
        if abort is not None:
            abort(reason)  # peers say "rank r (host, pid) aborted the communicator: <reason>"
        if self._native_comm is not None:
            assert self._native is not None  # it made the communicator
            try:
                self._native.abort(self._native_comm)
            except UnicclError as exc:
                logger.warning("aborting the %s communicator: %s", self._native.name, exc)
            self._native_comm = None
        self._executor.abandon()
        deadline = time.monotonic() + 2.0  # the hung call notices the abort within ~50 ms
        while self._engine is not None and time.monotonic() < deadline:
            try:
                self._engine.close()
                break
            except InvalidUsage:  # still inside a call on another thread
                time.sleep(0.01)
        self._flight.dump(reason="abort")
        for sub in self._hier or ():
            if sub is not None:
                sub.abort(reason)

    def _alive(self, op: str) -> None:
        if self._destroyed:
            raise InvalidUsage("the communicator was destroyed", op=op, rank=self.rank)
        self._owned(op)

    def _owned(self, op: str) -> None:
        """In a forked child (a DataLoader worker) the communicator is its parent's: every call,
        abort and destroy included, is InvalidUsage and touches nothing the two share."""
        if os.getpid() != self._pid:  # its sockets and shared memory are the parent's: never touch them
            raise InvalidUsage(
                f"this communicator belongs to process {self._pid}; a forked child must make its own",
                op=op,
                rank=self.rank,
            )

    # ------------------------------------------------------------- collectives
    def all_reduce(self, sendbuf, recvbuf=None, op=ReduceOp.SUM, *, async_op=False, timeout=None):
        """Reduce ``sendbuf`` over all ranks into ``recvbuf`` (None: in place)."""
        return self._call("all_reduce", self._plan_all_reduce, (sendbuf, recvbuf, op), async_op, timeout)

    def reduce(self, sendbuf, recvbuf=None, op=ReduceOp.SUM, root=0, *, async_op=False, timeout=None):
        """Reduce to ``root``'s ``recvbuf`` (None: in place in the root's ``sendbuf``)."""
        return self._call("reduce", self._plan_reduce, (sendbuf, recvbuf, op, root), async_op, timeout)

    def broadcast(self, buf, root=0, *, async_op=False, timeout=None):
        """Copy ``root``'s ``buf`` into every rank's ``buf``."""
        return self._call("broadcast", self._plan_broadcast, (buf, root), async_op, timeout)

    def all_gather(self, sendbuf, recvbuf, *, async_op=False, timeout=None):
        """``recvbuf`` (size x len(sendbuf), rank-major) gets every rank's ``sendbuf``.
        In place when ``sendbuf`` is block ``rank`` of ``recvbuf``."""
        return self._call("all_gather", self._plan_all_gather, (sendbuf, recvbuf), async_op, timeout)

    def reduce_scatter(self, sendbuf, recvbuf, op=ReduceOp.SUM, *, ring_order=False, async_op=False, timeout=None):
        """Block i of ``sendbuf`` (size x len(recvbuf)) reduced over all ranks lands in
        rank i's ``recvbuf``.  In place when ``recvbuf`` is block ``rank`` of ``sendbuf``.

        ``ring_order=True`` (host buffers): block b is combined as gloo's ring combines it,
        ((x[b-1] op x[b-2]) op ...) op x[b] with ranks mod size, on every transport alike, so
        float sums and products are the same bits whichever transport ran them (and gloo's;
        MAX/MIN may still differ in which NaN or which zero's sign wins)."""
        return self._call(
            "reduce_scatter", self._plan_reduce_scatter, (sendbuf, recvbuf, op, ring_order), async_op, timeout
        )

    def all_to_all(self, sendbuf, recvbuf, *, async_op=False, timeout=None):
        """Block i of ``sendbuf`` goes to rank i; block j of ``recvbuf`` comes from rank j."""
        return self._call("all_to_all", self._plan_all_to_all, (sendbuf, recvbuf), async_op, timeout)

    def gather(self, sendbuf, recvbuf=None, root=0, *, async_op=False, timeout=None):
        """``root``'s ``recvbuf`` (size x len(sendbuf)) gets every rank's ``sendbuf``."""
        return self._call("gather", self._plan_gather, (sendbuf, recvbuf, root), async_op, timeout)

    def scatter(self, sendbuf=None, recvbuf=None, root=0, *, async_op=False, timeout=None):
        """Block i of ``root``'s ``sendbuf`` goes to rank i's ``recvbuf``."""
        return self._call("scatter", self._plan_scatter, (sendbuf, recvbuf, root), async_op, timeout)

    def barrier(self, *, async_op=False, timeout=None):
        """Return once every rank has entered the barrier."""
        return self._call("barrier", lambda: Plan("barrier"), (), async_op, timeout)

    def send(self, buf, peer: int, *, async_op=False, timeout=None):
        """Send ``buf`` to ``peer`` (matched in order with its ``recv``)."""
        return self._call("send", self._plan_send, (buf, peer), async_op, timeout)

    def recv(self, buf, peer: int, *, async_op=False, timeout=None):
        """Receive from ``peer`` into ``buf`` (a longer message is an error)."""
        return self._call("recv", self._plan_recv, (buf, peer), async_op, timeout)

    # ---------------------------------------------------------------- structure
    def split(self, color: int, key: int = 0) -> Communicator | None:
        """Ranks with the same ``color`` form a new communicator, ordered by ``key``
        then rank; ``color=uniccl.UNDEFINED`` gives None.  Collective."""
        self._alive("split")
        for name, value in (("color", color), ("key", key)):
            if isinstance(value, bool) or not isinstance(value, int) or (name == "color" and value < UNDEFINED):
                raise InvalidArgument(
                    f"must be an int{' >= 0 or uniccl.UNDEFINED' if name == 'color' else ''}, got {value!r}",
                    op="split",
                    rank=self.rank,
                    argument=name,
                )
        self._executor.drain()
        with self._lock:
            new = self._t.split(color, key)
        return None if new is None else Communicator._over(new, self.platform, self.timeout, f"{self._name}.{color}")

    def shrink(self, timeout: float = 10.0) -> Communicator:
        """A new communicator of the ranks still alive, after a peer died (collective over the
        survivors; ranks keep their order).  Works on a failed communicator; call it before
        ``abort()`` (which may close the connections it needs).  Needs the TCP bootstrap
        (``uniccl run``, or a unique id): MPI cannot survive a dead rank.  ``timeout``: how long
        to wait for each survivor's view of who is alive."""
        shrink = getattr(self._t, "shrink", None)
        if shrink is None:
            raise InvalidUsage(
                f"shrink() needs the TCP bootstrap; this communicator runs over {self._t.name}",
                op="shrink",
                rank=self.rank,
            )
        transport = shrink(_check_timeout(timeout, "shrink", self.rank))
        self._shrunk = getattr(self, "_shrunk", 0) + 1
        logger.info("rank %d: shrink: %d of %d ranks survive", self.rank, transport.size, self.size)
        return Communicator._over(transport, self.platform, self.timeout, f"{self._name}.shrink{self._shrunk}")

    def stats(self) -> dict:
        """This rank's telemetry as a plain dict: per operation (``ops``: calls, bytes, seconds,
        algbw/busbw in GB/s, p50/p99 latency, and the same per message-size bucket under
        ``by_size``), per peer link over TCP (``links``: bytes and seconds sent and received,
        retransmissions, checksum failures: the job's connections, shared by its
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
        mesh = getattr(self._t, "mesh", None)
        if mesh is not None:
            out.update(mesh.stats)
            out["links"] = {str(p): mesh.link_stats(m) for p, m in enumerate(self._t.members) if p != self.rank}
        if self._engine is not None and not self._engine.closed:
            out.update(self._engine.integrity)
        return out

    # ----------------------------------------------------------------- plumbing
    def _call(self, name, planner, args, async_op, timeout=None):
        self._alive(name)
        if self._faults is not None and self._faults.slow_for() and name not in ("send", "recv"):
            time.sleep(self._faults.slow_for())  # UNICCL_FAULT_INJECT=slow=<s>: a straggler, late to each call
        entry = self._flight.enqueue(name, sys._getframe(2))  # the public method's caller
        self._staging.list = None
        try:
            timeout = _check_timeout(timeout, name, self.rank)  # like any bad argument: the peers learn it
            plan = planner(*args)
        except UnicclError as exc:
            plan = Plan(name, p2p=name in ("send", "recv"))
            plan.error, timeout = exc, None
        plan.staged, self._staging.list = self._staging.list, None
        plan.args, plan.timeout, plan.entry = args, timeout, entry
        if plan.p2p and plan.error is not None:
            self._flight.finished(entry, plan.error)
            raise plan.error  # point-to-point errors are local: no peer waits in agreement
        group = _group.current()
        if group is not None:
            return group.add(self, plan)
        if async_op:
            return self._executor.submit(functools.partial(self._execute, plan), Work(name))
        if not self._executor.idle():  # keep issue order behind pending async work
            return self._executor.submit(functools.partial(self._execute, plan), Work(name)).wait()
        return self._execute(plan)

    def _execute(self, plan: Plan):
        with self._lock:
            if self._destroyed:
                raise InvalidUsage("the communicator was destroyed", op=plan.name, rank=self.rank)
            timeout = self.timeout if plan.timeout is None else plan.timeout
            if timeout != self._timeout_set:
                self._set_timeout(timeout)
            seq = None if plan.p2p else self._seq
            self._in_data = False  # point-to-point errors stay between the two ranks
            self._flight.started(plan.entry, seq, plan, threading.current_thread() is self._executor._thread)
            tracer = self._tracer
            t0 = perf_counter_ns() if tracer is None else time.time_ns()
            try:
                result = plan.run(None) if plan.p2p else self._execute_locked(plan)
            except UnicclError as exc:
                if self._telemetry is not None:
                    self._telemetry.failure(plan.name)
                if tracer is not None:  # what moved before it failed, under this call
                    self._trace_call(plan, seq, t0, time.time_ns(), failed=type(exc).__name__)
                raise self._failed(plan, seq, timeout, exc) from None
            self._flight.finished(plan.entry)
            if self._telemetry is not None or tracer is not None:
                t1 = perf_counter_ns() if tracer is None else time.time_ns()
                if self._telemetry is not None:
                    self._telemetry.record(plan.name, plan.nbytes, t1 - t0)
                if tracer is not None:
                    self._trace_call(plan, seq, t0, t1)
            return result

    def _p2p_begin(self, plan: Plan) -> int:
        """A send or recv of a ``uniccl.group()`` block starts (the group posts it, outside
        ``_execute``): its flight-recorder entry and its clock, as ``_execute`` keeps them."""
        self._flight.started(plan.entry, None, plan, False)
        self._p2p_timeout(plan)
        return perf_counter_ns() if self._tracer is None else time.time_ns()

    def _p2p_timeout(self, plan: Plan) -> None:
        """The waits of a group's send or recv obey its own ``timeout=`` (else the communicator's)."""
        timeout = self.timeout if plan.timeout is None else plan.timeout
        if timeout != self._timeout_set:
            self._set_timeout(timeout)

    def _p2p_end(self, plan: Plan, t0: int, exc: BaseException | None = None) -> BaseException | None:
        """... and ends: counted in the telemetry and the trace like any call, its entry
        completed or failed.  Returns the error to report (``_failed``'s, for a uniccl error)."""
        tracer = self._tracer
        t1 = perf_counter_ns() if tracer is None else time.time_ns()
        if exc is None:
            self._flight.finished(plan.entry)
            if self._telemetry is not None:
                self._telemetry.record(plan.name, plan.nbytes, t1 - t0)
            if tracer is not None:
                self._trace_call(plan, None, t0, t1)
            return None
        if self._telemetry is not None:
            self._telemetry.failure(plan.name)
        if tracer is not None:
            self._trace_call(plan, None, t0, t1, failed=type(exc).__name__)
        if isinstance(exc, UnicclError):
            self._in_data = False  # point-to-point errors stay between the two ranks
            return self._failed(plan, None, self.timeout if plan.timeout is None else plan.timeout, exc)
        self._flight.finished(plan.entry, exc)
        return exc

    def _trace_call(self, plan: Plan, seq, t0: int, t1: int, failed: str | None = None) -> None:
        tracer = cast("_trace.Tracer", self._tracer)  # called only when tracing
        entry = plan.entry
        path = entry[_fl.PATH] if entry is not None else ""
        args = {
            "communicator": self._name,
            "seq": seq,
            "bytes": plan.nbytes,
            "path": path if isinstance(path, str) else f"{path.transport} {path.algorithm}".strip(),
        }
        if failed:
            args["failed"] = failed
        if plan.p2p:
            args["peer"] = plan.root
        if self._engine is not None:
            try:
                events, dropped = self._engine.take_events()
            except UnicclError:  # the engine was closed (abort): nothing more to take
                events, dropped = [], 0
            if dropped:
                args["transfers_not_traced"] = dropped
            for kind, peer, nbytes, e0, e1 in events:
                track = "reduce" if peer < 0 else f"{kind} {'to' if kind == 'write' else 'from'} rank {peer}"
                tracer.span("transfer", track, e0, e1, {"bytes": nbytes, "kind": kind, "peer": peer, "seq": seq})
        tracer.span(plan.name, "calls", t0, t1, args)

    def _set_timeout(self, timeout: float) -> None:
        if self._engine is not None:
            self._engine.set_timeout(timeout)
        set_timeout = getattr(self._t, "set_timeout", None)
        if set_timeout is not None:  # (TCP and MPI; an MPI wait with a limit polls: see _mpi)
            set_timeout(timeout)
        self._timeout_set = timeout

    def _failed(self, plan: Plan, seq, timeout: float, exc: UnicclError) -> UnicclError:
        """Record a failed call; a timeout names the call, its number and what it waited for.
        Failures that involve peers leave the flight recorder in UNICCL_DUMP_DIR."""
        if isinstance(exc, Timeout) and getattr(exc, "seq", None) is None:
            cause, remote = exc.message, getattr(exc, "remote_rank", None)
            missing = list(getattr(exc, "missing_ranks", None) or ())
            what = (
                f"call #{seq} on this communicator"
                if seq is not None
                else f"{'from' if plan.name == 'recv' else 'to'} rank {plan.root}"
            )
            exc = Timeout(
                f"{plan.name} ({what}) did not complete: {cause}",
                op=plan.name,
                rank=self.rank,
                seq=seq,
                timeout=timeout,
                missing_ranks=missing,
            )
            fail = getattr(self._t, "fail", None)
            if fail is not None and remote is None:
                fail(cause, missing)  # TCP: the peers learn it now, not at their own timeouts
        else:
            if exc.op in (None, "agree") or exc.rank is None:  # the engine's or transport's words: name the call
                exc = type(exc)(exc.message, op=plan.name, rank=self.rank, argument=exc.argument, **exc.extra)
            died = getattr(self._t, "peer_died", None)
            if (
                died is not None
                and isinstance(exc, RemoteError)
                and exc.extra.get("remote_rank") is not None
                and exc.extra.get("remote_type") in ("ConnectionError", "died")
            ):
                # TCP: tell every survivor (one may wait for another survivor, not for the dead rank);
                # before any abort notice of ours, so that they learn the cause, not just "aborted"
                died(exc.message, exc.extra["remote_rank"])
            elif self._in_data and not isinstance(exc, RemoteError) and getattr(self._t, "failed", None):
                # failed while moving data (not in the agreement, which every rank settles alike):
                # the peers would wait for our part; TCP tells them now (shm: the engine's abort record)
                self._t.failed(f"{type(exc).__name__}: {exc.message}")
        self._flight.finished(plan.entry, exc)
        if not isinstance(exc, InvalidArgument):
            path = self._flight.dump(reason=type(exc).__name__, error=exc)
            if path:
                logger.warning("rank %d: %s; flight recorder written to %s", self.rank, type(exc).__name__, path)
        return exc

    def dump_flight_recorder(self, directory: str | None = None) -> str | None:
        """Write this rank's record of the communicator's last operations as JSON to
        ``directory`` (default $UNICCL_DUMP_DIR); returns the path (None: no directory)."""
        return self._flight.dump(directory, reason="on demand")

    def flight_recorder(self) -> dict:
        """This rank's record of the communicator's last operations (what a dump contains)."""
        return self._flight.snapshot()

    def _execute_locked(self, plan: Plan):
        """The call itself (under the communicator's lock)."""
        seq = self._seq
        self._seq += 1
        if self._faults is not None and self._faults.should_kill(seq):
            import signal

            os.kill(os.getpid(), signal.SIGKILL)  # UNICCL_FAULT_INJECT=kill_at=<seq>
        staged, native = plan.staged, None
        if staged and plan.error is None:
            native = self._native_path(plan)
            if native is None:
                try:
                    _device.stage_in(self._backend, self._mirrors, staged)
                except UnicclError as exc:
                    plan.error = _located(exc, plan.name, self.rank)  # the agreement tells the peers
        self._hdr_view[_H_NATIVE] = self._native_id if native is not None else 0
        self._hdr_view[_H_DEVRED] = bool(staged) and native is None and _staged_reduce.applies(self, plan)
        self._in_data = False
        if self.size > 1:
            if self._engine is None and self._host_only and self._hier is None and hasattr(self._t, "announce"):
                return self._run_announced(plan, seq)
            if (
                plan.shm_agreed is not None
                and self._engine is not None
                and not staged
                and self._hier is None
                and plan.error is None
            ):
                choice = self._tuner.choose(plan.name, plan.nbytes)
                if choice.transport == "shm":
                    return self._run_fused(plan, seq, choice)
            self._agree(plan, seq)
        elif plan.error is not None:
            raise plan.error
        self._in_data = True  # from here a failure leaves peers waiting for this rank's data
        entry = plan.entry
        if self._hier is not None and plan.name == "all_reduce" and plan.op != ReduceOp.AVG and plan.count:
            if entry is not None:
                entry[_fl.PATH] = "hierarchical"
            return self._run_hierarchical(plan)
        hdrs = self._hdrs if self.size > 1 else self._hdr[None, :]
        if native is not None:
            if (hdrs[:, _H_NATIVE] == self._native_id).all():
                if entry is not None:
                    entry[_fl.PATH] = f"native:{cast(NativeCollectives, self._native).name}"
                return self._run_native(plan, native)
            _device.stage_in(self._backend, self._mirrors, staged)  # a peer stages: so do we
        if plan.run is None:
            return None
        if staged and hdrs[:, _H_DEVRED].all():
            if entry is not None:
                entry[_fl.PATH] = "staged:device kernels"
            return _staged_reduce.run(self, plan, seq)  # writes the device buffers itself
        result = self._run_host(plan, seq)
        if staged:
            _device.stage_out(self._backend, staged)
        return result

    def _run_host(self, plan: Plan, seq: int):
        algorithm = ""
        if self.size > 1:
            choice = self._tuner.choose(plan.name, plan.nbytes)
            if plan.entry is not None:
                plan.entry[_fl.PATH] = choice  # formatted when dumped
            if choice.transport == "shm":
                return plan.shm(self._engine)
            algorithm = choice.algorithm
        return plan.run(self._context(plan, seq, algorithm))

    # ------------------------------------------------------- device buffers
    def _stage(self, view, device: int, argument: str, writable: bool):
        """A claimed device buffer, staged through a host mirror unless the native path runs."""
        staged = _device.Staged(view, device, argument, writable)
        if self._staging.list is None:
            self._staging.list = []
        self._staging.list.append(staged)
        return staged

    def _make_hierarchy(self, ids: list) -> None:
        """Groups of ranks that share a vendor library, and their leaders: all_reduce then
        runs the library inside each group and the host path only between leaders."""
        group = self.split(sorted(set(ids)).index(ids[self.rank]), self.rank)
        assert group is not None  # a color >= 0: this rank is in one
        leaders = self.split(0 if group.rank == 0 else UNDEFINED, self.rank)
        self._hier = (group, leaders)
        sizes = {i: ids.count(i) for i in set(ids)}
        logger.info(
            "communicator rank %d/%d spans vendors: all_reduce is hierarchical (vendor library inside "
            "groups of sizes %s, host path between %d leaders)",
            self.rank,
            self.size,
            sorted(sizes.values(), reverse=True),
            len(sizes),
        )

    def _run_hierarchical(self, plan: Plan):
        """Reduce inside the vendor group, all_reduce across group leaders, broadcast inside."""
        sendbuf, recvbuf, op = plan.args
        group, leaders = cast("tuple[Communicator, Communicator | None]", self._hier)  # run only with one
        out = sendbuf if recvbuf is None else recvbuf
        logger.debug(
            "all_reduce %d elements: hierarchical (group of %d, %s)",
            plan.count,
            group.size,
            "leader" if leaders is not None else "member",
        )
        group.all_reduce(sendbuf, recvbuf, op)
        if leaders is not None:
            leaders.all_reduce(out, None, op)
        group.broadcast(out, root=0)
        return out

    def _init_native(self) -> None:
        """Make the vendor library's communicator now, while every rank is here (as NCCL
        users call ncclCommInitRank up front): point-to-point calls, which involve two
        ranks only, can then use it too.  If any rank fails, none uses the native path."""
        # every rank takes part (also those without a library): the ranks of a mixed-vendor
        # communicator learn together that no one library spans it
        mine = zlib.crc32(f"{self.platform}:{self._native.name}".encode()) | 1 if self._native is not None else 0
        device = self._device_scratch is not None  # this rank may pass device buffers
        both = self._t.allgather_obj((mine, device)) if self.size > 1 else [(mine, device)]
        ids = [i for i, _ in both]
        self._rank_native_ids = list(ids)
        # no rank can pass device buffers: every call takes the host path, so over TCP the
        # records can ride on the data (_run_announced) on every rank alike
        self._host_only = not any(d for _, d in both)
        if not mine or len(set(ids)) != 1:
            if mine:
                assert self._native is not None  # mine != 0: this rank has a library
                logger.info("native collectives (%s) not used: the ranks' platforms differ", self._native.name)
            self._native = None
            return
        assert self._native is not None  # mine != 0: this rank has a library
        error = None
        try:
            self._native_comm = self._native.create(self.size, self.rank, self.device, self._t.bcast_obj)
            self._native_id = mine
        except UnicclError as exc:
            error = f"rank {self.rank}: {exc}"
        errors = [e for e in self._t.allgather_obj(error) if e] if self.size > 1 else [error] if error else []
        if errors:
            logger.warning("native collectives (%s) not used: %s", self._native.name, errors[0])
            if self._native_comm is not None:
                self._native.destroy(self._native_comm)
            self._native, self._native_comm, self._native_id = None, None, 0

    def native_p2p(self, b) -> bool:
        """Does a send/recv of ``b`` go through the vendor library (a device buffer, and a
        datatype the library has)?  Both sides decide alike when they pass alike buffers."""
        return (
            isinstance(b, _device.Staged)
            and self._native is not None
            and b.device == self.device
            and self._native.supports(b.dtype)
        )

    def _native_path(self, plan: Plan):
        """Native-library arguments when this rank can take the native path, else None."""
        if self._native is None or {s.device for s in plan.staged} != {self.device}:
            return None  # the library's communicator lives on this rank's device; others stage
        args = _device.native_args(plan, plan.staged)
        if args is None or not self._native.supports(plan.dtype, plan.op if plan.op >= 0 else 0):
            return None
        return args

    def _run_native(self, plan: Plan, args: dict):
        # the native path runs only where _init_native made the library's communicator, on a
        # device platform (it has stream_synchronize)
        native = cast(NativeCollectives, self._native)
        native.run(plan.name, cast(int, self._native_comm), args, args["stream"], self.rank)
        if args["stream"] is None:  # no stream given: done on return, like the host path
            cast("Callable[[Any], None]", self._backend.stream_synchronize)(None)
        # else NCCL's contract: enqueued on the caller's stream, complete when it gets there
        if plan.name == "reduce" and self.rank != plan.root:
            return None
        return args["result"]

    def _context(self, plan: Plan, seq: int, algorithm: str) -> alg.OpContext:
        dt = DType(plan.dtype)
        op = ReduceOp.SUM if plan.op == ReduceOp.AVG else plan.op
        return alg.OpContext(
            self._t,
            self.rank,
            self.size,
            1 + seq % self._tag_span,
            dt.itemsize,
            int(dt),
            int(op),
            self._hostb.reduce,
            self._scratch,
            self._copy,
            algorithm,
            self._chunk_bytes,
        )

    def _record(self, plan: Plan) -> None:
        """This rank's record of the call (what every rank must agree on) into ``self._hdr``."""
        h = self._hdr_view
        h[_H_ERR], h[_H_COLL], h[_H_DTYPE] = plan.error is not None, _COLL_IDS[plan.name], plan.dtype
        h[_H_COUNT], h[_H_OP], h[_H_ROOT] = plan.count, plan.op, plan.root

    def _agree(self, plan: Plan, seq: int) -> None:
        """Exchange the records before any data moves (shm engine, device buffers)."""
        hdr, hdrs = self._hdr, self._hdrs
        self._record(plan)
        if self._engine is not None:
            same = self._engine.agree(hdr, hdrs)  # a cache-line exchange instead of an MPI allgather
        else:
            self._t.allgather_array(hdr, hdrs)
            same = hdrs.tobytes() == hdr.tobytes() * self.size
        if same and plan.error is None:
            return  # the common case: everyone made the same valid call
        self._judge(plan, seq, None)

    def _run_fused(self, plan: Plan, seq: int, choice):
        """Shared memory: the records ride on the data's first rendezvous (one instead of two);
        ranks that call anything else meet it there with :meth:`_agree`."""
        self._record(plan)
        if plan.entry is not None:
            plan.entry[_fl.PATH] = choice
        self._in_data = True
        agreed, result = plan.shm_agreed(self._engine)
        if agreed:
            return result
        self._in_data = False  # nothing moved: every rank judges the same records
        self._judge(plan, seq, None)
        self._in_data = True  # they differ only where the call allows it (paths): as after _agree
        return plan.shm(self._engine)

    def _run_announced(self, plan: Plan, seq: int):
        """TCP and MPI: the records travel alongside the data (:meth:`TCPTransport.announce`,
        :meth:`MPITransport.announce`) instead of a round trip before it; data from a peer is
        used only once the records matched."""
        name, error = plan.name, plan.error
        key = (name, plan.dtype, plan.count, plan.op, plan.root, plan.nbytes, plan.run is not None)
        known = self._announce.get(key) if error is None else None
        if known is None:
            agreed = _AGREE[name]  # only what the call must agree on is compared
            record = _RECORD.pack(
                error is not None,
                _COLL_IDS[name],
                plan.dtype if _H_DTYPE in agreed else -1,
                plan.count if _H_COUNT in agreed else -1,
                plan.op if _H_OP in agreed else -1,
                plan.root if _H_ROOT in agreed else -1,
                -1,
                -1,
            )
            light = False
            if error is None and plan.nbytes > 0 and plan.run is not None and self.size <= 64:
                light = self._tuner.choose(name, plan.nbytes).algorithm in _COVERING.get(name, ())
            known = record, light
            if error is None:
                if len(self._announce) >= 256:  # a program's calls repeat: a few shapes, kept
                    self._announce.clear()
                self._announce[key] = known
        record, light = known
        full = record if error is None else record + pickle.dumps(error)  # peers name it
        t = self._t
        self._in_data = True  # a failure from here (but a mismatch) leaves peers waiting
        self._announced = plan, seq
        try:
            t.announce(seq, 1 + seq % self._tag_span, record, full, light, self._mismatched)
            result = None if plan.run is None else self._run_host(plan, seq)
            t.finish()
            return result
        except BaseException:
            t.abandon()
            raise

    def _mismatched(self) -> None:
        """The ranks' records of an announced call differ: every rank gets here (told by the
        first to see it), learns them all, drops what was sent ahead and raises alike."""
        assert self._announced is not None  # set by _run_announced before the call's announce
        plan, seq = self._announced
        self._in_data = False
        recs = self._t.records()
        n = HEADER_WORDS * 8
        for p, rec in enumerate(recs):
            self._hdrs[p] = np.frombuffer(rec[:n], np.int64)
        self._t.flush()
        self._judge(plan, seq, [pickle.loads(rec[n:]) if len(rec) > n else None for rec in recs])

    def _judge(self, plan: Plan, seq: int, errors) -> None:
        """Raise for a call the ranks did not make alike (records in ``self._hdrs``)."""
        hdrs = self._hdrs
        if hdrs[:, _H_ERR].any():
            if errors is None:
                errors = self._t.allgather_obj(plan.error)
            if plan.error is not None:
                raise plan.error
            bad = int(np.flatnonzero(hdrs[:, _H_ERR])[0])
            raise RemoteError(
                f"call #{seq} failed on rank {bad}: {errors[bad]}",
                op=plan.name,
                rank=self.rank,
                remote_rank=bad,
                remote_type=type(errors[bad]).__name__,
            )
        colls = hdrs[:, _H_COLL]
        if (colls != colls[0]).any():
            other = int(np.flatnonzero(colls != colls[0])[0])
            raise InvalidUsage(
                f"mismatched call #{seq}: rank 0 called {_COLL_NAMES[int(colls[0])]} but rank "
                f"{other} called {_COLL_NAMES[int(colls[other])]}",
                op=plan.name,
                rank=self.rank,
            )
        for f in _AGREE[plan.name]:
            col = hdrs[:, f]
            if (col != col[0]).any():
                other = int(np.flatnonzero(col != col[0])[0])
                raise InvalidUsage(
                    f"mismatched call #{seq}: rank 0 passed {_FIELD_NAMES[f]}="
                    f"{_describe(f, col[0])} but rank {other} passed {_FIELD_NAMES[f]}="
                    f"{_describe(f, col[other])}",
                    op=plan.name,
                    rank=self.rank,
                )

    def _copy(self, dst: int, src: int, nbytes: int) -> None:
        if nbytes and dst != src:
            self._hostb.memcpy(dst, src, nbytes, MemcpyKind.HOST_TO_HOST, None)

    def _avg_input(self, ptr: int, count: int, dtype: int, op) -> int:
        """Where a reduction reads this rank's input: for a float AVG, the input divided by
        the size first, in scratch (NCCL pre-multiplies likewise), so that the sum of values
        whose mean fits cannot overflow (float16 AVG of 30000 over 4 ranks was inf); the
        caller's buffer is left as it is.  Any other op, and integer AVG: ``ptr`` itself."""
        if op is not ReduceOp.AVG or not count or self.size == 1 or dtype not in FLOATING:
            return ptr
        tmp = self._scratch.get("avg", count * DType(dtype).itemsize)
        self._hostb.scale(tmp, ptr, count, dtype, self.size, None)
        return tmp

    def _finish_avg(self, ptr: int, count: int, dtype: int, op) -> None:
        """Integer AVG: the sum divided (truncating) at the end; a float AVG was divided first."""
        if op is ReduceOp.AVG and count and (dtype not in FLOATING or self.size == 1):
            self._hostb.scale(ptr, ptr, count, dtype, self.size, None)

    # ------------------------------------------------------------------- plans
    def _plan_all_reduce(self, sendbuf, recvbuf, op):
        name = "all_reduce"
        rop = chk.reduce_op(self, op, name)
        kop = _KERNEL_OP[rop]
        send = chk.buffer(self, sendbuf, name, "sendbuf", writable=recvbuf is None or recvbuf is sendbuf)
        recv = send
        if recvbuf is not None and recvbuf is not sendbuf:
            recv = chk.buffer(self, recvbuf, name, "recvbuf", writable=True)
            chk.same_dtype(self, send, recv, name, "recvbuf")
            chk.at_least(self, recv, send.count, name, "recvbuf", "the count of sendbuf")
            chk.no_partial_overlap(self, send, recv, name)
        count, result = send.count, sendbuf if recvbuf is None else recvbuf

        def run(c):
            self._copy(recv.ptr, self._avg_input(send.ptr, count, send.dtype, rop), send.nbytes)
            if c.size > 1 and count:
                if c.algorithm == "recursive_doubling" or count < c.size:
                    alg.all_reduce_recursive_doubling(c, recv.ptr, count)
                else:
                    alg.all_reduce_ring(c, recv.ptr, count)
            self._finish_avg(recv.ptr, count, send.dtype, rop)
            return result

        def shm(e):
            e.all_reduce(self._avg_input(send.ptr, count, send.dtype, rop), recv.ptr, count, send.dtype, kop)
            self._finish_avg(recv.ptr, count, send.dtype, rop)
            return result

        def shm_agreed(e):  # the agreement in the data's first rendezvous (see _run_fused)
            src = self._avg_input(send.ptr, count, send.dtype, rop)
            if not e.all_reduce_agreed(self._hdr, self._hdrs, src, recv.ptr, count, send.dtype, kop):
                return False, None
            self._finish_avg(recv.ptr, count, send.dtype, rop)
            return True, result

        plan = Plan(name, send.dtype, count, rop, -1, run, shm, send.nbytes)
        plan.shm_agreed = shm_agreed
        return plan

    def _plan_reduce(self, sendbuf, recvbuf, op, root):
        name = "reduce"
        rop = chk.reduce_op(self, op, name)
        kop = _KERNEL_OP[rop]
        root = chk.rank_in_range(self, root, name, "root")
        is_root = self.rank == root
        inplace = is_root and (recvbuf is None or recvbuf is sendbuf)
        send = chk.buffer(self, sendbuf, name, "sendbuf", writable=inplace)
        recv = send
        if is_root and not inplace:
            recv = chk.buffer(self, recvbuf, name, "recvbuf", writable=True)
            chk.same_dtype(self, send, recv, name, "recvbuf")
            chk.at_least(self, recv, send.count, name, "recvbuf", "the count of sendbuf")
            chk.no_partial_overlap(self, send, recv, name)
        count = send.count
        result = (sendbuf if recvbuf is None else recvbuf) if is_root else None

        def run(c):
            src = acc = self._avg_input(send.ptr, count, send.dtype, rop)
            if is_root:
                acc = recv.ptr
                self._copy(acc, src, send.nbytes)
            elif alg._tree((c.rank - root) % c.size, c.size)[1] and src == send.ptr:  # inner node:
                acc = c.scratch(0, send.nbytes)  # fold children into a copy, never the caller's input
                self._copy(acc, src, send.nbytes)
            if c.size > 1 and count:
                alg.reduce_tree(c, src, acc, count, root)
            if is_root:
                self._finish_avg(acc, count, send.dtype, rop)
            return result

        def shm(e):
            e.reduce(self._avg_input(send.ptr, count, send.dtype, rop), recv.ptr, count, send.dtype, kop, root)
            if is_root:
                self._finish_avg(recv.ptr, count, send.dtype, rop)
            return result

        return Plan(name, send.dtype, count, rop, root, run, shm, send.nbytes)

    def _plan_broadcast(self, buf, root):
        name = "broadcast"
        root = chk.rank_in_range(self, root, name, "root")
        b = chk.buffer(self, buf, name, "buf", writable=self.rank != root)

        def run(c):
            if c.size > 1 and b.nbytes:
                alg.broadcast_tree(c, b.ptr, b.nbytes, root)
            return buf

        def shm(e):
            e.broadcast(b.ptr, b.nbytes, root)
            return buf

        return Plan(name, b.dtype, b.count, -1, root, run, shm, b.nbytes)

    def _plan_all_gather(self, sendbuf, recvbuf):
        name = "all_gather"
        send = chk.buffer(self, sendbuf, name, "sendbuf", writable=False)
        recv = chk.buffer(self, recvbuf, name, "recvbuf", writable=True)
        chk.same_dtype(self, send, recv, name, "recvbuf")
        chk.at_least(self, recv, self.size * send.count, name, "recvbuf", "size x count of sendbuf")
        chk.no_partial_overlap(self, send, recv, name, allowed_offset=self.rank * send.nbytes)

        def run(c):
            self._copy(recv.ptr + c.rank * send.nbytes, send.ptr, send.nbytes)
            if c.size > 1 and send.nbytes:
                alg.all_gather_ring(c, recv.ptr, send.nbytes)
            return recvbuf

        def shm(e):
            e.all_gather(send.ptr, recv.ptr, send.nbytes)
            return recvbuf

        return Plan(name, send.dtype, send.count, -1, -1, run, shm, self.size * send.nbytes)

    def _plan_reduce_scatter(self, sendbuf, recvbuf, op, ring_order=False):
        name = "reduce_scatter"
        rop = chk.reduce_op(self, op, name)
        kop = _KERNEL_OP[rop] | (_SHM_RING_ORDER if ring_order else 0)
        send = chk.buffer(self, sendbuf, name, "sendbuf", writable=False)
        recv = chk.buffer(self, recvbuf, name, "recvbuf", writable=True)
        if ring_order and (isinstance(send, _device.Staged) or isinstance(recv, _device.Staged)):
            raise InvalidArgument(
                "ring_order is for host buffers (a vendor library keeps its own order)",
                op=name,
                rank=self.rank,
                argument="ring_order",
            )
        chk.same_dtype(self, send, recv, name, "recvbuf")
        count = chk.divisible(self, send, name, "sendbuf")
        chk.at_least(self, recv, count, name, "recvbuf", "count of sendbuf / size")
        nbytes = count * DType(send.dtype).itemsize
        chk.no_partial_overlap(self, recv, send, name, allowed_offset=self.rank * nbytes)

        def run(c):
            if c.size == 1:
                self._copy(recv.ptr, send.ptr, nbytes)
            elif count:
                src = self._avg_input(send.ptr, count * c.size, send.dtype, rop)
                alg.reduce_scatter_ring(c, src, recv.ptr, count, reverse=ring_order)
            self._finish_avg(recv.ptr, count, send.dtype, rop)
            return recvbuf

        def shm(e):
            e.reduce_scatter(
                self._avg_input(send.ptr, count * self.size, send.dtype, rop), recv.ptr, count, send.dtype, kop
            )
            self._finish_avg(recv.ptr, count, send.dtype, rop)
            return recvbuf

        # the record's root field says the order (agreed: ranks asking for different orders
        # would get different bits)
        return Plan(name, send.dtype, count, rop, _RING_ORDER if ring_order else -1, run, shm, send.nbytes)

    def _plan_all_to_all(self, sendbuf, recvbuf):
        name = "all_to_all"
        inplace = recvbuf is sendbuf
        send = chk.buffer(self, sendbuf, name, "sendbuf", writable=inplace)
        recv = send if inplace else chk.buffer(self, recvbuf, name, "recvbuf", writable=True)
        chk.same_dtype(self, send, recv, name, "recvbuf")
        block = chk.divisible(self, send, name, "sendbuf")
        chk.at_least(self, recv, send.count, name, "recvbuf", "the count of sendbuf")
        chk.no_partial_overlap(self, send, recv, name)
        bbytes = block * DType(send.dtype).itemsize

        def run(c):
            src = send.ptr
            if recv.ptr == send.ptr and c.size > 1:  # in place: send from a copy
                src = c.scratch(0, send.nbytes)
                self._copy(src, send.ptr, send.nbytes)
            self._copy(recv.ptr + c.rank * bbytes, src + c.rank * bbytes, bbytes)
            if c.size > 1 and bbytes:
                alg.all_to_all_pairwise(c, src, recv.ptr, bbytes)
            return recvbuf

        def shm(e):
            src = send.ptr
            if recv.ptr == send.ptr:  # in place: send from a copy
                src = self._scratch(0, send.nbytes)
                self._copy(src, send.ptr, send.nbytes)
            e.all_to_all(src, recv.ptr, bbytes)
            return recvbuf

        return Plan(name, send.dtype, block, -1, -1, run, shm, send.nbytes)

    def _plan_gather(self, sendbuf, recvbuf, root):
        name = "gather"
        root = chk.rank_in_range(self, root, name, "root")
        send = chk.buffer(self, sendbuf, name, "sendbuf", writable=False)
        recv = None
        if self.rank == root:
            recv = chk.buffer(self, recvbuf, name, "recvbuf", writable=True)
            chk.same_dtype(self, send, recv, name, "recvbuf")
            chk.at_least(self, recv, self.size * send.count, name, "recvbuf", "size x count of sendbuf")
            chk.no_partial_overlap(self, send, recv, name, allowed_offset=root * send.nbytes)

        def run(c):
            rptr = recv.ptr if recv is not None else 0
            if recv is not None:
                self._copy(rptr + root * send.nbytes, send.ptr, send.nbytes)
            if c.size > 1 and send.nbytes:
                alg.gather_linear(c, send.ptr, rptr, send.nbytes, root)
            return recvbuf if recv is not None else None

        def shm(e):
            e.gather(send.ptr, recv.ptr if recv is not None else 0, send.nbytes, root)
            return recvbuf if recv is not None else None

        return Plan(name, send.dtype, send.count, -1, root, run, shm, self.size * send.nbytes)

    def _plan_scatter(self, sendbuf, recvbuf, root):
        name = "scatter"
        root = chk.rank_in_range(self, root, name, "root")
        recv = chk.buffer(self, recvbuf, name, "recvbuf", writable=True)
        send, count = None, recv.count
        if self.rank == root:
            send = chk.buffer(self, sendbuf, name, "sendbuf", writable=False)
            chk.same_dtype(self, send, recv, name, "recvbuf")
            count = chk.divisible(self, send, name, "sendbuf")
            chk.at_least(self, recv, count, name, "recvbuf", "count of sendbuf / size")
            chk.no_partial_overlap(self, recv, send, name, allowed_offset=root * count * DType(send.dtype).itemsize)
        bbytes = count * DType(recv.dtype).itemsize

        def run(c):
            sptr = send.ptr if send is not None else 0
            if send is not None:
                self._copy(recv.ptr, sptr + root * bbytes, bbytes)
            if c.size > 1 and bbytes:
                alg.scatter_linear(c, sptr, recv.ptr, bbytes, root)
            return recvbuf

        def shm(e):
            e.scatter(send.ptr if send is not None else 0, recv.ptr, bbytes, root)
            return recvbuf

        return Plan(name, recv.dtype, count, -1, root, run, shm, self.size * bbytes)

    def _check_peer(self, peer, name):
        peer = chk.rank_in_range(self, peer, name, "peer")
        if peer == self.rank and _group.current() is None:
            raise InvalidArgument(
                "a blocking send/recv with itself would deadlock; pair them inside uniccl.group()",
                op=name,
                rank=self.rank,
                argument="peer",
            )
        return peer

    def _plan_p2p(self, name, buf, peer):
        b = chk.buffer(self, buf, name, "buf", writable=name == "recv")
        peer = self._check_peer(peer, name)
        if self.native_p2p(b):
            return self._plan_native_p2p(name, buf, b, peer)
        start = self._t.isend if name == "send" else self._t.irecv
        staged = isinstance(b, _device.Staged)
        tmp = []  # a device buffer moves through its own pinned copy (several may be in one group)

        def post():
            ptr = b.ptr
            if staged:
                ptr = self._backend.host_alloc(max(1, b.nbytes))
                tmp.append(ptr)
                if name == "send" and b.nbytes:
                    self._backend.memcpy(ptr, b.dev_ptr, b.nbytes, int(MemcpyKind.DEVICE_TO_HOST), b.stream)
                    if b.stream is not None:
                        self._backend.stream_synchronize(b.stream)
            return start(ptr, b.nbytes, peer, 0, self._t.p2p)

        def finish(req):
            try:
                self._t.finish_p2p(req, peer, b.nbytes, name, self.rank)
                if staged and name == "recv" and b.nbytes:
                    self._backend.memcpy(b.dev_ptr, tmp[0], b.nbytes, int(MemcpyKind.HOST_TO_DEVICE), b.stream)
                    if b.stream is not None:
                        self._backend.stream_synchronize(b.stream)
            finally:
                while tmp:
                    self._backend.host_free(tmp.pop())

        def run(_):
            finish(post())
            return buf

        plan = Plan(name, b.dtype, b.count, -1, peer, run, nbytes=b.nbytes, p2p=True)
        plan.post, plan.finish = post, finish
        return plan

    def _plan_native_p2p(self, name, buf, b, peer):
        """send/recv of a device buffer through the vendor library (ncclSend/ncclRecv); inside
        uniccl.group() the group's transfers are issued between its group start and end."""
        args = {"send" if name == "send" else "recv": b.dev_ptr, "count": b.count, "dtype": b.dtype, "peer": peer}

        def post():
            self._native.run(name, self._native_comm, args, b.stream, self.rank)

        def finish(_):
            if b.stream is None:  # as for collectives: a given stream orders it, no wait here
                self._backend.stream_synchronize(None)

        def run(_):
            post()
            finish(None)
            return buf

        plan = Plan(name, b.dtype, b.count, -1, peer, run, nbytes=b.nbytes, p2p=True)
        plan.post, plan.finish, plan.native = post, finish, self._native
        return plan

    def _plan_send(self, buf, peer):
        return self._plan_p2p("send", buf, peer)

    def _plan_recv(self, buf, peer):
        return self._plan_p2p("recv", buf, peer)


def _located(exc: UnicclError, op: str, rank: int) -> UnicclError:
    """``exc`` naming the collective and rank it happened in (a vendor call knows neither)."""
    if exc.rank is not None:
        return exc
    return type(exc)(exc.message, op=op, rank=rank, argument=exc.argument, **exc.extra)


# The op the kernels see: AVG is SUM with a scale (before it for floats, after for integers).
_KERNEL_OP = {op: int(ReduceOp.SUM if op == ReduceOp.AVG else op) for op in ReduceOp}


def _describe(field: int, value) -> str:
    value = int(value)
    if field == _H_DTYPE:
        return dtype_name(value) if 0 <= value < len(DType) else str(value)
    if field == _H_OP:
        return ReduceOp(value).name.lower() if 0 <= value < len(ReduceOp) else str(value)
    if field == _H_ROOT and value < 0:
        return "none (gloo's ring order)" if value == _RING_ORDER else "none"
    return str(value)
