"""What the always-on mismatch check costs: the same all_reduce timed with the check and with
it switched off (for this measurement only, by replacing it with nothing), in alternating
blocks of the same run, so both see the same machine.

Over the shared-memory engine the records ride on the data's first rendezvous (see
Communicator._run_fused); over TCP on the data messages (uniccl._tcp.TCPTransport.announce).

usage: uniccl run -n 4 python benchmarks/check_cost.py [BYTES] [PAIRS]
       (default 1 MiB, 100 pairs of blocks of 20 calls; UNICCL_TRANSPORT=tcp for TCP)
Rank 0 prints one line: median microseconds per call with and without the check, and the cost:
the median over pairs of adjacent blocks of (with - without) / without, so that the machine's
drifts, which move both blocks of a pair alike, cancel.
"""
import statistics
import sys
import time

import numpy as np

import uniccl

nbytes = int(sys.argv[1]) if len(sys.argv) > 1 else 1 << 20
pairs = int(sys.argv[2]) if len(sys.argv) > 2 else 100
inner = 20
comm = uniccl.init()
x = np.ones(nbytes // 4, np.float32)
checked = comm._agree, comm._run_announced, comm._run_fused


def _no_agreement(plan, seq):
    return None


def _run_unannounced(plan, seq):
    comm._in_data = True
    return None if plan.run is None else comm._run_host(plan, seq)


def _run_unfused(plan, seq, choice):
    comm._in_data = True
    return plan.shm(comm._engine)


def timed(check: bool) -> float:
    comm.barrier()  # with the check on: a barrier without it would not wait for anyone
    comm._agree, comm._run_announced, comm._run_fused = checked if check else (
        _no_agreement, _run_unannounced, _run_unfused)
    t = time.perf_counter()
    for _ in range(inner):
        comm.all_reduce(x)
    elapsed = (time.perf_counter() - t) / inner * 1e6
    comm._agree, comm._run_announced, comm._run_fused = checked
    return elapsed


for _ in range(20):
    comm.all_reduce(x)
on, off = [], []
for b in range(pairs):  # alternate which goes first
    for check in ((True, False) if b % 2 else (False, True)):
        (on if check else off).append(timed(check))
if comm.rank == 0:
    transport = "shm" if comm._engine is not None else comm._t.name
    cost = statistics.median((a - b) / b for a, b in zip(on, off))
    print(f"{comm.size} ranks, {transport}, {nbytes} B all_reduce: {statistics.median(on):.1f} us with the "
          f"check, {statistics.median(off):.1f} us without, check = {100 * cost:+.2f}% of the call", flush=True)
comm.destroy()
