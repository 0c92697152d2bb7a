"""TCP links that heal (transport/tcp/heal.py): a connection that breaks while both processes
live is redialled and its stream resumes from the first message the receiver lacks; every
collective's values are checked against numpy (tests/workers/link_heal.py).

- Real resets on loopback: ``ss -K`` kills every connection of rank 0's, both ends, three times
  while the ranks call all_reduce (uniccl run, TCP, no fault injection).
- ``UNICCL_FAULT_INJECT=disconnect=P``: connections shut down at random under every collective,
  over plain TCP and over TLS.
- Two hosts (network namespaces): the veth of one taken down for 2 s in the middle of a 256 MiB
  all_reduce at 4 ranks, alone and with its connections reset meanwhile (``ss -K`` there, as a
  NAT or firewall that dropped them would).
A dead peer is still a RemoteError at once: its listener refuses the redial (tests/test_shrink.py,
tests/test_faults.py)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time

import pytest
from _launch import WORKERS
from _netns import netns_cluster  # noqa: F401  (the fixture)

WORKER = str(WORKERS / "link_heal.py")
SS = shutil.which("ss") or "/usr/bin/ss"


def _env(**extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith("UNICCL_")}
    env.update(UNICCL_TRANSPORT="tcp", **extra)  # (one host: shared memory otherwise)
    return env


def _rows(text: str) -> list[dict]:
    rows = [json.loads(line[line.index("{") :]) for line in text.splitlines() if '{"rank"' in line]
    return sorted(rows, key=lambda r: r["rank"])


def _wait_files(paths, proc, timeout=60.0) -> None:
    deadline = time.monotonic() + timeout
    while not all(p.exists() for p in paths):
        assert proc.poll() is None and time.monotonic() < deadline, (proc.poll(), [p.exists() for p in paths])
        time.sleep(0.02)


def _listen_port(pid: int) -> int:
    """The TCP port process ``pid`` listens on (a rank's mesh listener), from ``ss``."""
    out = subprocess.run([SS, "-Htlnp"], capture_output=True, text=True, check=True).stdout
    ports = [int(line.split()[3].rsplit(":", 1)[1]) for line in out.splitlines() if f"pid={pid}," in line]
    assert len(ports) == 1, out
    return ports[0]


@pytest.mark.skipif(not os.path.exists(SS) or os.geteuid() != 0, reason="needs ss (iproute2) and root for ss -K")
def test_connections_reset_under_all_reduce_are_redialled(tmp_path):
    n = 3
    cmd = [sys.executable, "-m", "uniccl", "run", "--no-prefix", "-n", str(n), WORKER, "loop", str(tmp_path)]
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(UNICCL_DEBUG="WARN")
    )
    try:
        _wait_files([tmp_path / f"{r}.pid" for r in range(n)], proc)
        port = _listen_port(int((tmp_path / "0.pid").read_text()))
        killed = 0
        for _ in range(3):  # rank 0's connections: accepted on its port, dialled to it by ranks 1, 2
            res = subprocess.run(
                [SS, "-HtK", "state", "established", f"( sport = :{port} or dport = :{port} )"],
                capture_output=True,
                text=True,
            )
            killed += len(res.stdout.splitlines())
            time.sleep(0.4)
        assert killed >= 2, res.stdout + res.stderr  # there were connections to kill
        (tmp_path / "stop").touch()
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, out[-3000:] + err[-3000:]
    rows = _rows(out)
    assert [r["rank"] for r in rows] == list(range(n)), out + err
    for r in rows:
        assert r["wrong"] == [] and r["calls"] > 8 and r["transport"] == "tcp", r
    assert sum(rows[0]["reconnects"].values()) >= 3, rows  # each kill was healed, not a new job
    assert "is back (redial" in out, out[-3000:]  # (UNICCL_DEBUG=WARN: each redial is logged)


@pytest.mark.parametrize("tls", [False, True], ids=["tcp", "tls"])
def test_injected_disconnects_lose_nothing(tls):
    """Redialled connections under TLS are TLS again, between the same pinned certificates."""
    if tls and not shutil.which("openssl"):
        pytest.skip("UNICCL_TCP_TLS=1 needs the openssl program")
    n = 3
    cmd = [sys.executable, "-m", "uniccl", "run", "--no-prefix", "-n", str(n), WORKER, "fault", "4"]
    env = _env(UNICCL_FAULT_INJECT="disconnect=0.03,seed=5", **({"UNICCL_TCP_TLS": "1"} if tls else {}))
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=180, env=env)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    rows = _rows(res.stdout)
    assert [r["rank"] for r in rows] == list(range(n)), res.stdout
    for r in rows:
        assert r["wrong"] == [] and r["calls"] == 4 * 4 * 5, r
    assert sum(r["injected"]["disconnect"] for r in rows) >= 3, rows
    assert sum(sum(r["reconnects"].values()) for r in rows) >= 3, rows


def _down_for(cluster, seconds: float, reset: bool) -> None:
    """Host 2's link down for ``seconds``; with ``reset`` its TCP connections to host 1 are
    killed meanwhile (their resets are lost on the dead link, as behind a NAT that forgot them)."""
    veth = "uccl-v2"  # host 2's end on the bridge (tests/_netns.py)
    subprocess.run(["ip", "link", "set", veth, "down"], check=True)
    try:
        if reset:
            subprocess.run(
                cluster.netns_argv(1, [SS, "-HtK", "state", "established", "dst", cluster.hosts[0]]),
                capture_output=True,
                check=True,
            )
        time.sleep(seconds)
    finally:
        subprocess.run(["ip", "link", "set", veth, "up"], check=True)


@pytest.mark.parametrize("reset", [False, True], ids=["down", "down-and-reset"])
def test_a_link_down_for_2s_mid_256MiB_all_reduce(netns_cluster, tmp_path, reset):  # noqa: F811
    c = netns_cluster
    hosts = f"{c.hosts[0]}:2,{c.hosts[1]}:2"
    opts = [f"--ssh-option={o}" for o in c.ssh_options]
    fwd = ["-x", "PYTHONPATH"] if os.environ.get("PYTHONPATH") else []
    cmd = [
        *(sys.executable, "-m", "uniccl", "run", "--hosts", hosts, *opts, "--python", sys.executable, *fwd),
        *(WORKER, "big", str(tmp_path), "256"),
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    down = threading.Thread(target=_down_for, args=(c, 2.0, reset))
    try:
        _wait_files([tmp_path / f"{r}.pid" for r in range(4)], proc, timeout=90)
        time.sleep(0.3)  # well inside the call: it takes seconds over TCP
        assert proc.poll() is None
        down.start()
        out, err = proc.communicate(timeout=150)
    finally:
        if down.ident:
            down.join()
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, out[-3000:] + err[-3000:]
    rows = _rows(out)
    assert [r["rank"] for r in rows] == [0, 1, 2, 3], out + err
    assert len({r["host"] for r in rows}) == 2
    for r in rows:
        assert r["wrong"] == [] and r["calls"] == 1, r
        assert r["big_s"] > 2.0, rows  # the call spanned the 2 s outage
    if reset:
        assert sum(sum(r["reconnects"].values()) for r in rows) >= 1, rows
