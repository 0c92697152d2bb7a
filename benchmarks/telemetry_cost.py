"""What telemetry costs: the same all_reduce timed with telemetry on and off, switched inside
one run call by call (benchmarks/_arms.py), at 8 B (microseconds per call) and 1 MiB (share
of the call).

usage: uniccl run -n 2 python benchmarks/telemetry_cost.py [CALLS]   (UNICCL_TRANSPORT=tcp for TCP)
       UNICCL_PLACEBO=1: both arms keep telemetry on -- what the method reads when there is
       nothing to find (its noise floor)
       UNICCL_CONTROL_SPIN=N: both arms have telemetry off and the first does N iterations of a
       Python loop before each call instead (N=4: ~0.15 us) -- what the method reads for a
       known small cost (on a busy machine the ranks' timing can amplify it many times)
Rank 0 prints one line per size: the median per-call time of each arm, their difference, and
the difference of the arms' means over their middle 80 % of calls.
"""

import os
import statistics
import sys

import numpy as np
from _arms import timed_arms, trimmed_mean  # benchmarks/_arms.py (the script's own folder)

import uniccl
from uniccl.observability.telemetry import Telemetry

calls = int(sys.argv[1]) if len(sys.argv) > 1 else 20000
placebo = os.environ.get("UNICCL_PLACEBO") == "1"
spin = int(os.environ.get("UNICCL_CONTROL_SPIN", "0"))
comm = uniccl.init()
mesh = getattr(comm._t, "mesh", None)
links = mesh.links if mesh is not None else None
telemetry = comm._telemetry or Telemetry(comm.size)


def switch(on: bool) -> None:
    on = (on or placebo) and not spin
    comm._telemetry = telemetry if on else None
    if comm._fast is not None:  # the compiled path keeps its own switch
        comm._fast._instruments(telemetry=on)
    if mesh is not None:
        mesh.links = links if on else None


def control() -> None:
    work = 0.0
    for _ in range(spin):
        work += 1.0


for nbytes, n in ((8, calls), (1 << 20, max(200, calls // 10))):
    x = np.ones(max(1, nbytes // 4), np.float32)
    for _ in range(50):
        comm.all_reduce(x)
    comm.barrier()
    on, off = timed_arms(comm, x, n, nbytes, switch, control if spin else None)
    if comm.rank == 0:
        transport = "shm" if comm._engine is not None else comm._t.name
        med_on, med_off = statistics.median(on), statistics.median(off)
        tm = trimmed_mean(on) - trimmed_mean(off)
        what = " (placebo)" if placebo else f" (control: {spin} loop iterations)" if spin else ""
        print(
            f"{comm.size} ranks, {transport}, {nbytes} B all_reduce{what}, "
            f"{len(on)}/{len(off)} calls: median {med_on:.2f} us on, {med_off:.2f} us off, telemetry = "
            f"{med_on - med_off:+.3f} us per call ({100 * (med_on - med_off) / med_off:+.2f}%); "
            f"trimmed means: {tm:+.3f} us ({100 * tm / trimmed_mean(off):+.2f}%)",
            flush=True,
        )
comm.destroy()
