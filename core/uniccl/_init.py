"""``uniccl.init()``: the world communicator of the current job."""
from __future__ import annotations

from ._communicator import Communicator
from ._mpi import mpi


def init(platform: str | None = None) -> Communicator:
    """Communicator over every rank of the job.

    Under ``mpiexec`` (MPICH or Open MPI) that is MPI's world; a plain single
    process gets a communicator of size 1.  ``platform`` forces the plugin like
    ``UNICCL_PLATFORM`` does.
    """
    return Communicator.from_mpi(mpi().COMM_WORLD, platform=platform)
