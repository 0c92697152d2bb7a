"""Timeouts as documented: ``timeout=`` of a send/recv inside ``uniccl.group()`` bounds its wait
(it waited 14 s for a 2 s limit), raising ``uniccl.Timeout`` that names the call and the peer."""

import json
import os
import subprocess
import sys

from _launch import WORKERS


def test_group_recv_obeys_its_timeout():
    limit = 2.0
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "uniccl",
            "run",
            "--no-prefix",
            "-n",
            "2",
            str(WORKERS / "group_timeout.py"),
            str(limit),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ),
    )
    rows = [json.loads(x) for x in res.stdout.splitlines() if x.startswith("{")]
    assert rows, res.stdout[-3000:] + res.stderr[-3000:]
    got = rows[0]
    assert got["type"] == "Timeout", got
    assert "recv (from rank 1)" in got["message"] and "rank 1" in got["message"], got
    assert limit <= got["seconds"] < limit + 2, got  # within timeout + 2 s, as every call
