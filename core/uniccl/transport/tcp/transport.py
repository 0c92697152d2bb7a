"""One communicator over the TCP mesh: :class:`TCPTransport`, its ranks and its contexts over
the job's :class:`~uniccl.transport.tcp.mesh.Mesh` (the world and each ``split`` or
``shrink`` have their own), with the agreement of each call's records carried alongside the
data, and the small pickled control exchanges (``bcast_obj``, ``allgather_obj``, ``split``).
"""

from __future__ import annotations

import json
import pickle
import time
import weakref
from collections.abc import Callable
from typing import cast

import numpy as np

from ..._errors import InternalError, InvalidArgument, InvalidUsage, RemoteError, Revoked, Timeout
from ..base import Transport
from ..record import RECORD_BYTES
from .base import _SENT, _Flushed, _Recv
from .control import _SILENT
from .mesh import Mesh
from .wire import _CTRL_TAG_BASE, _FLUSH_TAG, _MASK, _REC_BASE, _SLOW_BASE, _T, CTRL, DATA, P2P, derive_context

_TO_ALL_UP_TO = 8  # ranks: up to this many, a call's records go to every rank at once (see _disseminate)
_BRUCK_UP_TO = 8  # ranks: up to this many, the control all-gather is Bruck's (see _allgather_bytes)


class TCPTransport(Transport):
    """One communicator's view of the mesh: its ranks (world ranks in communicator
    order) and its contexts.  A :class:`uniccl.transport.base.Transport`."""

    name = "tcp"
    can_abort = True  # abort notices end every member's waits at once
    can_shrink = True
    tag_ub = (1 << 30) - 1
    data, p2p = DATA, P2P
    # the announced call (see announce): None until the first one
    _seq: int | None
    _tag: int | None
    _own: bytes | None  # this rank's record of it
    _full: bytes | None  # ... with its error, if any
    _recs: list[_Recv | None] | None  # the receives of the others' records (not light)
    _mismatched: Callable[[], object] | None  # judges (and raises) once the records differ
    _stamp: bytes | None  # what its data messages carry

    def __init__(self, mesh: Mesh, members: list[int], ctx: int):
        self.mesh = mesh
        self.members = members
        self.rank = members.index(mesh.rank)
        self.size = len(members)
        self.ctx = ctx
        self._ctrl_seq = 0
        self._splits = 0
        self._shrinks = 0
        self.active = False  # an announced call is running (see announce)
        self._seq = self._tag = self._own = self._full = self._recs = self._mismatched = self._stamp = None
        self._light, self._mask, self._full_mask = False, 0, (1 << self.size) - 1
        # stamps carry a 64-bit set of matched ranks: beyond 64 ranks no call is "light" (see
        # Communicator._run_announced) and the sets are not kept
        self._masked = self.size <= 64
        self._own_mask = _MASK.pack(1 << self.rank if self._masked else 0)
        mesh.live += 1

    def set_timeout(self, seconds: float) -> None:
        """Seconds each wait of the calling thread may take (0: forever)."""
        self.mesh.set_timeout(seconds)

    def abort(self, reason: str) -> None:
        """End this communicator's waits here and on every member at once; the last aborted
        communicator over the mesh closes its sockets."""
        self.mesh.abort(self.ctx, self.members, reason)
        self.mesh.live -= 1
        if self.mesh.live <= 0:
            self.mesh.close()

    def revoke(self, text: str) -> None:
        """Every member's calls on this communicator end now with ``Revoked`` saying ``text``; the
        connections stay (split, shrink and destroy use contexts of their own)."""
        self.mesh.abort(self.ctx, self.members, text, "revoke")

    def watch_revoke(self, hook) -> None:
        self.mesh.on_revoke[self.ctx & ~3] = weakref.WeakMethod(hook)

    def fail(self, reason: str, missing) -> None:
        """After a timeout: this communicator is finished here; every member's waits end now
        with a Timeout naming the same ranks (``missing``: this communicator's ranks)."""
        self.mesh.abort(self.ctx, self.members, reason, "timeout", [self.members[m] for m in missing])

    def failed(self, reason: str) -> None:
        """This rank failed in the middle of a call: every member's waits end now with a
        RemoteError naming this rank (they would otherwise wait for its data)."""
        self.mesh.abort(self.ctx, self.members, reason, "abort")

    def peer_died(self, reason: str, dead: int) -> None:
        """After losing rank ``dead`` mid-call: every member's waits end now with a RemoteError
        naming it (a survivor may be waiting for another survivor, not for the dead rank)."""
        self.mesh.abort(self.ctx, self.members, reason, "died", [self.members[dead]])

    def verdict(self):
        told = self.mesh._aborted.get(self.ctx & ~3)
        return None if told is None else self._local(told)

    def _local(self, exc):
        """A mesh error (Timeout, RemoteError) naming this communicator's ranks, not the job's."""
        extra = dict(exc.extra)
        if "missing_ranks" in extra:
            extra["missing_ranks"] = [self.members.index(p) for p in extra["missing_ranks"] if p in self.members]
        if extra.get("remote_rank") in self.members:
            extra["remote_rank"] = self.members.index(extra["remote_rank"])
        else:
            extra.pop("remote_rank", None)
        return type(exc)(exc.message, rank=self.rank, **extra)

    # -------------------------------------------------------- point to point
    def isend(self, ptr: int, nbytes: int, peer: int, tag: int, comm=None):
        try:
            self.mesh.send(
                self.members[peer],
                self.ctx + (comm or DATA),
                tag,
                ptr,
                nbytes,
                stamp=self._stamp if self.active and not comm else None,
            )
        except Timeout as exc:  # the peer took no data within the call's limit: it is named
            raise self._local(exc) from None
        return _SENT

    def irecv(self, ptr: int, nbytes: int, peer: int, tag: int, comm=None):
        return self.mesh.post(self.members[peer], self.ctx + (comm or DATA), tag, ptr, nbytes)

    def wait(self, req) -> None:
        try:
            self.mesh.wait(req)
        except _Flushed:  # some rank found that the call's records differ: judge them here too
            self._mismatch()
        except Timeout as exc:  # this rank's own (a peer's verdict, told to it, names the ranks already)
            own = self.active and exc.extra.get("remote_rank") is None
            raise (self._missing(exc) if own else self._local(exc)) from None
        except (RemoteError, Revoked) as exc:
            raise self._local(exc) from None
        if self.active and req is not _SENT:  # data is used only once its stamp matches (see announce)
            stamp = req.stamp
            if stamp is None or not stamp.startswith(self._own):
                self._mismatch()
            if self._masked and self._mask != self._full_mask:
                mask = self._mask | _MASK.unpack_from(stamp, RECORD_BYTES)[0]
                if mask != self._mask:
                    self._mask = mask
                    self._stamp = cast(bytes, self._own) + _MASK.pack(mask)  # (active: announced)

    def waitall(self, reqs) -> None:
        for req in reqs:
            self.wait(req)

    def finish_p2p(self, req, peer: int, nbytes: int, op: str, rank: int) -> None:
        try:
            self.mesh.wait(req)
        except Timeout as exc:
            raise self._local(exc) from None
        except (RemoteError, Revoked) as exc:
            raise RemoteError(exc.message, op=op, rank=rank, remote_rank=peer, remote_type="ConnectionError") from None
        if req is not _SENT and req.truncated:
            raise InvalidArgument(
                f"message from rank {peer} is longer than the receive buffer ({nbytes} bytes)",
                op=op,
                rank=rank,
                argument="buf",
            )

    # ------------------------------------- agreement alongside the data (TCP only)
    # A round trip of records before every call costs more than the check is worth over TCP.
    # Instead each data message of a call carries a stamp: the sender's record of the call and
    # the set of ranks whose records it has matched (its own, and those of every stamp it
    # accepted).  The ring and doubling algorithms pass stamps around until every rank has
    # matched every other ("light" calls: no extra message at all); other calls also send
    # their record to every rank (beyond _TO_ALL_UP_TO ranks: round a ring, then dissemination)
    # and check all of them before returning.  At the first
    # difference, seen by any rank, every rank exchanges full records, judges, drops what was
    # sent ahead (flush) and raises alike, and the communicator stays usable.
    def announce(self, seq: int, tag: int, record: bytes, full: bytes, light: bool, mismatched) -> None:
        """Start call ``seq`` (data tag ``tag``): ``record`` (``transport.record``) is what must agree, ``full``
        adds this rank's error if it has one; ``mismatched()`` judges (and raises) once records differ."""
        mesh, me = self.mesh, self.rank
        self._seq, self._tag, self._own, self._full, self._light = seq, tag, record, full, light
        self._mismatched = mismatched
        self._mask = 1 << me
        self._stamp = record + self._own_mask
        self.active = True
        known_bad = mesh.begin(self.ctx + DATA, seq, tag, record)
        if not light:
            if self.size > _TO_ALL_UP_TO:  # round 0 of the dissemination (see finish)
                n = self.size
                self._recs = [mesh.post(self.members[(me - 1) % n], self.ctx + CTRL, _REC_BASE + tag, None, 0)]
                self._send_rec((me + 1) % n, _REC_BASE + tag, full)
            else:
                self._recs = self._to_all(self.ctx + CTRL, _REC_BASE + tag, full)
        if known_bad or full is not record:
            self._mismatch()

    def finish(self) -> None:
        """End of an announced call's data: returns when every rank's record matched."""
        if self._light:
            if self._mask != self._full_mask:
                self._mismatch()
        elif self.size > _TO_ALL_UP_TO:
            self._disseminate()
        else:
            for _p, req in enumerate(cast("list[_Recv | None]", self._recs)):  # (not light: posted)
                if req is None:
                    continue
                try:
                    self.mesh.wait(req)
                except _Flushed:
                    self._mismatch()
                except Timeout as exc:
                    raise self._not_arrived(self._recs, exc=exc) from None
                except (RemoteError, Revoked) as exc:
                    raise self._local(exc) from None
                if req.data != self._full:
                    self._mismatch()
        self.active = False
        self.mesh.end(self.ctx + DATA, cast(int, self._tag))

    def abandon(self) -> None:
        """The call failed otherwise (timeout, dead peer, abort): forget its agreement."""
        self.active = False
        if self._tag is not None:
            self.mesh.end(self.ctx + DATA, self._tag)

    # Beyond _TO_ALL_UP_TO ranks a call that is not light does not send its record to every rank
    # (n - 1 messages, and a link to each): at announce each rank sends it to rank + 1 (a ring: if
    # every rank's record equals its left neighbour's, all are equal, so any difference is seen
    # there, early, as _to_all's would be); at finish ceil(log2 n) rounds of dissemination (rank
    # + 2^k) pass the record on from each rank whose every check so far passed, so that no rank
    # returns before every rank's check has reached it.  A rank that finds a difference sends no
    # more: it judges (Mismatched), which tells every rank, as a difference seen by _to_all does.
    def _send_rec(self, peer: int, tag: int, data: bytes) -> None:
        try:
            self.mesh.send(self.members[peer], self.ctx + CTRL, tag, None, len(data), data)
        except Timeout as exc:
            raise self._local(exc) from None

    def _disseminate(self) -> None:
        me, n, mesh = self.rank, self.size, self.mesh
        tag = _REC_BASE + cast(int, self._tag)
        req: _Recv | None = cast("list[_Recv | None]", self._recs)[0]
        d = 1
        while True:
            try:
                mesh.wait(cast(_Recv, req))
            except _Flushed:
                self._mismatch()
            except Timeout as exc:  # the rank it waited for may itself wait for another: ask them all
                raise (self._missing(exc) if exc.extra.get("remote_rank") is None else self._local(exc)) from None
            except (RemoteError, Revoked) as exc:
                raise self._local(exc) from None
            if cast(_Recv, req).data != self._full:
                self._mismatch()
            if d >= n:
                return
            req = mesh.post(self.members[(me - d) % n], self.ctx + CTRL, tag, None, 0)
            self._send_rec((me + d) % n, tag, cast(bytes, self._full))
            d <<= 1

    def _to_all(self, ctx: int, tag: int, data: bytes) -> list:
        """Post a receive from every other member, then send ``data`` to each: the receives, in
        rank order (None for this rank)."""
        mesh, me = self.mesh, self.rank
        reqs = [None if p == me else mesh.post(self.members[p], ctx, tag, None, 0) for p in range(self.size)]
        try:
            for p in range(self.size):
                if p != me:
                    mesh.send(self.members[p], ctx, tag, None, len(data), data)
        except Timeout as exc:
            raise self._local(exc) from None
        return reqs

    def _missing(self, exc: Timeout) -> Timeout:
        """A wait of an announced call timed out: the peer it waited for may itself wait for
        another; name the ranks that have not begun the call (asked now), if any."""
        peers = [m for m in self.members if m != self.mesh.rank]
        assert self._seq is not None  # a wait of an announced call
        found = self.mesh.probe(self.ctx + DATA, self._seq, peers, 1.0)
        told = self.verdict()
        if isinstance(told, Timeout) and all(why is _SILENT for why in found.values()):
            return told  # a peer's verdict, told meanwhile, names the ranks
        if not found:  # all here (or gave up)
            return self._local(exc)
        missing = sorted(self.members.index(m) for m in found)
        return Timeout(f"{exc.message}; {_why(found, self.members)}", rank=self.rank, missing_ranks=missing)

    def _mismatch(self):
        self.active = False
        self._mismatched()  # raises
        raise InternalError("the ranks' records of a call differ, yet their judgement passed", rank=self.rank)

    def _not_arrived(self, reqs, what: str = "to make the call", exc=None) -> Timeout:
        """A wait for the ranks' records (``reqs``) timed out: the ranks whose record is missing,
        or a peer's verdict (``exc`` told by it), or who is in the way (asked now)."""
        if exc is not None and exc.extra.get("remote_rank") is not None:
            return self._local(exc)  # a peer timed out first and told this rank whom it found missing
        missing = [p for p, r in enumerate(reqs) if r is not None and not r.done.is_set()]
        limit = getattr(self.mesh._tl, "timeout", self.mesh.timeout)
        if not missing:  # they all came meanwhile
            return self._missing(
                Timeout(
                    f"rank {self.rank} timed out after {limit:g} s waiting for the ranks' records of the call",
                    rank=self.rank,
                )
            )
        stopped = "".join(f"; rank {p} {why}" for p in missing if (why := self.mesh._stopped(self.members[p])))
        return Timeout(
            f"rank {self.rank} timed out after {limit:g} s waiting for "
            f"rank{'s' if len(missing) > 1 else ''} {', '.join(map(str, missing))} {what}{stopped}",
            rank=self.rank,
            missing_ranks=missing,
        )

    def records(self) -> list:
        """Every member's full record of the failing call, in rank order (all ranks call this)."""
        assert self._tag is not None and self._full is not None  # (of the announced call)
        reqs = self._to_all(self.ctx + CTRL, _SLOW_BASE + self._tag, self._full)
        for req in reqs:
            if req is not None:
                try:
                    self.mesh.wait(req)
                except Timeout as exc:
                    raise self._not_arrived(reqs, "to report their call", exc) from None
                except (RemoteError, Revoked) as exc:
                    raise self._local(exc) from None
        return [self._full if req is None else req.data for req in reqs]

    def flush(self) -> None:
        """After a judged mismatch (every member judges alike, and calls this): drop what was
        sent ahead for the call, here and on the way, so the communicator stays usable."""
        dctx, tag = self.ctx + DATA, self._tag
        assert tag is not None  # (of the announced call)
        self.mesh.cancel(dctx, tag)
        # the marker goes after everything this rank sent for the call (one ordered stream per peer)
        for req in self._to_all(dctx, _FLUSH_TAG, _T.pack(tag)):
            if req is None:
                continue
            try:  # each peer's marker: its reader dropped what came before it
                self.mesh.wait(req)
            except (Timeout, RemoteError, Revoked) as exc:
                raise self._local(exc) from None
        self.mesh.end(dctx, tag)

    # ------------------------------------------------- control (small, pickled)
    def _ctrl_tag(self) -> int:
        self._ctrl_seq += 1
        return _CTRL_TAG_BASE + self._ctrl_seq % _CTRL_TAG_BASE

    def _exchange(self, payloads: dict, sources, ctx: int | None = None, tag: int | None = None) -> dict:
        """Send ``payloads[peer]`` (bytes) to each peer, return {source: bytes} (``ctx``: a
        control context other than this communicator's; ``tag``: one of an exchange in rounds,
        whose every round has other peers)."""
        tag = self._ctrl_tag() if tag is None else tag
        ctx = self.ctx + CTRL if ctx is None else ctx
        reqs = {src: self.mesh.post(self.members[src], ctx, tag, None, 0) for src in sources}
        try:
            for peer, data in payloads.items():
                self.mesh.send(self.members[peer], ctx, tag, None, len(data), data)
        except Timeout as exc:
            raise self._local(exc) from None
        out = {}
        for src, req in reqs.items():
            self.wait(req)
            out[src] = req.data
        return out

    # The control exchanges run over trees, not all to all: a rank talks to about log2(n) peers,
    # so that the links made on first use (heal.py) stay few at any n.
    def bcast_obj(self, obj, root: int = 0):
        """``root``'s ``obj`` on every rank, down a binomial tree (ceil(log2 n) rounds)."""
        data = self._bcast_bytes(pickle.dumps(obj) if self.rank == root else b"", root)
        return obj if self.rank == root else pickle.loads(data)

    def _bcast_bytes(self, data: bytes, root: int, ctx: int | None = None, tag: int | None = None) -> bytes:
        """``root``'s ``data`` on every rank, down the binomial tree rooted there."""
        n, v = self.size, (self.rank - root) % self.size  # v: this rank's place in the tree
        mask, tag = 1, self._ctrl_tag() if tag is None else tag
        while mask < n:  # receive from the parent: v without its lowest set bit
            if v & mask:
                parent = (v - mask + root) % n
                data = self._exchange({}, (parent,), ctx, tag)[parent]
                break
            mask <<= 1
        mask >>= 1
        while mask:  # then send to the children v + mask, the largest subtree first
            if v + mask < n:
                self._exchange({(v + mask + root) % n: data}, (), ctx, tag)
            mask >>= 1
        return data

    def _allgather_bytes(self, data: bytes, ctx: int | None = None) -> list[bytes]:
        """Every rank's ``data``, in rank order.  Up to _BRUCK_UP_TO ranks Bruck's algorithm
        (ceil(log2 n) rounds; in round k the blocks this rank holds go to rank - 2^k and those of
        rank + 2^k come in: 2 log2 n peers each); beyond, up the binomial tree rooted at rank 0
        and back down it (2 ceil(log2 n) rounds; a rank talks to its parent and children only,
        2 on average, the links broadcast_object uses): at a job's init, links cost more than
        rounds."""
        n, r = self.size, self.rank
        if n > _BRUCK_UP_TO:
            tag = self._ctrl_tag()
            subtree = {r: data}  # ranks r .. r + lowbit(r) - 1
            mask = 1
            while mask < n and not r & mask:
                if r + mask < n:
                    subtree.update(pickle.loads(self._exchange({}, (r + mask,), ctx, tag)[r + mask]))
                mask <<= 1
            if r:
                self._exchange({r - (r & -r): pickle.dumps(subtree)}, (), ctx, tag)
            table = pickle.dumps([subtree[p] for p in range(n)]) if r == 0 else b""
            return pickle.loads(self._bcast_bytes(table, 0, ctx, tag))
        blocks = [data]  # blocks[i]: rank (r + i) % n's
        d, tag = 1, self._ctrl_tag()
        while d < n:
            count = min(d, n - d)
            src, dst = (r + d) % n, (r - d) % n
            got = self._exchange({dst: pickle.dumps(blocks[:count])}, (src,), ctx, tag)[src]
            blocks.extend(pickle.loads(got))
            d <<= 1
        return [blocks[(p - r) % n] for p in range(n)]

    def allgather_obj(self, obj, ctx: int | None = None) -> list:
        mine = pickle.dumps(obj)
        return [obj if p == self.rank else pickle.loads(b) for p, b in enumerate(self._allgather_bytes(mine, ctx))]

    def allgather_array(self, arr, out) -> None:
        """``out[i] = arr`` of rank i (numpy arrays; ``out`` has ``size`` rows)."""
        for p, raw in enumerate(self._allgather_bytes(arr.tobytes())):
            out[p] = arr if p == self.rank else np.frombuffer(raw, dtype=arr.dtype).reshape(arr.shape)

    def split(self, color: int, key: int) -> TCPTransport | None:
        """Ranks of one ``color`` ordered by (key, rank); UNDEFINED (-1) gets None.  The colors
        go over a context of the split's own, so that a revoked communicator can still split."""
        pairs = self.allgather_obj((color, key), derive_context(self.ctx, self._splits + 1, -3) + CTRL)
        self._splits += 1
        if color < 0:
            return None
        members = [self.members[r] for _, r in sorted((k, r) for r, (c, k) in enumerate(pairs) if c == color)]
        return TCPTransport(self.mesh, members, derive_context(self.ctx, self._splits, color))

    def shrink(self, timeout: float) -> TCPTransport:
        """The ranks of this communicator still alive, as a new transport (collective over the
        survivors).  Each survivor sends its view of who is alive (peers whose connection did
        not drop) to the others; those it cannot hear from within ``timeout`` or that drop
        meanwhile are left out; the intersection is confirmed in a second round."""
        if getattr(self.mesh, "closed", False):
            raise InvalidUsage(
                "the connections were closed by abort(): call shrink() before abort()", op="shrink", rank=self.rank
            )
        self._shrinks += 1
        ctx = derive_context(self.ctx, self._shrinks, -2) + CTRL  # a context of its own: the old one is aborted
        me = self.mesh.rank
        alive = [m for m in self.members if m == me or m not in self.mesh._dead]
        views = self._shrink_round(ctx, 1, alive, alive, timeout)
        common = [m for m in self.members if all(m in v for v in views.values())]  # in communicator order
        confirm = self._shrink_round(ctx, 2, common, common, timeout)
        if any(v != common for v in confirm.values()):
            raise InternalError(
                f"the survivors disagree on who is alive ({confirm}); call shrink() again", op="shrink", rank=self.rank
            )
        return TCPTransport(self.mesh, common, derive_context(ctx, 0, 0))

    def _shrink_round(self, ctx: int, tag: int, peers: list, view: list, timeout: float) -> dict:
        """Send ``view`` to every other job rank in ``peers``; {job rank: its view} of those heard
        from (mine included); a peer that is dead or silent for ``timeout`` is left out."""
        me, mesh = self.mesh.rank, self.mesh
        data = json.dumps(view).encode()
        reqs = {p: mesh.post(p, ctx, tag, None, 0) for p in peers if p != me}
        for p in reqs:
            try:
                mesh.send(p, ctx, tag, None, len(data), data)
            except (RemoteError, InternalError, Timeout):
                pass  # it died (its receive fails too), or takes no data: left out
        out = {me: list(view)}
        deadline = time.monotonic() + timeout
        for p, req in reqs.items():
            if req.done.wait(max(0.0, deadline - time.monotonic())) and req.error is None:
                out[p] = json.loads(req.data)
        return out

    def processes(self) -> list[dict]:
        mesh = self.mesh
        mesh.wait_table(5.0)  # (it comes down the tree while init returns: a moment at most)
        here = mesh.hosts[mesh.rank]
        out = []
        for m in self.members:
            t = mesh.table[m] or {"hostname": "?", "pid": 0}  # (not here after all: unknown)
            out.append(
                {"host": t["hostname"], "pid": t["pid"], "start": t.get("start"), "local": mesh.hosts[m] == here}
            )
        return out

    def host_keys(self) -> list[str]:
        return [self.mesh.hosts[m] for m in self.members]  # (every rank has them from the rendezvous)

    def node(self) -> tuple[int, int]:
        """(local rank, local size): position among this communicator's ranks on this host."""
        hosts = self.host_keys()
        mine = hosts[self.rank]
        same = [r for r, h in enumerate(hosts) if h == mine]
        return same.index(self.rank), len(same)

    def free(self) -> None:
        pass  # the mesh outlives communicators: peers may still be reading our last messages


def _why(found: dict, members: list) -> str:
    """'rank 1 is stopped (...); ranks 2, 3 have not made the call': ``found`` ({job rank: what
    it does}, from Mesh.probe) in this communicator's ranks."""
    groups: dict = {}
    for p, why in found.items():
        groups.setdefault(why, []).append(members.index(p))
    parts = []
    for why, ranks in groups.items():
        ranks.sort()
        if len(ranks) == 1:
            parts.append(f"rank {ranks[0]} {why}")
        else:
            verb, _, rest = why.partition(" ")
            verb = {"has": "have", "is": "are", "does": "do", "takes": "take"}.get(verb, verb)
            parts.append(f"ranks {', '.join(map(str, ranks))} {verb} {rest}")
    return "; ".join(parts)
