"""``uniccl run`` across three real OpenSSH hosts (network namespaces, see _netns.py):
a 6-rank job over TCP, an unreachable node, and a rank killed on one host."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

from _launch import WORKERS
from _netns import netns_cluster  # noqa: F401  (the fixture)

MULTI = str(WORKERS / "multinode.py")


def _leftovers(cluster) -> list:
    """Processes other than sshd left in any namespace."""
    left = []
    for i in range(len(cluster.hosts)):
        for pid in cluster.pids(i):
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if "sshd" not in cmd:
                left.append((cluster.hosts[i], pid, cmd))
    return left


def test_six_ranks_on_three_hosts(netns_cluster):  # noqa: F811
    c = netns_cluster
    res = c.run(",".join(f"{h}:2" for h in c.hosts), MULTI)
    assert res.returncode == 0, res.stdout + res.stderr
    rows = sorted(
        (json.loads(line.partition("] ")[2]) for line in res.stdout.splitlines() if "{" in line),
        key=lambda r: r["rank"],
    )
    assert [r["rank"] for r in rows] == list(range(6))
    assert all(r["all_reduce"] and r["all_gather"] and r["all_to_all"] for r in rows), rows
    assert len({r["host"] for r in rows}) == 3  # really three network hosts, two ranks each
    assert all(r["transport"] == "tcp" for r in rows)
    assert not _leftovers(c)


def test_unreachable_node_launches_nothing(netns_cluster, tmp_path):  # noqa: F811
    c = netns_cluster
    res = c.run(f"{c.hosts[0]}:2,10.77.0.9:2", MULTI, timeout=60)
    assert res.returncode == 255, res.stdout + res.stderr
    assert "node 10.77.0.9 is unreachable" in res.stderr and "nothing was launched" in res.stderr
    assert not res.stdout.strip() and not _leftovers(c)


def test_killed_rank_ends_the_job_everywhere(netns_cluster, tmp_path):  # noqa: F811
    c = netns_cluster
    before = sorted(p.name for p in Path("/dev/shm").glob("uniccl-*"))
    res = c.run(",".join(f"{h}:2" for h in c.hosts), MULTI, "kill", "3", str(tmp_path), timeout=60)
    assert res.returncode == 128 + signal.SIGKILL, res.stdout + res.stderr
    assert res.seconds < 10 + 3  # within 10 s of the kill (the launch itself takes ~1-3 s)
    assert f"rank 3 on host {c.hosts[1]}" in res.stderr and "killed by SIGKILL" in res.stderr
    assert len(list(tmp_path.glob("*.pid"))) == 6
    time.sleep(0.5)
    assert not _leftovers(c)
    assert sorted(p.name for p in Path("/dev/shm").glob("uniccl-*")) == before


def test_cluster_file_sync_build_and_run(netns_cluster, tmp_path):  # noqa: F811
    """The whole multi-node path on two hosts: a cluster.yaml with per-node settings,
    --sync of this project and --build of per-node venvs (wheels built here, nodes have
    no index), then the job runs from the synced copy under each node's venv."""
    c = netns_cluster
    root = Path(__file__).resolve().parents[1]
    base_python = getattr(sys, "_base_executable", None) or sys.executable  # cp3XX like the wheels
    cfg = tmp_path / "cluster.yaml"
    cfg.write_text(
        json.dumps(
            {  # JSON is YAML
                "defaults": {
                    "python": base_python,
                    "platform": "cpu",
                    "ssh_options": c.ssh_options,
                    "env": {"OMP_NUM_THREADS": "1"},
                },
                "nodes": [
                    {"host": c.hosts[0], "slots": 2, "workdir": str(tmp_path / "node a")},
                    {"host": c.hosts[2], "slots": 2, "workdir": str(tmp_path / "node b")},
                ],
            }
        )
    )
    cmd = [
        sys.executable,
        "-m",
        "uniccl",
        "run",
        "--cluster",
        str(cfg),
        "--sync",
        "--build",
        "--project",
        str(root),
        "examples/all_reduce.py",
    ]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=280)  # no -x PYTHONPATH: nodes use their venvs
    assert res.returncode == 0, res.stdout + res.stderr[-4000:]
    assert sorted(line.split()[0] for line in res.stdout.splitlines() if "OK" in line) == [
        "[0]",
        "[1]",
        "[2]",
        "[3]",
    ], res.stdout
    for node in ("node a", "node b"):
        assert (tmp_path / node / "examples" / "all_reduce.py").exists()  # synced
        assert (tmp_path / node / ".uniccl-venv" / "bin" / "python").exists()  # built
    assert "synced" in res.stderr and "built" in res.stderr
    assert not _leftovers(c)
