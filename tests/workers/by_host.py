"""Worker for the by-host tests (test_by_host.py), run by ``uniccl run --hosts`` over network
namespaces: all_reduce, all_gather and reduce_scatter on the world and on a split of it whose
ranks interleave the hosts, each value checked against numpy in float64, and the algorithm each
call took (from the flight recorder).  One JSON line per rank."""

import json

import numpy as np

import uniccl
from uniccl.observability import flight

comm = uniccl.init()


def data(rank: int, count: int, dtype) -> np.ndarray:
    """Rank ``rank``'s input: ((31 rank + i) mod 97) / 8 - 6, exact in every float type, and for
    integers ((31 rank + i) mod 7) - 3 (their products stay small)."""
    i = np.arange(count)
    if np.issubdtype(dtype, np.integer):
        return (((31 * rank + i) % 7) - 3).astype(dtype)
    return (((31 * rank + i) % 97) / 8 - 6).astype(dtype)


def reference(n: int, count: int, dtype, op: str) -> np.ndarray:
    """The reduction of every rank's data, in float64 (integer AVG truncates toward zero)."""
    rows = np.stack([data(r, count, dtype).astype(np.float64) for r in range(n)])
    if op == "avg" and np.issubdtype(dtype, np.integer):
        return np.trunc(rows.sum(0) / n)
    return {"sum": rows.sum(0), "max": rows.max(0), "prod": rows.prod(0), "avg": rows.sum(0) / n}[op]


def path(c) -> str:
    """The algorithm the last call took."""
    choice = c.last_operation()[flight.PATH]
    return getattr(choice, "algorithm", str(choice))


def check(c) -> dict:
    r, n = c.rank, c.size
    out = {"rank": r, "size": n, "errors": [], "paths": {}}

    def note(name, ok, what):
        out["paths"].setdefault(name, set()).add(path(c))
        if not ok:
            out["errors"].append(what)

    for dtype, op, count in [
        (np.float32, "sum", 1),
        (np.float32, "sum", 1000),
        (np.float64, "max", 4097),
        (np.float32, "avg", 1000),
        (np.int32, "avg", 333),
        (np.int64, "prod", 50),
        (np.float32, "sum", 300_000),
    ]:
        x = data(r, count, dtype)
        y = np.empty_like(x)
        c.all_reduce(x, y, op=op)
        want = reference(n, count, dtype, op)
        tol = 1e-5 * n if dtype == np.float32 else 0
        note(
            "all_reduce",
            np.max(np.abs(y.astype(np.float64) - want)) <= tol,
            f"all_reduce {dtype.__name__} {op} {count}",
        )
        c.all_reduce(x, op=op)  # in place
        note("all_reduce", np.array_equal(x, y), f"all_reduce in place {dtype.__name__} {op} {count}")

    for m in (1, 37, 70_000):
        g = np.full(n * m, -1, np.int32)
        c.all_gather((1000 * r + np.arange(m)).astype(np.int32), g)
        want = (1000 * np.arange(n)[:, None] + np.arange(m)[None, :]).reshape(-1)
        note("all_gather", np.array_equal(g, want), f"all_gather {m}")
        g = np.full(n * m, -1, np.int32)
        g[r * m : (r + 1) * m] = 1000 * r + np.arange(m)
        c.all_gather(g[r * m : (r + 1) * m], g)  # in place
        note("all_gather", np.array_equal(g, want), f"all_gather in place {m}")

    for dtype, op, count in [(np.float32, "sum", 33), (np.float64, "max", 5000), (np.float32, "avg", 8)]:
        send = data(r, n * count, dtype)
        recv = np.empty(count, dtype)
        c.reduce_scatter(send, recv, op=op)
        want = reference(n, n * count, dtype, op)[r * count : (r + 1) * count]
        tol = 1e-5 * n if dtype == np.float32 else 0
        note("reduce_scatter", np.max(np.abs(recv - want)) <= tol, f"reduce_scatter {dtype.__name__} {op} {count}")

    hosts = c._hosts  # what the communicator made of its hosts (None: nothing to group)
    out["hosts"] = None if hosts is None else [len(m) for m in hosts.members]
    out["in_order"] = None if hosts is None else hosts.in_order
    out["local_transport"] = None if hosts is None else hosts.local.tuner.transport
    out["local_size"] = None if hosts is None else hosts.local.size
    out["local_calls"] = None if hosts is None else hosts.local.calls
    out["paths"] = {k: sorted(v) for k, v in out["paths"].items()}
    return out


world = check(comm)
# the same ranks, ordered so that each host's ranks are not consecutive: even world ranks first
mixed = comm.split(0, key=(comm.rank % 2) * comm.size + comm.rank)
print(json.dumps({"world": world, "interleaved": check(mixed), "transport": comm.tuner.transport}), flush=True)
mixed.destroy()
comm.destroy()
