# cython: language_level=3
"""Buffer conversion: turn a user's buffer object into a small descriptor.

``as_buffer`` accepts, checked in this order: numpy arrays, objects exporting the
CUDA Array Interface, objects exporting DLPack, and anything else with the buffer
protocol. The ``BufferView`` it returns keeps alive whatever keeps the memory valid
(the object itself, a held ``Py_buffer`` or a consumed DLPack tensor) until the
view is collected.
"""
cimport cython
cimport numpy as cnp
from cpython.buffer cimport (PyBUF_RECORDS_RO, PyBuffer_IsContiguous, PyBuffer_Release,
                             PyObject_CheckBuffer, PyObject_GetBuffer)
from cpython.pycapsule cimport PyCapsule_GetPointer, PyCapsule_IsValid, PyCapsule_SetName
from libc.stdint cimport int32_t, int64_t, uint8_t, uint16_t, uint64_t, uintptr_t

import sys

import numpy as np

from uniccl._errors import InvalidArgument
from uniccl._types import DLDeviceType, DType, dtype_from_name, dtype_name

cnp.import_array()

cdef int _CPU = DLDeviceType.CPU
cdef int _CUDA = DLDeviceType.CUDA
cdef int _BFLOAT16 = DType.BFLOAT16

_SUPPORTED = ("int8, uint8, int16, uint16, int32, uint32, int64, uint64, "
              "float16, float32, float64, bfloat16")

# numpy's builtin type numbers -> DType code (-1: unsupported), so the numpy path is a
# table lookup. Built from type characters rather than names because several type
# numbers share a name (long and longlong are both int64 on LP64).
cdef int _NPY_DTYPE[cnp.NPY_NTYPES_LEGACY]

cdef _init_numpy_table():
    cdef int num
    for num in range(<int>cnp.NPY_NTYPES_LEGACY):
        _NPY_DTYPE[num] = -1
    for char in "bBhHiIlLqQefd":
        _NPY_DTYPE[np.dtype(char).num] = dtype_from_name(np.dtype(char).name)

_init_numpy_table()

# ml_dtypes registers bfloat16 as a user dtype whose number is only known at run time;
# looked up on first use so that ml_dtypes is imported only by its users.
cdef int _npy_bfloat16 = -1

# Byte-order marks that mean "native" (struct module and array-interface spellings).
if sys.byteorder == "little":
    _NATIVE_FORMAT_PREFIXES = ("@", "=", "<")
    _NATIVE_TYPESTR_ORDERS = ("<", "=", "|")
else:
    _NATIVE_FORMAT_PREFIXES = ("@", "=", ">", "!")
    _NATIVE_TYPESTR_ORDERS = (">", "=", "|")

# The element size always comes from the exporter's itemsize, which honours the
# native/standard size rules (and ctypes, which reports '<l' with itemsize 8 on LP64).
_FORMAT_KINDS = {
    "b": "int", "h": "int", "i": "int", "l": "int", "q": "int",
    "B": "uint", "H": "uint", "I": "uint", "L": "uint", "Q": "uint", "c": "uint",
    "e": "float", "f": "float", "d": "float",
}
_TYPESTR_KINDS = {"i": "int", "u": "uint", "f": "float"}
_DLPACK_KINDS = {0: "int", 1: "uint", 2: "float", 4: "bfloat"}


# dlpack.h (legacy, unversioned ABI) — the layout of a "dltensor" capsule's payload.
cdef struct DLDevice:
    int32_t device_type
    int32_t device_id

cdef struct DLDataType:
    uint8_t code
    uint8_t bits
    uint16_t lanes

cdef struct DLTensor:
    void* data
    DLDevice device
    int32_t ndim
    DLDataType dtype
    int64_t* shape
    int64_t* strides
    uint64_t byte_offset

cdef struct DLManagedTensor:
    DLTensor dl_tensor
    void* manager_ctx
    void (*deleter)(DLManagedTensor*) noexcept


@cython.final
cdef class _ManagedTensor:
    """Owns a consumed DLManagedTensor: its deleter runs exactly once, on collection."""

    cdef DLManagedTensor* tensor

    def __dealloc__(self):
        if self.tensor is not NULL and self.tensor.deleter is not NULL:
            self.tensor.deleter(self.tensor)


@cython.final
@cython.freelist(16)
cdef class BufferView:
    """Memory described by ``as_buffer``. ``ptr`` is valid while this view is alive.

    CUDA Array Interface input gets ``device_id`` 0: the interface has no device
    field, so plugins resolve the device from the pointer themselves.
    """

    cdef readonly object obj
    cdef readonly uintptr_t ptr
    cdef readonly Py_ssize_t nbytes
    cdef readonly Py_ssize_t count
    cdef readonly int dtype
    cdef readonly bint readonly
    cdef readonly int device_type
    cdef readonly int device_id
    cdef readonly object stream
    cdef Py_buffer _view         # buffer-protocol path; released on collection if _held
    cdef bint _held
    cdef _ManagedTensor _tensor  # DLPack path

    def __dealloc__(self):
        if self._held:
            PyBuffer_Release(&self._view)

    def __repr__(self):
        return (f"BufferView(dtype={dtype_name(self.dtype)}, count={self.count}, "
                f"nbytes={self.nbytes}, ptr={self.ptr:#x}, readonly={self.readonly}, "
                f"device=({self.device_type}, {self.device_id}), stream={self.stream})")


cdef inline BufferView _fill(BufferView v, obj, uintptr_t ptr, Py_ssize_t count,
                             Py_ssize_t itemsize, int dtype, bint readonly,
                             int device_type, int device_id, stream):
    v.obj = obj
    v.ptr = ptr
    v.count = count
    v.nbytes = count * itemsize
    v.dtype = dtype
    v.readonly = readonly
    v.device_type = device_type
    v.device_id = device_id
    v.stream = stream
    return v


cdef _invalid(str message, str op, str argument, int rank):
    return InvalidArgument(message, op=op, rank=rank, argument=argument)


cdef _unsupported(str what, str op, str argument, int rank):
    return _invalid(f"unsupported dtype {what}; supported: {_SUPPORTED}", op, argument, rank)


cdef _not_contiguous(str unit, strides, shape, str op, str argument, int rank):
    return _invalid(f"buffer must be C-contiguous; got a strided view with {unit} strides "
                    f"{strides} for shape {shape}", op, argument, rank)


cdef _read_only(str op, str argument, int rank):
    return _invalid("receive buffer is read-only; expected a writable buffer", op, argument, rank)


cdef int _numpy_user_dtype(int num):
    """DType code of a user-defined numpy dtype number (only bfloat16 is known), or -1."""
    global _npy_bfloat16
    if _npy_bfloat16 < 0:
        try:
            import ml_dtypes
        except ImportError:
            return -1
        _npy_bfloat16 = np.dtype(ml_dtypes.bfloat16).num
    return _BFLOAT16 if num == _npy_bfloat16 else -1


cdef BufferView _from_numpy(cnp.ndarray arr, str op, str argument, int rank, bint writable):
    cdef int num = cnp.PyArray_TYPE(arr)
    cdef int dtype = (_NPY_DTYPE[num] if 0 <= num < <int>cnp.NPY_NTYPES_LEGACY
                      else _numpy_user_dtype(num))
    if dtype < 0 or not cnp.PyArray_ISNOTSWAPPED(arr):
        raise _unsupported(str(arr.dtype), op, argument, rank)
    if not cnp.PyArray_IS_C_CONTIGUOUS(arr):
        raise _not_contiguous("byte", (<object>arr).strides, (<object>arr).shape,
                              op, argument, rank)
    cdef bint readonly = not cnp.PyArray_ISWRITEABLE(arr)
    if readonly and writable:
        raise _read_only(op, argument, rank)
    return _fill(BufferView.__new__(BufferView), arr, <uintptr_t>cnp.PyArray_DATA(arr),
                 cnp.PyArray_SIZE(arr), cnp.PyArray_ITEMSIZE(arr), dtype, readonly, _CPU, 0, None)


cdef bint _compact(shape, strides, Py_ssize_t unit):
    """Whether ``strides`` are row-major compact for ``shape`` (``unit``: the last
    dimension's stride); size-1 dimensions may have any stride, as in numpy."""
    if len(strides) != len(shape):
        return False
    expected = unit
    for n, s in zip(reversed(shape), reversed(strides)):
        if n != 1 and s != expected:
            return False
        expected *= n
    return True


cdef BufferView _from_cai(obj, cai, str op, str argument, int rank, bint writable):
    # CAI has no device field: device_id stays 0 and plugins resolve the device from
    # the pointer themselves (e.g. cuPointerGetAttribute).
    try:
        ptr, readonly = cai["data"]
        shape = tuple(cai["shape"])
        typestr = cai["typestr"]
        strides = cai.get("strides")
        descr = cai.get("descr")
        mask = cai.get("mask")
        stream = cai.get("stream")
        if stream is not None:
            stream = int(stream)
        count = 1
        for n in shape:
            count *= n
    except (KeyError, TypeError, ValueError) as exc:
        raise _invalid(f"malformed __cuda_array_interface__: {exc!r}", op, argument, rank) from exc
    if mask is not None:
        raise _invalid("masked __cuda_array_interface__ is unsupported; expected mask None",
                       op, argument, rank)

    dtype = None
    if isinstance(typestr, str) and len(typestr) >= 3 and typestr[0] in _NATIVE_TYPESTR_ORDERS:
        kind, size = typestr[1], typestr[2:]
        if kind == "V" and size == "2":
            # '<V2' is any 2-byte opaque type; only an explicit descr makes it bfloat16.
            if descr == [("bfloat16", typestr)]:
                dtype = _BFLOAT16
        elif kind in _TYPESTR_KINDS and size.isdigit():
            dtype = dtype_from_name(f"{_TYPESTR_KINDS[kind]}{8 * int(size)}")
    if dtype is None:
        hint = (" (bfloat16 needs descr [('bfloat16', '<V2')])"
                if isinstance(typestr, str) and typestr[1:] == "V2" else "")
        raise _unsupported(f"with typestr {typestr!r}{hint}", op, argument, rank)

    itemsize = int(typestr[2:])
    if strides is not None and count != 0 and not _compact(shape, tuple(strides), itemsize):
        raise _not_contiguous("byte", tuple(strides), shape, op, argument, rank)
    if readonly and writable:
        raise _read_only(op, argument, rank)
    return _fill(BufferView.__new__(BufferView), obj, ptr, count, itemsize, dtype, readonly,
                 _CUDA, 0, stream)


cdef BufferView _from_dlpack(obj, str op, str argument, int rank, bint writable):
    try:
        if obj.__dlpack_device__()[0] == _CPU:
            capsule = obj.__dlpack__()
        else:
            # stream=None: the producer orders its work before the legacy default stream.
            capsule = obj.__dlpack__(stream=None)
    except Exception as exc:
        raise _invalid(f"DLPack export failed: {exc}", op, argument, rank) from exc
    if not PyCapsule_IsValid(capsule, b"dltensor"):
        raise _invalid(f"__dlpack__ must return an unused 'dltensor' capsule; got {capsule!r}",
                       op, argument, rank)

    # Take ownership before any check can fail, so the deleter runs on every path.
    cdef _ManagedTensor owner = _ManagedTensor.__new__(_ManagedTensor)
    cdef DLManagedTensor* managed = <DLManagedTensor*>PyCapsule_GetPointer(capsule, b"dltensor")
    PyCapsule_SetName(capsule, b"used_dltensor")
    owner.tensor = managed

    cdef DLTensor* t = &managed.dl_tensor
    cdef DLDataType dt = t.dtype
    if dt.lanes != 1:
        raise _invalid(f"unsupported DLPack dtype with {dt.lanes} lanes; expected lanes 1",
                       op, argument, rank)
    dtype = (dtype_from_name(f"{_DLPACK_KINDS[dt.code]}{dt.bits}")
             if dt.code in _DLPACK_KINDS else None)
    if dtype is None:
        raise _unsupported(f"with DLPack code {dt.code} and {dt.bits} bits", op, argument, rank)

    cdef Py_ssize_t count = 1
    cdef int32_t i
    for i in range(t.ndim):
        count *= t.shape[i]
    if t.strides is not NULL and count != 0:
        shape = tuple([t.shape[i] for i in range(t.ndim)])
        strides = tuple([t.strides[i] for i in range(t.ndim)])
        if not _compact(shape, strides, 1):
            raise _not_contiguous("element", strides, shape, op, argument, rank)

    # Legacy DLPack has no read-only flag: producers refuse to export read-only memory.
    cdef BufferView v = _fill(BufferView.__new__(BufferView), obj,
                              <uintptr_t>t.data + t.byte_offset, count, dt.bits // 8, dtype,
                              False, t.device.device_type, t.device.device_id, None)
    v._tensor = owner
    return v


cdef BufferView _from_buffer(obj, str op, str argument, int rank, bint writable):
    cdef BufferView v = BufferView.__new__(BufferView)
    try:
        PyObject_GetBuffer(obj, &v._view, PyBUF_RECORDS_RO)  # format + strides, read-only allowed
    except BufferError as exc:
        raise _invalid(f"buffer export failed: {exc}", op, argument, rank) from exc
    v._held = True
    # From here on v owns the Py_buffer: raising drops v, which releases it.
    cdef Py_buffer* view = &v._view

    fmt = "B" if view.format is NULL else (<bytes>view.format).decode("latin-1")
    base = fmt[1:] if fmt[:1] in _NATIVE_FORMAT_PREFIXES else fmt
    kind = _FORMAT_KINDS.get(base)
    dtype = None if kind is None else dtype_from_name(f"{kind}{8 * view.itemsize}")
    if dtype is None:
        raise _unsupported(f"with buffer format {fmt!r}", op, argument, rank)
    if not PyBuffer_IsContiguous(view, b"C"):
        raise _not_contiguous("byte", tuple([view.strides[i] for i in range(view.ndim)]),
                              tuple([view.shape[i] for i in range(view.ndim)]),
                              op, argument, rank)
    if view.readonly and writable:
        raise _read_only(op, argument, rank)
    return _fill(v, obj, <uintptr_t>view.buf, view.len // view.itemsize, view.itemsize,
                 dtype, view.readonly, _CPU, 0, None)


def as_buffer(obj, str op, str argument, int rank, bint writable):
    """Describe ``obj``'s memory as a ``BufferView``.

    ``op``, ``argument`` and ``rank`` only label errors; ``writable`` requires memory
    the operation may write (a receive buffer). Raises ``InvalidArgument`` for an
    object that is not a buffer, is not C-contiguous, has an unsupported dtype, or
    is read-only where ``writable`` is set.
    """
    if isinstance(obj, cnp.ndarray):
        return _from_numpy(<cnp.ndarray>obj, op, argument, rank, writable)
    cai = getattr(obj, "__cuda_array_interface__", None)
    if cai is not None:
        return _from_cai(obj, cai, op, argument, rank, writable)
    if hasattr(obj, "__dlpack__") and hasattr(obj, "__dlpack_device__"):
        return _from_dlpack(obj, op, argument, rank, writable)
    if PyObject_CheckBuffer(obj):
        return _from_buffer(obj, op, argument, rank, writable)
    raise _invalid("expected an object with the buffer protocol, DLPack or the CUDA Array "
                   f"Interface, got {type(obj).__name__}", op, argument, rank)
