"""What telemetry costs: the same all_reduce timed with telemetry on and off (switched in the
same run, in alternating blocks), at 8 B (microseconds per call) and 1 MiB (share of the call).

usage: uniccl run -n 2 python benchmarks/telemetry_cost.py [PAIRS]   (UNICCL_TRANSPORT=tcp for TCP)
Rank 0 prints one line per size: median per-call time on and off, the median over pairs of
adjacent blocks of (on - off), in microseconds and as a share of the call; and the same for
the process's CPU time (all its threads: the caller and, over TCP, the reader threads), which
a busy machine's scheduling noise disturbs far less than the wall clock.
"""
import statistics
import sys

import time

import numpy as np

import uniccl
from uniccl._telemetry import Telemetry

pairs = int(sys.argv[1]) if len(sys.argv) > 1 else 100
comm = uniccl.init()
mesh = getattr(comm._t, "mesh", None)
links = mesh.links if mesh is not None else None
telemetry = comm._telemetry or Telemetry(comm.size)


def switch(on: bool) -> None:
    comm._telemetry = telemetry if on else None
    if mesh is not None:
        mesh.links = links if on else None


def timed(x, inner: int, on: bool) -> tuple:
    comm.barrier()
    switch(on)
    t, c = time.perf_counter(), time.process_time()
    for _ in range(inner):
        comm.all_reduce(x)
    elapsed = (time.perf_counter() - t) / inner * 1e6
    cpu = (time.process_time() - c) / inner * 1e6
    switch(True)
    return elapsed, cpu


for nbytes, inner in ((8, 500), (1 << 20, 20)):
    x = np.ones(max(1, nbytes // 4), np.float32)
    for _ in range(20):
        comm.all_reduce(x)
    on, off = [], []
    for b in range(pairs):
        for flag in ((True, False) if b % 2 else (False, True)):
            (on if flag else off).append(timed(x, inner, flag))
    if comm.rank == 0:
        transport = "shm" if comm._engine is not None else comm._t.name
        line = f"{comm.size} ranks, {transport}, {nbytes} B all_reduce:"
        for i, what in ((0, "wall"), (1, "cpu")):
            a_, b_ = [v[i] for v in on], [v[i] for v in off]
            diff = statistics.median(a - b for a, b in zip(a_, b_))
            share = statistics.median((a - b) / b for a, b in zip(a_, b_))
            line += (f" {what}: {statistics.median(a_):.2f} us on, {statistics.median(b_):.2f} us off, telemetry = "
                     f"{diff:+.3f} us per call ({100 * share:+.2f}%);")
        print(line, flush=True)
comm.destroy()
