"""Hooks for frameworks: functions a communicator calls around each of its calls
(``comm.add_hook(pre=, post=, on_error=, on_abort=)``), with the call's record (:class:`CallInfo`).

- ``pre(call)`` runs on the caller's thread once the call's arguments are checked, before the
  ranks agree on it: an exception it raises becomes the call's error on this rank, and every
  other rank's call raises ``RemoteError`` naming it (as for a bad argument): this rank sends
  nothing of the call (over shared memory nothing moves at all; over TCP the other ranks'
  receive buffers may hold what they exchanged meanwhile, as for any failed call there).
- ``post(call, result)`` once the call completed on this rank; ``on_error(call, exc)`` once it
  failed (``exc`` is what the caller gets); both on the thread that ran it (the communicator's
  executor for ``async_op=True``).  What they raise is logged, never the call's.
- ``on_abort(reason)`` when ``comm.abort()`` is called.

While a communicator has hooks its calls take the general path (the compiled one has no place
for Python code): a call costs that path's few microseconds plus the hooks'.  A persistent start
does the same.  Inside ``uniccl.group()`` a send or recv gets its ``pre`` hooks only.

:func:`nan_check` is a ready-made ``pre`` hook: a float input holding NaN or Inf is an
``InvalidArgument`` naming the rank, the call and the first bad element; the values never reach
another rank.
"""

from __future__ import annotations

import itertools

import numpy as np

from .._errors import InvalidArgument, InvalidUsage, UnicclError
from .._types import dtype_name
from ..observability.log import logger

# the builder's argument (after the communicator) that holds what this rank contributes, and
# whether only the root contributes (broadcast, scatter)
_INPUT = {
    "all_reduce": (1, False),
    "reduce": (1, False),
    "broadcast": (1, True),
    "all_gather": (1, False),
    "reduce_scatter": (1, False),
    "all_to_all": (1, False),
    "gather": (1, False),
    "scatter": (1, True),
    "send": (1, False),
}
_ROOT_ARG = {"broadcast": 2, "scatter": 3}
_ids = itertools.count(1)


class CallInfo:
    """One call, as hooks see it: ``op``, ``communicator`` (its name), ``rank``, ``size``,
    ``dtype`` (a name, or None), ``count``, ``root`` (rooted collectives) or ``peer`` (send,
    recv), ``nbytes``, ``seq`` (the call's number: None before the agreement, and for send and
    recv), and ``inputs``: the buffer objects this rank contributes, as the caller passed them."""

    __slots__ = ("op", "communicator", "rank", "size", "dtype", "count", "root", "peer", "nbytes", "seq", "inputs")

    def __init__(self, comm, plan, args):
        self.op, self.communicator, self.rank, self.size = plan.name, comm._name, comm.rank, comm.size
        self.dtype = dtype_name(plan.dtype) if plan.dtype is not None and plan.dtype >= 0 else None
        self.count = plan.count if plan.count is not None and plan.count >= 0 else None
        rooted = plan.root is not None and plan.root >= 0
        self.root = plan.root if rooted and not plan.p2p else None
        self.peer = plan.root if rooted and plan.p2p else None
        self.nbytes, self.seq = plan.nbytes, None
        which = _INPUT.get(plan.name)
        self.inputs: tuple = ()
        if which is not None and len(args) > which[0]:
            root = args[_ROOT_ARG[plan.name]] if which[1] and len(args) > _ROOT_ARG[plan.name] else None
            if not which[1] or root == comm.rank:
                self.inputs = (args[which[0]],)

    def __repr__(self):
        where = f" root={self.root}" if self.root is not None else f" peer={self.peer}" if self.peer is not None else ""
        return f"<CallInfo {self.op}{where} {self.dtype}x{self.count} rank {self.rank}/{self.size} #{self.seq}>"


class Hook:
    """What ``comm.add_hook`` returns: ``remove()`` takes the hook's functions off again."""

    __slots__ = ("id", "comm", "pre", "post", "on_error", "on_abort")

    def __init__(self, comm, pre, post, on_error, on_abort):
        self.id, self.comm = next(_ids), comm
        self.pre, self.post, self.on_error, self.on_abort = pre, post, on_error, on_abort

    def remove(self) -> None:
        hooks = self.comm._hooks
        if self in hooks:
            hooks.remove(self)
            if not hooks:
                self.comm._unhooked()


def add(comm, pre=None, post=None, on_error=None, on_abort=None) -> Hook:
    """``Communicator.add_hook``'s work: check the functions, keep them (see the module)."""
    named = {"pre": pre, "post": post, "on_error": on_error, "on_abort": on_abort}
    for name, fn in named.items():
        if fn is not None and not callable(fn):
            raise InvalidArgument(f"must be callable or None, got {fn!r}", op="add_hook", rank=comm.rank, argument=name)
    if all(fn is None for fn in named.values()):
        raise InvalidUsage("add_hook() needs at least one of pre, post, on_error, on_abort", op="add_hook",
                           rank=comm.rank)  # fmt: skip
    hook = Hook(comm, pre, post, on_error, on_abort)
    comm._hooks.append(hook)
    return hook


def before(comm, plan, args) -> CallInfo:
    """Run the ``pre`` hooks on a checked plan; an exception of one becomes the plan's error."""
    call = CallInfo(comm, plan, args)
    if plan.error is None:
        for hook in list(comm._hooks):
            if hook.pre is None:
                continue
            try:
                hook.pre(call)
            except UnicclError as exc:
                plan.error = exc
                break
            except Exception as exc:  # the framework's own: typed, so that the peers learn of it
                plan.error = InvalidUsage(
                    f"a pre hook ({getattr(hook.pre, '__name__', hook.pre)!r}) raised {type(exc).__name__}: {exc}",
                    op=plan.name,
                    rank=comm.rank,
                )
                break
    return call


def after(comm, call: CallInfo | None, seq, result=None, exc=None) -> None:
    """Run the ``post`` (or, with ``exc``, ``on_error``) hooks of a finished call."""
    if call is None:
        return
    call.seq = seq
    for hook in list(comm._hooks):
        fn = hook.on_error if exc is not None else hook.post
        if fn is None:
            continue
        try:
            fn(call, exc) if exc is not None else fn(call, result)
        except Exception:  # never the call's error
            logger.exception("rank %d: a %s hook of %s raised", comm.rank, "on_error" if exc else "post", call.op)


def aborted(comm, reason: str) -> None:
    for hook in list(comm._hooks):
        if hook.on_abort is not None:
            try:
                hook.on_abort(reason)
            except Exception:
                logger.exception("rank %d: an on_abort hook raised", comm.rank)


# ---------------------------------------------------------------------------- ready-made
def nan_check(call: CallInfo) -> None:
    """A ``pre`` hook: every float input this rank contributes must be finite.  A NaN or Inf is
    ``InvalidArgument`` naming the rank, the call and the first bad element, raised before any
    data moves (every other rank's call then raises ``RemoteError`` naming this rank).  Host
    buffers only (numpy arrays, CPU tensors, anything ``np.asarray`` reads without a copy);
    a device buffer is not checked.  Cost: one pass over the input (``docs/performance.md``)."""
    for buf in call.inputs:
        if hasattr(buf, "__cuda_array_interface__"):
            continue  # device memory: not readable here
        try:
            arr = np.asarray(buf)
        except Exception:
            continue
        if arr.dtype.kind != "f" and arr.dtype.name != "bfloat16":
            continue
        flat = arr.reshape(-1)
        ok = np.isfinite(flat if arr.dtype.kind == "f" else flat.astype(np.float32))
        if ok.all():
            continue
        bad = np.flatnonzero(~ok)
        i = int(bad[0])
        name = "buf" if call.op in ("broadcast", "send") else "sendbuf"
        raise InvalidArgument(
            f"holds {len(bad)} non-finite value(s) (first: {float(flat[i])} at element {i}); nothing was sent "
            "(uniccl.hooks.nan_check)",
            op=call.op,
            rank=call.rank,
            argument=name,
        )
