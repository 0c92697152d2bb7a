"""``comm.revoke(reason)`` (NCCL's ncclCommRevoke): rank 0's watchdog thread revokes the
communicator while the others are in an all_reduce and one rank is late (tests/workers/revoke.py,
under ``uniccl run``); every rank's call ends with ``uniccl.Revoked`` naming rank 0 and the
reason within 1 s, later calls at once, and shrink() and split() of the revoked communicator
still give working communicators (their sums checked against numpy)."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from _launch import WORKERS

import uniccl


def uniccl_run(n, transport):
    env = {k: v for k, v in os.environ.items() if not k.startswith("UNICCL_")}
    if transport == "tcp":
        env["UNICCL_TRANSPORT"] = "tcp"  # (a user's switch: shared memory is the default on one host)
    cmd = [sys.executable, "-m", "uniccl", "run", "--no-prefix", "-n", str(n), str(WORKERS / "revoke.py")]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)


@pytest.mark.parametrize("transport", ["shm", "tcp"])
@pytest.mark.parametrize("n", [2, 4])
def test_revoke_from_a_watchdog_thread_ends_every_call(n, transport):
    res = uniccl_run(n, transport)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    check_revoked(res.stdout, n)


def check_revoked(stdout: str, n: int) -> None:
    """What tests/workers/revoke.py's ``n`` ranks printed says every call ended as it should
    (test_ulfm.py runs the same worker under mpiexec)."""
    rows = sorted((json.loads(x) for x in stdout.splitlines() if x.startswith("{")), key=lambda r: r["rank"])
    assert [r["rank"] for r in rows] == list(range(n)), stdout
    revoked_at = rows[0]["t_revoke"]
    for r in rows:
        assert r["remote_rank"] == 0, r
        for text in (r["text"], r["again_text"]):
            assert "rank 0 revoked the communicator: watchdog: step 3 took too long" in text, r
        if r["rank"] < n - 1:  # in the call when it was revoked
            assert r["waited"] > 0.25 and r["t_raised"] - revoked_at < 1.0, r
        else:  # the late rank: its call raised at once
            assert r["t_raised"] > revoked_at and r["waited"] < 0.5, r
        assert r["again"] < 0.5, r
        assert r["shrunk_size"] == n and r["shrunk_ok"], r
        assert r["split_size"] == len(range(r["rank"] % 2, n, 2)) and r["split_ok"], r


def test_revoke_on_one_rank_alone():
    """A communicator of one rank: revoked, its calls raise; it still splits and destroys; revoke
    is idempotent, and a no-op once destroyed."""
    comm = uniccl.Communicator(uniccl.get_unique_id(), 0, 1)
    x = np.ones(8)
    comm.all_reduce(x)
    comm.all_reduce(x)  # (a learnt shape: the compiled path)
    comm.revoke("checkpoint is corrupt")
    comm.revoke("again")  # the first reason stands
    for call in (lambda: comm.all_reduce(x), comm.barrier, lambda: comm.all_reduce(x, async_op=True).wait()):
        with pytest.raises(uniccl.Revoked, match="rank 0 revoked the communicator: checkpoint is corrupt") as info:
            call()
        assert info.value.remote_rank == 0 and info.value.rank == 0
    assert isinstance(info.value, uniccl.UnicclError)
    sub = comm.split(0)
    y = np.arange(4.0)
    sub.all_reduce(y)
    np.testing.assert_array_equal(y, np.arange(4.0))
    sub.destroy()
    comm.destroy()
    comm.revoke("after destroy")  # nothing to revoke
    with pytest.raises(uniccl.InvalidUsage, match="destroyed"):
        comm.all_reduce(x)
