# cython: language_level=3
"""Host memory: page-aligned allocation and copies with the GIL released."""
from libc.stdint cimport uintptr_t
from libc.stdlib cimport free as c_free
from libc.string cimport memcpy
from posix.stdlib cimport posix_memalign

from uniccl._errors import InternalError, InvalidArgument

# Page alignment: glibc's memcpy between buffers of different alignment is up to
# 12x slower, and page-aligned buffers also suit the vector kernels.
cdef size_t ALIGNMENT = 4096


def alloc(Py_ssize_t nbytes):
    """Return the address of ``nbytes`` of page-aligned memory (never 0)."""
    cdef void *ptr = NULL
    if nbytes < 0:
        raise InvalidArgument(f"nbytes must be >= 0, got {nbytes}", op="alloc", argument="nbytes")
    # posix_memalign(0) may return NULL; one byte keeps every allocation a distinct address.
    if posix_memalign(&ptr, ALIGNMENT, <size_t>nbytes if nbytes else 1) != 0:
        raise InternalError(f"out of host memory allocating {nbytes} bytes", op="alloc")
    return <uintptr_t>ptr


def free(uintptr_t ptr):
    c_free(<void *>ptr)


def copy(uintptr_t dst, uintptr_t src, Py_ssize_t nbytes):
    """memcpy: the ranges must not overlap (every cpu copy is host to host)."""
    if nbytes < 0:
        raise InvalidArgument(f"nbytes must be >= 0, got {nbytes}", op="memcpy", argument="nbytes")
    with nogil:
        memcpy(<void *>dst, <const void *>src, <size_t>nbytes)
