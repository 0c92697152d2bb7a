"""Bad input on one rank (the last) must raise a typed error on every rank, quickly,
and leave the communicator usable.  Prints one JSON line per (case, rank).

usage: bad_input.py [CASE ...]   (default: every case)
"""

from __future__ import annotations

import json
import sys
import time

import numpy as np

import uniccl


def f32(n, v=1.0):
    return np.full(n, v, np.float32)


def readonly(n):
    a = f32(n)
    a.flags.writeable = False
    return a


# case -> (call(comm, bad) , error type on the bad rank, on the others; "same" = same as bad rank)
CASES = {
    "recv_too_small": (
        lambda c, bad: c.all_reduce(f32(8), f32(4 if bad else 8)),
        uniccl.InvalidArgument,
        uniccl.RemoteError,
    ),
    "non_contiguous_send": (
        lambda c, bad: c.all_reduce(f32(16)[::2] if bad else f32(8)),
        uniccl.InvalidArgument,
        uniccl.RemoteError,
    ),
    "non_contiguous_2d": (
        lambda c, bad: c.broadcast(np.zeros((4, 4), np.float32)[:, 1] if bad else f32(4)),
        uniccl.InvalidArgument,
        uniccl.RemoteError,
    ),
    "readonly_recv": (
        lambda c, bad: c.all_reduce(f32(8), readonly(8) if bad else f32(8)),
        uniccl.InvalidArgument,
        uniccl.RemoteError,
    ),
    "readonly_inplace": (
        lambda c, bad: c.all_reduce(readonly(8) if bad else f32(8)),
        uniccl.InvalidArgument,
        uniccl.RemoteError,
    ),
    "readonly_broadcast_nonroot": (
        lambda c, bad: c.broadcast(readonly(8) if bad else f32(8), root=0),
        uniccl.InvalidArgument,
        uniccl.RemoteError,
    ),
    "unsupported_dtype": (
        lambda c, bad: c.all_reduce(np.zeros(8, np.complex64) if bad else f32(8)),
        uniccl.InvalidArgument,
        uniccl.RemoteError,
    ),
    "bool_dtype": (
        lambda c, bad: c.all_gather(np.zeros(2, bool) if bad else f32(2), f32(2 * c.size)),
        uniccl.InvalidArgument,
        uniccl.RemoteError,
    ),
    "unknown_op": (
        lambda c, bad: c.all_reduce(f32(8), op="xor" if bad else "sum"),
        uniccl.InvalidArgument,
        uniccl.RemoteError,
    ),
    "unknown_op_reduce_scatter": (
        lambda c, bad: c.reduce_scatter(f32(2 * c.size), f32(2), op=7 if bad else 0),
        uniccl.InvalidArgument,
        uniccl.RemoteError,
    ),
    "root_out_of_range": (
        lambda c, bad: c.broadcast(f32(8), root=c.size if bad else 0),
        uniccl.InvalidArgument,
        uniccl.RemoteError,
    ),
    "negative_root_reduce": (
        lambda c, bad: c.reduce(f32(8), f32(8), root=-1 if bad else 0),
        uniccl.InvalidArgument,
        uniccl.RemoteError,
    ),
    "dtype_send_recv_differ": (
        lambda c, bad: c.all_reduce(f32(8), np.zeros(8, np.float64 if bad else np.float32)),
        uniccl.InvalidArgument,
        uniccl.RemoteError,
    ),
    "not_a_buffer": (
        lambda c, bad: c.all_reduce([1.0] * 8 if bad else f32(8)),
        uniccl.InvalidArgument,
        uniccl.RemoteError,
    ),
    "none_buffer": (
        lambda c, bad: c.all_to_all(None if bad else f32(c.size), f32(c.size)),
        uniccl.InvalidArgument,
        uniccl.RemoteError,
    ),
    "all_gather_recv_too_small": (
        lambda c, bad: c.all_gather(f32(4), f32(4 * c.size - (1 if bad else 0))),
        uniccl.InvalidArgument,
        uniccl.RemoteError,
    ),
    "reduce_scatter_not_divisible": (
        lambda c, bad: c.reduce_scatter(f32(2 * c.size + (1 if bad else 0)), f32(2)),
        uniccl.InvalidArgument,
        uniccl.RemoteError,
    ),
    "all_to_all_not_divisible": (
        lambda c, bad: c.all_to_all(f32(c.size + (1 if bad else 0)), f32(c.size + 1)),
        uniccl.InvalidArgument,
        uniccl.RemoteError,
    ),
    "gather_root_recv_too_small": (
        lambda c, bad: c.gather(f32(4), f32(4 * c.size - (1 if bad else 0)), root=c.size - 1),
        uniccl.InvalidArgument,
        uniccl.RemoteError,
    ),
    "scatter_root_without_sendbuf": (
        lambda c, bad: c.scatter(None if bad else f32(4 * c.size), f32(4), root=c.size - 1),
        uniccl.InvalidArgument,
        uniccl.RemoteError,
    ),
    "overlapping_buffers": (lambda c, bad: _overlap(c, bad), uniccl.InvalidArgument, uniccl.RemoteError),
    "async_bad_input": (
        lambda c, bad: c.all_reduce(f32(8), f32(4 if bad else 8), async_op=True).wait(),
        uniccl.InvalidArgument,
        uniccl.RemoteError,
    ),
    "mismatched_count": (lambda c, bad: c.all_reduce(f32(9 if bad else 8)), uniccl.InvalidUsage, "same"),
    "mismatched_op": (lambda c, bad: c.all_reduce(f32(8), op="max" if bad else "sum"), uniccl.InvalidUsage, "same"),
    "mismatched_dtype": (
        lambda c, bad: c.all_reduce(np.zeros(8, np.float64) if bad else f32(8)),
        uniccl.InvalidUsage,
        "same",
    ),
    "mismatched_root": (lambda c, bad: c.broadcast(f32(8), root=c.size - 1 if bad else 0), uniccl.InvalidUsage, "same"),
    "mismatched_collective": (
        lambda c, bad: c.all_gather(f32(1), f32(c.size)) if bad else c.all_reduce(f32(1)),
        uniccl.InvalidUsage,
        "same",
    ),
    # a ring call (its agreement rides on the data over TCP) against a tree call (records up front)
    "mismatched_ring_and_tree": (
        lambda c, bad: c.broadcast(f32(1 << 16), root=0) if bad else c.all_reduce(f32(1 << 16)),
        uniccl.InvalidUsage,
        "same",
    ),
    # many chunks on the way when the difference is found: all dropped, the next call clean
    "mismatched_op_large": (
        lambda c, bad: c.all_reduce(f32(1 << 20), op="max" if bad else "sum"),
        uniccl.InvalidUsage,
        "same",
    ),
    # shared memory: a call small enough for the engine's boxes against one through its slots
    "mismatched_count_box_and_slots": (
        lambda c, bad: c.all_reduce(f32(4096 if bad else 8)),
        uniccl.InvalidUsage,
        "same",
    ),
    # AVG agrees before its data (a rendezvous of its own) against a call whose record rides on its data
    "mismatched_op_agreed_alone": (
        lambda c, bad: c.all_reduce(f32(8), op="avg" if bad else "sum"),
        uniccl.InvalidUsage,
        "same",
    ),
    "mismatched_collective_box_and_slots": (
        lambda c, bad: c.broadcast(f32(8), root=0) if bad else c.all_gather(f32(4096), f32(4096 * c.size)),
        uniccl.InvalidUsage,
        "same",
    ),
    # one rank's messages four times longer than the others expect (MPI: would truncate)
    "mismatched_count_large": (
        lambda c, bad: c.all_reduce(f32(1 << 20 if bad else 1 << 18)),
        uniccl.InvalidUsage,
        "same",
    ),
    "peer_out_of_range": (lambda c, bad: c.send(f32(8), c.size), uniccl.InvalidArgument, "same"),
    "send_to_self_outside_group": (lambda c, bad: c.send(f32(8), c.rank), uniccl.InvalidArgument, "same"),
    "recv_truncated": (lambda c, bad: _truncated(c, bad), uniccl.InvalidArgument, None),
    # 16 KiB into 16 bytes: Open MPI 5 overruns such a buffer (the MPI transport probes first there)
    "recv_truncated_large": (lambda c, bad: _truncated(c, bad, 4096), uniccl.InvalidArgument, None),
    "split_bad_color": (lambda c, bad: c.split("red"), uniccl.InvalidArgument, "same"),
    "negative_timeout": (
        lambda c, bad: c.all_reduce(f32(8), timeout=-1 if bad else None),
        uniccl.InvalidArgument,
        uniccl.RemoteError,
    ),
    "mismatched_scatter_recv": (
        lambda c, bad: c.scatter(f32(4 * c.size) if c.rank == 0 else None, f32(3 if bad else 4), root=0),
        uniccl.InvalidUsage,
        "same",
    ),
    "reduce_root_readonly_recv": (
        lambda c, bad: c.reduce(f32(8), readonly(8) if bad else f32(8), root=c.size - 1),
        uniccl.InvalidArgument,
        uniccl.RemoteError,
    ),
    "mismatched_gather_root": (
        lambda c, bad: c.gather(f32(2), f32(2 * c.size), root=c.size - 1 if bad else 0),
        uniccl.InvalidUsage,
        "same",
    ),
    "all_to_all_recv_too_small": (
        lambda c, bad: c.all_to_all(f32(2 * c.size), f32(2 * c.size - (1 if bad else 0))),
        uniccl.InvalidArgument,
        uniccl.RemoteError,
    ),
    "reduce_scatter_recv_dtype": (
        lambda c, bad: c.reduce_scatter(f32(2 * c.size), np.zeros(2, np.float64 if bad else np.float32)),
        uniccl.InvalidArgument,
        uniccl.RemoteError,
    ),
    "call_from_forked_child": (lambda c, bad: _forked(c, bad), uniccl.InvalidUsage, None),
    "bool_root": (
        lambda c, bad: c.broadcast(f32(8), root=True if bad else 0),
        uniccl.InvalidArgument,
        uniccl.RemoteError,
    ),
    "float_peer": (lambda c, bad: c.send(f32(8), 0.5), uniccl.InvalidArgument, "same"),
    "all_gather_recv_dtype": (
        lambda c, bad: c.all_gather(f32(2), np.zeros(2 * c.size, np.int32 if bad else np.float32)),
        uniccl.InvalidArgument,
        uniccl.RemoteError,
    ),
}


# Cases that are only wrong when there is a second rank to disagree with or to be the root.
NEEDS_TWO = {"recv_truncated", "recv_truncated_large", "readonly_broadcast_nonroot", "all_to_all_not_divisible"} | {
    c for c in CASES if c.startswith("mismatched")
}


def _forked(c, bad):
    """The last rank forks; the child calls the parent's communicator: a typed error in the
    child (its parent's sockets and shared memory are never touched), nothing for the others."""
    import os

    if not bad:
        return None
    pid = os.fork()
    if pid == 0:
        try:
            c.all_reduce(f32(8))
            code = 1
        except uniccl.InvalidUsage as exc:
            code = 0 if "forked child" in str(exc) else 2
        except BaseException:
            code = 3
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        return "the forked child did not get InvalidUsage"
    raise uniccl.InvalidUsage("forked child refused, as it should be", op="all_reduce", rank=c.rank)


def _overlap(c, bad):
    a = f32(16)
    return c.all_reduce(a[:8], a[4:12] if bad else f32(8))


def _truncated(c, bad, n=8):
    """The last rank receives n floats into a buffer of 4: only it can tell."""
    if c.size < 2:
        raise uniccl.InvalidArgument("needs 2 ranks", op="recv")
    if bad:
        c.recv(f32(4), 0)
    elif c.rank == 0:
        c.send(f32(n), c.size - 1)
    return None


def run(case: str, comm) -> dict:
    call, bad_type, other_type = CASES[case]
    bad = comm.rank == comm.size - 1
    expect = bad_type if bad or other_type == "same" else other_type
    t0 = time.monotonic()
    try:
        call(comm, bad)
        got, msg = None, ""
    except uniccl.UnicclError as exc:
        got, msg = type(exc), str(exc)
    except Exception as exc:  # an untyped error is a failure
        got, msg = type(exc), f"UNTYPED {exc!r}"
    elapsed = time.monotonic() - t0
    ok = got is expect if expect is not None else got is None
    if case.startswith("recv_truncated") and comm.rank != 0 and not bad:
        ok = got is None  # bystanders do nothing
    # the communicator must still work, and agree, after the error
    usable = True
    for n in (4, 1 << 16):  # small, and large enough to meet anything a mismatch left on the way
        x = np.full(n, comm.rank + 1, np.float64)
        comm.all_reduce(x)
        usable = usable and bool(np.all(x == comm.size * (comm.size + 1) / 2))
    return {
        "case": case,
        "rank": comm.rank,
        "ok": ok and usable,
        "expected": getattr(expect, "__name__", None),
        "got": getattr(got, "__name__", None),
        "seconds": round(elapsed, 3),
        "message": msg,
        "usable": usable,
    }


def main() -> int:
    from _world import world

    cases = sys.argv[1:] or list(CASES)
    rows = []
    with uniccl.init() as comm:
        for case in cases:
            if comm.size < 2 and case in NEEDS_TWO:
                continue
            rows.append(run(case, comm))
        # use after destroy: every rank
        comm.destroy()
        try:
            comm.all_reduce(f32(8))
            res = {"case": "use_after_destroy", "rank": comm.rank, "ok": False, "got": None}
        except uniccl.InvalidUsage as exc:
            res = {
                "case": "use_after_destroy",
                "rank": comm.rank,
                "ok": "destroyed" in str(exc),
                "got": "InvalidUsage",
                "seconds": 0,
                "message": str(exc),
            }
        rows.append(res)
    # report through MPI itself (not uniccl) where there is MPI, one writer, so lines never interleave
    w = world()
    everything = w.gather(rows, root=0)
    if w.rank == 0:
        for rank_rows in everything:
            for row in rank_rows:
                print(json.dumps(row), flush=True)
    failed = sum(not row["ok"] for row in rows)
    return 1 if w.allreduce(failed) else 0


if __name__ == "__main__":
    sys.exit(main())
