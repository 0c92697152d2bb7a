"""Verdicts: what is wrong with a job, one finding each, naming ranks, call numbers, source lines
and links (``uniccl doctor``).

Kinds, in the order they are looked for (a cause before its consequences):

- ``dead``: rank R died (its exit code or signal where the launcher recorded it), during call #S;
- ``mismatch``: ranks called different collectives, dtypes, counts or roots as call #S;
- ``p2p-deadlock``: a cycle of point-to-point waits that can never match (each rank waits to
  receive from the next, or sends to one that does not receive from it);
- ``stuck-outside``: rank R never made call #S that the others wait in: it computes, is blocked
  elsewhere, or is stopped (what /proc said of it, where the ranks that waited could tell);
- ``stuck-inside``: every rank is in call #S and they wait on one another (the link or the chunk
  each waited for);
- ``straggler``: rank R starts a significant share of the collectives last, by how much;
- ``slow-link``: link A -> B runs below ``SLOW_LINK`` of the job's median link bandwidth;
- ``integrity``: checksum failures or retransmissions on a link.

Sources: the flight-recorder dumps (``UNICCL_DUMP_DIR``), the traces and stats
(``UNICCL_TRACE``), the launcher's record of how ranks ended (``uniccl-exit-r<rank>.json``
beside the dumps), and for a running job its status files and /proc (:func:`live`).
"""

from __future__ import annotations

import glob
import json
import os
import statistics
import time
from dataclasses import asdict, dataclass, field

from ..reliability import procs

KINDS = (
    "dead",
    "mismatch",
    "p2p-deadlock",
    "stuck-outside",
    "stuck-inside",
    "straggler",
    "slow-link",
    "integrity",
)
SLOW_LINK = 0.5  # a link below this share of the job's median link bandwidth is slow
_SIGNATURE = ("op", "dtype", "count", "root")


@dataclass
class Verdict:
    kind: str  # one of KINDS
    text: str  # one line for people
    ranks: list  # the ranks it names (of its communicator)
    communicator: str | None = None
    seq: int | None = None  # the call number it is about
    detail: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        return asdict(self)


# ------------------------------------------------------------------ reading what a job left
def load_dumps(directory: str) -> dict:
    """{communicator: {rank: dump}} of the flight-recorder dumps in ``directory``."""
    groups: dict = {}
    for path in sorted(glob.glob(os.path.join(directory, "uniccl-flight-*.json"))):
        try:
            with open(path) as f:
                dump = json.load(f)
            groups.setdefault(dump["communicator"], {})[int(dump["rank"])] = dump
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return groups


def load_exits(directory: str) -> dict:
    """{rank: how it ended} (``code``: exit code, negative for a signal; ``why`` in words) from
    the launcher's ``uniccl-exit-r<rank>.json`` files in ``directory``."""
    out = {}
    for path in glob.glob(os.path.join(directory, "uniccl-exit-r*.json")):
        try:
            with open(path) as f:
                e = json.load(f)
            out[int(e["rank"])] = e
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return out


def describe(op: dict) -> str:
    """``all_reduce(float32, 1024)``, ``recv(peer=2)``: a recorded call in a few words."""
    args = [str(op[k]) for k in ("dtype", "count") if op.get(k) is not None]
    if op.get("root") is not None:
        args.append(f"root={op['root']}")
    if op.get("peer") is not None:
        args.append(f"peer={op['peer']}")
    return f"{op['op']}({', '.join(args)})"


def ranks_text(ranks) -> str:
    ranks = sorted(ranks)
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks))


def _state_words(p: dict | None) -> str:
    """What /proc said of a process ("stopped (a SIGSTOP, or a debugger)"), "" when unknown."""
    if not p or "state" not in p:
        return ""
    return procs.MEANING.get(p["state"], f"in state {p['state']}")


# ------------------------------------------------------------------ post mortem: the dumps
def from_dumps(name: str, dumps: dict, exits: dict | None = None) -> list[Verdict]:
    """The verdicts one communicator's dumps ({rank: dump}) support, causes first."""
    exits = exits or {}
    size = max(d["size"] for d in dumps.values())
    calls = {r: {op["seq"]: op for op in d["ops"] if op.get("seq") is not None} for r, d in dumps.items()}
    out: list[Verdict] = []
    out += _dead(name, dumps, calls, exits, size)
    p2p = _p2p_deadlock(name, dumps)
    out += p2p
    if not p2p:
        out += _divergence(name, dumps, calls, size, dead={r for v in out for r in v.ranks})
    return out


def from_exits(exits: dict) -> list[Verdict]:
    """``dead`` for each rank the launcher saw end badly, when no rank left a dump."""
    return [
        Verdict("dead", f"rank {r} {e.get('why') or 'died'}", [r], "world", None, {"exit": e})
        for r, e in sorted(exits.items())
        if e.get("code") not in (0, None)
    ]


def _errors(dumps: dict) -> dict:
    return {r: d["error"] for r, d in dumps.items() if d.get("error")}


def _failing_call(dump: dict) -> dict | None:
    """The rank's newest collective that failed (or never finished)."""
    for op in reversed(dump["ops"]):
        if op.get("seq") is not None and op["state"] in ("failed", "started"):
            return op
    return None


def _dead(name, dumps, calls, exits, size) -> list[Verdict]:
    """Ranks that died: named by the survivors' errors (RemoteError: died, or its connection
    lost) or by the launcher's record of their end; during the call the survivors were in."""
    seen: dict = {}  # rank -> the ranks whose error named its death
    for r, err in _errors(dumps).items():
        if err.get("remote_type") in ("died", "ConnectionError") and err.get("remote_rank") is not None:
            seen.setdefault(int(err["remote_rank"]), []).append(r)
    dead = set(seen) | {r for r, e in exits.items() if e.get("code") not in (0, None) and r < size}
    out = []
    for r in sorted(dead):
        # the call it died in: the oldest call a survivor had not finished (its error's, or the one
        # the launcher's stop found it in)
        unfinished = {q: op for q, d in dumps.items() if q != r and (op := _failing_call(d)) is not None}
        op = min(unfinished.values(), key=lambda o: o["seq"]) if unfinished else None
        in_call = sorted(q for q, o in unfinished.items() if op is not None and o["seq"] == op["seq"])
        how = exits.get(r, {}).get("why") or "died"
        where = f" during call #{op['seq']} {describe(op)} at {op.get('site')}" if op else ""
        if seen.get(r):
            also = f"; {ranks_text(seen[r])} saw it"
        elif in_call:
            also = f"; {ranks_text(in_call)} {'was' if len(in_call) == 1 else 'were'} in it"
        else:
            also = ""
        out.append(
            Verdict(
                "dead",
                f"rank {r} {how}{where}{also}",
                [r],
                name,
                op["seq"] if op else None,
                {"exit": exits.get(r), "seen_by": sorted(seen.get(r, [])), "in_call": in_call},
            )
        )
    return out


def _p2p_deadlock(name, dumps) -> list[Verdict]:
    """A cycle of ranks, each in a send or recv with the next that never completed."""
    waits = {}  # rank -> (peer, op)
    for r, d in dumps.items():
        for op in reversed(d["ops"]):
            if op["op"] in ("send", "recv") and op["state"] in ("started", "failed") and op.get("peer") is not None:
                if op["state"] == "failed" and not (op.get("error") or "").startswith("Timeout"):
                    break  # failed for another reason: no wait
                waits[r] = (int(op["peer"]), op)
                break
            if op["state"] == "completed":
                break  # its newest call finished: it waits on no one
    seen: set = set()
    for start in sorted(waits):
        path, r = [], start
        while r in waits and r not in path and r not in seen:
            path.append(r)
            r = waits[r][0]
        seen.update(path)
        if r not in path:
            continue
        cycle = path[path.index(r) :]
        if any(_matches(a, waits) for a in cycle):
            continue  # one pair of the cycle can meet: no deadlock
        hops = " -> ".join(
            f"rank {a} {'receives from' if waits[a][1]['op'] == 'recv' else 'sends to'} rank {waits[a][0]}"
            f" ({waits[a][1].get('site')})"
            for a in cycle
        )
        return [
            Verdict(
                "p2p-deadlock",
                f"point-to-point deadlock: {hops}: each waits on the next, and no one is there to match",
                sorted(cycle),
                name,
                None,
                {"cycle": [{"rank": a, "op": waits[a][1]["op"], "peer": waits[a][0]} for a in cycle]},
            )
        ]
    return []


def _matches(a: int, waits: dict) -> bool:
    """Rank ``a``'s wait can complete: its peer waits on it with the other half (a send, a recv)."""
    peer, op = waits[a]
    other = waits.get(peer)
    return other is not None and other[0] == a and {op["op"], other[1]["op"]} == {"send", "recv"}


def _divergence(name, dumps, calls, size, dead) -> list[Verdict]:
    """mismatch, stuck-outside or stuck-inside: at the first call the ranks did not all finish alike."""
    no_dump = sorted(set(range(size)) - set(dumps))
    errors = _errors(dumps)
    waited = sorted({m for e in errors.values() for m in e.get("missing_ranks") or ()})
    named = {int(k): v for d in dumps.values() for k, v in (d.get("processes") or {}).items()}
    lows = [min(c) for c in calls.values() if c]
    start = max(lows) if lows else 0  # earlier calls may have left a rank's ring
    for seq in sorted({s for c in calls.values() for s in c if s >= start}):
        have = {r: c[seq] for r, c in calls.items() if seq in c}
        kinds: dict = {}
        for r, op in have.items():
            kinds.setdefault(tuple(op.get(k) for k in _SIGNATURE), []).append(r)
        skipped = set(calls) - set(have)  # ranks with a dump that never started it
        if len(kinds) == 1 and not skipped and all(op["state"] == "completed" for op in have.values()):
            continue  # (a rank without a dump is judged at the first call the others did not finish)
        absent = sorted(skipped | set(no_dump))
        if len(kinds) > 1:
            sides = [
                {"ranks": sorted(rs), "call": describe(have[rs[0]]), "site": have[rs[0]].get("site")}
                for _sig, rs in sorted(kinds.items(), key=lambda kv: -len(kv[1]))
            ]
            text = "; ".join(f"{ranks_text(s['ranks'])} called {s['call']} at {s['site']}" for s in sides)
            return [
                Verdict(
                    "mismatch",
                    f"mismatched call #{seq}: {text}",
                    sorted(have),
                    name,
                    seq,
                    {"sides": sides},
                )
            ]
        # a rank with no dump of its own may be in the call too (stopped in it): the others' timeouts
        # say whether it never started the call ("to arrive", "has not made the call")
        timeouts = [e["message"] for e in errors.values() if e.get("type") == "Timeout"]
        never = any(w in m for m in timeouts for w in ("never started", "has not made the call", "to arrive"))
        inside = [r for r in absent if r in no_dump and timeouts and not never]
        absent = [r for r in absent if r not in inside]
        out = []
        for r in absent:
            if r in dead:
                continue
            what = _state_words(named.get(r))
            mine = calls.get(r)
            last = mine[max(mine)] if mine else None
            if last is not None:
                after = f"; its last call was #{last['seq']} {describe(last)} at {last.get('site')}"
            elif seq > start:  # no dump of its own: the others finished the call before with it
                after = f"; its last call was #{seq - 1} (the others finished it with it)"
            else:
                after = ""
            doing = f"it is {what}" if what else "it computes or is blocked outside uniccl"
            call = next(iter(have.values()))
            out.append(
                Verdict(
                    "stuck-outside",
                    f"rank {r} never made call #{seq} {describe(call)} that {ranks_text(have)} wait in: {doing}{after}",
                    [r],
                    name,
                    seq,
                    {"process": named.get(r), "waited_on_by": sorted(have), "state": (named.get(r) or {}).get("state")},
                )
            )
        if out or absent:
            return out
        # every rank is in the call and none finished: they wait on one another
        call = next(iter(have.values()))
        waits = {r: e["message"] for r, e in errors.items() if e.get("type") == "Timeout"}
        if waits:
            said = "; ".join(f"rank {r}: {_waited_for(m)}" for r, m in sorted(waits.items()))
            states = {r: _state_words(named.get(r)) for r in waited if _state_words(named.get(r))}
            also = "".join(f"; rank {r} is {w}" for r, w in sorted(states.items()))
            return [
                Verdict(
                    "stuck-inside",
                    f"every rank is in call #{seq} {describe(call)} at {call.get('site')} and they wait on one "
                    f"another: {said}{also}",
                    sorted(set(have) | set(inside)),
                    name,
                    seq,
                    {
                        "waits": {str(r): m for r, m in waits.items()},
                        "waited_for": waited,
                        "states": {str(r): (named.get(r) or {}).get("state") for r in states},
                    },
                )
            ]
        return []
    return []


def _waited_for(message: str) -> str:
    """The part of a Timeout's message that says what was awaited ("waiting for rank 2 ...")."""
    i = message.find("waiting for")
    return message[i:] if i >= 0 else message


# ------------------------------------------------------------- post mortem: traces and stats
def from_traces(traces: dict, stats: dict) -> list[Verdict]:
    """straggler, slow-link and integrity from the traces and stats ``uniccl report`` reads."""
    from . import report as _report

    out = []
    late = _report.rank_lateness(traces) if traces else None
    if late is not None and late["stands_out"]:
        r = late["rank"]
        out.append(
            Verdict(
                "straggler",
                f"rank {r} ({late['host']}, pid {late['pid']}) starts {late['last']} of {late['calls']} collectives "
                f"last ({late['last_share']:.0%}; {late['chance_share']:.0%} by chance, p = {late['p_value']:.1e}), "
                f"a median {late['median_late_ms']:.3f} ms and a p99 {late['p99_late_ms']:.3f} ms after the first "
                f"rank (the others: {late['others_median_late_ms']:.3f} ms): the others wait for it",
                [r],
                "world",
                None,
                late,
            )
        )
    n, m, what = _report.link_matrix(stats, traces)
    cells = [(m[s][d], s, d) for s in range(n) for d in range(n) if m and m[s][d] is not None]
    if len(cells) >= 3:
        median = statistics.median(c[0] for c in cells)
        for bw, s, d in sorted(cells):
            if bw >= SLOW_LINK * median:
                break
            out.append(
                Verdict(
                    "slow-link",
                    f"link rank {s} -> rank {d} runs at {bw:.3f} GB/s, {bw / median:.0%} of the job's median "
                    f"link ({median:.3f} GB/s; {what})",
                    [s, d],
                    "world",
                    None,
                    {"src": s, "dst": d, "GBps": bw, "median_GBps": median, "what": what},
                )
            )
    for r, s in sorted(_report.world_stats(stats).items()):
        for peer, link in sorted((s.get("links") or {}).items(), key=lambda kv: int(kv[0])):
            bad, resent = link.get("checksum_failures", 0), link.get("retransmits", 0)
            if bad or resent:
                out.append(
                    Verdict(
                        "integrity",
                        f"link rank {peer} -> rank {r}: {bad} message(s) failed their checksum here"
                        + (f"; rank {r} sent {resent} again to rank {peer}" if resent else ""),
                        [int(peer), r],
                        s.get("communicator", "world"),
                        None,
                        {"checksum_failures": bad, "retransmits": resent},
                    )
                )
    return out


# ------------------------------------------------------------------------ a running job
def live(jobdir: str, now: float | None = None, stale_s: float = 5.0) -> list[Verdict]:
    """The verdicts a running job's status files (``uniccl top``'s) and /proc support: a rank
    whose process is gone (``dead``), ranks that never made the call the others are in
    (``stuck-outside``, with what /proc says of them), every rank in one call for long
    (``stuck-inside``, with the rank each waits on)."""
    from . import top as _top

    now = time.time() if now is None else now
    rows = [r for r in _top.read(jobdir) if r.get("comms")]
    out: list[Verdict] = []
    gone = []
    for r in rows:
        if r.get("state") in ("finished", "exited"):
            continue
        s = procs.state(r["pid"]) if r.get("host") == _here() else None
        if s is not None and procs.gone(s):
            gone.append(r["rank"])
            w = r["comms"][0]
            where = f" in call #{w['seq']} {w.get('op')}" if w.get("op") and w.get("state") == "started" else ""
            out.append(Verdict("dead", f"rank {r['rank']} (pid {r['pid']}) is gone{where}", [r["rank"]], w["name"]))
    live_rows = [r for r in rows if r["rank"] not in gone and r.get("state") not in ("finished", "exited")]
    if not live_rows:
        return out
    world = {r["rank"]: r["comms"][0] for r in live_rows}
    size = max(w.get("size", 0) for w in world.values())
    # arrival counts (shared memory): a rank last in most calls is the one the others wait for
    late = [(w.get("last_share") or 0.0, k) for k, w in world.items() if (w.get("calls") or 0) >= 20]
    if late and size > 1:
        share, k = max(late)
        if share >= max(0.5, 2.0 / size):
            out.append(
                Verdict(
                    "straggler",
                    f"rank {k} arrives last in {share:.0%} of its calls ({1 / size:.0%} by chance): the others "
                    "wait for it",
                    [k],
                    world[k]["name"],
                    None,
                    {"last_share": share},
                )
            )
    silent = sorted(set(range(size)) - {r["rank"] for r in rows})  # no status file: never got that far
    inside = {k: w for k, w in world.items() if w.get("state") == "started" and w.get("seq") is not None}
    if not inside:
        return out
    seq = max(w["seq"] for w in inside.values())
    waiting = {k: w for k, w in inside.items() if w["seq"] == seq}
    behind = sorted(k for k, w in world.items() if k not in waiting and (w.get("seq") or -1) < seq)
    name = next(iter(waiting.values()))["name"]
    op = next(iter(waiting.values())).get("op")
    for k in behind:
        row = next(r for r in live_rows if r["rank"] == k)
        s = procs.state(row["pid"]) if row.get("host") == _here() else None
        what = procs.MEANING.get(s, "") if s is not None else ""
        w = world[k]
        last = f"; its last call was #{w['seq']} {w.get('op')}" if w.get("seq") is not None else ""
        out.append(
            Verdict(
                "stuck-outside",
                f"rank {k} never made call #{seq} {op} that {ranks_text(waiting)} wait in"
                + (f": it is {what}" if what else "")
                + last,
                [k],
                name,
                seq,
                {"pid": row["pid"], "state": s},
            )
        )
    for k in silent:
        out.append(
            Verdict(
                "stuck-outside",
                f"rank {k} never made call #{seq} {op} that {ranks_text(waiting)} wait in: it has written no "
                "status (it has not made its communicator, or its process never started)",
                [k],
                name,
                seq,
                {"state": None},
            )
        )
    if not behind and not silent and len(waiting) == len(world):
        long = min(w.get("for_s") or 0.0 for w in waiting.values())
        if long >= stale_s:
            on = {k: w.get("waiting_on") for k, w in waiting.items() if w.get("waiting_on") is not None}
            said = "; ".join(f"rank {k} waits on rank {v}" for k, v in sorted(on.items()))
            out.append(
                Verdict(
                    "stuck-inside",
                    f"every rank has been in call #{seq} {op} for {long:.1f} s or more" + (f": {said}" if said else ""),
                    sorted(waiting),
                    name,
                    seq,
                    {"waiting_on": on},
                )
            )
    return out


def _here() -> str:
    import socket

    return socket.gethostname()
