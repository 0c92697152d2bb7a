"""Unit tests of the node model and of the ssh command lines (no root, no sshd).

The quoting tests run the remote command string that ssh would send through a real
local shell (what the remote login shell does with it) and check that the program
receives exactly the argv, environment and working directory asked for.
"""

import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest

from uniccl import InvalidArgument
from uniccl.launch import ssh as _ssh
from uniccl.launch.cluster import Node, assign_ranks, load_cluster, parse_hostfile, parse_hosts
from uniccl.launch.ssh import remote_command, ssh_argv

HOSTILE = [
    "a b",
    "it's",
    'say "hi"',
    "$(touch {canary})",
    "`touch {canary}`",
    "x; touch {canary}",
    "line1\nline2",
    "-rf",
    "--",
    "",
    "back\\slash",
    "*",
    "~",
    "$HOME",
    "${PATH}",
    "a|b&c>d",
    "ünï¢ødé",
    "'",
    '"',
    "\t",
]

# The fake program: reports what it received.
REPORT = (
    "import sys, os, json; print(json.dumps({'argv': sys.argv[1:], 'cwd': os.getcwd(), "
    "'env': {k: os.environ.get(k) for k in json.loads(sys.argv[1])}}))"
)


def _shells():
    return [s for s in ("bash", "sh", "dash", "zsh") if shutil.which(s)]


def _run_remote(cmd: str, shell: str, env: dict, cwd: str) -> dict:
    res = subprocess.run([shell, "-c", cmd], capture_output=True, text=True, env=env, cwd=cwd, timeout=30)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


@pytest.mark.parametrize("shell", _shells())
def test_remote_command_reproduces_argv_env_and_workdir(tmp_path, shell):
    canary = tmp_path / "canary"
    args = [a.replace("{canary}", str(canary)) for a in HOSTILE]
    workdir = tmp_path / "w o'r\"k $(touch canary) ;`touch canary`\nd"
    workdir.mkdir()
    env = {"UC_A": "a b", "UC_B": "$(touch %s)" % canary, "UC_C": "x'y\"z\n`w`", "UC_D": "", "UC_E": "-e"}
    keys = json.dumps(sorted(env) + ["PATH", "LD_LIBRARY_PATH"])
    node = Node(
        "h1",
        env={"UC_A": "overridden", "UC_F": "from node"},
        workdir="/nonexistent",
        path_prepend=["/opt/a b", "~/bin $(x)"],
        ld_library_path_prepend=["/l 'ib"],
    )
    argv = ssh_argv(node, [sys.executable, "-c", REPORT, keys, *args], env=env, workdir=str(workdir))
    assert argv[-2] == "--" and argv[-3] == "h1"
    base_env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path)}
    got = _run_remote(argv[-1], shell, base_env, cwd=str(tmp_path))
    assert got["argv"] == [keys, *args]
    assert got["cwd"] == str(workdir)
    assert got["env"] == {
        **env,
        "PATH": f"/opt/a b:{tmp_path}/bin $(x):{os.environ['PATH']}",
        "LD_LIBRARY_PATH": "/l 'ib",
    }  # no trailing ':' when it was unset
    assert not canary.exists() and not (workdir / "canary").exists()
    # a remote LD_LIBRARY_PATH is kept after ours; the node's own env comes through
    keys = json.dumps(["LD_LIBRARY_PATH", "UC_F"])
    cmd = ssh_argv(node, [sys.executable, "-c", REPORT, keys], workdir="")[-1]
    got = _run_remote(cmd, shell, {**base_env, "LD_LIBRARY_PATH": "/old"}, cwd=str(tmp_path))
    assert got["env"] == {"LD_LIBRARY_PATH": "/l 'ib:/old", "UC_F": "from node"}
    assert got["cwd"] == str(tmp_path)  # workdir="" means no cd


def test_remote_command_home_relative_workdir(tmp_path):
    (tmp_path / "my proj").mkdir()
    cmd = remote_command([sys.executable, "-c", "import os; print(os.getcwd())"], workdir="~/my proj")
    res = subprocess.run(
        ["sh", "-c", cmd],
        capture_output=True,
        text=True,
        timeout=30,
        env={"HOME": str(tmp_path), "PATH": os.environ["PATH"]},
    )
    assert res.stdout.strip() == str(tmp_path / "my proj")


def test_remote_command_failing_cd_does_not_run_the_program(tmp_path):
    cmd = remote_command(["touch", str(tmp_path / "ran")], workdir=str(tmp_path / "missing"))
    res = subprocess.run(["sh", "-c", cmd], capture_output=True, text=True, timeout=30)
    assert res.returncode != 0 and not (tmp_path / "ran").exists()


@pytest.mark.parametrize("bad", [[], ["-x"], ["ok", "nul\0"], [1]])
def test_remote_command_rejects_bad_argv(bad):
    with pytest.raises(InvalidArgument):
        remote_command(bad)


@pytest.mark.parametrize("key", ["A B", "1X", "X;Y", "$(x)", "", "A=B"])
def test_remote_command_rejects_bad_env_names(key):
    with pytest.raises(InvalidArgument) as e:
        remote_command(["true"], env={key: "v"})
    assert e.value.argument == "env"


def test_ssh_argv_layout():
    node = Node(
        "node-1.example", user="alice", port=2222, ssh_options=["-i", "/k ey", "StrictHostKeyChecking=no", "-v"]
    )
    argv = ssh_argv(node, ["true"], extra_options=["-o", "ConnectTimeout=9"])
    assert argv == [
        "ssh",
        "-o",
        "BatchMode=yes",
        "-o",
        "ConnectTimeout=9",
        "-i",
        "/k ey",
        "-o",
        "StrictHostKeyChecking=no",
        "-v",
        "-o",
        "ConnectTimeout=5",
        "-p",
        "2222",
        "alice@node-1.example",
        "--",
        "exec true",
    ]


@pytest.mark.parametrize(
    "host",
    ["-oProxyCommand=touch /tmp/x", "a b", "h;id", "$(id)", "`id`", "h\n", "h\t", "u@h", "", "h'", 'h"', "h/x", "-h"],
)
def test_hostile_host_names_are_rejected(host):
    with pytest.raises(InvalidArgument) as e:
        ssh_argv(Node(host), ["true"])
    assert e.value.op == "run"


@pytest.mark.parametrize("user", ["-lroot", "a b", "x@y", "a;b", "$(id)", "a\nb", ""])
def test_hostile_user_names_are_rejected(user):
    with pytest.raises(InvalidArgument):
        ssh_argv(Node("h1", user=user), ["true"])


def test_ssh_option_value_missing():
    with pytest.raises(InvalidArgument):
        ssh_argv(Node("h1", ssh_options=["-i"]), ["true"])


@pytest.mark.skipif(shutil.which("rsync") is None, reason="rsync is not installed")
def test_rsync_gets_the_exact_ssh_words(tmp_path, monkeypatch):
    """rsync splits -e itself: a fake ssh in PATH records what rsync hands it; the
    failure is collected per node, not raised."""
    fake = tmp_path / "bin"
    fake.mkdir()
    record = tmp_path / "argv.json"
    (fake / "ssh").write_text(
        textwrap.dedent(f"""\
        #!{sys.executable}
        import json, sys
        json.dump(sys.argv[1:], open({str(record)!r}, "w"))
        sys.stderr.write("fake ssh: refused\\n")
        sys.exit(255)
        """)
    )
    (fake / "ssh").chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake}:{os.environ['PATH']}")
    src = tmp_path / "src"
    src.mkdir()
    node = Node(
        "h1",
        user="bob",
        port=2022,
        workdir="/srv/my dir/it's",
        ssh_options=["-i", "/keys/a b'c\"d", "-o", "ProxyJump=x y", "''"],
    )
    seen = []
    failures = _ssh.sync([node], src, progress=lambda label, msg: seen.append((label, msg)))
    assert list(failures) == ["h1:2022"] and "fake ssh: refused" in failures["h1:2022"]
    words = json.loads(record.read_text())
    expected = _ssh._ssh_words(node)[1:]
    assert words[: len(expected)] == expected
    assert "h1" in words[len(expected) :]
    assert seen[-1][0] is None and "0/1" in seen[-1][1]


@pytest.mark.parametrize("workdir", ["/", "~", ".", "", "/tmp", "~/", "/home/", ".."])
def test_sync_refuses_to_mirror_into_home_or_top_folders(tmp_path, workdir):
    with pytest.raises(InvalidArgument, match="refusing to sync"):
        _ssh.sync([Node("h1", workdir=workdir)], tmp_path)


# node lists ---------------------------------------------------------------------------


def test_parse_hosts():
    nodes = parse_hosts("h1:4,bob@h2.example:2, h3 ,[fe80::1%eth0]:3,fe80::2,10.0.0.1:1")
    assert [(n.host, n.user, n.slots) for n in nodes] == [
        ("h1", None, 4),
        ("h2.example", "bob", 2),
        ("h3", None, 1),
        ("fe80::1%eth0", None, 3),
        ("fe80::2", None, 1),
        ("10.0.0.1", None, 1),
    ]


@pytest.mark.parametrize(
    "spec",
    [
        "",
        "h1:0",
        "h1:-1",
        "h1:x",
        "h1,,h2",
        "h1:4,h1:2",
        "h 1",
        "h1:4:ib0",
        "-oProxyCommand=x:2",
        "[fe80::1",
        "[::1]x",
        "@h1",
        "h1:",
    ],
)
def test_parse_hosts_errors(spec):
    with pytest.raises(InvalidArgument) as e:
        parse_hosts(spec)
    assert e.value.argument == "--hosts"


def test_parse_hostfile(tmp_path):
    f = tmp_path / "hosts"
    f.write_text("# a cluster\n\nh1:4\nh2 slots=2 max_slots=8   # Open MPI\n  bob@h3\t# plain\nh4 slots=3\n")
    nodes = parse_hostfile(f)
    assert [(n.host, n.user, n.slots) for n in nodes] == [
        ("h1", None, 4),
        ("h2", None, 2),
        ("h3", "bob", 1),
        ("h4", None, 3),
    ]


@pytest.mark.parametrize(
    "text, where",
    [
        ("h1\nh2 slots=x\n", ":2:"),
        ("h1 foo=3\n", ":1:"),
        ("h1\n\nh1:2\n", "twice"),
        ("# nothing\n", "no hosts"),
        ("h1\n-oProxy\n", ":2:"),
        ("h1:2:ib0\n", ":1:"),
    ],
)
def test_parse_hostfile_errors(tmp_path, text, where):
    f = tmp_path / "hosts"
    f.write_text(text)
    with pytest.raises(InvalidArgument) as e:
        parse_hostfile(f)
    assert where in str(e.value) and e.value.argument == "--hostfile"


def test_parse_hostfile_missing(tmp_path):
    with pytest.raises(InvalidArgument, match="cannot read hostfile"):
        parse_hostfile(tmp_path / "nope")


CLUSTER = """\
defaults:
  user: alice
  port: 2222
  workdir: ~/work
  python: /opt/py/bin/python3
  env: {OMP_NUM_THREADS: 2, MODE: base, FLAG: yes}
  path_prepend: [/opt/base/bin]
  ssh_options: [StrictHostKeyChecking=no]
  slots: 2
nodes:
  - host: h1
    slots: 4
  - host: bob@h2
    platform: metax
    env: {MODE: fast, EXTRA: "a b"}
    path_prepend: [/opt/metax/bin]
    ld_library_path_prepend: [/opt/metax/lib]
  - h3
"""


def test_load_cluster(tmp_path):
    f = tmp_path / "cluster.yaml"
    f.write_text(CLUSTER)
    h1, h2, h3 = load_cluster(f)
    assert (h1.host, h1.user, h1.port, h1.slots, h1.workdir, h1.python, h1.platform) == (
        "h1",
        "alice",
        2222,
        4,
        "~/work",
        "/opt/py/bin/python3",
        None,
    )
    assert h1.env == {"OMP_NUM_THREADS": "2", "MODE": "base", "FLAG": "1"}
    assert h1.path_prepend == ["/opt/base/bin"] and h1.ssh_options == ["StrictHostKeyChecking=no"]
    assert (h2.user, h2.platform, h2.slots) == ("bob", "metax", 2)
    assert h2.env == {"OMP_NUM_THREADS": "2", "MODE": "fast", "FLAG": "1", "EXTRA": "a b"}
    assert h2.path_prepend == ["/opt/metax/bin"] and h2.ld_library_path_prepend == ["/opt/metax/lib"]
    assert (h3.host, h3.user, h3.slots) == ("h3", "alice", 2)
    h1.env["X"] = "1"
    h1.path_prepend.append("/x")
    assert "X" not in h3.env and h3.path_prepend == ["/opt/base/bin"]  # no shared defaults


@pytest.mark.parametrize(
    "text, where",
    [
        ("nodes:\n  - host: h1\n  - {host: h2, slot: 3}\n", "nodes[1]: unknown key(s) ['slot']"),
        ("nodes:\n  - host: h1\n    port: 70000\n", "port out of range"),
        ("nodes:\n  - host: h1\n    slots: 0\n", "nodes[0]: slots:"),
        ("nodes:\n  - host: '-oProxyCommand=x'\n", "invalid host name"),
        ("nodes:\n  - host: h1\n    env: [A]\n", "env: must be a mapping"),
        ("nodes:\n  - host: h1\n    env: {'A B': 1}\n", "invalid variable name"),
        ("nodes:\n  - {port: 22}\n", "needs a 'host'"),
        ("nodes: []\n", "non-empty list"),
        ("defaults: {user: 'a b'}\nnodes: [h1]\n", "defaults: user:"),
        ("default: {}\nnodes: [h1]\n", "unknown top-level"),
        ("nodes:\n  - host: h1\n   bad: [\n", "not valid YAML"),
        ("nodes: [h1, h1]\n", "twice"),
        ("nodes:\n  - {host: a@h1, user: b}\n", "not both"),
        ("- h1\n", "expected a mapping"),
    ],
)
def test_load_cluster_errors(tmp_path, text, where):
    f = tmp_path / "cluster.yaml"
    f.write_text(text)
    with pytest.raises(InvalidArgument) as e:
        load_cluster(f)
    assert where in str(e.value) and str(f) in str(e.value)
    assert e.value.argument == "--cluster"


def test_load_cluster_yaml_error_names_the_line(tmp_path):
    f = tmp_path / "cluster.yaml"
    f.write_text("nodes:\n  - host: h1\n  - host: [h2\n")
    with pytest.raises(InvalidArgument, match=r"cluster.yaml:\d+: not valid YAML"):
        load_cluster(f)


def test_assign_ranks():
    nodes = parse_hosts("a:4,b:4,c")
    assert assign_ranks(nodes) == [[0, 1, 2, 3], [4, 5, 6, 7], [8]]
    assert assign_ranks(nodes, 5) == [[0, 1, 2, 3], [4], []]
    assert assign_ranks(nodes, 1) == [[0], [], []]
    with pytest.raises(InvalidArgument, match="--oversubscribe") as e:
        assign_ranks(nodes, 10)
    assert e.value.argument == "-n"
    two = parse_hosts("a:2,b")
    assert assign_ranks(two, 5, oversubscribe=True) == [[0, 1, 2], [3, 4]]
    assert assign_ranks(two, 7, oversubscribe=True) == [[0, 1, 2, 3], [4, 5, 6]]
    for bad in (0, -1, True, 2.5):
        with pytest.raises(InvalidArgument):
            assign_ranks(two, bad)
    with pytest.raises(InvalidArgument):
        assign_ranks([], 1)
