"""Set up the shared-memory engine for a communicator whose ranks share one host.

Rank 0 creates the segment (mode 0600) and sends its name; every rank attaches;
once all have, rank 0 unlinks it, so no exit path — not even kill -9 — can leave
it behind in /dev/shm.  Every rank learns whether all attached, so they all take
the same transport.
"""

from __future__ import annotations

import errno
import os
import secrets
from typing import cast

from ... import _env
from ..._errors import InternalError, UnicclError
from ...observability.log import logger

#: Each rank's two slots' size unless UNICCL_SHM_SLOT_BYTES says otherwise (its default in _env, which
#: tests/test_env.py holds equal); also what benchmarks/bench_shm.py and the engine's tests open with.
DEFAULT_SLOT_BYTES = 1 << 20
NO_SPACE = "no space"  # rank 0's reason when /dev/shm cannot hold the segment


def shm_attach(comm, single_host: bool):
    """Return (engine or None, reason when None)."""
    if comm.size < 2:
        return None, "a single rank needs no transport"
    if not single_host:
        return None, "ranks span hosts"
    forced = _env.choice("UNICCL_TRANSPORT")
    if forced in ("mpi", "tcp"):
        return None, f"UNICCL_TRANSPORT={forced}"
    t = comm._t
    engine = None
    reason: str | tuple[str, str] = ""  # (NO_SPACE, why): rank 0's /dev/shm cannot hold the segment
    kernel_hook = comm._hostb.host_reduce_kernel
    kernel = kernel_hook() if kernel_hook is not None else None
    if not kernel:
        reason = f"platform {comm.platform} has no host reduction kernel"
    else:
        try:
            from ._shm import ShmEngine
        except ImportError as exc:
            reason = f"engine not built: {exc}"
    if reason:  # the same on every rank: no need to agree
        return None, reason
    slot = _env.size("UNICCL_SHM_SLOT_BYTES")
    # the engine's tuning, read here (the engine's own reading of them is for direct users)
    tuning = {
        key: _env.get(f"UNICCL_SHM_{key.upper()}")
        for key in (
            "small_bytes",
            "cma_min_bytes",
            "nt_min_bytes",
            "cma_reduce_min_bytes",
            "cma_bcast_max_bytes",
            "spin_ns",
            "yield_ns",
        )
    }
    cma = _env.get("UNICCL_SHM_CMA")
    tuning["cma"] = "auto" if cma is None else cma
    timeout = comm.timeout
    # checksums on every region read from a peer's slot: opt-in (their cost: docs/reliability.md);
    # UNICCL_FAULT_INJECT's shm_flip then damages that share of the copies, which are made again
    checksum = _env.flag("UNICCL_SHM_CHECKSUM")
    flip_ppm = int(round(comm._faults.shm_flip * 1e6)) if checksum and comm._faults is not None else 0
    name = f"/uniccl-{os.getpid()}-{secrets.token_hex(6)}" if comm.rank == 0 else None
    if comm.rank == 0:
        sweep_orphans()
        try:
            engine = ShmEngine(
                name, 0, comm.size, True, slot, kernel, timeout, checksum=checksum, flip_ppm=flip_ppm, **tuning
            )
        except Exception as exc:
            reason, name = f"cannot create the segment: {exc}", None
            if getattr(exc, "errno", None) == errno.ENOSPC:  # every rank raises this, not a fallback
                # (the engine's InternalError: a uniccl error, with the errno of the failed call)
                reason = (
                    NO_SPACE,
                    f"{cast(UnicclError, exc).message}; make /dev/shm larger (docker run --shm-size=...), "
                    "set UNICCL_SHM_SLOT_BYTES lower, or UNICCL_TRANSPORT=tcp",
                )
    name = t.bcast_obj(name, root=0)
    if comm.rank != 0 and name is not None:
        try:
            engine = ShmEngine(name, comm.rank, comm.size, False, slot, kernel, timeout, **tuning)
        except Exception as exc:
            reason = f"rank {comm.rank} cannot attach {name}: {exc}"
    reasons = t.allgather_obj(reason)
    if comm.rank == 0 and engine is not None:
        engine.unlink()  # everyone attached (or gave up): the name is no longer needed
    full = [r[1] for r in reasons if isinstance(r, (tuple, list)) and r[0] == NO_SPACE]
    if full:  # a /dev/shm too small: a typed error on every rank, not a dying rank or a slow fallback
        raise InternalError(f"shared memory: {full[0]}", op="init", rank=comm.rank, errno=errno.ENOSPC, path="/dev/shm")
    failed = [r for r in reasons if r]
    if failed:
        if engine is not None:
            engine.close()
        logger.warning("shared-memory engine not used: %s", failed[0])
        return None, failed[0]
    assert engine is not None  # no rank failed: every rank created or attached
    speed = engine.tuning["cma_speed"]  # (UNICCL_DEBUG=INFO: which copies the data movers make)
    if tuning["cma"] is False:
        reads = "off (UNICCL_SHM_CMA=0)"
    elif speed is None:
        reads = "wherever possible"
    else:
        reads = f"at {speed:.2f}x a plain copy's speed (measured by rank 0): taken where that beats the slots"
    logger.info("shared memory: %d ranks, single-copy reads %s", comm.size, reads)
    return engine, ""


def sweep_orphans(folder: str = "/dev/shm") -> list[str]:
    """Unlink our segments whose creator is dead.  A segment lives unlinked-after-attach, but
    a creator killed (SIGKILL) in the instant between creating and unlinking it leaves it
    behind; its name carries the creator's pid, so the next job removes it."""
    removed: list[str] = []
    try:
        names = os.listdir(folder)
    except OSError:
        return removed
    for entry in names:
        parts = entry.split("-")
        if len(parts) != 3 or parts[0] != "uniccl" or not parts[1].isdigit():
            continue
        path = os.path.join(folder, entry)
        try:
            if os.stat(path).st_uid != os.getuid():
                continue
            os.kill(int(parts[1]), 0)
        except ProcessLookupError:
            try:
                os.unlink(path)
                removed.append(entry)
            except OSError:
                pass
        except OSError:
            continue  # alive (or not ours to signal): leave it
    if removed:
        logger.info("removed %d shared-memory segment(s) of dead jobs: %s", len(removed), ", ".join(removed))
    return removed
