"""uniccl: one collective-communication API for every accelerator.

    import uniccl
    with uniccl.init() as comm:
        comm.all_reduce(x)

The public names are listed in ``__all__``; everything else lives in private
modules (``_communicator``, ``_algorithms``, ``_plugins`` ...).
"""
from __future__ import annotations

from ._communicator import UNDEFINED, Communicator
from ._errors import (InternalError, InvalidArgument, InvalidUsage, PlatformUnavailable, RemoteError,
                      Timeout, UnicclError, VendorError)
from ._executor import Work
from ._group import group
from ._info import info
from ._world import init
from ._types import DType, ReduceOp
from ._uniqueid import UniqueId, get_unique_id
from ._version import __version__
from .hookspecs import UNICCL_PLUGIN_API, hookimpl

SUM, PROD, MAX, MIN, AVG = ReduceOp.SUM, ReduceOp.PROD, ReduceOp.MAX, ReduceOp.MIN, ReduceOp.AVG

__all__ = [
    "AVG", "MAX", "MIN", "PROD", "SUM", "UNDEFINED", "UNICCL_PLUGIN_API",
    "Communicator", "DType", "ReduceOp", "UniqueId", "Work",
    "InternalError", "InvalidArgument", "InvalidUsage", "PlatformUnavailable", "RemoteError", "Timeout",
    "UnicclError", "VendorError",
    "__version__", "get_unique_id", "group", "hookimpl", "info", "init",
]
