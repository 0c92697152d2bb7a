"""``uniccl bench``: the pure parts (no communicator), 2-rank runs through -np (mpiexec, and
``uniccl run`` when there is none) and under ``uniccl run`` itself (shm and TCP), JSON facts,
nccl-tests' names, and wrong combinations."""

from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import re
import shlex
import socket
import subprocess
import sys

import numpy as np
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
UNICCL = os.path.join(os.path.dirname(sys.executable), "uniccl")  # the venv's entry point, as a user runs it

from uniccl.tools import bench as _bench  # noqa: E402


def _dtypes_here():
    """All dtypes, less bfloat16 when ml_dtypes is missing."""
    try:
        import ml_dtypes  # noqa: F401

        return _bench.DTYPES
    except ImportError:
        return tuple(d for d in _bench.DTYPES if d != "bfloat16")


# ------------------------------------------------------------------ sizes
@pytest.mark.parametrize(
    "text, value",
    [
        ("0", 0),
        ("8", 8),
        ("1K", 1024),
        ("1k", 1024),
        ("64M", 64 << 20),
        ("1G", 1 << 30),
        ("2KB", 2048),
        ("4KiB", 4096),
        ("3T", 3 << 40),
        (" 16 ", 16),
        (12, 12),
    ],
)
def test_parse_size(text, value):
    assert _bench.parse_size(text) == value


@pytest.mark.parametrize("text", ["", "1.5K", "-8", "8X", "K", "1KK", "8 M B"])
def test_parse_size_rejects(text):
    with pytest.raises(ValueError):
        _bench.parse_size(text)


@pytest.mark.parametrize("n", [0, 8, 1000, 1024, 1536, 64 << 20, 1 << 30, 3 << 40])
def test_format_size_round_trips(n):
    assert _bench.parse_size(_bench.format_size(n)) == n
    assert _bench.format_size(1024) == "1K" and _bench.format_size(64 << 20) == "64M"


def test_size_sweep():
    assert _bench.size_sweep(8, 64, 2) == [8, 16, 32, 64]
    assert _bench.size_sweep(8, 65, 2) == [8, 16, 32, 64]
    assert _bench.size_sweep(8, 64 << 10, 8) == [8, 64, 512, 4096, 32768]
    assert _bench.size_sweep(1024, 1024, 2) == [1024]
    assert _bench.size_sweep(0, 4, 2) == [0, 1, 2, 4]
    assert _bench.size_sweep(0, 0, 2) == [0]
    default = _bench.size_sweep(8, 64 << 20, 2)
    assert len(default) == 24 and default[-1] == 64 << 20
    for bad in [(8, 4, 2), (8, 64, 1)]:
        with pytest.raises(ValueError):
            _bench.size_sweep(*bad)


def test_counts_and_rows():
    assert _bench.counts("all_reduce", 1024, 4, 3) == (256, 256)
    assert _bench.counts("all_reduce", 7, 4, 3) == (1, 1)
    # split buffers: whole blocks only; the count column is one block
    assert _bench.counts("all_gather", 1024, 4, 3) == (255, 85)
    assert _bench.counts("reduce_scatter", 8, 4, 3) == (0, 0)
    rows = _bench.plan_rows("all_gather", [0, 4, 8, 16, 32], 4, 3)
    assert rows == [(0, 0, 0), (12, 3, 1), (24, 6, 2)]
    assert _bench.plan_rows("all_reduce", [2, 4, 6], 4, 2) == [(4, 1, 1)]  # 6 B rounds to the 4 B row


def test_busbw_factors():
    f = _bench.busbw_factor
    assert f("all_reduce", 4) == pytest.approx(1.5)
    for c in ("all_gather", "reduce_scatter", "all_to_all", "gather", "scatter"):
        assert f(c, 4) == pytest.approx(0.75)
    assert f("broadcast", 4) == f("reduce", 4) == 1.0
    assert f("all_reduce", 1) == 0.0


# --------------------------------------------------------------- arguments
def _parse(*argv):
    p = argparse.ArgumentParser()
    _bench.add_arguments(p)
    return p.parse_args(list(argv))


def test_arguments_defaults_and_lists():
    a = _parse("all_reduce")
    assert (a.minbytes, a.maxbytes, a.stepfactor, a.iters, a.warmup, a.check) == (8, 64 << 20, 2, 20, 5, 1)
    assert a.datatype == ("float32",) and a.op == ("sum",) and a.root == 0 and a.np is None
    a = _parse("all", "-b", "1K", "-e", "1G", "-d", "all", "-o", "all", "-np", "4", "-n", "3")
    assert (a.minbytes, a.maxbytes, a.np, a.iters) == (1024, 1 << 30, 4, 3)
    assert len(a.datatype) == 12 and a.op == ("sum", "prod", "max", "min", "avg")
    assert _parse("gather", "-d", "half,bf16,float").datatype == ("float16", "bfloat16", "float32")
    for bad in (
        ["bogus"],
        ["all_reduce", "-d", "complex64"],
        ["all_reduce", "-o", "xor"],
        ["all_reduce", "-b", "1.5K"],
        ["all_reduce", "-f", "1"],
        ["all_reduce", "-c", "2"],
    ):
        with pytest.raises(SystemExit):
            _parse(*bad)


def test_child_argv_round_trips():
    a = _parse(
        "reduce",
        "-b",
        "1K",
        "-e",
        "4M",
        "-f",
        "4",
        "-d",
        "int8,float16",
        "-o",
        "all",
        "-r",
        "1",
        "-np",
        "2",
        "--json",
        "out.json",
    )
    b = _parse(*_bench.child_argv(a))
    for key in (
        "collective",
        "minbytes",
        "maxbytes",
        "stepfactor",
        "iters",
        "warmup",
        "check",
        "datatype",
        "op",
        "root",
    ):
        assert getattr(a, key) == getattr(b, key), key
    assert b.np is None and b.json == os.path.abspath("out.json")
    assert _parse(*_bench.child_argv(_parse("all_reduce", "--json", "-"))).json == "-"  # stdout stays stdout


@pytest.mark.parametrize(
    "name, canonical",
    [
        ("allreduce", "all_reduce"),
        ("allgather", "all_gather"),
        ("reducescatter", "reduce_scatter"),
        ("alltoall", "all_to_all"),
        ("AllReduce", "all_reduce"),
        ("all_reduce_perf", "all_reduce"),
        ("allgather_perf", "all_gather"),
        ("broadcast_perf", "broadcast"),
        ("all-to-all", "all_to_all"),
        ("scatter", "scatter"),
        ("all", "all"),
    ],
)
def test_nccl_tests_names_are_aliases(name, canonical):
    assert _parse(name).collective == canonical


@pytest.mark.parametrize("name", ["sendrecv", "hypercube", "all_reduc"])  # not collectives the bench has
def test_unknown_collectives_rejected(name):
    with pytest.raises(SystemExit):
        _parse(name)


# ---------------------------------------------------------------- -np relaunch
_LAUNCH_VARS = _bench._LAUNCHER_SIZE_VARS + _bench._LAUNCHER_RANK_VARS + (_bench._CHILD_MARK,)


def _fake_mpiexec(tmp_path, version_text, rc=3):
    """An 'mpiexec' that prints version_text for --version, else records its argv and exits rc."""
    exe = tmp_path / "mpiexec"
    exe.write_text(f"""#!{sys.executable}
import json, sys
if sys.argv[1:] == ["--version"]:
    print({version_text!r})
    sys.exit(0)
open({str(tmp_path / "argv.json")!r}, "w").write(json.dumps(sys.argv[1:]))
sys.exit({rc})
""")
    exe.chmod(0o755)
    return str(exe)


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX script as mpiexec")
@pytest.mark.parametrize(
    "version, openmpi",
    [
        ("mpirun (Open MPI) 4.1.5", True),
        ("prterun (Open MPI) 5.0.3", True),
        ("HYDRA build details:\n    Version: 4.2.0", False),
    ],
)
def test_relaunch_builds_the_mpiexec_line(tmp_path, monkeypatch, version, openmpi):
    for var in _LAUNCH_VARS:
        monkeypatch.delenv(var, raising=False)
    exe = _fake_mpiexec(tmp_path, version)
    monkeypatch.setattr(_bench, "find_mpiexec", lambda: exe)
    assert _bench.is_open_mpi(exe) is openmpi
    args = _parse("all_gather", "-np", "4", "-b", "1K", "-d", "int8")
    assert _bench.relaunch(args) == 3  # mpiexec's exit code
    argv = json.loads((tmp_path / "argv.json").read_text())
    assert argv[:2] == ["-n", "4"]
    assert ("--oversubscribe" in argv) is openmpi
    root = hasattr(os, "geteuid") and os.geteuid() == 0
    assert ("--allow-run-as-root" in argv) is (openmpi and root)
    rest = argv[argv.index(sys.executable) :]
    assert rest[1:4] == ["-m", "uniccl", "bench"] and "-np" not in rest
    assert _parse(*rest[4:]).minbytes == 1024


def test_relaunch_when_already_launched(monkeypatch, capsys):
    for var in _LAUNCH_VARS:
        monkeypatch.delenv(var, raising=False)
    assert _bench.relaunch(_parse("all_reduce", "-np", "1")) is None  # one rank: run here
    monkeypatch.setenv("PMI_SIZE", "2")
    assert _bench.relaunch(_parse("all_reduce", "-np", "2")) is None  # one of the 2 ranks
    monkeypatch.setenv("PMI_RANK", "0")
    assert _bench.relaunch(_parse("all_reduce", "-np", "4")) == 2
    err = capsys.readouterr().err
    assert "already has 2 ranks" in err and len(err.splitlines()) == 1
    # another rank of the job says nothing (rank 0 does) and fails alike, after its wait
    monkeypatch.setenv("PMI_RANK", "1")
    monkeypatch.setattr(_bench, "LINGER_S", 0.0)
    assert _bench.relaunch(_parse("all_reduce", "-np", "4")) == 2
    assert capsys.readouterr().err == ""
    # uniccl run's ranks: UNICCL_RANK / UNICCL_WORLD_SIZE
    for var in ("PMI_RANK", "PMI_SIZE"):
        monkeypatch.delenv(var)
    monkeypatch.setenv("UNICCL_WORLD_SIZE", "2")
    monkeypatch.setenv("UNICCL_RANK", "1")
    assert _bench.relaunch(_parse("all_reduce", "-np", "4")) == 2 and capsys.readouterr().err == ""
    monkeypatch.setenv("UNICCL_RANK", "0")
    assert _bench.relaunch(_parse("all_reduce", "-np", "4")) == 2
    assert "-np 4, but this job already has 2 ranks" in capsys.readouterr().err
    assert _bench.relaunch(_parse("all_reduce", "-np", "2")) is None


def test_command_line_names_the_entry_point():
    assert (
        _bench.command_line(["/x/.venv/bin/uniccl", "bench", "all_reduce", "-e", "1M"])
        == "uniccl bench all_reduce -e 1M"
    )
    assert _bench.command_line(["/x/uniccl/__main__.py", "bench", "a b"]) == "uniccl bench 'a b'"
    # -np's relaunched ranks get the user's command line (for the JSON), hidden from --help
    a = _parse(*_bench.child_argv(_parse("all_reduce", "-np", "2"), "uniccl bench all_reduce -np 2"))
    assert a.run_command == "uniccl bench all_reduce -np 2" and a.np is None


def test_source_commit_from_a_checkout_and_not_from_a_wheel(tmp_path):
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True)
    if head.returncode != 0:
        pytest.skip("not a git checkout")
    assert _bench.source_commit(str(ROOT / "core" / "uniccl")) == head.stdout.strip()
    (tmp_path / "__init__.py").write_text("")  # a package outside any checkout
    assert _bench.source_commit(str(tmp_path)) is None


def test_progress_only_when_enabled(capsys):
    off = _bench._Progress(False)
    off.show("x")
    off.clear()
    on = _bench._Progress(True)
    on.show("all_reduce float32 sum 1K 3/27")
    on.clear()
    err = capsys.readouterr().err
    assert "[all_reduce float32 sum 1K 3/27]" in err and err.count("[all_reduce") == 1
    assert err.endswith("\r\033[K")


# ------------------------------------------------------------------- table
def _row(**kw):
    row = {
        "collective": "all_reduce",
        "size": 1024,
        "count": 256,
        "dtype": "float32",
        "op": "sum",
        "root": None,
        "nranks": 2,
        "platform": "cpu",
    }
    for mode in ("oop", "ip"):
        row.update({f"{mode}_time_us": 12.5, f"{mode}_algbw": 0.08192, f"{mode}_busbw": 0.08192, f"{mode}_wrong": 0})
    row.update(kw)
    return row


def test_format_row_columns_line_up_with_header():
    header = _bench.header_lines()
    assert all(line.startswith("#") for line in header)
    line = _bench.format_row(_row(oop_path="tcp:ring", ip_path="tcp:ring"))
    assert line.split() == [
        "1024",
        "256",
        "float32",
        "sum",
        "-",
        "12.50",
        "0.08",
        "0.08",
        "0",
        "12.50",
        "0.08",
        "0.08",
        "0",
        "tcp:ring",
    ]
    names = header[1]
    for col in ("size", "count", "type", "redop", "root", "time", "algbw", "busbw", "#wrong"):
        end = names.index(col) + len(col)  # right-aligned: header and value end together
        assert line[end - 1] != " " and (end == len(line) or line[end] == " "), col
    assert names.index("algorithm") == line.index("tcp:ring")  # left-aligned, the last column


def test_format_row_variants():
    line = _bench.format_row(
        _row(
            op=None,
            root=1,
            oop_time_us=None,
            oop_algbw=None,
            oop_busbw=None,
            oop_wrong=None,
            ip_time_us=123.456,
            ip_wrong=None,
            ip_path="shm",
        )
    )
    assert line.split()[3:] == ["-", "1", "-", "-", "-", "-", "123.5", "0.08", "0.08", "N/A", "shm"]
    assert _bench.format_row(_row(oop_path="shm", ip_path="tcp:tree")).split()[-1] == "shm/tcp:tree"
    assert _bench.format_row(_row()).split()[-1] == "-"  # path unknown
    assert _bench.format_time(12345.6).strip() == "12346"
    assert _bench.format_time(1.234).strip() == "1.23"


def test_footer():
    rows = [_row(), _row(oop_wrong=3, oop_busbw=1.0, ip_busbw=2.0)]
    lines = _bench.footer_lines(rows, checked=True)
    assert lines[0] == "# Out of bounds values : 3 FAILED"
    assert float(lines[1].split(":")[1].split()[0]) == pytest.approx((0.08192 * 2 + 3.0) / 4)
    assert _bench.footer_lines([_row()], checked=True)[0] == "# Out of bounds values : 0 OK"


# --------------------------------------------------- check data and reference
def _average(total, n):
    """avg from a sum in the dtype: integers truncate (toward zero: sums are >= 0 here)."""
    if total.dtype.kind in "iu":
        return (total.astype(np.int64) // n).astype(total.dtype)
    return (total / total.dtype.type(n)).astype(total.dtype)


def test_tile_into_with_offset():
    period = np.arange(7.0)
    dst = np.empty(17)
    _bench.tile_into(dst, period, start=5)
    assert dst.tolist() == [(5 + k) % 7 for k in range(17)]


@pytest.mark.parametrize("nranks", [1, 2, 3, 8, 200])
@pytest.mark.parametrize("op", ["sum", "prod", "max", "min", "avg"])
def test_check_data_is_exact_in_every_dtype(op, nranks):
    """Reducing the typed inputs in the dtype's own arithmetic (rank order and reversed)
    gives the float64 reference; the integer sentinel is never a result."""
    combine = {"sum": np.add, "avg": np.add, "prod": np.multiply, "max": np.maximum, "min": np.minimum}[op]
    for name in _dtypes_here():
        if nranks > 8 and name not in ("int8", "uint8", "float16", "bfloat16"):
            continue  # the narrow types are the ones that bound the data
        data = _bench.CheckData(name, op, nranks)
        typed = [data.typed(r)[:3000] for r in range(nranks)]
        for order in (range(nranks), range(nranks - 1, -1, -1)):
            order = list(order)
            acc = typed[order[0]].copy()
            for r in order[1:]:
                acc = combine(acc, typed[r]).astype(data.dtype)
            if op == "avg":  # nonnegative, so floor division truncates
                acc = _average(acc, nranks)
            assert data.count_wrong(np.asarray(acc).astype(data.dtype), data.reduced()) == 0, (name, op)
        if data.dtype.kind in "iu":
            assert not np.any(data.reduced() == data.sentinel)


@pytest.mark.parametrize("name", ["int8", "uint8", "float16"])
def test_check_data_bounds_for_many_ranks(name):
    n = 5000
    for op in ("sum", "prod"):
        d = _bench.CheckData(name, op, n)
        assert d.window < n
        bound = _bench.exact_sum_limit(d.dtype) if op == "sum" else 2 ** _bench.max_pow2_exponent(d.dtype)
        top = d.window * d.hi if op == "sum" else 2**d.window
        assert top <= bound


def test_count_wrong_finds_errors():
    data = _bench.CheckData("float32", "sum", 2)
    n = _bench.PERIOD * 2 + 17
    got = np.empty(n, np.float32)
    _bench.tile_into(got, data.reduced().astype(np.float32), start=3)
    assert data.count_wrong(got, data.reduced(), start=3) == 0
    assert data.count_wrong(got, data.reduced(), start=4) > n // 2  # shifted by one element
    got[5] += 1
    got[-1] = np.nan
    assert data.count_wrong(got, data.reduced(), start=3) == 2
    avg = _bench.CheckData("float16", "avg", 3)
    exact = avg.reduced()[:100]
    close = exact.astype(np.float16)  # rounded: within tolerance
    assert avg.count_wrong(close, avg.reduced()) == 0
    close[7] = np.float16(exact[7] + 0.5)
    close[8] = np.nan
    assert avg.count_wrong(close, avg.reduced()) == 2


# ------------------------------------------ the benchmark loop on simulated ranks
class _World:
    """n in-process ranks: each FakeComm records its call; the last rank's call runs
    the collective for everyone in numpy, in the buffer's own dtype."""

    def __init__(self, n, corrupt=False):
        self.n, self.pending, self.corrupt = n, {}, corrupt

    def call(self, rank, name, args):
        self.pending[rank] = args
        if len(self.pending) == self.n:
            calls, self.pending = self.pending, {}
            getattr(self, name)(calls)
            if self.corrupt:  # one element of every rank's output
                for args in calls.values():
                    out = next(a for a in args[1::-1] if isinstance(a, np.ndarray))
                    if len(out):
                        out[len(out) // 2 : len(out) // 2 + 1] += 1

    @staticmethod
    def _op(op, n, bufs):
        fn = {"SUM": np.add, "AVG": np.add, "PROD": np.multiply, "MAX": np.maximum, "MIN": np.minimum}[op]
        acc = bufs[0].copy()
        for b in bufs[1:]:
            acc = fn(acc, b).astype(acc.dtype)
        return _average(acc, n) if op == "AVG" else acc

    def all_reduce(self, calls):
        res = self._op(calls[0][2], self.n, [calls[r][0].copy() for r in range(self.n)])
        for s, d, _ in calls.values():
            (s if d is None else d)[...] = res

    def reduce(self, calls):
        root = calls[0][3]
        res = self._op(calls[0][2], self.n, [calls[r][0].copy() for r in range(self.n)])
        s, d = calls[root][:2]
        (s if d is None else d)[...] = res

    def broadcast(self, calls):
        root = calls[0][1]
        src = calls[root][0].copy()
        for buf, _ in calls.values():
            buf[...] = src

    def all_gather(self, calls, root=None):
        sends = [calls[r][0].copy() for r in range(self.n)]
        for r, (_s, d, *_) in calls.items():
            if root is None or r == root:
                d[...] = np.concatenate(sends)

    def gather(self, calls):
        self.all_gather(calls, root=calls[0][2])

    def reduce_scatter(self, calls):
        res = self._op(calls[0][2], self.n, [calls[r][0].copy() for r in range(self.n)])
        b = len(res) // self.n
        for r, (_s, d, _) in calls.items():
            d[...] = res[r * b : (r + 1) * b]

    def all_to_all(self, calls):
        sends = [calls[r][0].copy() for r in range(self.n)]
        b = len(sends[0]) // self.n
        for r, (_s, d) in calls.items():
            d[...] = np.concatenate([sends[j][r * b : (r + 1) * b] for j in range(self.n)])

    def scatter(self, calls):
        root = calls[0][2]
        src = calls[root][0].copy()
        b = len(src) // self.n
        for r, (_s, d, _) in calls.items():
            d[...] = src[r * b : (r + 1) * b]


class _FakeComm:
    platform = "fake"

    def __init__(self, world, rank):
        self.world, self.rank, self.size = world, rank, world.n

    def __getattr__(self, name):
        if name in _bench.COLLECTIVES:
            return lambda *args: self.world.call(self.rank, name, args)
        raise AttributeError(name)


class _Op(str):
    """Stands in for ReduceOp: the fake world keys on the upper-case name."""


@pytest.mark.parametrize("nranks", [1, 2, 3])
@pytest.mark.parametrize("collective", _bench.COLLECTIVES)
def test_cases_check_clean_on_simulated_ranks(collective, nranks):
    """make_case/prepare/count_wrong agree with reference semantics of every collective,
    out of place and in place, at sizes around the data period; a corrupted result is seen."""
    world = _World(nranks)
    comms = [_FakeComm(world, r) for r in range(nranks)]
    ops = ("SUM", "PROD", "AVG", "MIN") if collective in _bench.REDUCING else (None,)
    root = nranks - 1 if collective in _bench.ROOTED else None
    dtypes = [d for d in ("int8", "uint16", "float16", "bfloat16", "float32") if d in _dtypes_here()]
    for dname in dtypes:
        dt = _bench.numpy_dtype(dname)
        for op in ops:
            data = _bench.CheckData(dname, op and op.lower(), nranks)
            for nbytes in (0, 24, (_bench.PERIOD + 5) * 3 * dt.itemsize):
                total, count = _bench.counts(collective, nbytes, dt.itemsize, nranks)
                bufs = [(np.zeros(total, dt), np.zeros(total, dt)) for _ in comms]
                for mode in _bench.modes(collective):
                    for corrupt in (False, True):
                        world.corrupt = corrupt
                        cases = [
                            _bench.make_case(c, collective, s, d, total, count, _Op(op or ""), root, mode == "ip")
                            for c, (s, d) in zip(comms, bufs)
                        ]
                        for r, case in enumerate(cases):
                            _bench.prepare(case, data, r)
                        for case in cases:
                            case.run()
                        wrong = sum(_bench.count_wrong(case, data) for case in cases)
                        if not corrupt:
                            assert wrong == 0, (dname, op, nbytes, mode)
                        elif count:
                            assert wrong > 0, (dname, op, nbytes, mode)


# ----------------------------------------------------- real 2-rank runs
def parse_table(text):
    """Rows of a bench table: (size, count, type, redop, root, [oop 4], [ip 4], algorithm);
    a ``[r] `` prefix (uniccl run's) is dropped."""
    rows = []
    for line in text.splitlines():
        line = re.sub(r"^\[\d+\] ", "", line)
        if not line.strip() or line.startswith("#") or line.startswith("uniccl "):
            continue
        f = line.split()
        assert len(f) == 14, line
        rows.append(
            {
                "size": int(f[0]),
                "count": int(f[1]),
                "dtype": f[2],
                "op": f[3],
                "root": f[4],
                "oop": f[5:9],
                "ip": f[9:13],
                "algorithm": f[13],
            }
        )
    return rows


def header(text):
    """The '#' lines before the first table, without uniccl run's prefix."""
    lines = [re.sub(r"^\[0\] ", "", x) for x in text.splitlines()]
    lines = [x for x in lines if x.startswith("#")]
    return lines[: next(i for i, x in enumerate(lines) if x.startswith("# Collective:"))]


def expected_rows(collective, lo, hi, factor, dtypes, nops, n=2):
    return (
        sum(
            len(_bench.plan_rows(collective, _bench.size_sweep(lo, hi, factor), _bench.numpy_dtype(d).itemsize, n))
            for d in dtypes
        )
        * nops
    )


def check_rows(rows, expected):
    assert len(rows) == expected
    for row in rows:
        for mode in ("oop", "ip"):
            t, algbw, busbw, wrong = row[mode]
            assert wrong == "0", row  # every element compared with the float64 reference
            assert float(t) > 0 and float(busbw) == pytest.approx(float(algbw), abs=0.011)  # 2 ranks: factor 1


def expected_path(transport, collective, nbytes):
    """What the ranks' tuner picks for a 2-rank job on one host (shm), or with UNICCL_TRANSPORT=tcp."""
    if transport == "shm":
        return "shm"
    from uniccl.comm.tuner import Tuner

    return "tcp:" + Tuner(2, "tcp", False).choose(collective, nbytes).algorithm


def test_two_rank_run(tmp_path):
    """-np 2 relaunches under mpiexec: the header names the MPI in use."""
    pytest.importorskip("mpi4py")
    if _bench.find_mpiexec() is None:
        pytest.skip("no mpiexec")
    out = tmp_path / "rows.json"
    cmd = [
        UNICCL,
        "bench",
        "all_reduce",
        "-np",
        "2",
        "-b",
        "8",
        "-e",
        "64K",
        "-f",
        "8",
        "-c",
        "1",
        "-d",
        "all",
        "-o",
        "all",
        "--json",
        str(out),
    ]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    rows = parse_table(res.stdout)
    # 12 dtypes x 5 ops x sizes 8..64K (x8), less those below one element
    expected = expected_rows("all_reduce", 8, 64 << 10, 8, _bench.DTYPES, 5)
    check_rows(rows, expected)
    assert {r["algorithm"] for r in rows} == {"shm"}  # one host: the shared-memory engine
    assert "# Out of bounds values : 0 OK" in res.stdout
    head = "\n".join(header(res.stdout))
    assert "nranks 2 on 1 host" in head and "transport shm (all ranks on one host)" in head
    assert "ranks met over MPI (started by an MPI launcher); MPI " in head, head
    data = json.loads(out.read_text())
    assert len(data) == expected and {r["nranks"] for r in data} == {2}
    assert all(r["oop_wrong"] == 0 and r["ip_wrong"] == 0 for r in data)
    facts = data[0]["run"]
    assert facts["bootstrap"] == "mpi" and facts["mpi"] and facts["launcher"] == "mpiexec"
    assert facts["command"] == shlex.join(["uniccl", *cmd[1:]])  # the user's command, not the relaunched one


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_under_uniccl_run(transport):
    """`uniccl run -n 2 uniccl bench ...`: the ranks meet over TCP; the header lists both ranks
    and the transport, claims no MPI, and each row names the path its calls took."""
    env = dict(os.environ)
    if transport == "tcp":
        env["UNICCL_TRANSPORT"] = "tcp"
    cmd = [
        UNICCL,
        "run",
        "-n",
        "2",
        UNICCL,
        "bench",
        "allreduce",
        "-b",
        "8",
        "-e",
        "256K",
        "-f",
        "8",
        "-d",
        "float32,int32",
        "-o",
        "sum,max",
        "-n",
        "3",
        "-w",
        "1",
    ]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=180, env=env)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    head = header(res.stdout)
    text = "\n".join(head)
    why = "all ranks on one host" if transport == "shm" else "UNICCL_TRANSPORT=tcp"
    assert (
        f"# uniccl {_bench_version()} bench: nranks 2 on 1 host  platform cpu  transport {transport} ({why})" in text
    ), text
    assert "ranks met over TCP (started by uniccl run)" in text
    assert not any("MPI" in x for x in head if not x.startswith("#  Rank")), text  # no MPI in use: none named
    ranks = [re.fullmatch(r"#  Rank +(\d+) Pid +(\d+) on +(\S+) device +(\d+) \[(\w+)\]", x) for x in head]
    ranks = [m.groups() for m in ranks if m]
    assert [int(r[0]) for r in ranks] == [0, 1], text
    assert len({r[1] for r in ranks}) == 2 and {r[2] for r in ranks} == {socket.gethostname()}
    assert {r[4] for r in ranks} == {"cpu"}
    rows = parse_table(res.stdout)
    check_rows(rows, expected_rows("all_reduce", 8, 256 << 10, 8, ("float32", "int32"), 2))
    for row in rows:
        assert row["algorithm"] == expected_path(transport, "all_reduce", row["size"]), row
    if transport == "tcp":  # both all_reduce algorithms show up over the sweep
        assert {r["algorithm"] for r in rows} == {
            expected_path("tcp", "all_reduce", s) for s in _bench.size_sweep(8, 256 << 10, 8)
        }
    assert res.stdout.count("# Out of bounds values : 0 OK") == 1


def _bench_version():
    from uniccl._version import __version__

    return __version__


def _expected_commit():
    """The commit the installed package knows: a build's stamp, or the checkout it is imported from."""
    import uniccl
    from uniccl import _version

    if getattr(_version, "__commit__", None):
        return _version.__commit__
    here = os.path.dirname(uniccl.__file__)
    tracked = subprocess.run(["git", "-C", here, "ls-files", "--error-unmatch", "__init__.py"], capture_output=True)
    if tracked.returncode != 0:
        return None
    return subprocess.run(["git", "-C", here, "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()


def test_json_to_stdout_carries_the_run_facts():
    """`--json -` under `uniccl run --no-prefix`: stdout is the JSON alone, every row with the facts."""
    cmd = [
        UNICCL,
        "run",
        "--no-prefix",
        "-n",
        "2",
        UNICCL,
        "bench",
        "allgather",
        "-b",
        "64",
        "-e",
        "64K",
        "-f",
        "32",
        "-n",
        "2",
        "-w",
        "1",
        "--json",
        "-",
    ]
    before = datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0)
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=180, env=dict(os.environ, UNICCL_TRANSPORT="tcp"))
    after = datetime.datetime.now(datetime.timezone.utc)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    rows = json.loads(res.stdout)  # nothing else on stdout
    assert len(rows) == expected_rows("all_gather", 64, 64 << 10, 32, ("float32",), 1) == 3
    for row in rows:
        assert row["collective"] == "all_gather" and row["oop_wrong"] == 0 and row["ip_wrong"] == 0
        assert row["oop_path"] == row["ip_path"] == "tcp:ring"
        facts = row["run"]
        assert facts["uniccl"] == _bench_version() and facts["commit"] == _expected_commit()
        assert facts["transport"] == "tcp" and facts["bootstrap"] == "tcp" and facts["launcher"] == "uniccl run"
        assert facts["mpi"] is None and facts["ranks"] == 2 and facts["hosts"] == [socket.gethostname()]
        assert facts["command"] == "uniccl bench allgather -b 64 -e 64K -f 32 -n 2 -w 1 --json -"
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", facts["date"])
        date = datetime.datetime.strptime(facts["date"], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=datetime.timezone.utc)
        assert before <= date <= after
    assert [r["size"] for r in rows] == [64, 2048, 65536]


def test_alias_on_one_process():
    """`uniccl bench allreduce` alone: one rank, checked, nothing moves ("local")."""
    res = subprocess.run(
        [UNICCL, "bench", "allreduce", "-b", "8", "-e", "4K", "-f", "8", "-n", "2", "-w", "1", "-o", "sum,max"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 0, res.stdout + res.stderr
    rows = parse_table(res.stdout)
    check_rows_one = [r for r in rows if r["oop"][3] == "0" and r["ip"][3] == "0"]
    assert len(rows) == len(check_rows_one) == expected_rows("all_reduce", 8, 4096, 8, ("float32",), 2, n=1)
    assert {r["algorithm"] for r in rows} == {"local"}
    assert "# Collective: all_reduce  nranks 1" in res.stdout


def test_np_without_mpiexec_runs_under_uniccl_run(tmp_path, monkeypatch, capfd):
    for var in _LAUNCH_VARS:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(_bench, "find_mpiexec", lambda: None)
    out = tmp_path / "rows.json"
    assert (
        _bench.relaunch(
            _parse("reduce_scatter", "-np", "2", "-b", "1K", "-e", "4K", "-f", "4", "-n", "2", "--json", str(out))
        )
        == 0
    )
    text = capfd.readouterr()
    rows = json.loads(out.read_text())
    assert [r["size"] for r in rows] == [1024, 4096] and all(r["oop_wrong"] == r["ip_wrong"] == 0 for r in rows)
    assert rows[0]["run"]["launcher"] == "uniccl run" and rows[0]["run"]["bootstrap"] == "tcp"
    assert len(parse_table(text.out)) == 2


@pytest.mark.parametrize("case", ["np", "mpi_transport"])
def test_wrong_combination_is_one_line(case):
    """-np 4 inside a 2-rank job, or the MPI transport without MPI: one line, no traceback, rc != 0."""
    env, extra = dict(os.environ), []
    if case == "np":
        extra, want = ["-np", "4"], "uniccl bench: error: -np 4, but this job already has 2 ranks"
    else:
        env["UNICCL_TRANSPORT"] = "mpi"
        want = "uniccl bench: error: UNICCL_TRANSPORT=mpi but this communicator was bootstrapped over tcp"
    res = subprocess.run(
        [UNICCL, "run", "-n", "2", UNICCL, "bench", "all_reduce", "-e", "64", *extra],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    both = res.stdout + res.stderr
    assert res.returncode == 2, both
    assert "Traceback" not in both, both
    from_ranks = [x for x in both.splitlines() if re.match(r"\[\d+\] ", x)]  # what the ranks printed
    assert len(from_ranks) == 1 and from_ranks[0].startswith(f"[0] {want}"), both
