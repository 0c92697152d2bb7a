"""Everything a call does is seen: send/recv inside ``uniccl.group()`` are counted (stats,
Prometheus, traces) and their flight-recorder entries end completed; ``uniccl top`` on a job
that has finished says so, with every rank's final count."""

import glob
import json
import os
import socket
import subprocess
import sys

import pytest
from _launch import WORKERS

GROUP = str(WORKERS / "group_seen.py")


def uniccl_run(n, *argv, env=None, timeout=180):
    res = subprocess.run(
        [sys.executable, "-m", "uniccl", "run", "--no-prefix", "-n", str(n), *argv],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=dict(os.environ, **(env or {})),
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    return res


def _free_base(n: int) -> int:
    """A port P with P .. P+n-1 free now (each rank serves on P + local rank)."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            base = s.getsockname()[1]
        if base + n > 65535:
            continue
        try:
            for p in range(base, base + n):
                with socket.socket() as t:
                    t.bind(("127.0.0.1", p))
            return base
        except OSError:
            continue
    pytest.skip("no run of free ports")


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_group_send_recv_are_counted_traced_and_completed(transport, tmp_path):
    pytest.importorskip("prometheus_client")
    n, rounds = 3, 5
    port = _free_base(n)
    trace = tmp_path / "trace"
    res = uniccl_run(
        n,
        GROUP,
        str(rounds),
        str(port),
        env={"UNICCL_TRANSPORT": transport, "UNICCL_METRICS_PORT": str(port), "UNICCL_TRACE": str(trace)},
    )
    rows = sorted((json.loads(x) for x in res.stdout.splitlines() if x.startswith("{")), key=lambda r: r["rank"])
    assert [r["rank"] for r in rows] == list(range(n)), res.stdout
    for row in rows:
        for op in ("send", "recv"):
            assert row[op] is not None, (op, row)
            assert row[op]["calls"] == rounds and row[op]["bytes"] == rounds * 1024 and row[op]["failed"] == 0
            assert row["served"][op] == rounds  # Prometheus serves the same counters
        # (the trace's clock alignment adds its own send/recv pairs, outside any group)
        p2p = [s for o, s in row["states"] if o in ("send", "recv")]
        assert len(p2p) >= 2 * rounds and set(p2p) == {"completed"}, row["states"]
    for r in range(n):  # the trace has a span per transfer
        doc = json.loads((trace / f"uniccl-trace-r{r}.json").read_text())
        events = doc["traceEvents"] if isinstance(doc, dict) else doc
        names = [
            e.get("name")
            for e in events
            if e.get("ph") == "X" and e.get("cat", "calls") == "calls" or e.get("name") in ("send", "recv")
        ]
        assert names.count("send") == rounds and names.count("recv") == rounds, sorted(set(map(str, names)))


def test_top_shows_a_finished_job_as_finished(tmp_path):
    status = tmp_path / "status"
    uniccl_run(3, GROUP, "40", env={"UNICCL_STATUS_DIR": str(status)})
    assert len(glob.glob(str(status / "rank-*.json"))) == 3
    res = subprocess.run(
        [sys.executable, "-m", "uniccl", "top", str(status), "--once"], capture_output=True, text=True, timeout=60
    )
    assert res.returncode == 0, res.stderr
    out = res.stdout
    assert "job finished: every rank exited" in out, out
    assert "behind" not in out and "STALE" not in out and "has not reported" not in out, out
    for r in range(3):  # every rank's final count: 80 transfers + the barrier, as the rank made them
        row = json.loads((status / f"rank-{r}.json").read_text())
        assert row["state"] == "exited"
        world = row["comms"][0]
        assert world["destroyed"] and world["calls"] == 1, world  # the barrier; p2p has no call number
        assert world["state"] == "completed"
