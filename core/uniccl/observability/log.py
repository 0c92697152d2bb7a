"""Debug output like NCCL_DEBUG: ``UNICCL_DEBUG=WARN|INFO|TRACE``, to stderr or
``UNICCL_DEBUG_FILE`` (``%h`` host, ``%p`` pid, ``%r`` rank expand per process)."""

from __future__ import annotations

import logging
import os
import socket
import sys
import tempfile

from .. import _env

TRACE = 5
logging.addLevelName(TRACE, "TRACE")
_LEVELS = {
    "WARN": logging.WARNING,
    "WARNING": logging.WARNING,
    "INFO": logging.INFO,
    "TRACE": TRACE,
    "DEBUG": logging.DEBUG,
}

logger = logging.getLogger("uniccl")
_configured = False


def configure(rank: int | None = None) -> None:
    """Attach the handler the environment asks for (once per process)."""
    global _configured
    if _configured:
        return
    name = _env.choice("UNICCL_DEBUG")  # InvalidArgument for a level it does not know
    _configured = True
    level = _LEVELS[name.upper()] if name else None
    if level is None:
        logger.addHandler(logging.NullHandler())
        return
    path = _env.path("UNICCL_DEBUG_FILE")
    if path:
        path = (
            path.replace("%h", socket.gethostname())
            .replace("%p", str(os.getpid()))
            .replace("%r", str(rank if rank is not None else ""))
        )
        handler: logging.Handler = logging.FileHandler(path)
    else:
        handler = logging.StreamHandler(sys.stderr)
    prefix = f"{socket.gethostname()}:{os.getpid()}" + (f" [{rank}]" if rank is not None else "")
    handler.setFormatter(logging.Formatter(f"{prefix} uniccl %(levelname)s %(message)s"))
    logger.addHandler(handler)
    logger.setLevel(level)
    logger.propagate = False


# ------------------------------------------------------------------ side channels: a warning at startup
_warned: set = set()
_checked: dict = {}


def warn(message: str) -> None:
    """One line on stderr (once per process per message) and in uniccl's log: for something
    the user asked for that cannot be served (not an error: the job runs without it)."""
    if message in _warned:
        return
    _warned.add(message)
    logger.warning(message)
    if not any(type(h) is logging.StreamHandler and h.stream is sys.stderr for h in logger.handlers):
        print(f"uniccl WARNING {message}", file=sys.stderr, flush=True)


def check_writable_dir(name: str, environ=None, probe: bool = True) -> bool:
    """Whether the directory variable ``name`` (unset: nothing to serve, True) can be
    written: it exists as a writable directory or can be made (its nearest existing parent is a
    writable directory).  If not, a warning on stderr now, once per process for each value --
    rather than a file silently missing at exit.  ``probe=False``: the path alone is looked at,
    no file is made there (its writer says itself when a write fails)."""
    where = _env.raw(name, environ)
    if where is None:
        return True
    key = (name, where)
    if key not in _checked:
        reason = _unwritable(where, probe)
        _checked[key] = reason is None
        if reason:
            warn(f"{name}={where!r} cannot be written ({reason}): nothing will be written there")
    return _checked[key]


def _unwritable(where: str, make_file: bool = True) -> str | None:
    """None when ``where`` is (or can become) a directory this process can write, else why not
    (``make_file``: by making a file there; else only whether it is, or can be, a directory)."""
    probe = os.path.abspath(os.path.expanduser(where))
    while not os.path.lexists(probe):
        parent = os.path.dirname(probe)
        if parent == probe:
            return "no such directory"
        probe = parent
    if not os.path.isdir(probe):
        return f"{probe} is not a directory"
    if not make_file:
        return None
    try:
        fd, tmp = tempfile.mkstemp(prefix=".uniccl-probe-", dir=probe)
    except OSError as exc:
        return exc.strerror or str(exc)
    os.close(fd)
    os.unlink(tmp)
    return None
