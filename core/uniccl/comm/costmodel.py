"""The alpha-beta-gamma cost model of all_reduce (and of all_gather and reduce_scatter, flat
and by host): the one place its formulas live.

Each function is pure: ``f(nbytes, n, alpha, beta, gamma, ...) -> seconds`` for an all_reduce of
``nbytes`` bytes per rank on ``n`` ranks, where one message of ``b`` bytes costs ``alpha + b * beta``
and reducing ``b`` bytes into a buffer costs ``b * gamma``.  The network is uniform and full duplex:
a rank sends one message and receives one message at a time.  The tuner (:mod:`.tuner`) uses
``ring`` and ``recursive_doubling`` with its measured constants; ``benchmarks/scale_model.py``
uses them all to predict all_reduce up to 16384 ranks (docs/scale.md).

``load_table`` / ``write_table`` read and write the constants as JSON:
``{"alpha_s": ..., "beta_s_per_byte": ..., "gamma_s_per_byte": ...}`` (gamma optional).

This module imports nothing of uniccl, so a script can load it by its path without the package.
"""

from __future__ import annotations

import json
import math
import os
from typing import Any, NamedTuple

# The smallest piece the pipelined double binary tree cuts a message into (bytes per chunk per tree).
MIN_CHUNK = 4096


def ring(nbytes: float, n: int, alpha: float, beta: float, gamma: float) -> float:
    """Ring reduce-scatter then ring all-gather: 2(n-1) steps of nbytes/n each, a reduction on the
    first n-1 of them."""
    return 2 * (n - 1) * alpha + 2 * (n - 1) / n * nbytes * beta + (n - 1) / n * nbytes * gamma


def recursive_doubling(nbytes: float, n: int, alpha: float, beta: float, gamma: float) -> float:
    """ceil(log2 n) exchanges of the whole buffer, each followed by a reduction; two more steps
    when n is not a power of two (the extra ranks hand their data in and get the result back).

    The count is the tuner's, kept as it always was: for n not a power of two the schedule in
    ``algorithms.all_reduce_recursive_doubling`` takes floor(log2 n) + 2 steps on its critical
    path, one fewer than charged here (tests/test_costmodel.py states both)."""
    steps = math.ceil(math.log2(n)) + (2 if n & (n - 1) else 0)
    return steps * (alpha + nbytes * (beta + gamma))


def tree(nbytes: float, n: int, alpha: float, beta: float, gamma: float) -> float:
    """A binary tree (heap order: rank r's children are 2r+1 and 2r+2) reduces the whole buffer to
    rank 0, which broadcasts it back down the same tree; no pipelining.

    Level by level, each level taking as long as its busiest parent: going up, a parent receives
    its c children's buffers one after another and reduces each (c (alpha + nbytes beta + nbytes
    gamma)); going down it sends to them one after another (c (alpha + nbytes beta)).  With
    d = floor(log2 n) levels below the root, every level but the deepest has parents of two
    children; the deepest holds n - 2^d + 1 ranks, so its busiest parent has min(2, that)."""
    if n < 2:
        return 0.0
    depth = n.bit_length() - 1  # floor(log2 n): the levels below the root
    last = n - (1 << depth) + 1  # ranks on the deepest level
    fan_units = 2 * (depth - 1) + min(2, last)
    return fan_units * (2 * alpha + 2 * nbytes * beta + nbytes * gamma)


def pipeline(stages: int, alpha: float, work: float, max_chunks: int) -> float:
    """A pipeline of ``stages`` hops through which the message goes in k chunks: the last chunk
    leaves the last stage after (stages + k - 1) steps of (alpha + work / k) each, ``work`` being
    the whole message's transfer and reduction time at the busiest rank.  k is the best integer in
    1..max_chunks (the convex optimum k* = sqrt((stages - 1) work / alpha), rounded either way)."""
    max_chunks = max(1, int(max_chunks))
    ks = {1, max_chunks}
    if alpha > 0 and stages > 1:
        k_star = math.sqrt((stages - 1) * work / alpha)
        ks.update(min(max_chunks, max(1, k)) for k in (math.floor(k_star), math.ceil(k_star)))
    return min((stages + k - 1) * (alpha + work / k) for k in ks)


def double_binary_tree(
    nbytes: float, n: int, alpha: float, beta: float, gamma: float, min_chunk: int = MIN_CHUNK
) -> float:
    """NCCL's double binary tree (NCCL 2.4): two binary trees over the n ranks, each rank a leaf in
    one of them, each tree reducing then broadcasting half the buffer, pipelined in chunks.

    Latency: a chunk climbs ceil(log2 n) levels and comes back down, 2 ceil(log2 n) stages.
    Bandwidth: the two trees together make every rank send and receive 2(n-1)/n of the buffer and
    reduce (n-1)/n of it on average, the ring's figures ("full bandwidth"); the chunk count is the
    best one with chunks of at least ``min_chunk`` bytes per tree."""
    if n < 2:
        return 0.0
    stages = 2 * (n - 1).bit_length()  # up and down ceil(log2 n) levels
    work = 2 * (n - 1) / n * nbytes * beta + (n - 1) / n * nbytes * gamma
    return pipeline(stages, alpha, work, int(nbytes // (2 * min_chunk)))


def _local_reduce(nbytes: float, g: int, alpha: float, beta: float, gamma: float) -> float:
    """Reduce to one rank among g on a host: the cheaper of a binomial tree (ceil(log2 g) whole
    buffers) and reduce-scatter plus gather (the ring's cost)."""
    if g < 2:
        return 0.0
    binomial = (g - 1).bit_length() * (alpha + nbytes * beta + nbytes * gamma)
    return min(binomial, ring(nbytes, g, alpha, beta, gamma))


def _local_broadcast(nbytes: float, g: int, alpha: float, beta: float) -> float:
    """Broadcast from one rank to g on a host: the cheaper of a binomial tree and scatter plus
    all-gather (the ring's cost without reduction)."""
    if g < 2:
        return 0.0
    binomial = (g - 1).bit_length() * (alpha + nbytes * beta)
    return min(binomial, ring(nbytes, g, alpha, beta, 0.0))


def hierarchical(
    nbytes: float,
    n: int,
    alpha: float,
    beta: float,
    gamma: float,
    ranks_per_host: int = 8,
    local_alpha: float = 0.5e-6,
    local_beta: float = 1 / 20e9,
    inter: str = "ring",
    min_chunk: int = MIN_CHUNK,
) -> float:
    """Reduce to one leader per host over shared memory (``local_alpha``, ``local_beta``), all_reduce
    among the ceil(n / ranks_per_host) leaders over the network with ``inter`` (any flat algorithm
    here), then broadcast from each leader over shared memory.  The three phases run one after
    another (no overlap), and one rank per host drives the network."""
    if n < 2:
        return 0.0
    g = min(ranks_per_host, n)
    hosts = -(-n // ranks_per_host)
    if inter not in FLAT:
        raise ValueError(f"inter={inter!r}: one of {', '.join(FLAT)}")
    between = 0.0
    if hosts > 1:
        if inter == "double_binary_tree":
            between = double_binary_tree(nbytes, hosts, alpha, beta, gamma, min_chunk)
        else:
            between = FLAT[inter](nbytes, hosts, alpha, beta, gamma)
    return (
        _local_reduce(nbytes, g, local_alpha, local_beta, gamma)
        + between
        + _local_broadcast(nbytes, g, local_alpha, local_beta)
    )


def ring_all_gather(total: float, n: int, alpha: float, beta: float) -> float:
    """The ring all_gather of ``total`` bytes in all (total / n from each rank): n - 1 steps."""
    return (n - 1) * (alpha + total / n * beta) if n > 1 else 0.0


def ring_reduce_scatter(total: float, n: int, alpha: float, beta: float, gamma: float) -> float:
    """The ring reduce_scatter of ``total`` bytes per rank: n - 1 steps of total / n, each reduced."""
    return (n - 1) * (alpha + total / n * (beta + gamma)) if n > 1 else 0.0


def hierarchical_all_gather(
    total: float,
    n: int,
    alpha: float,
    beta: float,
    ranks_per_host: int,
    local_alpha: float = 0.5e-6,
    local_beta: float = 1 / 20e9,
) -> float:
    """By host (comm/hosts.py): gather a host's g blocks to its leader (g - 1 shared-memory
    copies), the ring all_gather among the leaders of blocks g times larger, then a broadcast of
    the whole ``total`` from each leader over shared memory."""
    g = min(ranks_per_host, n)
    hosts = -(-n // g)
    gather = (g - 1) * (local_alpha + total / n * local_beta)
    return gather + ring_all_gather(total, hosts, alpha, beta) + _local_broadcast(total, g, local_alpha, local_beta)


def hierarchical_reduce_scatter(
    total: float,
    n: int,
    alpha: float,
    beta: float,
    gamma: float,
    ranks_per_host: int,
    local_alpha: float = 0.5e-6,
    local_beta: float = 1 / 20e9,
) -> float:
    """By host: reduce the whole ``total`` to each leader over shared memory, the ring
    reduce_scatter among the leaders, then scatter a host's g blocks from its leader."""
    g = min(ranks_per_host, n)
    hosts = -(-n // g)
    scatter = (g - 1) * (local_alpha + total / n * local_beta)
    return (
        _local_reduce(total, g, local_alpha, local_beta, gamma)
        + ring_reduce_scatter(total, hosts, alpha, beta, gamma)
        + scatter
    )


# The flat algorithms: every rank a peer on the network.
FLAT = {
    "ring": ring,
    "recursive_doubling": recursive_doubling,
    "tree": tree,
    "double_binary_tree": double_binary_tree,
}


class Table(NamedTuple):
    alpha: float
    beta: float
    gamma: float | None  # None: the file gave none


_KEYS = (("alpha", "alpha_s"), ("beta", "beta_s_per_byte"), ("gamma", "gamma_s_per_byte"))


def load_table(path: str | os.PathLike[str]) -> Table:
    """Read ``{"alpha_s": ..., "beta_s_per_byte": ..., "gamma_s_per_byte": ...}``; alpha and beta
    required, gamma optional; each a finite number >= 0.  Other keys are ignored.  ValueError names
    the file and the key when something is wrong."""
    with open(path, encoding="utf-8") as f:
        try:
            data = json.load(f)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}: not JSON: {e}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a JSON object, got {type(data).__name__}")
    values: dict[str, float | None] = {}
    for name, key in _KEYS:
        v = data.get(key)
        if v is None and name == "gamma":
            values[name] = None
            continue
        if v is None:
            raise ValueError(f"{path}: missing {key!r}")
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
            raise ValueError(f"{path}: {key!r} must be a finite number >= 0, got {v!r}")
        values[name] = float(v)
    alpha, beta = values["alpha"], values["beta"]
    assert alpha is not None and beta is not None
    return Table(alpha, beta, values["gamma"])


def write_table(
    path: str | os.PathLike[str], alpha: float, beta: float, gamma: float, notes: dict[str, Any] | None = None
) -> None:
    """Write the constants (and ``notes``, any JSON-able facts such as where they were measured)
    in the form ``load_table`` reads; the file is replaced whole (written beside it, then renamed)."""
    for name, v in (("alpha", alpha), ("beta", beta), ("gamma", gamma)):
        if not math.isfinite(v) or v < 0:
            raise ValueError(f"{name} must be a finite number >= 0, got {v!r}")
    data: dict[str, Any] = dict(notes or {})
    data.update({"alpha_s": float(alpha), "beta_s_per_byte": float(beta), "gamma_s_per_byte": float(gamma)})
    tmp = f"{os.fspath(path)}.tmp{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=2, sort_keys=True)
        f.write("\n")
    os.replace(tmp, path)
