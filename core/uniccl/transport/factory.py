"""The transport of a new communicator: from a unique id (MPI inside one MPI job, else TCP)
or from the environment ``uniccl run``'s own launchers give their ranks (TCP)."""

from __future__ import annotations

import socket
import threading

from .. import _env
from .._errors import InvalidArgument, InvalidUsage
from ..bootstrap.rendezvous import UniqueId, init_wait, rendezvous
from ..bootstrap.select import unique_id_bootstrap
from . import tcp as _tcp


def transport_from_unique_id(uid, rank: int, size: int, timeout: float | None, *, tcp: bool = False):
    """The transport of the ranks that joined ``uid``: MPI inside an MPI job, else (or with
    ``tcp``: processes from outside the job join it) TCP."""
    if isinstance(uid, (bytes, bytearray)):
        uid = UniqueId.from_bytes(bytes(uid))
    if not isinstance(uid, UniqueId):
        raise InvalidArgument(f"expected a uniccl.UniqueId, got {type(uid).__name__}", op="init", argument="uid")
    for name, value in (("size", size), ("rank", rank)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise InvalidArgument(f"must be an int, got {value!r}", op="init", argument=name)
    if size < 1 or not 0 <= rank < size:
        raise InvalidArgument(
            f"rank must be in [0, size) with size >= 1, got rank={rank} size={size}",
            op="init",
            rank=rank,
            argument="rank",
        )
    timeout = init_wait(timeout)
    if tcp or unique_id_bootstrap() == "tcp":
        return _tcp.TCPTransport(_tcp.Mesh(uid, rank, size, timeout), list(range(size)), _tcp.derive_context(1, 0, 0))
    from .mpi import MPITransport, mpi

    MPI = mpi()
    world = MPI.COMM_WORLD
    table = rendezvous(
        uid,
        rank,
        size,
        {"world_rank": world.Get_rank(), "world_size": world.Get_size(), "host": socket.gethostname()},
        timeout,
    )
    world_ranks = [t["world_rank"] for t in table]
    if len(set(world_ranks)) != size or len({t["world_size"] for t in table}) != 1:
        raise InvalidUsage(
            "the ranks of this unique id are not processes of one MPI job (world ranks "
            f"{world_ranks}); start them with one launcher (mpiexec or uniccl run)",
            op="init",
            rank=rank,
        )
    group = world.Get_group().Incl(world_ranks)
    try:
        comm = world.Create_group(group, tag=0)
    finally:
        group.Free()
    try:
        return MPITransport(comm)
    finally:
        comm.Free()


_world_mesh = None
_world_lock = threading.Lock()


def world_from_env(facts: list | None = None) -> _tcp.TCPTransport:
    """The transport over every rank of a ``uniccl run`` job (local, ssh or slurm launcher):
    rank, size and rendezvous come from the environment the launcher set.  ``facts``: what
    this rank tells the others of itself at the rendezvous (``native.world_facts``); the
    first world's transport then has everyone's as its ``facts``."""
    global _world_mesh
    with _world_lock:
        if _world_mesh is None:
            launcher = ("UNICCL_RANK", "UNICCL_WORLD_SIZE", "UNICCL_RENDEZVOUS", "UNICCL_JOB_SECRET")
            rank, size, rdv, secret = (_env.get(name) for name in launcher)  # malformed: InvalidArgument
            missing = [name for name in launcher if not _env.is_set(name)]
            if missing:
                raise InvalidArgument(
                    f"the launcher's environment is incomplete (no {', '.join(missing)}); start "
                    "the job with 'uniccl run'",
                    op="init",
                    argument="UNICCL_RENDEZVOUS",
                )
            host, _, port = rdv.rpartition(":")
            secret = bytes.fromhex(secret)
            timeout = float(_env.number("UNICCL_INIT_TIMEOUT"))
            _world_mesh = _tcp.Mesh(UniqueId(host, int(port), secret), rank, size, timeout, facts)
        _world_mesh.worlds += 1
        t = _tcp.TCPTransport(_world_mesh, list(range(_world_mesh.size)), _tcp.derive_context(0, _world_mesh.worlds, 0))
        facts = _world_mesh.facts
        if _world_mesh.worlds == 1 and all(f is not None for f in facts):  # (every rank's first world)
            t.facts = facts
        return t
