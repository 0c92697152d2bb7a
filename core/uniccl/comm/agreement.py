"""Cross-rank agreement (step 2 of :mod:`uniccl.comm.communicator`'s three): before a call's
data is used, every rank learns every rank's record of the call, so that a bad argument or a
mismatched call raises alike on every rank instead of leaving a peer hanging.

A record is :data:`HEADER_WORDS` int64 fields (the ``H_*`` indexes): whether this rank's
arguments were bad, the collective, dtype, count, op and root (those of them that the
collective must agree on, :data:`_AGREE`), and the device path this rank would take.  How the
records travel depends on the transport:

- shared memory: on the data's first rendezvous (:func:`run_fused`; a call whose engine
  run is more than one engine call, AVG or an in-place all_to_all: :func:`agree` first);
- TCP and MPI (host buffers): alongside the data (:func:`run_announced`; the transport calls
  the communicator's :class:`Mismatched` when they differ);
- otherwise: exchanged before any data moves (:func:`agree`).

The functions take the communicator; it binds ``agree``, ``run_fused`` and ``run_announced``
as its ``_agree``, ``_run_fused`` and ``_run_announced`` (what ``_execute_locked`` calls).
"""

from __future__ import annotations

import pickle
import weakref

import numpy as np

from .._errors import InvalidUsage, RemoteError
from .._types import DType, ReduceOp, dtype_name
from ..observability import flight as _fl
from ..transport.record import (
    COLL,
    COLLECTIVES,
    COUNT,
    DEVRED,
    DTYPE,
    ERR,
    NATIVE,
    OP,
    RECORD,
    RECORD_BYTES,
    RECORD_WORDS,
    ROOT,
)
from .plans import RING_ORDER, Plan

_COLL_IDS = {name: i for i, name in enumerate(COLLECTIVES)}
_COLL_NAMES = {i: n for n, i in _COLL_IDS.items()}
# The fields of a record (indexes into it).
# the record's fields and size: transport.record (its size is the C engine's UC_SHM_RECORD_WORDS)
H_ERR, H_COLL, H_DTYPE, H_COUNT, H_OP, H_ROOT, H_NATIVE, H_DEVRED = ERR, COLL, DTYPE, COUNT, OP, ROOT, NATIVE, DEVRED
HEADER_WORDS = RECORD_WORDS
# H_NATIVE: the vendor library this rank would run the call with (0: none); H_DEVRED: 1 when
# this rank would reduce staged device buffers with its kernels.  Ranks of a mixed-vendor job
# may differ in both: a path is taken only when every rank asks for the same one.
_FIELD_NAMES = {H_DTYPE: "dtype", H_COUNT: "count", H_OP: "op", H_ROOT: "root"}
# Header fields every rank must agree on, per collective.
_AGREE = {
    "barrier": (),
    "all_reduce": (H_DTYPE, H_COUNT, H_OP),
    "reduce": (H_DTYPE, H_COUNT, H_OP, H_ROOT),
    "broadcast": (H_DTYPE, H_COUNT, H_ROOT),
    "all_gather": (H_DTYPE, H_COUNT),
    "reduce_scatter": (H_DTYPE, H_COUNT, H_OP, H_ROOT),  # root: -1, or plans.RING_ORDER
    "all_to_all": (H_DTYPE, H_COUNT),
    "gather": (H_DTYPE, H_COUNT, H_ROOT),
    "scatter": (H_DTYPE, H_COUNT, H_ROOT),
}
_RECORD = RECORD  # a call's record as bytes (TCP: fields not agreed on are -1)
# Algorithms over which the stamps of a TCP call reach every rank (see TCPTransport.announce).
_COVERING = {
    "all_reduce": ("ring", "recursive_doubling"),
    "all_gather": ("ring",),
    "reduce_scatter": ("ring",),
    "all_to_all": ("pairwise",),
}


def record(comm, plan: Plan) -> None:
    """This rank's record of the call (what every rank must agree on) into ``comm._hdr``."""
    h = comm._hdr_view
    h[H_ERR], h[H_COLL], h[H_DTYPE] = plan.error is not None, _COLL_IDS[plan.name], plan.dtype
    h[H_COUNT], h[H_OP], h[H_ROOT] = plan.count, plan.op, plan.root


def agree(comm, plan: Plan, seq: int) -> None:
    """Exchange the records before any data moves (shm engine, device buffers)."""
    hdr, hdrs = comm._hdr, comm._hdrs
    record(comm, plan)
    if comm._engine is not None:
        same = comm._engine.agree(hdr, hdrs)  # a cache-line exchange instead of an MPI allgather
    else:
        comm._t.allgather_array(hdr, hdrs)
        same = hdrs.tobytes() == hdr.tobytes() * comm.size
    if same and plan.error is None:
        return  # the common case: everyone made the same valid call
    judge(comm, plan, seq, None)


def run_fused(comm, plan: Plan, seq: int, choice):
    """Shared memory: the records ride on the data's first rendezvous (one instead of two);
    ranks that call anything else meet it there with :func:`agree`."""
    record(comm, plan)
    if plan.entry is not None:
        plan.entry[_fl.PATH] = choice
    comm._in_data = True
    engine = comm._engine
    if engine.agreed_call(comm._hdr, comm._hdrs, _COLL_IDS[plan.name], *plan.engine):
        return plan.result
    comm._in_data = False  # nothing moved: every rank judges the same records
    judge(comm, plan, seq, None)
    comm._in_data = True  # they differ only where the call allows it (paths): as after agree
    return plan.shm(engine)


def run_announced(comm, plan: Plan, seq: int):
    """TCP and MPI: the records travel alongside the data (:meth:`TCPTransport.announce`,
    :meth:`MPITransport.announce`) instead of a round trip before it; data from a peer is
    used only once the records matched."""
    name, error = plan.name, plan.error
    key = (name, plan.dtype, plan.count, plan.op, plan.root, plan.nbytes, plan.run is not None)
    known = comm._announce.get(key) if error is None else None
    if known is None:
        agreed = _AGREE[name]  # only what the call must agree on is compared
        rec = _RECORD.pack(
            error is not None,
            _COLL_IDS[name],
            plan.dtype if H_DTYPE in agreed else -1,
            plan.count if H_COUNT in agreed else -1,
            plan.op if H_OP in agreed else -1,
            plan.root if H_ROOT in agreed else -1,
            -1,
            -1,
        )
        light = False
        if error is None and plan.nbytes > 0 and plan.run is not None and comm.size <= 64:
            light = comm._tuner.choose(name, plan.nbytes).algorithm in _COVERING.get(name, ())
        known = rec, light
        if error is None:
            if len(comm._announce) >= 256:  # a program's calls repeat: a few shapes, kept
                comm._announce.clear()
            comm._announce[key] = known
    rec, light = known
    full = rec if error is None else rec + pickle.dumps(error)  # peers name it
    t = comm._t
    comm._in_data = True  # a failure from here (but a mismatch) leaves peers waiting
    mismatched = comm._mismatched
    mismatched.plan, mismatched.seq = plan, seq
    try:
        t.announce(seq, 1 + seq % comm._tag_span, rec, full, light, mismatched)
        result = None if plan.run is None else comm._run_host(plan, seq)
        t.finish()
        return result
    except BaseException:
        t.abandon()
        raise


class Mismatched:
    """The ``mismatched`` callback that :func:`run_announced` hands the transport's ``announce``
    (one per communicator, told each call's plan and number): the ranks' records of the
    announced call differ.  Every rank gets here (told by the first to see it), learns them
    all, drops what was sent ahead and raises alike.  It refers to its communicator weakly
    (the transport keeps the last callback, and the communicator its transport)."""

    __slots__ = ("_comm", "plan", "seq")

    def __init__(self, comm) -> None:
        self._comm = weakref.ref(comm)
        self.plan: Plan | None = None  # the running announced call ...
        self.seq = -1  # ... and its number

    def __call__(self) -> None:
        comm, plan = self._comm(), self.plan
        assert comm is not None and plan is not None  # set by run_announced before the call's announce
        comm._in_data = False
        recs = comm._t.records()
        n = RECORD_BYTES
        for p, rec in enumerate(recs):
            comm._hdrs[p] = np.frombuffer(rec[:n], np.int64)
        comm._t.flush()
        judge(comm, plan, self.seq, [pickle.loads(rec[n:]) if len(rec) > n else None for rec in recs])


def judge(comm, plan: Plan, seq: int, errors) -> None:
    """Raise for a call the ranks did not make alike (records in ``comm._hdrs``)."""
    hdrs = comm._hdrs
    if hdrs[:, H_ERR].any():
        if errors is None:
            errors = comm._t.allgather_obj(plan.error)
        if plan.error is not None:
            raise plan.error
        bad = int(np.flatnonzero(hdrs[:, H_ERR])[0])
        raise RemoteError(
            f"call #{seq} failed on rank {bad}: {errors[bad]}",
            op=plan.name,
            rank=comm.rank,
            remote_rank=bad,
            remote_type=type(errors[bad]).__name__,
        )
    colls = hdrs[:, H_COLL]
    if (colls != colls[0]).any():
        other = int(np.flatnonzero(colls != colls[0])[0])
        raise InvalidUsage(
            f"mismatched call #{seq}: rank 0 called {_COLL_NAMES[int(colls[0])]} but rank "
            f"{other} called {_COLL_NAMES[int(colls[other])]}",
            op=plan.name,
            rank=comm.rank,
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
                rank=comm.rank,
            )


def _describe(field: int, value) -> str:
    value = int(value)
    if field == H_DTYPE:
        return dtype_name(value) if 0 <= value < len(DType) else str(value)
    if field == H_OP:
        return ReduceOp(value).name.lower() if 0 <= value < len(ReduceOp) else str(value)
    if field == H_ROOT and value < 0:
        return "none (gloo's ring order)" if value == RING_ORDER else "none"
    return str(value)
