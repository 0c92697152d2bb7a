# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Telemetry's counters in C (see :mod:`uniccl.observability.telemetry`): recording a call is one method
call, a dict lookup and a few integer adds, well under half a microsecond."""
from libc.stdint cimport uint64_t

cdef inline int _bits(uint64_t x) nogil:
    return 0 if x == 0 else 64 - __builtin_clzll(x)


cdef extern from *:
    int __builtin_clzll(unsigned long long) nogil


cdef class Stat:
    """One (operation, size bucket): calls, bytes, nanoseconds, latency histogram (fields: .pxd)."""

    def __cinit__(self):
        cdef int i
        for i in range(BUCKETS):
            self.hist[i] = 0

    cdef void add(self, uint64_t nbytes, uint64_t ns) noexcept:
        cdef int b = _bits(ns)
        self.calls += 1
        self.nbytes += nbytes
        self.ns += ns
        if b > 3:
            self.hist[(b << SUB) | ((ns >> (b - 3)) & 3)] += 1
        else:
            self.hist[ns] += 1

    def histogram(self) -> list:
        return [self.hist[i] for i in range(BUCKETS)]


cdef class Counters:
    """One communicator's counters: ``ops[(op, size bucket)] -> Stat``, ``failed[op] -> calls``."""

    def __init__(self, int size):
        self.ops = {}
        self.failed = {}
        self.size = size

    cdef Stat stat(self, str name, uint64_t nbytes):
        """The Stat of ``name`` at this size bucket (made on first use)."""
        key = (name, _bits(nbytes))
        cdef Stat s = self.ops.get(key)
        if s is None:
            s = Stat()
            self.ops[key] = s
        return s

    def record(self, str name, uint64_t nbytes, long long ns):
        self.stat(name, nbytes).add(nbytes, <uint64_t>(ns if ns > 0 else 0))

    def failure(self, str name):
        self.failed[name] = self.failed.get(name, 0) + 1
