"""MPI as a transport: point-to-point byte moves through mpi4py.

The algorithms only need "send these bytes to rank r" and "receive bytes from
rank r into this address", non-blocking; MPI gives exactly that and runs
everywhere (MPICH wheel by default, Open MPI when that is installed).

Under ULFM (Open MPI 5 run with ``mpiexec --with-ft ulfm``) a job survives a dead rank: a wait
on it fails with ``MPI_ERR_PROC_FAILED``, which becomes ``RemoteError`` naming the rank; a rank
that gives up on a communicator (a dead peer, a timeout, ``revoke()``) tells every member why
on a communicator of its own, then revokes the others (``MPIX_Comm_revoke``), so every member's
waits end at once with the same error; ``shrink()`` is ``MPIX_Comm_shrink``.  Without ULFM a
dead rank ends the job, as MPI does.
"""

from __future__ import annotations

import functools
import os
import socket
import sys
import time

from .._errors import InternalError, InvalidArgument, InvalidUsage, RemoteError, Timeout, UnicclError
from ..reliability import procs
from . import notice as _notice
from .base import Transport
from .net import host_key
from .record import RECORD_BYTES  # one rank's record of a call (Communicator._run_announced)


@functools.cache
def mpi():
    """Import mpi4py.MPI (initialising MPI with MPI_THREAD_MULTIPLE) once."""
    import mpi4py

    if _ft_requested():
        # Under ULFM, Open MPI's MPI_Finalize first shrinks away the dead ranks and runs a
        # synchronous barrier among the survivors (which flushes their messages), then a PMIx
        # fence through mpiexec: that fence hung the survivors after a rank had died (4 runs in
        # 30 with both cores busy; open-mpi/ompi#11404).  Skip the fence (MCA async_mpi_finalize,
        # read at MPI_Init), unless the user chose otherwise.
        os.environ.setdefault("OMPI_MCA_async_mpi_finalize", "1")

    mpi4py.rc.thread_level = "multiple"
    from mpi4py import MPI

    return MPI


def abort_at_exit(status: int = 1) -> None:
    """Make this process end MPI with ``MPI_Abort`` at exit instead of ``MPI_Finalize``.

    Called once a peer died or stopped answering: MPI_Finalize then waits for that peer
    forever (MPICH's PMI barrier; seen under ``uniccl run --launcher mpi`` when mpiexec
    did not kill the job), while MPI_Abort ends this job at once.  mpi4py's own
    ``python -m mpi4py`` does the same for an unhandled exception.  A no-op without MPI,
    and under ULFM, whose MPI_Finalize completes among the survivors (MPI_Abort would end them)."""
    MPI = sys.modules.get("mpi4py.MPI")
    if MPI is None or not MPI.Is_initialized() or MPI.Is_finalized() or ulfm()[0]:
        return
    setter = getattr(MPI, "_set_abort_status", None)  # mpi4py >= 3.1
    if setter is not None:
        setter(status)


_ON = ("1", "true", "yes", "on", "enabled")  # Open MPI's spellings of a true MCA boolean


def _ft_requested() -> bool:
    """Whether mpiexec asked for ULFM (``--with-ft ulfm`` sets ``OMPI_MCA_mpi_ft_enable`` in every rank)."""
    return os.environ.get("OMPI_MCA_mpi_ft_enable", "").lower() in _ON


@functools.cache
def ulfm() -> tuple[bool, str]:
    """(on, why): whether this MPI job survives a dead rank through ULFM's MPIX_Comm_revoke,
    _shrink and _agree (Open MPI 5 built with them, the job started with ``mpiexec --with-ft
    ulfm``, which sets ``OMPI_MCA_mpi_ft_enable`` in every rank), and why or why not."""
    import ctypes

    MPI = mpi()
    name = library()["name"]
    if not hasattr(ctypes.CDLL(MPI.__file__), "MPIX_Comm_revoke"):
        return False, f"{name} has no ULFM (MPIX_Comm_revoke): a dead rank ends the job"
    if name != "Open MPI":  # MPICH 5's ULFM prototype aborted internally in our tests (docs/reliability.md)
        return False, f"{name}'s ULFM prototype is not used (Open MPI 5's is): a dead rank ends the job"
    if not _ft_requested():
        return (
            False,
            "Open MPI has ULFM, off in this job: start it with 'mpiexec --with-ft ulfm' to survive a dead rank",
        )
    return True, "ULFM on (mpiexec --with-ft ulfm): survivors of a dead rank get RemoteError and can shrink()"


def library() -> dict:
    MPI = mpi()
    text = MPI.Get_library_version().strip()
    first = text.splitlines()[0] if text else ""
    if "Open MPI" in first:
        name = "Open MPI"
    elif "MPICH" in first:
        name = "MPICH"
    else:
        name = first.split()[0] if first else "unknown"
    version = first
    for token in first.replace(",", " ").split():
        if token[:1].isdigit() or token[:1] == "v" and token[1:2].isdigit():
            version = token.lstrip("v")
            break
    return {
        "name": name,
        "version": version,
        "standard": "%d.%d" % MPI.Get_version(),
        "thread_level": {
            MPI.THREAD_SINGLE: "single",
            MPI.THREAD_FUNNELED: "funneled",
            MPI.THREAD_SERIALIZED: "serialized",
            MPI.THREAD_MULTIPLE: "multiple",
        }.get(MPI.Query_thread(), "?"),
    }


class MPITransport(Transport):
    """Non-blocking byte transfers between the ranks of one MPI communicator.

    ``data`` carries collective traffic, ``p2p`` the user's send/recv, so the two
    can never match each other's messages; ``ctrl`` carries small control traffic
    through MPI's own collectives; ``agree`` each call's record (see :meth:`announce`).
    """

    name = "mpi"
    # Without ULFM, MPI has no way to end a peer's wait early (no abort notice, no shrink): a peer
    # learns of an aborted or failed rank when its own wait's timeout ends (the base class's
    # defaults).  Under ULFM both are True (set per transport in __init__).
    can_abort = False
    can_shrink = False

    def __init__(self, mpi_comm):
        MPI = mpi()
        self.MPI = MPI
        self.data = mpi_comm.Dup()
        self.p2p = mpi_comm.Dup()
        self.ctrl = mpi_comm.Dup()
        self.agree = mpi_comm.Dup()
        # ULFM: a dead rank is an error of the calls that need it, not the job's end (see the module)
        self.ulfm = ulfm()[0]
        self.notices = mpi_comm.Dup() if self.ulfm else MPI.COMM_NULL  # why a rank gave up
        self.can_abort = self.can_shrink = self.ulfm
        # Open MPI 5 writes a whole message of 4 KiB or more into a shorter receive buffer (it
        # reports the truncation, after overrunning the buffer: the heap corrupted), as a
        # mismatched call or a user's too-short recv would meet.  There no receive of a call's
        # data is posted before every rank's record matched, and a user's receive is posted only
        # once its message is known to fit (_Probed).  MPICH truncates safely: receives are posted
        # at once there.
        self._settle_first = library()["name"] != "MPICH"
        self._probed: list[_Probed] = []  # user receives not posted yet (Open MPI)
        self._probe_status = MPI.Status()
        self._told: list = []  # (request, bytes) of the notices this rank sent: never waited for
        self._verdict: UnicclError | None = None  # why this communicator ended (ULFM)
        for c in (self.data, self.p2p, self.ctrl, self.agree, self.notices):
            if c != MPI.COMM_NULL:
                c.Set_errhandler(MPI.ERRORS_RETURN)
        self.rank = me = mpi_comm.Get_rank()
        self.size = n = mpi_comm.Get_size()
        self._frombuf = MPI.buffer.fromaddress
        self.tag_ub = int(mpi_comm.Get_attr(MPI.TAG_UB) or 32767)
        # the records' exchange, made once: slot p of _recs holds rank p's record of the call;
        # one fixed tag suffices, MPI keeps each sender's messages in order
        self._recs = bytearray(n * RECORD_BYTES)
        slots = memoryview(self._recs)
        mine = slots[me * RECORD_BYTES : (me + 1) * RECORD_BYTES]
        self._rec_reqs = [self.agree.Send_init([mine, MPI.BYTE], p, 0) for p in range(n) if p != me] + [
            self.agree.Recv_init([slots[p * RECORD_BYTES : (p + 1) * RECORD_BYTES], MPI.BYTE], p, 0)
            for p in range(n)
            if p != me
        ]
        self._mine = mine
        self._expected = {}  # record -> record * size: what _recs holds when every rank agrees
        self.active = False  # a call is announced
        self._unsettled = False  # ... and its records are still on the way
        self._recvs = []  # that call's data receives (cancelled if it is judged mismatched)
        self._timeout = 0.0  # seconds a wait may take (0: forever); the communicator sets it
        # (host, pid) of every rank: a timed-out wait says which peer of this host is stopped
        self._where = self.ctrl.allgather((socket.gethostname(), os.getpid()))

    def set_timeout(self, seconds: float) -> None:
        """Seconds each later wait may take (0: forever).  MPI has no timed wait: a wait with a
        limit polls its requests (MPI_Testall, as MPI_Wait itself polls) against the deadline."""
        self._timeout = seconds

    def _block(self, reqs, peer: int = -1) -> None:
        """MPI_Waitall, bounded by the timeout: a stuck or stopped peer is a Timeout naming it
        (where this host can tell) instead of a hang."""
        MPI = self.MPI
        try:
            if not self._timeout and not self.ulfm and not self._probed:
                reqs[0].Wait() if len(reqs) == 1 else MPI.Request.Waitall(reqs)
                return
            self._poll(reqs, peer)
        except MPI.Exception as exc:
            raise self._failure(exc, peer) from None

    def _poll(self, reqs, peer: int) -> None:
        """Test ``reqs`` until they complete, the timeout passes (Timeout) or, under ULFM, a member
        (this rank too, from another thread) gives up on the communicator or a rank dies."""
        MPI = self.MPI
        # one request: its own Test, whose error is the request's (a truncation is ERR_TRUNCATE,
        # as from Wait; Testall would say ERR_IN_STATUS)
        test = reqs[0].Test if len(reqs) == 1 else functools.partial(MPI.Request.Testall, reqs)
        if self._probed and not isinstance(reqs[0], _Probed):  # (whose Test posts them itself)
            test = functools.partial(self._posting, test)  # it may wait for a receive not posted yet
        if test():
            return
        deadline = time.monotonic() + self._timeout if self._timeout else None
        spins = 0
        while not test():
            spins += 1
            if spins < 32:
                continue
            if self.ulfm:  # Open MPI's revoke does not end every pending request (persistent ones)
                self._heard()
            if deadline is not None and time.monotonic() > deadline:
                raise Timeout(
                    f"rank {self.rank} timed out after {self._timeout:g} s waiting for {self._whom(peer)}",
                    rank=self.rank,
                    missing_ranks=[peer] if peer >= 0 else self._stopped(),
                )
            # past a short spin, let the peer have the core (an oversubscribed host needs it)
            os.sched_yield()

    def _post_probed(self) -> None:
        """Post the user's receives whose messages have come (in posting order)."""
        for probed in list(self._probed):
            probed.post()

    def _posting(self, test) -> bool:
        self._post_probed()
        return test()

    def _stopped(self) -> list:
        """Ranks of this host whose process is stopped (state T in /proc: SIGSTOP, a debugger)."""
        here = socket.gethostname()
        return [
            r
            for r, (host, pid) in enumerate(self._where)
            if r != self.rank and host == here and procs.stopped(procs.state(pid))
        ]

    def processes(self) -> list[dict]:
        here = socket.gethostname()
        return [{"host": h, "pid": pid, "start": None, "local": h == here} for h, pid in self._where]

    def _whom(self, peer: int) -> str:
        stopped = self._stopped()
        if peer >= 0:
            host, pid = self._where[peer]
            what = f"rank {peer} ({host}, pid {pid})"
            return what + (" -- it is stopped (SIGSTOP or a debugger)" if peer in stopped else "")
        if stopped:
            return "its peers: " + ", ".join(
                f"rank {r} (pid {self._where[r][1]}) is stopped (SIGSTOP or a debugger)" for r in stopped
            )
        return "its peers (over MPI; none of this host's is stopped)"

    # ------------------------------------------------- failures (ULFM only)
    def _failure(self, exc, peer: int = -1):
        """The error a failed MPI wait means: under ULFM, a dead rank (``RemoteError`` naming it)
        or a communicator a member gave up on (the error its notice says); otherwise ``exc``."""
        MPI = self.MPI
        cls = exc.Get_error_class()
        fault = (MPI.ERR_PROC_FAILED, MPI.ERR_PROC_FAILED_PENDING, MPI.ERR_REVOKED, MPI.ERR_IN_STATUS)
        if not self.ulfm or cls not in fault:
            return exc
        if self._verdict is None:
            revoked = cls == MPI.ERR_REVOKED or any(c.Is_revoked() for c in (self.data, self.p2p, self.agree))
            self._verdict = self._notice(1.0 if revoked else 0.0) or self._died(peer)
        return exc if self._verdict is None else self._said()  # (None: ERR_IN_STATUS of another cause)

    def _said(self) -> UnicclError:
        """A new raisable copy of why this communicator ended (``_verdict``)."""
        v = self._verdict
        assert v is not None
        return type(v)(v.message, rank=self.rank, **v.extra)

    def _heard(self) -> None:
        """(ULFM: as a call starts, and while it waits) A member that gave up on this communicator
        ends the call at once, with its notice's error: its revoke may reach this rank's MPI only
        after data it sent before (a late rank would complete a call every other rank saw end),
        and does not end every pending request; a failure not yet acknowledged is a dead rank.
        One MPI_Iprobe."""
        MPI = self.MPI
        try:
            told = self._verdict is not None or self.notices.Iprobe(MPI.ANY_SOURCE, 0)
        except MPI.Exception as exc:  # a failure not acknowledged yet: a rank died
            raise self._failure(exc) from None
        if told:
            if self._verdict is None:
                self._verdict = self._notice(0.0)  # (the one Iprobe saw)
            raise self._said()

    def _notice(self, wait: float) -> UnicclError | None:
        """The first member's notice of why it gave up on this communicator, waiting at most
        ``wait`` s for it (it is sent before the revoke that ended our wait, not always received so)."""
        MPI, status = self.MPI, self.MPI.Status()
        deadline = time.monotonic() + wait
        src = -1
        while src < 0:
            for p in range(self.size):  # each source in turn: ANY_SOURCE fails while a failure is unacknowledged
                try:
                    if p != self.rank and self.notices.Iprobe(p, 0, status):
                        src = p
                        break
                except MPI.Exception:  # that one is dead
                    continue
            else:
                if time.monotonic() >= deadline:
                    return None
                time.sleep(0.001)
        raw = bytearray(status.Get_count(MPI.BYTE))
        self.notices.Recv([raw, MPI.BYTE], src, 0)
        return _notice.decode(raw, self.rank, src, self._name(src))

    def _died(self, peer: int) -> RemoteError | None:
        """RemoteError naming a rank MPI knows to have failed (``peer`` if it is one), else None."""
        MPI = self.MPI
        failed, mine = self.data.Get_failed(), self.data.Get_group()
        try:
            dead = [r for r in MPI.Group.Translate_ranks(failed, list(range(failed.Get_size())), mine) if r >= 0]
        finally:
            failed.Free()
            mine.Free()
        if not dead:
            return None
        r = peer if peer in dead else dead[0]
        return RemoteError(
            f"{self._name(r)} died: MPI reports its process failed (ULFM)",
            rank=self.rank,
            remote_rank=r,
            remote_type="died",
        )

    def _name(self, r: int) -> str:
        host, pid = self._where[r]
        return f"rank {r} ({host}, pid {pid})"

    def _give_up(self, kind: str, text: str, missing=(), mine: UnicclError | None = None) -> None:
        """ULFM: tell every member why this rank gives up on the communicator (``kind`` and
        ``text`` as :mod:`.notice` says), then revoke it, so that their waits end now with that
        error (not at their own timeouts); only the first reason counts."""
        if not self.ulfm or self._verdict is not None:
            return
        MPI = self.MPI
        data = _notice.encode(kind, text, missing)
        self._verdict = mine or _notice.decode(data, self.rank, self.rank, self._name(self.rank))
        for p in range(self.size):
            if p != self.rank:
                try:
                    self._told.append((self.notices.Isend([data, MPI.BYTE], p, 0), data))
                except MPI.Exception:
                    pass  # a dead rank: nothing to tell
        for c in (self.data, self.p2p, self.agree):
            try:
                c.Revoke()
            except MPI.Exception:
                pass  # revoked already

    def abort(self, reason: str) -> None:
        mine = InvalidUsage(f"the communicator was aborted on rank {self.rank}", rank=self.rank, aborted=True)
        self._give_up("abort", reason, mine=mine)

    def revoke(self, text: str) -> None:
        self._give_up("revoke", text)

    def fail(self, reason: str, missing) -> None:
        self._give_up("timeout", reason, missing)

    def failed(self, reason: str) -> None:
        self._give_up("abort", reason)

    def peer_died(self, reason: str, dead: int) -> None:
        self._give_up("died", reason, [dead])

    def shrink(self, timeout: float) -> Transport:
        """ULFM's MPIX_Comm_shrink: the survivors, in their order, within ``timeout`` s.  The
        blocking call, on a thread of its own so that a survivor that never calls shrink (stopped,
        hung) is a Timeout here (Open MPI 5.0's MPIX_Comm_ishrink fails with MPI_ERR_INTERN once
        a process has died)."""
        if not self.ulfm:
            return super().shrink(timeout)
        from .. import _threads

        MPI, got = self.MPI, []

        def run():
            try:
                got.append(self.ctrl.Shrink())
            except MPI.Exception as exc:
                got.append(exc)

        worker = _threads.start(run, name=f"uniccl-mpi-shrink{self.rank}")
        worker.join(timeout or None)
        if not got:
            raise Timeout(
                f"MPIX_Comm_shrink did not complete within {timeout:g} s (a survivor that does not call shrink?)",
                op="shrink",
                rank=self.rank,
            )
        new = got[0]
        if isinstance(new, MPI.Exception):
            raise InternalError(f"MPIX_Comm_shrink failed: {new}", op="shrink", rank=self.rank)
        try:
            ordered = new.Split(0, self.rank)  # the survivors keep their order (shrink's own is not promised)
        finally:
            new.Free()
        try:
            return MPITransport(ordered)
        finally:
            ordered.Free()

    def isend(self, ptr: int, nbytes: int, peer: int, tag: int, comm=None):
        buf = self._frombuf(ptr, nbytes, readonly=True)
        try:
            return (comm or self.data).Isend([buf, self.MPI.BYTE], peer, tag)
        except self.MPI.Exception as exc:  # ULFM: the peer is known dead, or the communicator revoked
            raise self._failure(exc, peer) from None

    def irecv(self, ptr: int, nbytes: int, peer: int, tag: int, comm=None):
        if self._settle_first and comm is None and self._unsettled:
            self._settle()  # (raises where the records differ: nothing posted)
        buf = self._frombuf(ptr, nbytes)
        if self._settle_first and comm is self.p2p:
            probed = _Probed(self, buf, nbytes, peer, tag)
            self._probed.append(probed)
            return probed
        try:
            req = (comm or self.data).Irecv([buf, self.MPI.BYTE], peer, tag)
        except self.MPI.Exception as exc:
            raise self._failure(exc, peer) from None
        if self.active and comm is None:
            self._recvs.append(req)
        return req

    def wait(self, req) -> None:
        if self._unsettled:
            self._settle()  # no peer's data is used before every record matched
        self._block([req])

    def waitall(self, reqs) -> None:
        if self._unsettled:
            self._settle()
        if reqs:
            self._block(reqs)

    def finish_p2p(self, req, peer: int, nbytes: int, op: str, rank: int) -> None:
        """Wait for a user send/recv; a message longer than the receive buffer is a typed error."""
        try:
            try:
                self._poll([req], peer) if self._timeout or self.ulfm or self._probed else req.Wait()
            except self.MPI.Exception as exc:
                raise self._failure(exc, peer) from None
        except self.MPI.Exception as exc:
            if exc.Get_error_class() == self.MPI.ERR_TRUNCATE:
                raise InvalidArgument(
                    f"message from rank {peer} is longer than the receive buffer ({nbytes} bytes)",
                    op=op,
                    rank=rank,
                    argument="buf",
                ) from None
            raise InternalError(f"MPI {op} with rank {peer} failed: {exc}", op=op, rank=rank) from None

    # ------------------------------------- agreement alongside the data
    # A round trip of records before every call (an MPI allgather) cost 4.4 % of a 1 MiB
    # all_reduce at 2 ranks, 8 % at 4.  Instead each rank starts sending its record to every
    # other as the call begins and the data follows at once; the records are compared at the
    # call's first wait, before any peer's data is used (docs/reliability.md).  Every rank
    # compares the same records, so all find a difference alike: each then cancels what it
    # posted for the call and the data communicator is replaced, so nothing sent ahead is
    # ever matched later (flush); the communicator stays usable.
    def announce(self, seq: int, tag: int, record: bytes, full: bytes, light: bool, mismatched) -> None:
        """Start a call: ``record`` (64 bytes) is what must agree, ``full`` adds this rank's
        error if it has one; ``mismatched()`` judges (and raises) once records differ."""
        self._own, self._full, self._mismatched = record, full, mismatched
        self._mine[:] = record
        if self.ulfm:
            self._heard()
        try:
            self.MPI.Prequest.Startall(self._rec_reqs)
        except self.MPI.Exception as exc:
            raise self._failure(exc) from None
        self.active = self._unsettled = True
        if full is not record:
            self._mismatch()

    def _settle(self) -> None:
        self._unsettled = False
        self._block(self._rec_reqs)
        expected = self._expected.get(self._own)
        if expected is None:
            if len(self._expected) >= 256:
                self._expected.clear()
            expected = self._expected[self._own] = self._own * self.size
        if self._recs != expected:
            self._mismatch()

    def finish(self) -> None:
        """End of an announced call: returns when every rank's record matched."""
        if self._unsettled:
            self._settle()
        self.active = False
        self._recvs.clear()

    # The call failed otherwise: its record exchange is completed all the same (the next call
    # starts another), and where the records differ the peers judge the call, so this rank too.
    abandon = finish

    def _mismatch(self):
        self.active = False
        self._mismatched()  # raises
        raise InternalError("the ranks' records of a call differ, yet their judgement passed", rank=self.rank)

    def records(self) -> list:
        """Every rank's full record of the failing call, in rank order (all ranks call this)."""
        if self._unsettled:
            self._unsettled = False
            self.MPI.Request.Waitall(self._rec_reqs)
        return self.ctrl.allgather(self._full)

    def flush(self) -> None:
        """After a judged mismatch (every rank judges alike, and calls this): cancel what this
        rank posted for the call and replace the data communicator, on which peers may have
        sent ahead, so that nothing of the call is matched later."""
        MPI = self.MPI
        for req in self._recvs:  # none may write into a buffer after the call raised
            if req != MPI.REQUEST_NULL:
                try:
                    req.Cancel()
                    req.Wait()  # returns once cancelled or done (MPI 4.0, 3.8.4)
                except MPI.Exception:
                    pass  # it failed (a truncated message): done as well
        # a send nobody will match stays pending on the old communicator, never waited for
        # (cancelling a send is deprecated since MPI 4.0, and crashes MPICH mid-handshake)
        self._recvs.clear()
        old, self.data = self.data, self.ctrl.Dup()
        self.data.Set_errhandler(MPI.ERRORS_RETURN)
        old.Free()

    # control: small traffic (Transport.bcast_obj and the rest)
    def _control(self, f, *args, **kw):
        """``f`` (a collective of ``ctrl``), its MPI failure typed (ULFM: a dead member)."""
        try:
            return f(*args, **kw)
        except self.MPI.Exception as exc:
            raise self._failure(exc) from None

    def bcast_obj(self, obj, root: int = 0):
        return self._control(self.ctrl.bcast, obj, root=root)

    def allgather_obj(self, obj) -> list:
        return self._control(self.ctrl.allgather, obj)

    def allgather_array(self, arr, out) -> None:
        self._control(self.ctrl.Allgather, arr, out)

    def split(self, color: int, key: int) -> MPITransport | None:
        """Ranks of one ``color`` ordered by (key, rank); a negative colour gets None."""
        new = self._control(self.ctrl.Split, self.MPI.UNDEFINED if color < 0 else color, key)
        if new == self.MPI.COMM_NULL:
            return None
        try:
            return MPITransport(new)
        finally:
            new.Free()

    def host_keys(self) -> list[str]:
        return self.allgather_obj(host_key())

    def node(self) -> tuple[int, int]:
        """(local rank, local size): position among this communicator's ranks on this host."""
        node = self.ctrl.Split_type(self.MPI.COMM_TYPE_SHARED)
        try:
            return node.Get_rank(), node.Get_size()
        finally:
            node.Free()

    def free(self) -> None:
        for req in self._rec_reqs:
            req.Free()
        for req, _ in self._told:  # (a notice to a dead rank never completes)
            req.Free()
        for c in (self.data, self.p2p, self.ctrl, self.agree, self.notices):
            if c != self.MPI.COMM_NULL:
                c.Free()


class _Probed:
    """A user's receive on Open MPI (see MPITransport.__init__): its message is matched by a
    probe first and received only if it fits; a longer one is received into a buffer of its own
    and dropped, and the receive fails as MPI's truncation would (ERR_TRUNCATE).  Every wait of
    the transport posts the receives whose messages have come, as MPI's progress would."""

    def __init__(self, t: MPITransport, buf, nbytes: int, peer: int, tag: int):
        self._t, self._buf, self._nbytes, self._peer, self._tag = t, buf, nbytes, peer, tag
        self._req = None  # the posted receive
        self._error = None

    def post(self) -> None:
        """Post the receive if its message has come (a no-op once posted)."""
        if self._req is not None or self._error is not None:
            return
        MPI, status = self._t.MPI, self._t._probe_status
        message = self._t.p2p.Improbe(self._peer, self._tag, status)
        if message is None:
            return
        self._t._probed.remove(self)
        nbytes = status.Get_count(MPI.BYTE)
        if nbytes > self._nbytes:
            message.Recv([bytearray(nbytes), MPI.BYTE])
            self._error = MPI.Exception(MPI.ERR_TRUNCATE)
        else:
            self._req = message.Irecv([self._buf, MPI.BYTE])

    def Test(self) -> bool:
        self._t._post_probed()
        if self._error is not None:
            raise self._error
        return self._req is not None and self._req.Test()

    def Wait(self) -> None:
        while not self.Test():
            os.sched_yield()
