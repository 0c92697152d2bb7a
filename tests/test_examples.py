"""``uniccl examples``: every example passes on 1, 2 and 4 ranks under ``uniccl run``; a
deliberately wrong example is a FAIL and a sleeping one a TIMEOUT that leaves nothing
running; plus the pure helpers of ``uniccl.tools.examples``."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from _launch import pid_alive, rank_counts

from uniccl.tools import examples as _examples

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
WRONG = Path(__file__).resolve().parent / "data" / "wrong_examples"
ROW = re.compile(r"^(\S+\.py)\s+(\d+)\s+(PASS|FAIL|TIMEOUT)\s+(\d+\.\d+)$", re.M)


def run_examples(*args: str, timeout: float, env: dict | None = None) -> tuple[int, str, dict]:
    """``python -m uniccl examples ARGS``: (exit code, output, {example: (ranks, status)})."""
    cmd = [sys.executable, "-m", "uniccl", "examples", *args]
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=dict(os.environ, **(env or {})),
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        raise AssertionError(f"{' '.join(cmd)} did not finish within {timeout} s:\n{out[-4000:]}")
    rows = {m.group(1): (int(m.group(2)), m.group(3)) for m in ROW.finditer(out)}
    return proc.returncode, out, rows


def log_dir(out: str) -> Path:
    m = re.search(r"logs in (\S*uniccl-examples-\d{8}-\d{6}\S*)\s*$", out)
    assert m, out
    return Path(m.group(1))


# ------------------------------------------------------------------ real runs
@pytest.mark.parametrize("nranks", rank_counts([1, 2, 4]))
def test_every_example_passes(nranks, tmp_path):
    names = sorted(p.name for p in EXAMPLES.glob("*.py"))
    assert len(names) >= 12 and "train_linear.py" in names
    t0 = time.monotonic()
    rc, out, rows = run_examples(
        "-n", str(nranks), "-t", "60", "--dir", str(EXAMPLES), "--log-dir", str(tmp_path), timeout=600
    )
    assert rc == 0, out[-6000:]
    assert rows == {name: (nranks, "PASS") for name in names}, out[-6000:]
    assert list(rows) == names  # run and listed in name order
    logs = log_dir(out)
    assert logs.parent == tmp_path
    for name in names:
        text = (logs / name.replace(".py", ".log")).read_text()
        for r in range(nranks):  # each rank verified its own result
            assert f"rank {r}/{nranks}: {name[:-3]} OK" in text, text[-3000:]
    print(f"{len(names)} examples on {nranks} ranks: {time.monotonic() - t0:.1f} s")


def test_wrong_result_is_fail(tmp_path):
    rc, out, rows = run_examples(
        "-n", "2", "-t", "60", "--dir", str(WRONG), "-e", "wrong_sum", "--log-dir", str(tmp_path), timeout=180
    )
    assert rc != 0, out
    assert rows == {"wrong_sum.py": (2, "FAIL")}, out
    assert "MISMATCH" in (log_dir(out) / "wrong_sum.log").read_text()
    assert "0/1 passed" in out


def test_sleeping_example_is_timeout_and_killed(tmp_path):
    pids = tmp_path / "pids"
    pids.mkdir()
    t0 = time.monotonic()
    rc, out, rows = run_examples(
        "-n",
        "2",
        "-t",
        "3",
        "--dir",
        str(WRONG),
        "-e",
        "sleeps",
        "--log-dir",
        str(tmp_path),
        timeout=120,
        env={"SLEEPS_PID_DIR": str(pids)},
    )
    elapsed = time.monotonic() - t0
    assert rc != 0, out
    assert rows == {"sleeps.py": (2, "TIMEOUT")}, out
    assert elapsed < 60, (elapsed, out)
    started = [int(p.read_text()) for p in pids.glob("rank*.pid")]
    assert started, f"the sleeping ranks never started:\n{out}"
    deadline = time.monotonic() + 10
    alive = started
    while alive and time.monotonic() < deadline:
        alive = [pid for pid in alive if pid_alive(pid)]
        time.sleep(0.1)
    assert not alive, f"ranks {alive} still running after TIMEOUT"


def test_missing_dir_and_no_match_are_errors(tmp_path):
    rc, out, _ = run_examples("--dir", str(tmp_path / "nowhere"), timeout=60)
    assert rc == 2 and "nowhere" in out and "not a folder" in out, out
    rc, out, _ = run_examples("--dir", str(EXAMPLES), "-e", "no-such-example", timeout=60)
    assert rc == 2 and "no *.py examples matching 'no-such-example'" in out, out
    assert not list(tmp_path.glob("uniccl-examples-*"))


# ------------------------------------------------------------------ pure helpers
def test_launch_argv():
    assert _examples.launch_argv(Path("/x/all_reduce.py"), 4, 30, "local") == [
        sys.executable,
        "-m",
        "uniccl",
        "run",
        "-n",
        "4",
        "--timeout",
        "30",
        "--launcher",
        "local",
        "/x/all_reduce.py",
    ]
    assert _examples.launch_argv("a.py", 1, 2.5, "auto")[6:8] == ["--timeout", "2.5"]


def test_find_examples_filters(tmp_path):
    for name in ("b_all_reduce.py", "a_gather.py", "train.py", "_helper.py", "notes.txt"):
        (tmp_path / name).write_text("")
    names = lambda *f: [p.name for p in _examples.find_examples(tmp_path, list(f))]  # noqa: E731
    assert names() == ["a_gather.py", "b_all_reduce.py", "train.py"]
    assert names("reduce") == ["b_all_reduce.py"]
    assert names("gather", "train") == ["a_gather.py", "train.py"]
    assert names("a_*") == ["a_gather.py"]  # glob on the name
    assert names("t?ain") == ["train.py"]  # glob on the stem
    assert names("*.py") == ["a_gather.py", "b_all_reduce.py", "train.py"]
    assert names("zzz") == []


def test_make_log_dir_is_timestamped_and_unique(tmp_path):
    now = time.mktime((2025, 3, 4, 5, 6, 7, 0, 0, -1))
    first = _examples.make_log_dir(tmp_path / "logs", now)
    second = _examples.make_log_dir(tmp_path / "logs", now)
    assert first.name == "uniccl-examples-20250304-050607" and first.is_dir()
    assert second.name == "uniccl-examples-20250304-050607-2" and second.is_dir()


@pytest.mark.parametrize(
    "rc, elapsed, killed, status",
    [
        (0, 1.0, False, "PASS"),
        (1, 1.0, False, "FAIL"),
        (-9, 1.0, False, "FAIL"),
        (124, 1.0, False, "TIMEOUT"),
        (1, 10.0, False, "TIMEOUT"),
        (-15, 12.0, True, "TIMEOUT"),
        (0, 10.5, False, "PASS"),
    ],
)
def test_classify(rc, elapsed, killed, status):
    assert _examples.classify(rc, elapsed, 10.0, killed) == status


def test_format_table():
    table = _examples.format_table(
        [
            {"example": "all_reduce.py", "ranks": 4, "status": "PASS", "seconds": 0.5},
            {"example": "train_linear.py", "ranks": 4, "status": "TIMEOUT", "seconds": 61.25},
        ]
    )
    lines = table.splitlines()
    assert lines[0].split() == ["example", "ranks", "status", "seconds"]
    assert [ROW.match(line).groups() for line in lines[1:]] == [
        ("all_reduce.py", "4", "PASS", "0.50"),
        ("train_linear.py", "4", "TIMEOUT", "61.25"),
    ]


def test_default_dir(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    assert _examples.default_dir() == Path("examples")
    monkeypatch.chdir(tmp_path)  # no ./examples: the source tree's, if uniccl runs from one
    found = _examples.default_dir()
    assert found is None or (found / "all_reduce.py").is_file()
