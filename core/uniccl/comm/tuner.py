"""Choose transport and algorithm per (collective, bytes, ranks, topology).

Rules, in order:
1. ``UNICCL_TRANSPORT=shm|mpi|tcp`` forces the transport (shm only where all
   ranks share a host and the engine could attach; mpi or tcp only when the
   communicator was bootstrapped by that one: MPI launchers give MPI,
   ``uniccl run``'s own launchers and unique ids outside MPI give TCP).
2. ``UNICCL_ALGO="all_reduce:ring;broadcast:tree"`` forces algorithms (``*`` = any).
3. Otherwise ranks on one host use the shared-memory engine; across hosts the
   point-to-point transport (MPI or TCP) runs the algorithm the alpha-beta-gamma cost model predicts
   fastest, with constants measured on the reference machine (see docs/performance.md), or on
   this cluster: ``UNICCL_TUNER_TABLE`` names the file ``uniccl bench --fit-model FILE`` writes.
   Where hosts hold several ranks, all_reduce, all_gather and reduce_scatter may also run by
   host ("hierarchical": comm/hosts.py), priced with the engine's assumed local constants.
Every choice carries a one-line reason, logged at ``UNICCL_DEBUG=INFO``.
"""

from __future__ import annotations

from typing import NamedTuple

from .. import _env
from .._errors import InvalidArgument
from ..observability.log import logger
from ..transport.record import COLLECTIVES
from . import costmodel

_P2P: dict[str, tuple[str, ...]] = {
    "all_reduce": ("ring", "recursive_doubling", "hierarchical"),
    "reduce": ("tree",),
    "broadcast": ("tree",),
    "all_gather": ("ring", "hierarchical"),
    "reduce_scatter": ("ring", "hierarchical"),
    "all_to_all": ("pairwise",),
    "gather": ("linear",),
    "scatter": ("linear",),
}
ALGORITHMS: dict[str, dict[str, tuple[str, ...]]] = {
    "mpi": _P2P,
    "tcp": _P2P,
    "shm": {c: ("shm",) for c in COLLECTIVES if c != "barrier"},
}

_BY_HOST = ("all_reduce", "all_gather", "reduce_scatter")  # what comm/hosts.py runs

# Measured cost constants of the MPI transport (seconds, seconds per byte): latency of
# one message, transfer and reduction cost per byte.  Only ratios matter for choices.
ALPHA, BETA, GAMMA = 6e-6, 1 / 4e9, 1 / 12e9
# A by-host call is the call plus three calls of its sub-communicators: each more costs the host
# path's own per-call time above its transport (~25 us here, docs/performance.md), which the
# algorithms' alpha does not hold.
SUB_CALLS_S = 3 * 25e-6


class Choice(NamedTuple):
    transport: str
    algorithm: str
    why: str


def parse_rules(spec: str) -> dict:
    """``"all_reduce:ring;*:shm"`` -> ``{"all_reduce": "ring", "*": "shm"}``."""
    rules = {}
    for part in filter(None, (p.strip() for p in spec.replace(",", ";").split(";"))):
        coll, sep, algo = part.partition(":")
        if not sep or not algo.strip():
            raise InvalidArgument(
                f"UNICCL_ALGO rule {part!r} is not 'collective:algorithm'", op="init", argument="UNICCL_ALGO"
            )
        rules[coll.strip()] = algo.strip()
    return rules


def cost_all_reduce(algorithm: str, nbytes: int, n: int, table: costmodel.Table | None = None) -> float:
    """Predicted seconds of all_reduce by ``algorithm`` ("recursive_doubling", otherwise ring) with
    ``table``'s constants (None: this module's; a table without gamma keeps GAMMA); the formulas
    are :mod:`.costmodel`'s."""
    alpha, beta, gamma = (ALPHA, BETA, GAMMA) if table is None else (table.alpha, table.beta, table.gamma)
    gamma = GAMMA if gamma is None else gamma
    if algorithm == "recursive_doubling":
        return costmodel.recursive_doubling(nbytes, n, alpha, beta, gamma)
    return costmodel.ring(nbytes, n, alpha, beta, gamma)


def measured_table() -> costmodel.Table | None:
    """The constants of ``UNICCL_TUNER_TABLE`` (None: unset); InvalidArgument naming the variable
    and what is wrong with the file."""
    path = _env.get("UNICCL_TUNER_TABLE")
    if path is None:
        return None
    try:
        return costmodel.load_table(path)
    except (OSError, ValueError) as exc:
        raise InvalidArgument(f"cannot use {path}: {exc}", op="init", argument="UNICCL_TUNER_TABLE") from None


class Tuner:
    def __init__(self, size: int, p2p: str, shm_ready: bool, shm_reason: str = ""):
        """``p2p``: the communicator's point-to-point transport, "mpi" or "tcp"."""
        self.size, self.p2p = size, p2p
        forced = _env.choice("UNICCL_TRANSPORT") or ""  # shm, mpi or tcp (InvalidArgument otherwise)
        if size < 2:
            forced = ""  # nothing to transport: any forced choice is moot
        if forced in ("mpi", "tcp") and forced != p2p:
            raise InvalidArgument(
                f"UNICCL_TRANSPORT={forced} but this communicator was bootstrapped over {p2p} "
                f"({'an MPI launcher' if p2p == 'mpi' else 'uniccl run or a unique id'})",
                op="init",
                argument="UNICCL_TRANSPORT",
            )
        if forced == "shm" and not shm_ready:
            raise InvalidArgument(
                f"UNICCL_TRANSPORT=shm but the shared-memory engine is not usable: {shm_reason}",
                op="init",
                argument="UNICCL_TRANSPORT",
            )
        if size < 2:
            self.transport, self.transport_why = "local", "a single rank"
        elif forced:
            self.transport, self.transport_why = forced, f"UNICCL_TRANSPORT={forced}"
        elif shm_ready:
            self.transport, self.transport_why = "shm", "all ranks on one host"
        else:
            self.transport, self.transport_why = p2p, shm_reason or "ranks span hosts"
        self.rules = parse_rules(_env.text("UNICCL_ALGO"))
        for coll, algo in self.rules.items():
            known = {a for t in ALGORITHMS.values() for c, algos in t.items() if coll in (c, "*") for a in algos}
            if algo not in known:
                raise InvalidArgument(
                    f"UNICCL_ALGO: unknown algorithm {algo!r} for {coll!r}; known: "
                    f"{', '.join(sorted(known)) or 'none (unknown collective)'}",
                    op="init",
                    argument="UNICCL_ALGO",
                )
        self.table = measured_table()  # alpha, beta, gamma measured here (None: the reference machine's)
        self._cache: dict = {}
        self.hosts: tuple[int, bool] | None = None  # (most ranks on one host, all hosts alike): by_host

    def by_host(self, most: int, alike: bool) -> None:
        """The communicator can run calls by host (comm/hosts.py): at most ``most`` ranks on a
        host; ``alike``: as many on every host (all_gather and reduce_scatter need that)."""
        self.hosts = (most, alike)
        self._cache.clear()

    def _by_host_ok(self, coll: str) -> bool:
        if self.hosts is None or coll not in _BY_HOST:
            return False
        return coll == "all_reduce" or self.hosts[1]

    def choose(self, coll: str, nbytes: int) -> Choice:
        key = (coll, nbytes.bit_length())  # one decision per power-of-two size bucket
        choice = self._cache.get(key)
        if choice is None:
            choice = self._cache[key] = self._decide(coll, nbytes)
            logger.info(
                "%s %d B on %d ranks: transport %s (%s), algorithm %s (%s)",
                coll,
                nbytes,
                self.size,
                choice.transport,
                self.transport_why,
                choice.algorithm,
                choice.why,
            )
        return choice

    def _decide(self, coll: str, nbytes: int) -> Choice:
        forced = self.rules.get(coll) or self.rules.get("*")
        if forced == "hierarchical" and not self._by_host_ok(coll):
            forced = None  # no hosts to group by here (one host, one rank each, or unlike hosts)
        if forced:
            transport = next((t for t in (self.transport, self.p2p) if forced in ALGORITHMS[t][coll]), None)
            if transport is not None:
                return Choice(transport, forced, f"UNICCL_ALGO {coll}:{forced}")
        options = ALGORITHMS[self.transport][coll]
        if self.transport == "shm":
            return Choice("shm", "shm", "native shared-memory engine, pipelined through cache-sized slots")
        costs = self._costs(coll, nbytes)
        if costs:
            best = min(costs, key=costs.__getitem__)
            detail = ", ".join(f"{a} {c * 1e6:.1f} us" for a, c in sorted(costs.items(), key=lambda kv: kv[1]))
            source = "UNICCL_TUNER_TABLE" if self.table is not None else "reference constants"
            return Choice(self.p2p, best, f"cost model ({source}): {detail}")
        return Choice(self.p2p, options[0], "the only point-to-point algorithm for it")

    def _costs(self, coll: str, nbytes: int) -> dict[str, float]:
        """Predicted seconds of each algorithm the model prices for ``coll`` (empty: no choice)."""
        t = self.table
        alpha, beta = (ALPHA, BETA) if t is None else (t.alpha, t.beta)
        gamma = GAMMA if t is None or t.gamma is None else t.gamma
        n, by_host = self.size, self._by_host_ok(coll)
        most = self.hosts[0] if self.hosts is not None else 1
        if coll == "all_reduce":
            costs = {a: cost_all_reduce(a, nbytes, n, t) for a in ("ring", "recursive_doubling")}
            if by_host:
                inter = min(("ring", "recursive_doubling"), key=lambda a: costs[a])
                by = costmodel.hierarchical(nbytes, n, alpha, beta, gamma, most, inter=inter)
                costs["hierarchical"] = by + SUB_CALLS_S
            return costs
        if not by_host:
            return {}
        if coll == "all_gather":  # (nbytes: the whole result)
            return {
                "ring": costmodel.ring_all_gather(nbytes, n, alpha, beta),
                "hierarchical": costmodel.hierarchical_all_gather(nbytes, n, alpha, beta, most) + SUB_CALLS_S,
            }
        return {  # reduce_scatter (nbytes: each rank's whole input)
            "ring": costmodel.ring_reduce_scatter(nbytes, n, alpha, beta, gamma),
            "hierarchical": costmodel.hierarchical_reduce_scatter(nbytes, n, alpha, beta, gamma, most) + SUB_CALLS_S,
        }
