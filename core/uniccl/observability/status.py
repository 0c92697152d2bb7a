"""Live status files for ``uniccl top``: with ``UNICCL_STATUS_DIR`` set (``uniccl run`` sets it
for every job, under ``/tmp/uniccl-<uid>/jobs/``), each process rewrites
``<dir>/rank-<rank>.json`` twice a second from a background thread: the call each of its
communicators is in (operation, sequence number, for how long), calls done, bus bandwidth,
the peer a TCP wait is waiting on, retransmissions.  Nothing runs on the call path.
"""

from __future__ import annotations

import atexit
import json
import os
import socket
import stat
import tempfile
import threading
import time
import weakref

from .. import _env, _safefs, _threads
from . import flight as _fl
from . import telemetry as _tel

INTERVAL = 0.5
_PAD = 512  # the file's length is a multiple of this
_writer = None
_lock = threading.Lock()


def directory() -> str | None:
    return _env.path("UNICCL_STATUS_DIR")


def jobs_root() -> str:
    return os.path.join(tempfile.gettempdir(), f"uniccl-{os.getuid()}", "jobs")


def prepare(path: str, ranks: int) -> None:
    """Make the empty files of ``ranks`` ranks in the job's status directory ``path`` (the
    launcher's, before the ranks start): a rank then only opens its own, and a thousand ranks of
    one host do not all change one directory at once (on ext4 they waited seconds so)."""
    for r in range(ranks):
        try:
            os.close(
                os.open(
                    os.path.join(path, f"rank-{r}.json"), os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600
                )
            )
        except FileExistsError:
            pass


def new_job_dir(keep: int = 20) -> str:
    """A fresh directory for one job's status files (made by the launcher); the oldest beyond
    the newest ``keep`` are removed.  ``$TMPDIR/uniccl-<uid>`` and its ``jobs`` are checked
    to be this user's alone first (another user may have planted them, or links in them)."""
    root = jobs_root()
    _safefs.private_dir(os.path.dirname(root), "status directory")
    _safefs.private_dir(root, "status directory")
    path = os.path.join(root, time.strftime("%Y%m%d-%H%M%S") + f"-{os.getpid()}")
    _safefs.private_dir(path, "status directory")
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        ages = {}
        for d in os.listdir(fd):
            if d != os.path.basename(path):
                try:
                    ages[d] = os.lstat(d, dir_fd=fd).st_mtime
                except OSError:
                    continue
    finally:
        os.close(fd)
    old = sorted(ages, key=ages.get)
    _safefs.remove_entries(root, old[: max(0, len(old) - keep + 1)])
    return path


def watch(comm) -> None:
    """Include ``comm`` in this process's status file (started with the first communicator),
    written now: a rank stopped right after init() is still seen, with its pid."""
    global _writer
    path = directory()
    if path is None:
        return
    with _lock:
        if _writer is None:
            _writer = _Writer(path, comm.rank)
            _threads.start(_writer.run, name="uniccl-status")
            atexit.register(_writer.exit)
        _writer.comms.append([weakref.ref(comm), None, None])
    if not _writer.write():
        from . import log

        if log.check_writable_dir("UNICCL_STATUS_DIR", probe=False):  # (else it said so already)
            log.warn(f"UNICCL_STATUS_DIR={path!r} cannot be written: uniccl top will not see rank {comm.rank}")


def closed(comm) -> None:
    """``comm`` was destroyed: its final counts stay in the status file, written now (a
    finished job reads as finished in ``uniccl top``, not as a rank that fell behind)."""
    w = _writer
    if w is not None and w.pid == os.getpid():
        w.close(comm)


class _Writer:
    def __init__(self, path: str, rank: int):
        self.path, self.rank = path, rank
        # [weak reference, its final status once destroyed (else None), its last status written]
        self.comms: list = []
        self.prev: dict = {}  # communicator name -> (time, bus bytes) at the last write
        self.exited = False
        self.pid = os.getpid()
        self._write_lock = threading.Lock()  # the thread, destroy() and exit all write
        # the file, once made, is rewritten in place: replacing it by rename made ext4 write
        # it out each time (~0.4 ms, 1 s and more per write with a thousand ranks on one disk);
        # a reader that meets a half-written file reads it again (tools.top.read)
        self._fd: int | None = None
        self._size = 0

    def run(self) -> None:
        while not self.exited:
            time.sleep(INTERVAL)
            self.write()

    def write(self, final: bool = False) -> bool:
        """Write the file now; whether it was written."""
        try:
            with self._write_lock:
                if self.exited and not final:  # (the thread, after exit's last write: a daemon thread
                    return True  # stopped mid-write by the interpreter's exit would leave its temporary file)
                data = json.dumps(self.snapshot()).encode()
                data += b" " * (-len(data) % _PAD)  # (JSON ends in spaces: the length rarely changes)
                if self._fd is None:
                    self._open()
                os.pwrite(self._fd, data, 0)
                if len(data) < self._size:
                    os.ftruncate(self._fd, len(data))
                self._size = len(data)
                return True
        except Exception:  # a status file is never worth failing the job for
            return False

    def _open(self) -> None:
        """Open this rank's file, made by the launcher (:func:`prepare`) or else made now (never
        through a planted link: O_NOFOLLOW, a plain file of this user's, O_EXCL to make it), and
        keep it open: the writes are in place, and no rank changes the shared directory."""
        target = os.path.join(self.path, f"rank-{self.rank}.json")
        flags = os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC
        try:
            fd = os.open(target, flags)
        except FileNotFoundError:
            os.makedirs(self.path, mode=0o700, exist_ok=True)
            fd = os.open(target, flags | os.O_CREAT | os.O_EXCL, 0o600)
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid():
            os.close(fd)
            raise PermissionError(f"{target} is not a plain file of this user's")
        self._fd, self._size = fd, st.st_size

    def close(self, comm) -> None:
        now = time.time()
        for item in self.comms:
            if item[0]() is comm and item[1] is None:
                item[1] = self._comm(comm, now)
                item[1]["destroyed"] = True
        self.write()

    def exit(self) -> None:
        """At interpreter exit: the last status, marked exited (not a forked child's exit: the
        file is its parent's)."""
        if os.getpid() != self.pid:
            return
        for item in self.comms:
            c = item[0]()
            if item[1] is None and c is not None:
                item[1] = self._comm(c, time.time())
        self.exited = True
        self.write(final=True)

    def snapshot(self) -> dict:
        now = time.time()
        comms = []
        for item in list(self.comms):
            ref, final, last = item
            c = ref() if final is None else None
            if final is not None:
                comms.append(final)
            elif c is not None:
                item[2] = self._comm(c, now)
                comms.append(item[2])
            elif last is not None:  # collected without destroy(): as it was last seen
                item[1] = dict(last, destroyed=True)
                comms.append(item[1])
        done = bool(comms) and all(c.get("destroyed") for c in comms)
        state = "exited" if self.exited else "finished" if done else "running"
        return {
            "rank": self.rank,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "time": now,
            "state": state,
            "comms": comms,
        }

    def _comm(self, c, now: float) -> dict:
        out = {
            "name": c.name,
            "rank": c.rank,
            "size": c.size,
            "transport": c.tuner.transport,
            "calls": c.calls,
            "destroyed": c.destroyed,
        }
        last = c.last_operation()
        if last is not None:
            state = last[_fl.STATE]
            out["op"], out["seq"], out["state"] = last[_fl.OP], last[_fl.SEQ], state
            since = last[_fl.T_START] if state == "started" else last[_fl.T_END] or last[_fl.T_ENQ]
            out["for_s"] = max(0.0, now - since) if since else None
            if last[_fl.ERROR]:
                out["error"] = last[_fl.ERROR]
        t = c.telemetry
        if t is not None:  # bus bytes moved since the last write, over the time since then
            bus = sum(s.nbytes * _tel.bus_factor(op, c.size) for (op, _), s in list(t.ops.items()))
            t0, b0 = self.prev.get(id(c), (now, bus))
            self.prev[id(c)] = (now, bus)
            out["busbw_GBps"] = (bus - b0) / (now - t0) / 1e9 if now > t0 else 0.0
        arrival = c.arrivals()
        if arrival is not None and arrival["calls"]:
            out["last_share"] = arrival["last_share"]  # the calls it arrived last in (uniccl top's LAST)
        mesh = c.mesh
        if mesh is not None:
            out["retransmits"] = mesh.stats["retransmits"] + mesh.stats["retransmit_requests"]
            out["reconnects"] = {str(r): n for r, n in c.reconnects().items()}  # redialled links (heal.py)
            waiting = c.waiting_on()
            if waiting is not None:
                out["waiting_on"], out["waiting_s"] = waiting
        return out
