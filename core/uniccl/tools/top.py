"""``uniccl top``: a live view of a running job, one row per rank, from the status files
the ranks write (:mod:`uniccl.observability.status`): the call each rank is in and for how long, calls
done, bus bandwidth, the peer it waits on, the share of calls it arrived last in (LAST: the others
waited for it), retransmissions, redialled links — and, below, the rank that holds
the others up, in words."""

from __future__ import annotations

import glob
import json
import os
import sys
import time

from ..observability import status as _status

STALE_S = 3.0  # a status file older than this: the rank is stuck outside Python, or gone


def add_arguments(p) -> None:
    p.add_argument(
        "dir", nargs="?", help=f"the job's status directory (default: the newest job under {_status.jobs_root()})"
    )
    p.add_argument("--interval", type=float, default=1.0, help="seconds between screens (default 1)")
    p.add_argument("--once", action="store_true", help="print one screen and exit")
    p.add_argument("--count", type=int, default=0, help="stop after this many screens (0: until Ctrl-C)")


def newest_job() -> str | None:
    jobs = [d for d in glob.glob(os.path.join(_status.jobs_root(), "*")) if os.path.isdir(d)]
    return max(jobs, key=os.path.getmtime) if jobs else None


def read(path: str) -> list[dict]:
    rows = []
    for f in glob.glob(os.path.join(path, "rank-*.json")):
        for _ in range(3):  # (a rank rewrites its file in place: a read may meet it half written)
            try:
                with open(f) as fh:
                    text = fh.read()
                if text.strip():  # (empty: made by the launcher, its rank has not written yet)
                    rows.append(json.loads(text))
                break
            except ValueError:
                time.sleep(0.001)
            except OSError:
                break
    return sorted(rows, key=lambda r: r.get("rank", 0))


def _world(row: dict) -> dict:
    comms = row.get("comms") or [{}]
    return comms[0]


def verdict(rows: list[dict], now: float) -> list[str]:
    """The rank(s) that hold the job up, in words."""
    out = []
    ended = [r for r in rows if r.get("state") in ("finished", "exited")]
    if rows and len(ended) == len(rows):
        calls = sorted({_world(r).get("calls", 0) for r in rows})
        made = f"{calls[0]} calls each" if len(calls) == 1 else f"{calls[0]}-{calls[-1]} calls"
        failed = [r["rank"] for r in rows if _world(r).get("state") == "failed"]
        tail = (
            f"; the last call of rank{'s' * (len(failed) > 1)} {', '.join(map(str, failed))} failed" if failed else ""
        )
        return [
            f"job finished: every rank {'exited' if all(r['state'] == 'exited' for r in rows) else 'finished'}"
            f" ({made}){tail}"
        ]
    # a rank that has finished (destroyed its communicators, or exited) is neither stale nor behind
    ended_ranks = {r["rank"] for r in ended}
    rows = [r for r in rows if r["rank"] not in ended_ranks]
    for r in sorted(ended_ranks):
        out.append(f"rank {r} has finished")
    stale = [r["rank"] for r in rows if now - r.get("time", 0) > STALE_S]
    for r in rows:
        if r["rank"] in stale:
            out.append(
                f"rank {r['rank']} ({r.get('host')}, pid {r.get('pid')}) has not reported for "
                f"{now - r.get('time', 0):.1f} s: stuck outside uniccl, or gone"
            )
    live = [r for r in rows if r["rank"] not in stale]
    seqs = {r["rank"]: _world(r).get("calls", 0) for r in live}
    if len(set(seqs.values())) > 1:
        low = min(seqs.values())
        behind = sorted(k for k, v in seqs.items() if v == low)
        if len(behind) < len(seqs):
            out.append(
                f"rank{'s' if len(behind) > 1 else ''} {', '.join(map(str, behind))} behind: "
                f"{low} calls made while others made up to {max(seqs.values())}"
            )
    waited = {}
    for r in live:
        w = _world(r).get("waiting_on")
        if w is not None and _world(r).get("waiting_s", 0) > 0.05:
            waited.setdefault(w, []).append(r["rank"])
    if waited:
        culprit, by = max(waited.items(), key=lambda kv: len(kv[1]))
        out.append(f"rank {culprit} is waited on by rank{'s' if len(by) > 1 else ''} {', '.join(map(str, by))}")
    late = [(_world(r).get("last_share") or 0.0, r["rank"]) for r in live if (_world(r).get("calls") or 0) >= 20]
    if late and len(live) > 1:
        share, rank = max(late)
        if share >= max(0.5, 2.0 / len(live)):  # beyond the 1/n of a job where no rank lags
            out.append(f"rank {rank} arrives last in {share:.0%} of its calls: the others wait for it")
    return out or ["all ranks keep pace"]


def _share(share) -> str:
    """'87%': the share of calls a rank arrived last in (the others waited for it); '-' unknown."""
    return "-" if share is None else f"{share:.0%}"


def _reconnects(by_peer) -> str:
    """'r3 x2, r5 x1': the peers whose connection was redialled, and how often."""
    return ", ".join(f"r{p} x{n}" for p, n in sorted((by_peer or {}).items(), key=lambda kv: int(kv[0]))) or "-"


def render(path: str, rows: list[dict], now: float | None = None) -> str:
    now = time.time() if now is None else now
    head = f"uniccl top  {path}  {len(rows)} rank{'s' * (len(rows) != 1)}  {time.strftime('%H:%M:%S')}"
    cols = (
        f"{'RANK':>4} {'HOST':<12} {'PID':>7} {'CALL':<22} {'FOR':>7} {'CALLS':>8} {'BUSBW GB/s':>10} "
        f"{'WAITING ON':<16} {'LAST':>5} {'RETX':>5} RECONNECTED"
    )
    lines = [head, cols]
    for r in rows:
        w = _world(r)
        call = f"{w.get('op', '-')} #{w.get('seq')}" if w.get("op") else "-"
        if w.get("state") == "completed":
            call = f"done {call}"
        elif w.get("state") == "failed":
            call = f"FAILED {call}"
        age = now - r.get("time", 0)
        waiting = f"rank {w['waiting_on']} {w.get('waiting_s', 0):.1f}s" if w.get("waiting_on") is not None else ""
        line = (
            f"{r['rank']:>4} {str(r.get('host', '?'))[:12]:<12} {r.get('pid', 0):>7} {call[:22]:<22} "
            f"{(w.get('for_s') or 0):>6.2f}s {w.get('calls', 0):>8} {w.get('busbw_GBps', 0):>10.3f} "
            f"{waiting:<16} {_share(w.get('last_share')):>5} {w.get('retransmits', 0):>5} "
            f"{_reconnects(w.get('reconnects')):<11}"
        )
        if r.get("state") in ("finished", "exited"):
            line += f"  {r['state'].upper()}"
        elif age > STALE_S:
            line += f"  STALE {age:.0f}s"
        lines.append(line)
    lines.append("")
    lines += [f"=> {v}" for v in verdict(rows, now)]
    return "\n".join(lines)


def main(args) -> int:
    path = args.dir or newest_job()
    if path is None or not os.path.isdir(path):
        print(
            f"uniccl top: no job status directory ({path or 'none under ' + _status.jobs_root()}); "
            "jobs started by `uniccl run` write one (or set UNICCL_STATUS_DIR)",
            file=sys.stderr,
        )
        return 2
    shown = 0
    try:
        while True:
            text = render(path, read(path))
            if args.once:
                print(text, flush=True)
                return 0
            sys.stdout.write("\x1b[H\x1b[2J" + text + "\n")  # home, clear: redraw in place
            sys.stdout.flush()
            shown += 1
            if args.count and shown >= args.count:
                return 0
            time.sleep(args.interval)
    except KeyboardInterrupt:
        return 0
