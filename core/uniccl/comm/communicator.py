"""The Communicator: the public object, and the call plumbing every operation goes through.

Every collective goes through three steps:
1. *plan* (caller's thread, :mod:`.plans`): convert and check the arguments locally.  A bad
   argument does not raise yet: it is recorded in the plan.
2. *agree* (all ranks, :mod:`.agreement`): a tiny allgather of each rank's call header
   (ok/error, operation, dtype, count, op, root).  If any rank's arguments were bad, every
   rank raises (the culprit its own error, the others ``RemoteError`` naming it);
   if the headers disagree, every rank raises ``InvalidUsage`` naming both sides.
   So bad input never leaves a peer hanging.
3. *run*: the algorithm moves and reduces the data (device buffers: :mod:`.native` routes
   them to the vendor library, staging or the hierarchical path).
Async operations run the same steps on the communicator's in-order executor.
"""

from __future__ import annotations

import functools
import os
import sys
import threading
import time
from time import perf_counter_ns

import numpy as np

from .. import _env
from .._errors import InvalidArgument, InvalidUsage, Revoked, UnicclError
from .._plugins import manager
from .._types import MemcpyKind
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
from . import _fastpath
from . import agreement as _agreement
from . import algorithms as alg
from . import device as _device
from . import group as _group
from . import hooks as _hooks
from . import hosts as _by_host
from . import native as _routes
from . import outcome as _outcome
from . import plans as _plans
from ._fastpath import CallLock, CallState, FastPath
from .agreement import H_DEVRED, H_NATIVE, HEADER_WORDS
from .executor import SerialExecutor, Work
from .plans import Plan
from .tuner import Tuner
from .views import CommunicatorViews

#: color for ``split`` meaning "not in any new communicator" (returns None).
UNDEFINED = -1


class Communicator(CommunicatorViews):
    """A group of ranks that run collectives together.

    Make one with :func:`uniccl.init` (the launcher's world), :meth:`from_mpi`,
    :meth:`split`, or NCCL-style ``Communicator(uid, rank, size)`` with a
    :func:`uniccl.get_unique_id` shared by the caller.  Its read-only properties, ``stats()``
    and the flight recorder's methods it inherits from :class:`~uniccl.comm.views.CommunicatorViews`.
    """

    # set in _setup
    _native_comm: int | None  # the vendor library's communicator
    _hier: tuple[Communicator, Communicator | None] | None  # (vendor group, leaders or None)
    _hosts: _by_host.Hosts | None  # (this host's ranks, the hosts' leaders or None)
    _native_id: int  # the library's id in the call records (0: no native path)
    _rank_native_ids: list[int]  # every rank's library id (native.init_native's exchange)
    _host_only: bool  # no rank can pass device buffers

    # the agreement (:mod:`.agreement`), as _execute_locked calls it (benchmarks/check_cost.py
    # replaces these per instance to time a call without its check)
    _agree = _agreement.agree
    _run_fused = _agreement.run_fused
    _run_announced = _agreement.run_announced

    # the per-call state, C fields of a CallState (what the compiled path reads and writes)
    _seq = property(lambda self: self._state.seq, lambda self, v: setattr(self._state, "seq", v))
    _in_data = property(lambda self: self._state.in_data, lambda self, v: setattr(self._state, "in_data", v))
    _destroyed = property(lambda self: self._state.destroyed, lambda self, v: setattr(self._state, "destroyed", v))

    @property
    def timeout(self) -> float:
        """Seconds each call may wait for its peers (settable; 0: no limit)."""
        return self._timeout

    @timeout.setter
    def timeout(self, value: float) -> None:
        self._timeout = value
        self._state.timeout_stale = value != self.__dict__.get("_told")

    @property
    def _timeout_set(self) -> float | None:
        """The timeout the transports were last told (None: not yet)."""
        return self._told

    @_timeout_set.setter
    def _timeout_set(self, value: float | None) -> None:
        self._told = value
        self._state.timeout_stale = self._timeout != value

    @property
    def _tracer(self):
        """UNICCL_TRACE's tracer (None: off)."""
        return self.__dict__.get("_tracer_on")

    @_tracer.setter
    def _tracer(self, value) -> None:
        self._tracer_on = value
        self._state.traced = value is not None

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
        self._state = CallState()  # the call number, and whether a call is past its agreement / destroyed
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
        _routes.init_native(self)
        self._staging = threading.local()
        self._executor = SerialExecutor(f"uniccl-comm-r{self.rank}", self._state)
        self._lock = CallLock()  # reentrant (threading.RLock's semantics)
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
        self._mismatched = _agreement.Mismatched(self)  # what announce calls when the records differ
        logger.info(
            "communicator rank %d/%d: platform %s (%s), transport %s (%s)",
            self.rank,
            self.size,
            self.platform,
            why,
            self._tuner.transport,
            self._tuner.transport_why,
        )
        self._pid = os.getpid()
        self._revoked: tuple[int | None, str] | None = None  # (the rank that revoked it, its words)
        self._hooks: list = []  # hooks.Hook: add_hook's
        self._unhooked_fast = None  # the compiled path, set aside while there are hooks
        self._shrunk = self._grown = 0  # the communicators shrink() and grow() made (their names)
        self._hier = None  # (vendor group, leaders or None) of a mixed-vendor communicator
        self._hosts = None  # the by-host sub-communicators (comm/hosts.py), where ranks span hosts
        self._telemetry = self._tracer = None  # (attach's clock alignment calls are not counted)
        self._tracer = _trace.attach(self)  # UNICCL_TRACE (None: off); the first one aligns clocks
        _fl.arm_signal_dumps()  # UNICCL_TRACE / UNICCL_DUMP_DIR: SIGTERM and Ctrl-C still leave the files
        self._telemetry = _tel.Telemetry(self.size) if _tel.enabled() else None  # UNICCL_TELEMETRY
        _metrics.serve(self)  # UNICCL_METRICS_PORT: Prometheus (a warning now if it cannot be served)
        _status.watch(self)  # UNICCL_STATUS_DIR: what `uniccl top` shows (a warning now if it cannot be written)
        for var in ("UNICCL_TRACE", "UNICCL_DUMP_DIR"):
            _log.check_writable_dir(var)  # a side channel that cannot be written: a warning now, not at exit
        # (the status directory is every rank's: no probe file there, its path alone)
        _log.check_writable_dir("UNICCL_STATUS_DIR", probe=False)
        mesh = self._t.mesh  # TCP's connections (None under MPI)
        if mesh is not None and self._tracer is not None:
            mesh.tracer = self._tracer  # spans per message
        self._t.watch_revoke(self._told_revoked)  # TCP: a peer's revoke is heard even while no call runs
        if self._engine is not None and self._tracer is not None:
            self._engine.trace(1 << 16)  # spans per transfer with each peer, taken after each call
        ids = self._rank_native_ids
        if self.size > 2 and len(set(ids)) > 1 and any(i and ids.count(i) > 1 for i in set(ids)):
            _routes.make_hierarchy(self, ids)
        if self.size > 2 and not single_host and self._hier is None:
            self._hosts = _by_host.make(self)
            if self._hosts is not None:
                h = self._hosts
                self._tuner.by_host(h.most, h.per_host is not None)
                logger.info("communicator rank %d/%d: ranks by host: %s", self.rank, self.size, _by_host.shape(h))
        # the compiled steady-state path (shared memory, and the native path where its records can be
        # agreed through the engine, or need not be: one rank; see _fastpath): None where it never applies
        served = self._engine is not None and self.size > 1 or self._native_comm is not None and self.size == 1
        eligible = served and self._hier is None and self._faults is None
        self._fast = FastPath(self) if eligible else None

    def add_hook(self, pre=None, post=None, on_error=None, on_abort=None) -> _hooks.Hook:
        """Call ``pre(call)`` before each call's agreement (what it raises fails the call on every
        rank), ``post(call, result)`` after it, ``on_error(call, exc)`` when it fails, and
        ``on_abort(reason)`` at :meth:`abort` (``call``: a :class:`uniccl.hooks.CallInfo`).  Returns
        a handle whose ``remove()`` takes them off.  Calls take the general path while hooks are
        on (see :mod:`uniccl.hooks`; ``uniccl.hooks.nan_check`` is a ready-made ``pre``)."""
        self._alive("add_hook")
        hook = _hooks.add(self, pre, post, on_error, on_abort)
        if len(self._hooks) == 1:  # the compiled path has no place for Python code: set it aside
            self._unhooked_fast, self._fast = self._fast, None
            self._state.hooked = True
        return hook

    def _unhooked(self) -> None:
        """The last hook was removed: the compiled path again."""
        self._fast, self._unhooked_fast = self._unhooked_fast, None
        self._state.hooked = False

    # ------------------------------------------------------------------ basics
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
        for sub in self._subs():
            if sub is not None:
                sub.destroy()
        _status.closed(self)  # its last counts, for `uniccl top`

    def abort(self, reason: str = "aborted by the user") -> None:
        """Give up on this communicator now, without waiting for anyone (any thread; idempotent).

        Never blocks on peers: a call hung on another thread ends with ``InvalidUsage``
        within about 10-20 ms, every peer's waits on this communicator end at once with
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
        if self._hooks:
            _hooks.aborted(self, reason)
        why = f"rank {self.rank} aborted the communicator: {reason}"
        logger.warning("%s", why)
        if self._engine is not None:
            self._engine.abort(why)
        # with can_abort (TCP) the peers say "rank r (host, pid) aborted the communicator: <reason>"
        self._t.abort(reason)
        self._abort_native()
        self._executor.abandon()
        deadline = time.monotonic() + 2.0  # the hung call notices the abort within ~10-20 ms
        while self._engine is not None and time.monotonic() < deadline:
            try:
                self._engine.close()
                break
            except InvalidUsage:  # still inside a call on another thread
                time.sleep(0.01)
        self._flight.dump(reason="abort")
        for sub in self._subs():
            if sub is not None:
                sub.abort(reason)

    def revoke(self, reason: str = "") -> None:
        """End every call on this communicator, in flight or later, on every rank, with
        ``uniccl.Revoked`` naming this rank and ``reason`` (any thread; never blocks on peers;
        idempotent).  NCCL's ``ncclCommRevoke``: unlike :meth:`abort` the communicator keeps its
        resources, so that :meth:`shrink`, :meth:`split` and :meth:`destroy` still work on it (on
        every rank).  Peers hear of it at once over shared memory and TCP (their waits end within
        about 10-20 ms, and a vendor communicator of theirs is aborted even while no call runs);
        over MPI without a shared-memory engine, only when they next call."""
        self._owned("revoke")
        if self._destroyed or self._revoked is not None:
            return
        text = f"rank {self.rank} revoked the communicator" + (f": {reason}" if reason else "")
        logger.warning("%s", text)
        self._revoked = (self.rank, text)
        self._state.revoked = True  # no new call starts; the compiled path hands every call over
        if self._engine is not None:
            self._engine.revoke(text)  # waits on this engine end, here and on every peer
        self._t.revoke(text)  # TCP: a notice to every member
        self._abort_native()
        for sub in self._subs():
            if sub is not None:
                sub.revoke(reason)

    def _told_revoked(self, peer: int, text: str) -> None:
        """The mesh's reader thread heard that job rank ``peer`` revoked this communicator."""
        if peer in self._t.members:
            self._learn_revoked(self._t.members.index(peer), text)

    def _learn_revoked(self, by: int | None, text: str) -> None:
        """Rank ``by`` revoked this communicator (told by the mesh, or by a call's Revoked)."""
        if self._revoked is None and not self._destroyed:
            self._revoked = (by, text)
            self._state.revoked = True
            self._abort_native()  # a vendor call waiting for the revoker would never end otherwise

    def _abort_native(self) -> None:
        """Abort the vendor library's communicator (revoke: ours stays)."""
        native, handle = self._native, self._native_comm
        if handle is None:
            return
        self._native_comm = None
        assert native is not None  # it made the communicator
        try:
            native.abort(handle)
        except UnicclError as exc:
            logger.warning("aborting the %s communicator: %s", native.name, exc)

    def _revoked_error(self, op: str) -> Revoked:
        assert self._revoked is not None
        by, text = self._revoked
        return Revoked(text, op=op, rank=self.rank, remote_rank=by)

    def _alive(self, op: str) -> None:
        if self._destroyed:
            raise InvalidUsage("the communicator was destroyed", op=op, rank=self.rank)
        if self._state.revoked:
            raise self._revoked_error(op)
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
    # The collectives: compiled (comm/_fastpath.pyx), so that a call of a learnt shape makes no
    # Python frame; each is ``_call(name, plans.<name>, ...)`` otherwise.
    all_reduce = _fastpath.all_reduce
    reduce = _fastpath.reduce
    broadcast = _fastpath.broadcast
    all_gather = _fastpath.all_gather
    reduce_scatter = _fastpath.reduce_scatter
    all_to_all = _fastpath.all_to_all
    gather = _fastpath.gather
    scatter = _fastpath.scatter
    barrier = _fastpath.barrier
    # persistent collectives (MPI 4's *_init): checked and agreed once, then start()/wait()
    all_reduce_init = _fastpath.all_reduce_init
    reduce_init = _fastpath.reduce_init
    broadcast_init = _fastpath.broadcast_init
    all_gather_init = _fastpath.all_gather_init
    reduce_scatter_init = _fastpath.reduce_scatter_init
    all_to_all_init = _fastpath.all_to_all_init
    gather_init = _fastpath.gather_init
    scatter_init = _fastpath.scatter_init
    barrier_init = _fastpath.barrier_init

    def send(self, buf, peer: int, *, async_op=False, timeout=None):
        """Send ``buf`` to ``peer`` (matched in order with its ``recv``)."""
        return self._call("send", _plans.send, (self, buf, peer), async_op, timeout)

    def recv(self, buf, peer: int, *, async_op=False, timeout=None):
        """Receive from ``peer`` into ``buf`` (a longer message is an error)."""
        return self._call("recv", _plans.recv, (self, buf, peer), async_op, timeout)

    def native_p2p(self, b) -> bool:
        """Does a send/recv of ``b`` go through the vendor library (a device buffer, and a
        datatype the library has)?  Both sides decide alike when they pass alike buffers."""
        return (
            isinstance(b, _device.Staged)
            and self._native is not None
            and b.device == self.device
            and self._native.supports(b.dtype)
        )

    # ---------------------------------------------------------------- structure
    def split(self, color: int, key: int = 0) -> Communicator | None:
        """Ranks with the same ``color`` form a new communicator, ordered by ``key``
        then rank; ``color=uniccl.UNDEFINED`` gives None.  Collective; works on a revoked
        communicator (every member must call it)."""
        self._owned("split")
        if self._destroyed:
            raise InvalidUsage("the communicator was destroyed", op="split", rank=self.rank)
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
        (``uniccl run``, or a unique id), or MPI with ULFM (Open MPI 5 under ``mpiexec --with-ft
        ulfm``: MPIX_Comm_shrink); other MPI jobs cannot survive a dead rank.  ``timeout``: how
        long to wait for each survivor's view of who is alive."""
        if not self._t.can_shrink:
            raise InvalidUsage(
                "shrink() needs the TCP bootstrap (uniccl run, or a unique id) or MPI with ULFM "
                f"(Open MPI 5: mpiexec --with-ft ulfm); this communicator runs over {self._t.name}",
                op="shrink",
                rank=self.rank,
            )
        transport = self._t.shrink(_check_timeout(timeout, "shrink", self.rank))
        self._shrunk += 1
        logger.info("rank %d: shrink: %d of %d ranks survive", self.rank, transport.size, self.size)
        return Communicator._over(transport, self.platform, self.timeout, f"{self._name}.shrink{self._shrunk}")

    def grow(self, new_size: int, uid, timeout: float | None = None) -> Communicator:
        """A new communicator of ``new_size`` ranks: this communicator's, keeping their ranks, and
        joiners, each a process that calls ``uniccl.Communicator(uid, rank, new_size)`` with
        ``rank`` in ``[size, new_size)`` (NCCL's ``ncclCommGrow``).  Collective over this
        communicator, with the same ``uid`` on every rank (made by one with
        :func:`uniccl.get_unique_id`; the joiners get it out of band).  A joiner may run on
        another platform.  This communicator keeps working.  Ranks that pass different sizes
        get ``InvalidUsage`` naming them.  ``timeout``: how long to wait for the joiners (default
        UNICCL_INIT_TIMEOUT); the new communicator connects over TCP, even inside an MPI job."""
        from ..transport.factory import transport_from_unique_id

        self._alive("grow")
        if isinstance(new_size, bool) or not isinstance(new_size, int) or new_size <= self.size:
            raise InvalidArgument(
                f"must be an int > the communicator's size {self.size}, got {new_size!r}",
                op="grow",
                rank=self.rank,
                argument="new_size",
            )
        sizes = self.all_gather_object(new_size)  # (before anyone joins: a mismatch hangs no one)
        if len(set(sizes)) > 1:
            said = "; ".join(
                f"rank{'s' if len(rs) > 1 else ''} {', '.join(map(str, rs))} passed {v}"
                for v in dict.fromkeys(sizes)
                for rs in [[r for r, x in enumerate(sizes) if x == v]]
            )
            raise InvalidUsage(f"the ranks passed different new_size: {said}", op="grow", rank=self.rank)
        transport = transport_from_unique_id(uid, self.rank, new_size, timeout, tcp=True)
        self._grown += 1
        logger.info("rank %d: grow: %d -> %d ranks", self.rank, self.size, new_size)
        return Communicator._over(transport, self.platform, self.timeout, f"{self._name}.grow{self._grown}")

    # ---------------------------------------------------------- control channel
    def broadcast_object(self, obj, root: int = 0):
        """``root``'s picklable ``obj``, on every rank, over the control channel (collective;
        small objects; not a numbered call: its flight recorder and telemetry do not see it)."""
        self._alive("broadcast_object")
        return self._t.bcast_obj(obj, root=root) if self.size > 1 else obj

    def all_gather_object(self, obj) -> list:
        """Every rank's picklable ``obj``, in rank order, over the control channel (as
        :meth:`broadcast_object`)."""
        self._alive("all_gather_object")
        return self._t.allgather_obj(obj) if self.size > 1 else [obj]

    # ----------------------------------------------------------------- plumbing
    def _persistent(self, name, planner, args) -> _fastpath.Persistent:
        """A persistent ``name``: its arguments checked here, then one agreement of its record
        across ranks (a numbered call that moves no data; a bad argument or a mismatch raises
        on every rank, as for the call itself)."""
        op = f"{name}_init"
        self._alive(op)
        if _group.current() is not None:
            raise InvalidUsage("a persistent call cannot be made inside uniccl.group()", op=op, rank=self.rank)
        entry = self._flight.enqueue(op, sys._getframe(1))  # the caller of the compiled *_init
        try:
            plan = planner(*args)
        except UnicclError as exc:
            plan = Plan(name)
            plan.error = exc
        # the agreement alone: the record of the call, no data (run None, no shm runner)
        probe = Plan(name, plan.dtype, plan.count, plan.op, plan.root, nbytes=plan.nbytes)
        probe.error, probe.entry, probe.staged = plan.error, entry, None
        self._in_order(probe, op)
        return _fastpath.Persistent(self, name, planner, args, plan.result)

    def _call(self, name, planner, args, async_op, timeout=None, depth=2):
        """The general path; ``depth``: frames up to the user's (1 from a compiled method)."""
        self._alive(name)
        if self._faults is not None and self._faults.slow_for() and name not in ("send", "recv"):
            time.sleep(self._faults.slow_for())  # UNICCL_FAULT_INJECT=slow=<s>: a straggler, late to each call
        entry = self._flight.enqueue(name, sys._getframe(depth))  # the public method's caller
        self._staging.list = None
        try:
            timeout = _check_timeout(timeout, name, self.rank)  # like any bad argument: the peers learn it
            plan = planner(*args)
        except UnicclError as exc:
            plan = Plan(name, p2p=name in ("send", "recv"))
            plan.error, timeout = exc, None
        plan.staged, self._staging.list = self._staging.list, None
        plan.args, plan.timeout, plan.entry = args, timeout, entry
        if self._hooks:
            plan.call = _hooks.before(self, plan, args)
        if plan.p2p and plan.error is not None:
            self._flight.finished(entry, plan.error)
            raise plan.error  # point-to-point errors are local: no peer waits in agreement
        group = _group.current()
        if group is not None:
            return group.add(self, plan)
        if async_op:
            return self._executor.submit(functools.partial(self._execute, plan), Work(name))
        return self._in_order(plan, name)

    def _in_order(self, plan: Plan, op: str):
        """Run ``plan`` now, or behind the async work still pending (issue order)."""
        if not self._executor.idle():
            return self._executor.submit(functools.partial(self._execute, plan), Work(op)).wait()
        return self._execute(plan)

    def _execute(self, plan: Plan):
        with self._lock:
            if self._destroyed:
                raise InvalidUsage("the communicator was destroyed", op=plan.name, rank=self.rank)
            if self._state.revoked:  # (queued before the revoke)
                raise self._revoked_error(plan.name)
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
                    _outcome.trace_call(self, plan, seq, t0, time.time_ns(), failed=type(exc).__name__)
                err = _outcome.failed(self, plan, seq, timeout, exc)
                if plan.call is not None:
                    _hooks.after(self, plan.call, seq, exc=err)
                raise err from None
            self._flight.finished(plan.entry)
            if plan.call is not None:
                _hooks.after(self, plan.call, seq, result)
            if self._telemetry is not None or tracer is not None:
                t1 = perf_counter_ns() if tracer is None else time.time_ns()
                if self._telemetry is not None:
                    self._telemetry.record(plan.name, plan.nbytes, t1 - t0)
                if tracer is not None:
                    _outcome.trace_call(self, plan, seq, t0, t1)
            return result

    def _set_timeout(self, timeout: float) -> None:
        if self._engine is not None:
            self._engine.set_timeout(timeout)
        self._t.set_timeout(timeout)  # (an MPI wait with a limit polls: see transport.mpi)
        self._timeout_set = timeout

    def _execute_locked(self, plan: Plan):
        """The call itself (under the communicator's lock)."""
        seq = self._seq
        self._seq += 1
        if self._faults is not None and self._faults.should_kill(seq):
            import signal

            os.kill(os.getpid(), signal.SIGKILL)  # UNICCL_FAULT_INJECT=kill_at=<seq>
        staged, native = plan.staged, None
        if staged:  # device buffers: the native path, or staged in now
            native = _routes.prepare(self, plan)
        else:
            h = self._hdr_view
            h[H_NATIVE] = h[H_DEVRED] = 0
        self._in_data = False
        if self.size > 1:
            if self._engine is None and self._host_only and self._hier is None and self._t.announces:
                return self._run_announced(plan, seq)
            if (
                plan.engine is not None
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
        if staged or self._hier is not None:
            return _routes.route(self, plan, seq, native)
        return None if plan.run is None else self._run_host(plan, seq)

    def _subs(self) -> tuple:
        """The sub-communicators this one made and runs calls over (None: a rank in none)."""
        return (*(self._hier or ()), *(self._hosts.subs() if self._hosts is not None else ()))

    def _run_host(self, plan: Plan, seq: int):
        algorithm = ""
        if self.size > 1:
            choice = self._tuner.choose(plan.name, plan.nbytes)
            by_host = choice.algorithm == "hierarchical"
            if by_host and (plan.hosts is None or self._hosts is None):  # (alike on every rank: the record's)
                choice, by_host = choice._replace(algorithm="ring", why="this call has no by-host form"), False
            if plan.entry is not None:
                plan.entry[_fl.PATH] = choice  # formatted when dumped
            if choice.transport == "shm":
                return plan.shm(self._engine)
            if by_host:
                return plan.hosts(self._hosts, self.timeout if plan.timeout is None else plan.timeout)
            algorithm = choice.algorithm
        return plan.run(_plans.context(self, plan, seq, algorithm))

    def _copy(self, dst: int, src: int, nbytes: int) -> None:
        if nbytes and dst != src:
            self._hostb.memcpy(dst, src, nbytes, MemcpyKind.HOST_TO_HOST, None)
