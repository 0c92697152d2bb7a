"""Call timeouts: how long a call may wait for its peers.

Dead peers are detected within seconds whatever the timeout (the shared-memory
engine watches the peers' processes, TCP sees the connection drop); the timeout
catches the rest — a rank that never arrives, a hung peer.  Expiry raises
:class:`uniccl.Timeout` on every rank, naming the call and the ranks waited for.
"""

from __future__ import annotations

from .. import _env
from .._errors import InvalidArgument

#: seconds a call may wait for its peers unless ``timeout=`` or UNICCL_TIMEOUT says otherwise
#: (0: forever).  Dead peers are detected within seconds regardless; this catches hangs.
DEFAULT_TIMEOUT = _env.DEFAULT_TIMEOUT


def default_timeout() -> float:
    """UNICCL_TIMEOUT (seconds; 0: none), else DEFAULT_TIMEOUT."""
    return float(_env.number("UNICCL_TIMEOUT"))


def check_timeout(value, op: str, rank: int | None):
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1e9:
        raise InvalidArgument(
            f"must be a number of seconds >= 0 (0: no timeout) or None, got {value!r}",
            op=op,
            rank=rank,
            argument="timeout",
        )
    return float(value)
