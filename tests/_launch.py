"""Start N real processes under the MPI launcher of this environment, with a hard timeout."""

from __future__ import annotations

import functools
import json
import os
import queue
import shutil
import signal
import subprocess
import sys
import threading
import time
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


class Job:
    """``uniccl run -n N`` of a worker, its output lines read as they come."""

    def __init__(self, n: int, script: str, *args, env: dict | None = None, launcher: tuple = ()):
        cmd = [
            sys.executable,
            "-m",
            "uniccl",
            "run",
            "--no-prefix",
            *launcher,
            "-n",
            str(n),
            sys.executable,
            str(WORKERS / script),
            *map(str, args),
        ]
        self.proc = subprocess.Popen(
            cmd,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=dict(os.environ, PYTHONUNBUFFERED="1", UNICCL_TRANSPORT="tcp", **(env or {})),
            start_new_session=True,
        )
        self.lines: list[str] = []
        self._q: queue.Queue = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self):
        for line in self.proc.stdout:
            self.lines.append(line)
            self._q.put(line)
        self._q.put(None)

    def rows(self, want, timeout: float) -> list[dict]:
        """JSON rows read until ``want(rows)`` holds; AssertionError after ``timeout`` s or at EOF."""
        got, deadline = [], time.monotonic() + timeout
        while not want(got):
            try:
                line = self._q.get(timeout=max(0.01, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"no complete answer within {timeout} s; output:\n{self.output()}") from None
            if line is None:
                raise AssertionError(f"the job ended early; output:\n{self.output()}")
            if line.startswith("{"):
                got.append(json.loads(line))
        return got

    def output(self) -> str:
        return "".join(self.lines)[-6000:]

    def wait(self, timeout: float) -> int:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"the job did not end within {timeout} s; output:\n{self.output()}") from None

    def kill(self):
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc.wait()


def resume(pid) -> None:
    """SIGCONT the stopped rank, if it was stopped and still exists (the tests' clean-up)."""
    if pid is not None:
        try:
            os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:
            pass


def wait_stopped(pid: int) -> None:
    deadline = time.monotonic() + 10
    while True:
        with open(f"/proc/{pid}/stat") as f:
            if f.read().rsplit(")", 1)[1].split()[0] == "T":
                return
        assert time.monotonic() < deadline, "SIGSTOP did not take"
        time.sleep(0.01)
