"""The flight recorder: every communicator's last operations, for post-mortems.

Each communicator keeps a ring of its last ``UNICCL_FLIGHT_RECORDER`` operations
(default 2048; 0 turns it off): sequence number, operation, dtype, count,
root/peer, the path it took (transport and algorithm, native library, staging),
its state (enqueued, started, completed, failed), wall-clock timestamps and the
caller's source line.  On a timeout or a failure that involves other ranks the
ring is written to ``$UNICCL_DUMP_DIR/uniccl-flight-<communicator>-r<rank>.json``
(and on demand with :meth:`Communicator.dump_flight_recorder`); ``uniccl doctor
DIR`` lines the ranks' files up (:mod:`uniccl.tools.doctor`).

Cost: one small list per call (the source line is kept as code object and instruction
offset, turned into a line only when the record is dumped); on the compiled path
(:mod:`uniccl.comm._fastpath`) the list is made in C.

Signals (:func:`arm_signal_dumps`, at communicator creation when ``UNICCL_TRACE`` or
``UNICCL_DUMP_DIR`` is set): a rank ended by SIGTERM (``uniccl run``'s stop, its ``--timeout``,
a batch system) or by Ctrl-C still writes its trace and its flight recorder, reason
``SIGTERM``/``SIGINT``, with a span per unfinished call in the trace.  SIGTERM gets a handler
only where it has none (``SIG_DFL``; never over one of the user's): it writes the files, then
restores the default and kills the process with SIGTERM again, so its exit status is still
"killed by SIGTERM".  A main thread stuck in a long C call (an MPI wait) runs no Python
handler until the call returns, so a watcher thread reads ``signal.set_wakeup_fd``'s pipe and
does the same at once.  Ctrl-C stays Python's KeyboardInterrupt: the files are written at
exit.  Nothing of this is on the per-call path.
"""

from __future__ import annotations

import atexit
import collections
import json
import os
import signal
import socket
import sys
import threading
import time
import weakref

from .. import _safefs, _threads

DEFAULT_CAPACITY = 2048


def capacity() -> int:
    try:
        return max(0, int(os.environ.get("UNICCL_FLIGHT_RECORDER", DEFAULT_CAPACITY)))
    except ValueError:
        return DEFAULT_CAPACITY


# An entry is a list (cheaper to make than an object): these are its fields, in order.
FIELDS = (
    "seq",
    "op",
    "dtype",
    "count",
    "root",
    "peer",
    "path",
    "state",
    "t_enqueued",
    "t_started",
    "t_completed",
    "code",
    "lasti",
    "error",
)
SEQ, OP, DTYPE, COUNT, ROOT, PEER, PATH, STATE, T_ENQ, T_START, T_END, CODE, LASTI, ERROR = range(len(FIELDS))


def site(code, lasti) -> str:
    """``file:line (function)`` of a recorded call: the caller's code object and the offset of
    its calling instruction (``frame.f_lasti``), turned into a line only here -- finding a line
    walks the code's line table, too slow for every call of a long function."""
    if code is None:
        return "?"
    line = code.co_firstlineno
    for start, end, lineno in code.co_lines():
        if start <= lasti < end:
            line = lineno if lineno is not None else line
            break
    return f"{code.co_filename}:{line} ({code.co_name})"


class FlightRecorder:
    def __init__(self, name: str, rank: int, size: int, cap: int | None = None):
        self.name, self.rank, self.size = name, rank, size
        self.entries: collections.deque = collections.deque(maxlen=capacity() if cap is None else cap)
        self.enabled = self.entries.maxlen > 0
        # (error, processes) of the last dump written for a failure: a later dump (the signal that
        # then ends the process) keeps them, so that it does not replace the cause with "SIGTERM"
        self._failure: tuple = (None, None)
        # the compiled call path's rows (uniccl.comm._fastpath.Ring: entries(), newest()), or None
        self.compiled = None
        _recorders.add(self)  # dumped when a signal ends the process (see arm_signal_dumps)

    def enqueue(self, op: str, frame) -> list | None:
        """Record a call of ``op`` made from ``frame`` (the caller's: where the user called)."""
        if not self.enabled:
            return None
        entry = [
            None,
            op,
            None,
            None,
            None,
            None,
            "",
            "enqueued",
            time.time(),
            None,
            None,
            frame.f_code,
            frame.f_lasti,
            None,
        ]
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

    def all(self) -> list:
        """Copies of every recorded call's entry, oldest first, at most the capacity: the
        general path's entries and the compiled path's rows together."""
        for _ in range(100):  # another thread may be recording a call (no lock on that hot path)
            try:
                entries = [list(e) for e in self.entries]
                break
            except RuntimeError:  # deque mutated during iteration: copy again
                continue
        else:
            entries = []
        if self.compiled is not None:
            entries += self.compiled.entries()
            entries.sort(key=lambda e: e[T_ENQ])
            del entries[: max(0, len(entries) - (self.entries.maxlen or 0))]
        return entries

    def newest(self) -> list | None:
        """The newest recorded call's entry (the general path's live list, or a copy of the
        compiled path's row), or None."""
        mine = self.entries[-1] if self.entries else None
        theirs = self.compiled.newest() if self.compiled is not None else None
        if mine is None or (theirs is not None and theirs[T_ENQ] >= mine[T_ENQ]):
            return theirs
        return mine

    def snapshot(
        self, reason: str = "on demand", error: BaseException | None = None, processes: dict | None = None
    ) -> dict:
        from .._types import dtype_name

        entries = self.all()
        ops = []
        for e in entries:
            d = dict(zip(FIELDS, e))
            d["site"] = site(d.pop("code"), d.pop("lasti"))
            for k in ("dtype", "count", "root", "peer"):
                if d[k] is not None and d[k] < 0:
                    d[k] = None
            if d["dtype"] is not None:
                d["dtype"] = dtype_name(d["dtype"])
            path = d["path"]  # a string, or the tuner's choice (formatted here, not per call)
            if not isinstance(path, str):
                d["path"] = "shm" if path.transport == "shm" else f"{path.transport}:{path.algorithm}"
            ops.append(d)
        return {
            "communicator": self.name,
            "rank": self.rank,
            "size": self.size,
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "time": time.time(),
            "reason": reason,
            "error": None
            if error is None
            else {
                "type": type(error).__name__,
                "message": str(error),
                "missing_ranks": getattr(error, "missing_ranks", None),
                "remote_rank": getattr(error, "remote_rank", None),
                "remote_type": getattr(error, "remote_type", None),
            },
            "processes": processes or {},
            "ops": ops,
        }

    def dump(
        self,
        directory: str | None = None,
        reason: str = "on demand",
        error: BaseException | None = None,
        processes: dict | None = None,
    ) -> str | None:
        """Write the ring as JSON; returns the file's path (None: no directory given or set).
        ``processes``: {rank: host, pid, /proc state} of the ranks the error names."""
        directory = directory or os.environ.get("UNICCL_DUMP_DIR")
        if not directory:
            return None
        if error is not None:
            self._failure = (error, processes)
        else:
            error, processes = self._failure
        safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in self.name)
        path = os.path.join(directory, f"uniccl-flight-{safe}-r{self.rank}.json")
        try:
            os.makedirs(directory, exist_ok=True)
            # a private temporary file of its own (two threads may dump at once), renamed
            _safefs.write_file(path, json.dumps(self.snapshot(reason, error, processes), indent=1, default=str))
        except OSError as exc:  # a dump must never replace the error it documents
            from .log import logger

            logger.warning("rank %d: could not write the flight recorder to %s: %s", self.rank, path, exc)
            return None
        return path


# ------------------------------------------------------------------ signals
_recorders: weakref.WeakSet[FlightRecorder] = weakref.WeakSet()  # every live communicator's
_owner_pid = None  # the process whose files these are (never a forked child's, unless it arms too)
_handler_pid = None  # the process whose SIGTERM handler and watcher are set up
_at_exit_armed = False
_wakeup = None  # (read end, write end) of the pipe given to signal.set_wakeup_fd
_seen: list = []  # signals the watcher saw that Python code handles (Ctrl-C): dump at exit
_ending = threading.Lock()
_reading = threading.Lock()  # held while a byte read from the wakeup pipe is not yet noted
_ending_thread = None  # the thread writing the files before the process dies


def arm_signal_dumps() -> None:
    """With ``UNICCL_TRACE`` or ``UNICCL_DUMP_DIR`` set, make SIGTERM and Ctrl-C leave this
    process's files (see the module doc).  Called at each communicator's creation; the
    handler and the watcher are set up from the main thread only, once per process."""
    global _at_exit_armed, _owner_pid, _handler_pid
    if not (os.environ.get("UNICCL_TRACE") or os.environ.get("UNICCL_DUMP_DIR")):
        return
    if not _at_exit_armed:
        _at_exit_armed = True
        atexit.register(_at_exit)
        os.register_at_fork(after_in_child=_after_fork_in_child)
    _owner_pid = os.getpid()
    if _handler_pid == os.getpid() or threading.current_thread() is not threading.main_thread():
        return
    _handler_pid = os.getpid()
    try:
        if signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, _on_sigterm):  # never over the user's handler
            signal.signal(signal.SIGTERM, _on_sigterm)
    except (ValueError, OSError):
        return
    _start_watcher()


def _start_watcher() -> None:
    global _wakeup
    import ctypes  # noqa: F401 - _die needs it on the watcher's path: imported now, not while dying

    r, w = os.pipe()
    os.set_blocking(w, False)
    os.set_blocking(r, False)  # read only when select says so (see _watch)
    try:
        old = signal.set_wakeup_fd(w, warn_on_full_buffer=False)
    except (ValueError, OSError):
        os.close(r)
        os.close(w)
        return
    if old != -1:  # someone's own (an event loop's): theirs stays; our handler still runs in the main thread
        signal.set_wakeup_fd(old)
        os.close(r)
        os.close(w)
        return
    _wakeup = (r, w)
    _threads.start(_watch, args=(r,), name="uniccl-signals")


def _watch(fd: int) -> None:
    """The wakeup pipe gets one byte per signal that has a Python handler, written by the C
    level handler whatever the main thread is doing.  Bytes are read only under ``_reading``
    (here and at exit, from a non-blocking pipe): a byte this thread had read but not yet
    noted was missed by the exit's check under load (a SIGTERM the program handled itself
    left no files, seen once in a full suite run)."""
    import select

    while True:
        try:
            select.select([fd], [], [])
        except (OSError, ValueError):
            return
        with _reading:
            try:
                data = os.read(fd, 64)
            except BlockingIOError:
                continue  # the exit's drain took it
            except OSError:
                return
            if not data:
                return
            _saw(data)
        if signal.SIGTERM in data and signal.getsignal(signal.SIGTERM) is _on_sigterm:
            _end(signal.SIGTERM)


def _saw(data: bytes) -> None:
    for b in data:
        if b in (signal.SIGINT, signal.SIGHUP) or (b == signal.SIGTERM and signal.getsignal(b) is not _on_sigterm):
            _seen.append(b)


def _after_fork_in_child() -> None:
    """A forked child must not write into its parent's pipe (the parent's watcher would act
    on the child's signals) nor overwrite its parent's files."""
    global _wakeup
    _recorders.clear()  # the parent's communicators: unusable here
    if _wakeup is None:
        return
    r, w = _wakeup
    try:
        old = signal.set_wakeup_fd(-1)
        if old not in (-1, w):
            signal.set_wakeup_fd(old)
    except (ValueError, OSError):
        return  # left as it is: closing the ends could point the wakeup fd at a reused number
    _wakeup = None
    for fd in (r, w):
        try:
            os.close(fd)
        except OSError:
            pass


def _on_sigterm(signum, _frame) -> None:
    _end(signum)


def _end(sig: int) -> None:
    """Write this process's files, then die of ``sig`` as if no handler had been set."""
    global _ending_thread
    me = threading.get_ident()
    if not _ending.acquire(blocking=False):
        if _ending_thread == me:
            return  # the signal again while this thread writes: carry on writing
        if threading.current_thread() is threading.main_thread():
            while True:  # the watcher writes the files and kills the process
                time.sleep(1)
        return
    _ending_thread = me
    if os.getpid() == _owner_pid:
        write_all(signal.Signals(sig).name)
    _die(sig)


def _die(sig: int) -> None:
    try:
        if threading.current_thread() is threading.main_thread():
            signal.signal(sig, signal.SIG_DFL)
        else:  # signal.signal is main-thread only: the C library's own
            import ctypes

            libc = ctypes.CDLL(None, use_errno=True)
            libc.signal.restype = ctypes.c_void_p
            libc.signal.argtypes = (ctypes.c_int, ctypes.c_void_p)
            libc.signal(int(sig), None)  # SIG_DFL
        signal.pthread_sigmask(signal.SIG_UNBLOCK, [sig])
        os.kill(os.getpid(), sig)
        time.sleep(1.0)  # delivered at once, unless every thread blocks it
    except BaseException:
        pass
    os._exit(128 + int(sig))


def write_all(reason: str) -> None:
    """Dump every live communicator's flight recorder (to UNICCL_DUMP_DIR) and write the
    trace (UNICCL_TRACE), with a span for each call still running.  Never raises."""
    from . import trace as _trace

    now_ns = time.time_ns()
    written = []
    tracer = _trace._tracer
    for rec in list(_recorders):
        try:
            if tracer is not None:
                for e in rec.all():
                    if e[STATE] == "started" and e[T_START] is not None:
                        tracer.span(
                            e[OP],
                            "calls",
                            int(e[T_START] * 1e9),
                            now_ns,
                            {"communicator": rec.name, "seq": e[SEQ], "unfinished": reason},
                        )
            path = rec.dump(reason=reason)
            if path:
                written.append(path)
        except Exception:
            pass
    try:
        path = _trace.flush()
        if path:
            written.append(path)
    except Exception:
        pass
    if written:
        rank = next((r.rank for r in list(_recorders)), "?")
        try:  # os.write: sys.stderr's lock may be held by the interrupted code
            os.write(2, f"uniccl: rank {rank}: {reason}: wrote {', '.join(written)}\n".encode())
        except OSError:
            pass


def _at_exit() -> None:
    """Ctrl-C (an uncaught KeyboardInterrupt, or a SIGINT the program caught) ends the
    process through Python's exit: write the flight recorders then (the trace's own atexit
    writes it, after this)."""
    if _ending_thread is not None or os.getpid() != _owner_pid:
        return
    if _wakeup is not None:  # what the watcher has not read yet
        with _reading:
            try:
                while True:
                    data = os.read(_wakeup[0], 64)
                    if not data:
                        break
                    _saw(data)
            except OSError:  # BlockingIOError: nothing left
                pass
    last = getattr(sys, "last_type", None)
    if isinstance(last, type) and issubclass(last, KeyboardInterrupt):
        reason = "SIGINT"
    elif _seen:
        reason = signal.Signals(_seen[0]).name
    else:
        return
    write_all(reason)
