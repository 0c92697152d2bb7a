"""Soak: many randomly chosen collectives (sizes, dtypes, ops, roots) on one communicator,
every result checked against numpy; resident memory, open file descriptors and /dev/shm
segments must stay flat.

usage: uniccl run -n 4 python benchmarks/soak.py [CALLS]   (default 10000; UNICCL_TRANSPORT=tcp for TCP)
Every rank draws the same sequence (seeded), so all call the same collective each time.
Rank 0 prints progress every 1000 calls and a summary; exit status 1 on any wrong result or growth.
"""

import os
import sys
import time

import ml_dtypes
import numpy as np

import uniccl

CALLS = int(sys.argv[1]) if len(sys.argv) > 1 else 10000
DTYPES = [
    np.int8,
    np.uint8,
    np.int32,
    np.uint32,
    np.int64,
    np.uint64,
    np.float16,
    np.float32,
    np.float64,
    ml_dtypes.bfloat16,
    np.int16,
    np.uint16,
]
OPS = {"sum": np.add, "prod": np.multiply, "max": np.maximum, "min": np.minimum}
COLLS = [
    "all_reduce",
    "reduce",
    "broadcast",
    "all_gather",
    "reduce_scatter",
    "all_to_all",
    "gather",
    "scatter",
    "barrier",
]


def rss_kib() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def shm() -> int:
    return sum(f.startswith("uniccl-") for f in os.listdir("/dev/shm"))


def data(rank: int, n: int, dt, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed * 131 + rank)
    if np.dtype(dt).kind in "iu":
        return rng.integers(0, 3, n).astype(dt)  # small: products and sums stay exact
    return rng.integers(-2, 3, n).astype(dt)  # small integers: float sums are exact too


def main() -> int:
    comm = uniccl.init()
    r, p = comm.rank, comm.size
    rng = np.random.default_rng(12345)  # the same on every rank
    wrong, t0 = 0, time.time()
    base = None
    for i in range(CALLS):
        coll = COLLS[rng.integers(len(COLLS))]
        dt = DTYPES[rng.integers(len(DTYPES))]
        n = int(rng.choice([0, 1, 7, 64, 1000, 4099, 65536, 300000]))
        opname = list(OPS)[rng.integers(4)]
        if opname == "prod":
            n = min(n, 4099)
        root = int(rng.integers(p))
        xs = [data(q, n, dt, i) for q in range(p)]
        ref = np.asarray(xs[0], np.float64) if np.dtype(dt).kind == "f" or dt is ml_dtypes.bfloat16 else xs[0]
        if coll in ("all_reduce", "reduce", "reduce_scatter"):
            acc = xs[0].astype(np.float64) if ref.dtype == np.float64 else xs[0].copy()
            for q in range(1, p):
                acc = OPS[opname](acc, xs[q].astype(acc.dtype))
            want = acc.astype(dt)
        x = xs[r].copy()
        if coll == "all_reduce":
            comm.all_reduce(x, op=opname)
            ok = np.array_equal(x, want)
        elif coll == "reduce":
            comm.reduce(x, op=opname, root=root)
            ok = r != root or np.array_equal(x, want)
        elif coll == "broadcast":
            comm.broadcast(x, root=root)
            ok = np.array_equal(x, xs[root])
        elif coll == "all_gather":
            out = np.empty(n * p, dt)
            comm.all_gather(x, out)
            ok = np.array_equal(out, np.concatenate(xs))
        elif coll == "reduce_scatter":
            m = n // p
            blocks = [data(q, m * p, dt, i) for q in range(p)]
            acc = blocks[0].astype(np.float64) if ref.dtype == np.float64 else blocks[0].copy()
            for q in range(1, p):
                acc = OPS[opname](acc, blocks[q].astype(acc.dtype))
            out = np.empty(m, dt)
            comm.reduce_scatter(blocks[r], out, op=opname)
            ok = np.array_equal(out, acc.astype(dt)[r * m : (r + 1) * m])
        elif coll == "all_to_all":
            m = n // p
            blocks = [data(q, m * p, dt, i) for q in range(p)]
            out = np.empty(m * p, dt)
            comm.all_to_all(blocks[r], out)
            ok = np.array_equal(out, np.concatenate([blocks[q][r * m : (r + 1) * m] for q in range(p)]))
        elif coll == "gather":
            out = np.empty(n * p, dt) if r == root else None
            comm.gather(x, out, root=root)
            ok = r != root or np.array_equal(out, np.concatenate(xs))
        elif coll == "scatter":
            m = n // p
            src = data(root, m * p, dt, i) if r == root else None
            out = np.empty(m, dt)
            comm.scatter(src, out, root=root)
            ok = np.array_equal(out, data(root, m * p, dt, i)[r * m : (r + 1) * m])
        else:
            comm.barrier()
            ok = True
        if not ok:
            wrong += 1
            print(f"rank {r}: call {i} {coll} {np.dtype(dt).name} n={n} op={opname} root={root}: WRONG", flush=True)
        if i == max(200, CALLS // 2):  # after warm-up: caches, pools and TCP's kept-copy ring have filled
            base = (rss_kib(), fds(), shm())
        if r == 0 and (i + 1) % 1000 == 0:
            print(
                f"{i + 1} calls, {time.time() - t0:.0f} s, rss {rss_kib()} KiB, fds {fds()}, /dev/shm {shm()}",
                flush=True,
            )
    end = (rss_kib(), fds(), shm())
    grew = base is not None and (end[0] > base[0] * 1.10 + 8192 or end[1] > base[1] or end[2] > base[2])
    wrong_all = comm._t.allgather_obj(wrong)
    grew_all = comm._t.allgather_obj((grew, base, end))
    if r == 0:
        print(
            f"soak: {CALLS} calls on {p} ranks in {time.time() - t0:.0f} s; wrong results {sum(wrong_all)}; "
            + "; ".join(
                f"rank {q}: rss {b[0]} -> {e[0]} KiB, fds {b[1]} -> {e[1]}, /dev/shm {b[2]} -> {e[2]}"
                + (" GREW" if g else "")
                for q, (g, b, e) in enumerate(grew_all)
            ),
            flush=True,
        )
    comm.destroy()
    return 1 if sum(wrong_all) or any(g for g, _, _ in grew_all) else 0


if __name__ == "__main__":
    sys.exit(main())
