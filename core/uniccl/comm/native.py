"""Device routing: which path a call on device buffers takes, and the paths themselves.

- *native*: every rank's buffers are on its own device of a platform whose vendor library
  (NCCL-class, :class:`~uniccl.hookspecs.NativeCollectives`) has the collective: the library
  runs it on the device, on the caller's stream (:func:`native_path`, :func:`run_native`);
- *staged*: the buffers are copied to host mirrors (:mod:`.device`) and the host path runs,
  or the platform's kernels reduce them (:mod:`.staged_reduce`);
- *hierarchical*: a communicator whose ranks span vendor libraries runs all_reduce with each
  library inside its group and the host path between the groups' leaders
  (:func:`make_hierarchy`, :func:`run_hierarchical`).

Each rank's choice goes into its record of the call (``H_NATIVE``, ``H_DEVRED``): a path is
taken only when every rank asks for the same one (:func:`prepare`, then :func:`route` once
the ranks agreed).  The functions take the communicator; host-only calls never get here.
"""

from __future__ import annotations

import zlib

from .._errors import UnicclError
from .._plugins import manager
from .._types import ReduceOp
from ..observability import flight as _fl
from ..observability.log import logger
from . import device as _device
from . import staged_reduce as _staged_reduce
from .agreement import H_DEVRED, H_NATIVE, judge
from .plans import Plan

_NO_GROUP = -1  # split's color for "in no new communicator" (uniccl.UNDEFINED)


def rank_facts(backend, native) -> tuple[int, bool]:
    """What the ranks of a communicator learn of each other at init: the id of this rank's
    vendor library (0: none) and whether it may pass device buffers (it has device scratch)."""
    mine = zlib.crc32(f"{backend.name}:{native.name}".encode()) | 1 if native is not None else 0
    return mine, backend.mem_alloc is not None and backend.name != "cpu"


def world_facts(platform: str | None) -> list:
    """:func:`rank_facts` of the plugin that ``platform`` chooses, ahead of the communicator: the
    rendezvous of a ``uniccl run`` job carries them, so init needs no exchange of its own."""
    mgr = manager()
    record, _ = mgr.choose(platform)
    backend = mgr.backend(record)
    native = backend.native_collectives() if backend.native_collectives is not None else None
    return list(rank_facts(backend, native))


def init_native(comm) -> None:
    """Make the vendor library's communicator now, while every rank is here (as NCCL
    users call ncclCommInitRank up front): point-to-point calls, which involve two
    ranks only, can then use it too.  If any rank fails, none uses the native path."""
    # every rank takes part (also those without a library): the ranks of a mixed-vendor
    # communicator learn together that no one library spans it
    mine, device = rank_facts(comm._backend, comm._native)
    both = comm._t.facts  # known from the rendezvous (the first world of a job), or exchanged now
    if both is None:
        both = comm._t.allgather_obj((mine, device)) if comm.size > 1 else [(mine, device)]
    ids = [i for i, _ in both]
    comm._rank_native_ids = list(ids)
    # no rank can pass device buffers: every call takes the host path, so over TCP the
    # records can ride on the data (run_announced) on every rank alike
    comm._host_only = not any(d for _, d in both)
    if not mine or len(set(ids)) != 1:
        if mine:
            logger.info("native collectives (%s) not used: the ranks' platforms differ", comm._native.name)
        comm._native = None
        return
    error = None
    try:
        comm._native_comm = comm._native.create(comm.size, comm.rank, comm.device, comm._t.bcast_obj)
        comm._native_id = mine
    except UnicclError as exc:
        error = f"rank {comm.rank}: {exc}"
    errors = [e for e in comm._t.allgather_obj(error) if e] if comm.size > 1 else [error] if error else []
    if errors:
        logger.warning("native collectives (%s) not used: %s", comm._native.name, errors[0])
        if comm._native_comm is not None:
            comm._native.destroy(comm._native_comm)
        comm._native, comm._native_comm, comm._native_id = None, None, 0


def make_hierarchy(comm, ids: list) -> None:
    """Groups of ranks that share a vendor library, and their leaders: all_reduce then
    runs the library inside each group and the host path only between leaders."""
    group = comm.split(sorted(set(ids)).index(ids[comm.rank]), comm.rank)
    assert group is not None  # a color >= 0: this rank is in one
    leaders = comm.split(0 if group.rank == 0 else _NO_GROUP, comm.rank)
    comm._hier = (group, leaders)
    sizes = {i: ids.count(i) for i in set(ids)}
    logger.info(
        "communicator rank %d/%d spans vendors: all_reduce is hierarchical (vendor library inside "
        "groups of sizes %s, host path between %d leaders)",
        comm.rank,
        comm.size,
        sorted(sizes.values(), reverse=True),
        len(sizes),
    )


def prepare(comm, plan: Plan):
    """Before the agreement, for a call on device buffers: this rank's path into its record,
    and the native library's arguments (None: the buffers are staged in now, unless the
    call already failed; a failing copy becomes this rank's error, which the agreement
    tells the peers)."""
    native = None
    if plan.error is None:
        native = native_path(comm, plan)
        if native is None:
            try:
                _device.stage_in(comm._backend, comm._mirrors, plan.staged)
            except UnicclError as exc:
                plan.error = _located(exc, plan.name, comm.rank)
    h = comm._hdr_view
    h[H_NATIVE] = comm._native_id if native is not None else 0
    h[H_DEVRED] = native is None and _staged_reduce.applies(comm, plan)
    return native


def route(comm, plan: Plan, seq: int, native):
    """After the agreement, a call on device buffers or on a hierarchical communicator: the
    path every rank asked for (``native``: :func:`prepare`'s arguments, or None)."""
    entry, staged = plan.entry, plan.staged
    if comm._hier is not None and plan.name == "all_reduce" and plan.op != ReduceOp.AVG and plan.count:
        if entry is not None:
            entry[_fl.PATH] = "hierarchical"
        return run_hierarchical(comm, plan)
    hdrs = comm._hdrs if comm.size > 1 else comm._hdr[None, :]
    if native is not None:
        if (hdrs[:, H_NATIVE] == comm._native_id).all():
            if entry is not None:
                entry[_fl.PATH] = f"native:{comm._native.name}"
            return run_native(comm, plan, native)
        _device.stage_in(comm._backend, comm._mirrors, staged)  # a peer stages: so do we
    if plan.run is None:
        return None
    if staged and hdrs[:, H_DEVRED].all():
        if entry is not None:
            entry[_fl.PATH] = "staged:device kernels"
        return _staged_reduce.run(comm, plan, seq)  # writes the device buffers itself
    result = comm._run_host(plan, seq)
    if staged:
        _device.stage_out(comm._backend, staged)
    return result


def staged_plan(comm, planner, args: tuple) -> Plan:
    """``planner(*args)`` with the device buffers it claimed as its ``staged`` list (what
    ``Communicator._call`` does around the planner)."""
    comm._staging.list = None
    plan = planner(*args)
    plan.staged, comm._staging.list = comm._staging.list, None
    plan.args = args
    return plan


def after_mismatch(comm, name: str, planner, args: tuple, seq: int):
    """A compiled native call (comm/_fastpath) whose records differed from a peer's (in
    ``comm._hdrs``): the general path's judgement, which raises, or finds a difference the
    call allows (a peer stages its buffers), and then :func:`route`, on a plan made afresh."""
    plan = staged_plan(comm, planner, args)
    native = native_path(comm, plan)
    comm._in_data = False  # nothing moved: every rank judges the same records
    judge(comm, plan, seq, None)
    comm._in_data = True
    if native is None and plan.staged:  # (its buffers changed since the shape was learnt): as prepare does
        _device.stage_in(comm._backend, comm._mirrors, plan.staged)
    return route(comm, plan, seq, native)


def native_path(comm, plan: Plan):
    """Native-library arguments when this rank can take the native path, else None."""
    if comm._native is None:
        return None
    args = _device.native_args(comm, plan)  # (buffers of another device, or host ones beside, stage)
    if args is None or not comm._native.supports(plan.dtype, plan.op if plan.op >= 0 else 0):
        return None
    return args


def run_native(comm, plan: Plan, args: dict):
    # the native path runs only where init_native made the library's communicator, on a
    # device platform (it has stream_synchronize)
    comm._native.run(plan.name, comm._native_comm, args, args["stream"], comm.rank)
    if args["stream"] is None:  # no stream given: done on return, like the host path
        comm._backend.stream_synchronize(None)
    # else NCCL's contract: enqueued on the caller's stream, complete when it gets there
    if plan.name == "reduce" and comm.rank != plan.root:
        return None
    return args["result"]


def run_hierarchical(comm, plan: Plan):
    """Reduce inside the vendor group, all_reduce across group leaders, broadcast inside."""
    _, sendbuf, recvbuf, op = plan.args
    group, leaders = comm._hier  # run only with one
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


def _located(exc: UnicclError, op: str, rank: int) -> UnicclError:
    """``exc`` naming the collective and rank it happened in (a vendor call knows neither)."""
    if exc.rank is not None:
        return exc
    return type(exc)(exc.message, op=op, rank=rank, argument=exc.argument, **exc.extra)
