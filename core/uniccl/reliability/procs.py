"""What ``/proc`` says of a process of this host: its state (running, asleep, stopped by SIGSTOP
or a debugger, in uninterruptible I/O, a zombie, gone), for the errors that name a stuck peer,
the redials of broken connections and ``uniccl doctor``.  A pid is checked against the start
time its process published, where there is one: a recycled pid is another process."""

from __future__ import annotations

#: what each state letter of /proc/<pid>/stat means for a peer that did not come ("": no such process)
MEANING = {
    "R": "running: computing outside uniccl",
    "S": "asleep outside uniccl (blocked elsewhere: I/O, a lock, a sleep, a wait on something else)",
    "D": "in uninterruptible I/O (a disk, NFS, a device driver)",
    "T": "stopped (a SIGSTOP, or a debugger)",
    "t": "stopped by a debugger (tracing)",
    "Z": "a zombie: it exited and its parent has not reaped it",
    "X": "dead",
    "": "gone: no such process",
}


def state(pid: int, start: int | None = None) -> str:
    """The state letter of process ``pid`` in /proc (``MEANING``'s keys), "" when it is not
    there or is another process than the one started at ``start`` (clock ticks since boot)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return ""
    if start is not None and (len(fields) < 20 or int(fields[19]) != start):
        return ""
    return fields[0].decode()


def start_time() -> int | None:
    """This process's start time in /proc (clock ticks since boot): with the pid, names it."""
    try:
        with open("/proc/self/stat", "rb") as f:
            return int(f.read().rsplit(b")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def stopped(s: str) -> bool:
    return s in ("T", "t")


def gone(s: str) -> bool:
    return s in ("", "Z", "X")
