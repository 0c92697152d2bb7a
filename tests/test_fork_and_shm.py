"""Crashes that must not happen: a forked child's calls, abort, destroy or exit touching its
parent's communicator; a /dev/shm too small for the segment (a real small tmpfs, in a mount
namespace of its own) killing a rank with SIGBUS; abort() from a watchdog thread freeing the
shared-memory engine while the hung call's thread still reads it (SIGSEGV), under a CPU hog."""

import json
import os
import shutil
import subprocess
import sys

import pytest
from _launch import WORKERS


def uniccl_run(n, *argv, env=None, timeout=240):
    return subprocess.run(
        [sys.executable, "-m", "uniccl", "run", "--no-prefix", "-n", str(n), *argv],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=dict(os.environ, **(env or {})),
    )


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_a_forked_child_never_touches_its_parents_communicator(transport, tmp_path):
    status, trace = tmp_path / "status", tmp_path / "trace"
    res = uniccl_run(
        2,
        str(WORKERS / "fork_child.py"),
        str(tmp_path / "out"),
        env={"UNICCL_TRANSPORT": transport, "UNICCL_STATUS_DIR": str(status), "UNICCL_TRACE": str(trace)},
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    rows = sorted((json.loads(x) for x in res.stdout.splitlines() if x.startswith("{")), key=lambda r: r["rank"])
    assert [r["rank"] for r in rows] == [0, 1], res.stdout
    for r in rows:
        assert r["ok"] and r["child_status"] == 0 and r["transport"] == transport, r
        child = json.loads((tmp_path / f"out-child-{r['rank']}.json").read_text())
        assert child == {
            "all_reduce": "InvalidUsage",
            "abort": "InvalidUsage",
            "destroy": "InvalidUsage",
            "barrier": "InvalidUsage",
        }, child
        doc = json.loads((status / f"rank-{r['rank']}.json").read_text())
        assert doc["pid"] != 0 and doc["comms"][0]["calls"] >= 22, doc  # the parent's, not the child's
        meta = json.loads((trace / f"uniccl-trace-r{r['rank']}.json").read_text())["otherData"]
        assert meta["pid"] == doc["pid"], meta  # the child's exit did not overwrite the parent's trace


def _can_make_a_tmpfs() -> bool:
    if os.geteuid() != 0 or not shutil.which("unshare"):
        return False
    probe = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", "mount -t tmpfs -o size=1M tmpfs /dev/shm"],
        capture_output=True,
    )
    return probe.returncode == 0


@pytest.mark.skipif(not _can_make_a_tmpfs(), reason="needs root and unshare to mount a private small /dev/shm")
def test_a_small_dev_shm_is_a_typed_error_on_every_rank():
    # 2 ranks need 2 x 2 slots of 1 MiB and a little more; this /dev/shm has 3 MiB
    cmd = (
        f"mount -t tmpfs -o size=3M tmpfs /dev/shm && exec {sys.executable} -m uniccl run -n 2 "
        f"{WORKERS / 'big_all_reduce.py'}"
    )
    res = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", cmd], capture_output=True, text=True, timeout=120
    )
    out = res.stdout + res.stderr
    assert res.returncode != 0, out[-3000:]
    assert "SIGBUS" not in out and "killed by" not in out, out[-3000:]
    for rank in (0, 1):  # each rank names /dev/shm, its free bytes and the bytes needed
        assert f"[{rank}] uniccl.InternalError: [init, rank {rank}] shared memory: /dev/shm has " in out, out[-3000:]
    assert "bytes free, the shared-memory segment needs " in out, out[-3000:]


def test_abort_from_a_watchdog_never_crashes_under_load():
    """200 rounds of the race (scripts can run more: tests/workers/abort_race.py ROUNDS) with
    both cores busy; before the fix rank 0 died of SIGSEGV within the first rounds."""
    hogs = [
        subprocess.Popen([sys.executable, "-c", "import time\nt = time.time() + 120\nwhile time.time() < t: pass"])
        for _ in range(2)
    ]
    try:
        res = uniccl_run(2, str(WORKERS / "abort_race.py"), "200", timeout=300)
    finally:
        for h in hogs:
            h.kill()
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "rounds 200 ok" in res.stdout, res.stdout[-2000:]
