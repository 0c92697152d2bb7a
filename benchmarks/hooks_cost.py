"""What hooks cost per call (comm.add_hook, uniccl.hooks): an all_reduce of SIZE bytes with no
hook (the compiled path over shared memory), with a hook that does nothing (the general path
plus one Python call), and with uniccl.hooks.nan_check (plus one pass over the input).

    uniccl run -n 2 python benchmarks/hooks_cost.py [SIZES...]    (default 8 4096 1048576)

7 blocks of CALLS calls of each, alternating; rank 0 prints the median block's microseconds
per call and each variant's added cost over no hook."""

import statistics
import sys
import time

import numpy as np

import uniccl
import uniccl.hooks

sizes = [int(s) for s in sys.argv[1:]] or [8, 4096, 1 << 20]
with uniccl.init() as comm:
    for nbytes in sizes:
        x = np.ones(nbytes // 4, np.float32)
        calls = 3000 if nbytes <= 4096 else 300

        def block():
            comm.barrier()
            t0 = time.perf_counter()
            for _ in range(calls):
                comm.all_reduce(x, op=uniccl.MAX)  # (MAX: the values stay finite and equal)
            return (time.perf_counter() - t0) / calls * 1e6

        times = {"none": [], "no-op hook": [], "nan_check": []}
        for _ in range(300):
            comm.all_reduce(x, op=uniccl.MAX)
        for _ in range(7):
            for name in times:
                hook = None
                if name == "no-op hook":
                    hook = comm.add_hook(pre=lambda call: None)
                elif name == "nan_check":
                    hook = comm.add_hook(pre=uniccl.hooks.nan_check)
                times[name].append(block())
                if hook is not None:
                    hook.remove()
        if comm.rank == 0:
            med = {k: statistics.median(v) for k, v in times.items()}
            print(
                f"{nbytes:>8} B: no hook {med['none']:.2f} us; no-op pre hook {med['no-op hook']:.2f} us "
                f"(+{med['no-op hook'] - med['none']:.2f}); nan_check {med['nan_check']:.2f} us "
                f"(+{med['nan_check'] - med['none']:.2f})",
                flush=True,
            )
