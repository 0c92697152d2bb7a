"""OpenSSH orchestration of the nodes of ``uniccl run``: reachability, rsync of a
project, a per-node virtual environment built from one local wheelhouse.

Safety rules:
* ssh runs in BatchMode (never a password prompt) and gets ``--`` before the one remote
  command string; hosts and users are checked by ``_cluster`` (nothing can become an
  ssh option);
* every word of the remote command is ``shlex.quote``d; the only unquoted text is
  ours (``"$HOME"``, ``"${PATH:+:$PATH}"``), so no host name, path, argument or value
  can inject shell code; the remote login shell must be POSIX (sh, bash, dash, zsh);
* no secret ever goes on a command line: callers pass secrets on ssh's stdin.
All node operations run in parallel threads and return ``{node.label: reason}`` for
the nodes that failed instead of raising half-way.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from .._errors import InvalidArgument
from .cluster import Node, check_host, check_user, default_workdir

__all__ = [
    "ssh_argv",
    "remote_command",
    "check_reachable",
    "sync",
    "build",
    "build_wheelhouse",
    "print_progress",
    "DEFAULT_EXCLUDES",
]

_ENV_KEY_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# ssh flags that take a value in the next word (man ssh)
_SSH_VALUE_FLAGS = set("BbcDEeFIiJLlmOoPpRSWw")
# build outputs and environments that belong to one host: never copied to another
DEFAULT_EXCLUDES = (
    ".git/",
    ".venv*/",
    "build/",
    "dist/",
    "__pycache__/",
    "*.egg-info/",
    ".pytest_cache/",
    ".uniccl-venv/",
    ".uniccl-wheelhouse/",
)
VENV = ".uniccl-venv"
WHEELHOUSE = ".uniccl-wheelhouse"


def _bad(msg: str, argument: str) -> InvalidArgument:
    return InvalidArgument(msg, op="run", argument=argument)


def _option_words(options) -> list[str]:
    """Node ssh options as ssh words: ``-x`` style words (and the value after a flag
    that takes one) are kept; a ``Key=Value`` word becomes ``-o Key=Value``."""
    out, takes_value = [], False
    for word in options:
        if not isinstance(word, str) or not word or "\0" in word:
            raise _bad(f"invalid ssh option {word!r}", "ssh_options")
        if takes_value:
            out.append(word)
            takes_value = False
        elif word.startswith("-"):
            out.append(word)
            takes_value = len(word) == 2 and word[1] in _SSH_VALUE_FLAGS
        else:
            out += ["-o", word]
    if takes_value:
        raise _bad(f"ssh option {out[-1]!r} needs a value", "ssh_options")
    return out


def _ssh_words(node: Node, extra_options=()) -> list[str]:
    """``ssh`` and its options, without the destination. ssh keeps the first value of
    an option, so BatchMode=yes cannot be undone and ConnectTimeout=5 is only the
    default."""
    words = [
        "ssh",
        "-o",
        "BatchMode=yes",
        *_option_words(extra_options),
        *_option_words(node.ssh_options),
        "-o",
        "ConnectTimeout=5",
    ]
    if node.port is not None:
        words += ["-p", str(int(node.port))]
    return words


def _destination(node: Node) -> str:
    check_host(node.host)
    if node.user is not None:
        return f"{check_user(node.user)}@{node.host}"
    return node.host


def _remote_path(path: str) -> str:
    """A quoted remote path; a leading ``~`` means the remote home."""
    if not isinstance(path, str) or not path or "\0" in path:
        raise _bad(f"invalid remote path {path!r}", "workdir")
    if path == "~":
        return '"$HOME"'
    if path.startswith("~/"):
        return '"$HOME"/' + shlex.quote(path[2:]) if path[2:] else '"$HOME"/'
    return shlex.quote(path)


def _prepend(var: str, paths) -> str:
    # the remote's own value is kept after ours; an unset or empty one adds no
    # trailing ':' (which would mean the current directory)
    return f"export {var}=" + ":".join(_remote_path(p) for p in paths) + f'"${{{var}:+:${var}}}"'


def remote_command(remote_argv, *, env=None, workdir=None, path_prepend=(), ld_library_path_prepend=()) -> str:
    """The one POSIX shell string ssh runs: ``cd -- WD && export K=V && ... && exec ARGV``.

    ``export`` rather than ``env K=V``: the shell does not reread the values and an
    argv[0] containing ``=`` cannot be taken for an assignment; PATH is set before
    ``exec`` looks the program up.
    """
    argv = list(remote_argv)
    if not argv or not all(isinstance(a, str) and "\0" not in a for a in argv):
        raise _bad("the remote command must be a non-empty list of strings without NUL", "program")
    if argv[0].startswith("-"):
        raise _bad(f"program name {argv[0]!r} must not start with '-'", "program")
    parts = []
    if workdir:
        parts.append("cd -- " + _remote_path(workdir))
    for key, value in (env or {}).items():
        if not isinstance(key, str) or not _ENV_KEY_RE.fullmatch(key):
            raise _bad(f"invalid environment variable name {key!r}", "env")
        value = str(value)
        if "\0" in value:
            raise _bad(f"environment variable {key} contains a NUL byte", "env")
        parts.append(f"export {key}={shlex.quote(value)}")
    if path_prepend:
        parts.append(_prepend("PATH", path_prepend))
    if ld_library_path_prepend:
        parts.append(_prepend("LD_LIBRARY_PATH", ld_library_path_prepend))
    parts.append("exec " + " ".join(shlex.quote(a) for a in argv))
    return " && ".join(parts)


def ssh_argv(
    node: Node, remote_argv, *, env: dict | None = None, workdir: str | None = None, extra_options=()
) -> list[str]:
    """argv that runs ``remote_argv`` on ``node`` over ssh in ``workdir`` (None: the
    node's; ``""``: the remote home) with the node's env and PATH/LD_LIBRARY_PATH
    prepends, then ``env`` over the node's env."""
    merged = {**node.env, **(env or {})}
    cmd = remote_command(
        remote_argv,
        env=merged,
        workdir=node.workdir if workdir is None else workdir,
        path_prepend=node.path_prepend,
        ld_library_path_prepend=node.ld_library_path_prepend,
    )
    return [*_ssh_words(node, extra_options), _destination(node), "--", cmd]


# parallel runs ------------------------------------------------------------------------


def print_progress(label: str | None, message: str) -> None:
    """A progress callback for terminals: ``[host] message``; label None is a summary."""
    print(message if label is None else f"[{label}] {message}", file=sys.stderr, flush=True)


def _each(nodes, fn) -> dict:
    """fn(node) on every node at once; {label: reason} of those that returned one."""
    nodes = list(nodes)
    if not nodes:
        return {}
    with ThreadPoolExecutor(max_workers=min(32, len(nodes))) as pool:
        results = list(pool.map(_guarded(fn), nodes))
    return {node.label: reason for node, reason in zip(nodes, results) if reason}


def _guarded(fn):
    def run(node):
        try:
            return fn(node)
        except InvalidArgument as e:
            return str(e)
        except OSError as e:  # e.g. no ssh or rsync client
            return f"{type(e).__name__}: {e}"

    return run


def _last_line(text: str, default: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else default


def _stream(argv, on_line, timeout: float) -> tuple[int | None, str]:
    """Run argv, calling on_line for every line (or carriage-return update) of its
    merged output; returns (exit status or None on timeout, the output's tail)."""
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    expired = threading.Event()

    def expire():
        expired.set()
        proc.kill()

    timer = threading.Timer(timeout, expire)
    timer.start()
    tail, buf = [], b""
    try:
        while chunk := proc.stdout.read1(65536):
            buf += chunk
            *done, buf = re.split(rb"[\r\n]", buf)
            for raw in done:
                line = raw.decode(errors="replace").strip()
                if line:
                    tail = (tail + [line])[-20:]
                    on_line(line)
        if buf.strip():
            tail.append(buf.decode(errors="replace").strip())
        rc = proc.wait()
    finally:
        timer.cancel()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()
    return (None if expired.is_set() else rc), "\n".join(tail)


def check_reachable(nodes, timeout: float = 10) -> dict[str, str]:
    """Log in to every node at once; {label: why} for those that cannot be used."""

    def probe(node):
        argv = [
            *_ssh_words(node, ["-o", f"ConnectTimeout={max(1, int(timeout))}"]),
            _destination(node),
            "--",
            "echo uniccl-ok",
        ]
        try:
            res = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout + 5)
        except subprocess.TimeoutExpired:
            return f"no answer within {timeout + 5:g} s"
        if res.returncode != 0:
            return _last_line(res.stderr, f"ssh exited with status {res.returncode}")
        if "uniccl-ok" not in res.stdout:
            return f"unexpected output from the remote shell: {_last_line(res.stdout, '')!r}"
        return None

    return _each(nodes, probe)


# rsync --------------------------------------------------------------------------------


def _check_target(workdir: str, argument: str = "workdir") -> None:
    # rsync --delete makes the target a mirror: never the home, /, or a top folder
    norm = workdir.rstrip("/")
    if norm in ("", ".", "~", "..") or (norm.startswith("/") and norm.count("/") < 2):
        raise _bad(f"refusing to sync into {workdir!r}: --delete would empty it; use a dedicated folder", argument)


def _rsync_dest(node: Node, path: str) -> str:
    # rsync -s sends the path itself (no remote shell): "~/x" is "x" under the home
    rel = path[2:] if path.startswith("~/") else path
    host = f"[{node.host}]" if ":" in node.host else node.host
    user = f"{check_user(node.user)}@" if node.user is not None else ""
    return f"{user}{host}:{rel.rstrip('/')}/"


def _rsync(node: Node, src: str, dest_dir: str, excludes, report, timeout: float) -> str | None:
    check_host(node.host)
    ssh_cmd = " ".join(shlex.quote(w) for w in _ssh_words(node))  # rsync splits it itself
    argv = [
        "rsync",
        "-a",
        "-s",
        "--delete",
        "--info=progress2",
        "--no-inc-recursive",
        *[f"--exclude={e}" for e in excludes],
        "-e",
        ssh_cmd,
        # the remote shell creates the target (and its parents) before rsync starts
        "--rsync-path",
        f"mkdir -p -- {_remote_path(dest_dir)} && rsync",
        src.rstrip("/") + "/",
        _rsync_dest(node, dest_dir),
    ]
    last = [0.0]

    def on_line(line):
        m = re.search(r"\s(\d+)%", " " + line)
        if m and time.monotonic() - last[0] > 0.5:  # at most two updates a second
            last[0] = time.monotonic()
            report(f"{m.group(1)}%  {line.split()[0]} bytes")

    rc, tail = _stream(argv, on_line, timeout)
    if rc is None:
        return f"rsync did not finish within {timeout:g} s"
    if rc != 0:
        # ssh's own message says more than rsync's closing "rsync error: ..." lines
        lines = [
            ln for ln in tail.splitlines() if not ln.startswith("rsync") and not re.match(r"[\d,.]+[kMGT]?\s+\d+%", ln)
        ]
        return f"{_last_line(lines[-1] if lines else tail, 'rsync failed')} (rsync exit {rc})"
    return None


def sync(nodes, src_dir, *, progress=None, excludes=DEFAULT_EXCLUDES, timeout: float = 1800) -> dict[str, str]:
    """Mirror ``src_dir`` into every node's workdir (rsync -a --delete over ssh, all
    nodes at once; a node without a workdir gets ``default_workdir(src_dir)``).
    ``progress(label, message)`` gets live per-node lines and, with label None, the
    summary. Returns {label: why} for the nodes that failed."""
    src_dir = os.fspath(src_dir)
    if not os.path.isdir(src_dir):
        raise _bad(f"{src_dir} is not a directory", "--sync")
    report = progress or (lambda label, message: None)
    nodes = list(nodes)
    for node in nodes:
        if node.workdir is None:
            node.workdir = default_workdir(src_dir)
        _check_target(node.workdir)
    start = time.monotonic()

    def one(node):
        t0 = time.monotonic()
        report(node.label, f"syncing {src_dir} -> {node.workdir}")
        reason = _rsync(node, src_dir, node.workdir, excludes, lambda m: report(node.label, m), timeout)
        report(node.label, f"FAILED: {reason}" if reason else f"synced in {time.monotonic() - t0:.1f} s")
        return reason

    failures = _each(nodes, one)
    report(None, _summary("synced", nodes, failures, start))
    return failures


def _summary(verb: str, nodes, failures: dict, start: float) -> str:
    ok = len(nodes) - len(failures)
    text = f"{verb} {ok}/{len(nodes)} node(s) in {time.monotonic() - start:.1f} s"
    if failures:
        text += "; failed: " + "; ".join(f"{k}: {v}" for k, v in failures.items())
    return text


# build --------------------------------------------------------------------------------


def build_wheelhouse(
    project_dir, platforms, dest, *, progress=None, python: str = sys.executable, timeout: float = 1800
) -> None:
    """Wheels of the project, the plugins of ``platforms`` and all their dependencies
    in ``dest``, built once here (the nodes may have no internet)."""
    project_dir = os.path.abspath(os.fspath(project_dir))
    report = progress or (lambda label, message: None)
    targets = [project_dir]
    for platform in sorted(set(platforms)):
        plugin = os.path.join(project_dir, "plugins", platform)
        if not os.path.isfile(os.path.join(plugin, "pyproject.toml")):
            raise _bad(f"no plugin for platform {platform!r} ({plugin} has no pyproject.toml)", "platform")
        targets.append(plugin)
    argv = [
        python,
        "-m",
        "pip",
        "wheel",
        "--disable-pip-version-check",
        "--progress-bar",
        "off",
        "--wheel-dir",
        os.fspath(dest),
        *targets,
    ]
    report("local", f"building wheels: {' '.join(os.path.relpath(t, project_dir) for t in targets)}")
    rc, tail = _stream(
        argv,
        lambda line: report("local", line) if line.startswith(("Building", "Created", "Saved", "Collecting")) else None,
        timeout,
    )
    if rc != 0:
        raise InvalidArgument(
            "building the wheels failed: "
            + (f"timed out after {timeout:g} s" if rc is None else _last_line(tail, f"exit {rc}")),
            op="run",
            argument="--build",
        )


# Runs on the node, in its workdir, with the node's env: a venv with its python (kept
# when it exists: node.python may be that venv's own python after a first build), every
# dependency from the wheelhouse, then our own wheels reinstalled (same version, new code).
_INSTALL = r"""set -e
if [ -x "$2/bin/python" ]; then
    echo "reusing $2"
else
    echo "creating $2 with $1"
    "$1" -m venv "$2"
fi
echo "installing uniccl and uniccl-$3 from the wheelhouse"
"$2/bin/python" -m pip install -q --disable-pip-version-check --no-index \
    --find-links "$4" uniccl "uniccl-$3"
"$2/bin/python" -m pip install -q --disable-pip-version-check --no-index --no-deps \
    --force-reinstall "$4"/uniccl-[0-9]*.whl "$4"/uniccl_"$(echo "$3" | tr - _)"-[0-9]*.whl
echo "UNICCL_VENV_PYTHON=$PWD/$2/bin/python"
"""


def build(nodes, project_dir, *, progress=None, wheelhouse=None, timeout: float = 1800) -> dict[str, str]:
    """Install the project into ``<workdir>/.uniccl-venv`` on every node: wheels built
    once here (or taken from ``wheelhouse``), rsynced to ``<workdir>/.uniccl-wheelhouse``,
    installed on all nodes at once with ``pip --no-index``. A node that succeeds gets
    ``node.python`` set to its venv's python. Returns {label: why} of the failures."""
    nodes = list(nodes)
    report = progress or (lambda label, message: None)
    start = time.monotonic()
    for node in nodes:
        if node.workdir is None:
            node.workdir = default_workdir(project_dir)
    tmp = None
    try:
        if wheelhouse is None:
            tmp = tempfile.mkdtemp(prefix="uniccl-build-")
            wheelhouse = os.path.join(tmp, "wheelhouse")
            try:
                build_wheelhouse(
                    project_dir, {n.platform or "cpu" for n in nodes}, wheelhouse, progress=progress, timeout=timeout
                )
            except InvalidArgument as e:
                failures = {node.label: str(e) for node in nodes}
                report(None, _summary("built", nodes, failures, start))
                return failures
        failures = _each(nodes, lambda node: _install(node, os.fspath(wheelhouse), report, timeout))
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    report(None, _summary("built", nodes, failures, start))
    return failures


def _install(node: Node, wheelhouse: str, report, timeout: float) -> str | None:
    t0 = time.monotonic()
    say = lambda m: report(node.label, m)  # noqa: E731
    wd = node.workdir.rstrip("/")
    target = f"{wd}/{WHEELHOUSE}"
    _check_target(target)
    say(f"copying the wheelhouse to {target}")
    reason = _rsync(node, wheelhouse, target, (), lambda m: None, timeout)
    if reason:
        say(f"FAILED: {reason}")
        return reason
    python = node.python or "python3"
    argv = ssh_argv(
        node, ["sh", "-c", _INSTALL, "sh", python, VENV, node.platform or "cpu", WHEELHOUSE], workdir=node.workdir
    )
    found = []

    def on_line(line):
        if line.startswith("UNICCL_VENV_PYTHON="):
            found.append(line.split("=", 1)[1])
        else:
            say(line)

    rc, tail = _stream(argv, on_line, timeout)
    if rc != 0 or not found:
        reason = (
            f"installing did not finish within {timeout:g} s"
            if rc is None
            else f"{_last_line(tail, 'install failed')} (exit {rc})"
        )
        say(f"FAILED: {reason}")
        return reason
    node.python = found[-1]
    say(f"built in {time.monotonic() - t0:.1f} s: {node.python}")
    return None
