"""Worker for tests/test_shm.py: the shared-memory engine (uniccl.transport.shm._shm) on its own.

    mpiexec -n N python shm_engine.py matrix --prefix /uniccl-test-...
        every collective x dtype x op x size, in and out of place, against numpy, on
        three engines: single-copy transfers for every size (and all_reduce so with
        streamed outputs), slot copies forced by UNICCL_SHM_CMA=0, and the default tuning.
        Exit 1 on any wrong result.
    mpiexec -n N python shm_engine.py big --prefix ... --mib 64
        one large all_reduce (checked), timed.
    mpiexec -n N python shm_engine.py bad-arg --prefix ...
        rank 1 passes a bad argument: it raises InvalidArgument, every other rank
        RemoteError naming rank 1 (nobody hangs).
    python shm_engine.py loop NAME RANK SIZE [--mib M] [--timeout T]
        no MPI: attach (rank 0 creates), barrier, unlink, then all_reduce forever;
        prints READY, and on an error "ERROR <type> remote_rank=<r> after <s> s: <msg>".
    python shm_engine.py timeout NAME RANK
        no MPI, 2 ranks: rank 1 stays away, rank 0's all_reduce times out naming it.
    python shm_engine.py raise NAME
        no MPI: create a segment, then raise (the segment must not be left behind).
    python shm_engine.py interrupt NAME
        no MPI: SIGINT while all_reduce waits for a rank that never comes.

MPI (mpi4py) is used for set-up and result checks only: rank 0 creates the segment
and broadcasts its name, the others attach, a barrier, rank 0 unlinks.
"""

from __future__ import annotations

import argparse
import os
import secrets
import sys
import time
import traceback

import numpy as np
import uniccl_cpu
from _data import compare, make_input

from uniccl._errors import InternalError, InvalidArgument, RemoteError, Timeout
from uniccl._types import DType, numpy_dtype
from uniccl.transport.shm._shm import ShmEngine
from uniccl.transport.shm.attach import DEFAULT_SLOT_BYTES

SUM, PROD, MAX, MIN = 0, 1, 2, 3
OPS = {"sum": SUM, "prod": PROD, "max": MAX, "min": MIN}
DTYPES = [DType.FLOAT32, DType.FLOAT64, DType.INT32, DType.BFLOAT16, DType.FLOAT16, DType.INT8]
TEST_SLOT = 32 * 1024  # small slots: "several slots" stays cheap
TEST_SMALL = 4096  # one-round all_reduce/reduce up to here, pipelined above


def reduce_kernel() -> int:
    return uniccl_cpu.uniccl_host_reduce_kernel()


def addr(a: np.ndarray) -> int:
    return a.ctypes.data


# ------------------------------------------------------------------ set-up
def mpi_engine(world, prefix: str, tag: str, slot_bytes: int, **tuning) -> ShmEngine:
    """Rank 0 creates, bcasts the name, the others attach, barrier, rank 0 unlinks."""
    r, n = world.rank, world.size
    name = world.bcast(f"{prefix}-{tag}-{secrets.token_hex(4)}" if r == 0 else None)
    eng = None
    if r == 0:
        eng = ShmEngine(name, r, n, True, slot_bytes, reduce_kernel(), 60.0, **tuning)
    world.Barrier()
    if r != 0:
        eng = ShmEngine(name, r, n, False, slot_bytes, reduce_kernel(), 60.0, **tuning)
    world.Barrier()
    if r == 0:
        eng.unlink()
        assert not os.path.exists("/dev/shm" + name), name
    return eng


def attach_standalone(name: str, rank: int, size: int, slot_bytes: int, timeout: float) -> ShmEngine:
    """No MPI: rank 0 creates; the others retry until the segment exists."""
    if rank == 0:
        return ShmEngine(name, 0, size, True, slot_bytes, reduce_kernel(), timeout)
    deadline = time.monotonic() + 20
    while True:
        try:
            return ShmEngine(name, rank, size, False, slot_bytes, reduce_kernel(), timeout)
        except InternalError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.01)


# ------------------------------------------------------------------ matrix
def block_counts(dt, slot_bytes: int, full: bool) -> list[int]:
    per_slot = slot_bytes // dt.itemsize
    if not full:  # a fifth of a slot, 7/8 of one (a two-rank reduce halves both) and 3.5 slots: blocks
        # under a slot, halves of odd length, and a last chunk short
        return [0, 1, 1023, per_slot // 5 + 3, 7 * per_slot // 8 + 3, per_slot + 1, 7 * per_slot // 2]
    return [0, 1, 7, 1023, per_slot - 1, per_slot, per_slot + 1, 7 * per_slot // 2]


def run_case(world, eng: ShmEngine, coll: str, dt, op: str, m: int, inplace: bool, seed: int) -> int:
    """One case on this rank; returns the number of wrong elements here."""
    n, r = world.size, world.rank
    root = seed % n
    npdt = numpy_dtype(dt)
    isz = dt.itemsize
    code = OPS.get(op, SUM)
    total = m * n if coll in ("reduce_scatter", "all_to_all", "scatter") else m
    inputs = [make_input(i, dt, op, total, seed) for i in range(n)]
    mine = inputs[r].copy()
    if coll == "all_reduce":
        if inplace:
            eng.all_reduce(addr(mine), addr(mine), m, int(dt), code)
            got = mine
        else:
            got = np.full(m, 7, npdt)
            eng.all_reduce(addr(mine), addr(got), m, int(dt), code)
            if not np.array_equal(mine.view(np.uint8), inputs[r].view(np.uint8)):
                return max(1, m)  # send must not change
        wrong = compare(got, inputs, op, dt)
        # every rank must hold the very same bits
        everyone = world.allgather(got.tobytes())
        return wrong + sum(b != everyone[0] for b in everyone)
    if coll == "reduce":
        recv = mine if inplace or r != root else np.full(m, 7, npdt)
        eng.reduce(addr(mine), addr(recv) if r == root else 0, m, int(dt), code, root)
        if r != root:
            return 0 if np.array_equal(mine.view(np.uint8), inputs[r].view(np.uint8)) else 1
        return compare(recv, inputs, op, dt)
    if coll == "reduce_scatter":
        if inplace:
            got = mine[r * m : (r + 1) * m]
            eng.reduce_scatter(addr(mine), addr(mine) + r * m * isz, m, int(dt), code)
        else:
            got = np.full(m, 7, npdt)
            eng.reduce_scatter(addr(mine), addr(got), m, int(dt), code)
        return compare(got, [x[r * m : (r + 1) * m] for x in inputs], op, dt)
    if coll == "broadcast":
        buf = mine if r == root else np.full(m, 7, npdt)
        eng.broadcast(addr(buf), m * isz, root)
        return _bytes_wrong(buf, inputs[root])
    if coll == "all_gather":
        recv = np.full(m * n, 7, npdt)
        if inplace:
            recv[r * m : (r + 1) * m] = mine
            eng.all_gather(addr(recv) + r * m * isz, addr(recv), m * isz)
        else:
            eng.all_gather(addr(mine), addr(recv), m * isz)
        return _bytes_wrong(recv, np.concatenate(inputs))
    if coll == "all_to_all":
        got = np.full(m * n, 7, npdt)
        eng.all_to_all(addr(mine), addr(got), m * isz)
        expect = np.concatenate([inputs[j][r * m : (r + 1) * m] for j in range(n)])
        return _bytes_wrong(got, expect)
    if coll == "gather":
        if r == root:
            recv = np.full(m * n, 7, npdt)
            if inplace:
                recv[r * m : (r + 1) * m] = mine
                eng.gather(addr(recv) + r * m * isz, addr(recv), m * isz, root)
            else:
                eng.gather(addr(mine), addr(recv), m * isz, root)
            return _bytes_wrong(recv, np.concatenate(inputs))
        eng.gather(addr(mine), 0, m * isz, root)
        return 0
    if coll == "scatter":
        if r == root:
            got = mine[r * m : (r + 1) * m] if inplace else np.full(m, 7, npdt)
            eng.scatter(addr(mine), addr(got), m * isz, root)
        else:
            got = np.full(m, 7, npdt)
            eng.scatter(0, addr(got), m * isz, root)
        return _bytes_wrong(got, inputs[root][r * m : (r + 1) * m])
    raise SystemExit(f"unknown collective {coll}")


def _bytes_wrong(got, expect) -> int:
    return int(np.count_nonzero(got.view(np.uint8) != expect.view(np.uint8)))


REDUCING = ("all_reduce", "reduce", "reduce_scatter")
MOVING = ("broadcast", "all_gather", "all_to_all", "gather", "scatter")
MOVING_DTYPES = [DType.INT8, DType.FLOAT32, DType.FLOAT64]  # bytes only: these give the size variety
INPLACE_FORMS = {"all_reduce", "reduce", "reduce_scatter", "all_gather", "gather", "scatter"}


def check_agree(world, eng: ShmEngine, rounds: int = 50) -> int:
    n, r = world.size, world.rank
    wrong = 0
    out = np.zeros((n, 8), np.int64)
    for k in range(rounds):
        hdr = np.arange(8, dtype=np.int64) * 1000 + r * 10 + k
        eng.agree(hdr, out)
        expect = np.arange(8, dtype=np.int64)[None, :] * 1000 + np.arange(n)[:, None] * 10 + k
        wrong += int(np.count_nonzero(out != expect))
    eng.barrier()
    return wrong


def matrix(world, eng: ShmEngine, label: str, slot_bytes: int, colls, dtypes, full: bool, failures: list) -> int:
    cases = 0
    seed = 0
    wrong = check_agree(world, eng)
    if wrong:
        failures.append(f"{label}: agree: {wrong} wrong")
    for coll in colls:
        for dt in dtypes if coll in REDUCING else MOVING_DTYPES:
            for op in list(OPS) if coll in REDUCING else ["sum"]:
                for m in block_counts(dt, slot_bytes, full):
                    for inplace in (False, True) if coll in INPLACE_FORMS else (False,):
                        seed += 1
                        cases += 1
                        try:
                            wrong = run_case(world, eng, coll, dt, op, m, inplace, seed)
                        except Exception:
                            traceback.print_exc()
                            failures.append(f"{label}: {coll} {dt.name} {op} count={m} raised")
                            return cases
                        if wrong:
                            failures.append(
                                f"{label}: {coll} {dt.name} {op} count={m} "
                                f"{'in' if inplace else 'out-of'}-place: {wrong} wrong"
                            )
    return cases


def cmd_matrix(args) -> int:
    from mpi4py import MPI

    world = MPI.COMM_WORLD
    failures: list[str] = []
    cases = 0

    # 1. single-copy transfers for every size above the one-round reductions, but broadcasts
    #    of half a slot or more, which go through the slots (as those of 32 MiB do by default)
    eng = mpi_engine(
        world,
        args.prefix,
        "cma",
        TEST_SLOT,
        cma=True,  # every path that may read single-copy does, however fast it measures here
        small_bytes=TEST_SMALL,
        cma_min_bytes=1,
        cma_reduce_min_bytes=1,
        cma_bcast_max_bytes=TEST_SLOT // 2,
    )
    cases += matrix(world, eng, "cma", TEST_SLOT, REDUCING + MOVING, DTYPES, True, failures)
    if world.size > 1 and not eng.cma:
        failures.append(f"cma engine: single-copy reads not in use: {eng.cma_reason}")
    if eng.tuning["cma_bcast_max_bytes"] != TEST_SLOT // 2:
        failures.append(f"cma engine: cma_bcast_max_bytes not applied: {eng.tuning}")
    eng.close()
    # 1b. the same with every output past the cache: a single-copy all_reduce streams each part
    #     out of the scratch area (those of 32 MiB and more, by default)
    eng = mpi_engine(world, args.prefix, "cma-nt", TEST_SLOT, cma=True, small_bytes=TEST_SMALL, cma_min_bytes=1,
                     cma_reduce_min_bytes=1, nt_min_bytes=1)  # fmt: skip
    cases += matrix(world, eng, "cma-nt", TEST_SLOT, ("all_reduce",), DTYPES, True, failures)
    eng.close()

    # 2. slot copies forced by the environment (pipelined reductions); non-temporal output
    #    copies for every size
    os.environ["UNICCL_SHM_CMA"] = "0"
    try:
        eng = mpi_engine(world, args.prefix, "slots", TEST_SLOT, small_bytes=TEST_SMALL, nt_min_bytes=1)
    finally:
        del os.environ["UNICCL_SHM_CMA"]
    if world.size > 1 and eng.tuning["small_bytes"] != TEST_SMALL:
        failures.append(f"tuning not applied: {eng.tuning}")
    cases += matrix(world, eng, "slots", TEST_SLOT, REDUCING + MOVING, DTYPES, True, failures)
    if world.size > 1 and (eng.cma or "UNICCL_SHM_CMA" not in eng.cma_reason):
        failures.append(f"slots engine: cma={eng.cma} reason={eng.cma_reason!r}")
    eng.close()

    # 3. default tuning and slot size: both paths by size (fewer dtypes: the sizes are larger)
    eng = mpi_engine(world, args.prefix, "default", DEFAULT_SLOT_BYTES)
    cases += matrix(
        world, eng, "default", DEFAULT_SLOT_BYTES, REDUCING + MOVING, [DType.FLOAT32, DType.INT8], False, failures
    )
    eng.close()

    for f in failures[:30]:
        print(f"[rank {world.rank}] FAIL {f}", flush=True)
    by_kind: dict[str, int] = {}
    for f in failures:
        kind = " ".join(f.split()[:2])
        by_kind[kind] = by_kind.get(kind, 0) + 1
    if by_kind:
        print(f"[rank {world.rank}] failures by engine and collective: {by_kind}", flush=True)
    total = world.allreduce(len(failures))
    if world.rank == 0:
        print(f"shm engine matrix on {world.size} ranks: {cases} cases, {total} failures over all ranks")
    return 1 if total else 0


def cmd_big(args) -> int:
    from mpi4py import MPI

    world = MPI.COMM_WORLD
    eng = mpi_engine(world, args.prefix, "big", DEFAULT_SLOT_BYTES)
    count = (args.mib << 20) // 4
    x = np.full(count, world.rank + 1, np.float32)
    y = np.empty_like(x)
    times = []
    for _ in range(args.repeat):
        world.Barrier()
        t = time.perf_counter()
        eng.all_reduce(addr(x), addr(y), count, int(DType.FLOAT32), SUM)
        times.append(time.perf_counter() - t)
    expect = world.size * (world.size + 1) / 2
    ok = bool(np.all(y == expect))
    oks = world.allgather(ok)
    eng.close()
    if world.rank == 0:
        print(
            f"all_reduce {args.mib} MiB on {world.size} ranks: "
            f"{', '.join(f'{t:.3f}' for t in times)} s; correct on every rank: {all(oks)}"
        )
    return 0 if all(oks) else 1


def cmd_bad_arg(args) -> int:
    from mpi4py import MPI

    world = MPI.COMM_WORLD
    eng = mpi_engine(world, args.prefix, "bad", TEST_SLOT)
    x = np.ones(1000, np.float32)
    outcome = "no error"
    try:
        count = -5 if world.rank == 1 else x.size
        eng.all_reduce(addr(x), addr(x), count, int(DType.FLOAT32), SUM)
    except InvalidArgument as exc:
        outcome = f"InvalidArgument: {exc}"
    except RemoteError as exc:
        outcome = f"RemoteError remote_rank={exc.remote_rank}: {exc}"
    try:
        eng.all_reduce(addr(x), addr(x), x.size, int(DType.FLOAT32), SUM)
        later = "no error"
    except InternalError as exc:
        later = f"InternalError: {exc}"
    eng.close()
    lines = world.gather(f"rank {world.rank}: {outcome} | then: {later}")
    if world.rank == 0:
        print("\n".join(lines), flush=True)
    return 0


def cmd_loop(args) -> int:
    eng = attach_standalone(args.name, args.rank, args.size, DEFAULT_SLOT_BYTES, args.timeout)
    eng.barrier()  # every rank attached
    if args.rank == 0:
        eng.unlink()
    count = (args.mib << 20) // 4
    x = np.ones(count, np.float32)
    y = np.empty_like(x)
    print("READY", flush=True)
    t = time.monotonic()
    calls = 0
    try:
        while True:
            t = time.monotonic()
            eng.all_reduce(addr(x), addr(y), count, int(DType.FLOAT32), SUM)
            calls += 1
    except Exception as exc:
        waited = time.monotonic() - t
        print(
            f"ERROR {type(exc).__name__} remote_rank={getattr(exc, 'remote_rank', None)} "
            f"after {waited:.3f} s ({calls} calls): {exc}",
            flush=True,
        )
        return 3


def cmd_timeout(args) -> int:
    eng = attach_standalone(args.name, args.rank, 2, TEST_SLOT, 1.0)
    eng.barrier()
    if args.rank == 0:
        eng.unlink()
    x = np.ones(100, np.float32)
    if args.rank == 1:
        time.sleep(2.5)  # rank 0 gives up after 1 s
    t = time.monotonic()
    try:
        eng.all_reduce(addr(x), addr(x), x.size, int(DType.FLOAT32), SUM)
        print("NO ERROR", flush=True)
    except (Timeout, RemoteError) as exc:
        extra = f"missing_ranks={exc.missing_ranks}" if isinstance(exc, Timeout) else f"remote_rank={exc.remote_rank}"
        print(f"ERROR {type(exc).__name__} {extra} after {time.monotonic() - t:.2f} s: {exc}", flush=True)
    try:
        eng.barrier()
        print("LATER no error", flush=True)
    except InternalError as exc:
        print(f"LATER InternalError: {exc}", flush=True)
    return 0


def cmd_interrupt(args) -> int:
    """Ctrl-C during a wait on a peer that never comes: KeyboardInterrupt, promptly."""
    import faulthandler
    import signal
    import threading

    faulthandler.dump_traceback_later(20, exit=True)  # a hang says where, before the test's 30 s
    # a process started from a background job (`cmd &` in a script) inherits SIGINT ignored, and
    # Python then installs no KeyboardInterrupt handler: the os.kill below did nothing and the
    # wait hung (twice in full runs of .ci/run started so); the user's Ctrl-C is what is tested
    signal.signal(signal.SIGINT, signal.default_int_handler)
    eng = ShmEngine(args.name, 0, 2, True, TEST_SLOT, reduce_kernel(), 0.0)
    x = np.ones(16, np.float32)
    threading.Timer(0.3, lambda: os.kill(os.getpid(), signal.SIGINT)).start()
    t = time.monotonic()
    try:
        eng.all_reduce(addr(x), addr(x), x.size, int(DType.FLOAT32), SUM)
        print("NO INTERRUPT", flush=True)
    except KeyboardInterrupt:
        print(f"KeyboardInterrupt after {time.monotonic() - t:.2f} s", flush=True)
    try:
        eng.barrier()
    except InternalError as exc:
        print(f"LATER InternalError: {exc}", flush=True)
    eng.close()
    return 0


def cmd_raise(args) -> int:
    global _KEEP  # alive until interpreter exit: the module's atexit hook must unlink it
    _KEEP = ShmEngine(args.name, 0, 2, True, TEST_SLOT, reduce_kernel(), 5.0)
    assert os.path.exists("/dev/shm" + args.name)
    raise RuntimeError("deliberate failure with an engine still open")


def main() -> int:
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("matrix")
    p.add_argument("--prefix", required=True)
    p = sub.add_parser("big")
    p.add_argument("--prefix", required=True)
    p.add_argument("--mib", type=int, default=64)
    p.add_argument("--repeat", type=int, default=2)
    p = sub.add_parser("bad-arg")
    p.add_argument("--prefix", required=True)
    p = sub.add_parser("loop")
    p.add_argument("name")
    p.add_argument("rank", type=int)
    p.add_argument("size", type=int)
    p.add_argument("--mib", type=int, default=16)
    p.add_argument("--timeout", type=float, default=0.0)
    p = sub.add_parser("timeout")
    p.add_argument("name")
    p.add_argument("rank", type=int)
    p = sub.add_parser("raise")
    p.add_argument("name")
    p = sub.add_parser("interrupt")
    p.add_argument("name")
    args = ap.parse_args()
    return {
        "matrix": cmd_matrix,
        "big": cmd_big,
        "bad-arg": cmd_bad_arg,
        "loop": cmd_loop,
        "timeout": cmd_timeout,
        "raise": cmd_raise,
        "interrupt": cmd_interrupt,
    }[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
