"""A 64-rank job over TCP on this machine (issue 24): with links made on first use, each rank
holds sockets only for the peers its calls (all_reduce, broadcast, barrier) and the tree-shaped
control exchanges use (at most 2 log2 n), not one per rank of the job, read by at most 4 reader
threads (epoll loops), not one per peer; the values are right."""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

WORKER = str(Path(__file__).parent / "workers" / "lazy_links.py")


@pytest.mark.slow
def test_64_ranks_over_tcp_hold_about_2_log2_n_links_and_4_readers_each():
    n = 64
    env = {k: v for k, v in os.environ.items() if not k.startswith("UNICCL_")}
    env["UNICCL_TRANSPORT"] = "tcp"  # (one host: shared memory otherwise)
    cmd = [sys.executable, "-m", "uniccl", "run", "--no-prefix", "-n", str(n), WORKER]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=400, env=env)
    rows = [json.loads(x) for x in res.stdout.splitlines() if x.startswith("{")]
    assert res.returncode == 0 and len(rows) == n, res.stdout[-3000:] + res.stderr[-3000:]
    bound = 2 * math.ceil(math.log2(n))  # the target (12), against 63 when every pair connected
    for row in rows:
        assert row["ok"] and row["transport"] == "tcp", row
        assert 1 <= row["tcp_established"] <= bound, row  # (the kernel's count: no other connection stays)
        assert row["links"] <= bound, row
        assert 1 <= row["readers"] <= 4, row  # READERS in transport/tcp/poller.py (one per peer before)
