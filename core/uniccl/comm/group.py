"""``with uniccl.group():`` — NCCL group semantics.

Operations issued inside the block are only recorded; at the end of the
outermost block every point-to-point transfer is started at once (so matching
send/recv pairs in any order cannot deadlock), then the collectives run in issue
order, then the transfers are completed.  Each call in the block returns a
``Work`` that is completed when the group ends.
"""

from __future__ import annotations

import contextlib
import threading
import time
from time import perf_counter_ns

from .._errors import InvalidUsage, UnicclError
from . import _fastpath as _fp
from . import outcome as _outcome
from .executor import Work

_state = threading.local()


class _Group:
    def __init__(self):
        self.items: list = []  # (comm, plan, work)

    def add(self, comm, plan) -> Work:
        work = Work(plan.name)
        self.items.append((comm, plan, work))
        return work

    def run(self) -> None:
        for comm in {id(c): c for c, _, _ in self.items}.values():
            comm._executor.drain()  # earlier async work first: issue order
        started = []
        # device-buffer transfers go to the vendor library between its group start and end,
        # like ncclGroupStart/End around ncclSend/ncclRecv
        natives = list({id(p.native): p.native for _, p, _ in self.items if p.p2p and p.native}.values())
        for lib in natives:
            lib.group_start()
        try:
            for comm, plan, work in self.items:
                if plan.p2p:
                    t0 = _p2p_begin(comm, plan)  # counted, traced and recorded like any call
                    try:
                        started.append((comm, plan, work, plan.post(), t0))
                    except BaseException as exc:
                        work._finish(error=_p2p_end(comm, plan, t0, exc))
        finally:
            for lib in natives:
                lib.group_end()
        for comm, plan, work in self.items:
            if not plan.p2p:
                try:
                    work._finish(result=comm._execute(plan))
                except BaseException as exc:
                    work._finish(error=exc)
        for comm, plan, work, req, t0 in started:
            try:
                _p2p_timeout(comm, plan)  # each transfer waits as long as its own timeout= says
                plan.finish(req)
            except BaseException as exc:
                work._finish(error=_p2p_end(comm, plan, t0, exc))
            else:
                _p2p_end(comm, plan, t0)
                work._finish(result=None)
        errors = [w._error for _, _, w in self.items if w._error is not None]
        if errors:
            raise errors[0]

    def discard(self) -> None:
        for _, plan, work in self.items:
            work._finish(error=InvalidUsage("the group block raised before it ended; nothing was run", op=plan.name))


def _p2p_begin(comm, plan) -> int:
    """A send or recv of a ``uniccl.group()`` block starts (the group posts it, outside
    ``_execute``): its flight-recorder entry and its clock, as ``_execute`` keeps them."""
    comm._flight.started(plan.entry, None, plan, False)
    _p2p_timeout(comm, plan)
    return perf_counter_ns() if comm._tracer is None else time.time_ns()


def _p2p_timeout(comm, plan) -> None:
    """The waits of a group's send or recv obey its own ``timeout=`` (else the communicator's)."""
    timeout = comm.timeout if plan.timeout is None else plan.timeout
    if timeout != comm._timeout_set:
        comm._set_timeout(timeout)


def _p2p_end(comm, plan, t0: int, exc: BaseException | None = None) -> BaseException | None:
    """... and ends: counted in the telemetry and the trace like any call, its entry
    completed or failed.  Returns the error to report (``outcome.failed``'s, for a uniccl error)."""
    tracer = comm._tracer
    t1 = perf_counter_ns() if tracer is None else time.time_ns()
    if exc is None:
        comm._flight.finished(plan.entry)
        if comm._telemetry is not None:
            comm._telemetry.record(plan.name, plan.nbytes, t1 - t0)
        if tracer is not None:
            _outcome.trace_call(comm, plan, None, t0, t1)
        return None
    if comm._telemetry is not None:
        comm._telemetry.failure(plan.name)
    if tracer is not None:
        _outcome.trace_call(comm, plan, None, t0, t1, failed=type(exc).__name__)
    if isinstance(exc, UnicclError):
        comm._in_data = False  # point-to-point errors stay between the two ranks
        return _outcome.failed(comm, plan, None, comm.timeout if plan.timeout is None else plan.timeout, exc)
    comm._flight.finished(plan.entry, exc)
    return exc


def current() -> _Group | None:
    if not _fp.groups_open():  # none in any thread: no thread-local lookup
        return None
    stack = getattr(_state, "stack", None)
    return stack[0] if stack else None


@contextlib.contextmanager
def group():
    """Batch operations like ncclGroupStart/ncclGroupEnd (nestable)."""
    stack = _state.__dict__.setdefault("stack", [])
    stack.append(_Group() if not stack else stack[0])
    _fp.group_entered()
    try:
        yield
    except BaseException:
        if len(stack) == 1:
            stack[0].discard()
        raise
    else:
        if len(stack) == 1:
            stack[0].run()
    finally:
        _fp.group_left()
        stack.pop()
