"""A rank that gives up on a communicator tells its members why (an *abort notice*): TCP sends it
on every connection, MPI under ULFM on a communicator of its own before it revokes the others.
One encoding, and one reading of it into the error each member raises.
"""

from __future__ import annotations

import json

from .._errors import RemoteError, Revoked, Timeout, UnicclError

#: what a notice says: the sender timed out ("timeout", naming ``missing``), revoked the
#: communicator ("revoke"), saw ``missing[0]`` die ("died"), or gave up otherwise ("abort")
KINDS = ("timeout", "revoke", "died", "abort")


def encode(kind: str, text: str, missing=()) -> bytes:
    return json.dumps({"kind": kind, "text": text[:2000], "missing": [int(m) for m in missing]}).encode()


def decode(raw: bytes | bytearray, rank: int, peer: int, where: str) -> UnicclError:
    """The error notice ``raw`` from ``peer`` (``where``: how to name it) means on ``rank``; the
    ranks in it are the sender's and this rank's alike (both are the communicator's, or the job's)."""
    try:
        notice = json.loads(bytes(raw))
        kind, text, missing = notice["kind"], str(notice["text"]), list(notice.get("missing") or ())
    except (ValueError, KeyError, TypeError):
        kind, text, missing = "abort", bytes(raw).decode(errors="replace"), []
    if kind == "timeout":
        return Timeout(text, rank=rank, missing_ranks=missing, remote_rank=peer)
    if kind == "revoke":
        return Revoked(text, rank=rank, remote_rank=peer)
    if kind == "died" and missing:  # the peer saw rank missing[0] die: so it is for us too
        return RemoteError(f"{text} (seen by rank {peer})", rank=rank, remote_rank=missing[0], remote_type="died")
    return RemoteError(f"{where} aborted the communicator: {text}", rank=rank, remote_rank=peer, remote_type="aborted")
