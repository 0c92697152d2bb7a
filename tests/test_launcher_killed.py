"""A launcher killed by SIGKILL (no cleanup of its own can run) leaves nothing running: its
ranks die with it (PR_SET_PDEATHSIG), and so do the processes the ranks started (the
reaper SIGKILLs the ranks' process groups).  Before, the ranks' children lived on."""

import os
import re
import signal
import subprocess
import sys
import time

from _launch import WORKERS, pid_alive


def test_sigkill_to_the_launcher_ends_the_ranks_and_their_children():
    launcher = subprocess.Popen(
        [sys.executable, "-m", "uniccl", "run", "--no-prefix", "-n", "2", str(WORKERS / "spawn_child.py")],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    pids = []
    try:
        deadline = time.monotonic() + 60
        while len(pids) < 4 and time.monotonic() < deadline:
            line = launcher.stdout.readline()
            m = re.search(r"pid (\d+) child (\d+)", line)
            if m:
                pids += [int(m.group(1)), int(m.group(2))]
        assert len(pids) == 4, pids
        assert all(pid_alive(p) for p in pids)
        os.kill(launcher.pid, signal.SIGKILL)
        launcher.wait(10)
        end = time.monotonic() + 10
        while any(pid_alive(p) for p in pids) and time.monotonic() < end:
            time.sleep(0.05)
        assert not [p for p in pids if pid_alive(p)], [(p, pid_alive(p)) for p in pids]
    finally:
        for p in pids:
            try:
                os.kill(p, signal.SIGKILL)
            except ProcessLookupError:
                pass
