"""Deterministic test inputs and an independent numpy reference for every collective.

Each rank can rebuild any rank's input from (rank, dtype, op, count, seed), so
every rank computes the expected result locally, in float64 for floating types
and with exact modular int64/uint64 arithmetic for integers (numpy float64
cannot hold every int64).
"""

from __future__ import annotations

import numpy as np

from uniccl._types import DType, numpy_dtype

ALL_DTYPES = [
    DType.INT8,
    DType.UINT8,
    DType.INT16,
    DType.UINT16,
    DType.INT32,
    DType.UINT32,
    DType.INT64,
    DType.UINT64,
    DType.FLOAT16,
    DType.BFLOAT16,
    DType.FLOAT32,
    DType.FLOAT64,
]
OPS = ["sum", "prod", "max", "min", "avg"]
EXACT_LIMIT = 4096  # above this many elements inputs are small integers: exact in every dtype
PERIOD = 183  # ...and repeat with this period, so the reference is computed on one period


def is_float(dt) -> bool:
    return dt in (DType.FLOAT16, DType.BFLOAT16, DType.FLOAT32, DType.FLOAT64)


def make_input(rank: int, dt, op: str, count: int, seed: int) -> np.ndarray:
    npdt = numpy_dtype(dt)
    if count > EXACT_LIMIT:
        # small integers (|sum| <= 4*30, |prod| <= 2**4): exact in bfloat16 too
        idx = np.arange(PERIOD, dtype=np.int64)
        if op == "prod":
            vals = (idx * 7 + rank * 3 + seed) % 3 - 1  # -1, 0, 1
            vals = np.where(vals == 0, 2, vals)
        else:
            vals = (idx * 7 + rank * 13 + seed) % 61 - 30
        if not np.issubdtype(npdt, np.signedinteger) and not is_float(dt):
            vals = np.abs(vals)
        return np.resize(vals.astype(npdt), count)
    rng = np.random.default_rng([seed, rank, int(dt), count, OPS.index(op) if op in OPS else 9])
    if is_float(dt):
        vals = rng.uniform(0.5, 1.5, count) if op == "prod" else rng.uniform(-8, 8, count)
        return vals.astype(npdt)
    info = np.iinfo(npdt)
    # full range: exercises wrap-around for sum and prod
    return rng.integers(info.min, info.max, count, dtype=npdt, endpoint=True)


def _int_wide(x: np.ndarray) -> np.ndarray:
    return x.astype(np.uint64 if np.issubdtype(x.dtype, np.unsignedinteger) else np.int64)


def reduce_ref(inputs: list[np.ndarray], op: str, dt) -> np.ndarray:
    """Expected result as float64 (floats) or as the exact wrapped integer of dtype dt."""
    npdt = numpy_dtype(dt)
    n = len(inputs)
    if is_float(dt):
        xs = [x.astype(np.float64) for x in inputs]
        if op in ("sum", "avg"):
            out = np.sum(xs, axis=0)
            return out / n if op == "avg" else out
        return {"prod": np.prod, "max": np.max, "min": np.min}[op](xs, axis=0)
    xs = [_int_wide(x) for x in inputs]
    with np.errstate(over="ignore"):
        if op in ("sum", "avg"):
            acc = xs[0].copy()
            for x in xs[1:]:
                acc = acc + x  # wraps modulo 2**64, hence modulo 2**bits after the cast
            s = acc.astype(npdt)
            if op == "sum":
                return s
            w = _int_wide(s)
            q = np.abs(w) // n if np.issubdtype(w.dtype, np.signedinteger) else w // n
            return (np.sign(w) * q if np.issubdtype(w.dtype, np.signedinteger) else q).astype(npdt)
        if op == "prod":
            acc = xs[0].copy()
            for x in xs[1:]:
                acc = acc * x
            return acc.astype(npdt)
    return {"max": np.max, "min": np.min}[op](xs, axis=0).astype(npdt)


def tolerance(inputs: list[np.ndarray], op: str, dt) -> np.ndarray | float:
    """Honest per-element error bound for float results: one rounding per step."""
    if not is_float(dt) or op in ("max", "min"):
        return 0.0
    eps = {DType.FLOAT16: 2.0**-10, DType.BFLOAT16: 2.0**-7, DType.FLOAT32: 2.0**-23, DType.FLOAT64: 2.0**-52}[dt]
    n = len(inputs)
    xs = np.abs(np.array([x.astype(np.float64) for x in inputs]))
    if op == "prod":
        return (n + 1) * eps * np.prod(xs, axis=0)
    bound = (n + 1) * eps * np.sum(xs, axis=0)
    return bound / n + eps * bound if op == "avg" else bound


def compare(got: np.ndarray, inputs: list[np.ndarray], op: str, dt) -> int:
    """Number of wrong elements in ``got``."""
    if got.size <= EXACT_LIMIT:
        return mismatches(got, reduce_ref(inputs, op, dt), tolerance(inputs, op, dt), dt)
    # periodic inputs: check every period against the reference of the first one
    period = [x[:PERIOD] for x in inputs]
    ref, tol = reduce_ref(period, op, dt), tolerance(period, op, dt)
    full = got.size // PERIOD * PERIOD
    wrong = mismatches(got[:full].reshape(-1, PERIOD), ref, tol, dt)
    tail = got.size - full
    if tail:
        tol_tail = tol[:tail] if isinstance(tol, np.ndarray) else tol
        wrong += mismatches(got[full:], ref[:tail], tol_tail, dt)
    return wrong


def mismatches(got: np.ndarray, ref: np.ndarray, tol, dt) -> int:
    if got.size == 0:
        return 0
    if is_float(dt):
        g = got.astype(np.float64)
        return int(np.count_nonzero(~(np.abs(g - ref) <= tol)))
    return int(np.count_nonzero(got != ref))
