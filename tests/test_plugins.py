"""Plugin discovery, selection, failure recording and the environment overrides.

Fake plugins are installed as real entry points (a ``*.dist-info`` folder on
PYTHONPATH) and examined in a fresh interpreter, exactly as a user's would be.
"""

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

FAKES = {
    "broken": "raise ImportError('libbroken.so.3: cannot open shared object file')\n",
    "future": """
        import pluggy
        hookimpl = pluggy.HookimplMarker("uniccl")
        @hookimpl
        def uniccl_platform_info():
            return {"name": "future", "version": "9.0", "api_version": [3, 4], "priority": 5}
        """,
    "ancient": """
        import pluggy
        hookimpl = pluggy.HookimplMarker("uniccl")
        @hookimpl
        def uniccl_platform_info():
            return {"name": "ancient", "version": "0.0.1", "api_version": 0, "priority": 5}
        """,
    "garbled": """
        import pluggy
        hookimpl = pluggy.HookimplMarker("uniccl")
        @hookimpl
        def uniccl_platform_info():
            return {"name": "garbled", "version": "0.1", "api_version": "2", "priority": 5}
        """,
    # written for plugin API 1 (its uniccl_transports hook included): the core adapts it
    "oldapi": """
        import pluggy
        import uniccl_cpu  # borrow the cpu plugin's hooks: host memory, kernels
        globals().update({k: getattr(uniccl_cpu, k) for k in dir(uniccl_cpu) if k.startswith("uniccl_")})
        hookimpl = pluggy.HookimplMarker("uniccl")
        calls = []
        @hookimpl
        def uniccl_platform_info():
            return {"name": "oldapi", "version": "0.9", "api_version": 1, "priority": -1}
        @hookimpl
        def uniccl_transports():
            calls.append("uniccl_transports")
            return {}
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
    assert (
        plugins["future"]["reason"]
        == "plugin implements plugin API 3..4, this uniccl supports plugin API 1..2: upgrade uniccl"
    )
    assert plugins["ancient"]["state"] == "rejected"
    assert plugins["ancient"]["reason"].endswith(
        "plugin API 0, this uniccl supports plugin API 1..2: upgrade the plugin"
    )
    assert plugins["garbled"]["state"] == "rejected"
    assert "api_version must be an int or a [lowest, highest] pair of ints, got '2'" in plugins["garbled"]["reason"]
    assert plugins["oldapi"]["state"] == "available" and plugins["oldapi"]["api_version"] == 1
    assert plugins["oldapi"]["adapted"] == "its uniccl_transports hook is not called"
    assert plugins["cpu"]["api_version"] == 2 and plugins["cpu"]["adapted"] == ""
    assert plugins["missing"]["state"] == "rejected"
    assert "uniccl_reduce" in plugins["missing"]["reason"]
    assert plugins["badhook"]["state"] == "failed"
    assert plugins["absent"]["state"] == "unavailable"
    assert "libabsent.so.1 not found" in plugins["absent"]["reason"]
    assert data["chosen"]["platform"] == "cpu"
    assert "absent unavailable" in data["chosen"]["why"]


def test_info_cli_explains_states(fake_path):
    env = dict(os.environ, PYTHONPATH=fake_path)
    out = subprocess.run([sys.executable, "-m", "uniccl", "info"], capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "cpu" in out.stdout and "available" in out.stdout
    assert "unavailable: libabsent.so.1 not found" in out.stdout
    assert "chosen platform: cpu" in out.stdout
    assert (
        "rejected: plugin implements plugin API 3..4, this uniccl supports plugin API 1..2: upgrade uniccl"
        in out.stdout
    )
    assert "plugin API 1 through its adapter (its uniccl_transports hook is not called)" in out.stdout
    assert "MPI:" in out.stdout


def test_blocking_a_plugin(fake_path):
    plugins, data = plugins_of(run_py(INFO, fake_path, UNICCL_PLUGINS="^absent,broken"))
    assert plugins["absent"]["state"] == "blocked"
    assert plugins["broken"]["state"] == "blocked"


def test_forced_platform_is_fatal_with_reasons(fake_path):
    code = "import uniccl\ntry:\n    uniccl.init()\nexcept uniccl.PlatformUnavailable as e:\n    print('RAISED', e)\n"
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
    code = "import uniccl\ntry:\n    uniccl.init()\nexcept uniccl.PlatformUnavailable as e:\n    print('RAISED', e)\n"
    res = run_py(code, UNICCL_PLUGINS="^cpu")
    assert "RAISED" in res.stdout and "blocked" in res.stdout, res.stdout + res.stderr


def test_backend_is_resolved_to_plain_functions():
    import uniccl_cpu

    import uniccl

    with uniccl.init() as comm:
        assert comm._backend.reduce is uniccl_cpu.uniccl_reduce
        assert comm._backend.memcpy is uniccl_cpu.uniccl_memcpy


def test_a_plugin_of_the_previous_api_runs_collectives_through_its_adapter(fake_path, tmp_path):
    """Two plain processes on the version-1 plugin (forced): all_reduce and broadcast give
    numpy's answer, and the hook version 2 dropped is never called."""
    code = textwrap.dedent("""
        import json, sys
        import numpy as np
        import uniccl
        import fake_oldapi
        rank, uid_file = int(sys.argv[1]), sys.argv[2]
        import os, time
        if rank == 0:
            uid = uniccl.get_unique_id()
            with open(uid_file + ".tmp", "wb") as f:
                f.write(bytes(uid))
            os.replace(uid_file + ".tmp", uid_file)
        else:
            while not os.path.exists(uid_file):
                time.sleep(0.01)
            uid = open(uid_file, "rb").read()
        with uniccl.Communicator(uid, rank, 2, timeout=60) as comm:
            x = np.arange(1000, dtype=np.float64) * (rank + 1)
            comm.all_reduce(x)
            y = np.full(7, float(rank))
            comm.broadcast(y, root=1)
            print(json.dumps({"platform": comm.platform, "sum": x.tolist(), "bcast": y.tolist(),
                              "calls": fake_oldapi.calls}))
        """)
    env = dict(
        os.environ, PYTHONPATH=fake_path + os.pathsep + os.environ.get("PYTHONPATH", ""), UNICCL_PLATFORM="oldapi"
    )
    uid_file = str(tmp_path / "uid")
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code, str(r), uid_file],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for r in range(2)
    ]
    outs = [p.communicate(timeout=120) for p in procs]
    for p, (_out, err) in zip(procs, outs):
        assert p.returncode == 0, err
    want = (np.arange(1000, dtype=np.float64) * 3).tolist()
    for out, _ in outs:
        got = json.loads(out.strip().splitlines()[-1])
        assert got["platform"] == "oldapi" and got["sum"] == want and got["bcast"] == [1.0] * 7
        assert got["calls"] == []


def test_every_older_accepted_api_version_has_an_adapter():
    from uniccl import _plugins, hookspecs

    assert set(_plugins.ADAPTERS) == set(range(hookspecs.UNICCL_PLUGIN_API_OLDEST, hookspecs.UNICCL_PLUGIN_API))
    assert _plugins.negotiate([1, 5]) == (hookspecs.UNICCL_PLUGIN_API, "")  # the highest both know
    assert _plugins.negotiate(True)[0] == 0 and _plugins.negotiate([2, 1])[0] == 0
