"""``uniccl run``: start a job from one process to many nodes.

Launchers:
- ``local``: N processes here; the launcher hosts the rendezvous, ranks connect
  over TCP and use shared memory between them.  No MPI involved.
- ``mpi``: the installed ``mpiexec`` (MPICH's hydra or Open MPI's prterun) with
  the right flags for its flavour; ranks use MPI.
- ``ssh``: our own multi-node orchestration: one agent per node over OpenSSH
  (BatchMode, every argument quoted), the job spec and secret on the agent's
  stdin; ranks meet at the launcher's rendezvous and use TCP across nodes.
- ``slurm``: ``srun`` inside an allocation, ranks bootstrap over TCP.
- ``auto``: ssh when hosts are given, slurm inside an allocation, else local.

The first rank that fails stops the job: the launcher names the rank, host and
exit code or signal, prints its last lines, and exits with its status.  With
``--enable-recovery`` (Open MPI's spelling; the local launcher) a rank that dies while others
run is named the same way and left out: the others run on (they can ``comm.shrink()``), and
the job's exit code is theirs; ``--max-restarts N`` also starts its command again (at most N
times per rank) with ``UNICCL_RESTART_COUNT`` set, to join the survivors by ``comm.grow()``.

Signals, as mpiexec and torchrun do: Ctrl-C (SIGINT) reaches every rank as SIGINT; a second
Ctrl-C, or ``--grace`` seconds (default 10) with a rank still alive, sends SIGTERM, and the
same again SIGKILL.  SIGTERM or SIGHUP to the launcher starts at SIGTERM.  ``--timeout``
sends SIGTERM too, so ranks with ``UNICCL_TRACE`` or ``UNICCL_DUMP_DIR`` write their files.

Every rank also gets torch's names (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
``LOCAL_WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``): ``init_process_group`` with its
default ``env://`` works under ``uniccl run``; ``-x`` overrides any of them.
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time

from .._errors import InvalidArgument, UnicclError
from . import agent as _agent
from .common import (
    TIMEOUT_STATUS,
    Rendezvous,
    finish,
    forward_signals,
    host_address,
    rank_signal,
    say,
    torch_env,
)

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "-n", "--np", dest="n", type=int, default=None, help="number of ranks (default: 1, or the slots of the hosts)"
    )
    p.add_argument("--launcher", choices=("auto", "local", "mpi", "ssh", "slurm"), default="auto")
    p.add_argument("--hosts", help="h1:4,h2:4 (host:slots) for ssh or mpi")
    p.add_argument("--hostfile", help="MPICH (host:4) or Open MPI (host slots=4) host file")
    p.add_argument("--cluster", help="cluster.yaml: per-node host, user, port, slots, workdir, platform, env, python")
    p.add_argument("--sync", action="store_true", help="copy the current project to each node first (rsync over ssh)")
    p.add_argument("--build", action="store_true", help="install uniccl into a per-node virtual environment first")
    p.add_argument("--project", default=".", help="the project folder --sync and --build use (default: .)")
    p.add_argument(
        "--timeout",
        type=float,
        default=None,
        help="stop the job after this many seconds (exit 124): SIGTERM, then SIGKILL after the grace",
    )
    p.add_argument(
        "--grace",
        type=float,
        default=_agent.GRACE_S,
        metavar="S",
        help=f"seconds between SIGINT, SIGTERM and SIGKILL when stopping the ranks (default {_agent.GRACE_S:g})",
    )
    p.add_argument("--log-dir", help="also write one log file per rank into this folder")
    p.add_argument("--no-prefix", dest="prefix", action="store_false", help="do not prefix output lines by [rank]")
    p.add_argument(
        "-x",
        "--env",
        action="append",
        default=[],
        metavar="K=V|K",
        help="set (K=V) or forward (K) an environment variable on every rank",
    )
    p.add_argument(
        "--python", help="interpreter on the nodes (ssh; default: the per-node venv after --build, else python3)"
    )
    p.add_argument(
        "--ssh-option",
        action="append",
        default=[],
        metavar="OPT",
        help="extra ssh argument, repeatable (e.g. --ssh-option=-i --ssh-option=key)",
    )
    p.add_argument("--oversubscribe", action="store_true", help="allow more ranks than slots")
    p.add_argument(
        "--enable-recovery",
        action="store_true",
        help="a rank that dies while others run does not stop the job: the others go on (and can "
        "comm.shrink()); the job's exit code is theirs (local launcher)",
    )
    p.add_argument(
        "--max-restarts",
        type=int,
        default=0,
        metavar="N",
        help="with --enable-recovery: start a dead rank's command again, up to N times per rank, with "
        "UNICCL_RESTART_COUNT and its old UNICCL_RANK set (it joins the survivors by comm.grow()'s unique id)",
    )
    p.add_argument(
        "--platforms",
        metavar="P0,P1,...",
        help="platform of each rank (cycling), for mixed-vendor jobs: rank r gets UNICCL_PLATFORM=P[r %% len]",
    )
    p.add_argument(
        "--rendezvous-addr", help="address the ranks reach this launcher at (default: the route to the first node)"
    )
    p.add_argument("program", help="executable or .py file")
    p.add_argument("args", nargs=argparse.REMAINDER, help="its arguments")


def _user_env(items: list[str]) -> dict:
    env = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not _ENV_NAME.fullmatch(key):
            raise InvalidArgument(f"not an environment variable name: {key!r}", op="run", argument="--env")
        env[key] = value if sep else os.environ.get(key, "")
    return env


def _nodes(args):
    from . import cluster as _cluster

    sources = [s for s in ("hosts", "hostfile", "cluster") if getattr(args, s)]
    if len(sources) > 1:
        raise InvalidArgument(
            f"give one of --hosts, --hostfile, --cluster (got {', '.join(sources)})",
            op="run",
            argument="--" + sources[1],
        )
    if args.hosts:
        return _cluster.parse_hosts(args.hosts)
    if args.hostfile:
        return _cluster.parse_hostfile(args.hostfile)
    if args.cluster:
        return _cluster.load_cluster(args.cluster)
    return None


def pick_launcher(args, nodes) -> tuple[str, str]:
    if args.launcher != "auto":
        return args.launcher, "--launcher"
    if nodes:
        return "ssh", "hosts were given"
    if os.environ.get("SLURM_JOB_ID") and shutil.which("srun"):
        return "slurm", f"inside Slurm allocation {os.environ['SLURM_JOB_ID']}"
    return "local", "no hosts given: every rank on this host, no MPI needed"


def main(args) -> int:
    try:
        nodes = _nodes(args)
        launcher, why = pick_launcher(args, nodes)
        if args.n is not None and args.n < 1:
            raise InvalidArgument(f"must be >= 1, got {args.n}", op="run", argument="-n")
        if not args.grace >= 0:
            raise InvalidArgument(f"must be >= 0 seconds, got {args.grace:g}", op="run", argument="--grace")
        env = _user_env(args.env)
        if "UNICCL_STATUS_DIR" not in env and "UNICCL_STATUS_DIR" not in os.environ:
            from ..observability.status import new_job_dir, prepare

            env["UNICCL_STATUS_DIR"] = new_job_dir()  # the ranks' live status, for `uniccl top`
            prepare(env["UNICCL_STATUS_DIR"], args.n or (sum(nd.slots for nd in nodes) if nodes else 1))
        if args.platforms:
            env["UNICCL_PLATFORMS"] = args.platforms
        argv = [args.program, *args.args]
        note = _agent.python_note(argv) if launcher != "ssh" else None  # (over ssh each node's agent says it)
        if note:
            say(note)
        if args.max_restarts < 0 or args.max_restarts and not args.enable_recovery:
            raise InvalidArgument(
                f"must be >= 0, and needs --enable-recovery (got {args.max_restarts})",
                op="run",
                argument="--max-restarts",
            )
        if args.enable_recovery and launcher != "local":
            raise InvalidArgument(
                f"the {launcher} launcher cannot keep a job going after a rank dies yet; "
                "--enable-recovery needs the local launcher",
                op="run",
                argument="--enable-recovery",
            )
        if launcher == "local":
            n = args.n or 1
            say(f"launcher local ({why}), {n} rank{'s' * (n > 1)}")
            return run_local(
                n,
                argv,
                env,
                timeout=args.timeout,
                prefix=args.prefix,
                log_dir=args.log_dir,
                grace=args.grace,
                recovery=args.enable_recovery,
                max_restarts=args.max_restarts,
            )
        if launcher == "mpi":
            return run_mpi(args, nodes, argv, env, why)
        if launcher == "slurm":
            return run_slurm(args, argv, env, why)
        if not nodes:
            raise InvalidArgument(
                "the ssh launcher needs --hosts, --hostfile or --cluster", op="run", argument="--launcher"
            )
        from .remote import run_ssh

        return run_ssh(args, nodes, argv, env, why)
    except UnicclError as exc:
        say(f"error: {exc}")
        return 2


# ------------------------------------------------------------------ local
def run_local(
    n: int,
    argv: list[str],
    env: dict,
    *,
    timeout=None,
    prefix=True,
    log_dir=None,
    grace=_agent.GRACE_S,
    recovery=False,
    max_restarts=0,
) -> int:
    rdv = Rendezvous("127.0.0.1", (timeout or 3600) + 60)
    job = _agent.NodeJob(
        list(range(n)),
        n,
        argv,
        {**torch_env("127.0.0.1"), **env, **rdv.env, "UNICCL_JOB_SECRET": rdv.secret},
        prefix=prefix,
        log_dir=log_dir,
        grace=grace,
        say=say,
        recovery=recovery,
        max_restarts=max_restarts,
    )
    caught = []

    def on_signal(sig, _frame):
        caught.append(sig)
        job.request_stop(rank_signal(sig))  # the job's loop sends it and escalates

    old = forward_signals(on_signal)
    try:
        state = job.run(timeout, on_failure=lambda f: _agent.failure_report(f, n))
    finally:
        for sig, h in old.items():
            signal.signal(sig, h)
    gone = [f for f in job.lost if not f["restarted"]]
    back = [f for f in job.lost if f["restarted"]]
    if gone and state == "done":
        names = ", ".join(f"rank {f['rank']} ({f['why']})" for f in gone)
        say(f"the job finished without {names}: the other {n - len(gone)} ranks exited 0")
    elif back and state == "done":
        names = ", ".join(f"rank {f['rank']} ({f['why']}, restarted)" for f in back)
        say(f"the job finished: every rank exited 0, after {names}")
    return finish(state, job.failure, timeout, caught)


# -------------------------------------------------------------------- mpi
def mpiexec_flavour(exe: str) -> str:
    text = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=30).stdout
    return "openmpi" if ("Open MPI" in text or "OpenRTE" in text or "prte" in text.lower()) else "mpich"


def find_mpiexec() -> str:
    here = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    exe = here if os.path.exists(here) else shutil.which("mpiexec")
    if not exe:
        raise InvalidArgument(
            "no mpiexec next to this Python or on PATH (install mpich or openmpi)", op="run", argument="--launcher"
        )
    return exe


def mpi_command(
    exe: str,
    flavour: str,
    n: int,
    argv: list[str],
    env: dict,
    *,
    hosts=None,
    hostfile=None,
    oversubscribe=False,
    prefix=True,
) -> list[str]:
    """The mpiexec command line: every rank runs our wrapper, which maps MPI's rank
    variables to UNICCL_* and prefixes output; ``env`` goes through the launcher's own
    forwarding (never expanded by a shell)."""
    cmd = [exe]
    wrapper = [sys.executable, "-m", "uniccl._agent", "--rank-from-env", "--", *argv]
    env = dict(env, UNICCL_PREFIX="1" if prefix else "0")
    if flavour == "openmpi":
        if os.geteuid() == 0:
            cmd.append("--allow-run-as-root")
        if oversubscribe or not (hosts or hostfile):
            cmd.append("--oversubscribe")
        if hosts:
            cmd += ["--host", hosts]
        if hostfile:
            cmd += ["--hostfile", hostfile]
        for key, value in env.items():
            cmd += ["-x", f"{key}={value}"]
        for key in ("PYTHONPATH", "PATH", "LD_LIBRARY_PATH", "UNICCL_DEBUG", "UNICCL_PLATFORM"):
            if key in os.environ and key not in env:
                cmd += ["-x", key]
    else:
        if hosts:
            cmd += ["-hosts", hosts]
        if hostfile:
            cmd += ["-f", hostfile]
        for key, value in env.items():
            cmd += ["-genv", key, value]
    return cmd + ["-n", str(n), *wrapper]


def run_mpi(args, nodes, argv, env, why) -> int:
    exe = find_mpiexec()
    flavour = mpiexec_flavour(exe)
    n = args.n or (sum(nd.slots for nd in nodes) if nodes else 1)
    hosts = ",".join(f"{nd.host}:{nd.slots}" for nd in nodes) if nodes and not args.hostfile else None
    env = {**torch_env(host_address(nodes[0].host) if nodes else "127.0.0.1"), **env}  # rank 0: the first host
    cmd = mpi_command(
        exe,
        flavour,
        n,
        argv,
        env,
        hosts=hosts,
        hostfile=args.hostfile,
        oversubscribe=args.oversubscribe,
        prefix=args.prefix,
    )
    say(f"launcher mpi ({why}): {'Open MPI' if flavour == 'openmpi' else 'MPICH'} {exe}, {n} ranks")
    before = _mpi_segments()
    try:
        return _run_child(cmd, args.timeout, args.grace)
    finally:
        _remove_orphan_segments(_mpi_segments() - before)


# MPI libraries unlink their shared memory at MPI_Finalize; a rank killed by a signal never
# gets there.  Those of this job that no live process maps any more are removed.
_MPI_SEGMENT_PREFIXES = ("mpich_shm_", "sm_segment.", "vader_segment.")


def _mpi_segments() -> set:
    try:
        return {n for n in os.listdir("/dev/shm") if n.startswith(_MPI_SEGMENT_PREFIXES)}
    except OSError:
        return set()


def _mapped_segments() -> set:
    mapped = set()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/maps") as f:
                mapped.update(line.rsplit("/dev/shm/", 1)[1].split()[0] for line in f if "/dev/shm/" in line)
        except (OSError, IndexError):
            continue
    return mapped


def _remove_orphan_segments(names, settle_s: float = 2.0) -> None:
    # a rank killed with its wrapper may still be exiting (its maps still listed) when the job
    # returns: look again for a while, until every segment is unmapped and removed
    names, removed = set(names), []
    deadline = time.monotonic() + settle_s
    while names:
        mapped = _mapped_segments()
        gone = {n for n in names if n not in mapped}
        removed += [n for n in sorted(gone) if _unlink(os.path.join("/dev/shm", n))]
        names -= gone
        if not names or time.monotonic() >= deadline:
            break
        time.sleep(0.05)
    if removed:
        say(f"removed {len(removed)} shared-memory segment(s) the MPI library left behind: {', '.join(removed)}")


def _unlink(path: str) -> bool:
    try:
        os.unlink(path)
        return True
    except OSError:
        return False


def _run_child(cmd, timeout, grace=_agent.GRACE_S, interrupt_whole_job=True) -> int:
    """Run a launcher (mpiexec, srun) in its own process group; forward signals; time out.

    A signal goes to the launcher process alone, which passes it to every rank (our wrapper
    under it forwards SIGINT as SIGINT); each further one, or ``grace`` seconds, sends the
    next of SIGTERM and SIGKILL to its whole process group (itself and the wrappers).
    ``interrupt_whole_job=False`` (srun: one SIGINT only makes it report its tasks, two end
    them at once): Ctrl-C starts at SIGTERM, which srun passes on to every task."""
    proc = subprocess.Popen(cmd, start_new_session=True)
    caught = []
    requests: collections.deque = collections.deque()

    def forward(sig, _frame):
        caught.append(sig)
        requests.append(rank_signal(sig) if interrupt_whole_job else signal.SIGTERM)

    old = forward_signals(forward)
    deadline = time.monotonic() + timeout if timeout else None
    level, step_end, timed_out = -1, 0.0, False

    def step(to: int) -> None:
        nonlocal level, step_end
        first, level = level < 0, min(to, len(_agent.LADDER) - 1)
        sig = _agent.LADDER[level]
        if first and (sig == signal.SIGINT or not interrupt_whole_job):
            _signal_one(proc.pid, sig)  # the launcher passes it to every rank, as from a terminal
        else:
            if not (first and timed_out):
                say(f"sending {sig.name} to {os.path.basename(cmd[0])} and its processes")
            _agent._killpg(proc.pid, sig)
        step_end = time.monotonic() + grace

    try:
        while proc.poll() is None:
            while requests:
                want = _agent.LADDER.index(requests.popleft())
                step(want if level < 0 else max(want, level + 1))
            if level < 0 and deadline is not None and time.monotonic() > deadline:
                say(
                    f"timeout: the job did not finish within {timeout:g} s; sending SIGTERM (SIGKILL {grace:g} s later)"
                )
                timed_out = True
                step(1)
            elif 0 <= level < len(_agent.LADDER) - 1 and time.monotonic() > step_end:
                step(level + 1)
            time.sleep(0.05)
        code = proc.wait()
    finally:
        if proc.poll() is None:  # an exception here: nothing may outlive the launcher
            _agent._killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        for sig, h in old.items():
            signal.signal(sig, h)
    if timed_out:
        return TIMEOUT_STATUS
    if caught:
        say(f"stopped by {signal.Signals(caught[0]).name}")
        return 128 + int(caught[0])
    return _agent.exit_status(code)


def _signal_one(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


# ------------------------------------------------------------------ slurm
def slurm_command(n: int, argv: list[str], prefix: bool) -> list[str]:
    return [
        "srun",
        "-n",
        str(n),
        "--kill-on-bad-exit=1",
        "--export=ALL",
        sys.executable,
        "-m",
        "uniccl._agent",
        "--rank-from-env",
        "--",
        *argv,
    ]


def run_slurm(args, argv, env, why) -> int:

    from ..transport.net import route_address

    n = args.n or int(os.environ.get("SLURM_NTASKS", 1))
    addr = args.rendezvous_addr or route_address(socket.gethostname())
    rdv = Rendezvous(addr, (args.timeout or 3600) + 60)
    # srun copies this environment to every task (--export=ALL): the secret stays off command lines
    os.environ.update(
        {**torch_env(_slurm_first_node() or addr), **env},
        **rdv.env,
        UNICCL_JOB_SECRET=rdv.secret,
        UNICCL_BOOTSTRAP="tcp",
        UNICCL_PREFIX="1" if args.prefix else "0",
    )
    say(f"launcher slurm ({why}): srun, {n} ranks, rendezvous {addr}")
    return _run_child(slurm_command(n, argv, args.prefix), args.timeout, args.grace, interrupt_whole_job=False)


def _slurm_first_node() -> str | None:
    """The address of the allocation's first node (where srun starts rank 0), or None."""
    nodelist = os.environ.get("SLURM_JOB_NODELIST") or os.environ.get("SLURM_NODELIST")
    if not nodelist or not shutil.which("scontrol"):
        return None
    try:
        out = subprocess.run(
            ["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True, timeout=30
        ).stdout.split()
    except (OSError, subprocess.SubprocessError):
        return None
    return host_address(out[0]) if out else None
