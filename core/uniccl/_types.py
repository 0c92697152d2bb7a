"""Stable enumerations shared by the core and every plugin.

The integer values are part of the plugin ABI (see ``hookspecs``): plugins receive
plain ints, so they never need to import these classes on their hot path.
Values 0-9 of ``DType`` and all of ``ReduceOp`` equal NCCL's, so a vendor plugin
can pass them straight through to an NCCL-class library.
"""

from __future__ import annotations

import enum

import numpy as np


class ReduceOp(enum.IntEnum):
    SUM = 0
    PROD = 1
    MAX = 2
    MIN = 3
    AVG = 4


class DType(enum.IntEnum):
    INT8 = 0
    UINT8 = 1
    INT32 = 2
    UINT32 = 3
    INT64 = 4
    UINT64 = 5
    FLOAT16 = 6
    FLOAT32 = 7
    FLOAT64 = 8
    BFLOAT16 = 9
    INT16 = 10
    UINT16 = 11

    @property
    def itemsize(self) -> int:
        return _ITEMSIZE[self]

    @property
    def numpy(self) -> np.dtype:
        """The numpy dtype (bfloat16 comes from ml_dtypes)."""
        return numpy_dtype(self)


#: The floating dtypes' codes (a float AVG divides each input first; integer AVG sums, then divides).
FLOATING = frozenset(int(d) for d in (DType.FLOAT16, DType.BFLOAT16, DType.FLOAT32, DType.FLOAT64))


class MemcpyKind(enum.IntEnum):
    """Copy direction; values equal cudaMemcpyKind's."""

    HOST_TO_HOST = 0
    HOST_TO_DEVICE = 1
    DEVICE_TO_HOST = 2
    DEVICE_TO_DEVICE = 3
    DEFAULT = 4


class DLDeviceType(enum.IntEnum):
    """DLPack device codes (dlpack.h)."""

    CPU = 1
    CUDA = 2
    CUDA_HOST = 3
    ROCM = 10
    EXT_DEV = 12
    ONEAPI = 14


_ITEMSIZE = {
    DType.INT8: 1,
    DType.UINT8: 1,
    DType.INT16: 2,
    DType.UINT16: 2,
    DType.INT32: 4,
    DType.UINT32: 4,
    DType.INT64: 8,
    DType.UINT64: 8,
    DType.FLOAT16: 2,
    DType.BFLOAT16: 2,
    DType.FLOAT32: 4,
    DType.FLOAT64: 8,
}

_NUMPY_NAMES = {
    DType.INT8: "int8",
    DType.UINT8: "uint8",
    DType.INT16: "int16",
    DType.UINT16: "uint16",
    DType.INT32: "int32",
    DType.UINT32: "uint32",
    DType.INT64: "int64",
    DType.UINT64: "uint64",
    DType.FLOAT16: "float16",
    DType.BFLOAT16: "bfloat16",
    DType.FLOAT32: "float32",
    DType.FLOAT64: "float64",
}
_BY_NAME = {name: dt for dt, name in _NUMPY_NAMES.items()}

_OP_NAMES = {op.name.lower(): op for op in ReduceOp}


def numpy_dtype(dt: DType) -> np.dtype:
    if dt == DType.BFLOAT16:
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(_NUMPY_NAMES[dt])


def dtype_from_name(name: str) -> DType | None:
    """'float32' -> DType.FLOAT32; None when unsupported."""
    return _BY_NAME.get(name)


def dtype_name(dt: int) -> str:
    return _NUMPY_NAMES[DType(dt)]


def op_from_any(op) -> ReduceOp | None:
    """Accept ReduceOp, its int value or its name ('sum', 'SUM'); None when unknown."""
    if isinstance(op, ReduceOp):
        return op
    if isinstance(op, str):
        return _OP_NAMES.get(op.lower())
    if isinstance(op, int) and not isinstance(op, bool):
        try:
            return ReduceOp(op)
        except ValueError:
            return None
    return None
