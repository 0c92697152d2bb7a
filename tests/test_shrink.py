"""After a rank dies, the survivors shrink to a working communicator (4 ranks, one killed
mid-all_reduce, over shared memory and over TCP)."""

import json
import os
import subprocess
import sys

import pytest
from _launch import WORKERS

import uniccl


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_survivors_shrink_and_go_on(transport):
    uid = uniccl.get_unique_id()
    procs = []
    for r in range(4):
        env = dict(
            os.environ,
            UNICCL_TEST_UID=bytes(uid).hex(),
            UNICCL_TEST_RANK=str(r),
            UNICCL_TEST_SIZE="4",
            UNICCL_BOOTSTRAP="tcp",
            UNICCL_TRANSPORT=transport,
            UNICCL_FAULT_INJECT="kill_at=5,kill_rank=2",
        )
        procs.append(
            subprocess.Popen(
                [sys.executable, str(WORKERS / "shrink.py")],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    rows = []
    done = [p.communicate(timeout=90) for p in procs]
    codes = [p.returncode for p in procs]
    # every rank's story when one failed (one rank's error is often another's consequence)
    assert codes == [0, 0, -9, 0], "\n".join(
        f"rank {r} (exit {c}): {err[-1500:]}" for r, ((_, err), c) in enumerate(zip(done, codes))
    )
    for out, _ in done:
        rows += [json.loads(x) for x in out.splitlines() if x.startswith("{")]
    rows.sort(key=lambda x: x["rank"])
    assert [r["rank"] for r in rows] == [0, 1, 3]
    for row, new_rank in zip(rows, (0, 1, 2)):
        assert row["error"] == "RemoteError" and row["remote_rank"] == 2, row
        assert row["new_size"] == 3 and row["new_rank"] == new_rank and row["sum"] == 6.0, row
        assert row["shrink_s"] < 5 and row["transport"] == transport, row
