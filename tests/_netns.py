"""Three real OpenSSH servers on one machine, for the multi-node tests.

As root: a bridge ``ucbr0`` (10.77.0.1/24) in the root network namespace and the
namespaces ``uccl-h1..h3`` (10.77.0.2-4), each joined to it by a veth pair, each
running its own ``sshd`` with a generated host key and one authorized test key.
The namespaces share the file system (and so the python environments) with the
root namespace; only the network is separate. Where this cannot be had (not root, no
``ip``/``sshd``/``ssh``, namespaces refused) the tests skip with the reason.

Use the session fixture ``netns_cluster``; it is set up once per pytest process
even when several test modules import it (a reference count keeps it until the
last user's teardown).
"""

from __future__ import annotations

import fcntl
import glob
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field

import pytest

BRIDGE = "ucbr0"
NS_PREFIX = "uccl-h"
VETH_PREFIX = "uccl-v"
SUBNET = "10.77.0"
COUNT = 3
LOCK_FILE = os.path.join(tempfile.gettempdir(), "uniccl-netns.lock")


@dataclass
class NetnsCluster:
    hosts: list  # ["10.77.0.2", "10.77.0.3", "10.77.0.4"]
    namespaces: list  # ["uccl-h1", ...], same order
    ssh_options: list  # ssh words: key, no known_hosts, quiet
    tmp: str  # keys, sshd configs and logs
    sshd: list = field(default_factory=list)  # Popen of each sshd
    lock: int | None = None  # fd holding LOCK_FILE while the namespaces exist

    def netns_argv(self, index: int, argv) -> list:
        """argv run inside the namespace of hosts[index]."""
        return ["ip", "netns", "exec", self.namespaces[index], *argv]

    def pids(self, index: int) -> list[int]:
        """Every process in the namespace of hosts[index] (sshd included)."""
        return _ns_pids(self.namespaces[index])

    def run(self, hosts: str, *args, timeout: float = 120) -> subprocess.CompletedProcess:
        """``uniccl run --hosts HOSTS ARGS`` over ssh to the namespaces, as a user runs it (with
        ``.seconds``, how long it took)."""
        opts = [f"--ssh-option={o}" for o in self.ssh_options]
        fwd = ["-x", "PYTHONPATH"] if os.environ.get("PYTHONPATH") else []  # a dev checkout on PYTHONPATH
        cmd = [sys.executable, "-m", "uniccl", "run", "--hosts", hosts, *opts, "--python", sys.executable]
        t0 = time.monotonic()
        res = subprocess.run([*cmd, *fwd, *args], capture_output=True, text=True, timeout=timeout)
        res.seconds = time.monotonic() - t0  # type: ignore[attr-defined]
        return res

    def sshd_log(self, index: int) -> str:
        try:
            with open(os.path.join(self.tmp, f"sshd-h{index + 1}.log")) as f:
                return f.read()
        except OSError:
            return ""


def _ip() -> str | None:
    return shutil.which("ip") or next((p for p in ("/usr/sbin/ip", "/sbin/ip") if os.access(p, os.X_OK)), None)


def _sshd() -> str | None:
    return shutil.which("sshd") or ("/usr/sbin/sshd" if os.access("/usr/sbin/sshd", os.X_OK) else None)


def _run(*argv, check=True) -> subprocess.CompletedProcess:
    res = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    if check and res.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: {res.stderr.strip() or res.returncode}")
    return res


def _ns_pids(name: str) -> list[int]:
    res = subprocess.run([_ip() or "ip", "netns", "pids", name], capture_output=True, text=True, timeout=10)
    return [int(p) for p in res.stdout.split() if p.isdigit()]


def _kill_namespace_processes(name: str) -> None:
    # only processes inside our own namespaces, each by its id
    for _ in range(50):
        pids = _ns_pids(name)
        if not pids:
            return
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.05)


def cleanup() -> None:
    """Remove our namespaces, veths and bridge (and what runs in them), also the ones
    a crashed earlier run left behind. Never raises."""
    ip = _ip()
    if ip is None:
        return
    listed = subprocess.run([ip, "netns", "list"], capture_output=True, text=True, timeout=10)
    for line in listed.stdout.splitlines():
        name = line.split()[0] if line.split() else ""
        if name.startswith(NS_PREFIX):
            _kill_namespace_processes(name)
            _run(ip, "netns", "del", name, check=False)
    for i in range(1, COUNT + 1):
        # deleting a namespace deletes its end of the pair, and the pair with it
        if os.path.exists(f"/sys/class/net/{VETH_PREFIX}{i}"):
            _run(ip, "link", "del", f"{VETH_PREFIX}{i}", check=False)
    if os.path.exists(f"/sys/class/net/{BRIDGE}"):
        _run(ip, "link", "del", BRIDGE, check=False)


def _network(ip: str) -> None:
    _run(ip, "link", "add", BRIDGE, "type", "bridge")
    _run(ip, "addr", "add", f"{SUBNET}.1/24", "dev", BRIDGE)
    _run(ip, "link", "set", BRIDGE, "up")
    for i in range(1, COUNT + 1):
        ns, host_end, ns_end = f"{NS_PREFIX}{i}", f"{VETH_PREFIX}{i}", f"uccl-p{i}"
        _run(ip, "netns", "add", ns)
        _run(ip, "link", "add", host_end, "type", "veth", "peer", "name", ns_end)
        _run(ip, "link", "set", ns_end, "netns", ns)
        _run(ip, "link", "set", host_end, "master", BRIDGE)
        _run(ip, "link", "set", host_end, "up")
        _run(ip, "-n", ns, "link", "set", "lo", "up")
        _run(ip, "-n", ns, "link", "set", ns_end, "name", "eth0")
        _run(ip, "-n", ns, "addr", "add", f"{SUBNET}.{i + 1}/24", "dev", "eth0")
        _run(ip, "-n", ns, "link", "set", "eth0", "up")
        _run(ip, "-n", ns, "route", "add", "default", "via", f"{SUBNET}.1")


_SSHD_CONFIG = """\
ListenAddress {addr}
Port 22
HostKey {tmp}/host_ed25519
AuthorizedKeysFile {tmp}/authorized_keys
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
PidFile {tmp}/sshd-h{i}.pid
MaxStartups 100
MaxSessions 100
LogLevel ERROR
"""


def _lock(wait: float = 150) -> int:
    """Take the machine-wide lock on the fixed names: a second pytest session (another
    developer's run, a parallel CI job) waits instead of deleting namespaces that are in
    use as "stale". The kernel drops the lock of a crashed session."""
    fd = os.open(LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o600)
    deadline = time.monotonic() + wait
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except BlockingIOError:
            if time.monotonic() > deadline:
                os.close(fd)
                pytest.skip(f"another test session held {LOCK_FILE} (the namespaces) for more than {wait:g} s")
            time.sleep(0.5)


def _keys(tmp: str) -> str:
    key = os.path.join(tmp, "id_ed25519")
    for path, comment in ((key, "uniccl-test"), (os.path.join(tmp, "host_ed25519"), "host")):
        _run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", path)
    shutil.copyfile(key + ".pub", os.path.join(tmp, "authorized_keys"))
    return key


def _wait_port(addr: str, sshd: subprocess.Popen, log: str, timeout: float = 15) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if sshd.poll() is not None:
            with open(log) as f:
                raise RuntimeError(f"sshd on {addr} exited ({sshd.returncode}): {f.read().strip()[-500:]}")
        try:
            with socket.create_connection((addr, 22), timeout=1) as s:
                s.settimeout(2)
                if s.recv(64).startswith(b"SSH-"):
                    return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"sshd on {addr} did not answer within {timeout} s")


def start() -> NetnsCluster:
    if os.geteuid() != 0:
        pytest.skip("network namespaces need root")
    ip, sshd = _ip(), _sshd()
    for name, path in (
        ("ip (iproute2)", ip),
        ("sshd (openssh-server)", sshd),
        ("ssh (openssh-client)", shutil.which("ssh")),
        ("ssh-keygen", shutil.which("ssh-keygen")),
    ):
        if path is None:
            pytest.skip(f"{name} is not installed")
    lock = _lock()
    cleanup()
    for stale in glob.glob(os.path.join(tempfile.gettempdir(), "uniccl-netns-*")):
        shutil.rmtree(stale, ignore_errors=True)  # keys and logs of a crashed run
    try:
        _network(ip)
    except (RuntimeError, OSError, subprocess.TimeoutExpired) as e:
        cleanup()
        os.close(lock)
        pytest.skip(f"cannot create network namespaces: {e}")
    tmp = tempfile.mkdtemp(prefix="uniccl-netns-")
    cluster = NetnsCluster(
        hosts=[f"{SUBNET}.{i + 2}" for i in range(COUNT)],
        namespaces=[f"{NS_PREFIX}{i + 1}" for i in range(COUNT)],
        ssh_options=[],
        tmp=tmp,
        lock=lock,
    )
    try:
        key = _keys(tmp)
        cluster.ssh_options = [
            "-i",
            key,
            "-o",
            "UserKnownHostsFile=/dev/null",
            "-o",
            "StrictHostKeyChecking=no",
            "-o",
            "LogLevel=ERROR",
        ]
        os.makedirs("/run/sshd", mode=0o755, exist_ok=True)  # sshd's privilege separation
        for i, (addr, ns) in enumerate(zip(cluster.hosts, cluster.namespaces), 1):
            cfg = os.path.join(tmp, f"sshd-h{i}.conf")
            with open(cfg, "w") as f:
                f.write(_SSHD_CONFIG.format(addr=addr, tmp=tmp, i=i))
            log = os.path.join(tmp, f"sshd-h{i}.log")
            with open(log, "w") as out:
                cluster.sshd.append(
                    subprocess.Popen(
                        [ip, "netns", "exec", ns, sshd, "-D", "-e", "-f", cfg],
                        stdin=subprocess.DEVNULL,
                        stdout=out,
                        stderr=subprocess.STDOUT,
                    )
                )
        for i, (addr, proc) in enumerate(zip(cluster.hosts, cluster.sshd), 1):
            _wait_port(addr, proc, os.path.join(tmp, f"sshd-h{i}.log"))
    except BaseException:
        stop(cluster)
        raise
    return cluster


def stop(cluster: NetnsCluster) -> None:
    try:
        for proc in cluster.sshd:
            if proc.poll() is None:
                proc.kill()
            proc.wait(timeout=10)
    finally:
        cleanup()
        shutil.rmtree(cluster.tmp, ignore_errors=True)
        if cluster.lock is not None:
            os.close(cluster.lock)  # releases the flock
            cluster.lock = None


_shared = {"cluster": None, "users": 0}


@pytest.fixture(scope="session")
def netns_cluster():
    if _shared["cluster"] is None:
        _shared["cluster"] = start()
    _shared["users"] += 1
    try:
        yield _shared["cluster"]
    finally:
        _shared["users"] -= 1
        if _shared["users"] == 0:
            cluster, _shared["cluster"] = _shared["cluster"], None
            stop(cluster)
