"""Which bootstrap a process uses: MPI inside an MPI job, TCP under ``uniccl run``'s own
launchers, torchrun and plain processes.  Reads the environment only (a leaf)."""

from __future__ import annotations

import os

from .._errors import InvalidArgument

# Variables that MPI launchers (MPICH's hydra, Open MPI's prterun, PMIx) give their ranks.
_MPI_LAUNCHER_VARS = ("PMI_RANK", "PMI_SIZE", "PMIX_RANK", "OMPI_COMM_WORLD_SIZE", "MPI_LOCALNRANKS")


def under_mpi_launcher() -> bool:
    return any(v in os.environ for v in _MPI_LAUNCHER_VARS)


def _forced_bootstrap() -> str | None:
    forced = os.environ.get("UNICCL_BOOTSTRAP", "").strip().lower()
    if forced and forced not in ("mpi", "tcp"):
        raise InvalidArgument(
            f"UNICCL_BOOTSTRAP must be 'mpi' or 'tcp', got {forced!r}", op="init", argument="UNICCL_BOOTSTRAP"
        )
    return forced or None


def bootstrap() -> str:
    """How ``uniccl.init()`` finds its peers: "mpi" or "tcp".

    ``UNICCL_BOOTSTRAP`` decides when set; otherwise a process started by an MPI
    launcher uses MPI, one started by ``uniccl run``'s own launchers (which set
    ``UNICCL_RENDEZVOUS``) uses TCP, and a lone process uses MPI's singleton world.
    """
    forced = _forced_bootstrap()
    if forced:
        return forced
    if under_mpi_launcher():
        return "mpi"
    return "tcp" if "UNICCL_RENDEZVOUS" in os.environ else "mpi"


def unique_id_bootstrap() -> str:
    """How the ranks of one unique id connect: "mpi" only inside one MPI job (started by an
    MPI launcher), else "tcp" -- torchrun, plain processes and MPI singletons have no MPI job
    whose ranks could form a communicator (each singleton is world rank 0 of its own world)."""
    return _forced_bootstrap() or ("mpi" if under_mpi_launcher() else "tcp")


def _under_torchrun() -> bool:
    """Started by torchrun (torch's elastic agent), whose agent hosts a store for its workers."""
    return os.environ.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true" and "RANK" in os.environ
