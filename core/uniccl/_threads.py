"""uniccl's background threads: started with the signals Python handles blocked in them.

A process-directed signal (Ctrl-C's SIGINT, SIGTERM, SIGHUP) may be delivered to any thread that
does not block it.  Python runs its handler in the main thread, but if the kernel picked one of
our threads the main thread is not woken: a rank asleep in ``time.sleep`` (or in any wait)
stays asleep and Ctrl-C does nothing until the launcher's SIGTERM (seen in full-suite runs: a
rank over TCP ignored SIGINT for 30 s with the signal taken by a reader thread).  Blocking them
in every thread uniccl starts leaves the main thread (or the user's threads) to take them.
"""

from __future__ import annotations

import signal
import threading

#: what Python (and uniccl's launcher and flight recorder) handle in the main thread
MAIN_THREAD_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)


def _run(target, args, kwargs):
    signal.pthread_sigmask(signal.SIG_BLOCK, MAIN_THREAD_SIGNALS)
    target(*args, **kwargs)


def thread(target, *, name: str | None = None, args: tuple = (), kwargs: dict | None = None, daemon: bool = True):
    """A ``threading.Thread`` (not started) running ``target`` with those signals blocked."""
    return threading.Thread(target=_run, args=(target, args, kwargs or {}), name=name, daemon=daemon)


def start(target, *, name: str | None = None, args: tuple = (), daemon: bool = True) -> threading.Thread:
    """``thread(...)``, started."""
    t = thread(target, name=name, args=args, daemon=daemon)
    t.start()
    return t
