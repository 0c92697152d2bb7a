"""``uniccl examples``: run the example programs under the launcher and tabulate the results.

    uniccl examples                       # every examples/*.py on 4 ranks
    uniccl examples -n 2 -e all_reduce -e 'train*' -t 30

Each example is one job, ``uniccl run -n N --timeout T --launcher L example.py``,
run in name order.  Its output (stdout and stderr) goes to ``<name>.log`` in a fresh
``uniccl-examples-YYYYmmdd-HHMMSS/`` folder under ``--log-dir``.  A job that exits 0
is PASS; one that ran into the timeout (``uniccl run``'s own, or ours a few seconds
later, which kills the job's whole process tree) is TIMEOUT; anything else is FAIL.
The examples check their own results and exit non-zero when wrong, so a wrong result
is a FAIL.  The exit code is 0 only when every example passed.

Where the examples are: ``--dir``; by default ``./examples`` when the current directory
has one, else the ``examples/`` folder of the source tree this package was imported
from (a checkout or an editable install).  A wheel ships no examples: run from the
repository root or pass ``--dir``.
"""

from __future__ import annotations

import argparse
import fnmatch
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

STATUSES = ("PASS", "FAIL", "TIMEOUT")
DEFAULT_RANKS = 4
DEFAULT_TIMEOUT = 60.0
TIMEOUT_EXIT = 124  # what `timeout(1)`-style launchers return when time ran out


def _grace(timeout: float) -> float:
    """How long after the launcher's own --timeout we kill the job ourselves."""
    return max(5.0, 0.1 * timeout)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "-e",
        "--filter",
        action="append",
        default=[],
        metavar="FILTER",
        help="run only examples whose file name contains FILTER, or matches it as a "
        "glob when it has * ? or [ (repeatable: any match)",
    )
    parser.add_argument(
        "-t",
        "--timeout",
        type=float,
        default=DEFAULT_TIMEOUT,
        metavar="SECONDS",
        help=f"per-example time limit (default {DEFAULT_TIMEOUT:g})",
    )
    parser.add_argument(
        "-n",
        "--nranks",
        type=int,
        default=DEFAULT_RANKS,
        metavar="N",
        help=f"ranks per example (default {DEFAULT_RANKS})",
    )
    parser.add_argument(
        "--dir",
        default=None,
        metavar="DIR",
        help="folder of *.py examples (default: ./examples, else the source tree's)",
    )
    parser.add_argument("--launcher", default="auto", metavar="L", help="launcher for `uniccl run` (default auto)")
    parser.add_argument(
        "--log-dir",
        default=".",
        metavar="D",
        help="where the uniccl-examples-<timestamp>/ log folder goes (default: .)",
    )


# ------------------------------------------------------------------ pure helpers
def launch_argv(path, nranks: int, timeout: float, launcher: str) -> list[str]:
    """The command that runs one example as one job."""
    return [
        sys.executable,
        "-m",
        "uniccl",
        "run",
        "-n",
        str(nranks),
        "--timeout",
        f"{timeout:g}",
        "--launcher",
        launcher,
        str(path),
    ]


def default_dir() -> Path | None:
    """./examples, else the examples/ next to the source tree of this package; None if neither."""
    here = Path("examples")
    if here.is_dir():
        return here
    source = Path(__file__).resolve().parents[3] / "examples"  # <root>/core/uniccl/tools/examples.py
    return source if source.is_dir() else None


def matches(name: str, filters: list[str]) -> bool:
    """Does the file name ``name`` pass any of ``filters`` (none: everything passes)?"""
    if not filters:
        return True
    stem = name[:-3] if name.endswith(".py") else name
    for f in filters:
        if any(c in f for c in "*?["):
            if fnmatch.fnmatchcase(name, f) or fnmatch.fnmatchcase(stem, f):
                return True
        elif f in name:
            return True
    return False


def find_examples(directory: Path, filters: list[str]) -> list[Path]:
    """``*.py`` files of ``directory`` (not ``_private.py`` ones) passing ``filters``, by name."""
    return sorted(
        (p for p in directory.glob("*.py") if p.is_file() and not p.name.startswith("_") and matches(p.name, filters)),
        key=lambda p: p.name,
    )


def make_log_dir(parent: Path, now: float | None = None) -> Path:
    """A new ``uniccl-examples-YYYYmmdd-HHMMSS`` folder (``-2``, ``-3`` … if taken)."""
    base = "uniccl-examples-" + time.strftime("%Y%m%d-%H%M%S", time.localtime(now))
    parent.mkdir(parents=True, exist_ok=True)
    for i in range(1, 1000):
        path = parent / (base if i == 1 else f"{base}-{i}")
        try:
            path.mkdir()
            return path
        except FileExistsError:
            continue
    raise RuntimeError(f"cannot make a log folder {base}-N under {parent}")


def classify(returncode: int | None, elapsed: float, timeout: float, killed: bool) -> str:
    """PASS, FAIL or TIMEOUT for a job that exited with ``returncode`` after ``elapsed`` s.
    A non-zero exit at or past the time limit is the launcher enforcing ``--timeout``."""
    if killed:
        return "TIMEOUT"
    if returncode == 0:
        return "PASS"
    if returncode == TIMEOUT_EXIT or elapsed >= timeout:
        return "TIMEOUT"
    return "FAIL"


def format_table(rows: list[dict]) -> str:
    """rows: dicts with example, ranks, status, seconds -> an aligned text table."""
    width = max([len("example")] + [len(r["example"]) for r in rows])
    lines = [f"{'example':<{width}}  {'ranks':>5}  {'status':<7}  {'seconds':>8}"]
    for r in rows:
        lines.append(f"{r['example']:<{width}}  {r['ranks']:>5}  {r['status']:<7}  {r['seconds']:>8.2f}")
    return "\n".join(lines)


# ------------------------------------------------------------------ running
def _descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (Linux /proc; empty elsewhere), so that ranks a launcher
    put into sessions of their own are killed too."""
    children: dict[int, list[int]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read().decode(errors="replace")
            ppid = int(stat[stat.rindex(")") + 2 :].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _kill_job(proc: subprocess.Popen) -> None:
    """SIGTERM the job (the launcher forwards it to its ranks), then SIGKILL its process
    group and every descendant still alive."""
    tree = _descendants(proc.pid)
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        pass
    try:
        proc.wait(timeout=3)
    except subprocess.TimeoutExpired:
        pass
    for pid in [proc.pid, *tree, *_descendants(proc.pid)]:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()


def run_one(path: Path, nranks: int, timeout: float, launcher: str, log: Path) -> dict:
    """Run one example as one job, its output into ``log``; return its table row."""
    argv = launch_argv(path, nranks, timeout, launcher)
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    killed = False
    with open(log, "w") as out:
        out.write("# " + " ".join(argv) + "\n")
        out.flush()
        t0 = time.monotonic()
        try:
            proc = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )
        except OSError as exc:
            out.write(f"cannot start: {exc}\n")
            return {
                "example": path.name,
                "ranks": nranks,
                "status": "FAIL",
                "seconds": 0.0,
                "returncode": None,
                "log": log,
            }
        try:
            proc.wait(timeout=timeout + _grace(timeout))
        except subprocess.TimeoutExpired:
            killed = True
            _kill_job(proc)
        except BaseException:  # Ctrl-C: leave nothing running behind
            _kill_job(proc)
            raise
        elapsed = time.monotonic() - t0
        status = classify(proc.returncode, elapsed, timeout, killed)
        out.write(
            f"# {status}: exit code {proc.returncode} after {elapsed:.2f} s"
            + (f" (killed after the {timeout:g} s limit)" if killed else "")
            + "\n"
        )
    return {
        "example": path.name,
        "ranks": nranks,
        "status": status,
        "seconds": elapsed,
        "returncode": proc.returncode,
        "log": log,
    }


def _tail(path: Path, lines: int = 6) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    return "\n".join("    " + line for line in text[-lines:])


def main(args) -> int:
    if args.nranks < 1:
        print("uniccl examples: -n must be at least 1", file=sys.stderr)
        return 2
    if args.timeout <= 0:
        print("uniccl examples: -t must be positive", file=sys.stderr)
        return 2
    directory = Path(args.dir) if args.dir is not None else default_dir()
    if directory is None:
        print(
            "uniccl examples: no examples folder: ./examples does not exist and this uniccl was "
            "not imported from a source tree; run from the repository root or pass --dir DIR",
            file=sys.stderr,
        )
        return 2
    if not directory.is_dir():
        print(f"uniccl examples: {directory} is not a folder", file=sys.stderr)
        return 2
    examples = find_examples(directory, args.filter)
    if not examples:
        what = f" matching {' or '.join(map(repr, args.filter))}" if args.filter else ""
        print(f"uniccl examples: no *.py examples{what} in {directory}", file=sys.stderr)
        return 2
    log_dir = make_log_dir(Path(args.log_dir)).resolve()
    print(
        f"running {len(examples)} example(s) from {directory} on {args.nranks} rank(s), "
        f"launcher {args.launcher}, timeout {args.timeout:g} s; logs in {log_dir}",
        flush=True,
    )
    rows = []
    for path in examples:
        row = run_one(path.resolve(), args.nranks, args.timeout, args.launcher, log_dir / (path.stem + ".log"))
        rows.append(row)
        print(f"  {row['status']:<7} {row['example']} ({row['seconds']:.2f} s)", flush=True)
    print()
    print(format_table(rows))
    bad = [r for r in rows if r["status"] != "PASS"]
    for r in bad:
        print(f"\n{r['example']}: {r['status']} (exit code {r['returncode']}), last lines of {r['log']}:")
        print(_tail(r["log"]))
    print(f"\n{len(rows) - len(bad)}/{len(rows)} passed; logs in {log_dir}")
    return 1 if bad else 0
