"""Traces: ``UNICCL_TRACE=DIR`` writes one Chrome/Perfetto trace per rank.

Spans: one per collective or point-to-point call (operation, bytes, sequence number,
algorithm, transport) on the rank's "calls" track, and over TCP one per message sent or
received, on a track per peer ("send to 3", "recv from 1").  Timestamps are the wall clock
in microseconds; each file records the rank's clock offset from rank 0, measured when the
first communicator is made (a ping-pong with rank 0, the exchange of least round trip
kept), which ``uniccl trace merge DIR`` subtracts to put every rank on one timeline.

Files are written when the process exits (and by :func:`flush`), also when SIGTERM (the
launcher's stop or ``--timeout``) or Ctrl-C ends it, with a span marked ``unfinished`` for
each call still running then (:func:`uniccl.observability.flight.arm_signal_dumps`):
``DIR/uniccl-trace-r<rank>.json``, and the communicators' :meth:`stats` beside them as
``DIR/uniccl-stats-r<rank>.json``, which ``uniccl report`` reads too.
"""

from __future__ import annotations

import atexit
import glob
import json
import os
import socket
import sys
import threading
import time
import weakref

from .. import _safefs

_tracer = None
_lock = threading.Lock()


def directory() -> str | None:
    return os.environ.get("UNICCL_TRACE") or None


class Tracer:
    """One process's events (all its communicators), kept in memory until written."""

    def __init__(self, path: str, rank: int, size: int):
        self.dir, self.rank, self.size = path, rank, size
        self.pid = os.getpid()  # whose files these are
        self.events: list = []
        self.offset_us = 0.0  # this clock minus rank 0's
        self.rtt_us = 0.0
        self.comms: list = []  # weak references: their stats are written beside the trace
        self.final: list = []  # the stats of communicators destroyed before the end
        self._tids: dict = {"calls": 1}

    def tid(self, name: str) -> int:
        t = self._tids.get(name)
        if t is None:
            with _lock:
                t = self._tids.setdefault(name, len(self._tids) + 1)
        return t

    def span(self, name: str, track: str, t0_ns: int, t1_ns: int, args: dict) -> None:
        self.events.append((name, self.tid(track), t0_ns, t1_ns, args))

    def write(self) -> str:
        os.makedirs(self.dir, exist_ok=True)
        events = [
            {
                "ph": "M",
                "name": "process_name",
                "pid": self.rank,
                "tid": 0,
                "args": {"name": f"rank {self.rank} ({socket.gethostname()}, pid {os.getpid()})"},
            },
            {"ph": "M", "name": "process_sort_index", "pid": self.rank, "tid": 0, "args": {"sort_index": self.rank}},
        ]
        # (copies: this may run on the signal watcher's thread while the program adds to them)
        for track, tid in sorted(dict(self._tids).items(), key=lambda kv: kv[1]):
            events.append({"ph": "M", "name": "thread_name", "pid": self.rank, "tid": tid, "args": {"name": track}})
        for name, tid, t0, t1, args in list(self.events):
            events.append(
                {
                    "ph": "X",
                    "name": name,
                    "cat": "uniccl",
                    "pid": self.rank,
                    "tid": tid,
                    "ts": t0 / 1e3,
                    "dur": max(0.0, (t1 - t0) / 1e3),
                    "args": args,
                }
            )
        meta = {
            "rank": self.rank,
            "size": self.size,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "clock_offset_us": self.offset_us,
            "clock_rtt_us": self.rtt_us,
        }
        path = os.path.join(self.dir, f"uniccl-trace-r{self.rank}.json")
        _write_json(path, {"traceEvents": events, "displayTimeUnit": "ms", "otherData": meta})
        stats = self.final + [c.stats() for c in (r() for r in self.comms) if c is not None and not c.destroyed]
        _write_json(os.path.join(self.dir, f"uniccl-stats-r{self.rank}.json"), {"rank": self.rank, "comms": stats})
        return path


def _write_json(path: str, obj) -> None:
    _safefs.write_file(path, json.dumps(obj))  # a private temporary file renamed: never through a link


def attach(comm) -> Tracer | None:
    """The process's tracer (made, and its clock aligned with rank 0, with the first
    communicator: every rank makes that one together), or None when tracing is off."""
    global _tracer
    path = directory()
    if path is None:
        return None
    if _tracer is None:
        tracer = Tracer(path, comm.rank, comm.size)
        tracer.offset_us, tracer.rtt_us = _align(comm)
        _tracer = tracer
        atexit.register(flush)
    _tracer.comms.append(weakref.ref(comm))
    return _tracer


def flush() -> str | None:
    """Write this process's trace and stats now (also done at exit; never from a forked child,
    whose files would overwrite its parent's)."""
    if _tracer is None or _tracer.pid != os.getpid():
        return None
    return _tracer.write()


def _align(comm, rounds: int = 8) -> tuple[float, float]:
    """(offset, round trip) in microseconds of this rank's wall clock against rank 0's: rank 0
    pings each rank in turn; the answer with the least round trip gives the offset."""
    import numpy as np

    if comm.size == 1:
        return 0.0, 0.0
    buf = np.zeros(1, np.float64)
    best = [(float("inf"), 0.0)] * comm.size
    for r in range(1, comm.size):
        for _ in range(rounds):
            if comm.rank == 0:
                t0 = time.time_ns()
                comm.send(buf, r)
                comm.recv(buf, r)
                t1 = time.time_ns()
                rtt = (t1 - t0) / 1e3
                if rtt < best[r][0]:
                    best[r] = (rtt, buf[0] - (t0 + t1) / 2e3)
            elif comm.rank == r:
                comm.recv(buf, 0)
                buf[0] = time.time_ns() / 1e3
                comm.send(buf, 0)
    table = comm.broadcast_object([(0.0, 0.0)] + best[1:] if comm.rank == 0 else None)
    rtt, offset = table[comm.rank]
    return float(offset), float(rtt if rtt != float("inf") else 0.0)


def load(path: str) -> dict:
    """rank -> (its file's metadata, its events on rank 0's clock) of every trace in ``path``."""
    out = {}
    for f in glob.glob(os.path.join(path, "uniccl-trace-r*.json")):
        with open(f) as fh:
            doc = json.load(fh)
        meta = doc.get("otherData", {})
        shift = float(meta.get("clock_offset_us", 0.0))
        events = [dict(ev, ts=ev["ts"] - shift) if "ts" in ev else ev for ev in doc["traceEvents"]]
        out[int(meta.get("rank", len(out)))] = (meta, events)
    return dict(sorted(out.items()))


def merge(path: str, out: str | None = None) -> str:
    """Every rank's trace in ``path`` on one timeline (rank 0's clock): the merged file's path."""
    ranks = load(path)
    if not ranks:
        raise FileNotFoundError(f"no uniccl-trace-r*.json files in {path}")
    out = out or os.path.join(path, "uniccl-trace-merged.json")
    _write_json(
        out,
        {
            "traceEvents": [ev for _, events in ranks.values() for ev in events],
            "displayTimeUnit": "ms",
            "otherData": {"ranks": [meta for meta, _ in ranks.values()]},
        },
    )
    return out


def add_arguments(p) -> None:
    sub = p.add_subparsers(dest="trace_command", required=True)
    m = sub.add_parser("merge", help="every rank's trace in DIR on one timeline (rank 0's clock)")
    m.add_argument("dir", help="the UNICCL_TRACE directory of a job")
    m.add_argument("-o", "--output", help="merged file (default DIR/uniccl-trace-merged.json)")


def main(args) -> int:
    try:
        out = merge(args.dir, args.output)
    except (OSError, ValueError, KeyError) as exc:
        print(f"uniccl trace merge: {exc}", file=sys.stderr)
        return 2
    print(out)
    return 0
