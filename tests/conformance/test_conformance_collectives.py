"""All collectives on device buffers at 1-4 ranks; on emulated vendors both through
the native library (NCCL) and, with it disabled, through host staging."""

import json
import os
import subprocess
import sys
from pathlib import Path

import _platform
import pytest
from _launch import rank_counts

WORKER = str(Path(__file__).parent / "workers" / "collectives.py")


def run_worker(n, env, timeout=240):
    cmd = [sys.executable, "-m", "uniccl", "run", "--no-prefix", "-n", str(n), "--timeout", str(timeout - 20), WORKER]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=dict(os.environ, **env))
    rows = [json.loads(line) for line in res.stdout.splitlines() if line.startswith("{")]
    return res, sorted(rows, key=lambda r: r["rank"])


@pytest.mark.parametrize("path", ["native", "staged"])
@pytest.mark.parametrize("n", rank_counts([1, 2, 3, 4]))
def test_collectives_on_device_buffers(platform, rank_env, backend, n, path):
    if platform == "cpu" and path == "native":
        pytest.skip("the cpu platform has no native collective library: host buffers are its device buffers")
    if path == "native" and platform in _platform.REAL and n > len(backend.record.probe["devices"]):
        pytest.skip("NCCL-class libraries need one device per rank (the emulation does not)")
    env = dict(rank_env)
    if path == "staged":
        env["UNICCL_PLUGINS"] = "^nccl"
    res, rows = run_worker(n, env)
    assert res.returncode == 0 and len(rows) == n, res.stdout[-1500:] + res.stderr[-1500:]
    for row in rows:
        assert row["platform"] == platform and row["cases"] > 100 and not row["failures"], row
        if row["nccl_all_reduce_calls"] >= 0:  # the emulation counts calls (real libraries do not)
            # the native path calls NCCL's all_reduce; staging never does
            assert (row["nccl_all_reduce_calls"] > 0) == (path == "native"), row
            # device-buffer send/recv (in a group): ncclSend/ncclRecv between group start and end
            assert (row["nccl_p2p_calls"] > 0) == (path == "native"), row
