"""How long each step of a rank's life cycle takes, at 4 ranks under ``uniccl run
--enable-recovery --max-restarts 1``: *revoke* (rank 0 revokes while the others are in an
all_reduce: from its call to the last rank's Revoked), *shrink* of the revoked communicator,
*detect* (a rank is SIGKILLed in a loop of all_reduce calls: from the kill to each survivor's
RemoteError naming it), *shrink* over the survivors, and *grow* back to 4 with the launcher's
restart of the dead rank (from the survivors' grow() call, the joiner already waiting, to the
last one's return; and from the kill to the 4-rank communicator's first all_reduce, the restart
of the process included).  Each new communicator's all_reduce is checked.

    .venv/bin/python benchmarks/lifecycle.py [--ranks 4] [--trials 20] [--transport shm,tcp]

One job per trial; one host, so one clock (time.time()) for every rank.  Prints, per transport,
the median and worst over the trials.  ``--transport`` sets ``UNICCL_TRANSPORT`` for the job.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

STEPS_BEFORE_KILL = 200
REVOKE_AT = 50


def say(**row) -> None:
    print(json.dumps(row), flush=True)


def wait_for(path: Path, limit: float = 60.0) -> None:
    deadline = time.monotonic() + limit
    while not path.exists():
        if time.monotonic() > deadline:
            raise SystemExit(f"no {path}")
        time.sleep(0.001)


def checked(comm, size: int) -> bool:
    import numpy as np

    y = np.ones(4, np.float64)
    comm.all_reduce(y)
    return bool(np.all(y == size))


def worker(folder: Path) -> int:
    import numpy as np

    import uniccl

    if os.environ.get("UNICCL_RESTART_COUNT"):  # the dead rank, started again: join by grow's unique id
        (folder / "waiting").touch()
        wait_for(folder / "uid")
        t = json.loads((folder / "uid").read_text())
        comm = uniccl.Communicator(bytes.fromhex(t["uid"]), t["rank"], t["size"])
        ok = checked(comm, t["size"])
        say(joined=time.time(), ok=ok)
        comm.destroy()
        return 0 if ok else 1
    comm = uniccl.init()
    me, full = comm.rank, comm.size
    x = np.ones(2048, np.float32)
    for i in range(REVOKE_AT + 1):  # revoke
        if me == 0 and i == REVOKE_AT:
            time.sleep(0.05)  # the others are inside the call
            say(revoke=time.time())
            comm.revoke("lifecycle benchmark")
        try:
            comm.all_reduce(x)
        except uniccl.Revoked:
            revoked = time.time()
            break
    new = comm.shrink()
    say(rank=me, revoked=revoked, revoke_shrunk=time.time(), ok=checked(new, full))
    comm.destroy()
    comm = new
    victim = min(2, full - 1)
    for i in range(100000):  # detect and shrink
        if me == victim and i == STEPS_BEFORE_KILL:
            say(kill=time.time())
            os.kill(os.getpid(), signal.SIGKILL)
        try:
            comm.all_reduce(x)
        except uniccl.RemoteError as exc:
            detected = time.time()
            if exc.remote_rank != victim:
                say(rank=me, wrong=str(exc))
                return 1
            new = comm.shrink()
            shrunk = time.time()
            ok = checked(new, full - 1)
            comm.abort("shrunk")
            comm = new
            break
    wait_for(folder / "waiting")  # grow: the restarted rank is there
    uid = comm.broadcast_object(uniccl.get_unique_id() if comm.rank == 0 else None)
    if comm.rank == 0:
        (folder / "uid.tmp").write_text(json.dumps({"uid": bytes(uid).hex(), "rank": comm.size, "size": full}))
        os.replace(folder / "uid.tmp", folder / "uid")
    t0 = time.time()
    grown = comm.grow(full, uid)
    t1 = time.time()
    ok = ok and checked(grown, full)
    say(rank=me, detect=detected, shrunk=shrunk, grow0=t0, grow1=t1, back=time.time(), ok=ok)
    grown.destroy()
    comm.destroy()
    return 0 if ok else 1


def trial(ranks: int, transport: str) -> dict | None:
    with tempfile.TemporaryDirectory() as folder:
        cmd = [sys.executable, "-m", "uniccl", "run", "--no-prefix", "--enable-recovery", "--max-restarts", "1",
               "-n", str(ranks), __file__, "--worker", folder]  # fmt: skip
        env = dict(os.environ, UNICCL_TRANSPORT=transport)
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)
    rows = [json.loads(x) for x in res.stdout.splitlines() if x.startswith("{")]
    one = {k: r[k] for r in rows for k in ("revoke", "kill", "joined") if k in r}
    revoked = [r for r in rows if "revoked" in r]
    survivors = [r for r in rows if "detect" in r]
    good = all(r.get("ok", True) for r in rows) and len(revoked) == ranks and len(survivors) == ranks - 1
    if res.returncode != 0 or len(one) != 3 or not good:
        sys.stderr.write(f"trial failed (exit {res.returncode}):\n{res.stdout[-1500:]}{res.stderr[-1500:]}\n")
        return None
    t, detect = one["kill"], sorted(r["detect"] - one["kill"] for r in survivors)
    return {
        "revoke (last rank's Revoked)": max(r["revoked"] for r in revoked) - one["revoke"],
        "shrink after revoke": max(r["revoke_shrunk"] - r["revoked"] for r in revoked),
        "first detect": detect[0],
        "last detect": detect[-1],
        "shrink after the death": max(r["shrunk"] - r["detect"] for r in survivors),
        "grow (the joiner waiting)": max(r["grow1"] for r in survivors) - min(r["grow0"] for r in survivors),
        "kill to 4 ranks again (restart included)": max(r["back"] for r in survivors) - t,
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--trials", type=int, default=20)
    p.add_argument("--transport", default="shm,tcp", help="comma list of UNICCL_TRANSPORT values")
    p.add_argument("--worker", type=Path, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        return worker(args.worker)
    status = 0
    for transport in args.transport.split(","):
        results = [r for r in (trial(args.ranks, transport) for _ in range(args.trials)) if r is not None]
        if len(results) < args.trials:
            status = 1
        print(f"{args.ranks} ranks, transport {transport}: {len(results)} of {args.trials} trials (ms)")
        print("| step | median | worst |\n|---|---:|---:|")
        for key in results[0] if results else ():
            vals = [r[key] * 1e3 for r in results]
            if vals:
                print(f"| {key} | {statistics.median(vals):.1f} | {max(vals):.1f} |")
    return status


if __name__ == "__main__":
    sys.exit(main())
