"""The spells of a small call: a persistent 8-byte all_reduce timed in blocks of 20000 calls for a
while, and the spread of the blocks (10th percentile, median, 90th percentile, µs per call).

    uniccl run -n 2 python benchmarks/call_spells.py [SECONDS]

On the shared VM the time of such a call moves in steps that last seconds (on 2026-12-07: about
0.37, 0.47, 0.53, 0.85 and 1.05 µs at 2 ranks within one minute), most likely where the
hypervisor places the two vCPUs (a line between them costs from tens to hundreds of ns); a
single median of a short run reads whichever spell it met.  The spread over SECONDS (default 8)
compares two builds better: alternate runs, with ``PYTHONPATH=<unpacked wheel>`` for the other.
"""

import statistics
import sys
import time

import numpy as np

import uniccl

BLOCK = 20000


def main(seconds: float) -> None:
    with uniccl.init() as comm:
        x = np.ones(2, np.float32)
        req = comm.all_reduce_init(x)
        start, wait = req.start, req.wait
        blocks = []
        # every rank runs the same number of blocks: rank 0's clock decides, by an all_reduce
        go = np.ones(1, np.float32)
        t_end = time.monotonic() + seconds
        while True:
            go[0] = 1.0 if comm.rank != 0 or time.monotonic() < t_end else 0.0
            comm.all_reduce(go, op="min")
            if not go[0]:
                break
            t0 = time.perf_counter()
            for _ in range(BLOCK):
                start()
                wait()
            blocks.append((time.perf_counter() - t0) / BLOCK * 1e6)
        req.free()
        if comm.rank == 0:
            b = sorted(blocks)
            print(
                f"{comm.size} ranks, {len(b)} blocks of {BLOCK} persistent 8 B all_reduce calls in {seconds:g} s: "
                f"p10 {b[len(b) // 10]:.3f}  median {statistics.median(b):.3f}  p90 {b[len(b) * 9 // 10]:.3f} µs per call",
                flush=True,
            )


if __name__ == "__main__":
    main(float(sys.argv[1]) if len(sys.argv) > 1 else 8.0)
