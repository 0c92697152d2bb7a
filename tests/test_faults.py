"""Faults: timeouts that name the missing rank and the call on every rank, the flight
recorder and ``uniccl doctor``, and ``abort()`` that never waits for anyone — over the
shared-memory engine and over TCP (3 real processes under ``uniccl run``)."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from _launch import WORKERS

import uniccl

FAULTS = str(WORKERS / "faults.py")


def run(scenario, transport, tmp_path, timeout=60):
    env = dict(os.environ, UNICCL_TRANSPORT=transport, UNICCL_DUMP_DIR=str(tmp_path / "dumps"))
    res = subprocess.run(
        [sys.executable, "-m", "uniccl", "run", "--no-prefix", "-n", "3", FAULTS, scenario],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )
    rows = sorted((json.loads(x) for x in res.stdout.splitlines() if x.startswith("{")), key=lambda r: r["rank"])
    assert len(rows) == 3, res.stdout[-3000:] + res.stderr[-3000:]
    return rows, res


def shm_segments():
    return sorted(f for f in os.listdir("/dev/shm") if f.startswith("uniccl-"))


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_timeout_names_the_missing_rank_and_the_call_on_every_rank(transport, tmp_path):
    rows, _ = run("skip_return", transport, tmp_path)
    for row in rows:
        assert row["error"] == "Timeout" and row["missing"] == [2] and row["seq"] == 1, row
        assert "call #1" in row["message"] and "rank 2" in row["message"], row
    for row in rows[:2]:  # they waited 2 s (timeout=2), not the default 120
        assert row["message"].startswith("[all_reduce, rank") and row["t"] < 4, row
    assert rows[2]["message"].startswith("[barrier, rank 2]")  # the late rank learns it at its next call


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_doctor_names_the_rank_that_skipped_and_the_operation(transport, tmp_path):
    rows, _ = run("skip_exit", transport, tmp_path)
    assert [r.get("error") for r in rows] == ["Timeout", "Timeout", None]
    dumps = tmp_path / "dumps"
    assert sorted(os.listdir(dumps)) == ["uniccl-flight-world-r0.json", "uniccl-flight-world-r1.json"]
    res = subprocess.run(
        [sys.executable, "-m", "uniccl", "doctor", "--json", str(dumps)], capture_output=True, text=True, timeout=60
    )
    assert res.returncode == 1, res.stderr  # a verdict was found
    (v,) = json.loads(res.stdout)["verdicts"]
    assert v["kind"] == "stuck-outside" and v["seq"] == 1 and v["ranks"] == [2], v
    assert v["detail"]["waited_on_by"] == [0, 1], v
    text = subprocess.run(
        [sys.executable, "-m", "uniccl", "doctor", str(dumps)], capture_output=True, text=True, timeout=60
    ).stdout
    assert "rank 2 never made call #1 all_reduce(float32, 1000) that ranks 0, 1 wait in" in text, text
    site = text.split("rank 0: last completed call #0 all_reduce(float32, 1000) at ")[1].split("\n")[0]
    assert site.endswith("(<module>)") and "faults.py:" in site, text


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_abort_returns_at_once_and_frees_every_peer(transport, tmp_path):
    before = shm_segments()
    rows, _ = run("abort_hung", transport, tmp_path)
    r0, r1, r2 = rows
    assert r0["abort_s"] < 5 and r0["error"] == "InvalidUsage" and "aborted on rank 0" in r0["message"], r0
    assert r0["t"] < 3 and r0["after"] == "InvalidUsage" and r0["usable"], r0
    assert r1["error"] == "RemoteError" and r1["remote"] == 0 and "watchdog" in r1["message"], r1
    assert r1["t"] < 3, r1  # freed by the abort, not by rank 2 coming back at 4 s
    assert r2["error"] == "RemoteError" and r2["remote"] == 0, r2
    ours = {str(row["pid"]) for row in rows}  # segments are named uniccl-<creator pid>-<random>
    assert [f for f in set(shm_segments()) - set(before) if f.split("-")[1] in ours] == []


def _single():
    from uniccl.bootstrap.rendezvous import get_unique_id
    from uniccl.transport.tcp import Mesh, TCPTransport, derive_context

    return TCPTransport(Mesh(get_unique_id(30), 0, 1, 30), [0], derive_context(7, 0, 0))


def test_flight_recorder_keeps_the_last_calls_with_their_source_lines(tmp_path, monkeypatch):
    monkeypatch.setenv("UNICCL_FLIGHT_RECORDER", "3")
    with uniccl.Communicator._over(_single(), "cpu") as comm:
        x = np.arange(8, dtype=np.float64)
        for _ in range(2):
            comm.all_reduce(x)
        comm.broadcast(x, root=0)
        comm.all_gather(x, np.zeros(8))
        snap = comm.flight_recorder()
        assert [(o["seq"], o["op"], o["state"]) for o in snap["ops"]] == [
            (1, "all_reduce", "completed"),
            (2, "broadcast", "completed"),
            (3, "all_gather", "completed"),
        ]
        op = snap["ops"][1]
        assert op["dtype"] == "float64" and op["count"] == 8 and op["root"] == 0
        assert op["site"].startswith(__file__) and "test_flight_recorder" in op["site"]
        assert op["t_enqueued"] <= op["t_started"] <= op["t_completed"]
        path = comm.dump_flight_recorder(str(tmp_path))
        assert json.loads(open(path).read())["ops"][-1]["op"] == "all_gather"
        with pytest.raises(uniccl.InvalidArgument):
            comm.all_reduce(x, np.zeros(3))
        assert comm.flight_recorder()["ops"][-1]["state"] == "failed"
    monkeypatch.setenv("UNICCL_FLIGHT_RECORDER", "0")
    with uniccl.Communicator._over(_single(), "cpu") as comm:
        comm.all_reduce(np.ones(4))
        assert comm.flight_recorder()["ops"] == []


def test_timeouts_are_checked(monkeypatch):
    with uniccl.Communicator._over(_single(), "cpu") as comm:
        assert comm.timeout == 120.0  # the documented default
        with pytest.raises(uniccl.InvalidArgument) as info:
            comm.all_reduce(np.ones(4), timeout="soon")
        assert info.value.argument == "timeout" and info.value.op == "all_reduce"
        comm.all_reduce(np.ones(4), timeout=0.5)  # a number is fine
    monkeypatch.setenv("UNICCL_TIMEOUT", "later")
    with pytest.raises(uniccl.InvalidArgument, match="UNICCL_TIMEOUT"):
        uniccl.Communicator._over(_single(), "cpu")
    monkeypatch.setenv("UNICCL_TIMEOUT", "7.5")
    with uniccl.Communicator._over(_single(), "cpu") as comm:
        assert comm.timeout == 7.5
