"""Differential test of one collective against numpy: every dtype x op x size, in place
and out of place.  Run under mpiexec; exit status 1 if any rank saw a wrong result.

usage: matrix.py COLLECTIVE [--sizes 0,1,7,1023,2063,big1,big8] [--dtypes all|float32,...]
Sizes are per-rank block counts; big1/big8 are ~1 MiB (odd count) and 8 MiB of data.
"""

from __future__ import annotations

import argparse
import sys
import traceback

import numpy as np
from _data import ALL_DTYPES, OPS, compare, make_input
from mpi4py import MPI

import uniccl
from uniccl._types import DType, numpy_dtype

REDUCING = {"all_reduce", "reduce", "reduce_scatter"}
# The big sizes (big1, big8) exercise the pipelining, chunking and single-copy paths, which
# depend on the element size, not on the values: a reduction runs them for every dtype with
# sum and for every op with float32 and int64; a data mover for one dtype of each element
# size.  (Every dtype x op still runs at 0, 1, 7, 1023 and 2063 elements, which cover the kernels'
# vector bodies and tails, and the shared-memory engine's boxes up to their limit and the slots
# just above it: 2063 4-byte elements are 8252 bytes, 2063 8-byte ones 16504.)  This cut the matrix
# from 495 s to about a third on the 2-core CI.
BIG_SIZES = {"big1", "big8"}
ALL_OPS_AT_BIG = {DType.FLOAT32, DType.INT64}
MOVERS_AT_BIG = {DType.INT8, DType.BFLOAT16, DType.FLOAT32, DType.FLOAT64}


def runs_big(coll: str, dt, op: str) -> bool:
    if coll in REDUCING:
        return op == "sum" or dt in ALL_OPS_AT_BIG
    return dt in MOVERS_AT_BIG


def block_counts(sizes: str, dt, big: bool = True) -> list[int]:
    out = []
    for s in sizes.split(","):
        if s in BIG_SIZES and not big:
            continue
        if s == "big1":
            out.append((1 << 20) // dt.itemsize + 5)
        elif s == "big8":
            out.append((8 << 20) // dt.itemsize)
        else:
            out.append(int(s))
    return out


def run_case(comm, coll: str, dt, op: str, m: int, inplace: bool, seed: int) -> int:
    """Run one case on this rank; return the number of wrong elements here."""
    n, r = comm.size, comm.rank
    root = seed % n
    npdt = numpy_dtype(dt)
    total = m * n if coll in ("reduce_scatter", "all_to_all", "scatter") else m
    inputs = [make_input(i, dt, op, total, seed) for i in range(n)]
    mine = inputs[r].copy()
    if coll == "all_reduce":
        if inplace:
            comm.all_reduce(mine, op=op)
            got = mine
        else:
            got = np.full(m, 7, npdt)
            assert comm.all_reduce(mine, got, op=op) is got
            if not np.array_equal(mine.view(np.uint8), inputs[r].view(np.uint8)):
                return max(1, m)  # sendbuf must not change
        return compare(got, inputs, op, dt)
    if coll == "reduce":
        recv = None if inplace or r != root else np.full(m, 7, npdt)
        res = comm.reduce(mine, recv, op=op, root=root)
        if r != root:
            return 0 if res is None else 1
        return compare(mine if inplace else recv, inputs, op, dt)
    if coll == "broadcast":
        buf = mine if r == root else np.full(m, 7, npdt)
        comm.broadcast(buf, root=root)
        return _bytes_wrong(buf, inputs[root])
    if coll == "all_gather":
        recv = np.full(m * n, 7, npdt)
        if inplace:
            recv[r * m : (r + 1) * m] = mine
            comm.all_gather(recv[r * m : (r + 1) * m], recv)
        else:
            comm.all_gather(mine, recv)
        return _bytes_wrong(recv, np.concatenate(inputs))
    if coll == "reduce_scatter":
        if inplace:
            comm.reduce_scatter(mine, mine[r * m : (r + 1) * m], op=op)
            got = mine[r * m : (r + 1) * m]
        else:
            got = np.full(m, 7, npdt)
            comm.reduce_scatter(mine, got, op=op)
        return compare(got, [x[r * m : (r + 1) * m] for x in inputs], op, dt)
    if coll == "all_to_all":
        if inplace:
            comm.all_to_all(mine, mine)
            got = mine
        else:
            got = np.full(m * n, 7, npdt)
            comm.all_to_all(mine, got)
        expect = np.concatenate([inputs[j][r * m : (r + 1) * m] for j in range(n)])
        return _bytes_wrong(got, expect)
    if coll == "gather":
        if r == root:
            recv = np.full(m * n, 7, npdt)
            if inplace:
                recv[r * m : (r + 1) * m] = mine
                comm.gather(recv[r * m : (r + 1) * m], recv, root=root)
            else:
                comm.gather(mine, recv, root=root)
            return _bytes_wrong(recv, np.concatenate(inputs))
        return 0 if comm.gather(mine, None, root=root) is None else 1
    if coll == "scatter":
        if r == root:
            got = mine[r * m : (r + 1) * m] if inplace else np.full(m, 7, npdt)
            comm.scatter(mine, got, root=root)
        else:
            got = np.full(m, 7, npdt)
            comm.scatter(None, got, root=root)
        return _bytes_wrong(got, inputs[root][r * m : (r + 1) * m])
    raise SystemExit(f"unknown collective {coll}")


def _bytes_wrong(got, expect) -> int:
    return int(np.count_nonzero(got.view(np.uint8) != expect.view(np.uint8)))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("collective")
    ap.add_argument("--sizes", default="0,1,7,1023,2063,big1,big8")
    ap.add_argument("--dtypes", default="all")
    args = ap.parse_args()
    dtypes = ALL_DTYPES if args.dtypes == "all" else [DType[d.upper()] for d in args.dtypes.split(",")]
    ops = OPS if args.collective in REDUCING else ["sum"]
    world = MPI.COMM_WORLD
    failures, cases = [], 0
    with uniccl.init() as comm:
        seed = 0
        for dt in dtypes:
            for op in ops:
                for m in block_counts(args.sizes, dt, runs_big(args.collective, dt, op)):
                    for inplace in (False,) if args.collective == "broadcast" else (False, True):
                        seed += 1
                        cases += 1
                        try:
                            wrong = run_case(comm, args.collective, dt, op, m, inplace, seed)
                        except Exception:
                            wrong = -1
                            traceback.print_exc()
                        if wrong:
                            failures.append(
                                f"{args.collective} {dt.name} {op} count={m} "
                                f"{'in' if inplace else 'out-of'}-place: {wrong} wrong"
                            )
    for f in failures[:20]:
        print(f"[rank {world.rank}] FAIL {f}", flush=True)
    total = world.allreduce(len(failures))
    if world.rank == 0:
        print(f"{args.collective} on {world.size} ranks: {cases} cases, {total} failures over all ranks")
    return 1 if total else 0


if __name__ == "__main__":
    sys.exit(main())
