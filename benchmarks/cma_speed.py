#!/usr/bin/env python3
"""What a single-copy read (process_vm_readv) costs against a plain copy on this host, and what the
shared-memory engine's measure of it costs at open (docs/performance.md, "single-copy reads only
where this host makes them pay").

    python benchmarks/cma_speed.py

1. process_vm_readv of this process's own 2 MiB numpy array into another, in one call and in pieces
   of 1 MiB down to 16 KiB, against numpy's copy of the same arrays (median of 20 each, GB/s).
2. 10 opens of a 2-rank segment by its creator with the engine's default ("auto": it measures) and
   10 with ``cma=True`` (no measure), alternating: ms per open, and the speed the measure gave.
"""

import ctypes
import os
import secrets
import statistics
import time

import numpy as np
import uniccl_cpu

from uniccl.transport.shm._shm import ShmEngine


class _Iovec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


def reads(n: int = 2 << 20, repeats: int = 20) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    pid = os.getpid()
    a, b = np.ones(n, np.uint8), np.zeros(n, np.uint8)
    copy = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        np.copyto(b, a)
        copy.append(time.perf_counter() - t0)
    print(f"plain copy of {n >> 20} MiB: {n / statistics.median(copy) / 1e9:.1f} GB/s")
    for piece in (n, 1 << 20, 256 << 10, 64 << 10, 16 << 10):
        took = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            for off in range(0, n, piece):
                local, remote = _Iovec(b.ctypes.data + off, piece), _Iovec(a.ctypes.data + off, piece)
                if libc.process_vm_readv(pid, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0) != piece:
                    raise OSError(ctypes.get_errno(), "process_vm_readv")
            took.append(time.perf_counter() - t0)
        print(f"process_vm_readv in pieces of {piece >> 10:5d} KiB: {n / statistics.median(took) / 1e9:.1f} GB/s")


def opens(count: int = 10) -> None:
    fn = uniccl_cpu.uniccl_host_reduce_kernel()
    ms = {"auto": [], "cma=True": []}
    speeds = []
    for _ in range(count):
        for tag, mode in (("auto", "auto"), ("cma=True", True)):
            t0 = time.perf_counter()
            e = ShmEngine(f"/uniccl-cma-speed-{secrets.token_hex(4)}", 0, 2, True, 1 << 20, fn, 10.0, cma=mode)
            ms[tag].append((time.perf_counter() - t0) * 1e3)
            if mode == "auto":
                speeds.append(e.tuning["cma_speed"])
            e.close()
    for tag, v in ms.items():
        print(f"open ({tag}): {min(v):.2f}-{max(v):.2f} ms, median {statistics.median(v):.2f}")
    print(f"measured single-copy speed over a plain copy: {min(speeds):.2f}-{max(speeds):.2f}")


if __name__ == "__main__":
    reads()
    opens()
