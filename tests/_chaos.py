"""kill -9 of one rank in the middle of a collective: the driver behind tests/test_chaos.py
and benchmarks/chaos.py.

Four ranks (plain processes joined by a unique id, so that no launcher kills the
survivors for us) loop one collective on 4 MiB per rank; a seeded choice of victim
and delay decides who dies and when (SIGKILL from a thread while its main thread is
inside the collective).  Each survivor reports what it raised, how long after the kill
(the victim stamps the time just before dying), and how long ``abort()`` took.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

WORKER = Path(__file__).resolve().parent / "workers" / "chaos.py"
COLLECTIVES = (
    "all_reduce",
    "broadcast",
    "reduce",
    "all_gather",
    "reduce_scatter",
    "all_to_all",
    "gather",
    "scatter",
    "barrier",
)
RANKS = 4


def segments() -> set:
    return {f for f in os.listdir("/dev/shm") if f.startswith("uniccl-")}


def run(transport: str, collective: str, seed: int, timeout: float = 60) -> dict:
    """One chaos run; returns {"victim", "rows" (one per survivor), "leftover" (shm), "hung"}."""
    import uniccl

    rng = random.Random(seed)
    victim, after = rng.randrange(RANKS), rng.uniform(0.05, 0.4)
    uid = uniccl.get_unique_id()
    before = segments()
    with tempfile.TemporaryDirectory(prefix="uniccl-chaos-") as tmp:
        stamp = os.path.join(tmp, "killed-at")
        procs = []
        for r in range(RANKS):
            env = dict(
                os.environ,
                UNICCL_TEST_UID=bytes(uid).hex(),
                UNICCL_TEST_RANK=str(r),
                UNICCL_TEST_SIZE=str(RANKS),
                UNICCL_BOOTSTRAP="tcp",
                UNICCL_TRANSPORT=transport,
            )
            procs.append(
                subprocess.Popen(
                    [sys.executable, str(WORKER), collective, str(victim), f"{after:.3f}", stamp],
                    env=env,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                )
            )
        deadline, rows, hung, errors = time.monotonic() + timeout, [], [], []
        for r, p in enumerate(procs):
            try:
                out, err = p.communicate(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                out, err = p.communicate()
                hung.append(r)
            rows += [json.loads(line) for line in out.splitlines() if line.startswith("{")]
            if r != victim and p.returncode != 0 and r not in hung:
                errors.append(f"rank {r} exited {p.returncode}: {err[-800:]}")
    ours = {str(p.pid) for p in procs}  # segments are named uniccl-<creator pid>-<random>: only ours count
    return {
        "transport": transport,
        "collective": collective,
        "seed": seed,
        "victim": victim,
        "kill_after": after,
        "rows": sorted(rows, key=lambda x: x["rank"]),
        "hung": hung,
        "errors": errors,
        "leftover": sorted(f for f in segments() - before if f.split("-")[1] in ours),
    }


def problems(result: dict) -> list:
    """What the run did wrong (empty: every survivor raised RemoteError naming the victim within
    10 s, abort() returned within 5 s, nothing hung, nothing left in /dev/shm)."""
    out = [f"hung: ranks {result['hung']}"] if result["hung"] else []
    out += result["errors"]
    if result["leftover"]:
        out.append(f"left in /dev/shm: {result['leftover']}")
    survivors = [r for r in range(RANKS) if r != result["victim"]]
    if sorted(row["rank"] for row in result["rows"]) != survivors:
        out.append(f"survivor reports: {[row['rank'] for row in result['rows']]}, expected {survivors}")
    for row in result["rows"]:
        if row.get("error") != "RemoteError" or row.get("remote_rank") != result["victim"]:
            out.append(f"rank {row['rank']}: {row.get('error')} naming {row.get('remote_rank')}: {row.get('message')}")
        if row.get("detect_s") is None or row["detect_s"] > 10:
            out.append(f"rank {row['rank']}: detected after {row.get('detect_s')} s")
        if row["abort_s"] > 5:
            out.append(f"rank {row['rank']}: abort() took {row['abort_s']} s")
    return out
