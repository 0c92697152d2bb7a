"""Visibility: telemetry in comm.stats(), traces merged onto one timeline, Prometheus metrics
scraped from a running job (real processes under ``uniccl run``)."""

import glob
import json
import os
import re
import subprocess
import sys
import time
import urllib.request

import pytest
from _launch import WORKERS

VIS = str(WORKERS / "visibility.py")


def launch(n, *args, env=None, wait=True):
    cmd = [sys.executable, "-m", "uniccl", "run", "--no-prefix", "-n", str(n), VIS, *args]
    env = dict(os.environ, **(env or {}))
    if not wait:
        return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    return res


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_stats_count_every_call(transport):
    res = launch(3, "stats", env={"UNICCL_TRANSPORT": transport})
    rows = sorted((json.loads(x) for x in res.stdout.splitlines() if x.startswith("{")), key=lambda r: r["rank"])
    assert [r["rank"] for r in rows] == [0, 1, 2]
    for r in rows:
        ops = r["ops"]
        ar = ops["all_reduce"]
        assert ar["calls"] == 7 and ar["bytes"] == 7 * 4 * (1 << 16) and ar["failed"] == 0
        assert ar["busbw_GBps"] == pytest.approx(ar["algbw_GBps"] * 2 * 2 / 3)  # 2(n-1)/n
        assert 0 < ar["p50_us"] <= ar["p99_us"] and ar["seconds"] > 0
        assert list(ar["by_size"]) == ["<512KiB"]  # 256 KiB messages
        assert ops["broadcast"]["calls"] == 3 and ops["broadcast"]["bytes"] == 3 * 16
        assert ops["all_gather"]["calls"] == 1 and ops["all_gather"]["bytes"] == 16 * 3
        assert r["transport"] == transport and r["calls"] == 11
        if transport == "tcp":  # the links carried the all_reduces: ring, 2(n-1)/n of 256 KiB per call
            sent = sum(link["sent_bytes"] for link in r["links"].values())
            assert sent >= 7 * 2 * 2 / 3 * 4 * (1 << 16)
            # the ring's messages (~85 KiB) are timed: the link to the next rank shows a bandwidth
            assert any(link["send_GBps"] > 0 for link in r["links"].values())


def test_telemetry_off():
    res = launch(2, "stats", env={"UNICCL_TELEMETRY": "0"})
    for r in (json.loads(x) for x in res.stdout.splitlines() if x.startswith("{")):
        assert r["telemetry"] is False and r["ops"] == {} and r["calls"] == 11


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_traces_merge_onto_one_timeline(transport, tmp_path):
    launch(3, "stats", env={"UNICCL_TRANSPORT": transport, "UNICCL_TRACE": str(tmp_path)})
    files = sorted(glob.glob(str(tmp_path / "uniccl-trace-r*.json")))
    assert len(files) == 3 and len(glob.glob(str(tmp_path / "uniccl-stats-r*.json"))) == 3
    out = subprocess.run(
        [sys.executable, "-m", "uniccl", "trace", "merge", str(tmp_path)], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    merged = json.load(open(out.stdout.strip()))
    calls = [e for e in merged["traceEvents"] if e.get("ph") == "X" and e["name"] == "all_reduce"]
    assert sorted(e["pid"] for e in calls) == [0] * 7 + [1] * 7 + [2] * 7
    rtt = max(r["clock_rtt_us"] for r in merged["otherData"]["ranks"])
    for seq in {e["args"]["seq"] for e in calls}:  # a collective's spans overlap on every rank
        spans = [e for e in calls if e["args"]["seq"] == seq]
        assert len(spans) == 3 and spans[0]["args"]["bytes"] == 4 * (1 << 16)
        assert max(e["ts"] for e in spans) <= min(e["ts"] + e["dur"] for e in spans) + rtt + 50
    messages = [e for e in merged["traceEvents"] if e.get("name") == "message"]
    if transport == "tcp":
        assert {e["pid"] for e in messages} == {0, 1, 2} and all(e["args"]["bytes"] > 0 for e in messages)
    else:  # the engine's transfers: reductions, and data taken from each peer
        transfers = [e for e in merged["traceEvents"] if e.get("name") == "transfer"]
        assert {e["pid"] for e in transfers} == {0, 1, 2} and all(e["args"]["bytes"] > 0 for e in transfers)
        assert {e["args"]["kind"] for e in transfers} >= {"reduce"}
        for pid in range(3):  # every rank took data from both others (all_gather, broadcast)
            peers = {e["args"].get("peer") for e in transfers if e["pid"] == pid and e["args"]["kind"] != "reduce"}
            assert peers == {p for p in range(3) if p != pid}, (pid, peers)
        reduced = sum(e["args"]["bytes"] for e in transfers if e["pid"] == 0 and e["args"]["kind"] == "reduce")
        assert reduced >= 7 * 4 * (1 << 16) // 3  # rank 0's share of seven 256 KiB all_reduces at least
    tracks = {e["args"]["name"] for e in merged["traceEvents"] if e.get("name") == "thread_name"}
    assert "calls" in tracks


def test_prometheus_metrics_from_a_running_job(tmp_path):
    pytest.importorskip("prometheus_client")
    base = 20000 + os.getpid() % 20000
    proc = launch(
        2, "serve", str(tmp_path), env={"UNICCL_METRICS_PORT": str(base), "UNICCL_TRANSPORT": "tcp"}, wait=False
    )
    try:
        deadline = time.monotonic() + 60
        while not all((tmp_path / f"ready-{r}").exists() for r in range(2)):
            assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read()
            time.sleep(0.05)
        for rank in range(2):
            text = urllib.request.urlopen(f"http://127.0.0.1:{base + rank}/metrics", timeout=10).read().decode()
            line = re.search(
                r'uniccl_calls_total\{communicator="world",op="all_reduce",rank="%d",size="<512KiB"\} '
                r"(\S+)" % rank,
                text,
            )
            assert line and float(line.group(1)) == 7.0, text[-2000:]
            assert re.search(r'uniccl_call_latency_seconds_bucket\{[^}]*le="\+Inf",op="all_reduce"[^}]*\} 7\.0', text)
            assert re.search(r'uniccl_link_sent_bytes_total\{peer="%d",rank="%d"\} [1-9]' % (1 - rank, rank), text)
    finally:
        (tmp_path / "done").touch()
        proc.wait(timeout=60)
    assert proc.returncode == 0


def test_top_shows_every_rank_of_a_running_job(tmp_path):
    """`uniccl top` in a pseudo-terminal against a 4-rank job whose last rank is slow."""
    import select

    status = tmp_path / "status"
    proc = launch(
        4, "loop", str(tmp_path), env={"UNICCL_STATUS_DIR": str(status), "UNICCL_TRANSPORT": "tcp"}, wait=False
    )
    try:
        deadline = time.monotonic() + 60
        while len(glob.glob(str(status / "rank-*.json"))) < 4:
            assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read()
            time.sleep(0.1)
        time.sleep(1.5)  # a few calls made: bandwidths and waits to show
        master, slave = os.openpty()
        top = subprocess.Popen(
            [sys.executable, "-m", "uniccl", "top", str(status), "--interval", "0.5", "--count", "6"],
            stdin=slave,
            stdout=slave,
            stderr=slave,
            close_fds=True,
        )
        os.close(slave)
        out = b""
        end = time.monotonic() + 30
        while time.monotonic() < end:
            ready, _, _ = select.select([master], [], [], 0.5)
            if ready:
                try:
                    chunk = os.read(master, 65536)
                except OSError:  # the terminal's other side closed: top exited
                    break
                if not chunk:
                    break
                out += chunk
            elif top.poll() is not None:
                break
        top.wait(timeout=30)
        os.close(master)
    finally:
        (tmp_path / "done").touch()
        proc.wait(timeout=60)
    assert top.returncode == 0, out.decode(errors="replace")[-2000:]
    screens = out.decode(errors="replace").replace("\r\n", "\n").split("\x1b[H\x1b[2J")
    assert len(screens) >= 6
    last = screens[-1]
    for r in range(4):  # every rank's row: rank, host, pid, and the all_reduce it is in or made
        assert re.search(r"^\s*%d\s+\S+\s+\d+\s+(done |FAILED )?all_reduce #\d+" % r, last, re.M), last
    assert any("rank 3" in s and "behind" in s for s in screens), screens[-1]  # the slow rank, named


def _browser():
    import shutil

    return shutil.which("chromium-headless-shell") or shutil.which("chromium")


def test_report_names_the_slowed_rank_and_renders_in_chromium(tmp_path):
    """A 4-rank TCP job whose rank 2 starts every collective 20 ms late (the fault injector's
    straggler): the report names rank 2, and headless Chromium draws the page with its plots."""
    pytest.importorskip("matplotlib")
    trace = tmp_path / "trace"
    res = subprocess.run(
        [sys.executable, "-m", "uniccl", "run", "--no-prefix", "-n", "4", VIS, "report"],
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(
            os.environ, UNICCL_TRANSPORT="tcp", UNICCL_TRACE=str(trace), UNICCL_FAULT_INJECT="slow=0.02,slow_rank=2"
        ),
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    page = tmp_path / "report.html"
    out = subprocess.run(
        [sys.executable, "-m", "uniccl", "report", str(trace), "-o", str(page), "--png", str(tmp_path / "png")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    text = page.read_text()
    findings = re.search(r'<ul id="findings">(.*?)</ul>', text).group(1)
    assert "Slowest rank: rank 2 " in findings, findings
    # self-contained: no address outside the page (the plots' base64 is left out: it can spell any word)
    markup = re.sub(r"base64,[A-Za-z0-9+/=]+", "base64,", text)
    assert "network" not in markup and "http" not in markup.replace("http://www.w3.org", "")
    assert sorted(os.listdir(tmp_path / "png")) == ["busbw.png", "heatmap.png", "timeline.png"]
    browser = _browser()
    if browser is None:
        pytest.skip("no headless Chromium (Debian's chromium-headless-shell; scripts/_setup.sh installs it)")
    shot = tmp_path / "shot.png"
    run = subprocess.run(
        [
            browser,
            "--no-sandbox",
            "--disable-gpu",
            "--hide-scrollbars",
            f"--screenshot={shot}",
            "--window-size=1200,2400",
            page.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert shot.exists(), run.stderr[-2000:]
    import matplotlib.image
    import numpy as np

    img = (matplotlib.image.imread(str(shot))[:, :, :3] * 255).astype(int)
    assert img.shape[:2] == (2400, 1200)
    colors = img.reshape(-1, 3)
    blue = np.all(np.abs(colors - [0x33, 0x66, 0xCC]) < 12, axis=1).sum()  # the all_reduce bars of the timeline
    assert blue > 2000, blue  # the embedded plots were drawn, not just the text
    assert len(np.unique(colors // 16, axis=0)) > 100  # a heatmap's and plots' worth of colours


def test_report_heatmap_from_shared_memory_transfers(tmp_path):
    """A shared-memory job has no TCP links: the report's heatmap and slowest link come from
    the engine's traced transfers, every pair of ranks in both directions."""
    pytest.importorskip("matplotlib")
    trace = tmp_path / "trace"
    res = subprocess.run(
        [sys.executable, "-m", "uniccl", "run", "--no-prefix", "-n", "3", VIS, "report"],
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ, UNICCL_TRANSPORT="shm", UNICCL_TRACE=str(trace)),
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    from uniccl.tools import report as _report

    data = _report.load(str(trace))
    n, m, what = _report.link_matrix(data["stats"], data["traces"])
    assert n == 3 and what.startswith("shared-memory")
    assert all(m[s][d] is not None and m[s][d] > 0 for s in range(3) for d in range(3) if s != d), m
    page = tmp_path / "report.html"
    out = subprocess.run(
        [sys.executable, "-m", "uniccl", "report", str(trace), "-o", str(page), "--png", str(tmp_path / "png")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert "heatmap.png" in os.listdir(tmp_path / "png")
    assert "shared-memory transfers" in re.search(r'<ul id="findings">(.*?)</ul>', page.read_text()).group(1)


def test_debug_file_per_rank(tmp_path):
    """UNICCL_DEBUG=INFO with UNICCL_DEBUG_FILE: one file per rank, %h %p %r expanded."""
    import socket

    launch(2, "stats", env={"UNICCL_DEBUG": "INFO", "UNICCL_DEBUG_FILE": str(tmp_path / "uc.%h.%p.%r.log")})
    files = sorted(os.listdir(tmp_path))
    assert len(files) == 2, files
    host = socket.gethostname()
    for f in files:
        m = re.fullmatch(r"uc\.(.+)\.(\d+)\.(\d)\.log", f)
        assert m and m.group(1) == host, f
        text = (tmp_path / f).read_text()
        assert f"[{m.group(3)}] uniccl INFO" in text and "transport" in text, text[:500]


# ------------------------------------------------------------------ report on synthetic traces
def _write_traces(directory, size, calls, start_us, rtt_us=20.0):
    """Trace files as ranks write them: rank r starts call i at ``start_us(i, r)`` (rank 0's clock)."""
    directory.mkdir(parents=True, exist_ok=True)
    for r in range(size):
        events = [
            {
                "ph": "X",
                "name": "all_reduce",
                "ts": float(start_us(i, r)),
                "dur": 50.0,
                "pid": r,
                "tid": 1,
                "args": {"communicator": "world", "seq": i, "bytes": 4096, "path": "shm"},
            }
            for i in range(calls)
        ]
        doc = {
            "traceEvents": events,
            "otherData": {"rank": r, "host": "node", "pid": 1000 + r, "clock_offset_us": 0.0, "clock_rtt_us": rtt_us},
        }
        (directory / f"uniccl-trace-r{r}.json").write_text(json.dumps(doc))


def _report_findings(directory, tmp_path):
    page = tmp_path / "report.html"
    out = subprocess.run(
        [sys.executable, "-m", "uniccl", "report", str(directory), "-o", str(page)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    return re.findall(r"<li>(.*?)</li>", re.search(r'<ul id="findings">(.*?)</ul>', page.read_text()).group(1))


def _binomial_sf(m, k, p):
    """P(X >= m), X ~ Binomial(k, p), exactly (fractions): the reference for the report's test."""
    from fractions import Fraction
    from math import comb

    p = Fraction(p)
    return float(sum(comb(k, j) * p**j * (1 - p) ** (k - j) for j in range(m, k + 1)))


def test_report_of_an_empty_directory_names_it(tmp_path):
    empty = tmp_path / "no traces here"
    empty.mkdir()
    out = subprocess.run(
        [sys.executable, "-m", "uniccl", "report", str(empty), "-o", str(tmp_path / "r.html")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2 and not (tmp_path / "r.html").exists()
    assert "{path}" not in out.stderr
    assert out.stderr.count(str(empty)) == 2, out.stderr  # nothing to report in DIR ... UNICCL_TRACE=DIR
    assert f"UNICCL_TRACE={empty})" in out.stderr


@pytest.mark.parametrize(
    "m, k, p", [(0, 5, 0.25), (3, 5, 0.25), (5, 5, 0.25), (9, 12, 0.5), (30, 100, 0.25), (6, 5, 0.3), (1, 1, 1.0)]
)
def test_binomial_tail(m, k, p):
    from uniccl.tools import report as _report

    assert _report.binomial_tail(m, k, p) == pytest.approx(_binomial_sf(m, k, p), rel=1e-9, abs=1e-300)


def test_report_no_rank_stands_out_when_the_last_one_varies(tmp_path):
    """4 ranks whose start times jitter alike (0-300 us): whoever is last is chance."""
    pytest.importorskip("matplotlib")
    import random

    rng = random.Random(11)
    jitter = {(i, r): rng.uniform(0, 300) for i in range(400) for r in range(4)}
    _write_traces(tmp_path / "t", 4, 400, lambda i, r: 1e6 + 1000 * i + jitter[(i, r)])
    last = [max(range(4), key=lambda r: jitter[(i, r)]) for i in range(400)]
    most = max(last.count(r) for r in range(4))
    assert 4 * _binomial_sf(most, 400, 0.25) >= 0.01  # the data is what the test claims: no rank beyond chance
    findings = _report_findings(tmp_path / "t", tmp_path)
    assert any(f.startswith("No rank stands out") for f in findings), findings
    assert not any("Slowest rank" in f for f in findings), findings


def test_report_names_rank_2_when_it_is_last_in_90_percent(tmp_path):
    """Rank 2 starts 90 % of the calls 2 ms late: named, with its count and median lateness."""
    pytest.importorskip("matplotlib")
    import random

    rng = random.Random(5)
    slow = {i for i in range(400) if i % 10 != 0}  # 360 of 400
    jitter = {(i, r): rng.uniform(0, 100) for i in range(400) for r in range(4)}
    _write_traces(
        tmp_path / "t", 4, 400, lambda i, r: 1e6 + 10000 * i + jitter[(i, r)] + (2000 if r == 2 and i in slow else 0)
    )
    findings = _report_findings(tmp_path / "t", tmp_path)
    named = [f for f in findings if f.startswith("Slowest rank")]
    assert len(named) == 1 and named[0].startswith("Slowest rank: rank 2 (node, pid 1002) started "), findings
    last2 = sum(
        1
        for i in range(400)
        if max(range(4), key=lambda r: jitter[(i, r)] + (2000 if r == 2 and i in slow else 0)) == 2
    )
    assert last2 >= 360 and f"started {last2} of 400 collectives last" in named[0], named
    m = re.search(r"a median (\d+\.\d+) ms after the first rank", named[0])
    assert m and 1.9 < float(m.group(1)) < 2.1, named
    assert not any("No rank stands out" in f for f in findings)


def test_report_does_not_name_a_rank_within_the_timing_noise(tmp_path):
    """Last in 90 % of calls, but by 3 us (clock alignment is good to half a 20 us round trip):
    not a finding; nor is a rank last in 5 of 12 calls, however late (chance: p ~ 0.16 x 4)."""
    pytest.importorskip("matplotlib")
    from uniccl.tools import report as _report

    slow = {i for i in range(400) if i % 10 != 0}
    _write_traces(
        tmp_path / "a",
        4,
        400,
        lambda i, r: 1e6 + 1000 * i + r * 0.1 * (r != 2) + (3.0 if r == 2 and i in slow else 0.0),
    )
    late = _report.rank_lateness(_report.load(str(tmp_path / "a"))["traces"])
    assert late["rank"] == 2 and late["last"] == 360 and late["p_value"] < 1e-100 and not late["stands_out"]
    assert any(f.startswith("No rank stands out") for f in _report_findings(tmp_path / "a", tmp_path))

    lasts = [2, 2, 2, 2, 2, 0, 1, 3, 0, 1, 3, 0]  # rank 2 last in 5 of 12, 5 ms behind then
    _write_traces(tmp_path / "b", 4, 12, lambda i, r: 1e6 + 1e5 * i + (5000 if r == lasts[i] else 10 * r))
    late = _report.rank_lateness(_report.load(str(tmp_path / "b"))["traces"])
    assert late["rank"] == 2 and late["last"] == 5
    assert late["p_value"] == pytest.approx(4 * _binomial_sf(5, 12, 0.25)) and not late["stands_out"]
    assert any(f.startswith("No rank stands out") for f in _report_findings(tmp_path / "b", tmp_path))


def test_busbw_plot_is_log_log(tmp_path):
    """The bandwidth plot's axes are both logarithmic; its points are the medians it was given."""
    pytest.importorskip("matplotlib")
    from uniccl.tools import report as _report

    bench = [
        {"collective": "all_reduce", "size": s, "oop_busbw": bw, "ip_busbw": bw}
        for s, bw in [(1024, 0.01), (1 << 20, 1.5), (64 << 20, 9.0), (0, 0.0)]
    ]
    bench += [{"collective": "broadcast", "size": 4096, "oop_busbw": None, "ip_busbw": 0.2}]
    stats = {
        r: [
            {
                "size": 2,
                "ops": {
                    "all_gather": {
                        "by_size": {
                            "<4KiB": {"calls": 3, "mean_bytes": 2048, "busbw_GBps": 0.1 * (r + 1)},
                            "<4MiB": {"calls": 1, "mean_bytes": 2 << 20, "busbw_GBps": 2.0 * (r + 1)},
                        }
                    }
                },
            }
        ]
        for r in range(2)
    }
    fig = _report.busbw_figure({"traces": {}, "stats": stats, "bench": bench})
    ax = fig.axes[0]
    assert ax.get_xscale() == "log" and ax.get_yscale() == "log"
    lines = {line.get_label(): (list(line.get_xdata()), list(line.get_ydata())) for line in ax.get_lines()}
    assert lines["all_reduce (bench)"] == (
        [1024, 1 << 20, 64 << 20],
        [0.01, 1.5, 9.0],
    )  # 0 B / 0 GB/s: not on a log axis
    assert lines["broadcast (bench)"] == ([4096], [0.2])  # in place only
    assert lines["all_gather (telemetry)"] == ([2048, 2 << 20], [pytest.approx(0.15), pytest.approx(3.0)])
    import matplotlib.pyplot as plt

    plt.close(fig)
    png = _report.plot_busbw({"traces": {}, "stats": {}, "bench": bench})
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
