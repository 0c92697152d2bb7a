"""uniccl: one collective-communication API for every accelerator.

    import uniccl
    with uniccl.init() as comm:
        comm.all_reduce(x)

The public names are listed in ``__all__``; everything else lives in private
modules (``_communicator``, ``_algorithms``, ``_plugins`` ...).
"""

from __future__ import annotations

from ._errors import (
    InternalError,
    InvalidArgument,
    InvalidUsage,
    PlatformUnavailable,
    RemoteError,
    Revoked,
    Timeout,
    UnicclError,
    VendorError,
)
from ._types import DType, ReduceOp
from ._version import __version__
from .bootstrap.rendezvous import UniqueId, get_unique_id
from .comm.communicator import UNDEFINED, Communicator
from .comm.executor import Work
from .comm.group import group
from .comm.world import init
from .hookspecs import UNICCL_PLUGIN_API, hookimpl
from .tools.info import info

SUM, PROD, MAX, MIN, AVG = ReduceOp.SUM, ReduceOp.PROD, ReduceOp.MAX, ReduceOp.MIN, ReduceOp.AVG

__all__ = [
    "AVG",
    "MAX",
    "MIN",
    "PROD",
    "SUM",
    "UNDEFINED",
    "UNICCL_PLUGIN_API",
    "Communicator",
    "DType",
    "ReduceOp",
    "UniqueId",
    "Work",
    "InternalError",
    "InvalidArgument",
    "InvalidUsage",
    "PlatformUnavailable",
    "RemoteError",
    "Revoked",
    "Timeout",
    "UnicclError",
    "VendorError",
    "__version__",
    "get_unique_id",
    "group",
    "hookimpl",
    "info",
    "init",
]
