"""The compiled native path on the emulated vendor platforms: a loop of calls of one shape on
device buffers is served compiled (the vendor library's function called by address), with
the values, the record's agreement, a mismatch and a failing library call checked
(workers/served.py)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import _platform
import pytest
from _launch import rank_counts

WORKER = str(Path(__file__).parent / "workers" / "served.py")


@pytest.mark.parametrize("n", rank_counts([1, 2]))
def test_served_native_calls(platform, rank_env, backend, n):
    if platform == "cpu":
        pytest.skip("the cpu platform has no native collective library")
    if platform in _platform.REAL:
        pytest.skip("the worker injects failures into the emulated library")
    cmd = [sys.executable, "-m", "uniccl", "run", "--no-prefix", "-n", str(n), "--timeout", "200", WORKER]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=dict(os.environ, **rank_env))
    rows = sorted((json.loads(x) for x in res.stdout.splitlines() if x.startswith("{")), key=lambda x: x["rank"])
    assert res.returncode == 0 and len(rows) == n, res.stdout[-2000:] + res.stderr[-2000:]
    for row in rows:
        assert not row["failures"] and row["cases"] > 200, row
        assert row["served"] >= 8 * 29, row  # eight loops of 30 calls, all but each first served
        assert row["ccl_all_reduce_calls"] >= 4 * 30, row  # the library ran them
