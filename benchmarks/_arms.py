"""Two arms of one measurement in one run: each call goes to arm "on" or "off" by a random
draw that every rank makes alike (seeded the same), so the machine's drift and load fall on
both arms alike.  A strict on/off alternation would tie each arm to the parity of the call,
and calls of even and odd number differ by a few microseconds over TCP."""

import random
import statistics
import time


def timed_arms(comm, x, calls: int, seed: int, switch, before=None) -> tuple:
    """(on, off): microseconds of each ``comm.all_reduce(x)``, ``switch(arm)`` made before it
    (and ``before()`` inside the timing, on arm "on" only, when given)."""
    on, off = [], []
    draw = random.Random(seed)
    clock = time.perf_counter_ns
    for _ in range(calls):
        arm = draw.random() < 0.5
        switch(arm)
        t0 = clock()
        if arm and before is not None:
            before()
        comm.all_reduce(x)
        (on if arm else off).append((clock() - t0) / 1e3)
    switch(True)
    return on, off


def trimmed_mean(v: list) -> float:
    """The mean of the middle 80 %."""
    v = sorted(v)
    cut = len(v) // 10
    return statistics.fmean(v[cut : len(v) - cut])
