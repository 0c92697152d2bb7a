"""``comm.revoke`` on the emulated vendor platforms: the vendor communicator is aborted on
every rank (ours stays), the calls raise Revoked, shrink() brings the vendor path back
(workers/revoke.py)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import _platform
import pytest

WORKER = str(Path(__file__).parent / "workers" / "revoke.py")


def test_revoke_aborts_the_vendor_communicator(platform, rank_env, backend):
    if platform == "cpu":
        pytest.skip("the cpu platform has no native collective library")
    if platform in _platform.REAL:
        pytest.skip("the worker reads the emulated library's call counters")
    cmd = [sys.executable, "-m", "uniccl", "run", "--no-prefix", "-n", "2", WORKER]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=dict(os.environ, **rank_env))
    rows = sorted((json.loads(x) for x in res.stdout.splitlines() if x.startswith("{")), key=lambda x: x["rank"])
    assert res.returncode == 0 and len(rows) == 2, res.stdout[-2000:] + res.stderr[-2000:]
    for row in rows:
        assert row["native"] and row["library_ran"] and row["sum_ok"], row
        assert row["vendor_aborted"] == 1 and not row["native_after"], row
        assert "rank 0 revoked the communicator: lost a GPU" in row["revoked"], row
        assert row["shrunk_native"] and row["shrunk_library_ran"] and row["shrunk_ok"], row
