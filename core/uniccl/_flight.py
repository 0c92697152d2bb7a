"""The flight recorder: every communicator's last operations, for post-mortems.

Each communicator keeps a ring of its last ``UNICCL_FLIGHT_RECORDER`` operations
(default 2048; 0 turns it off): sequence number, operation, dtype, count,
root/peer, the path it took (transport and algorithm, native library, staging),
its state (enqueued, started, completed, failed), wall-clock timestamps and the
caller's source line.  On a timeout or a failure that involves other ranks the
ring is written to ``$UNICCL_DUMP_DIR/uniccl-flight-<communicator>-r<rank>.json``
(and on demand with :meth:`Communicator.dump_flight_recorder`); ``uniccl doctor
DIR`` lines the ranks' files up (:mod:`uniccl._doctor`).

Cost: one small object and a walk up two or three stack frames per call.
"""
from __future__ import annotations

import collections
import json
import os
import socket
import sys
import time

_PACKAGE = os.path.dirname(os.path.abspath(__file__)) + os.sep
DEFAULT_CAPACITY = 2048


def capacity() -> int:
    try:
        return max(0, int(os.environ.get("UNICCL_FLIGHT_RECORDER", DEFAULT_CAPACITY)))
    except ValueError:
        return DEFAULT_CAPACITY


def call_site() -> str:
    """``file:line (function)`` of the first frame outside uniccl: the user's call."""
    f = sys._getframe(2)
    while f is not None and f.f_code.co_filename.startswith(_PACKAGE):
        f = f.f_back
    if f is None:
        return "?"
    return f"{f.f_code.co_filename}:{f.f_lineno} ({f.f_code.co_name})"


class Entry:
    __slots__ = ("seq", "op", "dtype", "count", "root", "peer", "path", "state", "t_enqueued", "t_started",
                 "t_completed", "site", "error")

    def __init__(self, op: str, site: str):
        self.op, self.site = op, site
        self.seq = self.dtype = self.count = self.root = self.peer = None
        self.path, self.state, self.error = "", "enqueued", None
        self.t_enqueued, self.t_started, self.t_completed = time.time(), None, None

    def as_dict(self) -> dict:
        return {k: getattr(self, k) for k in self.__slots__}


class FlightRecorder:
    def __init__(self, name: str, rank: int, size: int, cap: int | None = None):
        self.name, self.rank, self.size = name, rank, size
        self.entries: collections.deque = collections.deque(maxlen=capacity() if cap is None else cap)
        self.enabled = self.entries.maxlen > 0

    def enqueue(self, op: str) -> Entry | None:
        if not self.enabled:
            return None
        entry = Entry(op, call_site())
        self.entries.append(entry)
        return entry

    def started(self, entry: Entry | None, seq: int, plan) -> None:
        if entry is None:
            return
        entry.seq, entry.state, entry.t_started = seq, "started", time.time()
        entry.dtype = plan.dtype if plan.dtype >= 0 else None
        entry.count = plan.count if plan.count >= 0 else None
        if plan.p2p:
            entry.peer = plan.root
        elif plan.root >= 0:
            entry.root = plan.root

    @staticmethod
    def finished(entry: Entry | None, error: BaseException | None = None) -> None:
        if entry is None:
            return
        entry.t_completed = time.time()
        if error is None:
            entry.state = "completed"
        else:
            entry.state, entry.error = "failed", f"{type(error).__name__}: {error}"

    def snapshot(self, reason: str = "on demand", error: BaseException | None = None) -> dict:
        from ._types import dtype_name

        ops = []
        for e in list(self.entries):
            d = e.as_dict()
            if d["dtype"] is not None:
                d["dtype"] = dtype_name(d["dtype"])
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
        os.makedirs(directory, exist_ok=True)
        safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in self.name)
        path = os.path.join(directory, f"uniccl-flight-{safe}-r{self.rank}.json")
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            json.dump(self.snapshot(reason, error), f, indent=1, default=str)
        os.replace(tmp, path)
        return path
