# cython: language_level=3
"""Synchronous reduction and scale kernels (kernels.c), run with the GIL released.

Pointers are addresses (ints); dtype and op are uniccl's int codes.
"""
from libc.stdint cimport int64_t, uintptr_t

from uniccl_cpu._status cimport check

from uniccl._errors import InvalidArgument


cdef extern from "kernels.h" nogil:
    int uc_reduce(void *dst, const void *a, const void *b, size_t count, int dtype, int op)
    int uc_scale(void *dst, const void *src, size_t count, int dtype, int64_t divisor)
    int uc_reduce_check(int dtype, int op)
    int uc_scale_check(int dtype, int64_t divisor)
    const char *uc_kernels_available(int i)
    const char *uc_kernels_variant()
    int uc_kernels_select(const char *name)
    const char *uc_kernels_compiler()


cdef int reduce_c(void *dst, const void *a, const void *b, size_t n, int dtype, int op) noexcept nogil:
    return uc_reduce(dst, a, b, n, dtype, op)


cdef int scale_c(void *dst, const void *src, size_t n, int dtype, int64_t divisor) noexcept nogil:
    return uc_scale(dst, src, n, dtype, divisor)


cdef inline int check_count(Py_ssize_t count, str op) except -1:
    if count < 0:
        raise InvalidArgument(f"count must be >= 0, got {count}", op=op, argument="count")
    return 0


def reduce(uintptr_t dst, uintptr_t a, uintptr_t b, Py_ssize_t count, int dtype, int op):
    """dst[i] = op(a[i], b[i]) for count elements; dst may equal a or b."""
    cdef int status
    check_count(count, "reduce")
    with nogil:
        status = uc_reduce(<void *>dst, <const void *>a, <const void *>b, <size_t>count, dtype, op)
    check(status, "reduce", dtype, op)


def scale(uintptr_t dst, uintptr_t src, Py_ssize_t count, int dtype, int64_t divisor):
    """dst[i] = src[i] / divisor (integers truncate toward zero); divisor >= 1."""
    cdef int status
    check_count(count, "scale")
    with nogil:
        status = uc_scale(<void *>dst, <const void *>src, <size_t>count, dtype, divisor)
    check(status, "scale", dtype, divisor)


def check_reduce(int dtype, int op):
    """Raise InvalidArgument now for a dtype/op reduce would reject, so that work
    enqueued on a stream fails at the call rather than at the next synchronize."""
    check(uc_reduce_check(dtype, op), "reduce", dtype, op)


def check_scale(int dtype, int64_t divisor):
    check(uc_scale_check(dtype, divisor), "scale", dtype, divisor)


def available():
    """Kernel variants this CPU can run, best first."""
    names = []
    cdef const char *name = uc_kernels_available(0)
    while name is not NULL:
        names.append(name.decode())
        name = uc_kernels_available(len(names))
    return names


def variant():
    """The variant in use (the best available unless select() changed it)."""
    return uc_kernels_variant().decode()


def select(str name):
    """Use variant ``name`` from now on, process-wide (benchmarks and tests)."""
    if uc_kernels_select(name.encode()) != 0:
        raise InvalidArgument(f"kernel variant {name!r} is not one of {available()}",
                              op="select", argument="name")


def compiler():
    return uc_kernels_compiler().decode()


def reduce_kernel_address():
    """Address of the dispatched C reduction (``int fn(dst, a, b, count, dtype, op)``),
    GIL-free, for native transports that reduce chunks as they arrive."""
    return <uintptr_t>&uc_reduce
