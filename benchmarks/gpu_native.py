"""One GPU: uniccl's all_reduce on device buffers vs the same NCCL called directly.

usage: uniccl run -n 1 benchmarks/gpu_native.py   (needs a usable nvidia platform; with
UNICCL_PLUGINS=^nccl only the torch check runs, through host staging)
Prints a table: size, direct NCCL time, uniccl native time, uniccl staged time (us),
and the ratios; the per-call overhead of uniccl's Python layer is what it shows
(with one rank NCCL moves no data between GPUs).  Also checks a torch CUDA tensor
(DLPack, the tensor's stream honoured) through the native and staged paths.
"""

import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "conformance"))
from _platform import DeviceArray

import uniccl


def timed(fn, sync, iters):
    for _ in range(5):
        fn()
    sync()
    samples = []
    for _ in range(3):
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        sync()
        samples.append((time.perf_counter() - t0) / iters * 1e6)
    return statistics.median(samples)


def main() -> int:
    comm = uniccl.init(platform="nvidia")
    be, native = comm._backend, comm._native
    rows, ncomm = [], None
    if native is not None:
        t0 = time.perf_counter()
        ncomm = native.create(1, 0, 0, lambda obj, root: obj)
        print(f"NCCL communicator of 1 rank made in {time.perf_counter() - t0:.2f} s", flush=True)
    sync = lambda: be.stream_synchronize(None)  # noqa: E731
    for nbytes in (8, 1 << 10, 1 << 16, 1 << 20, 16 << 20, 256 << 20) if native is not None else ():
        n = max(1, nbytes // 4)
        a = DeviceArray(be, np.ones(n, np.float32))
        args = {"send": a.ptr, "recv": a.ptr, "count": n, "dtype": 7, "op": 0}
        iters = 200 if nbytes <= 1 << 20 else 20
        direct = timed(lambda: native.run("all_reduce", ncomm, args, None, 0), sync, iters)
        ours = timed(lambda: comm.all_reduce(a), sync, iters)
        rows.append((nbytes, direct, ours))
        print(f"{nbytes} B: direct {direct:.1f} us, uniccl {ours:.1f} us", flush=True)
        a.free()
    staged_env = os.environ.get("UNICCL_PLUGINS", "")
    if rows:
        print(f"\n{'bytes':>10} {'NCCL direct us':>15} {'uniccl us':>10} {'ratio':>6}")
    for nbytes, d, o in rows:
        print(f"{nbytes:>10} {d:>15.1f} {o:>10.1f} {o / d:>6.2f}")
    # a torch tensor through DLPack, on a side stream
    import torch

    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        t = torch.arange(1 << 20, device="cuda", dtype=torch.float32)
        comm.all_reduce(t)
    torch.cuda.synchronize()
    ok = torch.equal(t.cpu(), torch.arange(1 << 20, dtype=torch.float32))
    print(f"torch cuda tensor all_reduce (1 rank, UNICCL_PLUGINS={staged_env!r}): {'OK' if ok else 'WRONG'}")
    if ncomm is not None:
        native.destroy(ncomm)
    comm.destroy()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
