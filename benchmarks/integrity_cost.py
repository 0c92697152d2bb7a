"""What payload checksums cost: all_reduce with CRC-32C against the same without, interleaved
in one job (blocks of calls alternate, so drift hits both alike).

usage: uniccl run -n 2 python benchmarks/integrity_cost.py [SIZES...]
  UNICCL_TRANSPORT=tcp: TCP's checksums (on by default) switched off and on between blocks;
  otherwise (shared memory): a communicator with UNICCL_SHM_CHECKSUM=1 (made by split)
  against the default one.
Rank 0 prints a markdown table: median microseconds per call with and without, and the ratio.
"""

import os
import statistics
import sys
import time

import numpy as np

import uniccl

sizes = [int(s) for s in sys.argv[1:]] or [8, 64 << 10, 1 << 20, 16 << 20]
comm = uniccl.init()
mesh = getattr(comm._t, "mesh", None)
if comm._engine is None:  # TCP: one communicator, its checksums switched
    if mesh is None or not mesh.checksums:
        sys.exit("over TCP, run with checksums on (the default)")
    kind = "TCP"

    def pick(on):
        mesh.checksums = on
        return comm
else:
    os.environ["UNICCL_SHM_CHECKSUM"] = "1"
    checked = comm.split(0)  # its own engine, made with checksums
    del os.environ["UNICCL_SHM_CHECKSUM"]
    assert checked._engine.integrity["shm_checksums"] and not comm._engine.integrity["shm_checksums"]
    kind = "shared memory"

    def pick(on):
        return checked if on else comm


if comm.rank == 0:
    print(f"| bytes | with CRC-32C (us) | without (us) | ratio |  ({comm.size} ranks, {kind})")
    print("|---|---|---|---|")
for nbytes in sizes:
    x = np.ones(max(1, nbytes // 4), np.float32)
    inner = max(3, min(50, (64 << 20) // max(nbytes, 1) // 4))
    times = {True: [], False: []}
    for rep in range(10):
        for on in (True, False) if rep % 2 == 0 else (False, True):
            c = pick(on)
            c.barrier()
            c.all_reduce(x)
            t = time.perf_counter()
            for _ in range(inner):
                c.all_reduce(x)
            times[on].append((time.perf_counter() - t) / inner * 1e6)
    if comm.rank == 0:
        a, b = statistics.median(times[True]), statistics.median(times[False])
        print(f"| {nbytes} | {a:.1f} | {b:.1f} | {a / b:.2f} |", flush=True)
if mesh is not None:
    mesh.checksums = True
comm.destroy()
