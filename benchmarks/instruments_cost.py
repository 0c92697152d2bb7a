"""What the always-on instruments of a call cost together on the compiled shared-memory path:
telemetry, the cross-rank record that catches mismatched calls, the flight recorder's entry and
the engine's arrival counts (who arrived last, how long the others waited).  The same 8-byte all_reduce is timed with all three on and all three off, switched
call by call in a random order every rank draws alike (benchmarks/_arms.py).

usage: uniccl run -n 2 python benchmarks/instruments_cost.py [CALLS [telemetry|check|flight|arrivals]]
       (a third argument: switch only that one)
       UNICCL_PLACEBO=1: both arms keep everything on -- what the method reads when there is
       nothing to find (its noise floor)
Rank 0 prints the median per-call time of each arm, their difference, and the difference of
the arms' means over their middle 80 % of calls.  (Off is for this measurement only: without
the record a mismatched call would go unseen.)
"""

import os
import statistics
import sys

import numpy as np
from _arms import timed_arms, trimmed_mean  # benchmarks/_arms.py (the script's own folder)

import uniccl

calls = int(sys.argv[1]) if len(sys.argv) > 1 else 40000
only = sys.argv[2] if len(sys.argv) > 2 else None
placebo = os.environ.get("UNICCL_PLACEBO") == "1"
comm = uniccl.init()
fast = comm._fast
if fast is None:
    sys.exit("no compiled path here (it needs the shared-memory engine: one host, 2+ ranks)")


def switch(on: bool) -> None:
    on = on or placebo
    kinds = {k: on or (only is not None and k != only) for k in ("telemetry", "flight", "check", "arrivals")}
    fast._instruments(**kinds)


x = np.ones(2, np.float32)
for _ in range(3000):
    comm.all_reduce(x)
comm.barrier()
on, off = timed_arms(comm, x, calls, 8, switch)
if comm.rank == 0:
    med_on, med_off = statistics.median(on), statistics.median(off)
    tm = trimmed_mean(on) - trimmed_mean(off)
    print(
        f"{comm.size} ranks, 8 B all_reduce{' (placebo)' if placebo else ''}, {len(on)}/{len(off)} calls: "
        f"median {med_on:.3f} us on, {med_off:.3f} us off, {only or 'telemetry + record + flight recorder + arrivals'} = "
        f"{med_on - med_off:+.3f} us per call; trimmed means: {tm:+.3f} us",
        flush=True,
    )
comm.destroy()
