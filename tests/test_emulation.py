"""Tests of the vendor ABI emulation itself (tests/emulation, tests/_emulation.py).

Everything goes through ctypes, as a plugin's binding layer would; no uniccl
plugin is involved.  Multi-rank NCCL cases run this file as a worker script
(``python test_emulation.py MODE RANK NRANKS IDHEX``), one process per rank.
"""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys
import time
from ctypes import byref, c_float, c_int, c_size_t, c_void_p
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _emulation import HOSTFN, declare, ncclUniqueId

# cudaMemcpyKind, statuses, NCCL enums
H2H, H2D, D2H, D2D, DEFAULT = range(5)
OK, INVALID_VALUE, NO_MEMORY, INVALID_DIRECTION = 0, 1, 2, 21
INSUFFICIENT_DRIVER, NO_DEVICE, INVALID_DEVICE = 35, 100, 101
INVALID_HANDLE, NOT_READY, ILLEGAL_ADDRESS, NOT_SUPPORTED = 400, 600, 700, 801
nINVALID_ARGUMENT, nINVALID_USAGE, nREMOTE, nSYSTEM = 4, 5, 6, 2
SUM, PROD, MAX, MIN, AVG = range(5)
DTYPES = ["int8", "uint8", "int32", "uint32", "int64", "uint64", "float16", "float32", "float64", "bfloat16"]
HERE = Path(__file__).resolve()


# ============================================================== rank worker
def _np_dtype(code):
    import numpy as np

    if DTYPES[code] == "bfloat16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(DTYPES[code])


def _is_int(code):
    return code <= 5


def _inputs(rank, count, code, salt):
    import numpy as np

    rng = np.random.default_rng([salt, rank, code])
    lo, hi = (0, 40) if DTYPES[code].startswith("uint") else (-20, 20) if _is_int(code) else (-8, 8)
    return rng.integers(lo, hi, count).astype(_np_dtype(code))


def _reference(xs, op, code):
    """Reduce in float64/int64 and cast once (integers wrap like the emulation)."""
    import numpy as np

    a = np.stack([x.astype(np.int64 if _is_int(code) else np.float64) for x in xs])
    if op in (SUM, AVG):
        r = a.sum(0)
    elif op == PROD:
        r = a.prod(0)
    elif op == MAX:
        r = a.max(0)
    else:
        r = a.min(0)
    if op == AVG:
        r = np.sign(r) * (np.abs(r) // len(xs)) if _is_int(code) else r / len(xs)
    return r.astype(_np_dtype(code))


def _check(got, want, code, what):
    import numpy as np

    if _is_int(code):
        np.testing.assert_array_equal(got, want, err_msg=what)
    else:
        import ml_dtypes

        eps = float(ml_dtypes.finfo(_np_dtype(code)).eps)
        np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=eps, atol=0, err_msg=what)


def _shm_name(uid):
    """The shared-memory segment an emulated unique id names (offset 32, see nccl_emu.c)."""
    return bytes(uid)[32:96].split(b"\0")[0].decode()


def _shm_exists(name):
    return Path("/dev/shm", name.lstrip("/")).exists()


class _Rank:
    """One rank's view: emulated cudart + nccl, a comm and a stream."""

    def __init__(self, rank, nranks, idhex):
        self.cu = ctypes.CDLL(os.environ["EMU_CUDART"])
        self.nc = ctypes.CDLL(os.environ["EMU_NCCL"])
        declare(self.cu, self.nc)
        self.rank, self.n = rank, nranks
        self.uid = ncclUniqueId.from_buffer_copy(bytes.fromhex(idhex))
        self.comm = c_void_p()
        self.stream = c_void_p()
        self.ck(self.cu.cudaStreamCreate(byref(self.stream)))
        self.bufs = []

    def init(self):
        return self.nc.ncclCommInitRank(byref(self.comm), self.n, self.uid, self.rank)

    @staticmethod
    def ck(rc, what="call"):
        if rc != 0:
            raise AssertionError(f"{what} returned {rc}")

    def dev(self, arr=None, nbytes=None):
        p = c_void_p()
        nbytes = arr.nbytes if arr is not None else nbytes
        self.ck(self.cu.cudaMalloc(byref(p), max(nbytes, 1)), "cudaMalloc")
        if arr is not None and arr.nbytes:
            self.ck(self.cu.cudaMemcpy(p, arr.ctypes.data, arr.nbytes, H2D), "cudaMemcpy H2D")
        self.bufs.append(p)
        return p

    def host(self, p, count, code, offset=0):
        import numpy as np

        out = np.empty(count, _np_dtype(code))
        if out.nbytes:
            src = c_void_p(p.value + offset * out.itemsize)
            self.ck(self.cu.cudaMemcpy(out.ctypes.data, src, out.nbytes, D2H), "cudaMemcpy D2H")
        return out

    def free(self):
        for p in self.bufs:
            self.ck(self.cu.cudaFree(p), "cudaFree")
        self.bufs = []

    def sync(self, stream=None):
        self.ck(self.cu.cudaStreamSynchronize(stream or self.stream), "cudaStreamSynchronize")
        return self.async_error()

    def async_error(self):
        e = c_int(-1)
        self.ck(self.nc.ncclCommGetAsyncError(self.comm, byref(e)), "ncclCommGetAsyncError")
        return e.value

    def run(self, what, rc):
        self.ck(rc, what)
        err = self.sync()
        if err:
            raise AssertionError(f"{what}: async error {err}")


def _coll_cases(r: _Rank, big: bool):
    import numpy as np

    n, me, nc = r.n, r.rank, r.nc
    calls = 0
    # all_reduce: every dtype x every op, out of place
    for code in range(10):
        for op in range(5):
            count = 37
            xs = [_inputs(k, count, code, 1) for k in range(n)]
            s, d = r.dev(xs[me]), r.dev(nbytes=xs[me].nbytes)
            r.run("ncclAllReduce", nc.ncclAllReduce(s, d, count, code, op, r.comm, r.stream))
            calls += 1
            _check(r.host(d, count, code), _reference(xs, op, code), code, f"allreduce {DTYPES[code]} op {op}")
            r.free()
    # in place
    x = [_inputs(k, 64, 7, 2) for k in range(n)]
    b = r.dev(x[me])
    r.run("ncclAllReduce", nc.ncclAllReduce(b, b, 64, 7, SUM, r.comm, r.stream))
    calls += 1
    _check(r.host(b, 64, 7), _reference(x, SUM, 7), 7, "allreduce in place")
    r.free()
    # broadcast from every root
    for code in (0, 7, 9):
        for root in range(n):
            xs = [_inputs(k, 33, code, 3) for k in range(n)]
            s, d = r.dev(xs[me]), r.dev(nbytes=xs[me].nbytes)
            r.run("ncclBroadcast", nc.ncclBroadcast(s, d, 33, code, root, r.comm, r.stream))
            _check(r.host(d, 33, code), xs[root], code, f"broadcast root {root}")
            r.free()
    # reduce to the last rank (recv ignored elsewhere: pass NULL)
    root = n - 1
    for code, op in ((2, SUM), (8, MAX), (6, AVG), (3, PROD), (9, MIN)):
        xs = [_inputs(k, 41, code, 4) for k in range(n)]
        s = r.dev(xs[me])
        d = r.dev(nbytes=xs[me].nbytes) if me == root else None
        r.run("ncclReduce", nc.ncclReduce(s, d, 41, code, op, root, r.comm, r.stream))
        if me == root:
            _check(r.host(d, 41, code), _reference(xs, op, code), code, f"reduce {DTYPES[code]}")
        r.free()
    # all_gather, out of place and in place
    for code in (1, 7, 9):
        xs = [_inputs(k, 29, code, 5) for k in range(n)]
        s, d = r.dev(xs[me]), r.dev(nbytes=xs[me].nbytes * n)
        r.run("ncclAllGather", nc.ncclAllGather(s, d, 29, code, r.comm, r.stream))
        _check(r.host(d, 29 * n, code), np.concatenate(xs), code, "allgather")
        r.free()
    xs = [_inputs(k, 16, 4, 6) for k in range(n)]
    d = r.dev(np.concatenate([xs[me] if k == me else np.zeros(16, np.int64) for k in range(n)]))
    r.run("ncclAllGather", nc.ncclAllGather(c_void_p(d.value + me * 16 * 8), d, 16, 4, r.comm, r.stream))
    _check(r.host(d, 16 * n, 4), np.concatenate(xs), 4, "allgather in place")
    r.free()
    # reduce_scatter, out of place and in place
    for code, op in ((4, SUM), (7, PROD), (6, MIN), (0, AVG), (5, MAX)):
        xs = [_inputs(k, 19 * n, code, 7) for k in range(n)]
        s, d = r.dev(xs[me]), r.dev(nbytes=19 * xs[me].itemsize)
        r.run("ncclReduceScatter", nc.ncclReduceScatter(s, d, 19, code, op, r.comm, r.stream))
        want = _reference(xs, op, code)[me * 19 : (me + 1) * 19]
        _check(r.host(d, 19, code), want, code, f"reducescatter {DTYPES[code]} op {op}")
        r.free()
    xs = [_inputs(k, 8 * n, 7, 8) for k in range(n)]
    b = r.dev(xs[me])
    r.run("ncclReduceScatter", nc.ncclReduceScatter(b, c_void_p(b.value + me * 8 * 4), 8, 7, SUM, r.comm, r.stream))
    _check(r.host(b, 8, 7, offset=me * 8), _reference(xs, SUM, 7)[me * 8 : (me + 1) * 8], 7, "reducescatter in place")
    r.free()
    # count 0 is a no-op
    r.run("ncclAllReduce", nc.ncclAllReduce(None, None, 0, 7, SUM, r.comm, r.stream))
    calls += 1
    # two streams: call order on the comm is execution order on every rank
    s2 = c_void_p()
    r.ck(r.cu.cudaStreamCreate(byref(s2)))
    xa = [_inputs(k, 50, 2, 9) for k in range(n)]
    a, ga = r.dev(xa[me]), r.dev(nbytes=50 * 4 * n)
    r.ck(nc.ncclAllReduce(a, a, 50, 2, SUM, r.comm, s2))
    calls += 1
    r.ck(nc.ncclAllGather(a, ga, 50, 2, r.comm, r.stream))
    r.ck(r.cu.cudaStreamSynchronize(s2))
    assert r.sync() == 0
    _check(r.host(ga, 50 * n, 2), np.tile(_reference(xa, SUM, 2), n), 2, "two streams")
    r.free()
    r.ck(r.cu.cudaStreamDestroy(s2))

    # point to point: a ring inside a group, recv posted first, larger than the ring buffer
    nxt, prv = (me + 1) % n, (me - 1) % n
    for order in ("recv-first", "send-first"):
        count = 50_000 if big else 1000
        x = _inputs(me, count, 7, 10)
        s, d = r.dev(x), r.dev(nbytes=x.nbytes)
        r.ck(nc.ncclGroupStart())
        if order == "recv-first":
            r.ck(nc.ncclRecv(d, count, 7, prv, r.comm, r.stream))
            r.ck(nc.ncclSend(s, count, 7, nxt, r.comm, r.stream))
        else:
            r.ck(nc.ncclSend(s, count, 7, nxt, r.comm, r.stream))
            r.ck(nc.ncclRecv(d, count, 7, prv, r.comm, r.stream))
        r.run("ncclGroupEnd", nc.ncclGroupEnd())
        _check(r.host(d, count, 7), _inputs(prv, count, 7, 10), 7, f"ring {order}")
        r.free()
    # all-to-all as a group of sends and receives (self included), plus a collective
    xs = [_inputs(k, 12 * n, 2, 11) for k in range(n)]
    s, d = r.dev(xs[me]), r.dev(nbytes=xs[me].nbytes)
    ar = r.dev(xs[me])
    r.ck(nc.ncclGroupStart())
    r.ck(nc.ncclAllReduce(ar, ar, 12 * n, 2, MAX, r.comm, r.stream))
    calls += 1
    for k in range(n):
        r.ck(nc.ncclSend(c_void_p(s.value + k * 48), 12, 2, k, r.comm, r.stream))
    for k in reversed(range(n)):
        r.ck(nc.ncclRecv(c_void_p(d.value + k * 48), 12, 2, k, r.comm, r.stream))
    r.run("ncclGroupEnd", nc.ncclGroupEnd())
    want = np.concatenate([xs[k][me * 12 : (me + 1) * 12] for k in range(n)])
    _check(r.host(d, 12 * n, 2), want, 2, "alltoall")
    _check(r.host(ar, 12 * n, 2), _reference(xs, MAX, 2), 2, "allreduce in group")
    r.free()
    # ungrouped send then recv of a small message (fits the ring: no deadlock)
    x = _inputs(me, 10, 8, 12)
    s, d = r.dev(x), r.dev(nbytes=x.nbytes)
    r.ck(nc.ncclSend(s, 10, 8, nxt, r.comm, r.stream))
    r.run("ncclRecv", nc.ncclRecv(d, 10, 8, prv, r.comm, r.stream))
    _check(r.host(d, 10, 8), _inputs(prv, 10, 8, 12), 8, "send/recv")
    r.free()

    if big:  # several chunks per call (the id was made with a 4 KiB chunk)
        xs = [_inputs(k, 40_000, 7, 13) for k in range(n)]
        s, d = r.dev(xs[me]), r.dev(nbytes=xs[me].nbytes)
        r.run("ncclAllReduce", nc.ncclAllReduce(s, d, 40_000, 7, SUM, r.comm, r.stream))
        calls += 1
        _check(r.host(d, 40_000, 7), _reference(xs, SUM, 7), 7, "big allreduce")
        r.free()
        xs = [_inputs(k, 3000 * n, 2, 14) for k in range(n)]
        s, d = r.dev(xs[me]), r.dev(nbytes=3000 * 4)
        r.run("ncclReduceScatter", nc.ncclReduceScatter(s, d, 3000, 2, SUM, r.comm, r.stream))
        _check(r.host(d, 3000, 2), _reference(xs, SUM, 2)[me * 3000 : (me + 1) * 3000], 2, "big reducescatter")
        r.free()
        xs = [_inputs(k, 3000, 8, 15) for k in range(n)]
        s, d = r.dev(xs[me]), r.dev(nbytes=3000 * 8 * n)
        r.run("ncclAllGather", nc.ncclAllGather(s, d, 3000, 8, r.comm, r.stream))
        _check(r.host(d, 3000 * n, 8), np.concatenate(xs), 8, "big allgather")
        r.free()
        xs = [_inputs(k, 5000, 6, 16) for k in range(n)]
        s, d = r.dev(xs[me]), r.dev(nbytes=xs[me].nbytes)
        r.run("ncclBroadcast", nc.ncclBroadcast(s, d, 5000, 6, n - 1, r.comm, r.stream))
        _check(r.host(d, 5000, 6), xs[n - 1], 6, "big broadcast")
        r.free()
    assert r.nc.uniccl_emu_calls(b"ncclAllReduce") == calls, "call counter"


def _worker(argv):
    mode, rank, nranks, idhex = argv[0], int(argv[1]), int(argv[2]), argv[3]
    r = _Rank(rank, nranks, idhex)
    t0 = time.monotonic()
    rc = r.init()
    if mode == "init-timeout":
        print(json.dumps({"rc": rc, "elapsed": time.monotonic() - t0, "shm": _shm_name(r.uid)}))
        return
    r.ck(rc, "ncclCommInitRank")
    out = {"rank": rank}
    v = c_int()
    r.ck(r.nc.ncclCommCount(r.comm, byref(v)))
    assert v.value == nranks
    r.ck(r.nc.ncclCommUserRank(r.comm, byref(v)))
    assert v.value == rank
    if mode in ("coll", "coll-big"):
        _coll_cases(r, mode == "coll-big")
    elif mode == "dead":  # rank 1 vanishes; rank 0 must fail, not hang
        if rank == 1:
            os._exit(0)
        s = r.dev(nbytes=64)
        t0 = time.monotonic()
        r.ck(r.nc.ncclAllReduce(s, s, 16, 7, SUM, r.comm, r.stream))
        out["async"] = r.sync()
        out["elapsed"] = time.monotonic() - t0
        out["again"] = r.nc.ncclAllReduce(s, s, 16, 7, SUM, r.comm, r.stream)
    elif mode == "abort":  # rank 1 aborts while rank 0 waits for it
        s = r.dev(nbytes=64)
        if rank == 1:
            time.sleep(0.3)
            r.ck(r.nc.ncclCommAbort(r.comm))
        else:
            t0 = time.monotonic()
            r.ck(r.nc.ncclAllReduce(s, s, 16, 7, SUM, r.comm, r.stream))
            out["async"] = r.sync()
            out["elapsed"] = time.monotonic() - t0
    elif mode == "mismatch":  # ranks disagree on the count
        count = 10 * (rank + 1)
        s = r.dev(nbytes=count * 4)
        r.ck(r.nc.ncclAllReduce(s, s, count, 7, SUM, r.comm, r.stream))
        out["async"] = r.sync()
    if mode != "abort" or rank == 0:
        r.ck(r.nc.ncclCommDestroy(r.comm), "ncclCommDestroy")
    print(json.dumps(out))


# ================================================================== harness
if __name__ == "__main__":  # rank worker: skip importing pytest
    _worker(sys.argv[1:])
    sys.exit(0)

import _emulation  # noqa: E402
import pytest  # noqa: E402


@pytest.fixture(scope="module", params=["nvidia", "iluvatar"])
def emu(request):
    e = _emulation.load(_emulation.require(request.param)["kind"])
    e.clear()
    yield e
    e.clear()


@pytest.fixture(scope="module")
def nv():
    e = _emulation.load(_emulation.require("nvidia")["kind"])
    e.clear()
    yield e
    e.clear()


@pytest.fixture(autouse=True)
def _clear_rules():
    yield
    for e in _emulation._loaded.values():
        e.cudart.uniccl_emu_fail(None, 0, 0, 0)


def _py(info, code, timeout=20, **env):
    """Run a short Python snippet with this emulation's libraries as `cu`/`nc`."""
    prelude = (
        "import ctypes, json, sys\n"
        f"sys.path.insert(0, {str(HERE.parent)!r})\n"
        "from _emulation import declare\n"
        f"cu = ctypes.CDLL({info['cudart']!r}); nc = ctypes.CDLL({info['nccl']!r}); declare(cu, nc)\n"
        "from ctypes import byref, c_int, c_void_p, c_size_t\n"
    )
    r = subprocess.run(
        [sys.executable, "-c", prelude + code],
        env=_emulation.env(info, **env),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


def _ranks(info, nranks, mode, launch=None, timeout=40, chunk=None, p2p=None, **env):
    """Run MODE on ranks `launch` (default all) of an nranks comm; return their JSON lines."""
    saved = {k: os.environ.get(k) for k in ("UNICCL_EMU_NCCL_CHUNK", "UNICCL_EMU_NCCL_P2P")}
    try:  # the id carries the slot and ring sizes, read when it is made
        for k, v in (("UNICCL_EMU_NCCL_CHUNK", chunk), ("UNICCL_EMU_NCCL_P2P", p2p)):
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = str(v)
        uid = ncclUniqueId()
        assert _emulation.load(info["kind"]).nccl.ncclGetUniqueId(byref(uid)) == 0
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    e = _emulation.env(info, EMU_CUDART=info["cudart"], EMU_NCCL=info["nccl"], **env)
    procs = [
        subprocess.Popen(
            [sys.executable, str(HERE), mode, str(k), str(nranks), bytes(uid).hex()],
            env=e,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for k in (range(nranks) if launch is None else launch)
    ]
    deadline = time.monotonic() + timeout
    outs = []
    try:
        for p in procs:
            out, err = p.communicate(timeout=max(0.1, deadline - time.monotonic()))
            outs.append((p.returncode, out, err))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    for rc, _out, err in outs:
        assert rc == 0, err[-3000:]
    return [json.loads(out.strip().splitlines()[-1]) if out.strip() else {} for _, out, _ in outs]


# ============================================================ build, layout
def test_build_layout_and_cache():
    for kind, files in (
        (
            "nvidia",
            ["cuda/lib64/libcudart.so.12", "cuda/lib64/libcudart.so", "nccl/lib/libnccl.so.2", "nccl/lib/libnccl.so"],
        ),
        (
            "iluvatar",
            [
                "corex/lib64/libcudart.so.10.2",
                "corex/lib64/libcudart.so",
                "corex/lib64/libnccl.so.2",
                "corex/lib64/libnccl.so",
            ],
        ),
    ):
        info = _emulation.require(kind)
        out = Path(info["out"])
        for f in files:
            assert (out / f).exists(), f
        assert Path(info["root"]).name == ("cuda" if kind == "nvidia" else "corex")
        mtime = Path(info["cudart"]).stat().st_mtime_ns
        assert _emulation.build(kind) == info
        assert Path(info["cudart"]).stat().st_mtime_ns == mtime  # cached, not rebuilt
    e = _emulation.env(info)
    assert e["COREX_HOME"] == info["root"] and e["LD_LIBRARY_PATH"].startswith(info["cudart_dir"])
    with pytest.raises(ValueError):
        _emulation.build("ascend")  # no such emulation


@pytest.mark.parametrize(
    "kind,rt,lib,home,device",
    [
        ("metax", "mc", "maca/lib/libmcruntime.so", "MACA_PATH", "MetaX emulated device 1"),
        ("moore", "musa", "musa/lib/libmusart.so", "MUSA_HOME", "Moore Threads emulated device 1"),
    ],
)
def test_renamed_vendor_builds(kind, rt, lib, home, device):
    """metax/moore: the same sources, every cuda*/nccl* export renamed to the vendor's prefixes
    (mccl* for both collective libraries); the names counted, injected and reported follow."""
    info = _emulation.require(kind)
    out = Path(info["out"])
    assert info["cudart"] == str(out / lib) and info["nccl"] == str(out / lib).replace(Path(lib).name, "libmccl.so")
    assert info["home_env"] == home and info["lib_dirs"] == [str(Path(info["cudart"]).parent)]
    assert _emulation.env(info)[home] == info["root"]
    e = _emulation.load(kind)
    for name in list(_emulation.CUDART_SIGNATURES) + ["cudaGetErrorName", "cudaGetErrorString"]:
        assert not hasattr(e.cudart, name), name
        # MACA and MUSA have no cudaGetDeviceProperties_v2 counterpart
        assert hasattr(e.cudart, rt + name[4:]) == (name != "cudaGetDeviceProperties_v2"), name
    for name in _emulation.NCCL_SIGNATURES:
        assert not hasattr(e.nccl, name) and hasattr(e.nccl, "mccl" + name[4:]), name
    cu = e.cudart
    assert getattr(cu, rt + "GetErrorName")(700) == f"{rt}ErrorIllegalAddress".encode()
    prop = ctypes.create_string_buffer(4096)
    assert getattr(cu, rt + "GetDeviceProperties")(prop, 1) == 0 and prop.value == device.encode()
    e.clear()
    try:
        e.fail(rt + "Malloc", 2, 0, 1)
        p = c_void_p()
        assert getattr(cu, rt + "Malloc")(byref(p), 64) == 2
        assert getattr(cu, rt + "Malloc")(byref(p), 64) == 0 and getattr(cu, rt + "Free")(p) == 0
        assert e.calls(rt + "Malloc") == 2 and e.calls("cudaMalloc") == 0
        v = c_int()
        assert e.nccl.mcclGetVersion(byref(v)) == 0 and v.value == info["nccl_version"]
        assert e.calls("mcclGetVersion") == 1  # the collective library counts in its own runtime
    finally:
        e.clear()


def test_exports(emu):
    for name in list(_emulation.CUDART_SIGNATURES) + ["cudaGetErrorName", "cudaGetErrorString", "uniccl_emu_fail"]:
        if name == "cudaGetDeviceProperties_v2":
            # CUDA 12 added the _v2 entry point; CoreX's CUDA-10.2-era runtime has none
            assert hasattr(emu.cudart, name) == (emu.info["kind"] == "nvidia")
        else:
            assert hasattr(emu.cudart, name), name
    for name in list(_emulation.NCCL_SIGNATURES) + ["ncclGetErrorString", "ncclGetLastError", "uniccl_emu_calls"]:
        assert hasattr(emu.nccl, name), name


# =================================================================== device
def test_device_queries(emu):
    cu, kind = emu.cudart, emu.info["kind"]
    n, d, v = c_int(), c_int(), c_int()
    assert cu.cudaGetDeviceCount(byref(n)) == OK and n.value == 2
    assert cu.cudaSetDevice(1) == OK and cu.cudaGetDevice(byref(d)) == OK and d.value == 1
    assert cu.cudaSetDevice(2) == INVALID_DEVICE
    assert cu.cudaGetLastError() == INVALID_DEVICE and cu.cudaGetLastError() == OK
    assert cu.cudaSetDevice(0) == OK
    assert cu.cudaRuntimeGetVersion(byref(v)) == OK and v.value == emu.info["runtime_version"]
    assert cu.cudaDriverGetVersion(byref(v)) == OK and v.value >= emu.info["runtime_version"]
    assert cu.cudaGetErrorName(700) == b"cudaErrorIllegalAddress"
    assert cu.cudaGetErrorString(2) == b"out of memory"
    assert cu.cudaGetErrorName(12345) == b"unrecognized error code"
    prop = ctypes.create_string_buffer(4096)
    get_props = getattr(cu, "cudaGetDeviceProperties_v2", cu.cudaGetDeviceProperties)
    assert get_props(prop, 1) == OK
    name = prop.raw[:256].split(b"\0")[0].decode()
    assert name == ("uniccl emulated device 1" if kind == "nvidia" else "Iluvatar emulated device 1")
    assert c_size_t.from_buffer(prop, 288).value == 1 << 30
    assert cu.cudaGetDeviceProperties(prop, 5) == INVALID_DEVICE
    assert cu.cudaDeviceGetAttribute(byref(v), 10, 0) == OK and v.value == 32  # warp size
    assert cu.cudaDeviceGetAttribute(byref(v), 75, 0) == OK and v.value >= 7  # cc major
    assert cu.cudaDeviceGetAttribute(byref(v), 9999, 0) == INVALID_VALUE
    free, total = c_size_t(), c_size_t()
    assert cu.cudaMemGetInfo(byref(free), byref(total)) == OK
    assert total.value == 1 << 30 and 0 < free.value <= total.value
    assert cu.cudaDeviceSynchronize() == OK


def test_environment(nv):
    info = nv.info
    code = (
        "n = c_int(); rc = cu.cudaGetDeviceCount(byref(n)); p = c_void_p()\n"
        "m = [cu.cudaMalloc(byref(p), s) for s in (1 << 20, 2 << 20)]\n"
        "v = c_int(); cu.cudaDriverGetVersion(byref(v))\n"
        "print(json.dumps({'rc': rc, 'n': n.value, 'malloc': m, 'driver': v.value}))"
    )
    assert _py(info, code, UNICCL_EMU_DEVICES=0)["rc"] == NO_DEVICE
    r = _py(info, code, UNICCL_EMU_DEVICES=3, UNICCL_EMU_DEVICE_MEMORY="2M")
    assert (r["rc"], r["n"], r["malloc"]) == (OK, 3, [OK, NO_MEMORY])
    r = _py(info, code, UNICCL_EMU_DRIVER_VERSION=11080)
    assert (r["rc"], r["driver"]) == (INSUFFICIENT_DRIVER, 11080)
    r = _py(
        info,
        "p = c_void_p(); print(json.dumps([cu.cudaMalloc(byref(p), 8) for _ in range(4)]"
        " + [nc.uniccl_emu_calls(b'cudaMalloc')]))",
        UNICCL_EMU_FAIL="cudaMalloc=2@1:2;ncclGetVersion=3",
    )
    assert r == [OK, NO_MEMORY, NO_MEMORY, OK, 4]


# =================================================================== memory
def test_alloc_free_limits(emu):
    cu = emu.cudart
    free0, total = c_size_t(), c_size_t()
    cu.cudaMemGetInfo(byref(free0), byref(total))
    p, q = c_void_p(), c_void_p()
    assert cu.cudaMalloc(byref(p), 1000) == OK and p.value % 256 == 0
    free1 = c_size_t()
    cu.cudaMemGetInfo(byref(free1), byref(total))
    assert free0.value - free1.value == 1024
    assert cu.cudaMalloc(byref(q), 2 << 30) == NO_MEMORY and not q.value
    assert cu.cudaMalloc(byref(q), 0) == OK and q.value is None
    assert cu.cudaFree(c_void_p(p.value + 8)) == INVALID_VALUE  # not the base
    assert cu.cudaFreeHost(p) == INVALID_VALUE  # wrong kind of memory
    assert cu.cudaFree(p) == OK and cu.cudaFree(p) == INVALID_VALUE  # double free
    assert cu.cudaFree(None) == OK
    cu.cudaMemGetInfo(byref(free1), byref(total))
    assert free1.value == free0.value
    h = c_void_p()
    assert cu.cudaMallocHost(byref(h), 100) == OK and h.value % 4096 == 0
    assert cu.cudaFree(h) == INVALID_VALUE and cu.cudaFreeHost(h) == OK
    assert cu.cudaHostAlloc(byref(h), 100, 0) == OK and cu.cudaFreeHost(h) == OK
    # a device's limit is per device
    assert cu.cudaSetDevice(1) == OK
    assert cu.cudaMalloc(byref(p), 768 << 20) == OK
    assert cu.cudaMalloc(byref(q), 512 << 20) == NO_MEMORY
    assert cu.cudaSetDevice(0) == OK and cu.cudaMalloc(byref(q), 512 << 20) == OK
    assert cu.cudaFree(p) == OK and cu.cudaFree(q) == OK


class _Attrs(ctypes.Structure):
    _fields_ = [("type", c_int), ("device", c_int), ("devicePointer", c_void_p), ("hostPointer", c_void_p)]


def test_pointer_attributes(emu):
    import numpy as np

    cu = emu.cudart
    p, h, a = c_void_p(), c_void_p(), _Attrs()
    cu.cudaSetDevice(1)
    assert cu.cudaMalloc(byref(p), 4096) == OK
    cu.cudaSetDevice(0)
    assert cu.cudaMallocHost(byref(h), 64) == OK
    assert cu.cudaPointerGetAttributes(byref(a), c_void_p(p.value + 100)) == OK
    assert (a.type, a.device, a.devicePointer, a.hostPointer) == (2, 1, p.value + 100, None)
    assert cu.cudaPointerGetAttributes(byref(a), h) == OK
    assert (a.type, a.device, a.devicePointer, a.hostPointer) == (1, 0, h.value, h.value)
    x = np.zeros(4)
    assert cu.cudaPointerGetAttributes(byref(a), c_void_p(x.ctypes.data)) == OK
    assert (a.type, a.devicePointer) == (0, None)
    assert cu.cudaPointerGetAttributes(byref(a), None) == INVALID_VALUE
    cu.cudaFree(p)
    cu.cudaFreeHost(h)
    assert cu.cudaPointerGetAttributes(byref(a), p) == OK and a.type == 0  # freed


def test_copies_all_kinds(emu):
    import numpy as np

    cu = emu.cudart
    x = np.arange(256, dtype=np.float32)
    y = np.zeros_like(x)
    n = x.nbytes
    a, b, h = c_void_p(), c_void_p(), c_void_p()
    cu.cudaMalloc(byref(a), n)
    cu.cudaMalloc(byref(b), n)
    cu.cudaMallocHost(byref(h), n)
    X, Y = c_void_p(x.ctypes.data), c_void_p(y.ctypes.data)
    assert cu.cudaMemcpy(a, X, n, H2D) == OK
    assert cu.cudaMemcpy(b, a, n, D2D) == OK
    assert cu.cudaMemcpy(h, b, n, D2H) == OK  # pinned host counts as host
    assert cu.cudaMemcpy(Y, h, n, H2H) == OK
    np.testing.assert_array_equal(y, x)
    y[:] = 0
    assert cu.cudaMemcpy(b, X, n, DEFAULT) == OK and cu.cudaMemcpy(Y, b, n, DEFAULT) == OK
    np.testing.assert_array_equal(y, x)
    # wrong kinds, overruns, freed memory
    assert cu.cudaMemcpy(a, b, n, H2D) == INVALID_VALUE  # src is device memory
    assert cu.cudaMemcpy(Y, X, n, H2D) == INVALID_VALUE  # dst is not device memory
    assert cu.cudaMemcpy(a, b, n, D2H) == INVALID_VALUE
    assert cu.cudaMemcpy(Y, X, n, D2D) == INVALID_VALUE
    assert cu.cudaMemcpy(Y, a, n, H2H) == INVALID_VALUE
    assert cu.cudaMemcpy(a, X, n, 7) == INVALID_DIRECTION
    assert cu.cudaMemcpy(c_void_p(a.value + 4), X, n, H2D) == INVALID_VALUE  # runs past the end
    assert cu.cudaMemcpyAsync(Y, c_void_p(a.value + 1020), 8, D2H, None) == INVALID_VALUE
    assert cu.cudaMemcpy(a, None, n, H2D) == INVALID_VALUE
    assert cu.cudaMemcpy(c_void_p(a.value - 64), X, 128, H2H) == INVALID_VALUE  # runs into device memory
    assert cu.cudaMemcpy(a, X, 0, H2D) == OK
    assert cu.cudaGetLastError() == INVALID_VALUE
    # memset
    assert cu.cudaMemset(a, 0x3F, n) == OK and cu.cudaMemcpy(Y, a, n, D2H) == OK
    assert (y.view(np.uint8) == 0x3F).all()
    assert cu.cudaMemsetAsync(a, 0, 16, None) == OK and cu.cudaStreamSynchronize(None) == OK
    assert cu.cudaMemset(X, 0, 16) == INVALID_VALUE  # not device memory
    assert cu.cudaMemset(c_void_p(a.value + 1000), 0, 100) == INVALID_VALUE
    cu.cudaFree(a)
    assert cu.cudaMemcpy(Y, a, n, D2H) == INVALID_VALUE  # freed
    cu.cudaFree(b)
    cu.cudaFreeHost(h)


# =================================================================== streams
def test_stream_order_and_host_funcs(emu):
    import threading

    import numpy as np

    cu = emu.cudart
    s = c_void_p()
    assert cu.cudaStreamCreate(byref(s)) == OK
    log, gate = [], threading.Event()

    def slow(_):
        time.sleep(0.1)
        log.append("slow")

    cbs = [HOSTFN(slow), HOSTFN(lambda _: log.append("after")), HOSTFN(lambda _: gate.wait(10))]
    n = 1 << 20
    x = np.random.default_rng(0).random(n // 8)
    y = np.zeros_like(x)
    a, b = c_void_p(), c_void_p()
    cu.cudaMalloc(byref(a), n)
    cu.cudaMalloc(byref(b), n)
    assert cu.cudaLaunchHostFunc(s, cbs[2], None) == OK
    assert cu.cudaLaunchHostFunc(s, cbs[0], None) == OK
    assert cu.cudaMemcpyAsync(a, c_void_p(x.ctypes.data), n, H2D, s) == OK
    assert cu.cudaMemcpyAsync(b, a, n, D2D, s) == OK
    assert cu.cudaMemcpyAsync(c_void_p(y.ctypes.data), b, n, D2H, s) == OK
    assert cu.cudaLaunchHostFunc(s, cbs[1], None) == OK
    assert cu.cudaStreamQuery(s) == NOT_READY
    assert not y.any()  # nothing ran yet: the first host function holds the stream
    gate.set()
    assert cu.cudaStreamSynchronize(s) == OK and cu.cudaStreamQuery(s) == OK
    assert log == ["slow", "after"]
    np.testing.assert_array_equal(y, x)
    # legacy default stream: a synchronous copy waits for prior work on blocking streams
    cu.cudaLaunchHostFunc(s, cbs[0], None)
    assert cu.cudaMemsetAsync(a, 7, n, s) == OK
    assert cu.cudaMemcpy(c_void_p(y.ctypes.data), a, n, D2H) == OK
    assert (y.view(np.uint8) == 7).all()
    # destroy waits for pending work
    log.clear()
    cu.cudaLaunchHostFunc(s, cbs[0], None)
    cu.cudaLaunchHostFunc(s, cbs[1], None)
    assert cu.cudaStreamDestroy(s) == OK and log == ["slow", "after"]
    assert cu.cudaStreamSynchronize(s) == INVALID_HANDLE
    assert cu.cudaStreamDestroy(None) == INVALID_HANDLE
    assert cu.cudaLaunchHostFunc(None, HOSTFN(), None) == INVALID_VALUE  # NULL function
    ns = c_void_p()
    assert cu.cudaStreamCreateWithFlags(byref(ns), 1) == OK and cu.cudaStreamDestroy(ns) == OK
    assert cu.cudaStreamCreateWithFlags(byref(ns), 8) == INVALID_VALUE
    cu.cudaFree(a)
    cu.cudaFree(b)


def test_events(emu):
    cu = emu.cudart
    s, e0, e1, nt = c_void_p(), c_void_p(), c_void_p(), c_void_p()
    cu.cudaStreamCreate(byref(s))
    assert cu.cudaEventCreate(byref(e0)) == OK and cu.cudaEventCreate(byref(e1)) == OK
    assert cu.cudaEventCreateWithFlags(byref(nt), 2) == OK  # cudaEventDisableTiming
    ms = c_float()
    assert cu.cudaEventQuery(e0) == OK  # never recorded
    assert cu.cudaEventElapsedTime(byref(ms), e0, e1) == INVALID_HANDLE
    import threading

    gate = threading.Event()
    cb = HOSTFN(lambda _: time.sleep(0.1))
    hold = HOSTFN(lambda _: gate.wait(10))
    assert cu.cudaEventRecord(e0, s) == OK
    cu.cudaLaunchHostFunc(s, cb, None)
    cu.cudaLaunchHostFunc(s, hold, None)
    assert cu.cudaEventRecord(e1, s) == OK and cu.cudaEventRecord(nt, s) == OK
    assert cu.cudaEventQuery(e1) == NOT_READY
    assert cu.cudaEventElapsedTime(byref(ms), e0, e1) == NOT_READY
    gate.set()
    assert cu.cudaEventSynchronize(e1) == OK and cu.cudaEventQuery(e1) == OK
    assert cu.cudaEventElapsedTime(byref(ms), e0, e1) == OK and 90 <= ms.value < 2000
    assert cu.cudaEventElapsedTime(byref(ms), e0, nt) == INVALID_HANDLE
    for e in (e0, e1, nt):
        assert cu.cudaEventDestroy(e) == OK
    assert cu.cudaEventQuery(e0) == INVALID_HANDLE
    # destroying an event whose record is still queued is fine
    cu.cudaEventCreate(byref(e0))
    cu.cudaLaunchHostFunc(s, cb, None)
    cu.cudaEventRecord(e0, s)
    assert cu.cudaEventDestroy(e0) == OK
    assert cu.cudaStreamDestroy(s) == OK


def test_stream_wait_event(emu):
    cu = emu.cudart
    a, b, ev = c_void_p(), c_void_p(), c_void_p()
    cu.cudaStreamCreate(byref(a))
    cu.cudaStreamCreateWithFlags(byref(b), 1)
    cu.cudaEventCreateWithFlags(byref(ev), 2)
    log = []
    cbs = [HOSTFN(lambda _: (time.sleep(0.15), log.append("a"))), HOSTFN(lambda _: log.append("b"))]
    cu.cudaLaunchHostFunc(a, cbs[0], None)
    assert cu.cudaEventRecord(ev, a) == OK
    rc = cu.cudaStreamWaitEvent(b, ev, 0)
    if emu.info["kind"] == "iluvatar":
        assert rc == NOT_SUPPORTED  # CoreX: the plugin must order streams another way
        assert cu.cudaGetErrorName(rc) == b"cudaErrorNotSupported"
    else:
        assert rc == OK
        assert cu.cudaStreamWaitEvent(b, ev, 4) == INVALID_VALUE
    cu.cudaLaunchHostFunc(b, cbs[1], None)
    cu.cudaStreamSynchronize(b)
    if emu.info["kind"] == "nvidia":
        assert log == ["a", "b"]
    cu.cudaStreamSynchronize(a)
    for s in (a, b):
        assert cu.cudaStreamDestroy(s) == OK
    assert cu.cudaEventDestroy(ev) == OK


# ========================================================= error injection
def test_injection_and_counters(emu):
    import numpy as np

    cu, nc = emu.cudart, emu.nccl
    emu.clear()
    x = np.zeros(16, np.float32)
    p = c_void_p()
    cu.cudaMalloc(byref(p), x.nbytes)
    X = c_void_p(x.ctypes.data)
    emu.fail("cudaMemcpyAsync", ILLEGAL_ADDRESS, after=1, times=2)
    rcs = [cu.cudaMemcpyAsync(p, X, x.nbytes, H2D, None) for _ in range(4)]
    assert rcs == [OK, ILLEGAL_ADDRESS, ILLEGAL_ADDRESS, OK]
    assert emu.calls("cudaMemcpyAsync") == 4 and emu.calls("cudaMemcpy") == 0
    assert nc.uniccl_emu_calls(b"cudaMemcpyAsync") == 4  # one table behind both libraries
    assert cu.cudaGetLastError() == ILLEGAL_ADDRESS and cu.cudaGetLastError() == OK
    emu.fail("cudaStreamSynchronize", 999)
    assert [cu.cudaStreamSynchronize(None) for _ in range(3)] == [999] * 3
    nc.uniccl_emu_fail(b"ncclGetVersion", nINVALID_USAGE, 0, 1)  # through libnccl's export
    v = c_int()
    assert nc.ncclGetVersion(byref(v)) == nINVALID_USAGE
    assert nc.ncclGetVersion(byref(v)) == OK and v.value == emu.info["nccl_version"]
    assert b"injected" in nc.ncclGetLastError(None)
    emu.clear()
    assert cu.cudaStreamSynchronize(None) == OK and emu.calls("cudaMemcpyAsync") == 0
    assert nc.ncclGetErrorString(nREMOTE) == b"remote process exited or there was a network error"
    cu.cudaFree(p)


def test_nccl_single_rank_and_arguments(emu):
    import numpy as np

    cu, nc = emu.cudart, emu.nccl
    uid, comm = ncclUniqueId(), c_void_p()
    assert nc.ncclGetUniqueId(byref(uid)) == OK
    assert _shm_name(uid).startswith("/uniccl-emu-")
    assert nc.ncclCommInitRank(byref(comm), 1, uid, 0) == OK
    assert not _shm_exists(_shm_name(uid))  # unlinked once everyone joined
    v = c_int()
    assert nc.ncclCommCuDevice(comm, byref(v)) == OK and v.value == 0
    x = np.arange(8, dtype=np.float32)
    d, s = c_void_p(), c_void_p()
    cu.cudaMalloc(byref(d), x.nbytes)
    cu.cudaStreamCreate(byref(s))
    cu.cudaMemcpy(d, c_void_p(x.ctypes.data), x.nbytes, H2D)
    emu.clear()
    assert nc.ncclAllReduce(d, d, 8, 7, SUM, comm, s) == OK
    assert emu.calls("ncclAllReduce") == 1 and emu.calls("cudaLaunchHostFunc") == 0  # private enqueue
    assert cu.cudaStreamSynchronize(s) == OK
    y = np.zeros_like(x)
    cu.cudaMemcpy(c_void_p(y.ctypes.data), d, x.nbytes, D2H)
    np.testing.assert_array_equal(y, x)
    host = c_void_p(y.ctypes.data)
    bad = {
        "dtype": nc.ncclAllReduce(d, d, 8, 10, SUM, comm, s),
        "op": nc.ncclAllReduce(d, d, 8, 7, 5, comm, s),
        "root": nc.ncclBroadcast(d, d, 8, 7, 1, comm, s),
        "peer": nc.ncclSend(d, 8, 7, -1, comm, s),
        "comm": nc.ncclAllReduce(d, d, 8, 7, SUM, None, s),
        "host buffer": nc.ncclAllReduce(host, d, 8, 7, SUM, comm, s),
        "overrun": nc.ncclAllReduce(d, d, 9, 7, SUM, comm, s),
        "reduce root": nc.ncclReduce(d, d, 8, 7, SUM, 3, comm, s),
    }
    assert all(rc == nINVALID_ARGUMENT for rc in bad.values()), bad
    d1 = c_void_p()
    cu.cudaSetDevice(1)
    cu.cudaMalloc(byref(d1), x.nbytes)
    cu.cudaSetDevice(0)
    assert nc.ncclAllReduce(d1, d1, 8, 7, SUM, comm, s) == nINVALID_ARGUMENT  # comm is on device 0
    cu.cudaFree(d1)
    assert nc.ncclGroupEnd() == nINVALID_USAGE
    assert nc.ncclAllReduce(d, d, 8, 7, SUM, comm, c_void_p(0x1234)) == 1  # bad stream
    emu.fail("ncclAllReduce", nREMOTE, after=1, times=1)
    assert [nc.ncclAllReduce(d, d, 8, 7, SUM, comm, s) for _ in range(3)] == [OK, nREMOTE, OK]
    assert cu.cudaStreamSynchronize(s) == OK
    e = c_int(-1)
    assert nc.ncclCommGetAsyncError(comm, byref(e)) == OK and e.value == OK
    assert nc.ncclCommDestroy(comm) == OK
    assert nc.ncclCommDestroy(comm) == nINVALID_ARGUMENT and nc.ncclCommDestroy(None) == OK
    cu.cudaFree(d)
    cu.cudaStreamDestroy(s)


# ===================================================== NCCL, multi-process
@pytest.mark.parametrize("nranks", [1, 2, 3, 4])
def test_nccl_collectives(nv, nranks):
    # 3 ranks: small slots and rings so every large call is chunked and wraps around
    big = nranks == 3
    outs = _ranks(
        nv.info,
        nranks,
        "coll-big" if big else "coll",
        timeout=60,
        chunk=4096 if big else None,
        p2p=4096 if big else None,
    )
    assert [o["rank"] for o in outs] == list(range(nranks))


def test_nccl_collectives_corex():
    info = _emulation.require("iluvatar")
    outs = _ranks(info, 2, "coll", timeout=60)
    assert len(outs) == 2


def test_nccl_dead_peer():
    info = _emulation.require("nvidia")
    outs = _ranks(info, 2, "dead", timeout=30, UNICCL_EMU_TIMEOUT=20)
    r0 = outs[0]
    assert r0["async"] == nREMOTE and r0["again"] == nREMOTE
    assert r0["elapsed"] < 5  # found dead by its pid, long before the timeout


def test_nccl_abort_releases_peer():
    info = _emulation.require("nvidia")
    r0 = _ranks(info, 2, "abort", timeout=30, UNICCL_EMU_TIMEOUT=20)[0]
    assert r0["async"] == nREMOTE and r0["elapsed"] < 5


def test_nccl_mismatched_calls():
    info = _emulation.require("nvidia")
    outs = _ranks(info, 2, "mismatch", timeout=30, UNICCL_EMU_TIMEOUT=20)
    codes = [o["async"] for o in outs]
    assert nINVALID_USAGE in codes and set(codes) <= {nINVALID_USAGE, nREMOTE}, codes


def test_nccl_init_timeout():
    info = _emulation.require("nvidia")
    out = _ranks(info, 2, "init-timeout", launch=[0], timeout=30, UNICCL_EMU_TIMEOUT=1)[0]
    assert out["rc"] == nSYSTEM and 0.9 <= out["elapsed"] < 5
    assert not _shm_exists(out["shm"])  # the segment of the failed id is gone
