"""as_buffer: numpy arrays, the CUDA Array Interface, DLPack and the buffer protocol."""

import array
import ctypes
import gc
import pickle
import sys

import numpy as np
import pytest

from uniccl._errors import InvalidArgument
from uniccl._types import DType, dtype_from_name
from uniccl.comm._buffer import as_buffer

CONTEXT = "[allreduce, rank 3, argument 'recvbuf']"
INT_FLOAT_DTYPES = [dt for dt in DType if dt != DType.BFLOAT16]


def convert(obj, writable=False):
    return as_buffer(obj, "allreduce", "sendbuf", 0, writable)


def rejected(obj, match, writable=False):
    """as_buffer must raise InvalidArgument matching ``match`` and carrying the context."""
    with pytest.raises(InvalidArgument, match=match) as info:
        as_buffer(obj, "allreduce", "recvbuf", 3, writable)
    err = info.value
    assert (err.op, err.rank, err.argument) == ("allreduce", 3, "recvbuf")
    assert str(err).startswith(CONTEXT)
    return err


def address(obj):
    """Address of a host buffer's first byte, found independently of uniccl."""
    return np.frombuffer(obj, np.uint8).ctypes.data


def assert_host_view(v, obj, ptr, count, dtype, readonly=False):
    assert v.obj is obj
    assert v.ptr == ptr
    assert v.count == count
    assert v.nbytes == count * DType(dtype).itemsize
    assert v.dtype == dtype
    assert v.readonly is readonly
    assert (v.device_type, v.device_id, v.stream) == (1, 0, None)


# --- numpy ----------------------------------------------------------------------------


@pytest.mark.parametrize("dt", list(DType), ids=lambda dt: dt.name)
def test_numpy_every_dtype(dt):
    if dt == DType.BFLOAT16:
        pytest.importorskip("ml_dtypes")
    arr = np.zeros((2, 3), dtype=dt.numpy)
    v = convert(arr, writable=True)
    assert_host_view(v, arr, arr.ctypes.data, 6, dt)
    assert v.nbytes == arr.nbytes
    assert type(v.dtype) is int


@pytest.mark.parametrize(
    "npdt, dt",
    [
        (np.longlong, DType.INT64),
        (np.ulonglong, DType.UINT64),
        (np.intc, DType.INT32),
        (np.uintc, DType.UINT32),
        (np.short, DType.INT16),
        (np.byte, DType.INT8),
    ],
)
def test_numpy_type_aliases_map_by_size(npdt, dt):
    assert convert(np.zeros(4, npdt)).dtype == dt


def test_numpy_shapes():
    scalar = np.array(3.5)
    assert_host_view(convert(scalar), scalar, scalar.ctypes.data, 1, DType.FLOAT64)
    cube = np.zeros((2, 3, 4), np.int16)
    assert convert(cube).count == 24
    for empty in (np.empty(0, np.float32), np.empty((3, 0, 2), np.float32)):
        v = convert(empty)
        assert (v.count, v.nbytes) == (0, 0)
    # Size-1 dimensions may have any stride.
    column_t = np.arange(4.0).reshape(4, 1).T
    assert convert(column_t).count == 4


def test_numpy_non_contiguous_rejected():
    err = rejected(np.arange(8.0)[::2], "C-contiguous")
    assert "byte strides (16,) for shape (4,)" in str(err)
    rejected(np.zeros((3, 4), order="F"), "C-contiguous")


@pytest.mark.parametrize("npdt", [np.complex128, np.bool_, object, ">i4", "U3", np.longdouble])
def test_numpy_unsupported_dtype(npdt):
    arr = np.zeros(2, npdt)
    err = rejected(arr, "unsupported dtype")
    assert str(arr.dtype) in str(err)
    assert "supported: int8, uint8" in str(err) and "bfloat16" in str(err)


def test_numpy_read_only():
    arr = np.zeros(4, np.float32)
    arr.flags.writeable = False
    rejected(arr, "receive buffer is read-only", writable=True)
    assert convert(arr).readonly is True


# --- buffer protocol --------------------------------------------------------------------


def test_bytes_read_only():
    data = b"abcd"
    assert_host_view(convert(data), data, address(data), 4, DType.UINT8, readonly=True)
    rejected(data, "read-only", writable=True)


def test_bytearray_held_until_view_dies():
    buf = bytearray(8)
    v = convert(buf, writable=True)
    assert_host_view(v, buf, address(buf), 8, DType.UINT8)
    with pytest.raises(BufferError):
        buf.append(0)  # the exported buffer pins the bytearray's memory
    del v
    buf.append(0)


def test_failed_conversion_releases_buffer():
    buf = bytearray(16)
    rejected(memoryview(buf).cast("d")[::-1], "C-contiguous")
    rejected(memoryview(buf).toreadonly(), "read-only", writable=True)
    gc.collect()
    buf.append(0)


def test_memoryview():
    buf = bytearray(16)
    half = memoryview(np.zeros(8, np.float16))  # format 'e'
    assert_host_view(convert(half), half, address(half), 8, DType.FLOAT16)
    assert convert(memoryview(buf).cast("d", (2, 1))).count == 2
    err = rejected(memoryview(buf)[::2], "C-contiguous")
    assert "byte strides (2,) for shape (8,)" in str(err)


@pytest.mark.parametrize("code", "bBhHiIlLqQfd")
def test_array_array(code):
    arr = array.array(code, range(5))
    expected = dtype_from_name(np.dtype(code).name)
    assert_host_view(convert(arr), arr, arr.buffer_info()[0], 5, expected)


@pytest.mark.parametrize(
    "ctype, dt",
    [
        (ctypes.c_int8, DType.INT8),
        (ctypes.c_ubyte, DType.UINT8),
        (ctypes.c_char, DType.UINT8),
        (ctypes.c_int16, DType.INT16),
        (ctypes.c_uint16, DType.UINT16),
        (ctypes.c_int, DType.INT32),
        (ctypes.c_uint32, DType.UINT32),
        (ctypes.c_long, dtype_from_name(np.dtype(ctypes.c_long).name)),
        (ctypes.c_int64, DType.INT64),
        (ctypes.c_uint64, DType.UINT64),
        (ctypes.c_float, DType.FLOAT32),
        (ctypes.c_double, DType.FLOAT64),
    ],
)
def test_ctypes_array(ctype, dt):
    arr = (ctype * 4)()
    assert_host_view(convert(arr), arr, ctypes.addressof(arr), 4, dt)


def test_ctypes_2d():
    arr = ((ctypes.c_float * 3) * 2)()
    assert_host_view(convert(arr), arr, ctypes.addressof(arr), 6, DType.FLOAT32)


@pytest.mark.parametrize(
    "obj, fmt",
    [
        (memoryview(np.zeros(2, complex)), "'Zd'"),
        (memoryview(np.zeros(2, ">i4")), "'>i'"),
        (memoryview(np.zeros(2, bool)), "'?'"),
        ((ctypes.c_bool * 2)(), "'<?'"),
        (memoryview(np.zeros(2, [("a", "i4"), ("b", "f8")])), "T{"),
    ],
)
def test_buffer_unsupported_format(obj, fmt):
    err = rejected(obj, "unsupported dtype with buffer format")
    assert fmt in str(err) and "supported: int8" in str(err)


@pytest.mark.parametrize("obj", [[1, 2], None, 3, "text", object()])
def test_not_a_buffer(obj):
    err = rejected(obj, "expected an object with the buffer protocol, DLPack or the CUDA Array Interface")
    assert str(err).endswith(f"got {type(obj).__name__}")


# --- CUDA Array Interface ---------------------------------------------------------------


class FakeCuda:
    """Pretends host memory is device memory: a CAI dict over a numpy array."""

    def __init__(self, arr, **fields):
        self.arr = arr
        self.__cuda_array_interface__ = {
            "version": 3,
            "shape": arr.shape,
            "typestr": arr.dtype.str,
            "strides": None,
            "data": (arr.ctypes.data, not arr.flags.writeable),
            "stream": 1,
            **fields,
        }


def test_cai_basic():
    arr = np.zeros((2, 3), np.float32)
    fake = FakeCuda(arr, stream=7)
    v = convert(fake, writable=True)
    assert v.obj is fake
    assert (v.ptr, v.count, v.nbytes, v.dtype) == (arr.ctypes.data, 6, 24, DType.FLOAT32)
    assert (v.readonly, v.device_type, v.device_id, v.stream) == (False, 2, 0, 7)


@pytest.mark.parametrize("dt", INT_FLOAT_DTYPES, ids=lambda dt: dt.name)
def test_cai_typestr(dt):
    assert convert(FakeCuda(np.zeros(3, dt.numpy))).dtype == dt


def test_cai_v2_has_no_stream():
    fake = FakeCuda(np.zeros(3, np.int64), version=2)
    del fake.__cuda_array_interface__["stream"]
    assert convert(fake).stream is None


def test_cai_strides():
    arr = np.zeros((2, 3), np.float64)
    assert convert(FakeCuda(arr, strides=arr.strides)).count == 6
    assert convert(FakeCuda(np.zeros((1, 4)), strides=(999, 8))).count == 4
    assert convert(FakeCuda(np.zeros((0, 4)), strides=(8, 16))).count == 0
    strided = np.arange(8.0)[::2]
    err = rejected(FakeCuda(strided, strides=strided.strides), "C-contiguous")
    assert "byte strides (16,) for shape (4,)" in str(err)


def test_cai_read_only():
    arr = np.zeros(4, np.uint8)
    arr.flags.writeable = False
    rejected(FakeCuda(arr), "read-only", writable=True)
    assert convert(FakeCuda(arr)).readonly is True


def test_cai_bfloat16_needs_descr():
    arr = np.zeros(4, np.uint16)
    err = rejected(FakeCuda(arr, typestr="<V2"), "unsupported dtype with typestr '<V2'")
    assert "descr" in str(err)
    v = convert(FakeCuda(arr, typestr="<V2", descr=[("bfloat16", "<V2")]))
    assert (v.dtype, v.nbytes) == (DType.BFLOAT16, 8)


@pytest.mark.parametrize("typestr", ["<c16", ">i4", "<b1", "<f16", "f4"])
def test_cai_unsupported_typestr(typestr):
    rejected(FakeCuda(np.zeros(2), typestr=typestr), "unsupported dtype")


def test_cai_mask_and_malformed():
    rejected(FakeCuda(np.zeros(2), mask=object()), "mask")
    fake = FakeCuda(np.zeros(2))
    del fake.__cuda_array_interface__["data"]
    rejected(fake, "malformed __cuda_array_interface__")


def test_cai_checked_before_dlpack_and_buffer():
    class Both(FakeCuda):
        def __dlpack__(self, stream=None):
            raise AssertionError("DLPack must not be used")

        def __dlpack_device__(self):
            return (1, 0)

    assert convert(Both(np.zeros(2))).device_type == 2


# --- DLPack -----------------------------------------------------------------------------


class NumpyProducer:
    """A third-party DLPack producer backed by numpy's own __dlpack__."""

    def __init__(self, arr):
        self.arr = arr
        self.capsules = []

    def __dlpack__(self, stream=None):
        capsule = self.arr.__dlpack__()
        self.capsules.append(capsule)
        return capsule

    def __dlpack_device__(self):
        return self.arr.__dlpack_device__()


def capsule_name_is(capsule, name):
    is_valid = ctypes.pythonapi.PyCapsule_IsValid
    is_valid.restype, is_valid.argtypes = ctypes.c_int, [ctypes.py_object, ctypes.c_char_p]
    return is_valid(capsule, name) == 1


def test_dlpack_numpy_producer_deleter_runs_once():
    arr = np.arange(6, dtype=np.int32).reshape(2, 3)
    producer = NumpyProducer(arr)
    before = sys.getrefcount(arr)
    v = convert(producer, writable=True)
    assert_host_view(v, producer, arr.ctypes.data, 6, DType.INT32)
    assert capsule_name_is(producer.capsules[0], b"used_dltensor")
    assert sys.getrefcount(arr) == before + 1  # numpy's manager context holds the array
    del v
    gc.collect()
    assert sys.getrefcount(arr) == before


@pytest.mark.parametrize(
    "arr, match", [(np.arange(8.0)[::2], "element strides"), (np.zeros(2, np.complex64), "unsupported dtype")]
)
def test_dlpack_rejection_still_runs_deleter(arr, match):
    producer = NumpyProducer(arr)
    before = sys.getrefcount(arr)
    rejected(producer, match)
    gc.collect()
    assert sys.getrefcount(arr) == before


def test_dlpack_used_capsule_rejected():
    producer = NumpyProducer(np.zeros(2))
    convert(producer)
    producer.__dlpack__ = lambda stream=None: producer.capsules[0]
    rejected(producer, "unused 'dltensor' capsule")


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


class DLManagedTensor(ctypes.Structure):
    pass


DELETER = ctypes.CFUNCTYPE(None, ctypes.POINTER(DLManagedTensor))
DLManagedTensor._fields_ = [("dl_tensor", DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", DELETER)]


class RawProducer:
    """Builds the DLManagedTensor by hand to reach what real producers never emit, and
    counts deleter calls."""

    def __init__(self, shape=(4,), strides=None, code=2, bits=32, lanes=1, byte_offset=0, device=(1, 0)):
        self.memory = np.zeros(64, np.uint8)
        self.deleted = 0
        self.dlpack_kwargs = []
        self.device = device
        self._shape = (ctypes.c_int64 * len(shape))(*shape)
        self._strides = None if strides is None else (ctypes.c_int64 * len(strides))(*strides)
        self._deleter = DELETER(self._delete)
        t = DLTensor(
            data=self.memory.ctypes.data,
            device=DLDevice(*device),
            ndim=len(shape),
            dtype=DLDataType(code, bits, lanes),
            shape=self._shape,
            strides=self._strides,
            byte_offset=byte_offset,
        )
        self.managed = DLManagedTensor(dl_tensor=t, deleter=self._deleter)

    def _delete(self, managed):
        assert ctypes.addressof(managed.contents) == ctypes.addressof(self.managed)
        self.deleted += 1

    def __dlpack_device__(self):
        return self.device

    def __dlpack__(self, **kwargs):
        self.dlpack_kwargs.append(kwargs)
        new = ctypes.pythonapi.PyCapsule_New
        new.restype, new.argtypes = ctypes.py_object, [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
        return new(ctypes.addressof(self.managed), b"dltensor", None)


def test_dlpack_raw_producer():
    producer = RawProducer(shape=(2, 3), strides=(3, 1), code=1, bits=16, byte_offset=8)
    v = convert(producer)
    assert_host_view(v, producer, producer.memory.ctypes.data + 8, 6, DType.UINT16)
    assert producer.dlpack_kwargs == [{}]  # CPU: no stream argument
    assert producer.deleted == 0
    del v
    assert producer.deleted == 1


def test_dlpack_device_and_stream():
    producer = RawProducer(device=(2, 1))
    v = convert(producer)
    assert (v.device_type, v.device_id, v.stream) == (2, 1, None)
    assert producer.dlpack_kwargs == [{"stream": None}]


@pytest.mark.parametrize(
    "code, bits, dt",
    [
        (0, 8, DType.INT8),
        (0, 64, DType.INT64),
        (1, 32, DType.UINT32),
        (2, 16, DType.FLOAT16),
        (2, 64, DType.FLOAT64),
        (4, 16, DType.BFLOAT16),
    ],
)
def test_dlpack_dtype_codes(code, bits, dt):
    assert convert(RawProducer(code=code, bits=bits)).dtype == dt


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(lanes=4), "4 lanes; expected lanes 1"),
        (dict(code=5, bits=64), "unsupported dtype with DLPack code 5 and 64 bits"),
        (dict(code=6, bits=8), "unsupported dtype with DLPack code 6"),
        (dict(code=4, bits=8), "unsupported dtype with DLPack code 4"),
        (dict(shape=(2, 3), strides=(1, 2)), r"element strides \(1, 2\) for shape \(2, 3\)"),
    ],
)
def test_dlpack_rejections_run_deleter(kwargs, match):
    producer = RawProducer(**kwargs)
    rejected(producer, match)
    gc.collect()
    assert producer.deleted == 1


@pytest.mark.parametrize("shape, strides", [((1, 4), (99, 1)), ((0, 3), (7, 7)), ((), ())])
def test_dlpack_compact_strides(shape, strides):
    producer = RawProducer(shape=shape, strides=strides)
    assert convert(producer).count == int(np.prod(shape))


def test_dlpack_export_failure_is_invalid_argument():
    class Broken:
        def __dlpack__(self, stream=None):
            raise BufferError("cannot export")

        def __dlpack_device__(self):
            return (1, 0)

    err = rejected(Broken(), "DLPack export failed: cannot export")
    assert isinstance(err.__cause__, BufferError)


TORCH_DTYPES = [
    ("int8", DType.INT8),
    ("uint8", DType.UINT8),
    ("int16", DType.INT16),
    ("uint16", DType.UINT16),
    ("int32", DType.INT32),
    ("uint32", DType.UINT32),
    ("int64", DType.INT64),
    ("uint64", DType.UINT64),
    ("float16", DType.FLOAT16),
    ("bfloat16", DType.BFLOAT16),
    ("float32", DType.FLOAT32),
    ("float64", DType.FLOAT64),
]


@pytest.mark.parametrize("name, dt", TORCH_DTYPES, ids=[name for name, _ in TORCH_DTYPES])
def test_torch_dtypes(name, dt):
    torch = pytest.importorskip("torch")
    t = torch.zeros((2, 3), dtype=getattr(torch, name))
    assert_host_view(convert(t, writable=True), t, t.data_ptr(), 6, dt)


def test_torch_shapes():
    torch = pytest.importorskip("torch")
    scalar = torch.tensor(2.5)
    assert_host_view(convert(scalar), scalar, scalar.data_ptr(), 1, DType.FLOAT32)
    assert convert(torch.empty((0, 5))).count == 0
    tail = torch.arange(10, dtype=torch.float64)[3:]
    assert convert(tail).ptr == tail.data_ptr()


def test_torch_rejections():
    torch = pytest.importorskip("torch")
    err = rejected(torch.arange(12.0).reshape(3, 4).T, "C-contiguous")
    assert "element strides (1, 4) for shape (4, 3)" in str(err)
    rejected(torch.zeros(2, dtype=torch.complex64), "unsupported dtype")
    rejected(torch.zeros(2, dtype=torch.bool), "unsupported dtype")
    rejected(torch.zeros(2, requires_grad=True), "DLPack export failed")


# --- errors and the view object ---------------------------------------------------------


def test_errors_pickle_round_trip():
    err = rejected(np.zeros(2, complex), "unsupported dtype")
    copy = pickle.loads(pickle.dumps(err))
    assert type(copy) is InvalidArgument
    assert str(copy) == str(err)
    assert (copy.op, copy.rank, copy.argument, copy.message) == (err.op, err.rank, err.argument, err.message)


def test_view_attributes_are_read_only():
    v = convert(np.zeros(2))
    for name in ("obj", "ptr", "nbytes", "count", "dtype", "readonly", "device_type", "device_id", "stream"):
        with pytest.raises(AttributeError):
            setattr(v, name, 0)
    assert "float64" in repr(v)
