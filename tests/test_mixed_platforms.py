"""One communicator over ranks on different platforms (cpu and emulated vendors): every
collective matches numpy, no vendor library is used across vendors, and bad input on one
rank is a typed error on every rank."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent / "conformance"))
import _platform
from _launch import WORKERS

COLLECTIVES = Path(__file__).parent / "conformance" / "workers" / "collectives.py"


def mixed_env() -> dict:
    env = {}
    for name in _platform.EMULATED:
        env.update(_platform.platform_env(name))
    env.pop("UNICCL_PLATFORM")
    return env


def run(platforms, script, *args, timeout=240):
    cmd = [
        sys.executable,
        "-m",
        "uniccl",
        "run",
        "--no-prefix",
        "-x",
        "UNICCL_DEBUG=INFO",
        "-n",
        str(len(platforms)),
        "--platforms",
        ",".join(platforms),
        "--timeout",
        str(timeout - 20),
        str(script),
        *args,
    ]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=dict(os.environ, **mixed_env()))


@pytest.mark.parametrize(
    "platforms",
    [
        ("nvidia", "nvidia", "cpu", "iluvatar"),
        ("cpu", "iluvatar", "nvidia"),
        ("metax", "cpu", "moore", "moore"),
        ("metax", "metax", "cpu", "cambricon"),
        ("cambricon", "moore", "cpu", "cambricon"),
    ],
)
def test_every_collective_across_vendors(platforms):
    res = run(platforms, COLLECTIVES)
    rows = sorted((json.loads(x) for x in res.stdout.splitlines() if x.startswith("{")), key=lambda r: r["rank"])
    assert res.returncode == 0 and len(rows) == len(platforms), res.stdout[-2000:] + res.stderr[-2000:]
    for row, platform in zip(rows, platforms):
        assert row["platform"] == platform and row["cases"] > 100 and not row["failures"], row
        if platform != "cpu":
            # no library spans the vendors (point to point never goes native across them); where
            # two ranks share one, all_reduce is hierarchical and runs it inside their group
            assert row["nccl_p2p_calls"] == 0, row
            if platforms.count(platform) > 1:
                assert row["nccl_all_reduce_calls"] > 0, row
    if len(set(platforms)) < len(platforms):
        assert "all_reduce is hierarchical" in res.stdout  # the ranks' UNICCL_DEBUG=INFO lines


@pytest.mark.parametrize("platforms", [("nvidia", "cpu", "iluvatar"), ("cambricon", "cpu", "metax")])
def test_bad_input_on_one_rank_of_a_mixed_job(platforms):
    res = run(platforms, WORKERS / "bad_input.py", timeout=180)
    rows = [json.loads(x) for x in res.stdout.splitlines() if x.startswith("{")]
    assert res.returncode == 0 and rows, res.stdout[-3000:] + res.stderr[-3000:]
    assert all(r["ok"] for r in rows), [r for r in rows if not r["ok"]][:3]


def test_info_all_ranks_shows_each_ranks_platform():
    platforms = ("nvidia", "cpu", "iluvatar")
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "uniccl",
            "run",
            "--no-prefix",
            "-n",
            "3",
            "--platforms",
            ",".join(platforms),
            "--",
            sys.executable,
            "-m",
            "uniccl",
            "info",
            "--all-ranks",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ, **mixed_env()),
    )
    assert res.returncode == 0, res.stdout + res.stderr
    rows = json.loads(res.stdout[res.stdout.index("[") :])
    assert [(r["rank"], r["platform"]) for r in rows] == list(enumerate(platforms))
    assert all(r["device_name"] for r in rows)
