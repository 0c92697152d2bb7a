"""ssh orchestration against three real OpenSSH servers in network namespaces
(tests/_netns.py; skipped with the reason where that cannot be had)."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from _netns import netns_cluster  # noqa: F401  (fixture)

from uniccl.launch import ssh as _ssh
from uniccl.launch.cluster import Node

ROOT = Path(__file__).resolve().parent.parent
UNREACHABLE = "10.77.0.9"  # in the bridge's subnet, nobody there


def _nodes(cluster, **kw):
    return [Node(host, ssh_options=list(cluster.ssh_options), **kw) for host in cluster.hosts]


def test_check_reachable(netns_cluster, tmp_path):  # noqa: F811
    nodes = _nodes(netns_cluster)
    assert _ssh.check_reachable(nodes, timeout=3) == {}
    # an address nobody answers and a key the servers do not accept: clear reasons, fast
    other_key = tmp_path / "other"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other_key)], check=True, timeout=30)
    wrong_key = Node(
        netns_cluster.hosts[1],
        port=22,
        ssh_options=["-i", str(other_key), *netns_cluster.ssh_options[2:], "-o", "IdentitiesOnly=yes"],
    )
    start = time.monotonic()
    failures = _ssh.check_reachable(
        [*nodes, Node(UNREACHABLE, ssh_options=list(netns_cluster.ssh_options)), wrong_key], timeout=3
    )
    took = time.monotonic() - start
    assert set(failures) == {UNREACHABLE, f"{netns_cluster.hosts[1]}:22"}, failures
    assert UNREACHABLE in failures[UNREACHABLE] and (
        "timed out" in failures[UNREACHABLE] or "No route" in failures[UNREACHABLE]
    )
    assert "Permission denied" in failures[f"{netns_cluster.hosts[1]}:22"]
    assert took < 10, took  # in parallel, bounded by the connect timeout


REPORT = r"""
import json, os, socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.connect(("10.77.0.1", 9))          # no packet is sent: only picks the source address
print(json.dumps({"addr": s.getsockname()[0], "argv": sys.argv[1:], "cwd": os.getcwd(),
                  "env": os.environ.get("UC_VALUE"), "path": os.environ["PATH"]}))
"""


def test_ssh_argv_runs_on_each_namespace(netns_cluster, tmp_path):  # noqa: F811
    args = ["a b", "$(touch canary)", "it's", "x;y", "", "`id`", "line\nbreak"]
    for i, node in enumerate(_nodes(netns_cluster, env={"UC_VALUE": "v $(id) 'q'"}, path_prepend=["/opt/uc bin"])):
        node.workdir = str(tmp_path / f"node {i} 'wd'")
        os.makedirs(node.workdir)
        res = subprocess.run(
            _ssh.ssh_argv(node, [sys.executable, "-c", REPORT, *args]),
            capture_output=True,
            text=True,
            timeout=60,
            stdin=subprocess.DEVNULL,
        )
        assert res.returncode == 0, res.stderr
        got = json.loads(res.stdout)
        assert got["addr"] == node.host  # it ran in that namespace
        assert got["argv"] == args and got["cwd"] == node.workdir
        assert got["env"] == "v $(id) 'q'" and got["path"].startswith("/opt/uc bin:")
        assert not os.path.exists(os.path.join(node.workdir, "canary"))


def _tree(root: Path) -> dict:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_sync(netns_cluster, tmp_path):  # noqa: F811
    src = tmp_path / "proj"
    (src / "pkg" / "sub dir").mkdir(parents=True)
    (src / "main.py").write_text("print('hi')\n")
    (src / "pkg" / "sub dir" / "it's $(x).txt").write_text("data\n")
    (src / "pkg" / "big.bin").write_bytes(os.urandom(2 << 20))
    for excluded in (".git/HEAD", "build/x.o", "pkg/__pycache__/m.pyc", ".venv/bin/python"):
        (src / excluded).parent.mkdir(parents=True, exist_ok=True)
        (src / excluded).write_text("host-specific\n")
    nodes = _nodes(netns_cluster)
    for i, node in enumerate(nodes):
        # the namespaces share one file system: one folder per node
        node.workdir = str(tmp_path / f"node {i}" / "pro'j")
    # a stale file is deleted; the node's own venv survives
    stale = Path(nodes[0].workdir)
    (stale / ".uniccl-venv").mkdir(parents=True)
    (stale / "old.py").write_text("stale\n")
    dead = Node(UNREACHABLE, workdir="uniccl-test", ssh_options=[*netns_cluster.ssh_options, "-o", "ConnectTimeout=2"])
    seen = []
    failures = _ssh.sync([*nodes, dead], src, progress=lambda *a: seen.append(a))
    assert list(failures) == [UNREACHABLE], failures
    expected = {
        k: v for k, v in _tree(src).items() if not k.startswith((".git", "build", ".venv")) and "__pycache__" not in k
    }
    for node in nodes:
        assert _tree(Path(node.workdir)) == expected
    assert (stale / ".uniccl-venv").is_dir() and not (stale / "old.py").exists()
    labels = {label for label, _ in seen}
    assert labels == {*(n.label for n in nodes), UNREACHABLE, None}
    assert any(label == nodes[0].label and msg.startswith("synced in") for label, msg in seen)
    assert seen[-1][0] is None and seen[-1][1].startswith("synced 3/4 node(s)")
