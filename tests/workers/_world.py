"""The job's world for the workers' own bookkeeping (sharing a unique id, gathering
results): MPI's COMM_WORLD under mpiexec; under ``uniccl run`` (no MPI) a small
stand-in over a separate uniccl communicator's control channel."""

from __future__ import annotations

import uniccl
from uniccl.bootstrap.select import bootstrap


class _UnicclWorld:
    def __init__(self):
        self._comm = uniccl.init()
        self._t = self._comm._t
        self.rank, self.size = self._comm.rank, self._comm.size

    def bcast(self, obj, root=0):
        return self._t.bcast_obj(obj, root)

    def gather(self, obj, root=0):
        everything = self._t.allgather_obj(obj)
        return everything if self.rank == root else None

    def allreduce(self, value):
        return sum(self._t.allgather_obj(value))

    def Barrier(self):
        self._t.allgather_obj(None)


def world():
    if bootstrap() == "mpi":
        from mpi4py import MPI

        return MPI.COMM_WORLD
    return _UnicclWorld()


def has_mpi() -> bool:
    return bootstrap() == "mpi"
