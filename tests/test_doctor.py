"""``uniccl doctor``'s verdicts, each from a job that really goes wrong that way (tests/workers/doctor.py
under ``uniccl run``, with the user's UNICCL_DUMP_DIR or UNICCL_TRACE): a killed rank (dead), a
mismatched call, two ranks receiving from each other (p2p-deadlock), a rank stopped by SIGSTOP
(stuck-outside, post mortem and live), messages held on every link (stuck-inside), a rank made
late to every call (straggler), a rate-limited veth between namespace hosts (slow-link), flipped
bits (integrity); and a clean job (no verdict, exit 0)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from _launch import WORKERS
from _netns import netns_cluster  # noqa: F401  (the fixture)

WORKER = str(WORKERS / "doctor.py")


def _env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("UNICCL_")}
    env.update(UNICCL_TIMEOUT="3", **extra)  # (the user's: a stuck call ends in 3 s, not 120)
    return env


def uniccl_run(n, *args, env=None, timeout=90, wait=True, launcher=()):
    cmd = [sys.executable, "-m", "uniccl", "run", "--no-prefix", *launcher, "-n", str(n), WORKER, *args]
    if not wait:
        return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)


def doctor(*args) -> tuple[int, dict, str]:
    """(exit status, --json output, text output) of ``uniccl doctor ARGS``."""
    base = [sys.executable, "-m", "uniccl", "doctor", *map(str, args)]
    js = subprocess.run([*base, "--json"], capture_output=True, text=True, timeout=60)
    text = subprocess.run(base, capture_output=True, text=True, timeout=60)
    assert js.returncode == text.returncode, (js.stderr, text.stderr)
    return js.returncode, json.loads(js.stdout) if js.stdout.strip().startswith("{") else {}, text.stdout


def only(report: dict, kind: str) -> list[dict]:
    return [v for v in report["verdicts"] if v["kind"] == kind]


def test_dead(tmp_path):
    res = uniccl_run(3, "dead", env=_env(UNICCL_DUMP_DIR=str(tmp_path)))
    assert res.returncode == 128 + signal.SIGKILL, res.stdout + res.stderr
    code, report, text = doctor(tmp_path)
    assert code == 1, text
    (v,) = only(report, "dead")
    assert v["ranks"] == [2] and v["seq"] == 5 and v["detail"]["in_call"] == [0, 1], v
    assert v["detail"]["exit"]["code"] == -signal.SIGKILL, v
    assert "rank 2 was killed by SIGKILL during call #5 all_reduce(float32, 1000) at " in text, text
    # (the launcher stopped the job at once: the others were still in the call, or had seen it)
    assert "doctor.py:" in v["text"] and ("ranks 0, 1 were in it" in v["text"] or "saw it" in v["text"]), v
    assert not only(report, "stuck-outside"), report  # the death explains the rest


def one_verdict(tmp_path, scenario: str) -> tuple[dict, str]:
    """Run ``scenario`` at 3 ranks with the dumps in ``tmp_path``: uniccl doctor's one verdict, and its text."""
    res = uniccl_run(3, scenario, env=_env(UNICCL_DUMP_DIR=str(tmp_path)))
    assert res.returncode == 0, res.stdout + res.stderr
    code, report, text = doctor(tmp_path)
    assert code == 1 and len(report["verdicts"]) == 1, text
    return report["verdicts"][0], text


def test_mismatch(tmp_path):
    v, text = one_verdict(tmp_path, "mismatch")
    assert v["kind"] == "mismatch" and v["seq"] == 3 and v["ranks"] == [0, 1, 2], v
    sides = {tuple(s["ranks"]): s["call"] for s in v["detail"]["sides"]}
    assert sides == {(0, 2): "all_reduce(float32, 1000)", (1,): "broadcast(float32, 1000, root=0)"}, sides
    assert text.startswith("mismatch: mismatched call #3: ranks 0, 2 called all_reduce(float32, 1000) at "), text
    # the same dumps for torch's own tool (--torch-fr), read by torchfrtrace as torch's are
    frtrace = shutil.which("torchfrtrace", path=os.path.dirname(sys.executable)) or shutil.which("torchfrtrace")
    if frtrace is None:
        pytest.skip("torch's torchfrtrace is not installed here")
    out = tmp_path / "torch-fr"
    res = subprocess.run(
        [sys.executable, "-m", "uniccl", "doctor", str(tmp_path), "--torch-fr", str(out)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 1 and sorted(os.listdir(out)) == [f"uniccl_fr_trace_{r}" for r in range(3)], res.stderr
    res = subprocess.run([frtrace, str(out)], capture_output=True, text=True, timeout=120)
    said = res.stdout + res.stderr
    assert res.returncode == 0, said
    assert "Collective sequence number: 4 has errors" in said, said  # (torch counts from 1: uniccl's #3)
    assert "Culprit rank 1; Error type: COLLECTIVE_TYPE_MISMATCH" in said, said
    assert "'all_reduce' does not match found collective type: 'broadcast'" in said, said
    assert "doctor.py:" in said, said  # the caller's line, as the entry's frame


def test_p2p_deadlock(tmp_path):
    v, text = one_verdict(tmp_path, "p2p")
    assert v["kind"] == "p2p-deadlock" and v["ranks"] == [0, 1], v
    assert {(c["rank"], c["op"], c["peer"]) for c in v["detail"]["cycle"]} == {(0, "recv", 1), (1, "recv", 0)}
    assert "rank 0 receives from rank 1" in text and "rank 1 receives from rank 0" in text, text


def test_stuck_outside_names_a_stopped_rank(tmp_path):
    dumps = _with_a_stopped_rank(tmp_path, "stopped")
    code, report, text = doctor(dumps)
    assert code == 1, text
    (v,) = report["verdicts"]
    assert v["kind"] == "stuck-outside" and v["ranks"] == [2] and v["seq"] == 3, v
    assert v["detail"]["state"] == "T" and v["detail"]["waited_on_by"] == [0, 1], v
    assert "rank 2 never made call #3 all_reduce(float32, 1000) that ranks 0, 1 wait in: it is stopped" in text
    assert "its last call was #2" in text, text


def test_live_stuck_outside_names_a_stopped_rank(tmp_path):
    """The same job seen while it runs (uniccl run's status files and /proc)."""
    dumps = tmp_path / "dumps"
    status = tmp_path / "status"
    pids = tmp_path / "pids"
    pids.mkdir()
    env = _env(UNICCL_DUMP_DIR=str(dumps), UNICCL_STATUS_DIR=str(status))
    job = subprocess.Popen(
        [sys.executable, "-m", "uniccl", "run", "--no-prefix", "-n", "3", WORKER, "stopped", str(pids)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=dict(env, UNICCL_TIMEOUT="30"),  # (they wait while the test looks)
    )
    try:
        report, deadline = {}, time.monotonic() + 60
        while time.monotonic() < deadline:
            time.sleep(0.5)
            if not list(status.glob("rank-*.json")):
                continue  # (the ranks write their first status files)
            # (the two runs of doctor() would see two moments while the job is still starting)
            js = subprocess.run(
                [sys.executable, "-m", "uniccl", "doctor", "--live", str(status), "--json"],
                capture_output=True,
                text=True,
                timeout=60,
            )
            if '"stuck-outside"' in js.stdout:
                break
        code, report, text = doctor("--live", status)  # (rank 2 stays stopped: both runs see it)
        rows = [json.loads(f.read_text()) for f in sorted(status.glob("rank-*.json"))]
        assert len(only(report, "stuck-outside")) == 1, (report, rows)
        (v,) = only(report, "stuck-outside")
        assert code == 1 and v["ranks"] == [2] and v["seq"] == 3 and v["detail"]["state"] == "T", report
        assert "rank 2 never made call #3 all_reduce that ranks 0, 1 wait in: it is stopped" in text, text
    finally:
        if (pids / "2.pid").exists():
            os.kill(int((pids / "2.pid").read_text()), signal.SIGCONT)
        job.kill()
        job.communicate()


def _with_a_stopped_rank(tmp_path, scenario, attempt=1) -> Path:
    """Run ``scenario``, in which rank 2 stops itself; SIGCONT it once ranks 0 and 1 have dumped.
    Rank 2 stops itself from a timer thread 5 ms into a call. On a loaded machine (CI, both
    cores busy) the timer may fire only after the call ended, so that no rank fails (nothing to
    judge), or only after the others timed out on a rank 2 that was merely slow, so that their
    dumps saw it running: either way the scenario did not happen, and runs again (3 tries)."""
    dumps, pids = tmp_path / f"dumps{attempt}", tmp_path / f"pids{attempt}"
    pids.mkdir()
    job = uniccl_run(3, scenario, str(pids), env=_env(UNICCL_DUMP_DIR=str(dumps)), wait=False)
    try:
        deadline = time.monotonic() + 60
        while len(list(dumps.glob("uniccl-flight-*.json"))) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(0.3)
    finally:
        if (pids / "2.pid").exists():
            os.kill(int((pids / "2.pid").read_text()), signal.SIGCONT)
        out, err = job.communicate(timeout=60)
    assert job.returncode == 0, out + err
    rows = [json.loads(x) for x in out.splitlines() if x.startswith("{")]
    after = len(rows) == 3 and not any("error" in r for r in rows)  # the stop came after the call
    if attempt < 3 and (after or '"T"' not in json.dumps(doctor(dumps)[1].get("verdicts"))):  # ... or late
        return _with_a_stopped_rank(tmp_path, scenario, attempt + 1)
    return dumps


def test_stuck_inside_names_the_chunk_each_rank_waited_for(tmp_path):
    dumps = _with_a_stopped_rank(tmp_path, "inside")
    code, report, text = doctor(dumps)
    assert code == 1, text
    (v,) = report["verdicts"]
    assert v["kind"] == "stuck-inside" and v["ranks"] == [0, 1, 2] and v["seq"] == 1, v
    assert v["detail"]["waited_for"] == [2] and v["detail"]["states"] == {"2": "T"}, v
    assert "every rank is in call #1 all_reduce(float32, 33554432)" in text, text
    assert "waiting for rank 2 to " in text and "chunk" in text and "rank 2 is stopped" in text, text


def test_straggler(tmp_path):
    env = _env(UNICCL_TRACE=str(tmp_path), UNICCL_FAULT_INJECT="slow=0.01,slow_rank=1")
    res = uniccl_run(3, "calls", env=env)
    assert res.returncode == 0, res.stdout + res.stderr
    code, report, text = doctor(tmp_path)
    assert code == 1, text
    (v,) = only(report, "straggler")
    assert v["ranks"] == [1] and v["detail"]["last_share"] > 0.8, v
    assert v["detail"]["median_late_ms"] > 5 and v["detail"]["p99_late_ms"] >= v["detail"]["median_late_ms"], v
    assert "rank 1 (" in text and "collectives last" in text and "p99" in text, text


def test_integrity(tmp_path):
    env = _env(UNICCL_TRACE=str(tmp_path), UNICCL_TRANSPORT="tcp", UNICCL_FAULT_INJECT="flip=0.2,seed=4")
    res = uniccl_run(2, "calls", env=env)
    assert res.returncode == 0, res.stdout + res.stderr
    code, report, text = doctor(tmp_path)
    assert code == 1, text
    found = only(report, "integrity")
    assert found and all(sorted(v["ranks"]) == [0, 1] for v in found), report
    assert sum(v["detail"]["checksum_failures"] for v in found) > 0, found
    assert "failed their checksum" in text, text


def test_slow_link(netns_cluster, tmp_path):  # noqa: F811
    c = netns_cluster
    veth = "uccl-v3"  # host 3's end on the bridge: what goes to host 3 (tests/_netns.py)
    subprocess.run(
        ["tc", "qdisc", "add", "dev", veth, "root", "tbf", "rate", "40mbit", "burst", "32kbit", "latency", "400ms"],
        check=True,
    )
    try:
        opts = [f"--ssh-option={o}" for o in c.ssh_options]
        fwd = ["-x", "PYTHONPATH"] if os.environ.get("PYTHONPATH") else []
        hosts = ",".join(f"{h}:1" for h in c.hosts)
        launcher = ["--hosts", hosts, *opts, "--python", sys.executable, "-x", "UNICCL_TRACE", *fwd]
        cmd = [sys.executable, "-m", "uniccl", "run", "--no-prefix", *launcher, WORKER, "calls"]
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=150, env=_env(UNICCL_TRACE=str(tmp_path)))
    finally:
        subprocess.run(["tc", "qdisc", "del", "dev", veth, "root"], check=False)
    assert res.returncode == 0, res.stdout + res.stderr
    code, report, text = doctor(tmp_path)
    slow = only(report, "slow-link")
    assert code == 1 and slow, text
    assert {v["detail"]["dst"] for v in slow} == {2}, slow  # into host 3 only
    assert all(v["detail"]["GBps"] < 0.5 * v["detail"]["median_GBps"] for v in slow), slow
    assert "link rank 0 -> rank 2" in text or "link rank 1 -> rank 2" in text, text


def test_a_clean_job_has_no_verdict(tmp_path):
    res = uniccl_run(2, "calls", env=_env(UNICCL_TRACE=str(tmp_path)))
    assert res.returncode == 0, res.stdout + res.stderr
    code, report, text = doctor(tmp_path)
    assert code == 0 and report["verdicts"] == [] and "no verdict" in text, text
    code, _, text = doctor(tmp_path / "nothing-here")
    assert code == 2 and "nothing to read" in text, text
    assert not list(Path(tmp_path).glob("uniccl-exit-*"))
