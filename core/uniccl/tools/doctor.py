"""``uniccl doctor``: what is wrong with a job, as verdicts (:mod:`.verdicts`).

- ``uniccl doctor DIR``, post mortem: the flight-recorder dumps in DIR (``UNICCL_DUMP_DIR``,
  written on timeouts and failures, or by ``Communicator.dump_flight_recorder``), the launcher's
  record of how ranks ended there, and the traces and stats of ``UNICCL_TRACE`` if DIR has them;
  after the verdicts, each rank's last completed call and error, with source lines.
- ``uniccl doctor --live [JOBDIR]``: a running job, from the status files ``uniccl run`` has its
  ranks write (default: the newest job) and /proc, without stopping it.

``--json`` for scripts; ``--torch-fr OUT`` also writes the dumps in torch's flight-recorder format
(:mod:`.torch_fr`) for torch's ``torchfrtrace``.  Exit status: 0 nothing found, 1 verdicts found,
2 nothing to read.
"""

from __future__ import annotations

import json
import os
import sys

from . import verdicts as _v


def add_arguments(p) -> None:
    p.add_argument("directory", nargs="?", help="the dumps' folder (UNICCL_DUMP_DIR); with --live, the job's")
    p.add_argument("--live", action="store_true", help="a running job, from its status files and /proc")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument(
        "--torch-fr",
        metavar="OUT",
        help="also write the dumps as torch flight-recorder traces into OUT, for torch's `torchfrtrace OUT`",
    )


def context(name: str, dumps: dict) -> list[str]:
    """Lines that say where each rank of one communicator stood: its last completed call and its error."""
    size = max(d["size"] for d in dumps.values())
    missing = sorted(set(range(size)) - set(dumps))
    lines = [
        f"communicator {name!r}: {size} ranks, dumps from {_v.ranks_text(dumps)}"
        + (f"; no dump from {_v.ranks_text(missing)}" if missing else "")
    ]
    for r, d in sorted(dumps.items()):
        done = [op for op in d["ops"] if op.get("seq") is not None and op["state"] == "completed"]
        if done:
            op = max(done, key=lambda o: o["seq"])
            lines.append(f"  rank {r}: last completed call #{op['seq']} {_v.describe(op)} at {op.get('site')}")
        else:
            lines.append(f"  rank {r}: no completed call recorded")
        if d.get("error"):
            lines.append(f"          {d['error']['type']}: {d['error']['message']}")
    return lines


def post_mortem(directory: str) -> tuple[list, list] | None:
    """(verdicts, context lines) of what a job left in ``directory``; None when it left nothing."""
    from . import report as _report

    groups = _v.load_dumps(directory)
    exits = _v.load_exits(directory)
    try:
        traced = _report.load(directory)
    except (OSError, ValueError):
        traced = {"traces": {}, "stats": {}}
    if not groups and not exits and not traced["traces"] and not traced["stats"]:
        return None
    found, lines = [], []
    for name, dumps in sorted(groups.items(), key=lambda kv: (kv[0] != "world", kv[0])):
        found += _v.from_dumps(name, dumps, exits if name == "world" else None)
        lines += context(name, dumps)
    if not groups:
        found += _v.from_exits(exits)
    found += _v.from_traces(traced["traces"], traced["stats"])
    return found, lines


def main(args) -> int:
    if args.live:
        from . import top as _top

        jobdir = args.directory or _top.newest_job()
        if not jobdir or not os.path.isdir(jobdir):
            print(f"uniccl doctor: no job status directory ({jobdir or 'no job found'})", file=sys.stderr)
            return 2
        found, lines = _v.live(jobdir), []
    else:
        if not args.directory:
            print("uniccl doctor: give the dumps' folder (UNICCL_DUMP_DIR), or --live", file=sys.stderr)
            return 2
        got = post_mortem(args.directory)
        if got is None:
            print(
                f"uniccl doctor: nothing to read in {args.directory} (no uniccl-flight-*.json, uniccl-exit-*.json, "
                "uniccl-trace-*.json or uniccl-stats-*.json)"
            )
            return 2
        found, lines = got
        if args.torch_fr:
            from . import torch_fr

            written = torch_fr.write(_v.load_dumps(args.directory), args.torch_fr)
            print(f"uniccl doctor: wrote {len(written)} torch flight-recorder traces to {args.torch_fr} "
                  f"(read them with: torchfrtrace {args.torch_fr})", file=sys.stderr)  # fmt: skip
    if args.json:
        print(json.dumps({"verdicts": [v.to_json() for v in found], "context": lines}, indent=2, default=str))
    else:
        for v in found:
            where = f" [{v.communicator}]" if v.communicator not in (None, "world") else ""
            print(f"{v.kind}{where}: {v.text}")
        if not found:
            print("no verdict: nothing found wrong")
        if lines:
            print()
            print("\n".join(lines))
    return 1 if found else 0
