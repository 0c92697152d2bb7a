"""The compiled native path (uniccl.comm._fastpath): repeated calls of one shape on device
buffers go from the public method to the vendor library's C function by address; checked
against numpy (float64), with the record still agreed, failures typed, a mismatch named.

usage: served.py  (under uniccl run, on an emulated platform with a native library)
Prints one JSON line per rank: cases, failures, calls served compiled, the vendor library's
calls; exits 1 on any failure.
"""

import ctypes
import json
import sys
import traceback
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _platform import DeviceArray

import uniccl

ITERS = 30
N = 257  # elements per rank


def main() -> int:
    comm = uniccl.init()
    r, n, be = comm.rank, comm.size, comm._backend
    fast = comm._fast
    lib = be.record.module.runtime().lib  # the emulation's counters and error injection
    lib.uniccl_emu_calls.argtypes, lib.uniccl_emu_calls.restype = [ctypes.c_char_p], ctypes.c_int
    lib.uniccl_emu_fail.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.c_int, ctypes.c_int]
    prefix = be.record.module.ccl_spec.prefix.encode()  # nccl, mccl, cncl
    failures, cases, calls = [], 0, -1
    dev = lambda a, stream=None: DeviceArray(be, a, device=comm.device, stream=stream)  # noqa: E731

    def vals(q, i, count=N):  # rank q's input of iteration i: small integers, exact in float32
        return ((np.arange(count) * (q + 3) + 7 * i) % 23 - 11).astype(np.float32)

    def summed(i, count=N):
        return np.sum([vals(q, i, count).astype(np.float64) for q in range(n)], axis=0)

    def check(name, got, want):
        nonlocal cases
        cases += 1
        if not np.array_equal(np.asarray(got, np.float64), np.asarray(want, np.float64)):
            failures.append(f"{name}: got {np.asarray(got)[:4]}, want {np.asarray(want)[:4]}")

    def loop(name, step):
        """ITERS calls of one shape with fresh values each; all but the first served compiled."""
        before = fast.served
        for i in range(ITERS):
            step(i)
        if fast.served - before < ITERS - 1:
            failures.append(f"{name}: {fast.served - before} of {ITERS} calls served compiled")

    try:
        a, out = dev(vals(r, 0)), dev(np.zeros(N, np.float32))

        def in_place(i):
            a.upload(vals(r, i))
            assert comm.all_reduce(a) is a
            check("all_reduce in place", a.download(), summed(i))

        loop("all_reduce in place", in_place)

        def out_of_place(i):
            a.upload(vals(r, i))
            assert comm.all_reduce(a, out, uniccl.ReduceOp.MAX) is out
            check("all_reduce max", out.download(), np.max([vals(q, i) for q in range(n)], axis=0))

        loop("all_reduce max out of place", out_of_place)

        def broadcast(i):
            a.upload(vals(r, i))
            comm.broadcast(a, root=n - 1)
            check("broadcast", a.download(), vals(n - 1, i))

        loop("broadcast", broadcast)

        def reduce(i):
            a.upload(vals(r, i))
            out.upload(np.zeros(N, np.float32))
            comm.reduce(a, out, root=0)
            check("reduce", out.download(), summed(i) if r == 0 else np.zeros(N))

        loop("reduce", reduce)

        gathered = dev(np.zeros(n * N, np.float32))

        def all_gather(i):
            a.upload(vals(r, i))
            comm.all_gather(a, gathered)
            check("all_gather", gathered.download(), np.concatenate([vals(q, i) for q in range(n)]))

        loop("all_gather", all_gather)

        def reduce_scatter(i):
            gathered.upload(vals(r, i, n * N))
            comm.reduce_scatter(gathered, out)
            check("reduce_scatter", out.download(), summed(i, n * N)[r * N : (r + 1) * N])

        loop("reduce_scatter", reduce_scatter)

        # on the caller's stream: enqueued there, not waited for; the caller synchronizes
        stream = be.stream_create(comm.device)
        s = dev(vals(r, 0), stream)

        def on_stream(i):
            s.upload(vals(r, i))
            comm.all_reduce(s)
            be.stream_synchronize(stream)
            check("all_reduce on a stream", s.download(), summed(i))

        loop("all_reduce on a stream", on_stream)

        # a sendbuf and a recvbuf on two streams: no library call (it takes one stream, and the
        # other buffer's work would not be waited for); staged, each stream waited for
        other = dev(np.zeros(N, np.float32), be.stream_create(comm.device))
        for i in range(2):
            s.upload(vals(r, 40 + i))
            assert comm.all_reduce(s, other) is other
            check("all_reduce across two streams", other.download(), summed(40 + i))
            path = str(comm._flight.snapshot()["ops"][-1].get("path", ""))
            if path.startswith("native:"):
                failures.append(f"all_reduce across two streams took the library on one: {path}")

        # persistent: checked and agreed once, each start served
        req = comm.all_reduce_init(a)

        def persistent(i):
            a.upload(vals(r, i))
            req.start()
            assert req.wait() is a
            check("persistent all_reduce", a.download(), summed(i))

        loop("persistent all_reduce", persistent)
        req.free()

        # every call above went to the library; the flight recorder names the path
        last = comm._flight.snapshot()["ops"][-1]
        if not str(last.get("path", "")).startswith("native:"):
            failures.append(f"flight recorder path of a served call: {last}")

        # a mismatch on a served shape: every rank raises InvalidUsage naming both counts
        if n > 1:
            short = dev(vals(r, 0, N - 1))
            try:
                comm.all_reduce(a if r == 0 else short)
                failures.append("mismatched counts: no error")
            except uniccl.InvalidUsage as exc:
                if "mismatched call" not in str(exc) or f"count={N}" not in str(exc):
                    failures.append(f"mismatch message: {exc}")
            in_place(99)  # and the communicator works on
            # a peer whose buffer is in host memory: its record asks for no library; the ranks
            # then move the data through the host, the served rank staging its device buffer
            a.upload(vals(r, 98))
            host = vals(r, 98)
            got = comm.all_reduce(host if r == 1 else a)
            check("all_reduce with a host-buffer peer", host if r == 1 else got.download(), summed(98))

        # a device sendbuf with a host recvbuf: the host buffer gets the result (the host path),
        # the device input stays as it was; twice each, the second call a learnt shape's
        for k in range(2):
            a.upload(vals(r, 90 + k))
            host = np.zeros(N, np.float32)
            assert comm.all_reduce(a, host) is host
            check("all_reduce into a host recvbuf", host, summed(90 + k))
            check("all_reduce into a host recvbuf: sendbuf", a.download(), vals(r, 90 + k))
            host = np.zeros(N, np.float32)
            comm.reduce(a, host, root=0)
            check("reduce into a host recvbuf", host, summed(90 + k) if r == 0 else np.zeros(N))
            host = np.zeros(n * N, np.float32)
            comm.all_gather(a, host)
            check("all_gather into a host recvbuf", host, np.concatenate([vals(q, 90 + k) for q in range(n)]))
            gathered.upload(vals(r, 80 + k, n * N))
            host = np.zeros(N, np.float32)
            comm.reduce_scatter(gathered, host)
            check("reduce_scatter into a host recvbuf", host, summed(80 + k, n * N)[r * N : (r + 1) * N])
            check("reduce_scatter into a host recvbuf: sendbuf", gathered.download(), vals(r, 80 + k, n * N))
            # and a host sendbuf into a device recvbuf (the device kernels' path wanted a device sendbuf)
            out.upload(np.zeros(N, np.float32))
            assert comm.all_reduce(vals(r, 60 + k), out) is out
            check("all_reduce of a host sendbuf", out.download(), summed(60 + k))
            comm.reduce_scatter(vals(r, 50 + k, n * N), out)
            check("reduce_scatter of a host sendbuf", out.download(), summed(50 + k, n * N)[r * N : (r + 1) * N])

        # a buffer on another device than the rank's: the host path (the library's communicator,
        # the device kernels and their scratch are the rank's device's), the values right
        devices = len(be.record.probe.get("devices") or ())
        if devices > 1:
            far = DeviceArray(be, vals(r, 30), device=(comm.device + 1) % devices)
            for k in range(2):
                far.upload(vals(r, 30 + k))
                comm.all_reduce(far)
                check("all_reduce on another device", far.download(), summed(30 + k))
                path = str(comm._flight.snapshot()["ops"][-1].get("path", ""))
                if path.startswith("native:") or path == "staged:device kernels":
                    failures.append(f"all_reduce on another device ran on the rank's device: {path}")
            far.free()

        # a buffer whose interface turns read-only after the call read it (as another thread
        # might make it): the call that ran returns on every rank; the shape is not learnt from it
        class Turning(DeviceArray):
            reads = 0

            @property
            def __cuda_array_interface__(self):
                cai = DeviceArray.__cuda_array_interface__.fget(self)
                Turning.reads += 1
                if Turning.reads > 1:
                    cai["data"] = (cai["data"][0], True)
                return cai

        t = Turning(be, vals(r, 70), device=comm.device)
        comm.broadcast(t, root=n - 1)
        check("broadcast of a buffer turning read-only", t.download(), vals(n - 1, 70))

        # a failing library call on a served shape: the status's typed error, naming call and rank
        in_place(100)
        calls = lib.uniccl_emu_calls(prefix + b"AllReduce")
        lib.uniccl_emu_fail(prefix + b"AllReduce", 5, 0, 1)  # every rank's next call fails alike
        try:
            comm.all_reduce(a)
            failures.append("injected failure: no error")
        except uniccl.UnicclError as exc:
            if exc.op != "all_reduce" or exc.rank != r or prefix.decode() + "AllReduce" not in str(exc):
                failures.append(f"injected failure: {type(exc).__name__} {exc!r}")
        lib.uniccl_emu_fail(None, 0, 0, 0)
        in_place(101)
    except Exception:
        failures.append(traceback.format_exc())
    print(
        json.dumps(
            {
                "rank": r,
                "cases": cases,
                "failures": failures[:5],
                "served": fast.served if fast is not None else -1,
                "ccl_all_reduce_calls": calls,
            }
        ),
        flush=True,
    )
    comm.destroy()
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
