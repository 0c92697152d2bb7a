"""What TCP's payload checksums cost: all_reduce with CRC-32C (and kept copies) against the
same without, interleaved in one job (blocks of calls alternate, so drift hits both alike).

usage: uniccl run -n 2 python benchmarks/integrity_cost.py [SIZES...]   (UNICCL_TRANSPORT=tcp)
Rank 0 prints a markdown table: median microseconds per call with and without, and the ratio.
"""
import statistics
import sys
import time

import numpy as np

import uniccl

sizes = [int(s) for s in sys.argv[1:]] or [8, 64 << 10, 1 << 20, 16 << 20]
comm = uniccl.init()
mesh = getattr(comm._t, "mesh", None)
if mesh is None or not mesh.checksums:
    sys.exit("run over TCP (UNICCL_TRANSPORT=tcp) with checksums on (the default)")
if comm.rank == 0:
    print(f"| bytes | with CRC-32C (us) | without (us) | ratio |  ({comm.size} ranks, TCP)")
    print("|---|---|---|---|")
for nbytes in sizes:
    x = np.ones(max(1, nbytes // 4), np.float32)
    inner = max(3, min(50, (64 << 20) // max(nbytes, 1) // 4))
    times = {True: [], False: []}
    for rep in range(10):
        for on in (True, False) if rep % 2 == 0 else (False, True):
            comm.barrier()
            mesh.checksums = on
            comm.all_reduce(x)
            t = time.perf_counter()
            for _ in range(inner):
                comm.all_reduce(x)
            times[on].append((time.perf_counter() - t) / inner * 1e6)
    mesh.checksums = True
    if comm.rank == 0:
        a, b = statistics.median(times[True]), statistics.median(times[False])
        print(f"| {nbytes} | {a:.1f} | {b:.1f} | {a / b:.2f} |", flush=True)
comm.destroy()
