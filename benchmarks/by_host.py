"""Collectives by host against the flat algorithms, on a real multi-host job: three network
namespaces joined by veth pairs (tests/_netns.py; root needed), each running sshd, and one
``uniccl run --hosts h1:2,h2:2,h3:2`` job per way of running the calls:

- ``ring``: the flat ring over all 6 ranks (``UNICCL_ALGO=all_reduce:ring;...``),
- ``rd``: all_reduce by recursive doubling over all 6 ranks,
- ``by host``: shared memory inside each host, the 3 leaders over TCP (``...:hierarchical``),
- ``tuned``: no UNICCL_ALGO, the tuner's choice per size (which it names).

Each job times float32 all_reduce, all_gather (the size is the whole result) and
reduce_scatter (the size is each rank's input) at each size: ``--reps`` calls after 3 warm-up
ones, the median per call of rank 0 (every rank's time is alike: the calls synchronise), and
checks each result against numpy once.  The table gives microseconds and the ratio flat/by-host.
The namespaces share this machine's cores and its memory: the "network" is veth, which is
fast, so this measures the algorithms' step counts and copies, not a cluster's network.

    .venv/bin/python benchmarks/by_host.py [--sizes 8,1K,64K,1M,8M] [--reps 30]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ALGOS = {
    "ring": "all_reduce:ring;all_gather:ring;reduce_scatter:ring",
    "rd": "all_reduce:recursive_doubling;all_gather:ring;reduce_scatter:ring",
    "by host": "all_reduce:hierarchical;all_gather:hierarchical;reduce_scatter:hierarchical",
    "tuned": None,
}
COLLS = ("all_reduce", "all_gather", "reduce_scatter")


def parse_size(text: str) -> int:
    text = text.strip().upper().removesuffix("B")
    scale = {"K": 1 << 10, "M": 1 << 20}.get(text[-1:], 1)
    return int(text[:-1] if scale > 1 else text) * scale


def worker(sizes: list[int], reps: int) -> None:
    import numpy as np

    import uniccl
    from uniccl.observability import flight

    comm = uniccl.init()
    r, n = comm.rank, comm.size
    out = {}
    for nbytes in sizes:
        count = max(n, nbytes // 4 // n * n)  # a multiple of n elements
        x = ((31 * r + np.arange(count)) % 97 / 8 - 6).astype(np.float32)
        ranks = np.arange(n)[:, None]
        total = ((31 * ranks + np.arange(count)) % 97 / 8 - 6).sum(0)  # float64
        y = np.empty_like(x)
        block = np.full(count // n, r, np.float32)
        gathered = np.empty(count, np.float32)
        part = np.empty(count // n, np.float32)
        calls = {
            "all_reduce": lambda: comm.all_reduce(x, y),
            "all_gather": lambda: comm.all_gather(block, gathered),
            "reduce_scatter": lambda: comm.reduce_scatter(x, part),
        }
        for name, call in calls.items():
            times = []
            for i in range(reps + 3):
                comm.barrier()
                t = time.perf_counter()
                call()
                if i >= 3:
                    times.append(time.perf_counter() - t)
            ok = {
                "all_reduce": np.allclose(y, total, atol=1e-3 * n),
                "all_gather": np.array_equal(gathered, np.repeat(np.arange(n, dtype=np.float32), count // n)),
                "reduce_scatter": np.allclose(part, total[r * (count // n) : (r + 1) * (count // n)], atol=1e-3 * n),
            }[name]
            choice = comm.last_operation()[flight.PATH]
            out[f"{name} {nbytes}"] = {
                "us": statistics.median(times) * 1e6,
                "ok": bool(ok),
                "path": getattr(choice, "algorithm", str(choice)),
            }
    if r == 0:
        print("RESULT " + json.dumps(out), flush=True)
    comm.destroy()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="8,1K,64K,1M,8M")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    sizes = [parse_size(s) for s in args.sizes.split(",")]
    if args.worker:
        worker(sizes, args.reps)
        return 0
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    import _netns

    try:
        cluster = _netns.start()
    except BaseException as exc:  # (pytest.skip outside pytest: the reason it cannot run here)
        print(f"cannot set up the namespaces: {exc}")
        return 1
    try:
        hosts = ",".join(f"{h}:2" for h in cluster.hosts)
        results = {}
        for label, algo in ALGOS.items():
            extra = ["-x", f"UNICCL_ALGO={algo}"] if algo else []
            res = cluster.run(
                hosts, *extra, __file__, "--worker", "--sizes", args.sizes, "--reps", str(args.reps), timeout=900
            )
            line = next((x for x in res.stdout.splitlines() if "RESULT " in x), None)
            if res.returncode or line is None:
                print(f"{label}: the job failed ({res.returncode})\n{res.stdout[-2000:]}{res.stderr[-2000:]}")
                return 1
            results[label] = json.loads(line.partition("RESULT ")[2])
    finally:
        _netns.stop(cluster)
    print(f"uniccl run --hosts (3 netns hosts x 2 ranks), float32, median of {args.reps} calls, rank 0, us")
    print(
        f"{'call':15} {'bytes':>9} {'ring':>9} {'rd':>9} {'by host':>9} {'tuned':>9} {'tuned took':>13} {'best flat / by host':>20}"
    )
    bad = []
    for coll in COLLS:
        for nbytes in sizes:
            key = f"{coll} {nbytes}"
            row = {label: results[label][key] for label in ALGOS}
            bad += [f"{label} {key}" for label, v in row.items() if not v["ok"]]
            flat = min(row["ring"]["us"], row["rd"]["us"]) if coll == "all_reduce" else row["ring"]["us"]
            rd = f"{row['rd']['us']:9.1f}" if coll == "all_reduce" else f"{'-':>9}"
            print(
                f"{coll:15} {nbytes:9d} {row['ring']['us']:9.1f} {rd} {row['by host']['us']:9.1f} "
                f"{row['tuned']['us']:9.1f} {row['tuned']['path']:>13} {flat / row['by host']['us']:20.2f}"
            )
    print("values: all match numpy" if not bad else f"WRONG VALUES: {bad}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
