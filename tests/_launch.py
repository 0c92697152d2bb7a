"""Start N real processes under the MPI launcher of this environment, with a hard timeout."""

from __future__ import annotations

import functools
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

WORKERS = Path(__file__).parent / "workers"


def rank_counts(default: list[int]) -> list[int]:
    """Rank counts to test: ``default``, or those of UNICCL_TEST_RANKS that it contains
    (the Open MPI run uses UNICCL_TEST_RANKS=2)."""
    only = os.environ.get("UNICCL_TEST_RANKS")
    if not only:
        return default
    return [n for n in default if str(n) in only.split(",")]


@functools.cache
def mpiexec() -> list[str]:
    """The mpiexec next to this interpreter (the venv's MPI wheel) or on PATH, with the
    flags its flavour needs to oversubscribe cores and run as root."""
    exe = os.environ.get("UNICCL_TEST_MPIEXEC") or str(Path(sys.executable).parent / "mpiexec")
    if not Path(exe).exists():
        exe = shutil.which("mpiexec") or "mpiexec"
    version = subprocess.run([exe, "--version"], capture_output=True, text=True).stdout
    if "Open MPI" in version or "OpenRTE" in version or "prte" in version.lower():
        flags = ["--oversubscribe"] + (["--allow-run-as-root"] if os.geteuid() == 0 else [])
        return [exe, *flags]
    return [exe]


#: The transports every multi-rank suite runs on, each forced (so a build without the
#: engine fails instead of silently testing another transport twice).  shm and mpi run
#: under mpiexec; tcp under ``uniccl run``'s local launcher, with no MPI at all.
TRANSPORTS = {
    "shm": {"UNICCL_TRANSPORT": "shm"},
    "mpi": {"UNICCL_TRANSPORT": "mpi"},
    "tcp": {"UNICCL_TRANSPORT": "tcp"},
}


def launcher_argv(n: int, env: dict | None) -> list[str]:
    """mpiexec, or ``uniccl run`` for the TCP transport."""
    if (env or {}).get("UNICCL_TRANSPORT") == "tcp":
        return [sys.executable, "-m", "uniccl", "run", "--no-prefix", "-n", str(n)]
    return [*mpiexec(), "-n", str(n)]


def rank_transports(default: list[int]) -> list[tuple[int, str]]:
    """(nranks, transport) pairs to test; one rank moves no data, so it runs once.
    UNICCL_TEST_TRANSPORTS=shm,mpi keeps only those (the Open MPI run tests MPI)."""
    only = os.environ.get("UNICCL_TEST_TRANSPORTS")
    names = [t for t in TRANSPORTS if not only or t in only.split(",")]
    # TCP (Python) is the slowest: 2 and 3 ranks cover its ring and tree paths
    return [
        (n, t) for n in rank_counts(default) for t in names if (n > 1 or t == names[0]) and not (t == "tcp" and n > 3)
    ]


def run_ranks(n: int, script: str, *args: str, timeout: float = 120, env: dict | None = None):
    """Run ``workers/<script>`` on ``n`` ranks; return the CompletedProcess (stdout+stderr
    in .stdout).  On timeout the whole process group is killed and AssertionError raised."""
    cmd = [*launcher_argv(n, env), sys.executable, str(WORKERS / script), *map(str, args)]
    full_env = dict(os.environ, PYTHONUNBUFFERED="1", **(env or {}))
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=full_env, start_new_session=True
    )
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        raise AssertionError(f"{' '.join(cmd)} did not finish within {timeout} s; output:\n{out[-4000:]}")
    return subprocess.CompletedProcess(cmd, proc.returncode, out, None)


def check_ranks(n: int, script: str, *args: str, timeout: float = 120, env: dict | None = None) -> str:
    res = run_ranks(n, script, *args, timeout=timeout, env=env)
    assert res.returncode == 0, f"exit {res.returncode}:\n{res.stdout[-6000:]}"
    return res.stdout


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie counts as dead)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False
