"""Single-copy reads (CMA) against the engine's slots for the data movers, in the same processes:
two shared-memory engines, one with the default single-copy threshold (and no upper limit for
broadcasts) and one that never reads a peer's memory directly, timed alternately (7 rounds, the median of each), so that the machine's
changing speed weighs on both alike.

    uniccl run -n 2 python benchmarks/cma_vs_slots.py [COLLECTIVES] [SIZES]
    uniccl run -n 2 python benchmarks/cma_vs_slots.py broadcast,all_gather 131072,2097152

Rank 0 prints, per collective and size (bytes of the per-rank buffer), µs per call each way and
slots / cma (above 1: the slots are slower).
"""

import secrets
import statistics
import sys
import time

import numpy as np
import uniccl_cpu

import uniccl
from uniccl.transport.shm._shm import ShmEngine

COLLS = "broadcast,reduce,all_gather,all_to_all,gather,scatter,all_reduce"
SIZES = "32768,131072,524288,2097152,8388608"


def call(e, coll, send, recv, size, n):
    bb = size // n
    if coll == "broadcast":
        e.broadcast(recv.ctypes.data, size, 0)
    elif coll == "reduce":
        e.reduce(send.ctypes.data, recv.ctypes.data, size // 4, 7, 0, 0)
    elif coll == "all_reduce":
        e.all_reduce(send.ctypes.data, recv.ctypes.data, size // 4, 7, 0)
    elif coll in ("all_gather", "all_to_all"):
        getattr(e, coll)(send.ctypes.data, recv.ctypes.data, bb)
    else:  # gather, scatter
        getattr(e, coll)(send.ctypes.data, recv.ctypes.data, bb, 0)


def main() -> None:
    colls = (sys.argv[1] if len(sys.argv) > 1 else COLLS).split(",")
    sizes = [int(x) for x in (sys.argv[2] if len(sys.argv) > 2 else SIZES).split(",")]
    with uniccl.init() as comm:
        r, n = comm.rank, comm.size
        token = comm._t.bcast_obj(secrets.token_hex(4) if r == 0 else None, 0)
        fn = uniccl_cpu.uniccl_host_reduce_kernel()
        engines = {}
        for tag, cma_min in (("cma", 16384 if n <= 2 else 65536), ("slots", 1 << 40)):
            name = f"/uniccl-cma-vs-slots-{token}-{tag}"
            if r == 0:
                engines[tag] = ShmEngine(
                    name, 0, n, True, 1 << 20, fn, 60.0, cma=True, cma_min_bytes=cma_min, cma_bcast_max_bytes=-1
                )
                comm.barrier()
            else:
                comm.barrier()
                engines[tag] = ShmEngine(name, r, n, False, 0, fn, 60.0)
        try:
            for coll in colls:
                for size in sizes:
                    send, recv = np.ones(size // 4, np.float32), np.zeros(size // 4, np.float32)
                    iters = max(3, min(300, (64 << 20) // size))
                    took = {"cma": [], "slots": []}
                    for _ in range(7):
                        for tag, e in engines.items():
                            call(e, coll, send, recv, size, n)
                            e.barrier()
                            t0 = time.perf_counter()
                            for _ in range(iters):
                                call(e, coll, send, recv, size, n)
                            took[tag].append((time.perf_counter() - t0) / iters)
                    if r == 0:
                        c, s = statistics.median(took["cma"]), statistics.median(took["slots"])
                        print(
                            f"{coll:12s} n={n} {size:>9d}: cma {c * 1e6:9.1f} us  slots {s * 1e6:9.1f} us  "
                            f"slots/cma {s / c:5.2f}",
                            flush=True,
                        )
        finally:
            for e in engines.values():
                e.close()


if __name__ == "__main__":
    main()
