"""``uniccl run --enable-recovery``: a rank that dies does not take the job with it; the
survivors shrink and finish (tests/workers/recovery.py, a real SIGKILL, no UNICCL_* set), and
the job's exit code is theirs: 0, or the code a survivor exits with."""

import json
import os
import subprocess
import sys

import pytest
from _launch import WORKERS

SCRIPT = str(WORKERS / "recovery.py")


def uniccl_run(*args, timeout=120):
    cmd = [sys.executable, "-m", "uniccl", "run", "--no-prefix", *args]
    env = {k: v for k, v in os.environ.items() if not k.startswith("UNICCL_")}
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)


def rows(res):
    return sorted((json.loads(x) for x in res.stdout.splitlines() if x.startswith("{")), key=lambda r: r["rank"])


def test_survivors_of_a_killed_rank_shrink_and_finish():
    res = uniccl_run("--enable-recovery", "-n", "4", SCRIPT)
    got = rows(res)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    assert [r["rank"] for r in got] == [0, 1, 3], got
    for r in got:
        assert r["steps"] == 10 and r["size"] == 3, r  # every step checked against numpy
        assert [e["remote_rank"] for e in r["errors"]] == [2] and r["errors"][0]["step"] == 5, r
    assert "rank 2" in res.stderr and "killed by SIGKILL" in res.stderr and "goes on without it" in res.stderr
    assert "finished without rank 2" in res.stderr, res.stderr


def test_the_job_exit_code_is_the_survivors():
    res = uniccl_run("--enable-recovery", "-n", "4", SCRIPT, "survivor-fails")
    assert res.returncode == 3, res.stdout[-2000:] + res.stderr[-2000:]
    assert [r["rank"] for r in rows(res)] == [0, 1, 3]


def test_without_recovery_the_first_death_stops_the_job():
    res = uniccl_run("-n", "4", SCRIPT)
    assert res.returncode == 128 + 9, res.stdout[-2000:] + res.stderr[-2000:]
    assert not rows(res)  # the survivors were stopped before they could finish
    assert "stopping the job" in res.stderr


@pytest.mark.parametrize("launcher", ["mpi"])
def test_recovery_needs_the_local_launcher(launcher):
    res = uniccl_run("--enable-recovery", "--launcher", launcher, "-n", "2", SCRIPT)
    assert res.returncode == 2 and "--enable-recovery" in res.stderr and "local launcher" in res.stderr, res.stderr


def test_elastic_example_loses_rank_2_and_grows_back(tmp_path):
    """examples/elastic_train.py as its docstring runs it: 4 ranks, rank 2 SIGKILLed at step 5,
    3 ranks for steps 5-9, the launcher's restart of rank 2 joins by grow() at step 10; every
    rank's final weights equal numpy's replay of that schedule (checked by the example)."""
    example = os.path.join(os.path.dirname(__file__), "..", "examples", "elastic_train.py")
    res = uniccl_run(
        "--enable-recovery", "--max-restarts", "1", "-n", "4", "python", example, "--dir", str(tmp_path / "d")
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    lines = sorted(x for x in res.stdout.splitlines() if "steps at sizes" in x)
    sizes = "[4, 4, 4, 4, 4, 3, 3, 3, 3, 3, 4, 4, 4, 4, 4]"
    assert len(lines) == 4 and all(f"15 steps at sizes {sizes}; weights match numpy's" in x for x in lines), lines
    assert "starting its command again (restart 1 of 1, UNICCL_RESTART_COUNT=1)" in res.stderr, res.stderr
    assert "every rank exited 0, after rank 2 (was killed by SIGKILL, restarted)" in res.stderr, res.stderr
    assert not (tmp_path / "d").exists()  # rank 0 removed its rendezvous folder


def test_a_restarted_rank_is_told_how_to_rejoin_and_restarts_are_bounded():
    """A restarted command that calls uniccl.init() gets InvalidUsage saying how to rejoin;
    it is started again at most --max-restarts times, and the job's exit code is then its own
    (it never ran to the end)."""
    code = (
        "import os, sys, time, uniccl\n"
        "if os.environ['UNICCL_RANK'] == '0': time.sleep(6)\n"
        "elif 'UNICCL_RESTART_COUNT' not in os.environ: sys.exit(1)\n"
        "else: uniccl.init()"
    )
    res = uniccl_run("--enable-recovery", "--max-restarts", "2", "-n", "2", sys.executable, "-c", code)
    assert res.returncode == 1, res.stdout[-2000:] + res.stderr[-2000:]
    assert res.stderr.count("starting its command again") == 2, res.stderr
    assert "restart 2 of 2" in res.stderr and "restart 3" not in res.stderr
    assert "this process is restart 1 of rank 1 (uniccl run --max-restarts)" in res.stdout, res.stdout[-2000:]


def test_max_restarts_needs_recovery():
    res = uniccl_run("--max-restarts", "1", "-n", "2", SCRIPT)
    assert res.returncode == 2 and "--max-restarts" in res.stderr and "--enable-recovery" in res.stderr, res.stderr
