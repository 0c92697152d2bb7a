"""SUM reduction throughput of uniccl-cpu against numpy's ``np.add(a, b, out=c)``.

GB/s counts the bytes read and written, 3 * count * itemsize, per call; each
cell is the median of ``--repeats`` timings, each timing long enough (a loop of
calls) to dwarf the clock, uniccl's and numpy's timings alternating.  Both sides work on the same page-aligned buffers and
uniccl is called through its hook, as the core calls it.

    python benchmarks/bench_kernels.py [--variant avx2] [--repeats 7]
"""

from __future__ import annotations

import argparse
import ctypes
import statistics
import time

import ml_dtypes
import numpy as np
import uniccl_cpu
from uniccl_cpu import _kernels

DTYPES = {  # name: (uniccl dtype code, numpy dtype)
    "float32": (7, np.float32),
    "float64": (8, np.float64),
    "float16": (6, np.float16),
    "bfloat16": (9, ml_dtypes.bfloat16),
    "int32": (2, np.int32),
}
SIZES = {"64 KiB": 64 << 10, "1 MiB": 1 << 20, "16 MiB": 16 << 20, "64 MiB": 64 << 20}
SUM = 0
MIN_SAMPLE_S = 0.05


def aligned_array(nbytes: int, dtype) -> np.ndarray:
    ptr = uniccl_cpu.uniccl_host_alloc(nbytes)
    arr = np.frombuffer((ctypes.c_char * nbytes).from_address(ptr), dtype)
    arr[...] = np.arange(arr.size) % 100  # touch every page, keep values finite
    return arr


def seconds_per_call(fns, repeats: int) -> list[float]:
    """Median seconds per call of each function; their samples alternate so that
    both sides see the same machine (memory bandwidth on a shared host drifts)."""
    calls = []
    for fn in fns:
        fn()  # warm up caches and page tables
        start = time.perf_counter()
        fn()
        calls.append(max(1, int(MIN_SAMPLE_S / max(time.perf_counter() - start, 1e-7))))
    samples = [[] for _ in fns]
    for _ in range(repeats):
        for fn, k, out in zip(fns, calls, samples):
            start = time.perf_counter()
            for _ in range(k):
                fn()
            out.append((time.perf_counter() - start) / k)
    return [statistics.median(s) for s in samples]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variant", choices=_kernels.available(), help="kernel variant (default: best)")
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    if args.variant:
        _kernels.select(args.variant)

    print(f"kernels: {_kernels.variant()}   numpy {np.__version__}   GB/s = 3*n*itemsize/time")
    print(f"{'dtype':<9} {'size':>7} {'uniccl':>9} {'numpy':>9} {'ratio':>7}")
    for name, (code, dtype) in DTYPES.items():
        for label, nbytes in SIZES.items():
            a, b, c = (aligned_array(nbytes, dtype) for _ in range(3))
            n = a.size
            pa, pb, pc = a.ctypes.data, b.ctypes.data, c.ctypes.data
            reduce = uniccl_cpu.uniccl_reduce
            ours, theirs = seconds_per_call(
                [lambda: reduce(pc, pa, pb, n, code, SUM, None), lambda: np.add(a, b, out=c)], args.repeats
            )
            gbs = 3 * nbytes / 1e9
            print(f"{name:<9} {label:>7} {gbs / ours:9.1f} {gbs / theirs:9.1f} {theirs / ours:6.2f}x", flush=True)
            for arr in (a, b, c):
                uniccl_cpu.uniccl_host_free(arr.ctypes.data)


if __name__ == "__main__":
    main()
