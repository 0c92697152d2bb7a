"""One parser for every UNICCL_* variable (uniccl._env), driven by the README's Environment table.

Each variable the README lists has an entry in ``uniccl._env.VARS`` (and each variable meant for
users is in the README); a bad value of each typed one makes a real ``uniccl.init()`` fail with
``uniccl.InvalidArgument`` naming the variable and the value; booleans take exactly
1/0/true/false/yes/no/on/off; sizes take K/M/G as ``uniccl bench -b`` does (one parser); a side
channel that cannot be served is a warning on stderr when the communicator is made.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import uniccl
from uniccl import _env
from uniccl.observability import log as _log

ROOT = Path(__file__).resolve().parent.parent
INIT = "import uniccl; c = uniccl.init(); print('made', c.size); c.destroy()"


def readme_rows() -> list[tuple[list[str], str]]:
    """(variables of the row, its meaning) for each row of the README's Environment table."""
    text = (ROOT / "README.md").read_text()
    section = text.split("\n## Environment\n", 1)[1]
    rows, seen_table = [], False
    for line in section.splitlines():
        if not line.startswith("|"):
            if seen_table:
                break
            continue
        seen_table = True
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]]
        names = re.findall(r"UNICCL_[A-Z0-9_]+", cells[0])
        if names:
            rows.append((names, cells[1]))
    return rows


README_VARS = [name for names, _ in readme_rows() for name in names]


def _clean_env(**extra) -> dict:
    """This environment without any UNICCL_* variable (a user's shell), plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("UNICCL_")}
    env.update(PYTHONUNBUFFERED="1", **extra)
    return env


def run_py(code: str, timeout: float = 60, **env) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout, env=_clean_env(**env)
    )


# ------------------------------------------------------------------ the two tables agree
def test_readme_table_is_found_and_large():
    assert len(README_VARS) >= 40, README_VARS  # the parser found the table, not a fragment of it
    assert len(set(README_VARS)) == len(README_VARS), "a variable listed twice"


def test_every_readme_variable_has_an_entry():
    missing = [n for n in README_VARS if n not in _env.VARS]
    assert not missing, f"in the README's table but not in uniccl._env.VARS: {missing}"


def test_every_user_variable_is_in_the_readme():
    missing = [n for n, v in _env.VARS.items() if v.user and n not in README_VARS]
    assert not missing, f"in uniccl._env.VARS (user=True) but not in the README's table: {missing}"


def test_entries_are_well_formed():
    for name, v in _env.VARS.items():
        assert v.name == name and name.startswith("UNICCL_")
        assert v.kind in _env.KINDS, name
        assert v.meaning and "\n" not in v.meaning, name
        assert (v.kind == "enum") == bool(v.choices), name
        if v.default is not None:  # a default is a value of the variable's own kind
            kind_of = {
                "bool": bool,
                "int": int,
                "float": float,
                "size": int,
                "port": int,
                "str": str,
                "enum": str,
                "path": str,
                "list": list,
            }
            assert isinstance(v.default, kind_of[v.kind]), (name, v.default)
        if v.choices and v.default is not None:
            assert v.default in v.choices, name


@pytest.mark.parametrize(
    "names,meaning",
    [r for r in readme_rows() if len(r[0]) == 1 and "default " in r[1]],
    ids=lambda x: x[0] if isinstance(x, list) else "",
)
def test_readme_defaults_are_the_tables(names, meaning):
    """A default the README states ("default 524288", "default 64M") is the table's."""
    m = re.search(r"default (\d+[KMG]?)\b", meaning)
    if m is None:
        pytest.skip("no numeric default stated")
    assert _env.VARS[names[0]].default == _env.parse_size(m.group(1)), (names[0], m.group(1))


def test_module_defaults_are_the_tables():
    from uniccl.bootstrap import rendezvous as _uniqueid
    from uniccl.comm import algorithms as _algorithms
    from uniccl.observability import flight as _flight
    from uniccl.reliability import timeout as _timeout
    from uniccl.transport.shm import attach as _shm_attach

    d = {n: v.default for n, v in _env.VARS.items()}
    assert d["UNICCL_CHUNK_BYTES"] == _algorithms.DEFAULT_CHUNK_BYTES
    assert d["UNICCL_SHM_SLOT_BYTES"] == _shm_attach.DEFAULT_SLOT_BYTES
    assert d["UNICCL_TIMEOUT"] == _timeout.DEFAULT_TIMEOUT
    assert d["UNICCL_FLIGHT_RECORDER"] == _flight.DEFAULT_CAPACITY
    assert d["UNICCL_INIT_TIMEOUT"] == _uniqueid.DEFAULT_TIMEOUT


# ------------------------------------------------------------------ bad values, through real use
#: a value each variable must refuse, by kind (path and list variables take any text)
BAD_BY_KIND = {"bool": "disabled", "int": "lots", "float": "soon", "size": "12Q", "port": "http", "enum": "bogus"}
BAD_BY_NAME = {
    "UNICCL_PLUGINS": "nccl",
    "UNICCL_ALGO": "all_reduce",
    "UNICCL_FAULT_INJECT": "explode=1",
    "UNICCL_RENDEZVOUS": "no-port-here",
    "UNICCL_JOB_SECRET": "not hex",
    "UNICCL_METRICS_PORT": "70000",
    "UNICCL_SHM_SLOT_BYTES": "1000",
    "UNICCL_TCP_RETAIN_BYTES": "-1",
}


def bad_value(name: str) -> str | None:
    return BAD_BY_NAME.get(name) or BAD_BY_KIND.get(_env.VARS[name].kind)


TYPED = [n for n in README_VARS if n in _env.VARS and bad_value(n) is not None]
UNTYPED = [n for n in README_VARS if n in _env.VARS and bad_value(n) is None]


def test_the_untyped_variables_are_only_paths_lists_and_free_text():
    assert {_env.VARS[n].kind for n in UNTYPED} <= {"path", "list", "str"}, UNTYPED
    assert len(TYPED) >= 30


@pytest.mark.parametrize("name", TYPED)
def test_a_bad_value_fails_init_naming_the_variable(name):
    """What a user sees: ``uniccl.init()`` with the bad value set raises InvalidArgument that
    names the variable and the value (and, for a typed one, what it accepts)."""
    value = bad_value(name)
    res = run_py(INIT, **{name: value})
    assert res.returncode != 0 and "made" not in res.stdout, (name, res.stdout, res.stderr[-1500:])
    last = res.stderr.strip().splitlines()[-1]
    assert "InvalidArgument" in last and name in last and value in last, (name, res.stderr[-1500:])
    assert f"argument '{name}'" in last, last
    if _env.VARS[name].kind in BAD_BY_KIND and name not in ("UNICCL_BOOTSTRAP",):
        assert "expected " + _env.VARS[name].allowed() in last, last


# free text (UNICCL_ALGO, UNICCL_FAULT_INJECT) is judged where it is used: by init, above
@pytest.mark.parametrize("name", [n for n in TYPED if _env.VARS[n].kind != "str" or _env.VARS[n].pattern])
def test_a_bad_value_is_an_invalid_argument_in_process(name, monkeypatch):
    monkeypatch.setenv(name, bad_value(name))
    with pytest.raises(uniccl.InvalidArgument) as info:
        _env.get(name)
    assert info.value.argument == name and name in str(info.value) and bad_value(name) in str(info.value)
    with pytest.raises(uniccl.InvalidArgument):
        _env.check_all()


def test_unset_and_blank_are_the_default(monkeypatch):
    for name, v in _env.VARS.items():
        monkeypatch.delenv(name, raising=False)
        assert _env.get(name) == v.default, name
        monkeypatch.setenv(name, "  ")
        assert _env.get(name) == v.default, name
    _env.check_all()


def test_getters_check_the_kind():
    assert _env.flag("UNICCL_TELEMETRY") in (True, False)
    with pytest.raises(TypeError):
        _env.flag("UNICCL_CHUNK_BYTES")
    with pytest.raises(KeyError):
        _env.get("UNICCL_NO_SUCH_VARIABLE")


# ------------------------------------------------------------------ booleans
BOOLS = [n for n, v in _env.VARS.items() if v.kind == "bool"]
SPELLINGS = {"1": True, "0": False, "true": True, "false": False, "yes": True, "no": False, "on": True, "off": False}


@pytest.mark.parametrize("name", BOOLS)
def test_booleans_take_exactly_the_documented_spellings(name, monkeypatch):
    for text, value in SPELLINGS.items():
        for spelled in (text, text.upper(), text.capitalize(), f" {text} "):
            monkeypatch.setenv(name, spelled)
            assert _env.flag(name) is value, (name, spelled)
    for text in ("disabled", "enabled", "2", "-1", "y", "n", "none", "truthy", "o"):
        monkeypatch.setenv(name, text)
        with pytest.raises(uniccl.InvalidArgument, match=name):
            _env.flag(name)


def test_shm_checksum_disabled_is_refused_not_on():
    """The bug: UNICCL_SHM_CHECKSUM=disabled turned checksums on. Now init says so."""
    res = run_py(INIT, UNICCL_SHM_CHECKSUM="disabled")
    assert res.returncode != 0 and "UNICCL_SHM_CHECKSUM='disabled'" in res.stderr, res.stderr[-1500:]


def _shm_job(**env) -> subprocess.CompletedProcess:
    code = (
        "import uniccl, numpy as np; c = uniccl.init(); x = np.ones(1 << 16); c.all_reduce(x); "
        "print('ENGINE', c.rank, c._tuner.transport, c._engine.integrity['shm_checksums'], x[0])"
    )
    return subprocess.run(
        [sys.executable, "-m", "uniccl", "run", "--no-prefix", "-n", "2", sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        env=_clean_env(**env),
    )


@pytest.mark.parametrize("spelled,on", [("yes", True), ("ON", True), ("off", False), ("No", False), ("disabled", None)])
def test_shm_checksum_spellings_in_a_real_job(spelled, on):
    """Two ranks on the shared-memory engine: checksums on or off as spelled; "disabled" fails
    on every rank (it used to turn them on)."""
    res = _shm_job(UNICCL_SHM_CHECKSUM=spelled)
    if on is None:
        out = res.stdout + res.stderr  # (the ranks' output, as uniccl run passes it on)
        assert res.returncode != 0 and "ENGINE" not in out, out[-3000:]
        assert out.count("InvalidArgument") >= 2 and "UNICCL_SHM_CHECKSUM='disabled'" in out, out[-3000:]
        return
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    lines = sorted(line for line in res.stdout.splitlines() if line.startswith("ENGINE"))
    assert lines == [f"ENGINE {r} shm {on} 2.0" for r in range(2)], res.stdout


# ------------------------------------------------------------------ sizes
def test_sizes_take_k_m_g_like_bench():
    from uniccl.tools import bench as _bench

    assert _bench.parse_size is _env.parse_size  # one parser
    for text, n in (
        ("8", 8),
        ("1K", 1024),
        ("64M", 64 << 20),
        ("1G", 1 << 30),
        ("2KB", 2048),
        ("4KiB", 4096),
        (" 16 k ", 16384),
        ("3m", 3 << 20),
    ):
        assert _env.parse_size(text) == n, text
    for text in ("1.5M", "-1", "1X", "K", "", "0x1000", "1 M B"):
        with pytest.raises(ValueError):
            _env.parse_size(text)


def test_size_variables(monkeypatch):
    monkeypatch.setenv("UNICCL_CHUNK_BYTES", "64K")
    assert _env.size("UNICCL_CHUNK_BYTES") == 65536
    from uniccl.comm import algorithms as _algorithms

    assert _algorithms.chunk_bytes() == 65536
    monkeypatch.setenv("UNICCL_SHM_CMA_REDUCE_MIN_BYTES", "-1")  # "never"
    assert _env.size("UNICCL_SHM_CMA_REDUCE_MIN_BYTES") == -1
    monkeypatch.setenv("UNICCL_SHM_SLOT_BYTES", "256K")
    assert _env.size("UNICCL_SHM_SLOT_BYTES") == 256 << 10
    for bad in ("1000", "2G", "0"):  # not a multiple of 4096, over 1 GiB, under 4096
        monkeypatch.setenv("UNICCL_SHM_SLOT_BYTES", bad)
        with pytest.raises(uniccl.InvalidArgument, match="UNICCL_SHM_SLOT_BYTES"):
            _env.size("UNICCL_SHM_SLOT_BYTES")


def test_single_copy_reads_are_auto_unless_set(monkeypatch):
    monkeypatch.delenv("UNICCL_SHM_CMA", raising=False)
    assert _env.get("UNICCL_SHM_CMA") is None  # auto: where the creator measures them faster
    for text, value in (("auto", None), ("AUTO", None), ("1", True), ("on", True), ("0", False), ("off", False)):
        monkeypatch.setenv("UNICCL_SHM_CMA", text)
        assert _env.get("UNICCL_SHM_CMA") is value, text
    monkeypatch.setenv("UNICCL_SHM_CMA", "sometimes")
    with pytest.raises(uniccl.InvalidArgument, match="UNICCL_SHM_CMA.*auto"):
        _env.get("UNICCL_SHM_CMA")


def test_a_size_with_a_suffix_reaches_the_communicator():
    res = run_py("import uniccl; c = uniccl.init(); print('CHUNK', c._chunk_bytes)", UNICCL_CHUNK_BYTES="64K")
    assert res.returncode == 0 and "CHUNK 65536" in res.stdout, res.stderr[-1500:]


def test_slot_size_with_a_suffix_reaches_the_engine():
    res = _shm_job(UNICCL_SHM_SLOT_BYTES="256K", UNICCL_SHM_CHECKSUM="0")
    assert res.returncode == 0 and res.stdout.count("ENGINE") == 2, res.stdout[-2000:] + res.stderr[-2000:]


# ------------------------------------------------------------------ no environment reads per call
def test_calls_do_not_read_the_environment(monkeypatch):
    from uniccl.bootstrap.rendezvous import get_unique_id
    from uniccl.transport.tcp import Mesh, TCPTransport, derive_context

    comm = uniccl.Communicator._over(
        TCPTransport(Mesh(get_unique_id(30), 0, 1, 30), [0], derive_context(5, 0, 0)), "cpu"
    )
    reads = []
    real_get = os.environ.get
    monkeypatch.setattr(os.environ, "get", lambda *a: reads.append(a[0]) or real_get(*a), raising=False)
    real_env_get = _env.get
    monkeypatch.setattr(_env, "get", lambda *a, **k: reads.append(a[0]) or real_env_get(*a, **k))
    try:
        x = np.ones(1 << 12, np.float32)
        for _ in range(20):
            comm.all_reduce(x)
            comm.broadcast(x, root=0)
    finally:
        monkeypatch.undo()
        comm.destroy()
    assert not [r for r in reads if str(r).startswith("UNICCL_")], reads


# ------------------------------------------------------------------ side channels: a warning at startup
def test_metrics_port_taken_is_a_warning_at_startup():
    with socket.socket() as s:
        s.bind(("", 0))
        s.listen()
        port = s.getsockname()[1]
        res = run_py(INIT, UNICCL_METRICS_PORT=str(port))
    assert res.returncode == 0 and "made 1" in res.stdout, res.stderr[-1500:]
    assert f"cannot serve metrics on port {port}" in res.stderr and "UNICCL_METRICS_PORT" in res.stderr, res.stderr
    assert "Traceback" not in res.stderr


def test_metrics_port_free_is_served_without_a_warning():
    with socket.socket() as s:
        s.bind(("", 0))
        port = s.getsockname()[1]
    code = (
        "import uniccl, urllib.request; c = uniccl.init(); "
        f"print('made', c.size, len(urllib.request.urlopen('http://127.0.0.1:{port}/metrics').read()) > 0)"
    )
    res = run_py(code, UNICCL_METRICS_PORT=str(port))
    assert res.returncode == 0 and "made 1 True" in res.stdout, res.stderr[-1500:]
    assert "WARNING" not in res.stderr, res.stderr


def test_metrics_without_prometheus_client_is_a_warning(tmp_path):
    hidden = tmp_path / "prometheus_client"
    hidden.mkdir()
    (hidden / "__init__.py").write_text("raise ImportError('hidden by test_env')\n")
    with socket.socket() as s:
        s.bind(("", 0))
        port = s.getsockname()[1]
    res = run_py(INIT, UNICCL_METRICS_PORT=str(port), PYTHONPATH=str(tmp_path))
    assert res.returncode == 0 and "made 1" in res.stdout, res.stderr[-1500:]
    assert "prometheus-client is not installed" in res.stderr, res.stderr


@pytest.fixture
def read_only_dir(tmp_path):
    """A directory that even root cannot write: a read-only tmpfs (skip where mounting is not allowed)."""
    where = tmp_path / "ro"
    where.mkdir()
    if (
        os.geteuid() != 0
        or subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "ro,size=64k", "tmpfs", str(where)], capture_output=True
        ).returncode
        != 0
    ):
        pytest.skip("cannot mount a read-only tmpfs here")
    yield where
    subprocess.run(["umount", str(where)], capture_output=True)


@pytest.mark.parametrize("name", ["UNICCL_TRACE", "UNICCL_DUMP_DIR", "UNICCL_STATUS_DIR"])
def test_unwritable_directory_under_a_file_is_a_warning_at_startup(name):
    res = run_py(
        "import sys, uniccl; c = uniccl.init(); print('made', c.size); sys.stdout.flush(); "
        "import os; os._exit(0)",  # (what happens at exit is the trace's own business)
        **{name: "/etc/passwd/x"},
    )
    assert res.returncode == 0 and "made 1" in res.stdout, res.stderr[-1500:]
    warning = [line for line in res.stderr.splitlines() if "WARNING" in line and name in line]
    assert warning and "/etc/passwd/x" in warning[0] and "cannot be written" in warning[0], res.stderr


@pytest.mark.parametrize("name", ["UNICCL_TRACE", "UNICCL_DUMP_DIR"])
def test_read_only_directory_is_a_warning_at_startup(name, read_only_dir):
    for target in (read_only_dir, read_only_dir / "sub"):
        res = run_py(
            "import os, uniccl; c = uniccl.init(); print('made', c.size, flush=True); os._exit(0)",
            **{name: str(target)},
        )
        assert res.returncode == 0 and "made 1" in res.stdout, res.stderr[-1500:]
        assert f"{name}='{target}' cannot be written" in res.stderr, res.stderr


@pytest.mark.parametrize("name", ["UNICCL_TRACE", "UNICCL_DUMP_DIR", "UNICCL_STATUS_DIR"])
def test_writable_directory_is_no_warning(name, tmp_path):
    res = run_py(INIT, **{name: str(tmp_path / "new" / "dir")})
    assert res.returncode == 0 and "made 1" in res.stdout, res.stderr[-1500:]
    assert "WARNING" not in res.stderr, res.stderr


def test_check_writable_dir_warns_once(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("UNICCL_DUMP_DIR", f"/etc/passwd/once-{tmp_path.name}")
    assert _log.check_writable_dir("UNICCL_DUMP_DIR") is False
    assert _log.check_writable_dir("UNICCL_DUMP_DIR") is False
    err = capsys.readouterr().err
    assert err.count("UNICCL_DUMP_DIR") == 1, err
    monkeypatch.setenv("UNICCL_DUMP_DIR", str(tmp_path))
    assert _log.check_writable_dir("UNICCL_DUMP_DIR") is True
    monkeypatch.delenv("UNICCL_DUMP_DIR")
    assert _log.check_writable_dir("UNICCL_DUMP_DIR") is True


def test_torch_autoload_bad_value_is_named_not_ignored():
    pytest.importorskip("torch")
    code = "import torch, torch.distributed as dist; print('uniccl' in dist.Backend.backend_list)"
    res = run_py(code, timeout=120, UNICCL_TORCH_AUTOLOAD="sometimes")
    assert res.returncode == 0 and res.stdout.split() == ["False"], res.stderr[-1500:]
    assert "UNICCL_TORCH_AUTOLOAD='sometimes'" in res.stderr, res.stderr[-1500:]
    res = run_py(code, timeout=120, UNICCL_TORCH_AUTOLOAD="Yes")
    assert res.returncode == 0 and res.stdout.split() == ["True"], res.stderr[-1500:]
