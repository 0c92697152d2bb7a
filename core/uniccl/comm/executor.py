"""In-order background execution: the engine behind ``async_op=True``.

One ``SerialExecutor`` per communicator runs submitted operations one after
another on a daemon thread, so outstanding operations complete in issue order
(the same order on every rank, which the collectives rely on).
"""

from __future__ import annotations

import collections
import threading

from .. import _threads
from .._errors import Timeout


class Work:
    """Handle of an operation: ``wait()`` returns its result or raises its error."""

    __slots__ = ("_done", "_result", "_error", "op")

    def __init__(self, op: str = ""):
        self.op = op
        self._done = threading.Event()
        self._result = None
        self._error: BaseException | None = None

    def _finish(self, result=None, error: BaseException | None = None) -> None:
        self._result, self._error = result, error
        self._done.set()

    def is_completed(self) -> bool:
        return self._done.is_set()

    def wait(self, timeout: float | None = None):
        if not self._done.wait(timeout):
            raise Timeout(f"not completed within {timeout} s", op=self.op)
        if self._error is not None:
            raise self._error
        return self._result

    def result(self):
        return self.wait()

    def exception(self):
        self._done.wait()
        return self._error

    def __repr__(self):
        state = "completed" if self.is_completed() else "pending"
        return f"<uniccl.Work {self.op} {state}>"


class SerialExecutor:
    def __init__(self, name: str, state=None):
        self._name = name
        self._state = state  # the communicator's CallState: its ``pending`` counts what is here
        self._queue: collections.deque = collections.deque()
        self._cond = threading.Condition()
        self._busy = False
        self._thread: threading.Thread | None = None
        self._closed = False

    def submit(self, fn, work: Work) -> Work:
        with self._cond:
            if self._thread is None:
                self._thread = _threads.thread(self._loop, name=self._name)
                self._thread.start()
            self._queue.append((fn, work))
            if self._state is not None:
                self._state.pending += 1
            self._cond.notify_all()
        return work

    def idle(self) -> bool:
        # Lock-free on purpose (it is on every blocking call's path): both reads are
        # atomic under the GIL, and a submit racing from another thread is unordered
        # with respect to this call anyway.
        return not self._queue and not self._busy

    def drain(self) -> None:
        """Wait until everything submitted so far has finished."""
        with self._cond:
            while self._queue or self._busy:
                self._cond.wait()

    def close(self) -> None:
        with self._cond:
            while self._queue or self._busy:
                self._cond.wait()
            self._closed = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join()

    def abandon(self) -> None:
        """Abort: fail what has not started, let the running call end on its own, wait for
        nothing."""
        from .._errors import InvalidUsage

        with self._cond:
            pending, self._queue = list(self._queue), collections.deque()
            if self._state is not None:
                self._state.pending -= len(pending)
            self._closed = True
            self._cond.notify_all()
        for _, work in pending:
            work._finish(error=InvalidUsage("the communicator was aborted before this operation started", op=work.op))

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._closed:
                    self._cond.wait()
                if not self._queue:
                    return
                fn, work = self._queue.popleft()
                self._busy = True
            try:
                work._finish(result=fn())
            except BaseException as exc:  # delivered by Work.wait()
                work._finish(error=exc)
            with self._cond:
                self._busy = False
                if self._state is not None:
                    self._state.pending -= 1
                self._cond.notify_all()
