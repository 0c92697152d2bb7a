"""A rank that starts a child process of its own (``sleep``) and prints both pids, then waits
(under ``uniccl run``; the test kills the launcher with SIGKILL)."""

import os
import subprocess
import time

child = subprocess.Popen(["sleep", "600"])
print(f"rank {os.environ.get('RANK')} pid {os.getpid()} child {child.pid}", flush=True)
time.sleep(600)
