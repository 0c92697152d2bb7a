"""Collectives by host, for a communicator whose ranks span hosts: the ranks of each host work
together over shared memory and one leader per host goes over the network, so a call makes
O(hosts) network steps where the flat ring makes O(ranks), and each host sends its data once.

:func:`make` (at init, where the ranks span two hosts or more and some host has two of them or
more) splits the communicator into ``local`` (this host's ranks, in rank order: the
shared-memory engine) and ``leaders`` (each host's lowest rank; None on the other ranks).  The
tuner (:mod:`.tuner`) prices each call flat and by host (:mod:`.costmodel`) and picks;
``UNICCL_ALGO=all_reduce:hierarchical`` forces it, a flat algorithm there forces flat.

- all_reduce: reduce to the leader over ``local``, all_reduce among the leaders, broadcast over
  ``local``.
- all_gather: gather to the leader, all_gather of the hosts' blocks among the leaders, broadcast.
- reduce_scatter: reduce to the leader, reduce_scatter of the hosts' blocks among the leaders,
  scatter over ``local``.

all_gather and reduce_scatter need as many ranks on every host (the leaders exchange equal
blocks); hosts whose ranks are not consecutive cost one permuting copy at the leader.  The
sub-calls are the sub-communicators' own (agreed, timed out, recorded in their flight
recorders); a failure in one names the step and the world ranks of that sub-communicator.
"""

from __future__ import annotations

import ctypes
import time
from collections import Counter

import numpy as np

from .._errors import Timeout, UnicclError
from .._types import DType
from . import plans as _plans

UNDEFINED = -1  # split's colour for "in no new communicator"


class Hosts:
    """A communicator's ranks by host, and the two sub-communicators that work on them."""

    __slots__ = ("local", "leaders", "members", "per_host", "order", "in_order")

    def __init__(self, local, leaders, members: list[list[int]]):
        self.local, self.leaders = local, leaders
        self.members = members  # per host (in the order of their lowest rank): its ranks, ascending
        counts = {len(m) for m in members}
        self.per_host = counts.pop() if len(counts) == 1 else None  # None: the hosts differ
        self.order = [r for m in members for r in m]  # the ranks host by host
        self.in_order = self.order == sorted(self.order)  # each host's ranks consecutive

    @property
    def hosts(self) -> int:
        return len(self.members)

    @property
    def most(self) -> int:
        """The most ranks on one host."""
        return max(len(m) for m in self.members)

    def subs(self) -> tuple:
        return (self.local, self.leaders)


def make(comm) -> Hosts | None:
    """The by-host sub-communicators of ``comm`` (collective), or None where they would not
    help: one host, or one rank on every host."""
    keys = comm._t.host_keys()
    index: dict = {}
    host_of = [index.setdefault(k, len(index)) for k in keys]
    if len(index) < 2 or len(index) == comm.size:
        return None
    local = comm.split(host_of[comm.rank], comm.rank)
    leaders = comm.split(0 if local.rank == 0 else UNDEFINED, comm.rank)
    members: list[list[int]] = [[] for _ in index]
    for r, h in enumerate(host_of):
        members[h].append(r)
    return Hosts(local, leaders, members)


def shape(h: Hosts) -> str:
    """The hosts in a few words, for the log: '3 hosts of 2 ranks'."""
    sizes = Counter(len(m) for m in h.members)
    return ", ".join(f"{k} host{'s' * (k > 1)} of {n} rank{'s' * (n > 1)}" for n, k in sorted(sizes.items()))


# ------------------------------------------------------------------------- the runs
def _array(ptr: int, count: int, dtype: int) -> np.ndarray:
    """The ``count`` elements of ``dtype`` at host address ``ptr``, as a numpy array (no copy)."""
    dt = DType(dtype)
    raw = (ctypes.c_char * (count * dt.itemsize)).from_address(ptr)
    return np.frombuffer(raw, dtype=_numpy_dtype(dt))


def _numpy_dtype(dt: DType):
    if dt == DType.BFLOAT16:
        import ml_dtypes  # only a bfloat16 call gets here, and its numpy arrays come from it

        return ml_dtypes.bfloat16
    return np.dtype(dt.name.lower())


def numpy_ok(dtype: int) -> bool:
    """Whether :func:`_array` can view ``dtype`` here (bfloat16 needs ml_dtypes)."""
    if dtype != DType.BFLOAT16:
        return True
    try:
        import ml_dtypes  # noqa: F401
    except ImportError:
        return False
    return True


class _Steps:
    """The sub-calls of one call and their timeouts, and a failure in one re-raised naming the
    step, the sub-communicator's ranks as this communicator's, and the call.

    The steps' deadlines are staggered by their depth: the first step (among a host's ranks,
    depth 0) ends a slack of 10 % of the timeout (at most 1 s) before the leaders' step (depth
    1), which ends as much before the last step (depth 2), which ends with the call's timeout.
    So the rank that waits on a stopped or lost rank directly times out first and tells every
    rank of this communicator (outcome.failed); the others, whose steps wait on that one, find
    its verdict when theirs end, and all name the same rank (as on the flat path)."""

    def __init__(self, comm, name: str, h: Hosts, timeout: float | None):
        self.comm, self.name, self.h = comm, name, h
        self.deadline = time.monotonic() + timeout if timeout else None
        self.slack = min(1.0, 0.1 * timeout) if timeout else 0.0

    def __call__(self, sub, depth: int, which: str, op: str, planner, *args):
        left = None
        if self.deadline is not None:
            left = max(1e-3, self.deadline - (2 - depth) * self.slack - time.monotonic())
        try:
            plan = planner(sub, *args)
            plan.args, plan.timeout = (sub, *args), left
            return sub._in_order(plan, op)  # (not the public method: a group() block must not take it)
        except Timeout as exc:
            told = self.comm._t.verdict()  # a rank's verdict on this call, come meanwhile
            if told is None:
                raise self._here(sub, which, op, exc) from None
            raise Timeout(told.message, op=self.name, rank=self.comm.rank, **told.extra) from None
        except UnicclError as exc:
            raise self._here(sub, which, op, exc) from None

    def _here(self, sub, which: str, op: str, exc: UnicclError) -> UnicclError:
        """``exc`` of a step as this call's: the sub-communicator's ranks as this communicator's, and
        without its call number, so that outcome.failed names this call."""
        extra = {k: v for k, v in exc.extra.items() if k != "seq"}
        if extra.get("missing_ranks"):
            extra["missing_ranks"] = [self.comm_rank(sub, r) for r in extra["missing_ranks"]]
        if extra.get("remote_rank") is not None:
            extra["remote_rank"] = self.comm_rank(sub, extra["remote_rank"])
        ranks = ", ".join(f"its rank {r} is rank {self.comm_rank(sub, r)}" for r in range(sub.size))
        return type(exc)(
            f"{exc.message} (in the {which} {op} of this by-host {self.name}: {ranks})",
            op=self.name,
            rank=self.comm.rank,
            argument=exc.argument,
            **extra,
        )

    def comm_rank(self, sub, r: int) -> int:
        """Rank ``r`` of sub-communicator ``sub`` as a rank of the whole communicator."""
        if sub is self.h.local:
            return self.h.members[self._host()][r]
        return self.h.members[r][0]

    def _host(self) -> int:
        me = self.comm.rank
        return next(i for i, m in enumerate(self.h.members) if me in m)


def all_reduce(comm, h: Hosts, ptr: int, count: int, dtype: int, op, timeout) -> None:
    """``ptr``'s ``count`` elements reduced over every rank, in place."""
    step = _Steps(comm, "all_reduce", h, timeout)
    buf = _array(ptr, count, dtype)
    step(h.local, 0, "local", "reduce", _plans.reduce, buf, None, op, 0)
    if h.leaders is not None:
        step(h.leaders, 1, "leaders'", "all_reduce", _plans.all_reduce, buf, None, op)
    step(h.local, 2, "local", "broadcast", _plans.broadcast, buf, 0)


def all_gather(comm, h: Hosts, send: int, recv: int, block: int, timeout) -> None:
    """Every rank's ``block`` bytes at ``send`` into ``recv`` (rank-major); equal hosts only."""
    step = _Steps(comm, "all_gather", h, timeout)
    n, per = comm.size, h.per_host
    assert per is not None  # (the tuner offers it only then)
    mine = _array(send, block, DType.UINT8).copy()  # (it may be a block of recv)
    out = _array(recv, n * block, DType.UINT8)
    if h.leaders is not None:
        # the hosts' blocks in host order: recv itself when that is rank order
        staged = out if h.in_order else np.empty(n * block, np.uint8)
        at = h.leaders.rank * per * block
        step(h.local, 0, "local", "gather", _plans.gather, mine, staged[at : at + per * block], 0)
        step(h.leaders, 1, "leaders'", "all_gather", _plans.all_gather, staged[at : at + per * block], staged)
        if not h.in_order:
            out.reshape(n, block)[h.order] = staged.reshape(n, block)
    else:
        step(h.local, 0, "local", "gather", _plans.gather, mine, None, 0)
    step(h.local, 2, "local", "broadcast", _plans.broadcast, out, 0)


def reduce_scatter(comm, h: Hosts, send: int, recv: int, count: int, dtype: int, op, timeout) -> None:
    """Block i of the reduction of every rank's ``size x count`` elements at ``send`` into rank
    i's ``recv``; equal hosts only."""
    step = _Steps(comm, "reduce_scatter", h, timeout)
    n, per = comm.size, h.per_host
    assert per is not None
    src = _array(send, n * count, dtype)
    if not h.in_order:
        src = src.reshape(n, count)[h.order].reshape(-1)  # (a copy) the hosts' blocks in host order
    else:
        src = src.copy()  # (recv may be a block of it)
    out = _array(recv, count, dtype)
    leader = h.leaders is not None
    total = np.empty_like(src) if leader else None
    step(h.local, 0, "local", "reduce", _plans.reduce, src, total, op, 0)
    part = None
    if leader:
        part = np.empty(per * count, src.dtype)
        step(h.leaders, 1, "leaders'", "reduce_scatter", _plans.reduce_scatter, total, part, op)
    step(h.local, 2, "local", "scatter", _plans.scatter, part, out, 0)
