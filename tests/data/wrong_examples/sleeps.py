"""An example that never finishes in time: every rank sleeps, so `uniccl examples -t T`
must report TIMEOUT and kill it.  With SLEEPS_PID_DIR set each rank first writes its
process id there, so a test can check that nothing was left running."""
import os
import sys
import time

import uniccl

comm = uniccl.init()
piddir = os.environ.get("SLEEPS_PID_DIR")
if piddir:
    with open(os.path.join(piddir, f"rank{comm.rank}.pid"), "w") as f:
        f.write(str(os.getpid()))
print(f"rank {comm.rank}/{comm.size}: sleeping", flush=True)
time.sleep(600)
sys.exit(1)
