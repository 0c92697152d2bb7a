#!/usr/bin/env python3
"""The shared-memory engine's "slow spells" (docs/performance.md, "the slow spells, and live
choices"): a whole process pair whose slot copies run at a fraction of their usual speed.

    python benchmarks/slot_spells.py [RUNS]         # default 10 runs
    python benchmarks/slot_spells.py --control [KIB ...]   # the control alone, per chunk size

Each run is a fresh ``uniccl run -n 2`` job (as a user starts one) that times blocks of 100
broadcasts of 512 KiB from rank 0 twice, through the engine's slots only (``UNICCL_SHM_CMA=0``) and
with the default choice (live choices), and prints per run the median block in µs per call, whether
it was slow (over 150 µs: 3.5 GB/s or less), the path in force for that size and rank 1's running
estimates of its whole calls' speed on each path (GB/s; 0.0: none yet), and a control without uniccl:
two plain processes passing 32 MiB through a shared ring of four 1 MiB numpy chunks (GB/s). When the
control is slow too (on 2026-12-07, 1 MiB chunks: 3.5-3.7 against 14.8 GB/s), the spell is the machine's
hand-over of cached data between its cores (which the slots depend on; the MPIs escaped it).
``--control`` runs the control alone for chunks of each size given (default 64 256 1024 4096 8192
KiB), beside the same copies made by one process (no hand-over between cores).
Run with no other load: a busy machine makes every run slow.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import time

NBYTES, CALLS, BLOCKS = 512 << 10, 100, 5


def worker() -> None:
    import numpy as np

    import uniccl

    with uniccl.init() as comm:
        x = np.ones(NBYTES // 4, np.float32)
        for _ in range(20):
            comm.broadcast(x)
        blocks = []
        for _ in range(BLOCKS):
            comm.barrier()
            t0 = time.perf_counter()
            for _ in range(CALLS):
                comm.broadcast(x)
            blocks.append((time.perf_counter() - t0) / CALLS * 1e6)
        live = comm._engine.live_choices("broadcast")
        est = live and live[NBYTES]
        rows = comm.all_gather_object({"us": statistics.median(blocks), "live": est})
        if comm.rank == 0:
            print("RESULT " + json.dumps(rows), flush=True)


def control(
    nbytes: int = 32 << 20, chunk: int = 1 << 20, ring_chunks: int = 4, rounds: int = 10, pair: bool = True
) -> float:
    """GB/s of a plain producer/consumer pair: a forked child copies chunks of its array into a shared
    ring, this process copies them out, each spinning on the other's chunk counter.  ``pair=False``:
    this process makes both copies of every chunk itself."""
    import mmap

    import numpy as np

    shared = mmap.mmap(-1, chunk * ring_chunks + 16)  # anonymous and shared: the child sees it
    ring = np.frombuffer(shared, np.uint8, chunk * ring_chunks)
    done = np.frombuffer(shared, np.int64, 2, chunk * ring_chunks)  # chunks written, chunks read
    child = os.fork() if pair else None
    x = np.ones(nbytes, np.uint8)
    t0 = time.perf_counter()
    for k in range(rounds * (nbytes // chunk)):
        part = x[(k % (nbytes // chunk)) * chunk :][:chunk]
        box = ring[(k % ring_chunks) * chunk :][:chunk]
        if child is None:
            np.copyto(box, part)
            np.copyto(part, box)
        elif child == 0:
            while k - done[1] >= ring_chunks:
                if time.perf_counter() > t0 + 60:  # the reader is gone: do not spin on as an orphan
                    os._exit(1)
            np.copyto(box, part)
            done[0] = k + 1
        else:
            while done[0] <= k:
                if time.perf_counter() > t0 + 60:
                    raise TimeoutError("the control's writer stopped")
            np.copyto(part, box)
            done[1] = k + 1
    if child == 0:
        os._exit(0)
    gbps = nbytes * rounds / (time.perf_counter() - t0) / 1e9
    if child:
        os.waitpid(child, 0)
    return gbps


def main() -> int:
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 10
    uniccl = shutil.which("uniccl") or os.path.join(os.path.dirname(sys.executable), "uniccl")
    counts = {"slots only": 0, "default": 0}
    for i in range(runs):
        for label, cma in (("slots only", "0"), ("default", None)):
            env = dict(os.environ)
            env.pop("UNICCL_SHM_CMA", None)
            if cma is not None:
                env["UNICCL_SHM_CMA"] = cma
            out = subprocess.run(
                [uniccl, "run", "-n", "2", sys.executable, __file__, "--worker"],
                env=env,
                capture_output=True,
                text=True,
                timeout=120,
            ).stdout
            line = next((ln for ln in out.splitlines() if "RESULT " in ln), None)
            if line is None:
                print(f"run {i + 1} {label}: no result\n{out[-2000:]}")
                return 1
            rows = json.loads(line.split("RESULT ", 1)[1])
            us = rows[0]["us"]
            slow = us > 150
            counts[label] += slow
            est = rows[1]["live"]
            tail = (
                f"{est['choice'] or 'not chosen'}; rank 1: slots {est['slot_gbps']:.1f} GB/s, "
                f"single-copy {est['cma_gbps']:.1f} GB/s"
                if est
                else "choice not live"
            )
            print(
                f"run {i + 1:2d} {label:10s}: {us:7.1f} us per call{' SLOW' if slow else '     '}  {tail}; "
                f"control {control():.1f} GB/s",
                flush=True,
            )
    print(f"slow runs: slots only {counts['slots only']}/{runs}, default {counts['default']}/{runs}")
    return 0


if __name__ == "__main__":
    if "--worker" in sys.argv:
        worker()
    elif "--control" in sys.argv:
        for kib in [int(a) for a in sys.argv[sys.argv.index("--control") + 1 :]] or [64, 256, 1024, 4096, 8192]:
            print(
                f"{kib:5d} KiB chunks: two processes {control(chunk=kib << 10):5.1f} GB/s, "
                f"one process {control(chunk=kib << 10, pair=False):5.1f} GB/s",
                flush=True,
            )
    else:
        sys.exit(main())
