"""``uniccl run``: the local launcher (no MPI at all), the MPI launcher, failures,
timeouts and signals; command lines of the mpi and slurm launchers."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from _launch import WORKERS, pid_alive, rank_counts

from uniccl.launch import agent as _agent
from uniccl.launch import run as _run

PROBE = str(WORKERS / "run_probe.py")


def uniccl_run(*args, timeout=60, env=None):
    cmd = [sys.executable, "-m", "uniccl", "run", *map(str, args)]
    t0 = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=dict(os.environ, **(env or {})))
    proc.seconds = time.monotonic() - t0
    return proc


def probes(stdout: str) -> list[dict]:
    rows = []
    for line in stdout.splitlines():
        _, _, rest = line.partition("] ")
        if rest.startswith("{"):
            rows.append(json.loads(rest))
    return sorted(rows, key=lambda r: r["rank"])


def _our_segments() -> list[str]:
    return sorted(p.name for p in Path("/dev/shm").glob("uniccl-*"))


@pytest.mark.parametrize("n", rank_counts([1, 2, 3, 4]))
def test_local_launcher_needs_no_mpi(n):
    res = uniccl_run("-n", n, PROBE, "ok")
    assert res.returncode == 0, res.stdout + res.stderr
    rows = probes(res.stdout)
    assert [r["rank"] for r in rows] == list(range(n)) and all(r["ok"] for r in rows)
    for r in rows:
        assert r["env"] == {
            "UNICCL_RANK": str(r["rank"]),
            "UNICCL_WORLD_SIZE": str(n),
            "UNICCL_LOCAL_RANK": str(r["rank"]),
            "UNICCL_LOCAL_SIZE": str(n),
            "UNICCL_NODE_RANK": "0",
        }
        assert r["mpi_loaded"] is False  # bootstrapped over TCP, data through shared memory
        assert r["p2p"] == "tcp" and r["transport"] == ("shm" if n > 1 else "local")
    for line in res.stdout.splitlines():
        assert line.startswith("["), line  # every line prefixed by its rank
    assert "launcher local" in res.stderr


@pytest.mark.parametrize("n", rank_counts([2, 3]))
def test_mpi_launcher(n):
    res = uniccl_run("--launcher", "mpi", "-n", n, PROBE, "ok", timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    rows = probes(res.stdout)
    assert [r["rank"] for r in rows] == list(range(n)) and all(r["ok"] for r in rows)
    for r in rows:
        assert r["p2p"] == "mpi" and r["mpi_loaded"] is True
        assert r["env"]["UNICCL_RANK"] == str(r["rank"]) and r["env"]["UNICCL_WORLD_SIZE"] == str(n)
        assert r["env"]["UNICCL_LOCAL_SIZE"] == str(n)


def test_first_failure_stops_the_job(tmp_path):
    res = uniccl_run("-n", 4, PROBE, "fail", tmp_path, timeout=60)
    assert res.returncode == 3, res.stdout + res.stderr
    assert res.seconds < 10
    assert f"rank 2 on host {socket.gethostname()}" in res.stderr and "exited with code 3" in res.stderr
    assert "rank 2: last words before exit 3" in res.stderr  # the report quotes its last lines
    pids = [int(p.read_text()) for p in tmp_path.glob("*.pid")]
    assert len(pids) == 4 and not any(pid_alive(p) for p in pids)


def test_kill_9_of_a_rank(tmp_path):
    before = _our_segments()
    res = uniccl_run("-n", 3, PROBE, "kill", tmp_path, timeout=60)
    assert res.returncode == 128 + signal.SIGKILL, res.stdout + res.stderr
    assert res.seconds < 10
    assert "rank 1 on host" in res.stderr and "killed by SIGKILL" in res.stderr
    pids = [int(p.read_text()) for p in tmp_path.glob("*.pid")]
    assert len(pids) == 3 and not any(pid_alive(p) for p in pids)
    assert _our_segments() == before


def test_timeout_and_log_dir(tmp_path):
    res = uniccl_run("-n", 2, "--timeout", 2, "--log-dir", tmp_path / "logs", PROBE, "hang", tmp_path, timeout=60)
    assert res.returncode == _run.TIMEOUT_STATUS, res.stdout + res.stderr
    assert "did not finish within 2 s" in res.stderr
    assert all((tmp_path / "logs" / f"rank-{r}.log").read_text() == "sleeping\n" for r in range(2))
    assert not any(pid_alive(int(p.read_text())) for p in tmp_path.glob("*.pid"))


def test_sigterm_is_forwarded(tmp_path):
    cmd = [sys.executable, "-m", "uniccl", "run", "-n", "2", PROBE, "hang", str(tmp_path)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 30
    while len(list(tmp_path.glob("*.pid"))) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.3)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert "stopped by SIGTERM" in err
    assert not any(pid_alive(int(p.read_text())) for p in tmp_path.glob("*.pid"))


def test_bad_arguments_are_named():
    res = uniccl_run("--env", "1BAD=x", PROBE, "ok")
    assert res.returncode == 2 and "--env" in res.stderr
    res = uniccl_run("--hosts", "a:1", "--hostfile", "f", PROBE, "ok")
    assert res.returncode == 2 and "--hostfile" in res.stderr
    res = uniccl_run("-n", 0, PROBE, "ok")
    assert res.returncode == 2 and "-n" in res.stderr
    res = uniccl_run("-n", 2, "/nonexistent/program")
    assert res.returncode == 127 and "could not start" in res.stderr


def test_mpi_command_lines():
    mpich = _run.mpi_command("/x/mpiexec", "mpich", 4, ["prog.py", "a b"], {"K": "v w"}, hosts="h1:2,h2:2")
    assert mpich[:3] == ["/x/mpiexec", "-hosts", "h1:2,h2:2"]
    assert ["-genv", "K", "v w"] == mpich[3:6] and mpich[mpich.index("-n") + 1] == "4"
    assert mpich[-6:] == ["-m", "uniccl._agent", "--rank-from-env", "--", "prog.py", "a b"]
    ompi = _run.mpi_command("/x/mpiexec", "openmpi", 2, ["prog"], {"K": "v"}, hostfile="hf")
    assert "--hostfile" in ompi and ompi[ompi.index("--hostfile") + 1] == "hf"
    assert ["-x", "K=v"] == ompi[ompi.index("-x") : ompi.index("-x") + 2]
    assert ("--allow-run-as-root" in ompi) == (os.geteuid() == 0)
    assert "--oversubscribe" not in ompi  # hosts given: slots are respected
    assert "--oversubscribe" in _run.mpi_command("/x/mpiexec", "openmpi", 8, ["p"], {})
    srun = _run.slurm_command(8, ["train.py", "--lr", "0.1"], True)
    assert srun[:4] == ["srun", "-n", "8", "--kill-on-bad-exit=1"] and srun[-3:] == ["train.py", "--lr", "0.1"]


@pytest.mark.parametrize(
    "env,expect",
    [
        ({"PMI_RANK": "3", "PMI_SIZE": "4", "MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "2"}, ("3", "4", "1", "2", "0")),
        (
            {
                "OMPI_COMM_WORLD_RANK": "5",
                "OMPI_COMM_WORLD_SIZE": "8",
                "OMPI_COMM_WORLD_LOCAL_RANK": "1",
                "OMPI_COMM_WORLD_LOCAL_SIZE": "4",
                "OMPI_COMM_WORLD_NODE_RANK": "1",
            },
            ("5", "8", "1", "4", "1"),
        ),
        (
            {
                "SLURM_PROCID": "6",
                "SLURM_NTASKS": "7",
                "SLURM_LOCALID": "0",
                "SLURM_TASKS_PER_NODE": "3(x2),1",
                "SLURM_NODEID": "2",
                "SLURM_NNODES": "3",
            },
            ("6", "7", "0", "1", "2"),
        ),
    ],
)
def test_rank_variables_from_other_launchers(env, expect):
    got = _agent.rank_env_from_launcher(env)
    assert (
        got["UNICCL_RANK"],
        got["UNICCL_WORLD_SIZE"],
        got["UNICCL_LOCAL_RANK"],
        got["UNICCL_LOCAL_SIZE"],
        got["UNICCL_NODE_RANK"],
    ) == expect


def test_survivors_of_a_dead_rank_leave_mpi_on_their_own(tmp_path):
    """A rank's peer died: it must not wait in MPI_Finalize for that peer at exit (MPICH's PMI
    barrier waits forever) but end MPI with MPI_Abort.  Run as users do: plain mpiexec, each rank
    under a job script, with hydra's clean-up off (``-disable-auto-cleanup``), so nothing but
    the ranks themselves can end the job (CI saw the launcher's test hang once when hydra did
    not clean up).  Before the fix the job hung until killed (732 s by hand)."""
    exe = _run.find_mpiexec()
    if _run.mpiexec_flavour(exe) != "mpich":
        pytest.skip("-disable-auto-cleanup is MPICH's hydra option")
    job = tmp_path / "job.sh"
    job.write_text(f'#!/bin/sh\n"{sys.executable}" "{PROBE}" kill "{tmp_path}"\n')
    cmd = [exe, "-disable-auto-cleanup", "-n", "3", "sh", str(job)]
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        for pid in [proc.pid] + [int(p.read_text()) for p in tmp_path.glob("*.pid")]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        out, _ = proc.communicate()
        pytest.fail("the survivors stayed in MPI_Finalize past 60 s:\n" + out[-3000:])
    assert proc.returncode != 0 and time.monotonic() - t0 < 30, out
    assert "MPI_Abort" in out and "died during all_reduce" in out, out
    pids = [int(p.read_text()) for p in tmp_path.glob("*.pid")]
    end = time.monotonic() + 10  # MPI_Abort's exits may trail mpiexec's by a moment
    while any(pid_alive(p) for p in pids) and time.monotonic() < end:
        time.sleep(0.1)
    assert len(pids) == 3 and not any(pid_alive(p) for p in pids), (pids, out)


def test_kill_9_under_the_mpi_launcher(tmp_path):
    """mpiexec is told by our wrapper; ranks die with their wrappers (PDEATHSIG) instead of
    hanging in MPI_Finalize, and the MPI library's segments of this job are removed."""
    before = set(os.listdir("/dev/shm"))
    res = uniccl_run("--launcher", "mpi", "-n", 3, PROBE, "kill", tmp_path, timeout=60)
    assert res.returncode != 0 and res.seconds < 10, res.stdout + res.stderr
    assert "rank 1 on host" in res.stderr and "killed by SIGKILL" in res.stderr
    time.sleep(0.5)
    pids = [int(p.read_text()) for p in tmp_path.glob("*.pid")]
    assert len(pids) == 3 and not any(pid_alive(p) for p in pids)
    assert set(os.listdir("/dev/shm")) - before == set()
