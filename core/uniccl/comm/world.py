"""``uniccl.init()``: the world communicator of the current job."""

from __future__ import annotations

import os

from .. import _env
from .._errors import InvalidArgument, InvalidUsage
from ..bootstrap.select import _forced_bootstrap, _under_torchrun, bootstrap, under_mpi_launcher
from .communicator import Communicator

_torchrun_worlds = 0  # worlds made in this process under torchrun: each has its own key


def _torchrun_world(platform, timeout) -> Communicator:
    """The world of a torchrun job: rank 0 puts a unique id in the store torchrun's agent hosts
    at MASTER_ADDR:MASTER_PORT (every worker is its client, as torch's own env:// init is) and
    every rank joins it, so ``uniccl.init()`` works under torchrun as under ``uniccl run``."""
    global _torchrun_worlds
    from datetime import timedelta

    from torch.distributed import TCPStore

    from ..bootstrap.rendezvous import get_unique_id, init_wait, torch_job_host

    env = os.environ
    try:
        rank, size = int(env["RANK"]), int(env["WORLD_SIZE"])
        addr, port = env["MASTER_ADDR"], int(env["MASTER_PORT"])
    except (KeyError, ValueError) as exc:
        raise InvalidArgument(
            f"torchrun's environment is incomplete or malformed ({exc})", op="init", argument="RANK"
        ) from None
    wait = init_wait(timeout)
    store = TCPStore(addr, port, size, is_master=False, timeout=timedelta(seconds=wait))
    _torchrun_worlds += 1
    key = f"uniccl/world/{env.get('TORCHELASTIC_RESTART_COUNT', '0')}/{_torchrun_worlds}"
    if rank == 0:
        store.set(key, bytes(get_unique_id(host=torch_job_host())))
    uid = store.get(key)  # waits until rank 0 has put it
    return Communicator(uid, rank, size, platform=platform, timeout=timeout)


def init(platform: str | None = None, *, timeout: float | None = None) -> Communicator:
    """Communicator over every rank of the job.

    Under ``mpiexec`` (MPICH or Open MPI, also via ``uniccl run --launcher mpi``)
    that is MPI's world; under ``uniccl run``'s local, ssh or slurm launchers the
    ranks meet at the launcher's rendezvous and connect over TCP (shared memory
    within a host); under ``torchrun`` they meet through the store its agent hosts;
    a plain single process gets a communicator of size 1.
    ``platform`` forces the plugin like ``UNICCL_PLATFORM`` does; ``timeout`` is the
    seconds each call may wait for its peers (default $UNICCL_TIMEOUT, else 120; 0: none).
    """
    if _env.is_set("UNICCL_RESTART_COUNT"):
        raise InvalidUsage(
            f"this process is restart {_env.get('UNICCL_RESTART_COUNT')} of rank {os.environ.get('UNICCL_RANK')} "
            "(uniccl run --max-restarts): the job's world was made without it and cannot be joined again; join "
            "the survivors with uniccl.Communicator(uid, rank, new_size), the unique id of their comm.grow() "
            "(examples/elastic_train.py)",
            op="init",
        )
    how = bootstrap()
    if how == "tcp":
        from ..transport.factory import world_from_env
        from .native import world_facts

        return Communicator._over(world_from_env(world_facts(platform)), platform, timeout)
    if not under_mpi_launcher() and _forced_bootstrap() is None and _under_torchrun():
        return _torchrun_world(platform, timeout)
    from ..transport.mpi import mpi

    return Communicator.from_mpi(mpi().COMM_WORLD, platform=platform, timeout=timeout)
