# Kernel entry points other Cython modules cimport (through the module's C-API
# table), so that streams use this module's single run-time dispatch.
from libc.stdint cimport int64_t


cdef int reduce_c(void *dst, const void *a, const void *b, size_t n, int dtype, int op) noexcept nogil
cdef int scale_c(void *dst, const void *src, size_t n, int dtype, int64_t divisor) noexcept nogil
