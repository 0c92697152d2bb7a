"""What the always-on mismatch check costs: the same all_reduce timed with the check and with
it switched off (for this measurement only, by replacing it with nothing), switched call by
call (benchmarks/_arms.py), so both see the same machine.

Over the shared-memory engine the records ride on the data's first rendezvous (see
Communicator._run_fused); over TCP on the data messages (uniccl.transport.tcp.TCPTransport.announce);
over MPI they are sent beside the data (uniccl.transport.mpi.MPITransport.announce).

usage: uniccl run -n 4 python benchmarks/check_cost.py [BYTES] [CALLS]
       (default 1 MiB, 4000 calls; UNICCL_TRANSPORT=tcp for TCP;
       MPI: UNICCL_TRANSPORT=mpi mpiexec -n 4 python benchmarks/check_cost.py)
       UNICCL_PLACEBO=1: both arms keep the check -- the method's noise floor
Rank 0 prints one line: median microseconds per call with and without the check, and the cost:
the difference of the medians, and of the means over each arm's middle 80 % of calls, as a
share of the call without the check.
"""

import os
import statistics
import sys

import numpy as np
from _arms import timed_arms, trimmed_mean  # benchmarks/_arms.py (the script's own folder)

import uniccl

nbytes = int(sys.argv[1]) if len(sys.argv) > 1 else 1 << 20
calls = int(sys.argv[2]) if len(sys.argv) > 2 else 4000
placebo = os.environ.get("UNICCL_PLACEBO") == "1"
comm = uniccl.init()
# the general path, where the check can be switched off: the compiled path (comm._fast) runs the
# same fused record-on-the-data rendezvous of the engine, without the switch
comm._fast = None
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


def switch(check: bool) -> None:
    comm._agree, comm._run_announced, comm._run_fused = (
        checked if check or placebo else (_no_agreement, _run_unannounced, _run_unfused)
    )


for _ in range(20):
    comm.all_reduce(x)
comm.barrier()
on, off = timed_arms(comm, x, calls, 1, switch)
if comm.rank == 0:
    transport = "shm" if comm._engine is not None else comm._t.name
    med_on, med_off = statistics.median(on), statistics.median(off)
    tm = (trimmed_mean(on) - trimmed_mean(off)) / trimmed_mean(off)
    print(
        f"{comm.size} ranks, {transport}, {nbytes} B all_reduce{' (placebo)' if placebo else ''}: "
        f"{med_on:.1f} us with the check, {med_off:.1f} us without, check = "
        f"{100 * (med_on - med_off) / med_off:+.2f}% of the call (trimmed means: {100 * tm:+.2f}%)",
        flush=True,
    )
comm.destroy()
