"""Every collective on buffers in the platform's own memory, checked against numpy.

usage: collectives.py  (under uniccl run; the platform comes from UNICCL_PLATFORM)
Prints one JSON line per rank: cases, failures, and how often the vendor's native
collective library was called (emulated platforms), then exits 1 on any failure.
"""

import ctypes
import json
import sys
import traceback
from pathlib import Path

import ml_dtypes
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _platform import DeviceArray

import uniccl

DTYPES = [np.float32, np.int32, np.float64, ml_dtypes.bfloat16, np.int64]


def data(rank, n, t, salt):
    rng = np.random.default_rng(1000 * salt + rank)
    if np.dtype(t).kind in "iu":
        return rng.integers(-50, 50, n).astype(t)
    return rng.integers(-8, 8, n).astype(t)  # small integers: sums exact in every float type


def main() -> int:
    comm = uniccl.init()
    r, n, be = comm.rank, comm.size, comm._backend
    dev = lambda a: DeviceArray(be, a, device=comm.device)  # noqa: E731  (this rank's device)
    cases, failures, salt = 0, [], 0

    def check(name, got, expect):
        nonlocal cases
        cases += 1
        if not np.array_equal(np.asarray(got).astype(np.float64), np.asarray(expect).astype(np.float64)):
            failures.append(name)

    for t in DTYPES:
        for count in (0, 1, 1000, 3 * n * 257):
            salt += 1
            tag = f"{np.dtype(t).name} count={count}"
            ins = [data(q, count, t, salt) for q in range(n)]
            ref_sum = np.sum([x.astype(np.float64) for x in ins], axis=0) if count else np.zeros(0)
            try:
                for op, ref in (("sum", ref_sum), ("max", np.max(ins, axis=0) if count else np.zeros(0))):
                    a = dev(ins[r])
                    comm.all_reduce(a.buffer(), op=op)
                    check(f"all_reduce {op} in place {tag}", a.download(), ref)
                    a.free()
                a, b = dev(ins[r]), dev(np.zeros(count, t))
                comm.all_reduce(a.buffer(), b.buffer())
                check(f"all_reduce out of place {tag}", b.download(), ref_sum)
                root = (count + 1) % n
                comm.broadcast(a.buffer(), root=root)
                check(f"broadcast {tag}", a.download(), ins[root])
                a.upload(ins[r])
                b.upload(np.zeros(count, t))
                comm.reduce(a.buffer(), b.buffer(), root=root)
                if r == root:
                    check(f"reduce {tag}", b.download(), ref_sum)
                a.free()
                b.free()
                g = dev(np.zeros(n * count, t))
                s = dev(ins[r])
                comm.all_gather(s.buffer(), g.buffer())
                check(f"all_gather {tag}", g.download(), np.concatenate(ins))
                s.free()
                g.free()
                if count % n == 0:
                    big = [data(q, count, t, salt + 500) for q in range(n)]
                    s, o = dev(big[r]), dev(np.zeros(count // n, t))
                    comm.reduce_scatter(s.buffer(), o.buffer())
                    m = count // n
                    check(
                        f"reduce_scatter {tag}",
                        o.download(),
                        np.sum([x.astype(np.float64) for x in big], axis=0)[r * m : (r + 1) * m],
                    )
                    o2 = dev(np.zeros(count, t))
                    comm.all_to_all(s.buffer(), o2.buffer())
                    check(f"all_to_all {tag}", o2.download(), np.concatenate([x[r * m : (r + 1) * m] for x in big]))
                    s.free()
                    o.free()
                    o2.free()
                # point to point: a ring in one group
                snd, rcv = dev(ins[r]), dev(np.zeros(count, t))
                with uniccl.group():
                    comm.send(snd.buffer(), (r + 1) % n)
                    comm.recv(rcv.buffer(), (r - 1) % n)
                check(f"send/recv ring {tag}", rcv.download(), ins[(r - 1) % n])
                snd.free()
                rcv.free()
            except Exception:
                failures.append(f"{tag}: {traceback.format_exc()}")
    # on a stream of the caller's: the op is ordered there (native: enqueued, not waited for)
    stream = be.stream_create(comm.device) if be.stream_create else None
    for t in (np.float32, np.int64):
        x = [data(q, 5000, t, 999) for q in range(n)]
        a = DeviceArray(be, x[r], device=comm.device, stream=stream)
        comm.all_reduce(a.buffer())
        if stream is not None:
            be.stream_synchronize(stream)
        check(
            f"all_reduce on a stream {np.dtype(t).name}",
            a.download(),
            np.sum([v.astype(np.float64) for v in x], axis=0),
        )
        a.free()
    if stream is not None:
        be.stream_destroy(stream)
    calls = p2p_calls = -1
    if be.name != "cpu":
        lib = be.record.module.runtime().lib  # its counters cover the emulated NCCL's calls too
        fn = getattr(lib, "uniccl_emu_calls", None)
        if fn is not None:
            fn.argtypes, fn.restype = [ctypes.c_char_p], ctypes.c_int
            ccl = be.record.module.ccl_spec.prefix.encode()  # nccl, mccl
            calls = fn(ccl + b"AllReduce")
            p2p_calls = fn(ccl + b"Send") + fn(ccl + b"Recv")
    print(
        json.dumps(
            {
                "rank": r,
                "platform": be.name,
                "cases": cases,
                "failures": failures[:5],
                "nccl_all_reduce_calls": calls,
                "nccl_p2p_calls": p2p_calls,
            }
        ),
        flush=True,
    )
    comm.destroy()
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
