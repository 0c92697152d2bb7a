"""Reduce and scale kernels against independent numpy references, for every
kernel variant this CPU runs."""

import numpy as np
import pytest
from cpu_helpers import FLOATS, HALFS, INTS, NUMPY, addr

from uniccl._errors import InvalidArgument
from uniccl._types import DType, ReduceOp

OPS = [ReduceOp.SUM, ReduceOp.PROD, ReduceOp.MAX, ReduceOp.MIN]
# Odd sizes and non-multiples of every vector width and of the 512-element half block.
SIZES = [0, 1, 7, 33, 513, 4099, 100_003]


def reference_reduce(a, b, dtype, op):
    nd = np.dtype(NUMPY[dtype])
    with np.errstate(all="ignore"):
        if dtype in INTS:
            if op in (ReduceOp.MAX, ReduceOp.MIN):
                return (np.maximum if op == ReduceOp.MAX else np.minimum)(a, b)
            # Exact in a 64-bit type (wrapping mod 2**64 there), then wrap to the width.
            wide = np.uint64 if nd.kind == "u" or nd.itemsize == 8 else np.int64
            x, y = a.astype(wide), b.astype(wide)
            return (x + y if op == ReduceOp.SUM else x * y).astype(nd)
        compute = np.float32 if dtype in HALFS else nd
        x, y = a.astype(compute), b.astype(compute)
        fn = {ReduceOp.SUM: np.add, ReduceOp.PROD: np.multiply, ReduceOp.MAX: np.maximum, ReduceOp.MIN: np.minimum}[op]
        return fn(x, y).astype(nd)


def specials(dtype):
    info = np.finfo(NUMPY[dtype]) if dtype != DType.BFLOAT16 else None
    big = float(info.max) if info else 3.3895313892515355e38
    tiny = float(info.smallest_subnormal) if info else 9.183549615799121e-41
    return [np.nan, np.inf, -np.inf, 0.0, -0.0, big, -big, tiny, -tiny, 1.0, -1.0]


def random_operand(rng, dtype, n):
    nd = np.dtype(NUMPY[dtype])
    if dtype in INTS:
        info = np.iinfo(nd)
        return rng.integers(info.min, info.max, size=n, dtype=nd, endpoint=True)
    values = (rng.standard_normal(n) * 50).astype(nd)
    if n:
        s = np.array(specials(dtype)).astype(nd)
        values[rng.integers(0, n, size=min(n, 2 * len(s)))] = np.resize(s, min(n, 2 * len(s)))
    return values


def assert_same(got, ref):
    """Bit-exact up to NaN payloads: same NaN positions, values and zero signs."""
    if got.dtype.kind in "iu":
        np.testing.assert_array_equal(got, ref)
        return
    g, r = got.astype(np.float64), ref.astype(np.float64)
    nan = np.isnan(r)
    np.testing.assert_array_equal(np.isnan(g), nan)
    np.testing.assert_array_equal(g[~nan], r[~nan])
    np.testing.assert_array_equal(np.signbit(g[~nan]), np.signbit(r[~nan]))


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("op", OPS, ids=lambda o: o.name)
@pytest.mark.parametrize("dtype", list(DType), ids=lambda d: d.name)
def test_reduce_matches_numpy(plugin, variant, dtype, op, n):
    rng = np.random.default_rng([int(dtype), int(op), n])
    a, b = random_operand(rng, dtype, n), random_operand(rng, dtype, n)
    dst = np.zeros(n + 1, NUMPY[dtype])  # one guard element past the end
    plugin.uniccl_reduce(addr(dst), addr(a), addr(b), n, int(dtype), int(op), None)
    assert_same(dst[:n], reference_reduce(a, b, dtype, op))
    assert dst[n] == 0


@pytest.mark.parametrize("in_place", ["a", "b"])
@pytest.mark.parametrize("op", OPS, ids=lambda o: o.name)
@pytest.mark.parametrize("dtype", list(DType), ids=lambda d: d.name)
def test_reduce_in_place(plugin, variant, dtype, op, in_place):
    rng = np.random.default_rng([int(dtype), int(op)])
    a, b = random_operand(rng, dtype, 1003), random_operand(rng, dtype, 1003)
    ref = reference_reduce(a, b, dtype, op)
    dst = a if in_place == "a" else b
    plugin.uniccl_reduce(addr(dst), addr(a), addr(b), a.size, int(dtype), int(op), None)
    assert_same(dst, ref)


@pytest.mark.parametrize(
    "dtype, x, y, op, expected",
    [
        (DType.INT8, 127, 1, ReduceOp.SUM, -128),
        (DType.UINT8, 255, 1, ReduceOp.SUM, 0),
        (DType.INT16, 300, 300, ReduceOp.PROD, 90000 - 65536),
        (DType.UINT16, 65535, 65535, ReduceOp.PROD, 1),
        (DType.INT32, 2**31 - 1, 2, ReduceOp.PROD, -2),
        (DType.UINT32, 2**32 - 1, 2, ReduceOp.SUM, 1),
        (DType.INT64, -(2**63), -1, ReduceOp.SUM, 2**63 - 1),
        (DType.UINT64, 2**64 - 1, 2**64 - 1, ReduceOp.PROD, 1),
        (DType.INT64, -(2**63), -1, ReduceOp.PROD, -(2**63)),
    ],
)
def test_integer_wraparound(plugin, variant, dtype, x, y, op, expected):
    nd = NUMPY[dtype]
    a, b, dst = np.full(37, x, nd), np.full(37, y, nd), np.empty(37, nd)
    plugin.uniccl_reduce(addr(dst), addr(a), addr(b), 37, int(dtype), int(op), None)
    assert dst.tolist() == [expected] * 37


@pytest.mark.parametrize("op", [ReduceOp.MAX, ReduceOp.MIN], ids=lambda o: o.name)
@pytest.mark.parametrize("dtype", FLOATS, ids=lambda d: d.name)
def test_max_min_propagate_nan(plugin, variant, dtype, op):
    nd = NUMPY[dtype]
    a = np.array([np.nan, 1.0, np.nan, -np.inf] * 9, nd)
    b = np.array([1.0, np.nan, np.nan, np.nan] * 9, nd)
    dst = np.zeros_like(a)
    plugin.uniccl_reduce(addr(dst), addr(a), addr(b), a.size, int(dtype), int(op), None)
    assert np.isnan(dst.astype(np.float32)).all()


def reference_scale(src, dtype, divisor):
    nd = np.dtype(NUMPY[dtype])
    if dtype in INTS:  # Python ints: exact, truncating toward zero
        return np.array([abs(v) // divisor * (1 if v >= 0 else -1) for v in src.tolist()], nd)
    compute = np.float32 if dtype in HALFS else nd.type
    with np.errstate(all="ignore"):
        return (src.astype(compute) / compute(divisor)).astype(nd)


@pytest.mark.parametrize("divisor", [1, 3, 7, 1000])
@pytest.mark.parametrize("dtype", list(DType), ids=lambda d: d.name)
def test_scale_matches_reference(plugin, variant, dtype, divisor):
    src = random_operand(np.random.default_rng([int(dtype), divisor]), dtype, 1027)
    dst = np.zeros(1027, NUMPY[dtype])
    plugin.uniccl_scale(addr(dst), addr(src), src.size, int(dtype), divisor, None)
    assert_same(dst, reference_scale(src, dtype, divisor))
    plugin.uniccl_scale(addr(src), addr(src), src.size, int(dtype), divisor, None)  # in place
    assert_same(src, dst)


def test_scale_truncates_negative_integers_toward_zero(plugin, variant):
    src = np.array([-7, 7, -1, -128, 127, -6], np.int8)
    dst = np.empty_like(src)
    plugin.uniccl_scale(addr(dst), addr(src), src.size, int(DType.INT8), 2, None)
    assert dst.tolist() == [-3, 3, 0, -64, 63, -3]
    big = np.array([-(2**63), 2**63 - 1], np.int64)
    plugin.uniccl_scale(addr(big), addr(big), 2, int(DType.INT64), 3, None)
    assert big.tolist() == [-(2**63 // 3), (2**63 - 1) // 3]


@pytest.mark.parametrize(
    "dtype, op",
    [
        (int(DType.FLOAT32), int(ReduceOp.AVG)),
        (int(DType.FLOAT32), 5),
        (int(DType.FLOAT32), -1),
        (12, int(ReduceOp.SUM)),
        (-1, int(ReduceOp.SUM)),
    ],
)
def test_reduce_rejects_unknown_dtype_or_op(plugin, dtype, op):
    a = np.ones(4, np.float32)
    with pytest.raises(InvalidArgument) as info:
        plugin.uniccl_reduce(addr(a), addr(a), addr(a), 4, dtype, op, None)
    assert info.value.argument == ("op" if dtype == int(DType.FLOAT32) else "dtype")
    assert a.tolist() == [1.0] * 4


def test_bad_counts_and_divisors_are_invalid_arguments(plugin):
    a = np.ones(4, np.float32)
    with pytest.raises(InvalidArgument, match="count"):
        plugin.uniccl_reduce(addr(a), addr(a), addr(a), -1, int(DType.FLOAT32), 0, None)
    with pytest.raises(InvalidArgument, match="count"):
        plugin.uniccl_scale(addr(a), addr(a), -1, int(DType.FLOAT32), 2, None)
    for divisor in (0, -2):
        with pytest.raises(InvalidArgument, match="divisor"):
            plugin.uniccl_scale(addr(a), addr(a), 4, int(DType.FLOAT32), divisor, None)
    with pytest.raises(InvalidArgument, match="dtype"):
        plugin.uniccl_scale(addr(a), addr(a), 4, 42, 2, None)


def test_variant_selection(variant):
    from uniccl_cpu import _kernels

    assert _kernels.variant() == variant
    assert _kernels.available()[-1] == "baseline"
    with pytest.raises(InvalidArgument):
        _kernels.select("sse9")
