"""Chaos statistics: kill -9 one rank of four mid-collective, many times; print the worst
detection and abort() times per transport (the numbers in docs/reliability.md).

usage: python benchmarks/chaos.py [RUNS_PER_COLLECTIVE]   (default 3: 9 x 2 x 3 = 54 runs)
"""

import os
import statistics
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
import _chaos


def main() -> int:
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    failures = 0
    print(
        "| transport | runs | survivors | RemoteError naming the victim | detection median / worst (s) | "
        "abort() median / worst (s) | hung | left in /dev/shm |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for transport in ("shm", "tcp"):
        results = [
            _chaos.run(transport, c, 1000 * k + i) for k in range(runs) for i, c in enumerate(_chaos.COLLECTIVES)
        ]
        rows = [row for r in results for row in r["rows"]]
        named = sum(
            row.get("error") == "RemoteError" and row.get("remote_rank") == r["victim"]
            for r in results
            for row in r["rows"]
        )
        detect = [row["detect_s"] for row in rows if row.get("detect_s") is not None]
        abort = [row["abort_s"] for row in rows]
        bad = [(r["collective"], r["seed"], _chaos.problems(r)) for r in results if _chaos.problems(r)]
        failures += len(bad)
        print(
            f"| {transport} | {len(results)} | {len(rows)} | {named} | {statistics.median(detect):.3f} / "
            f"{max(detect):.3f} | {statistics.median(abort):.3f} / {max(abort):.3f} | "
            f"{sum(len(r['hung']) for r in results)} | {sum(len(r['leftover']) for r in results)} |"
        )
        for item in bad:
            print("  problem:", item, file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
