"""The flight recorder: every communicator's last operations, for post-mortems.

Each communicator keeps a ring of its last ``UNICCL_FLIGHT_RECORDER`` operations
(default 2048; 0 turns it off): sequence number, operation, dtype, count,
root/peer, the path it took (transport and algorithm, native library, staging),
its state (enqueued, started, completed, failed), wall-clock timestamps and the
caller's source line.  On a timeout or a failure that involves other ranks the
ring is written to ``$UNICCL_DUMP_DIR/uniccl-flight-<communicator>-r<rank>.json``
(and on demand with :meth:`Communicator.dump_flight_recorder`); ``uniccl doctor
DIR`` lines the ranks' files up (:mod:`uniccl._doctor`).

Cost: one small list per call (the source line is kept as code object and line number,
formatted only when the record is dumped).
"""
from __future__ import annotations

import collections
import json
import os
import socket
import threading
import time

from . import _safefs

DEFAULT_CAPACITY = 2048


def capacity() -> int:
    try:
        return max(0, int(os.environ.get("UNICCL_FLIGHT_RECORDER", DEFAULT_CAPACITY)))
    except ValueError:
        return DEFAULT_CAPACITY


# An entry is a list (cheaper to make than an object): these are its fields, in order.
FIELDS = ("seq", "op", "dtype", "count", "root", "peer", "path", "state", "t_enqueued", "t_started",
          "t_completed", "code", "line", "error")
SEQ, OP, DTYPE, COUNT, ROOT, PEER, PATH, STATE, T_ENQ, T_START, T_END, CODE, LINE, ERROR = range(len(FIELDS))


def site(code, line) -> str:
    """``file:line (function)`` of a recorded call."""
    if code is None:
        return "?"
    return f"{code.co_filename}:{line} ({code.co_name})"


class FlightRecorder:
    def __init__(self, name: str, rank: int, size: int, cap: int | None = None):
        self.name, self.rank, self.size = name, rank, size
        self.entries: collections.deque = collections.deque(maxlen=capacity() if cap is None else cap)
        self.enabled = self.entries.maxlen > 0

    def enqueue(self, op: str, frame) -> list | None:
        """Record a call of ``op`` made from ``frame`` (the caller's: where the user called)."""
        if not self.enabled:
            return None
        entry = [None, op, None, None, None, None, "", "enqueued", time.time(), None, None, frame.f_code,
                 frame.f_lineno, None]
        self.entries.append(entry)
        return entry

    @staticmethod
    def started(entry: list | None, seq, plan, queued: bool) -> None:
        """The call starts (``queued``: it waited behind earlier async work)."""
        if entry is None:
            return
        entry[SEQ], entry[STATE] = seq, "started"
        entry[T_START] = time.time() if queued else entry[T_ENQ]
        entry[DTYPE], entry[COUNT] = plan.dtype, plan.count  # -1: none (shown as null)
        entry[PEER if plan.p2p else ROOT] = plan.root

    @staticmethod
    def finished(entry: list | None, error: BaseException | None = None) -> None:
        if entry is None:
            return
        entry[T_END] = time.time()
        if error is None:
            entry[STATE] = "completed"
        else:
            entry[STATE], entry[ERROR] = "failed", f"{type(error).__name__}: {error}"

    def snapshot(self, reason: str = "on demand", error: BaseException | None = None) -> dict:
        from ._types import dtype_name

        for _ in range(100):  # another thread may be recording a call (no lock on that hot path)
            try:
                entries = [list(e) for e in self.entries]
                break
            except RuntimeError:  # deque mutated during iteration: copy again
                continue
        else:
            entries = []
        ops = []
        for e in entries:
            d = dict(zip(FIELDS, e))
            d["site"] = site(d.pop("code"), d.pop("line"))
            for k in ("dtype", "count", "root", "peer"):
                if d[k] is not None and d[k] < 0:
                    d[k] = None
            if d["dtype"] is not None:
                d["dtype"] = dtype_name(d["dtype"])
            path = d["path"]  # a string, or the tuner's choice (formatted here, not per call)
            if not isinstance(path, str):
                d["path"] = "shm" if path.transport == "shm" else f"{path.transport}:{path.algorithm}"
            ops.append(d)
        return {"communicator": self.name, "rank": self.rank, "size": self.size, "pid": os.getpid(),
                "host": socket.gethostname(), "time": time.time(), "reason": reason,
                "error": None if error is None else {"type": type(error).__name__, "message": str(error),
                                                     "missing_ranks": getattr(error, "missing_ranks", None),
                                                     "remote_rank": getattr(error, "remote_rank", None)},
                "ops": ops}

    def dump(self, directory: str | None = None, reason: str = "on demand",
             error: BaseException | None = None) -> str | None:
        """Write the ring as JSON; returns the file's path (None: no directory given or set)."""
        directory = directory or os.environ.get("UNICCL_DUMP_DIR")
        if not directory:
            return None
        safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in self.name)
        path = os.path.join(directory, f"uniccl-flight-{safe}-r{self.rank}.json")
        try:
            os.makedirs(directory, exist_ok=True)
            # a private temporary file of its own (two threads may dump at once), renamed
            _safefs.write_file(path, json.dumps(self.snapshot(reason, error), indent=1, default=str))
        except OSError as exc:  # a dump must never replace the error it documents
            from ._log import logger

            logger.warning("rank %d: could not write the flight recorder to %s: %s", self.rank, path, exc)
            return None
        return path
