"""MPI as a transport: point-to-point byte moves through mpi4py.

The algorithms only need "send these bytes to rank r" and "receive bytes from
rank r into this address", non-blocking; MPI gives exactly that and runs
everywhere (MPICH wheel by default, Open MPI when that is installed).
"""
from __future__ import annotations

import functools

from ._errors import InternalError, InvalidArgument


@functools.lru_cache(maxsize=None)
def mpi():
    """Import mpi4py.MPI (initialising MPI with MPI_THREAD_MULTIPLE) once."""
    import mpi4py

    mpi4py.rc.thread_level = "multiple"
    from mpi4py import MPI

    return MPI


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
    return {"name": name, "version": version, "standard": "%d.%d" % MPI.Get_version(),
            "thread_level": {MPI.THREAD_SINGLE: "single", MPI.THREAD_FUNNELED: "funneled",
                             MPI.THREAD_SERIALIZED: "serialized",
                             MPI.THREAD_MULTIPLE: "multiple"}.get(MPI.Query_thread(), "?")}


class MPITransport:
    """Non-blocking byte transfers between the ranks of one MPI communicator.

    ``data`` carries collective traffic, ``p2p`` the user's send/recv, so the two
    can never match each other's messages; ``ctrl`` carries the small
    per-call agreement (argument checks) through MPI's own collectives.
    """

    name = "mpi"

    def __init__(self, mpi_comm):
        MPI = mpi()
        self.MPI = MPI
        self.data = mpi_comm.Dup()
        self.p2p = mpi_comm.Dup()
        self.ctrl = mpi_comm.Dup()
        for c in (self.data, self.p2p, self.ctrl):
            c.Set_errhandler(MPI.ERRORS_RETURN)
        self.rank = mpi_comm.Get_rank()
        self.size = mpi_comm.Get_size()
        self._frombuf = MPI.buffer.fromaddress
        self.tag_ub = int(mpi_comm.Get_attr(MPI.TAG_UB) or 32767)

    def isend(self, ptr: int, nbytes: int, peer: int, tag: int, comm=None):
        buf = self._frombuf(ptr, nbytes, readonly=True)
        return (comm or self.data).Isend([buf, self.MPI.BYTE], peer, tag)

    def irecv(self, ptr: int, nbytes: int, peer: int, tag: int, comm=None):
        buf = self._frombuf(ptr, nbytes)
        return (comm or self.data).Irecv([buf, self.MPI.BYTE], peer, tag)

    def wait(self, req) -> None:
        req.Wait()

    def waitall(self, reqs) -> None:
        if reqs:
            self.MPI.Request.Waitall(reqs)

    def finish_p2p(self, req, peer: int, nbytes: int, op: str, rank: int) -> None:
        """Wait for a user send/recv; a message longer than the receive buffer is a typed error."""
        try:
            req.Wait()
        except self.MPI.Exception as exc:
            if exc.Get_error_class() == self.MPI.ERR_TRUNCATE:
                raise InvalidArgument(f"message from rank {peer} is longer than the receive buffer "
                                      f"({nbytes} bytes)", op=op, rank=rank, argument="buf") from None
            raise InternalError(f"MPI {op} with rank {peer} failed: {exc}", op=op, rank=rank) from None

    # control: small agreement traffic, the same interface as TCPTransport's
    def bcast_obj(self, obj, root: int = 0):
        return self.ctrl.bcast(obj, root=root)

    def allgather_obj(self, obj) -> list:
        return self.ctrl.allgather(obj)

    def allgather_array(self, arr, out) -> None:
        self.ctrl.Allgather(arr, out)

    def split(self, color: int, key: int) -> "MPITransport | None":
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
        for c in (self.data, self.p2p, self.ctrl):
            if c != self.MPI.COMM_NULL:
                c.Free()
