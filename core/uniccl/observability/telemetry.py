"""Telemetry, on by default (``UNICCL_TELEMETRY=0`` turns it off).

Per communicator, per operation and message-size bucket (powers of two): calls, bytes,
seconds and a latency histogram; per peer link of the TCP mesh: bytes and seconds sent
and received, retransmissions.  :meth:`Communicator.stats` returns it as a plain dict
(:func:`summary`); the Prometheus exporter, the status files of ``uniccl top`` and
``uniccl report`` read the same numbers.

Cost per call: two clock reads and one call into C (:mod:`uniccl.observability._counters`).  The histogram
has four buckets per power of two of nanoseconds, so percentiles are good to about 12 %.
"""

from __future__ import annotations

from .. import _env
from ._counters import Counters

_SUB = 2  # log2 of the buckets per power of two
_BUCKETS = 64 << _SUB

# Bus bandwidth = algorithm bandwidth x this factor (as nccl-tests reports it): the bytes
# each rank's busiest link carries, per byte of the message, for the best algorithm.
_BUS = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "all_to_all": lambda n: (n - 1) / n,
    "gather": lambda n: (n - 1) / n,
    "scatter": lambda n: (n - 1) / n,
}


def enabled() -> bool:
    return _env.flag("UNICCL_TELEMETRY")


def bus_factor(op: str, size: int) -> float:
    if size < 2:
        return 1.0 if op != "barrier" else 0.0
    f = _BUS.get(op)
    return f(size) if f is not None else 1.0


def bucket(ns: int) -> int:
    """Histogram bucket of a duration in nanoseconds."""
    b = ns.bit_length()
    return (b << _SUB) | ((ns >> (b - 3)) & 3) if b > 3 else ns


def bucket_bounds(i: int) -> tuple[float, float]:
    """[low, high) nanoseconds of bucket ``i``."""
    if i < 16:
        return float(i), float(i + 1)
    b, sub = i >> _SUB, i & 3
    return float((4 + sub) << (b - 3)), float((5 + sub) << (b - 3))


def size_label(k: int) -> str:
    """The message-size bucket ``k`` (bit length of the byte count) as text: its upper bound."""
    if k == 0:
        return "0B"
    top = 1 << k  # sizes in [2**(k-1), 2**k)
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if top >= 1 << shift:
            return f"<{top >> shift}{unit}"
    return f"<{top}B"


# One communicator's counters, in C: ``Telemetry(size).record(op, nbytes, ns)``;
# ``ops[(op, size bucket)]`` is a ``Stat`` with ``calls``, ``nbytes``, ``ns`` and ``histogram()``,
# ``failed[op]`` counts calls that raised.
Telemetry = Counters


def percentile(hist, q: float) -> float:
    """The ``q`` quantile (0..1) of a histogram, in nanoseconds (its bucket's midpoint)."""
    total = sum(hist)
    if not total:
        return 0.0
    want, seen = q * total, 0
    for i, c in enumerate(hist):
        seen += c
        if c and seen >= want:
            lo, hi = bucket_bounds(i)
            return (lo + hi) / 2
    return 0.0


def _entry(op: str, size: int, calls: int, nbytes: int, ns: int, hist) -> dict:
    seconds = ns * 1e-9
    algbw = nbytes / seconds / 1e9 if seconds > 0 else 0.0
    return {
        "calls": calls,
        "bytes": nbytes,
        "seconds": seconds,
        "algbw_GBps": algbw,
        "busbw_GBps": algbw * bus_factor(op, size),
        "p50_us": percentile(hist, 0.50) / 1e3,
        "p99_us": percentile(hist, 0.99) / 1e3,
    }


def summary(t) -> dict:
    """Plain-dict view: per op the totals and, under ``by_size``, each size bucket."""
    out: dict = {}
    for (op, k), st in sorted(t.ops.items()):
        calls, nbytes, ns, hist = st.calls, st.nbytes, st.ns, st.histogram()
        o = out.get(op)
        if o is None:
            o = out[op] = {"calls": 0, "bytes": 0, "ns": 0, "hist": [0] * _BUCKETS, "by_size": {}}
        o["calls"] += calls
        o["bytes"] += nbytes
        o["ns"] += ns
        o["hist"] = [a + b for a, b in zip(o["hist"], hist)]
        e = _entry(op, t.size, calls, nbytes, ns, hist)
        e["mean_bytes"] = nbytes / calls if calls else 0
        o["by_size"][size_label(k)] = e
    for op, o in out.items():
        by_size = o.pop("by_size")
        o.update(_entry(op, t.size, o.pop("calls"), o.pop("bytes"), o.pop("ns"), o.pop("hist")))
        o["failed"] = t.failed.get(op, 0)
        o["by_size"] = by_size
    for op, n in t.failed.items():
        if op not in out:
            out[op] = {"calls": 0, "bytes": 0, "seconds": 0.0, "failed": n, "by_size": {}}
    return out


def arrivals(a: dict, size: int) -> dict:
    """What ``comm.stats()["arrival"]`` says of the shared-memory engine's arrival counts
    (``ShmEngine.arrivals``): of ``calls``, the ``last`` in which this rank arrived last (its
    share, against 1/size by chance), and how long it waited for the last rank at the others
    (mean, and p50/p99 to within a factor of 2: the counts are per power of two of ns)."""
    calls, hist = a["calls"], a["hist"]
    out = {"calls": calls, "last": a["last"], "last_share": a["last"] / calls if calls else 0.0}
    out["chance_share"] = 1.0 / size if size else 0.0
    out["wait_mean_us"] = a["wait_ns"] / calls / 1e3 if calls else 0.0
    out["wait_ns"], out["hist_log2_ns"] = a["wait_ns"], list(hist)  # (Prometheus' histogram)
    for name, q in (("wait_p50_us", 0.5), ("wait_p99_us", 0.99)):
        seen, value = 0, 0.0
        for b, n in enumerate(hist):
            seen += n
            if calls and seen >= q * calls:
                value = 0.0 if b == 0 else (1 << b) / 1e3  # the bucket's upper bound
                break
        out[name] = value
    return out
