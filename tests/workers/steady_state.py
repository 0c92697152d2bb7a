"""10^4 collectives in a loop: resident memory must stay flat (no allocation per call).
Prints one line per rank: RSS growth in KiB over the loop, measured once the flight recorder
(a bounded ring of the last calls, UNICCL_FLIGHT_RECORDER: 2048 by default) is full."""

import sys

import numpy as np

import uniccl


def rss_kib() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 // 1024


def main() -> int:
    calls = int(sys.argv[1]) if len(sys.argv) > 1 else 10_000
    with uniccl.init() as comm:
        n = comm.size
        x = np.ones(1024, np.float32)
        g = np.empty(1024 * n, np.float32)
        a = np.ones(1024 * n, np.float32)
        fl = comm._flight

        def step(i):
            comm.all_reduce(x, op="max")
            if i % 10 == 0:  # a mix of collectives, including ones that use scratch space
                comm.all_gather(x, g)
                comm.all_to_all(a, a)
                comm.reduce_scatter(a, x, op="avg")

        i = 0
        while i < calls // 10 or (fl.enabled and len(fl.entries) < fl.entries.maxlen and i < 100 * calls):
            step(i)  # until the recorder holds as many entries as it keeps
            i += 1
        before = rss_kib()
        for j in range(calls):
            step(i + j)
        growth = rss_kib() - before
        print(f"rank {comm.rank} transport {comm._tuner.transport} rss_growth_kib {growth}", flush=True)
        assert np.all(x == 1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
