"""``uniccl bench --fit-model FILE``: measure the tuner's constants on this cluster.

alpha (seconds per message) and beta (seconds per byte) of the point-to-point path between
ranks 0 and 1: a ping-pong of ``comm.send``/``comm.recv`` over the sizes of the sweep, half the median
round trip of each, fitted to t(m) = alpha + m * beta by least squares on relative error.  gamma (seconds per byte
reduced): a float32 sum of two 16 MiB arrays on rank 0, as the host reductions run.  The file
is what :func:`uniccl.comm.costmodel.write_table` writes and ``UNICCL_TUNER_TABLE`` reads.
Start ranks 0 and 1 on two hosts for the network's figures (on one host they are the
shared-memory or loopback path's); the transport is written into the file's notes.
"""

from __future__ import annotations

import socket
import time

import numpy as np

from ..comm import costmodel

_GAMMA_BYTES = 16 << 20


def ping_pong(comm, sizes: list[int], iters: int, warmup: int) -> dict[int, float]:
    """Seconds of one message of each size between ranks 0 and 1 (empty on the other ranks).

    The sizes take turns, one round trip each per round, and each size's figure is half its
    median round trip: a rank preempted on a shared host (milliseconds) or a slow spell of the
    machine then lands on every size alike, or on none, instead of on one size's whole sample."""
    bufs = [np.zeros(n, np.uint8) for n in sizes]
    comm.barrier()
    if comm.rank > 1:
        return {}
    peer = 1 - comm.rank
    trips: list[list[float]] = [[] for _ in sizes]
    for i in range(warmup + iters):
        for buf, got in zip(bufs, trips):
            t0 = time.perf_counter()
            if comm.rank == 0:
                comm.send(buf, peer)
                comm.recv(buf, peer)
            else:
                comm.recv(buf, peer)
                comm.send(buf, peer)
            if i >= warmup:
                got.append(time.perf_counter() - t0)
    return {n: float(np.median(got)) / 2 for n, got in zip(sizes, trips)}


def least_squares(points: list[tuple[int, float]]) -> tuple[float, float]:
    """(alpha, beta) of t = alpha + m * beta through ``points`` (m, t), fitted on relative error
    (residuals divided by t: the 8 B times count as much as the 64 MiB ones), each >= 0."""
    m = np.array([p[0] for p in points], np.float64)
    t = np.array([p[1] for p in points], np.float64)
    x, y = 1 / t, m / t  # minimise sum((alpha x + beta y - 1)^2)
    a = np.array([[x @ x, x @ y], [x @ y, y @ y]])
    if len(points) < 2 or abs(np.linalg.det(a)) < 1e-12 * (x @ x) * (y @ y):
        return float(np.median(t)), 0.0
    alpha, beta = np.linalg.solve(a, [x.sum(), y.sum()])
    if beta < 0:
        return float(x.sum() / (x @ x)), 0.0
    if alpha < 0:
        return 0.0, float(y.sum() / (y @ y))
    return float(alpha), float(beta)


def reduction_cost(iters: int = 5) -> float:
    """Seconds per byte of a float32 sum into one of two arrays (best of ``iters``)."""
    a = np.ones(_GAMMA_BYTES // 4, np.float32)
    b = np.ones_like(a)
    best = float("inf")
    for _ in range(iters):
        t0 = time.perf_counter()
        np.add(a, b, out=a)
        best = min(best, time.perf_counter() - t0)
    return best / _GAMMA_BYTES


def fit_model(comm, sizes: list[int], iters: int, warmup: int, path: str, command: str, out) -> int:
    """Measure, write ``path`` (rank 0) and print the fit; the exit code."""
    if comm.size < 2:
        if comm.rank == 0:
            print("uniccl bench: error: --fit-model needs 2 ranks or more (-np 2)", file=out)
        return 2
    points = ping_pong(comm, sizes, iters, warmup)
    if comm.rank != 0:
        comm.barrier()
        return 0
    measured = sorted(points.items())
    alpha, beta = least_squares(measured)
    gamma = reduction_cost()
    transport = comm.stats().get("transport")
    notes = {
        "measured_by": command,
        "transport": transport,
        "ranks": comm.size,
        "host_of_rank_0": socket.gethostname(),
        "points_s": {str(n): t for n, t in measured},
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    costmodel.write_table(path, alpha, beta, gamma, notes)
    print(f"# point-to-point between ranks 0 and 1 ({transport}), one message, half a round trip:", file=out)
    print(f"# {'bytes':>12} {'measured us':>12} {'fitted us':>12}", file=out)
    for n, t in measured:
        print(f"  {n:>12} {t * 1e6:>12.2f} {(alpha + n * beta) * 1e6:>12.2f}", file=out)
    bw = f"{1 / beta / 1e9:.2f} GB/s" if beta else "unbounded"
    print(
        f"# alpha {alpha * 1e6:.2f} us, beta {beta:.3e} s/B ({bw}), gamma {gamma:.3e} s/B "
        f"({1 / gamma / 1e9:.2f} GB/s reduced) -> {path}",
        file=out,
    )
    print(f"# the tuner uses them with UNICCL_TUNER_TABLE={path}", file=out, flush=True)
    comm.barrier()
    return 0
