import pytest

import uniccl
from uniccl._types import DType, ReduceOp, dtype_from_name, numpy_dtype, op_from_any


def test_values_match_nccl():
    # ncclDataType_t / ncclRedOp_t values: a vendor plugin passes them straight through
    assert [
        DType.INT8,
        DType.UINT8,
        DType.INT32,
        DType.UINT32,
        DType.INT64,
        DType.UINT64,
        DType.FLOAT16,
        DType.FLOAT32,
        DType.FLOAT64,
        DType.BFLOAT16,
    ] == list(range(10))
    assert [ReduceOp.SUM, ReduceOp.PROD, ReduceOp.MAX, ReduceOp.MIN, ReduceOp.AVG] == list(range(5))


@pytest.mark.parametrize("dt", list(DType))
def test_numpy_round_trip(dt):
    npdt = numpy_dtype(dt)
    assert npdt.itemsize == dt.itemsize
    assert dtype_from_name(npdt.name) == dt


def test_op_names():
    assert op_from_any("sum") is ReduceOp.SUM and op_from_any("AVG") is ReduceOp.AVG
    assert op_from_any(uniccl.MAX) is ReduceOp.MAX and op_from_any(3) is ReduceOp.MIN
    assert op_from_any("xor") is None and op_from_any(True) is None and op_from_any(9) is None
