"""The platform's reduction kernels on its own memory, against numpy (float64 / exact integers)."""

import ml_dtypes
import numpy as np
import pytest
from _platform import DeviceArray

DTYPES = {
    0: np.int8,
    1: np.uint8,
    2: np.int32,
    3: np.uint32,
    4: np.int64,
    5: np.uint64,
    6: np.float16,
    7: np.float32,
    8: np.float64,
    9: ml_dtypes.bfloat16,
    10: np.int16,
    11: np.uint16,
}
OPS = {0: np.add, 1: np.multiply, 2: np.maximum, 3: np.minimum}


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_reduce(backend, dtype, op):
    t = np.dtype(DTYPES[dtype])
    rng = np.random.default_rng(dtype * 10 + op)
    n = 4099
    if t.kind in "iu":
        a, b = (rng.integers(np.iinfo(t).min, np.iinfo(t).max, n, dtype=t, endpoint=True) for _ in range(2))
        expect = OPS[op](a, b)  # numpy wraps like the kernels must
    else:
        a, b = (rng.uniform(-4, 4, n).astype(t) for _ in range(2))
        expect = OPS[op](a.astype(np.float64), b.astype(np.float64)).astype(t)
    da, db, dc = DeviceArray(backend, a), DeviceArray(backend, b), DeviceArray(backend, np.zeros(n, t))
    try:
        backend.reduce(dc.ptr, da.ptr, db.ptr, n, dtype, op, None)
        got = dc.download()
    finally:
        for d in (da, db, dc):
            d.free()
    if t.kind in "iu":
        assert np.array_equal(got, expect)
    else:  # one rounding of the exact result (fp16/bf16 computed in float32)
        assert np.array_equal(got, expect) or np.allclose(
            got.astype(np.float64),
            expect.astype(np.float64),
            rtol=np.finfo(np.float32).eps * 4 if t.itemsize >= 4 else 1e-2,
            atol=0,
        )


@pytest.mark.parametrize("dtype", [2, 4, 7, 8, 6, 9])
def test_scale(backend, dtype):
    t = np.dtype(DTYPES[dtype])
    src = (np.arange(-50, 50) * 7).astype(t)
    ds, dd = DeviceArray(backend, src), DeviceArray(backend, np.zeros_like(src))
    try:
        backend.scale(dd.ptr, ds.ptr, src.size, dtype, 3, None)
        got = dd.download()
    finally:
        ds.free()
        dd.free()
    if t.kind in "iu":
        expect = (src.astype(np.int64) / 3).astype(np.int64).astype(t)  # truncation toward zero
        assert np.array_equal(got, expect)
    else:
        assert np.allclose(got.astype(np.float64), src.astype(np.float64) / 3, rtol=1e-2 if t.itemsize == 2 else 1e-6)
