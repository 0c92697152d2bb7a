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

Stopping: a request (the launcher's Ctrl-C, SIGTERM, its ``--timeout``, a failed rank) sends
the first signal of the ladder SIGINT -> SIGTERM -> SIGKILL it names to every live rank's
process group; each further request, or ``grace`` seconds with a rank still alive, sends
the next.  So Ctrl-C reaches every rank as SIGINT (Python's KeyboardInterrupt: ``finally``
blocks run), a second Ctrl-C or the grace period sends SIGTERM (a rank with ``UNICCL_TRACE``
or ``UNICCL_DUMP_DIR`` writes its files then), and whatever is left is killed.
"""

from __future__ import annotations

import collections
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time

from .. import _safefs, _threads

STATUS_MARK = "\x1euniccl-agent "  # starts the agent's status line among the ranks' output
TAIL_LINES = 20
GRACE_S = 10.0  # seconds a rank has after SIGINT (then SIGTERM), and after SIGTERM (then SIGKILL)
LADDER = (signal.SIGINT, signal.SIGTERM, signal.SIGKILL)  # how a stop escalates
PYTHON_NAMES = ("python", "python3")  # run as this launcher's (or the node's) interpreter


def _die_with_parent() -> None:
    """In the child before exec: SIGKILL me when my supervisor dies, even by SIGKILL (Linux),
    so no rank outlives its agent or wrapper (an MPI launcher kills those, not the ranks)."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


# The reaper: a small process of its own session that outlives a launcher killed by SIGKILL
# (no cleanup of ours runs then).  PR_SET_PDEATHSIG kills each rank, but not the processes a
# rank started (a data loader, a shell's children): they stay in the rank's process group, and
# the reaper SIGKILLs those groups once its stdin -- a pipe only the launcher holds -- closes
# without "done".  It reads one process-group id per line.
_REAPER = r"""
import os, signal, sys
groups = set()
for line in sys.stdin:
    line = line.strip()
    if line == "done":
        sys.exit(0)
    if line.isdigit():
        groups.add(int(line))
for g in groups:
    try:
        os.killpg(g, signal.SIGKILL)
    except OSError:
        pass
"""


class _Reaper:
    """The launcher's end of the reaper: ``add`` a rank's process group, ``done`` at a normal end."""

    def __init__(self):
        self.proc = None
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-c", _REAPER],
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
                close_fds=True,
                text=True,
            )
        except OSError:
            pass  # no reaper: the ranks still die with us (PR_SET_PDEATHSIG), their children may not

    def add(self, pgid: int) -> None:
        self._send(f"{pgid}\n")

    def done(self) -> None:
        """Every rank's group was stopped by us: the reaper leaves without killing anything."""
        self._send("done\n")
        if self.proc is not None:
            try:
                self.proc.stdin.close()
                self.proc.wait(5)
            except (OSError, subprocess.TimeoutExpired):
                pass
            self.proc = None

    def _send(self, text: str) -> None:
        if self.proc is not None:
            try:
                self.proc.stdin.write(text)
                self.proc.stdin.flush()
            except OSError:
                self.proc = None


def program_argv(argv: list[str], python: str | None = None) -> list[str]:
    """A ``.py`` program, or ``python``/``python3`` by its bare name, runs under this (or the
    node's) interpreter: the one uniccl is installed in, not whatever ``python`` is first on PATH."""
    if argv and argv[0].endswith(".py"):
        return [python or sys.executable, *argv]
    if argv and argv[0] in PYTHON_NAMES:
        return [python or sys.executable, *argv[1:]]
    return list(argv)


def python_note(argv: list[str], python: str | None = None) -> str | None:
    """The line to log when ``program_argv`` ran another interpreter than PATH's ``python``."""
    if not argv or argv[0] not in PYTHON_NAMES:
        return None
    exe = python or sys.executable
    on_path = shutil.which(argv[0])
    if on_path and os.path.abspath(on_path) == os.path.abspath(exe):
        return None
    other = f"not {on_path} (first on PATH)" if on_path else f"there is no {argv[0]} on PATH"
    return f"{argv[0]!r} runs as this launcher's interpreter {exe}, {other}"


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
    __slots__ = ("rank", "proc", "tail", "pump", "log", "ended", "lost", "restart")

    def __init__(self, rank, proc, log, restart=0):
        self.rank, self.proc, self.log = rank, proc, log
        self.ended = float("inf")  # when its output closed: orders near-simultaneous failures
        self.tail = collections.deque(maxlen=TAIL_LINES)
        self.pump = None
        self.lost = False  # recovery: it died while others ran, and the job went on without it
        self.restart = restart  # which start of this rank's command (0: the first)


class NodeJob:
    """The ranks of one node.  ``env`` is added to each rank's environment on top of
    the rank variables (uniccl's and torch's); ``out`` receives the prefixed lines; ``say``
    the launcher's own messages (how a stop escalates).  ``escalate=False``: a request for
    the signal already sent is not a second Ctrl-C (the wrapper under mpiexec, which may get
    one signal both from mpiexec and from the launcher's process group).  ``recovery``
    (``uniccl run --enable-recovery``): a rank that dies while others still run is reported
    and left out (``lost``) instead of stopping the job; the job ends when the others do.
    ``max_restarts``: with recovery, a lost rank's command is started again, at most that many
    times per rank, with ``UNICCL_RESTART_COUNT`` (1, 2, ...) and its old ``UNICCL_RANK``."""

    def __init__(
        self,
        ranks: list[int],
        world_size: int,
        argv: list[str],
        env: dict,
        *,
        node_rank: int = 0,
        nnodes: int = 1,
        host: str | None = None,
        prefix: bool = True,
        log_dir: str | None = None,
        out=None,
        python: str | None = None,
        inherit_fds: bool = False,
        grace: float = GRACE_S,
        say=None,
        escalate: bool = True,
        recovery: bool = False,
        max_restarts: int = 0,
    ):
        self.ranks, self.world_size, self.env = ranks, world_size, env
        self.argv = program_argv(argv, python)
        self.node_rank, self.nnodes = node_rank, nnodes
        self.host = host or socket.gethostname()
        self.prefix, self.log_dir = prefix, log_dir
        self.out = out or sys.stdout
        self.inherit_fds = inherit_fds
        self.grace, self.escalate = grace, escalate
        self.say = say or (lambda msg: None)
        self._requests: collections.deque = collections.deque()  # signals asked for (see request_stop)
        self._write_lock = threading.Lock()
        self.procs: list[_Rank] = []
        self.failure: dict | None = None
        self.recovery = recovery
        self.lost: list[dict] = []  # with recovery: the ranks that died while others ran
        self.max_restarts = max_restarts
        self._reaper = None  # started with the first rank

    def start(self) -> None:
        if self.log_dir:
            os.makedirs(self.log_dir, exist_ok=True)
        for local, rank in enumerate(self.ranks):
            if not self._spawn(local, rank):
                return

    def _spawn(self, local: int, rank: int, restart: int = 0) -> bool:
        """Start rank ``rank``'s command (``restart``: how many times it was started before);
        False if it could not be (the job then stops: ``self.failure``)."""
        env = dict(
            os.environ,
            UNICCL_RANK=str(rank),
            UNICCL_WORLD_SIZE=str(self.world_size),
            UNICCL_LOCAL_RANK=str(local),
            UNICCL_LOCAL_SIZE=str(len(self.ranks)),
            UNICCL_NODE_RANK=str(self.node_rank),
            UNICCL_NNODES=str(self.nnodes),
            PYTHONUNBUFFERED="1",
            # torch's names, for init_process_group's default env:// (MASTER_* come in self.env)
            RANK=str(rank),
            WORLD_SIZE=str(self.world_size),
            LOCAL_RANK=str(local),
            LOCAL_WORLD_SIZE=str(len(self.ranks)),
            GROUP_RANK=str(self.node_rank),
        )
        if self.recovery:  # (torchrun's TORCHELASTIC_MAX_RESTARTS): whether a lost rank comes back
            env["UNICCL_MAX_RESTARTS"] = str(self.max_restarts)
        if restart:
            env["UNICCL_RESTART_COUNT"] = str(restart)
        env.update(self.env)  # the user's -x values win
        platforms = env.get("UNICCL_PLATFORMS", "")
        if platforms:  # a mixed-vendor job: rank r takes the r-th platform (cycling)
            names = [p.strip() for p in platforms.split(",") if p.strip()]
            env["UNICCL_PLATFORM"] = names[rank % len(names)]
        name = f"rank-{rank}.log" if not restart else f"rank-{rank}.restart-{restart}.log"
        log = open(os.path.join(self.log_dir, name), "w") if self.log_dir else None
        try:
            proc = subprocess.Popen(
                self.argv,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                close_fds=not self.inherit_fds,
                preexec_fn=_die_with_parent,
            )
        except OSError as exc:
            if log:
                log.close()
            self.failure = self._record(rank, None, f"could not start {self.argv[0]!r}: {exc}", 127)
            self.stop(grace=self.grace)
            return False
        if self._reaper is None:
            self._reaper = _Reaper()
        self._reaper.add(proc.pid)  # its own session: pid == process group id
        r = _Rank(rank, proc, log, restart)
        r.pump = _threads.thread(self._pump, args=(r,), name=f"uniccl-out-{rank}")
        r.pump.start()
        self.procs.append(r)
        return True

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
        return {
            "rank": rank,
            "host": self.host,
            "pid": pid,
            "code": code,
            "why": why,
            "exit_status": exit_status(code),
            "node": self.node_rank,
        }

    def _note_exit(self, record: dict) -> None:
        """With ``UNICCL_DUMP_DIR`` set, how a rank ended goes beside the flight-recorder dumps,
        as ``uniccl-exit-r<rank>.json``: ``uniccl doctor`` names the dead rank and its signal.
        (Only the rank whose end is the job's failure, or one lost under recovery: the ranks the
        launcher then stops ended because it did.)"""
        directory = self.env.get("UNICCL_DUMP_DIR") or os.environ.get("UNICCL_DUMP_DIR")
        if not directory:
            return
        try:
            os.makedirs(directory, exist_ok=True)
            _safefs.write_file(os.path.join(directory, f"uniccl-exit-r{record['rank']}.json"), json.dumps(record))
        except OSError as exc:  # a side channel: never the job's failure
            self.say(f"could not write rank {record['rank']}'s exit to {directory}: {exc}")

    def check(self) -> str:
        """ "running", "done" (every rank exited 0) or "failed" (``self.failure`` says who).
        With recovery a rank that fails while others run is lost, not a failure; once all have
        ended, a lost rank that exited with a code (rather than being killed by a signal) said
        something went wrong, and the first such is the job's failure."""
        if self.failure:
            return "failed"
        codes = [(r, r.proc.poll()) for r in self.procs]
        failed = [r for r, code in codes if code not in (None, 0) and not r.lost]
        running = any(code is None for _, code in codes)
        if failed:
            for r in failed:
                r.pump.join(1.0)  # its last lines belong in the report
            if self.recovery and running:
                for r in sorted(failed, key=lambda r: r.ended):
                    self._lose(r)
                return "running"
            # the first to go is the likely cause; the others often failed because it did
            r = min(failed, key=lambda r: r.ended)
            code = r.proc.returncode
            self.failure = self._record(r.rank, r.proc.pid, describe_exit(code), code)
            self._note_exit(self.failure)
            self.failure["last_lines"] = list(r.tail)
            return "failed"
        if running:
            return "running"
        said = [f for f in self.lost if f["code"] is not None and f["code"] > 0 and not f["restarted"]]
        if said:
            self.failure = dict(said[0], ended=True)
            return "failed"
        return "done"

    def _lose(self, r: _Rank) -> None:
        """Recovery: rank ``r`` died while others run; say so, with its last lines, and go on."""
        code = r.proc.returncode
        r.lost = True
        again = r.restart < self.max_restarts
        lost = dict(self._record(r.rank, r.proc.pid, describe_exit(code), code), restarted=again)
        self.lost.append(lost)
        self._note_exit(lost)
        live = sum(p.proc.poll() is None for p in self.procs)
        self.say(
            f"rank {r.rank} on host {self.host}, pid {r.proc.pid} {lost['why']}; the job goes on without it "
            f"(--enable-recovery: {live} rank{'s' * (live != 1)} still running)"
        )
        for line in list(r.tail)[-10:]:
            self.say(f"    [{r.rank}] {line}")
        if again:
            self.say(
                f"rank {r.rank}: starting its command again (restart {r.restart + 1} of {self.max_restarts}, "
                f"UNICCL_RESTART_COUNT={r.restart + 1})"
            )
            self._spawn(self.ranks.index(r.rank), r.rank, r.restart + 1)

    def request_stop(self, sig: int = signal.SIGTERM) -> None:
        """Ask the running job to stop by ``sig`` (SIGINT, SIGTERM or SIGKILL); safe from a
        signal handler or another thread.  While stopping, each request sends the next signal
        of the ladder (see the module doc) or ``sig`` if that is further up."""
        self._requests.append(sig)

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
        if self._reaper is not None:  # every group was SIGKILLed above: nothing left to reap
            self._reaper.done()
            self._reaper = None

    def run(self, timeout: float | None = None, stop_event: threading.Event | None = None, on_failure=None) -> str:
        """Start, watch until done, failed, timed out, :meth:`request_stop` or ``stop_event``
        (a SIGTERM request); then stop what is left, signal by signal (see the module doc)."""
        self.start()
        deadline = time.monotonic() + timeout if timeout else None
        state = "failed" if self.failure else "running"
        try:
            while state == "running":
                state = self.check()
                if state != "running":
                    break
                if self._requests:
                    state = "stopped"
                    break
                if stop_event is not None and stop_event.is_set():
                    state = "stopped"
                    break
                if deadline is not None and time.monotonic() > deadline:
                    state = "timeout"
                    self.say(
                        f"timeout: the job did not finish within {timeout:g} s; sending SIGTERM to every "
                        f"rank (SIGKILL {self.grace:g} s later)"
                    )
                    break
                time.sleep(0.02)
            if state == "failed" and on_failure is not None:
                on_failure(self.failure)  # tell the launcher before the (slow) stop
            if state != "done":
                # a request says what it was; a failure, a timeout or stop_event is a silent SIGTERM
                self._wind_down(stop_event, None if self._requests else signal.SIGTERM)
        finally:
            self.stop(grace=self.grace)  # SIGKILL each rank's group (its children too); close the logs
        return state

    def _wind_down(self, stop_event=None, first: int | None = None) -> None:
        """Send the requested signals (``first``: one sent without a word), escalating on each
        new request and after each ``grace`` seconds, until every rank has exited or been sent
        SIGKILL."""
        level, step_end = -1, 0.0
        stop_seen = stop_event is not None and stop_event.is_set()
        while True:
            live = [r for r in self.procs if r.proc.poll() is None]
            if not live:
                return
            if stop_event is not None and not stop_seen and stop_event.is_set():
                stop_seen = True
                self._requests.append(signal.SIGTERM)
            now = time.monotonic()
            steps = []  # (ladder index, why: None for the silent first step)
            if first is not None:
                level, first = LADDER.index(first), None
                steps.append((level, None))
            while self._requests:
                sig = self._requests.popleft()
                want = LADDER.index(sig) if sig in LADDER else 1
                nxt = want if level < 0 else max(want, level + 1 if self.escalate else level)
                if nxt > level:
                    steps.append((nxt, signal.Signals(sig).name + (" again" if 0 <= want <= level else "")))
                    level = nxt
            if not steps and now > step_end:
                level += 1
                steps.append((level, f"still running {self.grace:g} s after {LADDER[level - 1].name}"))
            for lvl, why in steps:
                sig = LADDER[min(lvl, len(LADDER) - 1)]
                for r in live:
                    _killpg(r.proc.pid, sig)
                step_end = now + self.grace
                if why is not None:
                    then = (
                        ""
                        if sig == signal.SIGKILL
                        else f" (again, or {self.grace:g} s later: {LADDER[LADDER.index(sig) + 1].name})"
                    )
                    self.say(
                        f"{why}: sent {sig.name} to rank{'s' * (len(live) > 1)} "
                        f"{', '.join(str(r.rank) for r in live)}{then}"
                    )
            if level >= len(LADDER) - 1:
                return  # SIGKILL sent: stop() reaps them
            time.sleep(0.02)


def _killpg(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def failure_report(failure: dict, world_size: int, out=sys.stderr) -> None:
    pid = f", pid {failure['pid']}" if failure.get("pid") else ""
    then = (
        "its status is the job's (--enable-recovery)"
        if failure.get("ended")
        else f"stopping the job ({world_size} ranks)"
    )
    out.write(f"uniccl run: rank {failure['rank']} on host {failure['host']}{pid} {failure['why']}; {then}\n")
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
    env = dict(spec.get("env") or {})
    env["UNICCL_JOB_SECRET"] = spec["secret"]
    say = _stderr_say
    job = NodeJob(
        spec["ranks"],
        spec["world_size"],
        spec["argv"],
        env,
        node_rank=spec["node_rank"],
        nnodes=spec["nnodes"],
        host=spec.get("host"),
        prefix=spec.get("prefix", True),
        log_dir=spec.get("log_dir"),
        out=sys.stdout,
        grace=spec.get("grace", GRACE_S),
        say=say,
    )
    note = python_note(spec["argv"])
    if note:
        say(note)

    def watch_stdin():
        # "signal SIGINT" (the launcher's Ctrl-C, forwarded), "stop" (SIGTERM), or EOF: the launcher is gone
        for line in sys.stdin:
            words = line.split()
            if words[:1] == ["signal"] and len(words) == 2 and words[1] in ("SIGINT", "SIGTERM", "SIGKILL"):
                job.request_stop(signal.Signals[words[1]])
            elif words == ["stop"]:
                job.request_stop(signal.SIGTERM)
        job.request_stop(signal.SIGTERM)

    _threads.start(watch_stdin, name="uniccl-agent-stdin")

    def report(failure):
        _status({"state": "failed", "failure": failure})

    signal.signal(signal.SIGTERM, lambda *_: job.request_stop(signal.SIGTERM))
    signal.signal(signal.SIGHUP, lambda *_: job.request_stop(signal.SIGTERM))
    signal.signal(signal.SIGINT, lambda *_: job.request_stop(signal.SIGINT))
    state = job.run(spec.get("timeout"), on_failure=report)
    if state != "failed":
        _status({"state": state})
    return 0 if state == "done" else (job.failure or {}).get("exit_status", 1) or 1


def _stderr_say(msg: str) -> None:
    sys.stderr.write(f"uniccl run: {msg}\n")
    sys.stderr.flush()


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
    return {
        "UNICCL_RANK": rank,
        "UNICCL_WORLD_SIZE": size,
        "UNICCL_LOCAL_RANK": local,
        "UNICCL_LOCAL_SIZE": local_size or "1",
        "UNICCL_NODE_RANK": node,
        "UNICCL_NNODES": nnodes,
    }


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
    job = NodeJob(
        [rank],
        size,
        argv,
        ids,
        node_rank=int(ids["UNICCL_NODE_RANK"]),
        nnodes=int(ids["UNICCL_NNODES"]),
        prefix=os.environ.get("UNICCL_PREFIX", "1") != "0",
        inherit_fds=True,  # PMI may pass an fd
        escalate=False,
    )  # the same signal may come from mpiexec and from the launcher's group
    caught = []

    def forward(sig, _frame):  # the rank gets what the wrapper got: SIGINT stays SIGINT
        caught.append(sig)
        job.request_stop(signal.SIGINT if sig == signal.SIGINT else signal.SIGTERM)

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, forward)
    state = job.run()
    if state == "failed":
        failure_report(job.failure, size)
        return job.failure["exit_status"] or 1
    return 0 if state == "done" else 128 + int(caught[0] if caught else signal.SIGTERM)


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
