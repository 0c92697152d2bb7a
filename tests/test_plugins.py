"""Plugin discovery, selection, failure recording and the environment overrides.

Fake plugins are installed as real entry points (a ``*.dist-info`` folder on
PYTHONPATH) and examined in a fresh interpreter, exactly as a user's would be.
"""
import json
import os
import subprocess
import sys
import textwrap

import pytest

FAKES = {
    "broken": "raise ImportError('libbroken.so.3: cannot open shared object file')\n",
    "future": """
        import pluggy
        hookimpl = pluggy.HookimplMarker("uniccl")
        @hookimpl
        def uniccl_platform_info():
            return {"name": "future", "version": "9.0", "api_version": 2, "priority": 5}
        """,
    "missing": """
        import pluggy
        hookimpl = pluggy.HookimplMarker("uniccl")
        @hookimpl
        def uniccl_platform_info():
            return {"name": "missing", "version": "0.1", "api_version": 1, "priority": 5}
        @hookimpl
        def uniccl_probe():
            return {"available": True}
        """,
    "absent": """
        import pluggy
        import uniccl_cpu  # borrow every hook, then say the SDK is missing
        globals().update({k: getattr(uniccl_cpu, k) for k in dir(uniccl_cpu) if k.startswith("uniccl_")})
        hookimpl = pluggy.HookimplMarker("uniccl")
        @hookimpl
        def uniccl_platform_info():
            return {"name": "absent", "version": "0.1", "api_version": 1, "priority": 20}
        @hookimpl
        def uniccl_probe():
            return {"available": False, "reason": "libabsent.so.1 not found (searched: /opt/absent/lib)"}
        """,
    "badhook": """
        import pluggy
        hookimpl = pluggy.HookimplMarker("uniccl")
        @hookimpl
        def uniccl_reduce(nonsense_argument):
            pass
        """,
}


@pytest.fixture(scope="module")
def fake_path(tmp_path_factory):
    root = tmp_path_factory.mktemp("fakeplugins")
    for name, body in FAKES.items():
        (root / f"fake_{name}.py").write_text(textwrap.dedent(body))
        info = root / f"fake_{name}-0.1.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: fake-{name}\nVersion: 0.1\n")
        (info / "entry_points.txt").write_text(f"[uniccl.plugins]\n{name} = fake_{name}\n")
    return str(root)


def run_py(code: str, fake_path=None, **env):
    full = dict(os.environ)
    full.pop("UNICCL_PLATFORM", None)
    full.pop("UNICCL_PLUGINS", None)
    if fake_path:
        full["PYTHONPATH"] = fake_path + os.pathsep + full.get("PYTHONPATH", "")
    full.update(env)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=full, timeout=60)


INFO = "import json, uniccl; print(json.dumps(uniccl.info(), default=str))"


def plugins_of(res):
    assert res.returncode == 0, res.stderr
    data = json.loads(res.stdout)
    return {p["name"]: p for p in data["plugins"]}, data


def test_import_does_not_discover_or_start_mpi():
    res = run_py("import sys, uniccl; print('mpi4py.MPI' in sys.modules, uniccl._plugins._manager is None)")
    assert res.stdout.split() == ["False", "True"], res.stderr


def test_cpu_plugin_available():
    plugins, data = plugins_of(run_py(INFO))
    assert plugins["cpu"]["state"] == "available"
    assert plugins["cpu"]["priority"] == 0
    assert plugins["cpu"]["devices"]
    assert data["chosen"]["platform"] == "cpu"
    assert data["mpi"]["name"] in ("MPICH", "Open MPI")


def test_every_failure_is_recorded_and_cpu_still_works(fake_path):
    plugins, data = plugins_of(run_py(INFO, fake_path))
    assert plugins["broken"]["state"] == "failed"
    assert "libbroken.so.3" in plugins["broken"]["reason"]
    assert plugins["future"]["state"] == "rejected"
    assert "plugin API 2" in plugins["future"]["reason"]
    assert plugins["missing"]["state"] == "rejected"
    assert "uniccl_reduce" in plugins["missing"]["reason"]
    assert plugins["badhook"]["state"] == "failed"
    assert plugins["absent"]["state"] == "unavailable"
    assert "libabsent.so.1 not found" in plugins["absent"]["reason"]
    assert data["chosen"]["platform"] == "cpu"
    assert "absent unavailable" in data["chosen"]["why"]


def test_info_cli_explains_states(fake_path):
    env = dict(os.environ, PYTHONPATH=fake_path)
    out = subprocess.run([sys.executable, "-m", "uniccl", "info"], capture_output=True, text=True, env=env,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    assert "cpu" in out.stdout and "available" in out.stdout
    assert "unavailable: libabsent.so.1 not found" in out.stdout
    assert "chosen platform: cpu" in out.stdout
    assert "MPI:" in out.stdout


def test_blocking_a_plugin(fake_path):
    plugins, data = plugins_of(run_py(INFO, fake_path, UNICCL_PLUGINS="^absent,broken"))
    assert plugins["absent"]["state"] == "blocked"
    assert plugins["broken"]["state"] == "blocked"


def test_forced_platform_is_fatal_with_reasons(fake_path):
    code = ("import uniccl\ntry:\n    uniccl.init()\nexcept uniccl.PlatformUnavailable as e:\n"
            "    print('RAISED', e)\n")
    res = run_py(code, fake_path, UNICCL_PLATFORM="absent")
    assert "RAISED" in res.stdout, res.stdout + res.stderr
    assert "libabsent.so.1 not found" in res.stdout
    res = run_py(code, fake_path, UNICCL_PLATFORM="nosuch")
    assert "nosuch: not installed" in res.stdout


def test_forced_order_falls_through_to_next(fake_path):
    code = "import uniccl\nc = uniccl.init()\nprint(c.platform, '|', c.platform_reason)\n"
    res = run_py(code, fake_path, UNICCL_PLATFORM="absent,cpu")
    assert res.stdout.startswith("cpu |"), res.stdout + res.stderr
    assert "UNICCL_PLATFORM=absent,cpu" in res.stdout


def test_blocking_every_platform_gives_clear_error():
    code = ("import uniccl\ntry:\n    uniccl.init()\nexcept uniccl.PlatformUnavailable as e:\n"
            "    print('RAISED', e)\n")
    res = run_py(code, UNICCL_PLUGINS="^cpu")
    assert "RAISED" in res.stdout and "blocked" in res.stdout, res.stdout + res.stderr


def test_backend_is_resolved_to_plain_functions():
    import uniccl_cpu

    import uniccl

    with uniccl.init() as comm:
        assert comm._backend.reduce is uniccl_cpu.uniccl_reduce
        assert comm._backend.memcpy is uniccl_cpu.uniccl_memcpy
