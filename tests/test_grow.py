"""``comm.grow(new_size, uid)`` (NCCL's ncclCommGrow): a job of 2 ranks under ``uniccl run``
grows to 3 with a joiner on an emulated vendor platform and to 4 with a cpu joiner, each joiner
a plain ``python`` process started with the unique id (tests/workers/grow.py); every step's
sum is checked against numpy, on the new communicator and the old.  Ranks that pass different
sizes get InvalidUsage naming both values."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent / "conformance"))
import _platform
from _launch import WORKERS

SCRIPT = str(WORKERS / "grow.py")


def clean_env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("UNICCL_")}
    return dict(env, **extra)


def job(tmp_path, *args):
    cmd = [sys.executable, "-m", "uniccl", "run", "--no-prefix", "-n", "2", "--platforms", "cpu,cpu", SCRIPT]
    return subprocess.Popen(
        [*cmd, str(tmp_path), *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=clean_env()
    )


def rows_of(*outputs):
    return sorted(
        (json.loads(x) for out in outputs for x in out.splitlines() if x.startswith("{")), key=lambda r: r["rank"]
    )


def test_grow_2_3_4_with_a_joiner_of_another_platform(tmp_path):
    vendor = "nvidia"
    joiners = []
    main = job(tmp_path)
    try:
        for rank, platform, env in ((2, vendor, _platform.platform_env(vendor)), (3, "cpu", {})):
            deadline = time.monotonic() + 60
            while not (tmp_path / f"uid-{rank + 1}").exists() and main.poll() is None and time.monotonic() < deadline:
                time.sleep(0.02)
            env = clean_env(**{k: v for k, v in env.items() if k != "UNICCL_PLATFORM"})
            cmd = [sys.executable, SCRIPT, str(tmp_path), "--join", str(rank), "--platform", platform]
            joiners.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env))
        outs = [p.communicate(timeout=120) for p in [main, *joiners]]
    finally:
        for p in [main, *joiners]:
            p.kill()
    codes = [p.returncode for p in [main, *joiners]]
    text = "\n".join(o + e for o, e in outs)
    assert codes == [0, 0, 0], text[-4000:]
    rows = rows_of(*(o for o, _ in outs))
    assert [r["rank"] for r in rows] == [0, 1, 2, 3], text[-4000:]
    want = ["cpu", "cpu", vendor, "cpu"]
    for r in rows:
        assert r["platform"] == want[r["rank"]], r
        assert r["sizes"] == list(range(max(2, r["rank"] + 1), 5)), r
        assert r["platforms"] == want, r


def test_ranks_that_pass_different_sizes_are_told_both(tmp_path):
    main = job(tmp_path, "--mode", "mismatch")
    out, err = main.communicate(timeout=120)
    assert main.returncode == 0, out[-3000:] + err[-3000:]
    rows = rows_of(out)
    assert len(rows) == 2
    for r in rows:
        assert "the ranks passed different new_size: rank 0 passed 3; rank 1 passed 4" in r["error"], r


def test_a_joiner_with_another_size_fails_every_rank_at_once():
    """The rendezvous of a unique id: one rank passing another size ends it for every rank
    that joined (InvalidUsage naming both sizes), instead of leaving them to time out."""
    import threading

    import uniccl

    uid = uniccl.get_unique_id()
    errors = {}

    def join(rank, size):
        try:
            uniccl.Communicator(uid, rank, size, timeout=30)
        except uniccl.InvalidUsage as exc:
            errors[rank] = (str(exc), time.monotonic() - t0)

    t0 = time.monotonic()
    first = threading.Thread(target=join, args=(0, 3))
    first.start()
    time.sleep(0.3)  # rank 0 has joined with size 3
    second = threading.Thread(target=join, args=(1, 2))
    second.start()
    first.join(60)
    second.join(60)
    assert sorted(errors) == [0, 1], errors
    for text, took in errors.values():
        assert "the ranks passed different sizes: rank 1 passed 2, rank 0 passed 3" in text and took < 10, errors
