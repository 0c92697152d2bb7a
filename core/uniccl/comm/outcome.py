"""What a finished call leaves behind beyond its result: its span in the trace (with the
shared-memory engine's transfers under it) and, for a failure, the error as the caller sees
it: named after the call, a timeout saying what it waited for, the peers told where they
would otherwise wait, and the flight recorder written.  Called by ``Communicator._execute``
and by a group's point-to-point transfers (:mod:`.group`); the functions take the communicator.
"""

from __future__ import annotations

import os

from .._errors import InvalidArgument, RemoteError, Revoked, Timeout, UnicclError
from ..observability import flight as _fl
from ..observability.log import logger
from ..reliability import procs
from ..transport.mpi import abort_at_exit


def trace_call(comm, plan, seq, t0: int, t1: int, failed: str | None = None) -> None:
    """The call's span in the trace (UNICCL_TRACE), with the engine's transfers under it."""
    tracer = comm._tracer  # called only when tracing
    entry = plan.entry
    path = entry[_fl.PATH] if entry is not None else ""
    args = {
        "communicator": comm._name,
        "seq": seq,
        "bytes": plan.nbytes,
        "path": path if isinstance(path, str) else f"{path.transport} {path.algorithm}".strip(),
    }
    if failed:
        args["failed"] = failed
    if plan.p2p:
        args["peer"] = plan.root
    if comm._engine is not None:
        try:
            events, dropped = comm._engine.take_events()
        except UnicclError:  # the engine was closed (abort): nothing more to take
            events, dropped = [], 0
        if dropped:
            args["transfers_not_traced"] = dropped
        for kind, peer, nbytes, e0, e1 in events:
            track = "reduce" if peer < 0 else f"{kind} {'to' if kind == 'write' else 'from'} rank {peer}"
            tracer.span("transfer", track, e0, e1, {"bytes": nbytes, "kind": kind, "peer": peer, "seq": seq})
    tracer.span(plan.name, "calls", t0, t1, args)


def _named(comm, exc: UnicclError) -> dict:
    """{rank: host, pid and, on this host, /proc state} of the ranks ``exc`` names (those waited
    for, the remote one): what ``uniccl doctor`` says they were doing ("stopped", "in I/O")."""
    if not os.environ.get("UNICCL_DUMP_DIR"):  # (where flight.dump writes: nothing to say)
        return {}
    ranks = set(exc.extra.get("missing_ranks") or ())
    if exc.extra.get("remote_rank") is not None:
        ranks.add(exc.extra["remote_rank"])
    ranks.discard(comm.rank)  # its own state says nothing (it is running this): a rank that was
    # stopped and echoes the others' timeout once continued would report itself running
    table = comm._t.processes()
    out = {}
    for r in sorted(ranks):
        if 0 <= r < len(table):
            p = dict(table[r])
            if p["local"]:
                p["state"] = procs.state(p["pid"], p["start"])
            out[str(r)] = p
    return out


def failed(comm, plan, seq, timeout: float, exc: UnicclError) -> UnicclError:
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
            rank=comm.rank,
            seq=seq,
            timeout=timeout,
            missing_ranks=missing,
        )
        if comm._t.can_abort and remote is None:
            comm._t.fail(cause, missing)  # TCP: the peers learn it now, not at their own timeouts
    else:
        if exc.op in (None, "agree") or exc.rank is None:  # the engine's or transport's words: name the call
            exc = type(exc)(exc.message, op=plan.name, rank=comm.rank, argument=exc.argument, **exc.extra)
        if isinstance(exc, Revoked):
            comm._learn_revoked(exc.extra.get("remote_rank"), exc.message)  # later calls raise it at once
        elif (
            comm._t.can_abort
            and isinstance(exc, RemoteError)
            and exc.extra.get("remote_rank") is not None
            and exc.extra.get("remote_type") in ("ConnectionError", "died")
        ):
            # TCP: tell every survivor (one may wait for another survivor, not for the dead rank);
            # before any abort notice of ours, so that they learn the cause, not just "aborted"
            comm._t.peer_died(exc.message, exc.extra["remote_rank"])
        elif comm._in_data and not isinstance(exc, RemoteError) and comm._t.can_abort:
            # failed while moving data (not in the agreement, which every rank settles alike):
            # the peers would wait for our part; TCP tells them now (shm: the engine's abort record)
            comm._t.failed(f"{type(exc).__name__}: {exc.message}")
    if isinstance(exc, RemoteError) and exc.extra.get("remote_type") in ("ConnectionError", "died"):
        abort_at_exit()  # a peer is dead: MPI_Finalize would wait for it at exit
    comm._flight.finished(plan.entry, exc)
    if not isinstance(exc, InvalidArgument):
        path = comm._flight.dump(reason=type(exc).__name__, error=exc, processes=_named(comm, exc))
        if path:
            logger.warning("rank %d: %s; flight recorder written to %s", comm.rank, type(exc).__name__, path)
    return exc
