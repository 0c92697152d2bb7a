# cython: language_level=3
# Telemetry's counters at C level, for the compiled call path (uniccl.comm._fastpath).
from libc.stdint cimport uint64_t


cdef enum:
    SUB = 2          # log2 of the histogram buckets per power of two
    BUCKETS = 64 << SUB


cdef class Stat:
    cdef public uint64_t calls, nbytes, ns
    cdef uint64_t hist[BUCKETS]
    cdef void add(self, uint64_t nbytes, uint64_t ns) noexcept


cdef class Counters:
    cdef public dict ops
    cdef public dict failed
    cdef public int size
    cdef Stat stat(self, str name, uint64_t nbytes)
