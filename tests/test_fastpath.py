"""The compiled steady-state call path (uniccl.comm._fastpath), run as users run it:
``uniccl run`` ranks calling all_reduce in loops, checked against numpy (tests/workers/fastpath.py)."""

import os
import re
import subprocess
import sys

import pytest
from _launch import WORKERS

SCRIPT = str(WORKERS / "fastpath.py")


def uniccl_run(n, mode, env=None, timeout=180):
    cmd = [sys.executable, "-m", "uniccl", "run", "--no-prefix", "-n", str(n), SCRIPT, mode]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=dict(os.environ, **(env or {})))


@pytest.mark.parametrize("n", [2, 3])
@pytest.mark.parametrize("telemetry", [False, True])
def test_served_calls_match_numpy_errors_and_records(n, telemetry):
    res = uniccl_run(n, "basic", {"UNICCL_TELEMETRY": "1"} if telemetry else None)
    assert res.returncode == 0, res.stdout + res.stderr
    served = [int(s) for s in re.findall(r"rank \d+: ok (\d+)", res.stdout)]
    assert len(served) == n and min(served) > 10000, res.stdout  # the loops were served compiled


def test_peer_killed_inside_served_calls():
    res = uniccl_run(3, "kill")
    assert res.returncode != 0  # rank 1 was killed
    lines = re.findall(r"rank (\d+): RemoteError served=(\d+) (.*)", res.stdout)
    assert sorted(int(r) for r, _, _ in lines) == [0, 2], res.stdout + res.stderr
    for _, served, text in lines:
        assert int(served) >= 400 and "rank 1" in text, text


def test_served_calls_refuse_what_the_general_path_refuses():
    """Found by an adversarial review (2026-12-07): a call refused in a group was learnt and
    then served past its buffer (heap corruption), a bad op raised inside the group (the peer
    waited its timeout), a call matched in one thread ran another thread's newly learnt shape,
    a persistent start ran on a buffer resized since init (use after free), and a buffer wrapper
    from a module named uniccl* was compared by identity."""
    res = uniccl_run(2, "misuse", timeout=120)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert len(re.findall(r"rank \d+: misuse ok", res.stdout)) == 2, res.stdout
