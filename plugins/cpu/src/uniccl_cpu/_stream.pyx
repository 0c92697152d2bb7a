# cython: language_level=3
"""Streams and events (stream.c): one native worker thread per stream runs its
work in issue order without the GIL.

Stream methods check sizes but enqueue the dtype, op and divisor unchecked (the
hooks check them first): a failure on the worker is raised by the next
synchronize() or destroy().
"""
from libc.stdint cimport int64_t, uintptr_t

from uniccl_cpu._kernels cimport reduce_c, scale_c
from uniccl_cpu._status cimport UC_OK, check

from uniccl._errors import InternalError, InvalidArgument, InvalidUsage


cdef extern from "stream.h" nogil:
    ctypedef struct uc_stream
    ctypedef struct uc_event
    ctypedef int (*uc_reduce_fn)(void *, const void *, const void *, size_t, int, int) noexcept nogil
    ctypedef int (*uc_scale_fn)(void *, const void *, size_t, int, int64_t) noexcept nogil
    ctypedef struct uc_error:
        int status
        const char *task
        int dtype
        int64_t arg

    uc_stream *uc_stream_create()
    uc_error uc_stream_destroy(uc_stream *s)
    uc_error uc_stream_synchronize(uc_stream *s)
    int uc_stream_copy(uc_stream *s, void *dst, const void *src, size_t nbytes)
    int uc_stream_reduce(uc_stream *s, uc_reduce_fn fn, void *dst, const void *a, const void *b,
                         size_t n, int dtype, int op)
    int uc_stream_scale(uc_stream *s, uc_scale_fn fn, void *dst, const void *src, size_t n,
                        int dtype, int64_t divisor)
    int uc_stream_record(uc_stream *s, uc_event *e)
    int uc_stream_wait(uc_stream *s, uc_event *e)

    uc_event *uc_event_create()
    void uc_event_destroy(uc_event *e)
    void uc_event_record_now(uc_event *e)
    int uc_event_query(uc_event *e)
    void uc_event_synchronize(uc_event *e)


cdef inline size_t size_arg(Py_ssize_t n, str op, str name) except? 0:
    if n < 0:
        raise InvalidArgument(f"{name} must be >= 0, got {n}", op=op, argument=name)
    return <size_t>n


cdef int raise_async(uc_error err) except -1:
    if err.status != UC_OK:
        check(err.status, err.task.decode(), err.dtype, err.arg)
    return 0


cdef class Event:
    cdef uc_event *_e

    def __cinit__(self):
        self._e = uc_event_create()
        if self._e is NULL:
            raise InternalError("out of host memory", op="event_create")

    def __dealloc__(self):
        if self._e is not NULL:
            uc_event_destroy(self._e)

    cdef uc_event *live(self, str op) except NULL:
        if self._e is NULL:
            raise InvalidUsage("the event was destroyed", op=op)
        return self._e

    def record_now(self):
        """Record without a stream: complete at once (no work is pending)."""
        uc_event_record_now(self.live("event_record"))

    def query(self):
        return uc_event_query(self.live("event_query")) != 0

    def synchronize(self):
        cdef uc_event *e = self.live("event_synchronize")
        with nogil:
            uc_event_synchronize(e)

    def destroy(self):
        """Free the event; records and waits already enqueued still complete."""
        uc_event_destroy(self.live("event_destroy"))
        self._e = NULL


cdef class Stream:
    cdef uc_stream *_s

    def __cinit__(self):
        self._s = uc_stream_create()
        if self._s is NULL:
            raise InternalError("cannot start a stream worker thread", op="stream_create")

    def __dealloc__(self):
        # Never lose the worker: join it even when destroy() was not called.
        if self._s is not NULL:
            with nogil:
                uc_stream_destroy(self._s)

    cdef uc_stream *live(self, str op) except NULL:
        if self._s is NULL:
            raise InvalidUsage("the stream was destroyed", op=op)
        return self._s

    def copy(self, uintptr_t dst, uintptr_t src, Py_ssize_t nbytes):
        cdef uc_stream *s = self.live("memcpy")
        cdef size_t n = size_arg(nbytes, "memcpy", "nbytes")
        cdef int status
        with nogil:
            status = uc_stream_copy(s, <void *>dst, <const void *>src, n)
        check(status, "memcpy", -1, 0)

    def reduce(self, uintptr_t dst, uintptr_t a, uintptr_t b, Py_ssize_t count, int dtype, int op):
        cdef uc_stream *s = self.live("reduce")
        cdef size_t n = size_arg(count, "reduce", "count")
        cdef int status
        with nogil:
            status = uc_stream_reduce(s, reduce_c, <void *>dst, <const void *>a, <const void *>b,
                                      n, dtype, op)
        check(status, "reduce", dtype, op)

    def scale(self, uintptr_t dst, uintptr_t src, Py_ssize_t count, int dtype, int64_t divisor):
        cdef uc_stream *s = self.live("scale")
        cdef size_t n = size_arg(count, "scale", "count")
        cdef int status
        with nogil:
            status = uc_stream_scale(s, scale_c, <void *>dst, <const void *>src, n, dtype, divisor)
        check(status, "scale", dtype, divisor)

    def record(self, Event event not None):
        check(uc_stream_record(self.live("event_record"), event.live("event_record")),
              "event_record", -1, 0)

    def wait(self, Event event not None):
        check(uc_stream_wait(self.live("stream_wait_event"), event.live("stream_wait_event")),
              "stream_wait_event", -1, 0)

    def synchronize(self):
        cdef uc_stream *s = self.live("stream_synchronize")
        cdef uc_error err
        with nogil:
            err = uc_stream_synchronize(s)
        raise_async(err)

    def destroy(self):
        """Finish the pending work, join the worker and raise any unreported failure."""
        cdef uc_stream *s = self.live("stream_destroy")
        cdef uc_error err
        self._s = NULL
        with nogil:
            err = uc_stream_destroy(s)
        raise_async(err)
