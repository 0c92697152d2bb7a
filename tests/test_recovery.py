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
