"""Ctrl-C must wake a rank's main thread: every thread uniccl starts (TCP readers and senders,
the async executor, the status writer, the flight recorder's signal watcher, the rendezvous,
the cpu plugin's stream workers) blocks the signals Python handles in the main thread, so the
kernel never hands SIGINT to one of them and leaves the main thread asleep (seen in full-suite
runs before: a rank in time.sleep ignored Ctrl-C until the launcher's SIGTERM).

A real ``uniccl run -n 2`` job (TCP mesh between the ranks), with the user's UNICCL_TRACE and
UNICCL_STATUS_DIR so that those threads exist too."""

import json
import os
import subprocess
import sys
from pathlib import Path

WORKER = Path(__file__).resolve().parent / "workers" / "thread_signals.py"


def test_every_uniccl_thread_blocks_the_main_threads_signals(tmp_path):
    env = dict(os.environ, UNICCL_TRACE=str(tmp_path / "trace"), UNICCL_STATUS_DIR=str(tmp_path / "status"))
    res = subprocess.run(
        [sys.executable, "-m", "uniccl", "run", "-n", "2", sys.executable, str(WORKER), str(tmp_path)],
        capture_output=True, text=True, env=env, timeout=240,
    )  # fmt: skip
    assert res.returncode == 0, res.stdout + res.stderr
    for rank in range(2):
        rows = json.loads((tmp_path / f"{rank}.json").read_text())
        names = {r["name"] for r in rows}
        assert any(n.startswith("uniccl-tcp-r") for n in names), names  # the threads under test exist
        assert "uniccl-signals" in names and "uniccl-status" in names, names
        assert "cpu-stream" in names, names  # the cpu stream's worker (a C thread)
        # (other native threads are the libraries' own, numpy's BLAS pool: not uniccl's to set)
        unblocked = [r for r in rows if r["name"] != "other native" and not (r["SIGINT"] and r["SIGTERM"])]
        assert not unblocked, f"rank {rank}: threads that could take Ctrl-C from the main thread: {unblocked}"
