"""Another local user at the rendezvous port: random bytes, truncated frames, huge lengths,
JSON of the wrong shape, wrong proofs claiming real ranks, slow clients and a flood of idle
connections (tests/workers/rdv_attacker.py, run as uid nobody where the test is root) while
a real job initialises -- through ``get_unique_id()`` with plain processes, and through
``uniccl run``.  The job must initialise and compute correctly, well within its timeout."""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest
from _launch import WORKERS

ATTACKER = WORKERS / "rdv_attacker.py"


class Attacker:
    """The attacking process: as uid nobody (system python, which nobody can run) when we are root."""

    def __init__(self, host: str, port: int, seconds: float = 90):
        self.dir = tempfile.mkdtemp(prefix="uniccl-attack-")
        os.chmod(self.dir, 0o755)
        self.stop_file = os.path.join(self.dir, "stop")
        kw, python = {}, sys.executable
        if os.geteuid() == 0 and os.access("/usr/bin/python3", os.X_OK):
            kw, python = {"user": 65534, "group": 65534, "extra_groups": []}, "/usr/bin/python3"
        self.as_nobody = bool(kw)
        self.proc = subprocess.Popen(
            [python, str(ATTACKER), host, str(port), str(seconds), self.stop_file],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd="/",
            **kw,
        )

    def finish(self) -> dict:
        Path(self.stop_file).touch()
        out, err = self.proc.communicate(timeout=60)
        shutil.rmtree(self.dir, ignore_errors=True)
        assert self.proc.returncode == 0, err[-3000:]
        counts = json.loads(out.strip().splitlines()[-1])
        for attack in ("json_list", "random_bytes", "truncated", "huge_length", "wrong_shape", "wrong_proof"):
            assert counts.get(attack, 0) > 0, counts  # the attack really ran
        assert counts["idle_flood"] > 100, counts
        return counts


def user_env() -> dict:
    return {k: v for k, v in os.environ.items() if not k.startswith("UNICCL_")}


def test_unique_id_rendezvous_survives_a_hostile_local_user(tmp_path):
    import uniccl

    n = 3
    uid_file = tmp_path / "uid"
    outs = [tmp_path / f"out-{r}.json" for r in range(n)]

    def rank(r):
        return subprocess.Popen(
            [sys.executable, str(WORKERS / "uid_plain.py"), str(r), str(n), str(uid_file), str(outs[r])],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=user_env(),
        )

    procs = [rank(0)]  # makes the unique id and joins: its rendezvous is now up
    deadline = time.monotonic() + 60
    while not uid_file.exists():
        assert time.monotonic() < deadline and procs[0].poll() is None, "rank 0 wrote no unique id"
        time.sleep(0.05)
    uid = uniccl.UniqueId.from_bytes(uid_file.read_bytes())
    attacker = Attacker(uid.host, uid.port)
    try:
        time.sleep(3)  # every attack under way (the slow clients have sent their first bytes)
        t0 = time.monotonic()
        procs += [rank(r) for r in range(1, n)]
        for r, p in enumerate(procs):
            out, _ = p.communicate(timeout=60)
            assert p.returncode == 0, f"rank {r}:\n{out[-3000:]}"
        joined = time.monotonic() - t0
    finally:
        for p in procs:
            p.kill()
        counts = attacker.finish()
    assert joined < 45, joined  # not the rendezvous' timeout: nobody waited for the attacker
    for r in range(n):
        got = json.loads(outs[r].read_text())
        np.testing.assert_array_equal(got["all_reduce"], np.arange(1000, dtype=np.float64) * sum(range(1, n + 1)))
    print(counts, "as nobody" if attacker.as_nobody else "as this user")


def test_uniccl_run_rendezvous_survives_a_hostile_local_user(tmp_path):
    go = tmp_path / "go"
    job = subprocess.Popen(
        [sys.executable, "-m", "uniccl", "run", "-n", "3", str(WORKERS / "wait_go.py"), str(go)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=user_env(),
    )
    addr = None
    lines = []
    deadline = time.monotonic() + 60
    while addr is None:
        line = job.stdout.readline()
        assert line and time.monotonic() < deadline, "".join(lines)
        lines.append(line)
        if "rendezvous" in line:
            addr = line.split()[line.split().index("rendezvous") + 1]
    host, _, port = addr.rpartition(":")
    attacker = Attacker(host, int(port))
    try:
        time.sleep(3)
        go.touch()
        out, _ = job.communicate(timeout=60)
    finally:
        job.kill()
        attacker.finish()
    out = "".join(lines) + out
    assert job.returncode == 0, out[-3000:]
    assert sum("all_reduce checked" in line for line in out.splitlines()) == 3, out[-3000:]


def listening(pid: int) -> list[str]:
    """host:port of every TCP socket process ``pid`` listens on (from /proc)."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    out = []
    for table, width in (("/proc/net/tcp", 8), ("/proc/net/tcp6", 32)):
        try:
            rows = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            f = row.split()
            if f[3] == "0A" and f[9] in inodes:  # LISTEN
                hexaddr, hexport = f[1].split(":")
                if width == 8:
                    host = ".".join(str(int(hexaddr[i : i + 2], 16)) for i in (6, 4, 2, 0))
                else:
                    host = "::" if int(hexaddr, 16) == 0 else f"v6:{hexaddr}"
                out.append(f"{host}:{int(hexport, 16)}")
    return out


def test_a_job_of_one_host_listens_on_loopback_only(tmp_path):
    """The launcher's rendezvous and every rank's mesh listener bind 127.0.0.1, not every interface."""
    go, late = tmp_path / "go", tmp_path / "late"
    job = subprocess.Popen(
        [sys.executable, "-m", "uniccl", "run", "-n", "3", str(WORKERS / "wait_go.py"), str(go), "1", str(late)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=dict(user_env(), UNICCL_TRANSPORT="tcp"),
    )
    try:
        pids, lines = {}, []
        deadline = time.monotonic() + 60
        while len(pids) < 3:
            line = job.stdout.readline()
            assert line and time.monotonic() < deadline, "".join(lines)
            lines.append(line)
            words = line.split()
            if "rendezvous" in words:
                pids[len(pids)] = int(words[words.index("pid") + 1])
        launcher = listening(job.pid)
        assert launcher and all(a.startswith("127.0.0.1:") for a in launcher), launcher
        go.touch()  # ranks 0 and 2 open their mesh listeners and wait for rank 1
        seen = []
        while time.monotonic() < deadline and len(seen) < 2:
            seen = [listening(p) for p in pids.values()]
            seen = [s for s in seen if s]
            time.sleep(0.05)
        assert len(seen) >= 2, seen
        for addrs in seen:
            assert all(a.startswith("127.0.0.1:") for a in addrs), seen
        late.touch()
        out, _ = job.communicate(timeout=60)
    finally:
        job.kill()
    out = "".join(lines) + out
    assert job.returncode == 0, out[-3000:]
    assert sum("all_reduce checked" in line for line in out.splitlines()) == 3, out[-3000:]


def as_nobody(*argv):
    """Run a command as uid nobody (the other local user)."""
    subprocess.run(list(argv), check=True, user=65534, group=65534, extra_groups=[], cwd="/")


needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="a second uid needs root to switch to")


def shared_tmp(tmp_path) -> Path:
    """A world-writable sticky directory like /tmp, reachable by nobody."""
    d = Path(tempfile.mkdtemp(prefix="uniccl-shared-"))
    os.chmod(d, 0o1777)
    return d


@needs_root
@pytest.mark.parametrize("plant", ["link-to-their-dir", "their-dir-with-link"])
def test_uniccl_run_refuses_a_planted_status_root_and_deletes_nothing(plant, tmp_path):
    shared = shared_tmp(tmp_path)
    victim = tmp_path / "victim"  # our directories that a planted link points at
    for i in range(25):
        (victim / f"2020010{i % 9 + 1}-0000{i:02d}-1").mkdir(parents=True)
        (victim / f"2020010{i % 9 + 1}-0000{i:02d}-1" / "data").write_text("ours")
    try:
        theirs = shared / "theirs"
        as_nobody("mkdir", "-m", "0777", str(theirs))
        as_nobody("ln", "-s", str(victim), str(theirs / "jobs"))
        if plant == "link-to-their-dir":
            as_nobody("ln", "-s", str(theirs), str(shared / f"uniccl-{os.getuid()}"))
        else:
            as_nobody("mv", str(theirs), str(shared / f"uniccl-{os.getuid()}"))
        res = subprocess.run(
            [sys.executable, "-m", "uniccl", "run", "-n", "1", "/bin/true"],
            capture_output=True,
            text=True,
            timeout=60,
            env=dict(user_env(), TMPDIR=str(shared)),
        )
        assert res.returncode == 2, res.stdout + res.stderr
        assert "refusing to use it" in res.stderr and f"uniccl-{os.getuid()}" in res.stderr, res.stderr
        assert len(list(victim.iterdir())) == 25  # nothing of ours deleted
        assert all((d / "data").read_text() == "ours" for d in victim.iterdir())
    finally:
        shutil.rmtree(shared, ignore_errors=True)


@needs_root
def test_status_files_are_never_written_through_a_planted_link(tmp_path):
    shared = shared_tmp(tmp_path)
    precious = tmp_path / "precious"
    precious.write_text("ours")
    try:
        status = shared / "status"
        as_nobody("mkdir", "-m", "0777", str(status))
        for r in range(2):  # where a rank writes its status file, and the name it renames it to
            as_nobody("ln", "-s", str(precious), str(status / f"rank-{r}.json.tmp"))
        res = subprocess.run(
            [sys.executable, "-m", "uniccl", "run", "-n", "2", str(WORKERS / "group_seen.py"), "3"],
            capture_output=True,
            text=True,
            timeout=120,
            env=dict(user_env(), UNICCL_STATUS_DIR=str(status)),
        )
        assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
        assert precious.read_text() == "ours"
        for r in range(2):
            f = status / f"rank-{r}.json"
            assert not f.is_symlink() and json.loads(f.read_text())["rank"] == r
            assert f.stat().st_mode & 0o777 == 0o600
    finally:
        shutil.rmtree(shared, ignore_errors=True)


def test_the_launchers_own_status_directories_are_private():
    res = subprocess.run(
        [sys.executable, "-m", "uniccl", "run", "-n", "1", "/bin/true"],
        capture_output=True,
        text=True,
        timeout=60,
        env=user_env(),
    )
    assert res.returncode == 0, res.stderr
    import uniccl.observability.status as st

    root = Path(st.jobs_root())
    for d in (root.parent, root, max(root.iterdir(), key=lambda p: p.stat().st_mtime)):
        info = d.lstat()
        assert not d.is_symlink() and info.st_uid == os.geteuid() and info.st_mode & 0o777 == 0o700, (
            d,
            oct(info.st_mode),
        )
