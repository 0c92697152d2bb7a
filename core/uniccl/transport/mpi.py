"""MPI as a transport: point-to-point byte moves through mpi4py.

The algorithms only need "send these bytes to rank r" and "receive bytes from
rank r into this address", non-blocking; MPI gives exactly that and runs
everywhere (MPICH wheel by default, Open MPI when that is installed).
"""

from __future__ import annotations

import functools
import os
import socket
import sys
import time

from .._errors import InternalError, InvalidArgument, Timeout
from .base import Transport
from .record import RECORD_BYTES  # one rank's record of a call (Communicator._run_announced)


@functools.cache
def mpi():
    """Import mpi4py.MPI (initialising MPI with MPI_THREAD_MULTIPLE) once."""
    import mpi4py

    mpi4py.rc.thread_level = "multiple"
    from mpi4py import MPI

    return MPI


def abort_at_exit(status: int = 1) -> None:
    """Make this process end MPI with ``MPI_Abort`` at exit instead of ``MPI_Finalize``.

    Called once a peer died or stopped answering: MPI_Finalize then waits for that peer
    forever (MPICH's PMI barrier; seen under ``uniccl run --launcher mpi`` when mpiexec
    did not kill the job), while MPI_Abort ends this job at once.  mpi4py's own
    ``python -m mpi4py`` does the same for an unhandled exception.  A no-op without MPI."""
    MPI = sys.modules.get("mpi4py.MPI")
    if MPI is None or not MPI.Is_initialized() or MPI.Is_finalized():
        return
    setter = getattr(MPI, "_set_abort_status", None)  # mpi4py >= 3.1
    if setter is not None:
        setter(status)


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
    # MPI has no way to end a peer's wait early (no abort notice, no shrink): a peer learns of an
    # aborted or failed rank when its own wait's timeout ends (the base class's defaults)
    can_abort = False
    can_shrink = False

    def __init__(self, mpi_comm):
        MPI = mpi()
        self.MPI = MPI
        self.data = mpi_comm.Dup()
        self.p2p = mpi_comm.Dup()
        self.ctrl = mpi_comm.Dup()
        self.agree = mpi_comm.Dup()
        for c in (self.data, self.p2p, self.ctrl, self.agree):
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
        if not self._timeout:
            MPI.Request.Waitall(reqs)
            return
        # one request: its own Test, whose error is the request's (a truncation is ERR_TRUNCATE,
        # as from Wait; Testall would say ERR_IN_STATUS)
        test = reqs[0].Test if len(reqs) == 1 else functools.partial(MPI.Request.Testall, reqs)
        if test():
            return
        deadline = time.monotonic() + self._timeout
        spins = 0
        while not test():
            spins += 1
            if spins < 32:
                continue
            if time.monotonic() > deadline:
                raise Timeout(
                    f"rank {self.rank} timed out after {self._timeout:g} s waiting for {self._whom(peer)}",
                    rank=self.rank,
                    missing_ranks=[peer] if peer >= 0 else self._stopped(),
                )
            # past a short spin, let the peer have the core (an oversubscribed host needs it)
            os.sched_yield()

    def _stopped(self) -> list:
        """Ranks of this host whose process is stopped (state T in /proc: SIGSTOP, a debugger)."""
        here = socket.gethostname()
        out = []
        for r, (host, pid) in enumerate(self._where):
            if r != self.rank and host == here:
                try:
                    with open(f"/proc/{pid}/stat") as f:
                        state = f.read().rsplit(")", 1)[1].split()[0]
                except (OSError, IndexError):
                    continue
                if state in ("T", "t"):
                    out.append(r)
        return out

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

    def isend(self, ptr: int, nbytes: int, peer: int, tag: int, comm=None):
        buf = self._frombuf(ptr, nbytes, readonly=True)
        return (comm or self.data).Isend([buf, self.MPI.BYTE], peer, tag)

    def irecv(self, ptr: int, nbytes: int, peer: int, tag: int, comm=None):
        buf = self._frombuf(ptr, nbytes)
        req = (comm or self.data).Irecv([buf, self.MPI.BYTE], peer, tag)
        if self.active and comm is None:
            self._recvs.append(req)
        return req

    def wait(self, req) -> None:
        if self._unsettled:
            self._settle()  # no peer's data is used before every record matched
        if self._timeout:
            self._block([req])
        else:
            req.Wait()

    def waitall(self, reqs) -> None:
        if self._unsettled:
            self._settle()
        if reqs:
            self._block(reqs)

    def finish_p2p(self, req, peer: int, nbytes: int, op: str, rank: int) -> None:
        """Wait for a user send/recv; a message longer than the receive buffer is a typed error."""
        try:
            if self._timeout:
                self._block([req], peer)
            else:
                req.Wait()
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
        self.MPI.Prequest.Startall(self._rec_reqs)
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
    def bcast_obj(self, obj, root: int = 0):
        return self.ctrl.bcast(obj, root=root)

    def allgather_obj(self, obj) -> list:
        return self.ctrl.allgather(obj)

    def allgather_array(self, arr, out) -> None:
        self.ctrl.Allgather(arr, out)

    def split(self, color: int, key: int) -> MPITransport | None:
        """Ranks of one ``color`` ordered by (key, rank); a negative colour gets None."""
        new = self.ctrl.Split(self.MPI.UNDEFINED if color < 0 else color, key)
        if new == self.MPI.COMM_NULL:
            return None
        try:
            return MPITransport(new)
        finally:
            new.Free()

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
        for c in (self.data, self.p2p, self.ctrl, self.agree):
            if c != self.MPI.COMM_NULL:
                c.Free()
