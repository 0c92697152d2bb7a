"""How long a reset TCP connection keeps a collective waiting (transport/tcp/heal.py): ranks
of a ``uniccl run`` job over TCP loop 8 KiB all_reduce calls, each timed; the driver resets
every connection of rank 0 with ``ss -K`` (both ends, as a NAT or firewall that dropped them
would) once a second.  Per trial: the longest call of any rank that ended in the half second after
the reset (the one the break hit: the heal and the resent messages included) and, as the
control, in the half second after that; the redials counted.  Needs root (ss -K) and iproute2.

    .venv/bin/python benchmarks/link_heal.py [--ranks 2] [--trials 20]

Prints one JSON line per trial, then the median and worst over the trials (milliseconds).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def worker(folder: Path) -> int:
    import numpy as np

    import uniccl

    comm = uniccl.init()
    x = np.ones(1024, np.float64)
    ends, stop = [], np.zeros(1, np.int64)
    (folder / f"{comm.rank}.pid").write_text(str(os.getpid()))
    while not stop[0]:
        for _ in range(20):
            t0 = time.time()
            comm.all_reduce(x)
            ends.append((t0, time.time()))
        stop[0] = (folder / "stop").exists()
        comm.broadcast(stop, root=0)  # every rank stops after the same call
    redials = sum(comm.reconnects().values())
    (folder / f"{comm.rank}.json").write_text(json.dumps({"ends": ends, "redials": redials}))
    comm.destroy()
    return 0


def listen_port(pid: int) -> int:
    out = subprocess.run(["ss", "-Htlnp"], capture_output=True, text=True, check=True).stdout
    return next(int(line.split()[3].rsplit(":", 1)[1]) for line in out.splitlines() if f"pid={pid}," in line)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--trials", type=int, default=20)
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return worker(Path(args.worker))
    if not shutil.which("ss") or os.geteuid() != 0:
        raise SystemExit("needs ss (iproute2) and root")
    folder = Path(tempfile.mkdtemp(prefix="uniccl-heal-"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("UNICCL_")}
    env["UNICCL_TRANSPORT"] = "tcp"
    cmd = [sys.executable, "-m", "uniccl", "run", "--no-prefix", "-n", str(args.ranks)]
    job = subprocess.Popen([*cmd, sys.executable, __file__, "--worker", str(folder)], env=env)
    while not all((folder / f"{r}.pid").exists() for r in range(args.ranks)):
        time.sleep(0.01)
    port = listen_port(int((folder / "0.pid").read_text()))
    resets = []
    for _ in range(args.trials):
        time.sleep(1.0)
        resets.append(time.time())
        subprocess.run(["ss", "-HtK", "state", "established", f"( sport = :{port} or dport = :{port} )"], check=True)
    time.sleep(0.5)
    (folder / "stop").touch()
    if job.wait(timeout=120):
        raise SystemExit(f"the job failed ({job.returncode})")
    ranks = [json.loads((folder / f"{r}.json").read_text()) for r in range(args.ranks)]
    shutil.rmtree(folder, ignore_errors=True)
    calls = sorted(e - s for r in ranks for s, e in r["ends"])
    typical = statistics.median(calls) * 1e3
    longest, control = [], []

    def worst(t0, t1):  # the longest call of any rank that ended in [t0, t1)
        return max((e - s) * 1e3 for r in ranks for s, e in r["ends"] if t0 <= e < t1)

    for t in resets:  # the half second after each reset, and the next (no reset) as the control
        longest.append(worst(t, t + 0.5))
        control.append(worst(t + 0.5, t + 1.0))
        print(json.dumps({"after_reset_ms": round(longest[-1], 2), "control_ms": round(control[-1], 2)}))
    redials = sum(r["redials"] for r in ranks)
    print(
        f"{args.ranks} ranks, {args.trials} resets, {redials} redials counted (each link's two ends), "
        f"{len(calls) // args.ranks} calls of {typical:.2f} ms (median).  Longest call in the 0.5 s after "
        f"a reset: median {statistics.median(longest):.1f} ms, worst {max(longest):.1f} ms; in the 0.5 s "
        f"after that (no reset): median {statistics.median(control):.1f} ms, worst {max(control):.1f} ms"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
