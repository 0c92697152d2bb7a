# cython: language_level=3
# ShmEngine's C-level interface, for the compiled call path (uniccl.comm._fastpath), which
# calls the engine without Python objects in between.
from libc.stdint cimport int64_t, uintptr_t


cdef extern from "shm_engine.h" nogil:
    ctypedef struct uc_shm:
        pass


cdef class ShmEngine:
    cdef uc_shm *_e
    cdef readonly str name
    cdef readonly int rank
    cdef readonly int size
    cdef readonly bint creator
    cdef object __weakref__
    # Threads inside a call (counted under the GIL): close() refuses while any is, so that a
    # call's thread never reads a freed engine (its error, its trace) after another thread's
    # abort() closed it -- that was a SIGSEGV in abort's tests.
    cdef int _users

    cdef int agree_records(self, const int64_t *rec, int64_t *res) except -1
    cdef int agreed(self, const int64_t *rec, int64_t *res, int coll, uintptr_t send, uintptr_t recv, size_t n,
                    int dtype, int op, int root) except -1
    cdef _alone(self, int coll, str op, send, recv, n, str n_name, dtype, rop, root, str recv_name=*)
    cdef _records(self, header, out, str op)
    cdef uc_shm *_live(self, str op) except NULL
    cdef int _bad(self, str op, str message, str argument) except -1
    cdef uintptr_t _ptr(self, object x, str op, str arg) except? 0
    cdef size_t _count(self, object x, str op, str arg) except? 0
    cdef int _code(self, object x, str op, str arg) except? -1
    cdef int _raise(self, int rc) except -1
