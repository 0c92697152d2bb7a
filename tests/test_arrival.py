"""Online straggler attribution (shared memory): every rank counts, at each call's first rendezvous,
whether it arrived last and how long it waited for the last rank otherwise -- in comm.stats()
("arrival"), Prometheus (uniccl_arrival_skew_seconds), uniccl top's LAST column and verdict, and
uniccl doctor --live.  Rank 1 is made late to every call (the slow= fault, 5 ms); 3 ranks under
uniccl run, read while the job runs and at its end."""

import json
import os
import subprocess
import sys
import time
import urllib.request

import pytest
from _launch import WORKERS


def test_the_late_rank_is_named_while_the_job_runs_and_after(tmp_path):
    pytest.importorskip("prometheus_client")
    status = tmp_path / "status"
    env = {k: v for k, v in os.environ.items() if not k.startswith("UNICCL_")}
    env.update(UNICCL_FAULT_INJECT="slow=0.005,slow_rank=1", UNICCL_STATUS_DIR=str(status), UNICCL_METRICS_PORT="29731")
    cmd = [sys.executable, "-m", "uniccl", "run", "--no-prefix", "-n", "3", str(WORKERS / "arrival.py"), str(tmp_path)]
    job = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        deadline = time.monotonic() + 60
        while not all((tmp_path / f"{r}.ready").exists() for r in range(3)):
            assert job.poll() is None and time.monotonic() < deadline, job.communicate()
            time.sleep(0.1)
        time.sleep(1.0)  # (the status files of a few hundred calls)
        metrics = urllib.request.urlopen("http://127.0.0.1:29732/metrics", timeout=10).read().decode()  # rank 1
        top = subprocess.run(
            [sys.executable, "-m", "uniccl", "top", "--once", str(status)], capture_output=True, text=True, timeout=30
        ).stdout
        live = subprocess.run(
            [sys.executable, "-m", "uniccl", "doctor", "--live", "--json", str(status)],
            capture_output=True,
            text=True,
            timeout=30,
        )
    finally:
        (tmp_path / "stop").touch()
        out, err = job.communicate(timeout=60)
    assert job.returncode == 0, out + err
    rows = sorted((json.loads(x) for x in out.splitlines() if x.startswith("{")), key=lambda r: r["rank"])
    assert [r["rank"] for r in rows] == [0, 1, 2], out + err
    assert rows[1]["last_share"] > 0.8 and rows[1]["wait_p50_us"] == 0.0, rows[1]  # it never waits
    for r in (rows[0], rows[2]):  # they wait ~5 ms for it, at nearly every call
        assert r["last_share"] < 0.2 and r["wait_p50_us"] >= 2048 and r["wait_mean_us"] > 3000, r
    skew = [line for line in metrics.splitlines() if line.startswith("uniccl_arrival_skew_seconds_count")]
    assert skew and 'rank="1"' in skew[0] and float(skew[0].split()[-1]) >= 100, metrics[-2000:]
    assert "LAST" in top and "rank 1 arrives last in" in top and "the others wait for it" in top, top
    assert live.returncode == 1, live.stdout + live.stderr
    (v,) = [v for v in json.loads(live.stdout)["verdicts"] if v["kind"] == "straggler"]
    assert v["ranks"] == [1] and v["detail"]["last_share"] > 0.8, v
