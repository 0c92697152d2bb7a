"""The per-node half of ``uniccl run``: start this node's ranks and watch them.

One :class:`NodeJob` runs the ranks of one node: each in its own process group
(so a rank's children die with it), output prefixed ``[rank]`` line by line,
optionally copied to one log file per rank, the last lines kept for the failure
report.  The first rank that exits non-zero (or by a signal) stops its node.

``python -m uniccl._agent`` is the same thing driven remotely: the launcher
(over ssh) writes a JSON job spec, secret included, on its standard input — never
on a command line — and the agent answers with the ranks' output and one final
status line.  ``stop`` on stdin, or stdin closing (the launcher or the ssh
connection died), stops the ranks: no orphan survives its launcher.

``python -m uniccl._agent --rank-from-env -- program args`` is the wrapper run
under MPI's launchers and srun: it maps their rank variables to ``UNICCL_*`` and
runs one rank the same way.
"""
from __future__ import annotations

import collections
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

STATUS_MARK = "\x1euniccl-agent "  # starts the agent's status line among the ranks' output
TAIL_LINES = 20
GRACE_S = 3.0


def _die_with_parent() -> None:
    """In the child before exec: SIGKILL me when my supervisor dies, even by SIGKILL (Linux),
    so no rank outlives its agent or wrapper (an MPI launcher kills those, not the ranks)."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def program_argv(argv: list[str], python: str | None = None) -> list[str]:
    """A ``.py`` program runs under this (or the node's) interpreter."""
    if argv and argv[0].endswith(".py"):
        return [python or sys.executable, *argv]
    return list(argv)


def describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


def exit_status(code: int) -> int:
    """The shell's convention: a signal N becomes 128 + N."""
    return 128 - code if code < 0 else code


class _Rank:
    __slots__ = ("rank", "proc", "tail", "pump", "log", "ended")

    def __init__(self, rank, proc, log):
        self.rank, self.proc, self.log = rank, proc, log
        self.ended = float("inf")  # when its output closed: orders near-simultaneous failures
        self.tail = collections.deque(maxlen=TAIL_LINES)
        self.pump = None


class NodeJob:
    """The ranks of one node.  ``env`` is added to each rank's environment on top of
    the rank variables; ``out`` receives the prefixed lines."""

    def __init__(self, ranks: list[int], world_size: int, argv: list[str], env: dict, *, node_rank: int = 0,
                 nnodes: int = 1, host: str | None = None, prefix: bool = True, log_dir: str | None = None,
                 out=None, python: str | None = None, inherit_fds: bool = False):
        self.ranks, self.world_size, self.env = ranks, world_size, env
        self.argv = program_argv(argv, python)
        self.node_rank, self.nnodes = node_rank, nnodes
        self.host = host or socket.gethostname()
        self.prefix, self.log_dir = prefix, log_dir
        self.out = out or sys.stdout
        self.inherit_fds = inherit_fds
        self._write_lock = threading.Lock()
        self.procs: list[_Rank] = []
        self.failure: dict | None = None

    def start(self) -> None:
        if self.log_dir:
            os.makedirs(self.log_dir, exist_ok=True)
        for local, rank in enumerate(self.ranks):
            env = dict(os.environ, UNICCL_RANK=str(rank), UNICCL_WORLD_SIZE=str(self.world_size),
                       UNICCL_LOCAL_RANK=str(local), UNICCL_LOCAL_SIZE=str(len(self.ranks)),
                       UNICCL_NODE_RANK=str(self.node_rank), UNICCL_NNODES=str(self.nnodes), PYTHONUNBUFFERED="1")
            env.update(self.env)
            platforms = env.get("UNICCL_PLATFORMS", "")
            if platforms:  # a mixed-vendor job: rank r takes the r-th platform (cycling)
                names = [p.strip() for p in platforms.split(",") if p.strip()]
                env["UNICCL_PLATFORM"] = names[rank % len(names)]
            log = open(os.path.join(self.log_dir, f"rank-{rank}.log"), "w") if self.log_dir else None
            try:
                proc = subprocess.Popen(self.argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                        stderr=subprocess.STDOUT, start_new_session=True,
                                        close_fds=not self.inherit_fds, preexec_fn=_die_with_parent)
            except OSError as exc:
                if log:
                    log.close()
                self.failure = self._record(rank, None, f"could not start {self.argv[0]!r}: {exc}", 127)
                self.stop()
                return
            r = _Rank(rank, proc, log)
            r.pump = threading.Thread(target=self._pump, args=(r,), daemon=True, name=f"uniccl-out-{rank}")
            r.pump.start()
            self.procs.append(r)

    def _pump(self, r: _Rank) -> None:
        head = f"[{r.rank}] " if self.prefix else ""
        for raw in iter(r.proc.stdout.readline, b""):
            line = raw.decode(errors="replace").rstrip("\n")
            r.tail.append(line)
            if r.log:
                r.log.write(line + "\n")
                r.log.flush()
            with self._write_lock:
                try:
                    self.out.write(head + line + "\n")
                    self.out.flush()
                except (OSError, ValueError):
                    pass  # our own output is gone (launcher died): keep draining the rank
        r.proc.stdout.close()
        r.ended = time.monotonic()

    def _record(self, rank, pid, why, code) -> dict:
        return {"rank": rank, "host": self.host, "pid": pid, "code": code, "why": why,
                "exit_status": exit_status(code), "node": self.node_rank}

    def check(self) -> str:
        """"running", "done" (every rank exited 0) or "failed" (``self.failure`` says who)."""
        if self.failure:
            return "failed"
        codes = [(r, r.proc.poll()) for r in self.procs]
        failed = [r for r, code in codes if code not in (None, 0)]
        if failed:
            for r in failed:
                r.pump.join(1.0)  # its last lines belong in the report
            # the first to go is the likely cause; the others often failed because it did
            r = min(failed, key=lambda r: r.ended)
            code = r.proc.returncode
            self.failure = self._record(r.rank, r.proc.pid, describe_exit(code), code)
            self.failure["last_lines"] = list(r.tail)
            return "failed"
        return "running" if any(code is None for _, code in codes) else "done"

    def stop(self, sig: int = signal.SIGTERM, grace: float = GRACE_S) -> None:
        """Signal every live rank's process group; SIGKILL whatever outlives ``grace``."""
        live = [r for r in self.procs if r.proc.poll() is None]
        for r in live:
            _killpg(r.proc.pid, sig)
        deadline = time.monotonic() + grace
        for r in live:
            try:
                r.proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        for r in self.procs:
            _killpg(r.proc.pid, signal.SIGKILL)  # also the rank's own children, if any survive it
            try:
                r.proc.wait(5)
            except subprocess.TimeoutExpired:
                pass
            r.pump.join(2.0)
            if r.log:
                r.log.close()

    def run(self, timeout: float | None = None, stop_event: threading.Event | None = None,
            on_failure=None) -> str:
        """Start, watch until done, failed, timed out or ``stop_event``; always stop."""
        self.start()
        deadline = time.monotonic() + timeout if timeout else None
        state = "failed" if self.failure else "running"
        try:
            while state == "running":
                state = self.check()
                if state != "running":
                    break
                if stop_event is not None and stop_event.is_set():
                    state = "stopped"
                    break
                if deadline is not None and time.monotonic() > deadline:
                    state = "timeout"
                    break
                time.sleep(0.02)
            if state == "failed" and on_failure is not None:
                on_failure(self.failure)  # tell the launcher before the (slow) stop
        finally:
            self.stop()
        return state


def _killpg(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def failure_report(failure: dict, world_size: int, out=sys.stderr) -> None:
    pid = f", pid {failure['pid']}" if failure.get("pid") else ""
    out.write(f"uniccl run: rank {failure['rank']} on host {failure['host']}{pid} {failure['why']}; "
              f"stopping the job ({world_size} ranks)\n")
    lines = failure.get("last_lines") or []
    if lines:
        out.write(f"uniccl run: last {len(lines)} lines of rank {failure['rank']}:\n")
        for line in lines:
            out.write(f"    {line}\n")
    out.flush()


# ------------------------------------------------------------- remote agent
def _serve_spec() -> int:
    """Run the node job described by the JSON spec on stdin (see the module doc)."""
    spec = json.loads(sys.stdin.readline())
    stop = threading.Event()

    def watch_stdin():
        for line in sys.stdin:
            if line.strip() == "stop":
                break
        stop.set()  # "stop", or EOF: the launcher is gone

    threading.Thread(target=watch_stdin, daemon=True, name="uniccl-agent-stdin").start()
    env = dict(spec.get("env") or {})
    env["UNICCL_JOB_SECRET"] = spec["secret"]
    job = NodeJob(spec["ranks"], spec["world_size"], spec["argv"], env, node_rank=spec["node_rank"],
                  nnodes=spec["nnodes"], host=spec.get("host"), prefix=spec.get("prefix", True),
                  log_dir=spec.get("log_dir"), out=sys.stdout)

    def report(failure):
        _status({"state": "failed", "failure": failure})

    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGHUP, lambda *_: stop.set())
    state = job.run(spec.get("timeout"), stop, on_failure=report)
    if state != "failed":
        _status({"state": state})
    return 0 if state == "done" else (job.failure or {}).get("exit_status", 1) or 1


def _status(obj) -> None:
    sys.stdout.write(STATUS_MARK + json.dumps(obj) + "\n")
    sys.stdout.flush()


# ------------------------------------------------- wrapper under MPI or Slurm
def rank_env_from_launcher(env=os.environ) -> dict:
    """``UNICCL_*`` rank variables from MPICH's, Open MPI's or Slurm's own."""
    def first(*names, default=None):
        for n in names:
            if env.get(n, "") != "":
                return env[n]
        return default

    rank = first("OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "SLURM_PROCID")
    size = first("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS")
    if rank is None or size is None:
        raise SystemExit("uniccl: --rank-from-env needs an MPI launcher or srun (no rank variables found)")
    local = first("OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID", default="0")
    local_size = first("OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", default=None)
    if local_size is None and "SLURM_TASKS_PER_NODE" in env:
        local_size = _slurm_tasks_here(env)
    node = first("OMPI_COMM_WORLD_NODE_RANK", "SLURM_NODEID", default="0")
    nnodes = first("SLURM_NNODES", "OMPI_MCA_orte_num_nodes", default="1")
    return {"UNICCL_RANK": rank, "UNICCL_WORLD_SIZE": size, "UNICCL_LOCAL_RANK": local,
            "UNICCL_LOCAL_SIZE": local_size or "1", "UNICCL_NODE_RANK": node, "UNICCL_NNODES": nnodes}


def _slurm_tasks_here(env) -> str:
    """Tasks on this node from SLURM_TASKS_PER_NODE ("2(x3),1") and SLURM_NODEID."""
    counts = []
    for part in env["SLURM_TASKS_PER_NODE"].split(","):
        n, _, rep = part.partition("(x")
        counts += [int(n)] * (int(rep.rstrip(")")) if rep else 1)
    node = int(env.get("SLURM_NODEID", 0))
    return str(counts[node] if node < len(counts) else counts[-1])


def _wrap_one(argv: list[str]) -> int:
    ids = rank_env_from_launcher()
    rank, size = int(ids["UNICCL_RANK"]), int(ids["UNICCL_WORLD_SIZE"])
    job = NodeJob([rank], size, argv, ids, node_rank=int(ids["UNICCL_NODE_RANK"]), nnodes=int(ids["UNICCL_NNODES"]),
                  prefix=os.environ.get("UNICCL_PREFIX", "1") != "0", inherit_fds=True)  # PMI may pass an fd
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    state = job.run(stop_event=stop)
    if state == "failed":
        failure_report(job.failure, size)
        return job.failure["exit_status"] or 1
    return 0 if state == "done" else 143


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--rank-from-env"]:
        rest = argv[1:]
        if rest[:1] == ["--"]:
            rest = rest[1:]
        return _wrap_one(rest)
    return _serve_spec()


if __name__ == "__main__":
    sys.exit(main())
