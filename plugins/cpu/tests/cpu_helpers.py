"""Shared helpers of the cpu plugin's tests: numpy dtypes for uniccl's codes and raw-address
views (a module of its own: several conftest.py files exist in one pytest run)."""

import ctypes

import ml_dtypes
import numpy as np

from uniccl._types import DType

NUMPY = {
    DType.INT8: np.int8,
    DType.UINT8: np.uint8,
    DType.INT16: np.int16,
    DType.UINT16: np.uint16,
    DType.INT32: np.int32,
    DType.UINT32: np.uint32,
    DType.INT64: np.int64,
    DType.UINT64: np.uint64,
    DType.FLOAT16: np.float16,
    DType.BFLOAT16: ml_dtypes.bfloat16,
    DType.FLOAT32: np.float32,
    DType.FLOAT64: np.float64,
}
INTS = [d for d in DType if np.issubdtype(np.dtype(NUMPY[d]), np.integer)]
FLOATS = [d for d in DType if d not in INTS]
HALFS = [DType.FLOAT16, DType.BFLOAT16]


def addr(arr: np.ndarray) -> int:
    return arr.ctypes.data


def view(address: int, count: int, dtype) -> np.ndarray:
    """A numpy array over ``count`` elements at a raw address (no copy)."""
    dtype = np.dtype(dtype)
    return np.frombuffer((ctypes.c_char * (count * dtype.itemsize)).from_address(address), dtype)
