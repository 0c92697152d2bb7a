"""Debug output like NCCL_DEBUG: ``UNICCL_DEBUG=WARN|INFO|TRACE``, to stderr or
``UNICCL_DEBUG_FILE`` (``%h`` host, ``%p`` pid, ``%r`` rank expand per process)."""
from __future__ import annotations

import logging
import os
import socket
import sys

from . import _env

TRACE = 5
logging.addLevelName(TRACE, "TRACE")
_LEVELS = {"WARN": logging.WARNING, "WARNING": logging.WARNING, "INFO": logging.INFO, "TRACE": TRACE,
           "DEBUG": logging.DEBUG}

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
        path = (path.replace("%h", socket.gethostname()).replace("%p", str(os.getpid()))
                .replace("%r", str(rank if rank is not None else "")))
        handler: logging.Handler = logging.FileHandler(path)
    else:
        handler = logging.StreamHandler(sys.stderr)
    prefix = f"{socket.gethostname()}:{os.getpid()}" + (f" [{rank}]" if rank is not None else "")
    handler.setFormatter(logging.Formatter(f"{prefix} uniccl %(levelname)s %(message)s"))
    logger.addHandler(handler)
    logger.setLevel(level)
    logger.propagate = False
