"""``uniccl report DIR -o report.html``: one self-contained HTML page (plots embedded as PNG,
no network needed) from what a job left in DIR — traces and stats (``UNICCL_TRACE=DIR``) and
any ``uniccl bench --json`` files there or given with ``--bench``:

- findings in words: the slowest rank (the one the others wait for at the start of their
  collectives), named only when it stands out beyond chance (:func:`rank_lateness`), and
  the slowest link;
- a per-rank timeline of the calls, on rank 0's clock;
- a rank x rank bandwidth heatmap of the TCP links (receiver's view), or of the shared-memory
  engine's traced transfers;
- bus bandwidth against message size per collective (telemetry, and bench rows), log-log;
- the topology: hosts, ranks, platform, transport, the algorithms the calls took.

``--png DIR`` also writes each plot as a PNG file.  Needs matplotlib (``uniccl[report]``).
"""

from __future__ import annotations

import base64
import glob
import html
import io
import json
import math
import os
import statistics
import sys

from ..observability import trace as _trace

_COLORS = {
    "all_reduce": "#3366cc",
    "broadcast": "#dc3912",
    "reduce": "#ff9900",
    "all_gather": "#109618",
    "reduce_scatter": "#990099",
    "all_to_all": "#0099c6",
    "gather": "#dd4477",
    "scatter": "#66aa00",
    "barrier": "#888888",
    "send": "#b82e2e",
    "recv": "#316395",
}


def add_arguments(p) -> None:
    p.add_argument("dir", help="the job's UNICCL_TRACE directory")
    p.add_argument("-o", "--output", default="report.html", help="the HTML file (default report.html)")
    p.add_argument("--png", metavar="DIR", help="also write the plots as PNG files there")
    p.add_argument(
        "--bench",
        action="append",
        default=[],
        metavar="FILE",
        help="uniccl bench --json output to plot too (repeatable; *.bench.json in DIR are read)",
    )


# ------------------------------------------------------------------ loading
def load(path: str, bench_files=()) -> dict:
    traces = {
        rank: {"meta": meta, "spans": [e for e in events if e.get("ph") == "X"]}
        for rank, (meta, events) in _trace.load(path).items()
    }
    stats = {}
    for f in glob.glob(os.path.join(path, "uniccl-stats-r*.json")):
        with open(f) as fh:
            doc = json.load(fh)
        stats[int(doc["rank"])] = doc["comms"]
    bench = []
    for f in list(bench_files) + sorted(glob.glob(os.path.join(path, "*.bench.json"))):
        with open(f) as fh:
            bench += json.load(fh)
    if not traces and not stats and not bench:
        raise FileNotFoundError(
            f"nothing to report in {path}: no uniccl-trace-r*.json, uniccl-stats-r*.json "
            f"or *.bench.json (run the job with UNICCL_TRACE={path})"
        )
    return {"traces": traces, "stats": stats, "bench": bench}


def world_stats(stats: dict) -> dict:
    """rank -> the stats of its first communicator (the world)."""
    return {r: comms[0] for r, comms in stats.items() if comms}


# ------------------------------------------------------------------ findings
# A rank is named the slowest only when it stands out beyond chance: it starts last in more
# of the calls than 1/size would give (one-sided binomial test, Bonferroni over the ranks,
# p < ALPHA) and its median lateness exceeds the others' by MARGIN_FACTOR x the timing noise
# (the clocks' alignment uncertainty, half the worst round trip, and at least TIMER_NOISE_US).
ALPHA = 0.01
MARGIN_FACTOR = 3.0
TIMER_NOISE_US = 10.0


def binomial_tail(m: int, k: int, p: float) -> float:
    """P(X >= m) for X ~ Binomial(k, p) (in log space: k may be large)."""
    if m <= 0:
        return 1.0
    if m > k:
        return 0.0
    if p >= 1.0:
        return 1.0
    if p <= 0.0:
        return 0.0
    lp, lq = math.log(p), math.log1p(-p)
    logs = [
        math.lgamma(k + 1) - math.lgamma(j + 1) - math.lgamma(k - j + 1) + j * lp + (k - j) * lq
        for j in range(m, k + 1)
    ]
    top = max(logs)
    return min(1.0, math.exp(top) * sum(math.exp(v - top) for v in logs))


def _quantile(values: list, q: float) -> float:
    """The ``q`` quantile of ``values`` (nearest rank)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def rank_lateness(traces: dict) -> dict | None:
    """How late each rank starts the collectives every rank traced (on rank 0's clock), and
    whether one stands out: the rank last most often (``rank``: ``last`` of ``calls``), the
    binomial p-value of that count against 1/size (``p_value``, Bonferroni-corrected over the
    ranks), its median lateness behind the first rank against the others' (``median_late_ms``,
    ``others_median_late_ms``) and the timing noise (``noise_ms``).  ``stands_out``: p < ALPHA
    and the median margin above MARGIN_FACTOR x noise.  None: fewer than 2 ranks or no call
    traced by all."""
    starts: dict = {}
    for rank, t in traces.items():
        for e in t["spans"]:
            a = e.get("args", {})
            if (
                e["name"] not in ("send", "recv", "message", "transfer")
                and a.get("seq") is not None
                and a.get("communicator") == "world"
            ):
                starts.setdefault(a["seq"], {})[rank] = e["ts"]
    full = [s for s in starts.values() if len(s) == len(traces)]
    if len(traces) < 2 or not full:
        return None
    size, k = len(traces), len(full)
    late = {r: [] for r in traces}
    last = {r: 0 for r in traces}
    for s in full:
        first = min(s.values())
        for r, ts in s.items():
            late[r].append(ts - first)
        last[max(s, key=s.get)] += 1
    rank = max(sorted(last), key=lambda r: (last[r], statistics.median(late[r])))
    p_value = min(1.0, size * binomial_tail(last[rank], k, 1.0 / size))
    others = [v for r, vs in late.items() if r != rank for v in vs]
    median_us = statistics.median(late[rank])
    others_us = statistics.median(others) if others else 0.0
    rtt = max((float(t["meta"].get("clock_rtt_us") or 0.0) for t in traces.values()), default=0.0)
    noise_us = max(TIMER_NOISE_US, rtt / 2)
    meta = traces[rank]["meta"]
    return {
        "rank": rank,
        "calls": k,
        "last": last[rank],
        "last_share": last[rank] / k,
        "chance_share": 1.0 / size,
        "p_value": p_value,
        "median_late_ms": median_us / 1e3,
        "p99_late_ms": _quantile(late[rank], 0.99) / 1e3,
        "others_median_late_ms": others_us / 1e3,
        "mean_late_ms": statistics.mean(late[rank]) / 1e3,
        "noise_ms": noise_us / 1e3,
        "stands_out": p_value < ALPHA and median_us - others_us > MARGIN_FACTOR * noise_us,
        "host": meta.get("host"),
        "pid": meta.get("pid"),
    }


def slowest_rank(traces: dict) -> dict | None:
    """The rank the others wait for at the start of their collectives, when one stands out
    beyond chance (:func:`rank_lateness`); None otherwise."""
    late = rank_lateness(traces)
    return late if late is not None and late["stands_out"] else None


MIN_LINK_BYTES = 1 << 20


def link_matrix(stats: dict, traces: dict | None = None):
    """(size, matrix[src][dst] GB/s or None, what it measures) from the receivers' TCP link
    stats or, with none (a shared-memory job), from the engine's traced transfers: data a
    rank read or copied from a peer went peer -> rank, data it wrote went rank -> peer.
    Pairs that moved less than 1 MiB or 1/20 of the busiest are left out (no bandwidth to
    speak of)."""
    world = world_stats(stats)
    n = max((s["size"] for s in world.values()), default=len(traces or {}))
    carried = {}  # (src, dst) -> [bytes, seconds]
    for dst, s in world.items():
        for src, link in (s.get("links") or {}).items():
            if link.get("recv_seconds"):  # timed messages (>= 32 KiB) over the time they took
                carried[(int(src), dst)] = [link.get("recv_timed_bytes", link["recv_bytes"]), link["recv_seconds"]]
    what = "TCP links, as received"
    if not carried and traces:
        what = "shared-memory transfers, from the traces"
        for rank, t in traces.items():
            for e in t["spans"]:
                a = e.get("args", {})
                if e["name"] != "transfer" or a.get("peer", -1) < 0 or not e.get("dur"):
                    continue
                key = (rank, a["peer"]) if a.get("kind") == "write" else (a["peer"], rank)
                c = carried.setdefault(key, [0, 0.0])
                c[0] += a["bytes"]
                c[1] += e["dur"] / 1e6
    if not n or not carried:
        return 0, [], what
    n = max(n, 1 + max(max(k) for k in carried))
    m = [[None] * n for _ in range(n)]
    busiest = max(b for b, _ in carried.values())
    for (src, dst), (nbytes, seconds) in carried.items():
        if seconds and nbytes >= max(MIN_LINK_BYTES, busiest / 20):
            m[src][dst] = nbytes / seconds / 1e9
    return n, m, what


def slowest_link(stats: dict, traces: dict | None = None) -> dict | None:
    n, m, what = link_matrix(stats, traces)
    cells = [(m[s][d], s, d) for s in range(n) for d in range(n) if m and m[s][d] is not None]
    if len(cells) < 2:
        return None
    bw, s, d = min(cells)
    return {"src": s, "dst": d, "GBps": bw, "median_GBps": statistics.median(c[0] for c in cells), "what": what}


def findings(data: dict) -> list[str]:
    out = []
    late = rank_lateness(data["traces"])
    if late is not None and late["stands_out"]:
        out.append(
            f"Slowest rank: rank {late['rank']} ({late['host']}, pid {late['pid']}) started "
            f"{late['last']} of {late['calls']} collectives last ({late['last_share']:.0%}; "
            f"{late['chance_share']:.0%} by chance, p = {late['p_value']:.1e}), a median "
            f"{late['median_late_ms']:.3f} ms after the first rank (the others: "
            f"{late['others_median_late_ms']:.3f} ms) — the others wait for it."
        )
    elif late is not None and late["p_value"] >= ALPHA:
        out.append(
            f"No rank stands out: none starts collectives last more often than chance would have it "
            f"(most often rank {late['rank']}, {late['last']} of {late['calls']} calls; "
            f"{late['chance_share']:.0%} expected, p = {late['p_value']:.2g})."
        )
    elif late is not None:
        out.append(
            f"No rank stands out: rank {late['rank']} starts {late['last']} of {late['calls']} collectives "
            f"last, but a median {late['median_late_ms']:.3f} ms after the first rank (the others: "
            f"{late['others_median_late_ms']:.3f} ms), within {MARGIN_FACTOR:g} x the timing noise "
            f"({late['noise_ms']:.3f} ms: the clocks agree to half a round trip)."
        )
    link = slowest_link(data["stats"], data["traces"])
    if link is not None:
        out.append(
            f"Slowest link: rank {link['src']} → rank {link['dst']} at {link['GBps']:.3f} GB/s "
            f"(median link {link['median_GBps']:.3f} GB/s; {link['what']})."
        )
    for r, s in sorted(world_stats(data["stats"]).items()):
        bad = sum(
            link.get("retransmits", 0) + link.get("checksum_failures", 0) for link in (s.get("links") or {}).values()
        )
        if bad:
            out.append(f"Rank {r}: {bad} retransmissions or checksum failures on its links.")
    return out or ["No rank or link stands out."]


# ------------------------------------------------------------------ plots
def _png(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=96, bbox_inches="tight")
    import matplotlib.pyplot as plt

    plt.close(fig)
    return buf.getvalue()


def plot_timeline(data: dict, slow=None, last: int = 60):
    import matplotlib.pyplot as plt

    traces = data["traces"]
    if not traces:
        return None
    fig, ax = plt.subplots(figsize=(11, 0.5 + 0.55 * len(traces)))
    calls = {r: [e for e in t["spans"] if e["name"] in _COLORS and e.get("tid") == 1] for r, t in traces.items()}
    t0 = min((e["ts"] for c in calls.values() for e in c[-last:]), default=0.0)
    seen = set()
    for r, c in calls.items():
        for e in c[-last:]:
            color = _COLORS.get(e["name"], "#999999")
            ax.broken_barh(
                [((e["ts"] - t0) / 1e3, max(e["dur"] / 1e3, 0.01))],
                (r - 0.4, 0.8),
                facecolors=color,
                label=e["name"] if e["name"] not in seen else None,
            )
            seen.add(e["name"])
    ax.set_yticks(sorted(traces))
    ax.set_yticklabels([f"rank {r}" + (" (slowest)" if slow and slow["rank"] == r else "") for r in sorted(traces)])
    ax.invert_yaxis()
    ax.set_xlabel("ms (rank 0's clock)")
    ax.set_title(f"Calls per rank (the last {last})")
    ax.legend(loc="upper right", fontsize=8, ncol=4)
    return _png(fig)


def plot_heatmap(data: dict):
    import matplotlib.pyplot as plt
    import numpy as np

    n, m, what = link_matrix(data["stats"], data["traces"])
    if not n or all(v is None for row in m for v in row):
        return None
    arr = np.array([[np.nan if v is None else v for v in row] for row in m])
    fig, ax = plt.subplots(figsize=(1.6 + 0.7 * n, 1.2 + 0.6 * n))
    im = ax.imshow(arr, cmap="viridis")
    for s in range(n):
        for d in range(n):
            if not np.isnan(arr[s, d]):
                ax.text(d, s, f"{arr[s, d]:.2f}", ha="center", va="center", color="w", fontsize=8)
    ax.set_xticks(range(n))
    ax.set_yticks(range(n))
    ax.set_xlabel("to rank")
    ax.set_ylabel("from rank")
    ax.set_title(f"Link bandwidth, GB/s ({what})")
    fig.colorbar(im, ax=ax)
    return _png(fig)


def plot_busbw(data: dict):
    fig = busbw_figure(data)
    return None if fig is None else _png(fig)


def busbw_figure(data: dict):
    """The bus bandwidth vs message size figure (log-log; only positive bandwidths can be
    drawn so), or None when there is nothing to plot."""
    import matplotlib.pyplot as plt

    series = {}
    for _r, s in world_stats(data["stats"]).items():
        for op, o in s.get("ops", {}).items():
            for e in o.get("by_size", {}).values():
                if e["calls"] and e["mean_bytes"] > 0 and e["busbw_GBps"] > 0:
                    series.setdefault(f"{op} (telemetry)", {}).setdefault(e["mean_bytes"], []).append(e["busbw_GBps"])
    for row in data["bench"]:
        bw = row.get("oop_busbw")
        if bw is None:
            bw = row.get("ip_busbw")  # broadcast: in place only
        if bw is not None and bw > 0 and row["size"] > 0:
            series.setdefault(f"{row['collective']} (bench)", {}).setdefault(row["size"], []).append(bw)
    if not series:
        return None
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for name, pts in sorted(series.items()):
        xs = sorted(pts)
        ax.plot(
            xs,
            [statistics.median(pts[x]) for x in xs],
            marker="o",
            color=_COLORS.get(name.split(" ")[0]),
            linestyle="-" if "bench" in name else "--",
            label=name,
        )
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")  # bandwidths span decades from small to large messages
    ax.set_xlabel("message size (bytes)")
    ax.set_ylabel("bus bandwidth (GB/s, log)")
    ax.set_title("Bus bandwidth vs message size (median over ranks)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    return fig


# ------------------------------------------------------------------ page
def topology(data: dict) -> str:
    world = world_stats(data["stats"])
    paths = {}
    for t in data["traces"].values():
        for e in t["spans"]:
            a = e.get("args", {})
            if a.get("path") and e["name"] in _COLORS:
                paths.setdefault(e["name"], set()).add(a["path"])
    rows = "".join(
        f"<tr><td>{r}</td><td>{html.escape(str(s.get('host')))}</td><td>{s.get('pid')}</td>"
        f"<td>{html.escape(str(s.get('platform')))}</td><td>{html.escape(str(s.get('transport')))}</td>"
        f"<td>{s.get('calls')}</td></tr>"
        for r, s in sorted(world.items())
    )
    algos = "".join(
        f"<li><b>{html.escape(op)}</b>: {html.escape(', '.join(sorted(p)))}</li>" for op, p in sorted(paths.items())
    )
    hosts = {}
    for r, s in world.items():
        hosts.setdefault(s.get("host"), []).append(r)
    host_line = "; ".join(f"{html.escape(str(h))}: ranks {', '.join(map(str, sorted(rs)))}" for h, rs in hosts.items())
    return (
        f"<p>{len(world)} ranks on {len(hosts)} host{'s' * (len(hosts) != 1)} — {host_line}</p>"
        "<table><tr><th>rank</th><th>host</th><th>pid</th><th>platform</th><th>transport</th><th>calls</th></tr>"
        f"{rows}</table><p>Paths the calls took (transport, algorithm):</p><ul>{algos or '<li>-</li>'}</ul>"
    )


def build(path: str, bench_files=(), png_dir: str | None = None) -> str:
    data = load(path, bench_files)
    slow = slowest_rank(data["traces"])
    plots = [
        ("timeline", "Timeline", plot_timeline(data, slow)),
        ("heatmap", "Links", plot_heatmap(data)),
        ("busbw", "Bandwidth", plot_busbw(data)),
    ]
    parts = []
    for key, title, png in plots:
        if png is None:
            parts.append(
                f"<h2>{title}</h2><p>(no data for this plot: "
                f"{'no TCP links measured and no traced transfers' if key == 'heatmap' else 'nothing recorded'})</p>"
            )
            continue
        if png_dir:
            os.makedirs(png_dir, exist_ok=True)
            with open(os.path.join(png_dir, f"{key}.png"), "wb") as f:
                f.write(png)
        parts.append(
            f"<h2>{title}</h2><img id='{key}' alt='{key}' src='data:image/png;base64,{base64.b64encode(png).decode()}'>"
        )
    found = "".join(f"<li>{html.escape(s)}</li>" for s in findings(data))
    return f"""<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>uniccl report</title>
<style>body{{font-family:DejaVu Sans,Arial,sans-serif;margin:24px;max-width:1100px}}
table{{border-collapse:collapse}}td,th{{border:1px solid #ccc;padding:3px 8px}}
.findings{{background:#fff4e5;border-left:4px solid #f90;padding:8px 16px}}img{{max-width:100%}}</style>
</head><body><h1>uniccl report</h1><p>{html.escape(os.path.abspath(path))}</p>
<div class="findings"><h2>Findings</h2><ul id="findings">{found}</ul></div>
{"".join(parts)}<h2>Topology</h2>{topology(data)}</body></html>"""


def main(args) -> int:
    try:
        page = build(args.dir, args.bench, args.png)
    except (OSError, ValueError, KeyError) as exc:
        print(f"uniccl report: {exc}", file=sys.stderr)
        return 2
    except ImportError as exc:
        print(f"uniccl report: {exc} (pip install 'uniccl[report]')", file=sys.stderr)
        return 2
    with open(args.output, "w") as f:
        f.write(page)
    print(args.output)
    return 0
