"""Control messages of the TCP mesh, which the reader threads answer or act on wherever the
callers are: the agreement of announced calls (each call's records and stamps compared as
they arrive, flush markers), probes (after a timeout: who has not begun the call), the sync
asked at exit (:meth:`_Control.linger`) and abort notices (a communicator given up on one rank
ends its waits on every member).
"""

from __future__ import annotations

import os
import time

from ..._errors import InvalidUsage, Revoked, Timeout, UnicclError
from .. import notice as _notice
from .base import _Flushed, _MeshBase
from .wire import (
    _ABORT_TAG,
    _FLUSH_TAG,
    _PROBE_TAG,
    _PROBED_TAG,
    _Q,
    _REC_BASE,
    _SLOW_BASE,
    _SYNC_TAG,
    _SYNCED_TAG,
    _T,
    CTRL,
    DATA,
    _head,
)

_SILENT = "does not answer (alive? its process may be stopped or hung)"


class _Control(_MeshBase):
    """The Mesh's part that sends, answers and acts on control messages."""

    _unexpected: dict  # (peer, ctx, tag) -> deque of bytearray
    _notified: set  # context bases whose members this rank has told why it gave up
    _expect: dict  # data context -> (data tag, record) of the call running there
    _early: dict  # (data context, tag) -> the record stamped on what came before that call
    _alarm: dict  # data context -> tag of its call whose records were found to differ
    _begun: dict  # data context -> number of the last call begun there (for probes)
    _pid: int  # the process that made the mesh (a forked child does not own its connections)

    # ---------------------------------------------- the agreement of announced calls
    # A call announced on a data context (TCPTransport.announce) stamps its data with the
    # caller's record; the readers compare each stamp or record with the one expected there
    # and, at the first difference, end that call's receives here (_alarm) so the waiting
    # thread judges it.  All under self._lock.
    def _observe(self, dctx: int, tag: int, record: bytes) -> None:
        exp = self._expect.get(dctx)
        if exp is not None and exp[0] == tag:
            if record != exp[1]:
                self._alarm_call(dctx, tag)
            return
        prev = self._early.get((dctx, tag))  # before this rank made that call: kept for it
        if prev is None:
            self._early[(dctx, tag)] = record
        elif prev != record:
            self._early[(dctx, tag)] = b""  # two peers differ: whatever this rank calls, it mismatches

    def _alarmed(self, ctx: int, tag: int) -> bool:
        """Is (ctx, tag) a receive of a call whose records were found to differ?"""
        if ctx & 3 == DATA:
            return self._alarm.get(ctx) == tag
        return ctx & 3 == CTRL and _REC_BASE <= tag < _SLOW_BASE and self._alarm.get(ctx & ~3) == tag - _REC_BASE

    def _alarm_call(self, dctx: int, tag: int) -> None:
        self._alarm[dctx] = tag
        for key in [
            k for k in self._posted if k[1] == dctx and k[2] == tag or k[1] == dctx + CTRL and k[2] == _REC_BASE + tag
        ]:
            for req in self._posted.pop(key):
                req.error = _Flushed()
                req.done.set()

    def _agreement_message(self, peer: int, ctx: int, tag: int, payload) -> None:
        """A record, a report of a failed agreement, or a flush marker arrived (reader thread)."""
        with self._lock:
            if tag == _FLUSH_TAG:  # all that ``peer`` sent for that call came before: drop it
                t = _T.unpack(bytes(payload[:4]))[0]
                for key in [
                    k
                    for k in self._unexpected
                    if k[0] == peer and (k[1] == ctx and k[2] == t or k[1] == ctx + CTRL and k[2] == _REC_BASE + t)
                ]:
                    del self._unexpected[key]
                for key in [k for k in self._posted if k[0] == peer and k[1] == ctx and k[2] == t]:
                    for req in self._posted.pop(key):
                        req.error = _Flushed()
                        req.done.set()
            elif tag >= _SLOW_BASE:  # a peer judges that call: so must this rank
                self._alarm_call(ctx & ~3, tag - _SLOW_BASE)
            else:
                self._observe(ctx & ~3, tag - _REC_BASE, bytes(payload))

    def begin(self, dctx: int, seq: int, tag: int, record: bytes) -> bool:
        """This rank starts call ``seq`` (data tag ``tag``) on ``dctx``; True if it is already
        known to mismatch."""
        with self._lock:
            self._begun[dctx] = seq
            self._expect[dctx] = (tag, record)
            early = self._early.pop((dctx, tag), None)
            return self._alarm.get(dctx) == tag or (early is not None and early != record)

    def end(self, dctx: int, tag: int) -> None:
        with self._lock:
            self._expect.pop(dctx, None)
            self._early.pop((dctx, tag), None)
            if self._alarm.get(dctx) == tag:
                del self._alarm[dctx]

    # ------------------------------------------------------------- sync at exit
    def _answer_sync(self, peer: int) -> None:
        """(reader thread) Tell ``peer`` that all it sent before its question is checked."""
        self._kick(self._outs[peer], [(_head(0, _SYNCED_TAG, 0, 0, 0, 0),), None])

    def linger(self, timeout: float) -> None:
        """Before this process exits: wait, at most ``timeout`` s, until every live peer has
        checked all that this rank sent it, so that a peer still asking for a copy of a damaged
        last message gets it (this rank's reader and sender threads serve it meanwhile).  A
        healthy peer answers from its reader thread at once, wherever its caller is."""
        if self.closed or not self.checksums or os.getpid() != self._pid:
            return  # aborted; no copies to ask for; a forked child (the connections are its parent's)
        # (the peers this rank is connected to: one never connected was sent nothing)
        peers = [p for p, out in list(self._outs.items()) if out.sock is not None and p not in self._dead]
        reqs = [self.post(p, 0, _SYNCED_TAG, None, 0) for p in peers]
        ask = _head(0, _SYNC_TAG, 0, 0, 0, 0)
        for p in peers:
            self._notice(p, ask)
        deadline = time.monotonic() + timeout
        for req in reqs:
            req.done.wait(max(0.0, deadline - time.monotonic()))

    # ------------------------------------------------------------------- probes
    def _answer_probe(self, peer: int, dctx: int) -> None:
        """(reader thread) The answer goes through the peer's sender thread: never a blocking send here."""
        with self._lock:
            begun = self._begun.get(dctx, -1)
        self._kick(self._outs[peer], [(_head(dctx, _PROBED_TAG, _Q.size, 0, 0, 0) + _Q.pack(begun),), None])

    def probe(self, dctx: int, seq: int, peers: list, wait: float) -> dict:
        """After a timeout, who of ``peers`` (job ranks) is in the way of call ``seq`` on ``dctx``,
        and why: {peer: what it does} for those that answered that they have not begun the call
        (their readers answer, wherever their callers are), whose connection is lost, whose
        process is stopped (on this host: /proc), that take no data, and (_SILENT) those that did
        not answer within ``wait`` seconds."""
        found, reqs = {}, []
        ask = _head(dctx, _PROBE_TAG, 0, 0, 0, 0)
        for p in peers:
            if p in self._dead:
                found[p] = "is gone (its connection was lost)"
                continue
            stopped = self._stopped(p)
            if stopped:
                found[p] = stopped
                continue
            req = self.post(p, dctx, _PROBED_TAG, None, 0)
            if not self._try_send(p, ask, min(wait, 0.25)):  # its socket is full: it reads nothing
                found[p] = self._stopped(p) or "takes no data (its process may be stopped or hung)"
                continue
            reqs.append((p, req))
        deadline = time.monotonic() + wait
        for p, req in reqs:
            if req.done.wait(max(0.0, deadline - time.monotonic())):
                if req.error is None:
                    if _Q.unpack(req.data)[0] < seq:
                        found[p] = "has not made the call"
                elif p in self._dead:
                    found[p] = "is gone (its connection was lost)"
            else:
                found[p] = self._stopped(p) or _SILENT
        return found

    # ------------------------------------------------------------ abort notices
    def _abort_local(self, peer: int, ctx: int, error) -> None:
        """Fail every receive, pending or later, in the communicator of context ``ctx``: it was
        aborted (or timed out) on ``peer``, so no member can complete a call in it."""
        base = ctx & ~3
        with self._lock:
            self._aborted.setdefault(base, error)
            keys = [k for k in self._posted if k[1] & ~3 == base]
            reqs = [r for k in keys for r in self._posted.pop(k)]
        for req in reqs:
            req.error = error
            req.done.set()

    def _notice_error(self, peer: int, raw: bytes | bytearray):
        """The error a peer's abort notice means here (see :mod:`..notice`)."""
        return _notice.decode(raw, self.rank, peer, self.where(peer))

    def abort(self, ctx: int, members: list, reason: str, kind: str = "abort", missing=()) -> None:
        """This rank gives up on the communicator of ``ctx``: its own waits end at once and
        every member is told, so that theirs end too (never waits for anyone).  ``kind``
        "timeout": peers raise Timeout naming ``missing`` (job ranks) instead; "revoke": every
        member raises Revoked with ``reason``, and the connections stay."""
        mine: UnicclError
        if kind == "timeout":
            mine = Timeout(reason, rank=self.rank, missing_ranks=list(missing))
        elif kind == "revoke":  # ``reason``: the revoker's own words, naming it in its communicator
            mine = Revoked(reason, rank=self.rank, remote_rank=self.rank)
        else:
            mine = InvalidUsage(f"the communicator was aborted on rank {self.rank}", rank=self.rank, aborted=True)
        self._abort_local(self.rank, ctx, mine)
        with self._lock:
            if ctx & ~3 in self._notified:
                return  # the members were told once (the first verdict is the one that counts)
            self._notified.add(ctx & ~3)
        data = _notice.encode(kind, reason, missing)
        notice = _head(ctx & ~3, _ABORT_TAG, len(data), 0, 0, 0) + data
        for peer in members:
            if peer == self.rank or peer in self._dead:
                continue
            self._notice(peer, notice)  # never waits: a peer that takes no data gets it when it reads again
