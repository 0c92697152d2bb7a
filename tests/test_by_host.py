"""Collectives by host (comm/hosts.py) on a real multi-host job: ``uniccl run --hosts`` over ssh
to three network namespaces (_netns.py), the ranks of a host over shared memory and the hosts'
leaders over TCP.  Every value is checked against numpy in float64 by the worker
(workers/by_host.py), on the world and on a split whose ranks interleave the hosts."""

from __future__ import annotations

import json
import os
import signal
import sys

import pytest
from _launch import WORKERS, Job, resume, wait_stopped
from _netns import netns_cluster  # noqa: F401  (the fixture)

WORKER = str(WORKERS / "by_host.py")
BY_HOST = "all_reduce:hierarchical;all_gather:hierarchical;reduce_scatter:hierarchical"


def _rows(res) -> list[dict]:
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    rows = [json.loads(line.partition("] ")[2]) for line in res.stdout.splitlines() if "{" in line]
    return sorted(rows, key=lambda r: r["world"]["rank"])


@pytest.mark.parametrize("slots", [(2, 2, 2), (3, 2, 1)], ids=["2-2-2", "3-2-1"])
def test_forced_by_host(netns_cluster, slots):  # noqa: F811
    c = netns_cluster
    hosts = ",".join(f"{h}:{k}" for h, k in zip(c.hosts, slots))
    rows = _rows(c.run(hosts, "-x", f"UNICCL_ALGO={BY_HOST}", WORKER, timeout=180))
    assert len(rows) == sum(slots)
    alike = len(set(slots)) == 1
    for row in rows:
        assert row["transport"] == "tcp"
        for label in ("world", "interleaved"):
            part = row[label]
            assert part["errors"] == [], (label, part)
            assert sorted(part["hosts"]) == sorted(slots)
            # a host's ranks share memory ("local": a host of one rank)
            assert part["local_transport"] == ("shm" if part["local_size"] > 1 else "local")
            assert part["paths"]["all_reduce"] == ["hierarchical"]
            assert part["local_calls"] >= 2 * 14  # every all_reduce made its reduce and broadcast there
            # all_gather and reduce_scatter need alike hosts; else the ring, whatever UNICCL_ALGO asks
            for coll in ("all_gather", "reduce_scatter"):
                assert part["paths"][coll] == (["hierarchical"] if alike else ["ring"]), (label, coll)
        assert row["world"]["in_order"] is True
        assert row["interleaved"]["in_order"] is False


def test_tuned_by_host(netns_cluster):  # noqa: F811
    """No UNICCL_ALGO: the tuner picks per size (at 6 ranks mostly flat: test_tuner); the values
    are right whatever it picks."""
    c = netns_cluster
    rows = _rows(c.run(",".join(f"{h}:2" for h in c.hosts), WORKER, timeout=180))
    assert len(rows) == 6
    for row in rows:
        for label in ("world", "interleaved"):
            part = row[label]
            assert part["errors"] == [], (label, part)
            for coll, paths in part["paths"].items():
                assert set(paths) <= {"ring", "recursive_doubling", "hierarchical"}, (coll, paths)


LIMIT = 3.0


@pytest.mark.parametrize("victim", [3, 2], ids=["member", "leader"])
def test_a_stopped_rank_is_named_by_every_other(netns_cluster, tmp_path, victim):  # noqa: F811
    """A rank held stopped (SIGSTOP) in a by-host all_reduce: every other rank, on its host or
    not, raises uniccl.Timeout naming it within the call's timeout (+2 s), as on the flat path
    (test_tcp_hardening), and the job ends cleanly once it is resumed."""
    c = netns_cluster
    go, done = tmp_path / "go", tmp_path / "done"
    opts = [f"--ssh-option={o}" for o in c.ssh_options]
    hosts = ",".join(f"{h}:2" for h in c.hosts)
    launcher = ("--hosts", hosts, *opts, "--python", sys.executable, "-x", f"UNICCL_ALGO={BY_HOST}")
    job = Job(6, "tcp_stopped.py", "all_reduce", 8, LIMIT, go, done, launcher=launcher)
    pid = None
    try:
        pid = {row["ready"]: row["pid"] for row in job.rows(lambda rows: len(rows) == 6, 120)}[victim]
        os.kill(pid, signal.SIGSTOP)
        wait_stopped(pid)
        go.write_text("go")
        rows = job.rows(lambda rows: len(rows) == 5, LIMIT + 60)
        for row in rows:
            assert row["error"] == "Timeout", row
            assert row["seconds"] < LIMIT + 2, row
            assert row["missing"] == [victim], row
            assert f"rank {victim}" in row["message"], row
        os.kill(pid, signal.SIGCONT)
        last = job.rows(lambda rows: len(rows) == 1, 60)[0]
        assert last["rank"] == victim and last["error"] in (None, "Timeout", "RemoteError", "InvalidUsage"), last
        done.write_text("done")
        assert job.wait(60) == 0, job.output()
        assert "Traceback" not in job.output(), job.output()
    finally:
        resume(pid)
        job.kill()
