"""How long each step of losing a rank takes, at 4 ranks under ``uniccl run --enable-recovery``:
a rank is SIGKILLed in the middle of a loop of all_reduce calls; the survivors' calls fail with
RemoteError naming it (*detect*: from the kill to each survivor's error), they ``shrink()``
(*shrink*: from the error to the new communicator) and check an all_reduce on it.

    python3 benchmarks/lifecycle.py [--ranks 4] [--trials 20] [--transport shm,tcp]

One job per trial; the victim (rank 2, or the last rank) prints the wall-clock time just
before it kills itself, every survivor the times of its error and of its shrink's end (one
host: one clock).  Prints, per transport, the median and worst over the trials of: the first
and the last survivor's detection, the slowest survivor's shrink, and kill to the last
survivor's working communicator.  ``--transport`` sets ``UNICCL_TRANSPORT`` for the job.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time

STEPS_BEFORE_KILL = 200


def worker() -> int:
    import numpy as np

    import uniccl

    comm = uniccl.init()
    victim = min(2, comm.size - 1)
    x = np.ones(2048, np.float32)
    for i in range(100000):
        if comm.rank == victim and i == STEPS_BEFORE_KILL:
            print(json.dumps({"kill": time.time()}), flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        try:
            comm.all_reduce(x)
        except uniccl.RemoteError as exc:
            detected = time.time()
            if exc.remote_rank != victim:
                print(json.dumps({"rank": comm.rank, "wrong": str(exc)}), flush=True)
                return 1
            new = comm.shrink()
            shrunk = time.time()
            y = np.ones(4, np.float64)
            new.all_reduce(y)
            ok = bool(np.all(y == comm.size - 1))
            comm.abort("shrunk")
            print(json.dumps({"rank": comm.rank, "detect": detected, "shrunk": shrunk, "ok": ok}), flush=True)
            new.destroy()
            return 0 if ok else 1
    return 1


def trial(ranks: int, transport: str) -> dict | None:
    cmd = [sys.executable, "-m", "uniccl", "run", "--no-prefix", "--enable-recovery", "-n", str(ranks), __file__,
           "--worker"]  # fmt: skip
    env = dict(os.environ, UNICCL_TRANSPORT=transport)
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)
    rows = [json.loads(x) for x in res.stdout.splitlines() if x.startswith("{")]
    kill = [r["kill"] for r in rows if "kill" in r]
    survivors = [r for r in rows if "detect" in r]
    if res.returncode != 0 or not kill or len(survivors) != ranks - 1 or not all(r["ok"] for r in survivors):
        sys.stderr.write(f"trial failed (exit {res.returncode}):\n{res.stdout[-1500:]}{res.stderr[-1500:]}\n")
        return None
    t = kill[0]
    detect = sorted(r["detect"] - t for r in survivors)
    return {
        "first detect": detect[0],
        "last detect": detect[-1],
        "shrink": max(r["shrunk"] - r["detect"] for r in survivors),
        "kill to working": max(r["shrunk"] for r in survivors) - t,
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--trials", type=int, default=20)
    p.add_argument("--transport", default="shm,tcp", help="comma list of UNICCL_TRANSPORT values")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        return worker()
    status = 0
    for transport in args.transport.split(","):
        results = [r for r in (trial(args.ranks, transport) for _ in range(args.trials)) if r is not None]
        if len(results) < args.trials:
            status = 1
        print(f"{args.ranks} ranks, transport {transport}: {len(results)} of {args.trials} trials (ms)")
        print("| step | median | worst |\n|---|---:|---:|")
        for key in ("first detect", "last detect", "shrink", "kill to working"):
            vals = [r[key] * 1e3 for r in results]
            if vals:
                print(f"| {key} | {statistics.median(vals):.1f} | {max(vals):.1f} |")
    return status


if __name__ == "__main__":
    sys.exit(main())
