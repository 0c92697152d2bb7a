"""``uniccl run``'s ssh launcher: one agent per node, driven from here.

Order of work: check every node answers (nothing is launched if one does not),
optionally ``--sync`` and ``--build`` on all nodes at once, host the rendezvous,
start ``python -m uniccl._agent`` on each node over ssh and hand it its job spec
(ranks, program, environment, secret) on stdin.  The agents stream their ranks'
prefixed output back; the first failure any agent reports stops every node.
Ctrl-C (or SIGTERM) here is passed to every agent (``signal SIGINT`` on its stdin), which
sends it to its ranks and escalates after the grace as the local launcher does.
"""

from __future__ import annotations

import json
import queue
import signal
import subprocess
import sys
import time

from .. import _threads
from ..transport.net import route_address
from . import agent as _agent
from . import cluster as _cluster
from . import ssh as _ssh
from .common import Rendezvous, finish, forward_signals, free_port, host_address, rank_signal, say

_SSH_SLACK_S = 7.0  # an agent's stop takes its grace (per signal) plus this: the ssh round trip, the reports


class _Agent:
    """The ssh process running one node's agent, and a thread relaying its output."""

    def __init__(self, node, ranks, argv, events: queue.Queue):
        self.node, self.ranks, self.events = node, ranks, events
        self.proc = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True
        )
        self.err_tail: list[str] = []
        self.status = None
        _threads.start(self._relay)
        _threads.start(self._relay_err)

    def send(self, text: str) -> None:
        try:
            self.proc.stdin.write(text.encode())
            self.proc.stdin.flush()
        except (OSError, ValueError):
            pass  # already gone: its exit is reported by the relay thread

    def _relay(self) -> None:
        for raw in iter(self.proc.stdout.readline, b""):
            line = raw.decode(errors="replace")
            if line.startswith(_agent.STATUS_MARK):
                self.status = json.loads(line[len(_agent.STATUS_MARK) :])
                self.events.put((self, self.status))
            else:
                sys.stdout.write(line)
                sys.stdout.flush()
        code = self.proc.wait()
        if self.status is None:  # the agent died or ssh lost the node before it could report
            tail = "; ".join(self.err_tail[-3:]) or "no output"
            self.events.put(
                (
                    self,
                    {
                        "state": "failed",
                        "failure": {
                            "rank": self.ranks[0] if self.ranks else -1,
                            "host": self.node.label,
                            "pid": None,
                            "code": code,
                            "exit_status": _agent.exit_status(code) or 255,
                            "last_lines": self.err_tail[-10:],
                            "why": f"(node {self.node.label}: ssh/agent {_agent.describe_exit(code)}: {tail})",
                        },
                    },
                )
            )
        else:
            self.events.put((self, {"state": "exited"}))

    def _relay_err(self) -> None:
        for raw in iter(self.proc.stderr.readline, b""):
            line = raw.decode(errors="replace").rstrip("\n")
            self.err_tail = (self.err_tail + [line])[-20:]
            sys.stderr.write(f"[{self.node.label}] {line}\n")
            sys.stderr.flush()


def _prepare(args, nodes) -> bool:
    """Reachability, then --sync and --build; False (with the reasons said) if any node fails."""
    t0 = time.monotonic()
    bad = _ssh.check_reachable(nodes, timeout=10)
    if bad:
        for host, why in bad.items():
            say(f"node {host} is unreachable: {why}")
        say(f"{len(bad)} of {len(nodes)} nodes unreachable; nothing was launched")
        return False
    say(f"all {len(nodes)} nodes answer ({time.monotonic() - t0:.1f} s)")
    for step, fn in (("sync", _ssh.sync), ("build", _ssh.build)):
        if getattr(args, step):
            failures = fn(nodes, args.project, progress=_ssh.print_progress)
            if failures:
                for host, why in failures.items():
                    say(f"{step} failed on {host}: {why}")
                say("nothing was launched")
                return False
    return True


def run_ssh(args, nodes, argv, env, why) -> int:
    for node in nodes:
        node.ssh_options = [*node.ssh_options, *args.ssh_option]
        if args.python:
            node.python = args.python
    placement = _cluster.assign_ranks(nodes, args.n, oversubscribe=args.oversubscribe)
    world = sum(len(r) for r in placement)
    if not _prepare(args, nodes):
        return 255
    addr = args.rendezvous_addr or route_address(nodes[0].host)
    rdv = Rendezvous(addr, (args.timeout or 3600) + 60)
    used = [(node, ranks) for node, ranks in zip(nodes, placement) if ranks]
    say(
        f"launcher ssh ({why}): {world} ranks on {len(used)} nodes "
        f"({', '.join(f'{n.label}:{len(r)}' for n, r in used)}), rendezvous {addr}"
    )
    events: queue.Queue = queue.Queue()
    agents = []
    # torch's store: rank 0 listens on the first node (the port is one free here: the best guess there is)
    torch = {"MASTER_ADDR": host_address(used[0][0].host), "MASTER_PORT": str(free_port())}
    for k, (node, ranks) in enumerate(used):
        spec = {
            "ranks": ranks,
            "world_size": world,
            "argv": argv,
            "node_rank": k,
            "nnodes": len(used),
            "host": node.label,
            "prefix": args.prefix,
            "log_dir": args.log_dir,
            "secret": rdv.secret,
            "grace": args.grace,
            "env": {**torch, **env, **rdv.env, "UNICCL_BOOTSTRAP": "tcp"},
        }
        agent = _Agent(
            node, ranks, _ssh.ssh_argv(node, [node.python or "python3", "-m", "uniccl._agent"], env=env), events
        )
        agent.send(json.dumps(spec) + "\n")
        agents.append(agent)
    caught: list = []
    old = forward_signals(lambda sig, _f: (caught.append(sig), events.put((None, rank_signal(sig)))))
    try:
        state, failure = _watch(agents, events, args.timeout, world, args.grace)
    finally:
        _stop_all(agents, args.grace)
        for sig, h in old.items():
            signal.signal(sig, h)
    return finish(state, failure, args.timeout, caught)


def _watch(agents, events, timeout, world, grace=_agent.GRACE_S):
    deadline = time.monotonic() + timeout if timeout else None
    finished = 0
    stopping = False
    while True:
        wait = None if deadline is None else max(0.0, deadline - time.monotonic())
        try:
            agent, status = events.get(timeout=wait)
        except queue.Empty:
            return ("stopped" if stopping else "timeout"), None
        if agent is None:  # a signal here: every agent sends it to its ranks, and escalates as ours would
            for a in agents:
                a.send(f"signal {signal.Signals(status).name}\n")
            if not stopping:
                stopping = True
                deadline = time.monotonic() + 2 * grace + _SSH_SLACK_S  # SIGINT, SIGTERM, then SIGKILL
            continue
        if stopping:  # wait for the agents to report their ranks gone; failures now are the stop's doing
            if all(a.proc.poll() is not None or a.status is not None for a in agents):
                return "stopped", None
            continue
        state = status.get("state")
        if state == "failed":
            _agent.failure_report(status["failure"], world)
            return "failed", status["failure"]
        if state == "exited":
            finished += 1
            if finished == len(agents):
                return "done", None
        elif state in ("timeout", "stopped"):
            return state, None


def _stop_all(agents, grace: float = _agent.GRACE_S) -> None:
    """Ask every agent to stop its ranks; kill the ssh processes that do not end in time."""
    for agent in agents:
        if agent.proc.poll() is None and agent.status is None:
            agent.send("stop\n")
    deadline = time.monotonic() + grace + _SSH_SLACK_S
    for agent in agents:
        try:
            agent.proc.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            _agent._killpg(agent.proc.pid, signal.SIGKILL)  # ssh dies, the agent sees EOF and stops
            agent.proc.wait()
