"""The native path's added cost per call over the vendor library called directly, measured on
the emulated NCCL (tests/emulation: libcudart and libnccl over host memory), so it needs no GPU.

    python3 benchmarks/native_overhead.py [--ranks 1,2] [--calls 2000]

Builds the emulation (needs a C compiler), then runs ``uniccl run -n N`` of this script; each
rank makes a communicator on the nvidia platform (the plugin's real binding layer over the
emulated ABI) and times, on the same device buffer, alternating blocks of

* direct: ``ncclAllReduce`` on the default stream then ``cudaStreamSynchronize``, both through
  ctypes with their argument types set -- what a Python program calling NCCL itself pays;
* uniccl: ``comm.all_reduce(buf)`` -- the native path: checks, the cross-rank record, the
  same ``ncclAllReduce`` and the same synchronization (no stream given); after the first call
  of the shape, served compiled (the library's function called by address);
* direct+record: the direct call preceded by the shared-memory engine's agreement of a call
  record (more than one rank) -- the cross-rank check uniccl makes before every vendor call;
* interface: reading the buffer's ``__cuda_array_interface__`` -- what any consumer of the
  array pays to learn its pointer (the test's DeviceArray builds the dict in Python), and
  part of uniccl's column: the compiled path reads it on every call to match the shape.

Rank 0 prints, per size, the median block's µs per call of each, the difference (the native
path's added cost), and "rest": uniccl less direct+record less interface, what the compiled
path adds beyond the check and the array's own interface; it checks that the calls were
served compiled.  The emulated library's own work is in both columns alike; on a
GPU, benchmarks/gpu_native.py measures the same against the real NCCL.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SIZES = (8, 1 << 10, 1 << 16)
BLOCKS = 7


def rank_main(calls: int) -> int:
    sys.path.insert(0, str(ROOT / "tests" / "conformance"))
    import numpy as np
    from _platform import DeviceArray

    import uniccl

    comm = uniccl.init(platform="nvidia")
    if comm._native is None:
        print(f"rank {comm.rank}: no native path ({comm.platform_reason})", flush=True)
        return 1
    ccl, be = comm._native.ccl, comm._backend
    fn = ccl._fns["AllReduce"]  # the emulated library's ncclAllReduce (ctypes, argument types set)
    V = ctypes.c_void_p
    ncomm = V(comm._native_comm)
    rows = []
    for nbytes in SIZES:
        n = max(1, nbytes // 4)
        a = DeviceArray(be, np.ones(n, np.float32), device=comm.device)
        dt, op = ccl.dtype(int(uniccl.DType.FLOAT32)), ccl.spec.ops[int(uniccl.ReduceOp.SUM)]
        p = V(a.ptr)

        def direct(p=p, n=n, dt=dt, op=op):
            for _ in range(calls):
                rc = fn(p, p, n, dt, op, ncomm, None)
                if rc:
                    raise RuntimeError(f"ncclAllReduce returned {rc}")
                be.stream_synchronize(None)

        engine, hdr, hdrs = comm._engine, comm._hdr, comm._hdrs

        def direct_record(p=p, n=n, dt=dt, op=op):
            for _ in range(calls):
                if engine is not None:
                    engine.agree(hdr, hdrs)
                rc = fn(p, p, n, dt, op, ncomm, None)
                if rc:
                    raise RuntimeError(f"ncclAllReduce returned {rc}")
                be.stream_synchronize(None)

        def ours(a=a):
            for _ in range(calls):
                comm.all_reduce(a)

        def interface(a=a):
            for _ in range(calls):
                _ = a.__cuda_array_interface__

        for f in (direct, ours):  # warm up
            f()
        served = comm._fast.served if comm._fast is not None else 0
        arms = {"direct": direct, "direct+record": direct_record, "uniccl": ours, "interface": interface}
        blocks: dict = {name: [] for name in arms}
        for _ in range(BLOCKS):
            for name, f in arms.items():
                comm.barrier()
                t0 = time.perf_counter()
                f()
                blocks[name].append((time.perf_counter() - t0) / calls * 1e6)
        got = a.download()  # (one rank: a sum over one rank leaves the ones as they were)
        if comm.size == 1 and not np.array_equal(got, np.ones(n, np.float32)):
            print(f"rank {comm.rank}: wrong values after the loops: {got[:4]}", flush=True)
            return 1
        served = (comm._fast.served if comm._fast is not None else 0) - served
        if served < BLOCKS * calls:
            print(f"rank {comm.rank}: {served} of {BLOCKS * calls} calls served compiled", flush=True)
            return 1
        rows.append((nbytes, *(statistics.median(blocks[k]) for k in arms)))
        a.free()
    if comm.rank == 0:
        print(f"{comm.size} rank(s), {ccl.path} (emulated NCCL), {calls} calls per block, median of {BLOCKS}:")
        head = ("bytes", "direct us", "+record us", "uniccl us", "added us", "interface us", "rest us")
        print(" ".join(f"{h:>{max(8, len(h))}}" for h in head))
        for nbytes, d, dr, o, i in rows:
            cells = (nbytes, f"{d:.2f}", f"{dr:.2f}", f"{o:.2f}", f"{o - d:.2f}", f"{i:.2f}", f"{o - dr - i:.2f}")
            print(" ".join(f"{c:>{max(8, len(h))}}" for c, h in zip(cells, head)), flush=True)
    comm.destroy()
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ranks", default="1,2")
    p.add_argument("--calls", type=int, default=2000)
    p.add_argument("--rank-worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.rank_worker:
        return rank_main(args.calls)
    sys.path.insert(0, str(ROOT / "tests"))
    from _emulation import build, env

    info = build("nvidia")
    status = 0
    for n in (int(x) for x in args.ranks.split(",")):
        cmd = [sys.executable, "-m", "uniccl", "run", "--no-prefix", "-n", str(n), __file__, "--rank-worker",
               "--calls", str(args.calls)]  # fmt: skip
        status |= subprocess.run(cmd, env=env(info, dict(os.environ))).returncode
    return status


if __name__ == "__main__":
    sys.exit(main())
