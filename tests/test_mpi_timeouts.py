"""MPI waits obey the timeout (MPI has no timed wait; uniccl polls against the deadline): with
one rank stopped by a real SIGSTOP, every other rank's collective or recv over MPI raises
uniccl.Timeout within timeout + 2 s, naming the stopped rank.  Before, they waited forever."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from _launch import WORKERS, mpiexec


@pytest.mark.parametrize(
    "op,nbytes",
    [("all_reduce", 8), ("all_reduce", 64 << 20), ("broadcast", 128 << 20), ("all_gather", 16 << 20), ("recv", 8)],
)
def test_a_stopped_peer_is_a_timeout_naming_it_over_mpi(op, nbytes, tmp_path):
    n = 3
    out = tmp_path / "out"
    proc = subprocess.Popen(
        [*mpiexec(), "-n", str(n), sys.executable, str(WORKERS / "mpi_stopped_peer.py"), op, str(nbytes), str(out)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=dict(os.environ, UNICCL_TRANSPORT="mpi"),
        start_new_session=True,
    )
    files = [tmp_path / f"out-{r}.json" for r in range(n)]
    stopped = None
    deadline = time.monotonic() + 90
    try:
        while not all(f.exists() for f in files) and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.05)
    finally:
        (tmp_path / "out-done").touch()
        if files[-1].exists():
            stopped = json.loads(files[-1].read_text())["stopping"]
            try:
                os.kill(stopped, signal.SIGCONT)
            except ProcessLookupError:
                pass
        try:
            text = proc.communicate(timeout=30)[0]
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            text = proc.communicate()[0]
    assert stopped and all(f.exists() for f in files), text[-3000:]
    for f in files[:-1]:
        row = json.loads(f.read_text())
        assert row["error"] == "Timeout", row
        assert row["seconds"] < 3 + 2, row
        assert f"rank {n - 1}" in row["message"] and "stopped" in row["message"], row
