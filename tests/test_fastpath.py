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
