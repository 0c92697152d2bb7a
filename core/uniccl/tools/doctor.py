"""``uniccl doctor DIR``: line up the ranks' flight-recorder dumps and say where they diverged.

Reads every ``uniccl-flight-*.json`` in DIR (written on timeouts and failures when
UNICCL_DUMP_DIR is set, or by ``Communicator.dump_flight_recorder``), groups them
by communicator, and for each one prints the first call number at which the ranks
differ: ranks that called another operation (or the same one with another dtype,
count or root), ranks that never reached the call, ranks that left no dump, and the
last call each rank completed, with the source lines.
"""

from __future__ import annotations

import glob
import json
import os

_SIGNATURE = ("op", "dtype", "count", "root")


def load(directory: str) -> dict:
    """{communicator: {rank: dump}} of the dumps in ``directory``."""
    groups: dict = {}
    for path in sorted(glob.glob(os.path.join(directory, "uniccl-flight-*.json"))):
        try:
            with open(path) as f:
                dump = json.load(f)
            groups.setdefault(dump["communicator"], {})[int(dump["rank"])] = dump
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return groups


def _describe(op: dict) -> str:
    args = [str(op[k]) for k in ("dtype", "count") if op.get(k) is not None]
    if op.get("root") is not None:
        args.append(f"root={op['root']}")
    return f"{op['op']}({', '.join(args)})"


def _ranks(ranks) -> str:
    ranks = sorted(ranks)
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks))


def diagnose(name: str, dumps: dict) -> dict:
    """The first divergence of one communicator's dumps (a dict; ``lines`` for people)."""
    size = max(d["size"] for d in dumps.values())
    calls = {r: {op["seq"]: op for op in d["ops"] if op.get("seq") is not None} for r, d in dumps.items()}
    no_dump = sorted(set(range(size)) - set(dumps))
    waited_for = sorted({m for d in dumps.values() if d.get("error") for m in d["error"].get("missing_ranks") or ()})
    last_done = {
        r: max((s for s, op in c.items() if op["state"] == "completed"), default=None) for r, c in calls.items()
    }
    out = {
        "communicator": name,
        "size": size,
        "ranks_with_dumps": sorted(dumps),
        "ranks_without_dumps": no_dump,
        "waited_for": waited_for,
        "last_completed": last_done,
        "divergence": None,
        "lines": [],
    }
    lines = out["lines"]
    lines.append(
        f"communicator {name!r}: {size} ranks, dumps from {_ranks(dumps)}"
        + (f"; no dump from {_ranks(no_dump)}" if no_dump else "")
    )
    # the first call some rank recorded that not every rank with a dump recorded alike
    lows = [min(c) for c in calls.values() if c]
    start = max(lows) if lows else 0  # earlier calls may have left a rank's ring
    seqs = sorted({s for c in calls.values() for s in c if s >= start})
    for seq in seqs:
        have = {r: c[seq] for r, c in calls.items() if seq in c}
        kinds: dict = {}
        for r, op in have.items():
            kinds.setdefault(tuple(op.get(k) for k in _SIGNATURE), []).append(r)
        absent = sorted(set(calls) - set(have))
        if len(kinds) == 1 and not absent and all(op["state"] == "completed" for op in have.values()):
            continue  # (a rank without a dump is judged at the first call the others did not finish)
        absent = sorted(absent + no_dump)
        div = {"seq": seq, "calls": [], "absent": absent}
        lines.append(f"first divergence at call #{seq}:")
        for _sig, ranks in sorted(kinds.items(), key=lambda kv: -len(kv[1])):
            op = have[ranks[0]]
            states = sorted({have[r]["state"] for r in ranks})
            div["calls"].append(
                {"ranks": sorted(ranks), "call": _describe(op), "site": op.get("site"), "states": states}
            )
            lines.append(f"  {_ranks(ranks)} called {_describe(op)} at {op.get('site')} ({', '.join(states)})")
        if len(kinds) > 1:
            lines.append("  mismatch: the ranks called different operations (or arguments) as the same call")
        if absent:
            why = " (the others waited for them)" if set(absent) & set(waited_for) else ""
            lines.append(f"  {_ranks(absent)} never started call #{seq}{why}")
        out["divergence"] = div
        break
    else:
        if waited_for:
            lines.append(f"no divergence in the records; the failing ranks waited for {_ranks(waited_for)}")
        else:
            lines.append("no divergence: every rank recorded the same calls")
    for r in sorted(calls):
        done = last_done[r]
        if done is not None:
            op = calls[r][done]
            lines.append(f"  rank {r}: last completed call #{done} {_describe(op)} at {op.get('site')}")
        else:
            lines.append(f"  rank {r}: no completed call recorded")
        err = dumps[r].get("error")
        if err:
            lines.append(f"          {err['type']}: {err['message']}")
    return out


def add_arguments(p) -> None:
    p.add_argument("directory", help="folder of the ranks' flight-recorder dumps (UNICCL_DUMP_DIR)")
    p.add_argument("--json", action="store_true", help="machine-readable output")


def main(args) -> int:
    groups = load(args.directory)
    if not groups:
        print(f"uniccl doctor: no flight-recorder dumps (uniccl-flight-*.json) in {args.directory}")
        return 1
    reports = [diagnose(name, dumps) for name, dumps in sorted(groups.items())]
    if args.json:
        print(json.dumps(reports, indent=2, default=str))
    else:
        print("\n\n".join("\n".join(r["lines"]) for r in reports))
    return 0
