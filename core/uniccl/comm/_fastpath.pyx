# cython: language_level=3, boundscheck=False, wraparound=False
"""The compiled steady-state call path: a call whose shape matches the communicator's last
call of that shape goes from the public method to the engine in one compiled function.

The first call of a shape runs the general path (:mod:`.plans`, :mod:`.agreement`,
``Communicator._execute``); once it succeeded, :meth:`FastPath.learn_all_reduce` keeps what
that path derived from the arguments (dtype code, count, kernel op, the tuner's choice, the
telemetry bucket).  A later call is served here when the same checks would pass for the same
reasons -- exact numpy arrays with the same addresses, element counts, dtypes and flags, the
same op object -- and the communicator is in the state the general path took its route in
(no group open, no async work queued, no tracing, the default timeout, not destroyed, not a
forked child).  Anything else returns :data:`MISS` and the caller takes the general path.

Calls on device buffers that the vendor library runs (the native path; a Shape learnt with
the library's ``c_entry``) are served the same way: the buffers matched by their CUDA Array
Interface, the record agreed through the engine (alone, as the general path does before a
vendor call), then the library's C function called by address, without ctypes.

What stays on: the cross-rank record (it rides on the data in the engine's agreed call, as
on the general path), the flight recorder's row (a C ring the recorder reads with its own entries;
the caller's code and instruction, its line found at a dump), the
telemetry counters (the same ``Stat``), the communicator's call number and lock.  A mismatch
or a failure is handed back to the general path's Python (``agreement.judge``,
``outcome.failed``), which names the call, the rank and the cause exactly as before.
"""
cimport numpy as cnp
from cpython.exc cimport PyErr_CheckSignals
from cpython.pythread cimport (
    NOWAIT_LOCK,
    PyThread_acquire_lock,
    PyThread_allocate_lock,
    PyThread_free_lock,
    PyThread_get_thread_ident,
    PyThread_release_lock,
    PyThread_type_lock,
)
from cpython.ref cimport PyObject, Py_XDECREF, Py_XINCREF
from libc.stdint cimport int64_t, uint64_t, uintptr_t
from libc.stdlib cimport calloc, free

from uniccl.observability._counters cimport Counters, Stat
from uniccl.transport.shm._shm cimport ShmEngine

import copy
import os

from uniccl._errors import InvalidUsage, UnicclError
from uniccl._types import ReduceOp
from uniccl.comm import agreement as _agreement
from uniccl.comm import native as _routes
from uniccl.comm import outcome as _outcome
from uniccl.comm import plans as _plans
from uniccl.observability import flight as _fl
from uniccl.transport import record as _record

cnp.import_array()

cdef extern from "pythread.h":
    ctypedef enum PyLockStatus:
        PY_LOCK_FAILURE
        PY_LOCK_ACQUIRED
        PY_LOCK_INTR
    PyLockStatus PyThread_acquire_lock_timed(PyThread_type_lock, long long microseconds, int intr_flag) nogil

cdef extern from "Python.h":
    ctypedef struct PyFrameObject:
        pass
    PyFrameObject *PyEval_GetFrame()  # borrowed: the user's frame (a compiled method has none)
    object PyFrame_GetCode(PyFrameObject *)  # new reference
    int PyFrame_GetLasti(PyFrameObject *)

MISS = object()  #: "not served here: take the general path"

# the record's fields (transport.record) and the flight recorder's (observability.flight)
cdef int R_ERR = _record.ERR, R_COLL = _record.COLL, R_DTYPE = _record.DTYPE, R_COUNT = _record.COUNT
cdef int R_OP = _record.OP, R_ROOT = _record.ROOT, R_NATIVE = _record.NATIVE, R_DEVRED = _record.DEVRED
cdef int R_WORDS = _record.RECORD_WORDS
cdef int COLL_ALL_REDUCE = _record.COLLECTIVES.index("all_reduce")
cdef Py_ssize_t F_SEQ = _fl.SEQ, F_DTYPE = _fl.DTYPE, F_COUNT = _fl.COUNT, F_ROOT = _fl.ROOT
cdef Py_ssize_t F_PATH = _fl.PATH, F_STATE = _fl.STATE, F_T_ENQ = _fl.T_ENQ, F_T_START = _fl.T_START
cdef Py_ssize_t F_T_END = _fl.T_END, F_CODE = _fl.CODE, F_LASTI = _fl.LASTI, F_FIELDS = len(_fl.FIELDS)
cdef object S_ENQUEUED = "enqueued", S_STARTED = "started", S_COMPLETED = "completed", EMPTY = ""

# A forked child must not use its parent's communicator (Communicator._owned says so): a
# counter bumped in every child replaces a getpid() per call.
cdef long _fork_generation = 0


def _forked():
    global _fork_generation
    _fork_generation += 1


# ``with uniccl.group():`` blocks open in any thread (comm/group.py enters and leaves them here):
# a call inside one is recorded by the general path, never served.  A C counter, changed with the
# GIL held, so that _ready reads no module dict and no two threads lose an update.
cdef long _groups_open = 0


def group_entered():
    global _groups_open
    _groups_open += 1


def group_left():
    global _groups_open
    _groups_open -= 1


def groups_open():
    """How many group blocks are open, in all threads."""
    return _groups_open


cdef bint _in_group():
    """A group block is open in this thread (comm/group.py imports this module: imported here late)."""
    from uniccl.comm import group
    return group.current() is not None


os.register_at_fork(after_in_child=_forked)


cdef extern from "call_clock.h":  # two readings a call: the TSC where the kernel keeps time by it
    void uc_clock_init()
    uint64_t uc_clock_ticks()
    double uc_clock_wall(uint64_t t)
    uint64_t uc_clock_ns(uint64_t t0, uint64_t t1)

uc_clock_init()


cdef inline bint _array_matches(object a, uintptr_t ptr, Py_ssize_t count, int typenum, bint writable):
    cdef cnp.ndarray arr = <cnp.ndarray>a
    return (<uintptr_t>cnp.PyArray_DATA(arr) == ptr and cnp.PyArray_SIZE(arr) == count
            and cnp.PyArray_TYPE(arr) == typenum and cnp.PyArray_IS_C_CONTIGUOUS(arr)
            and cnp.PyArray_ISNOTSWAPPED(arr) and (not writable or cnp.PyArray_ISWRITEABLE(arr)))

DEF MAX_ARGS = 4

# NCCL's collective signatures (kit._ccl.SIGNATURES): int status (send, recv, count,
# datatype, [op or root], [root], comm, stream)
ctypedef int (*ccl_call7)(const void *, void *, size_t, int, int, void *, void *) noexcept nogil
ctypedef int (*ccl_call8)(const void *, void *, size_t, int, int, int, void *, void *) noexcept nogil
ctypedef int (*ccl_call6)(const void *, void *, size_t, int, void *, void *) noexcept nogil


cdef struct Row:
    int64_t seq, dtype, count, root
    double t_enq, t_end
    int state  # 0 none (or moved to the recorder's deque), 1 started, 2 completed
    int lasti
    PyObject *name  # the collective's name; these three hold a reference
    PyObject *code  # the caller's code object
    PyObject *path  # the tuner's choice


cdef class Ring:
    """The flight recorder's rows of the calls served here, as C structs in a fixed ring (an
    entry list per call was most of what the instruments cost): the recorder merges them with
    its own entries when it is read (FlightRecorder.all), so a dump shows every call alike.
    Read and written under the GIL: a call waiting in the engine has its row "started"."""
    cdef Row *rows
    cdef Py_ssize_t cap, head  # head: rows ever written (the next goes to head % cap)

    def __cinit__(self, Py_ssize_t cap):
        self.cap, self.head = max(1, cap), 0
        self.rows = <Row *>calloc(self.cap, sizeof(Row))
        if self.rows == NULL:
            raise MemoryError()

    def __dealloc__(self):
        cdef Py_ssize_t i
        if self.rows != NULL:
            for i in range(self.cap):
                _clear(&self.rows[i])
            free(self.rows)

    cdef Row *next(self, str name, double t) except NULL:
        cdef Row *r = &self.rows[self.head % self.cap]
        cdef PyFrameObject *caller = PyEval_GetFrame()
        _clear(r)
        self.head += 1
        r.seq, r.dtype, r.count, r.root, r.t_enq, r.t_end, r.state, r.lasti = -1, -1, -1, -1, t, 0, 1, 0
        r.name = <PyObject *>name
        Py_XINCREF(r.name)
        if caller != NULL:
            code = PyFrame_GetCode(caller)
            r.code = <PyObject *>code
            Py_XINCREF(r.code)
            r.lasti = PyFrame_GetLasti(caller)
        return r

    cdef list take(self, Row *r):
        """Row ``r`` as an entry list, no longer a row (it goes to the recorder's deque)."""
        entry = _entry(r)
        _clear(r)
        return entry

    def entries(self) -> list:
        """The rows, oldest first, as the recorder's entry lists."""
        cdef Py_ssize_t i, n = min(self.head, self.cap)
        out = []
        for i in range(self.head - n, self.head):
            if self.rows[i % self.cap].state:
                out.append(_entry(&self.rows[i % self.cap]))
        return out

    def newest(self):
        cdef Py_ssize_t i, n = min(self.head, self.cap)
        for i in range(self.head - 1, self.head - n - 1, -1):
            if self.rows[i % self.cap].state:
                return _entry(&self.rows[i % self.cap])
        return None


cdef inline void _clear(Row *r) noexcept:
    Py_XDECREF(r.name)
    Py_XDECREF(r.code)
    Py_XDECREF(r.path)
    r.name = r.code = r.path = NULL
    r.state = 0


cdef inline void _set_path(Row *r, object path) noexcept:
    Py_XINCREF(<PyObject *>path)
    Py_XDECREF(r.path)
    r.path = <PyObject *>path


cdef list _entry(Row *r):
    entry = [None] * F_FIELDS
    entry[1] = <object>r.name if r.name != NULL else None
    if r.seq >= 0:
        entry[F_SEQ], entry[F_DTYPE], entry[F_COUNT], entry[F_ROOT] = r.seq, r.dtype, r.count, r.root
        entry[F_T_START] = r.t_enq
    entry[F_PATH] = <object>r.path if r.path != NULL else EMPTY
    entry[F_STATE] = S_COMPLETED if r.state == 2 else S_STARTED if r.seq >= 0 else S_ENQUEUED
    entry[F_T_ENQ] = r.t_enq
    if r.state == 2:
        entry[F_T_END] = r.t_end
    if r.code != NULL:
        entry[F_CODE], entry[F_LASTI] = <object>r.code, r.lasti
    return entry


cdef class CallState:
    """A communicator's per-call state as C fields, so that the compiled path reads and writes
    them without a dictionary lookup (``Communicator._seq``, ``_in_data`` and ``_destroyed``
    are properties over these)."""
    cdef public long long seq  # the next call's number
    cdef public bint in_data  # the running call is past its agreement
    cdef public bint destroyed
    cdef public bint revoked  # every call raises Revoked (Communicator.revoke, here or on a peer)
    cdef public bint hooked  # the communicator has hooks (Communicator.add_hook): the general path
    # what else sends a call down the general path, kept here so that the compiled path's
    # readiness check reads C fields, not a Python attribute each (Communicator keeps them)
    cdef public bint traced  # UNICCL_TRACE: a tracer is attached
    cdef public bint timeout_stale  # comm.timeout differs from what the transports were told
    cdef public int pending  # async calls queued or running on the executor


cdef class CallLock:
    """A reentrant lock (``threading.RLock``'s semantics, used with ``with``) that compiled
    code takes and releases with a few C calls: the communicator's lock, taken on every call.
    Every take and give holds the GIL, so the owner and depth fields are the lock itself and an
    uncontended take is two field writes (a PyThread lock's acquire read the monotonic clock and
    made a semaphore call each time, a tenth of an 8-byte call).  The semaphore ``gate`` only
    wakes a thread that found the lock held: it blocks there with the GIL released, can be
    interrupted by a signal (Ctrl-C), and looks again at least every 50 ms."""
    cdef PyThread_type_lock gate  # locked unless a wake-up is pending for a waiter
    cdef unsigned long owner
    cdef long depth
    cdef int waiters
    cdef bint woken  # the gate was released for a waiter that has not yet taken it

    def __cinit__(self):
        self.gate = PyThread_allocate_lock()
        if self.gate == NULL:
            raise MemoryError()
        PyThread_acquire_lock(self.gate, NOWAIT_LOCK)
        self.owner, self.depth, self.waiters, self.woken = 0, 0, 0, False

    def __dealloc__(self):
        if self.gate != NULL:
            if not self.woken:
                PyThread_release_lock(self.gate)  # freed unlocked
            PyThread_free_lock(self.gate)

    cdef int take(self) except -1:
        cdef unsigned long me = PyThread_get_thread_ident()
        if self.depth:
            if self.owner == me:
                self.depth += 1
                return 0
            self._wait(me)
        self.owner, self.depth = me, 1
        return 0

    cdef int _wait(self, unsigned long me) except -1:
        """Until no other thread holds the lock (the GIL held on return)."""
        cdef PyLockStatus got
        self.waiters += 1
        try:
            while self.depth:
                with nogil:
                    got = PyThread_acquire_lock_timed(self.gate, 50000, 1)
                if got == PY_LOCK_ACQUIRED:
                    self.woken = False
                elif got == PY_LOCK_INTR:
                    PyErr_CheckSignals()  # raises the handler's exception (KeyboardInterrupt)
        finally:
            self.waiters -= 1
        return 0

    cdef int give(self) except -1:
        if not self.depth or self.owner != PyThread_get_thread_ident():
            raise RuntimeError("cannot release un-acquired lock")
        self.depth -= 1
        if not self.depth:
            self.owner = 0
            if self.waiters and not self.woken:
                self.woken = True
                PyThread_release_lock(self.gate)
        return 0

    def acquire(self):
        self.take()
        return True

    def release(self):
        self.give()

    def __enter__(self):
        self.take()
        return True

    def __exit__(self, *exc):
        self.give()


cdef class Shape:
    """A learnt call of a collective other than all_reduce (or a persistent call of any): its
    arguments as the general path saw them (arrays by address, count, type, flags and identity
    relations; the others by identity, ints by value) and the checked plan it built.  The plan's buffer views keep
    those arrays alive, so an array at the same address is the same memory."""
    cdef int n
    # 0 None, 1 numpy array, 2 anything else, 3 a device buffer (its CUDA Array Interface in scalars)
    cdef int kind[MAX_ARGS]
    cdef uintptr_t ptr[MAX_ARGS]
    cdef Py_ssize_t size[MAX_ARGS]
    cdef int typenum[MAX_ARGS]
    cdef bint writeable[MAX_ARGS]
    cdef bint same01  # args 0 and 1 were one object
    cdef list scalars
    cdef list types  # a device buffer's type
    cdef int result_index  # which argument the call returns (-1: None)
    cdef object plan, choice
    cdef int64_t coll, dtype, count, op, root  # the record's fields
    cdef uint64_t nbytes
    cdef Stat stat
    # the plan's engine call (ShmEngine.agreed's arguments), unless it has none (barrier)
    cdef bint has_engine
    cdef uintptr_t e_send, e_recv
    cdef size_t e_n
    cdef int e_dtype, e_op, e_root
    cdef bint declined  # it matches, but cannot be served: a call of it takes the general path as is
    cdef bint returned  # the call returned something: one of its arguments (result_index says which)
    # the native path's library call (device buffers): its arity (6, 7, 8), address, arguments
    cdef bint native
    cdef int n_arity, n_dtype, n_a, n_b  # n_a: the op (the root for broadcast), n_b: reduce's root
    cdef uintptr_t n_fn, n_send, n_recv, n_comm, n_stream
    cdef size_t n_count
    cdef int64_t native_id  # the record's R_NATIVE
    cdef object n_check, n_sync, planner  # check(status, rank); the backend's stream_synchronize, or None


cdef inline bint _same_scalar(object a, object b):
    return a is b or (type(a) is int and type(b) is int and a == b)


cdef bint _matches(Shape sh, tuple args):
    cdef int i
    cdef cnp.ndarray arr
    if len(args) != sh.n + 1:
        return False
    for i in range(sh.n):
        a = args[i + 1]
        if sh.kind[i] == 0:
            if a is not None:
                return False
        elif sh.kind[i] == 3:
            if type(a) is not sh.types[i]:
                return False
            try:
                if a.__cuda_array_interface__ != sh.scalars[i]:
                    return False
            except Exception:
                return False  # the general path says why
        elif sh.kind[i] == 1:
            if type(a) is not cnp.ndarray:
                return False
            arr = <cnp.ndarray>a
            if not (<uintptr_t>cnp.PyArray_DATA(arr) == sh.ptr[i] and cnp.PyArray_SIZE(arr) == sh.size[i]
                    and cnp.PyArray_TYPE(arr) == sh.typenum[i] and cnp.PyArray_IS_C_CONTIGUOUS(arr)
                    and cnp.PyArray_ISNOTSWAPPED(arr) and cnp.PyArray_ISWRITEABLE(arr) == sh.writeable[i]):
                return False
        elif not _same_scalar(a, sh.scalars[i]):
            return False
    if sh.n >= 2 and (args[1] is args[2]) != sh.same01:
        return False
    return True


cdef class FastPath:
    """One communicator's compiled call path (made by the communicator when it has a
    shared-memory engine; see the module doc)."""

    cdef object comm, executor, entries_append, tuner
    cdef Ring ring  # the flight recorder's rows of the calls served here (None: recorder off)
    cdef bint recording
    cdef CallLock lock  # the communicator's
    cdef CallState state  # the communicator's
    cdef ShmEngine engine
    cdef Counters telemetry
    cdef cnp.ndarray hdr_arr, hdrs_arr
    cdef int64_t *hdr
    cdef int64_t *hdrs
    cdef long fork_generation
    cdef int rank
    cdef readonly unsigned long long served  # calls served here (tests, benchmarks)
    cdef bint counting, checking  # telemetry, and the record on the data (benchmarks switch them: _instruments)
    # the all_reduce shape last learnt
    cdef bint ar_known, ar_inplace
    cdef object ar_op, ar_choice
    cdef uintptr_t ar_send, ar_recv
    cdef Py_ssize_t ar_scount, ar_rcount
    cdef int ar_stype, ar_rtype, ar_dtype, ar_kop
    cdef int64_t ar_op_code
    cdef size_t ar_count
    cdef uint64_t ar_nbytes
    cdef Stat ar_stat
    cdef dict shapes  # collective name -> its learnt Shape

    def __init__(self, comm):
        self.comm = comm
        self.engine = comm._engine
        self.lock, self.state = comm._lock, comm._state
        self.executor = comm._executor
        self.tuner = comm._tuner
        self.telemetry = comm._telemetry
        fl = comm._flight
        self.ring = Ring(fl.entries.maxlen) if fl.enabled else None
        fl.compiled = self.ring
        self.counting = self.checking = self.recording = True
        self.entries_append = fl.entries.append
        self.hdr_arr, self.hdrs_arr = comm._hdr, comm._hdrs
        if self.hdr_arr.dtype != "int64" or self.hdr_arr.size != R_WORDS:
            raise ValueError("the communicator's record is not int64[RECORD_WORDS]")
        if self.hdrs_arr.dtype != "int64" or self.hdrs_arr.size != R_WORDS * comm.size:
            raise ValueError("the communicator's records are not int64[size, RECORD_WORDS]")
        self.hdr = <int64_t *>cnp.PyArray_DATA(self.hdr_arr)
        self.hdrs = <int64_t *>cnp.PyArray_DATA(self.hdrs_arr)
        self.fork_generation = _fork_generation
        self.rank = comm.rank
        self.ar_known = False
        self.served = 0
        self.shapes = {}

    cdef bint _ready(self, object comm):
        """The communicator is in the state the general path took its route in."""
        cdef CallState st = self.state
        return not (st.destroyed or st.revoked or st.hooked or st.traced or st.timeout_stale or st.pending
                    or _fork_generation != self.fork_generation or _groups_open)

    # ------------------------------------------------------------------ all_reduce
    def learn_all_reduce(self, sendbuf, recvbuf, op):
        """After the general path ran this all_reduce: keep its shape if a later call of the
        same shape may be served here (exact numpy arrays, an op other than AVG, the tuner's
        choice the shared-memory engine).  Never raises: the call itself succeeded.  A call
        queued in an open group has not run (its checks come at the group's end): nothing is
        learnt from it.  The shape kept is the one the planner checked in full."""
        cdef cnp.ndarray s, r
        if _groups_open:
            return  # (the shape learnt before stays: it came from a call that ran)
        self.ar_known = False  # first: a call in another thread meanwhile misses (_all_reduce)
        comm = self.comm
        if (type(sendbuf) is not cnp.ndarray or comm._hier is not None or comm._faults is not None
                or self.engine is None):
            return
        inplace = recvbuf is None or recvbuf is sendbuf
        if not inplace and type(recvbuf) is not cnp.ndarray:
            return
        try:
            plan = _plans.all_reduce(comm, sendbuf, recvbuf, op)  # every check of the call's
        except UnicclError:
            return
        if plan.engine is None:
            return  # AVG: more than the one engine call
        choice = self.tuner.choose("all_reduce", plan.nbytes)
        if choice.transport != "shm":
            return
        s = <cnp.ndarray>sendbuf
        r = s if inplace else <cnp.ndarray>recvbuf
        self.ar_inplace = inplace
        self.ar_op, self.ar_choice = op, choice
        self.ar_send, self.ar_recv = <uintptr_t>cnp.PyArray_DATA(s), <uintptr_t>cnp.PyArray_DATA(r)
        self.ar_scount, self.ar_rcount = cnp.PyArray_SIZE(s), cnp.PyArray_SIZE(r)
        self.ar_stype, self.ar_rtype = cnp.PyArray_TYPE(s), cnp.PyArray_TYPE(r)
        _, _, self.ar_count, self.ar_dtype, self.ar_kop, _ = plan.engine
        self.ar_nbytes, self.ar_op_code = plan.nbytes, int(plan.op)
        self.ar_stat = self.telemetry.stat("all_reduce", plan.nbytes) if self.telemetry is not None else None
        self.ar_known = True  # last

    cdef object _all_reduce(self, sendbuf, recvbuf, op):
        """``Communicator.all_reduce(sendbuf, recvbuf, op)`` of a learnt shape, or :data:`MISS`."""
        if not self.ar_known or op is not self.ar_op or type(sendbuf) is not cnp.ndarray:
            return MISS
        inplace = recvbuf is None or recvbuf is sendbuf
        if inplace != self.ar_inplace:
            return MISS
        if not _array_matches(sendbuf, self.ar_send, self.ar_scount, self.ar_stype, inplace):
            return MISS
        if not inplace and (type(recvbuf) is not cnp.ndarray
                            or not _array_matches(recvbuf, self.ar_recv, self.ar_rcount, self.ar_rtype, True)):
            return MISS
        comm = self.comm
        if not self._ready(comm):
            return MISS
        # The shape as matched, taken before anything can let another thread run (the lock's
        # wait, the engine's call): a learning there rewrites the fields for its own buffers.
        cdef uintptr_t send_p = self.ar_send, recv_p = self.ar_recv
        cdef size_t count = self.ar_count
        cdef int dtype = self.ar_dtype, kop = self.ar_kop
        cdef int64_t op_code = self.ar_op_code
        cdef uint64_t nbytes = self.ar_nbytes
        choice, stat = self.ar_choice, self.ar_stat
        result = sendbuf if recvbuf is None else recvbuf
        cdef uint64_t t0 = uc_clock_ticks()  # one reading for the flight recorder and telemetry
        cdef Row *row = self._enqueue("all_reduce", t0)
        cdef int64_t *h = self.hdr
        cdef int64_t seq
        self.lock.take()
        try:
            seq = self._start(comm, "all_reduce", row, dtype, <int64_t>count, -1)
            if row != NULL:
                _set_path(row, choice)
            h[R_ERR], h[R_COLL], h[R_DTYPE], h[R_COUNT] = 0, COLL_ALL_REDUCE, dtype, <int64_t>count
            h[R_OP], h[R_ROOT], h[R_NATIVE], h[R_DEVRED] = op_code, -1, 0, 0
            self.state.in_data = True
            try:
                if not self.engine.agreed(h if self.checking else NULL, self.hdrs, COLL_ALL_REDUCE, send_p,
                                          recv_p, count, dtype, kop, -1):
                    self._mismatched(sendbuf, recvbuf, op, seq)
            except UnicclError as exc:
                self._failed(sendbuf, recvbuf, op, self._moved(row), seq, exc)
            self._completed(row, <Stat>stat, nbytes, t0)
        finally:
            self.lock.give()
        self.served += 1
        return result

    # ------------------------------------------------------- the other collectives
    cdef object call(self, str name, planner, tuple args):
        """``name`` with the builder's ``args`` (the communicator first): served when it matches
        the shape last learnt for ``name``, else the general path, after which it is learnt."""
        cdef Shape sh = self.shapes.get(name)
        comm = self.comm
        if sh is not None and _matches(sh, args) and self._ready(comm):
            if sh.declined:
                return comm._call(name, planner, args, False, None, 1)
            return self._run(sh, name, args)
        result = comm._call(name, planner, args, False, None, 1)
        if _groups_open:
            return result  # queued in a group, not run yet: nothing learnt (the shape learnt before stays)
        self.shapes.pop(name, None)
        sh = self.shape(name, planner, args, result)
        if sh is not None:
            self.shapes[name] = sh
        return result

    cdef Shape shape(self, str name, planner, tuple args, result):
        """The shape of a call of ``name`` with these arguments that returned ``result`` (the
        general path ran it, or agreed on it); None when its arguments cannot be matched here.
        A shape that matches but cannot be served is ``declined``: a call of it takes the general
        path without being planned again to be learnt."""
        cdef Shape sh = Shape.__new__(Shape)
        comm = self.comm
        if comm._hier is not None or comm._faults is not None or len(args) - 1 > MAX_ARGS:
            return None
        if not self._arguments(sh, args, result):
            return None
        try:
            sh.declined = self._served(sh, name, planner, args) is None
        except Exception:  # (a buffer's interface may raise anything)
            return None  # its buffers changed since the call (another thread): learnt at a later call
        return sh

    cdef bint _arguments(self, Shape sh, tuple args, result):
        """``sh``'s arguments, as ``_matches`` compares them; False for a kind it cannot match."""
        cdef cnp.ndarray arr
        cdef int i
        sh.n = len(args) - 1
        sh.scalars, sh.types = [None] * sh.n, [None] * sh.n
        sh.result_index = -1
        sh.native = False
        sh.returned = result is not None
        for i in range(sh.n):
            a = args[i + 1]
            if a is None:
                sh.kind[i] = 0
            elif type(a) is cnp.ndarray:
                arr = <cnp.ndarray>a
                sh.kind[i] = 1
                sh.ptr[i], sh.size[i] = <uintptr_t>cnp.PyArray_DATA(arr), cnp.PyArray_SIZE(arr)
                sh.typenum[i], sh.writeable[i] = cnp.PyArray_TYPE(arr), cnp.PyArray_ISWRITEABLE(arr)
            elif isinstance(a, (int, str, float)):  # (ReduceOp is an int)
                sh.kind[i] = 2  # an op, a root, a flag: immutable, compared by identity or value
                sh.scalars[i] = a
            elif getattr(a, "is_cuda", None) is False:
                return False  # a host tensor: asking for the interface would raise, costing more
            else:
                try:
                    cai = a.__cuda_array_interface__
                except Exception:
                    return False  # another buffer kind (bytearray, DLPack only): the general path only
                if type(cai) is not dict:
                    return False
                sh.kind[i], sh.types[i], sh.scalars[i] = 3, type(a), copy.deepcopy(cai)
                sh.native = True
            if result is not None and result is a and sh.result_index < 0:
                sh.result_index = i + 1
        sh.same01 = sh.n >= 2 and args[1] is args[2]
        return True

    cdef Shape _served(self, Shape sh, str name, planner, tuple args):
        """``sh`` (its arguments filled in) completed with the plan it runs, or None when it
        cannot be served here."""
        if sh.result_index < 0 and sh.returned:
            return None
        if sh.native:
            return self._native_shape(sh, name, planner, args)
        if self.engine is None:
            return None  # (a FastPath of the native path alone: one rank)
        plan = planner(*args)  # the same checks as the call that just succeeded
        if plan.error is not None or plan.staged is not None or plan.p2p:
            return None
        sh.has_engine = plan.engine is not None
        if sh.has_engine:
            sh.choice = self.tuner.choose(name, plan.nbytes)
            if sh.choice.transport != "shm":
                return None
            sh.e_send, sh.e_recv, sh.e_n, sh.e_dtype, sh.e_op, sh.e_root = plan.engine
        elif plan.run is not None:
            return None  # more than one engine call (AVG, an in-place all_to_all): the general path
        sh.plan = plan
        return self._described(sh, name, plan)

    cdef Shape _described(self, Shape sh, str name, plan):
        """``sh`` with the record's fields and the telemetry bucket of ``plan``'s call."""
        sh.coll = _record.COLLECTIVES.index(name)
        sh.dtype, sh.count = plan.dtype, plan.count
        sh.op, sh.root = int(plan.op), plan.root
        sh.nbytes = plan.nbytes
        sh.stat = self.telemetry.stat(name, plan.nbytes) if self.telemetry is not None else None
        return sh

    cdef Shape _native_shape(self, Shape sh, str name, planner, tuple args):
        """``sh`` (its arguments filled in, one a device buffer) as a call of the vendor
        library's C function, or None when the native path would not run it so."""
        comm = self.comm
        native = comm._native
        if comm._native_comm is None or (self.engine is None and comm.size > 1):
            return None  # no library communicator, or no engine for the record (TCP, MPI)
        c_entry = getattr(native, "c_entry", None)
        if c_entry is None:
            return None
        plan = _routes.staged_plan(comm, planner, args)  # the same checks (and pointer claims) as the call's
        if plan.error is not None or not plan.staged or plan.p2p:
            return None
        n = _routes.native_path(comm, plan)
        got = c_entry(name, plan.dtype, plan.op if plan.op >= 0 else 0) if n is not None else None
        if got is None:
            return None
        address, vdtype, vop, check = got
        sh.native, sh.has_engine, sh.plan, sh.planner = True, False, plan, planner
        sh.n_fn, sh.n_dtype, sh.n_check = address, vdtype, check
        sh.n_arity = 8 if name == "reduce" else 6 if name == "all_gather" else 7
        sh.n_a = n["root"] if name == "broadcast" else vop
        sh.n_b = n["root"]
        sh.n_send, sh.n_recv, sh.n_count = n["send"], n["recv"], n["count"]
        sh.n_comm, sh.n_stream = comm._native_comm, n["stream"] or 0
        sh.n_sync = comm._backend.stream_synchronize if n["stream"] is None else None
        sh.native_id = comm._native_id
        sh.choice = f"native:{native.name}"
        return self._described(sh, name, plan)

    cdef object _run_native(self, Shape sh, str name, tuple args):
        """What the general path does for a native call (``native.route`` to ``run_native``):
        the record agreed through the engine (more than one rank), then the library's
        function by address; a differing record goes to ``native.after_mismatch``."""
        comm = self.comm
        cdef uint64_t t0 = uc_clock_ticks()
        cdef Row *row = self._enqueue(name, t0)
        cdef int64_t *h = self.hdr
        cdef int64_t seq
        cdef int rc = 0
        cdef bint same = True
        cdef void *comm_h = <void *>sh.n_comm
        cdef void *stream = <void *>sh.n_stream
        result = None if sh.result_index < 0 else args[sh.result_index]
        self.lock.take()
        try:
            seq = self._start(comm, name, row, sh.dtype, sh.count, sh.root)
            if row != NULL:
                _set_path(row, sh.choice)
            h[R_ERR], h[R_COLL], h[R_DTYPE], h[R_COUNT] = 0, sh.coll, sh.dtype, sh.count
            h[R_OP], h[R_ROOT], h[R_NATIVE], h[R_DEVRED] = sh.op, sh.root, sh.native_id, 0
            try:
                if self.engine is not None:
                    same = self.engine.agree_records(h, self.hdrs) == 1
                self.state.in_data = True
                if not same:
                    result = _routes.after_mismatch(comm, name, sh.planner, args, seq)
                else:
                    with nogil:
                        if sh.n_arity == 7:
                            rc = (<ccl_call7>sh.n_fn)(<const void *>sh.n_send, <void *>sh.n_recv, sh.n_count,
                                                      sh.n_dtype, sh.n_a, comm_h, stream)
                        elif sh.n_arity == 8:
                            rc = (<ccl_call8>sh.n_fn)(<const void *>sh.n_send, <void *>sh.n_recv, sh.n_count,
                                                      sh.n_dtype, sh.n_a, sh.n_b, comm_h, stream)
                        else:
                            rc = (<ccl_call6>sh.n_fn)(<const void *>sh.n_send, <void *>sh.n_recv, sh.n_count,
                                                      sh.n_dtype, comm_h, stream)
                    if rc != 0:
                        sh.n_check(rc, self.rank)  # raises the status's typed error
                    if sh.n_sync is not None:  # no stream given: done on return, like the host path
                        sh.n_sync(None)
            except UnicclError as exc:
                self._raise_failed(name, sh.plan, row, seq, exc)
            self._completed(row, sh.stat, sh.nbytes, t0)
        finally:
            self.lock.give()
        self.served += 1
        return result

    cdef object _run(self, Shape sh, str name, tuple args):
        """What ``Communicator._execute`` does for this plan on the engine (the agreed engine
        call, or the agreement alone for a barrier), without making a plan."""
        if sh.native:
            return self._run_native(sh, name, args)
        comm = self.comm
        plan = sh.plan
        cdef uint64_t t0 = uc_clock_ticks()  # one reading for the flight recorder and telemetry
        cdef Row *row = self._enqueue(name, t0)
        cdef int64_t *h = self.hdr
        cdef int64_t seq
        self.lock.take()
        try:
            seq = self._start(comm, name, row, sh.dtype, sh.count, sh.root)
            h[R_ERR], h[R_COLL], h[R_DTYPE], h[R_COUNT] = 0, sh.coll, sh.dtype, sh.count
            h[R_OP], h[R_ROOT], h[R_NATIVE], h[R_DEVRED] = sh.op, sh.root, 0, 0
            try:
                if not sh.has_engine:
                    if not self.engine.agree_records(h, self.hdrs):
                        _agreement.judge(comm, plan, seq, None)  # raises, or the difference is allowed
                else:
                    if row != NULL:
                        _set_path(row, sh.choice)
                    self.state.in_data = True
                    if not self.engine.agreed(h if self.checking else NULL, self.hdrs, <int>sh.coll, sh.e_send,
                                              sh.e_recv, sh.e_n, sh.e_dtype, sh.e_op, sh.e_root):
                        self.state.in_data = False  # nothing moved: every rank judges the same records
                        _agreement.judge(comm, plan, seq, None)  # raises, or the difference is allowed
                        self.state.in_data = True
                        plan.shm(self.engine)
            except UnicclError as exc:
                self._raise_failed(name, plan, row, seq, exc)
            self._completed(row, sh.stat, sh.nbytes, t0)
        finally:
            self.lock.give()
        self.served += 1
        return None if sh.result_index < 0 else args[sh.result_index]

    def _instruments(self, telemetry=True, flight=True, check=True, arrivals=True):
        """Benchmarks only (benchmarks/instruments_cost.py, the placebo method): serve calls
        without telemetry, the flight recorder's entry, the record on the data (a mismatch
        would then go unseen: never in a program) or the engine's arrival counts."""
        self.counting, self.checking, self.recording = bool(telemetry), bool(check), bool(flight)
        if self.engine is not None:
            self.engine._count_arrivals(arrivals)

    # ---------------------------------------------------------------- helpers
    cdef int64_t _start(self, comm, str name, Row *row, int64_t dtype, int64_t count, int64_t root) except -1:
        """Under the lock: the call's number taken, its flight recorder entry started."""
        cdef CallState st = self.state
        cdef int64_t seq
        if st.destroyed:
            raise InvalidUsage("the communicator was destroyed", op=name, rank=self.rank)
        if st.revoked:  # revoked since _ready, from another thread
            raise comm._revoked_error(name)
        seq = st.seq
        st.seq = seq + 1
        st.in_data = False
        if row != NULL:
            row.seq, row.dtype, row.count, row.root = seq, dtype, count, root
        return seq

    cdef inline void _completed(self, Row *row, Stat stat, uint64_t nbytes, uint64_t t0) noexcept:
        """Under the lock, a served call done: its row completed, its telemetry counted."""
        cdef uint64_t t1 = uc_clock_ticks()
        if row != NULL:
            row.t_end, row.state = uc_clock_wall(t1), 2
        if self.counting and stat is not None:
            stat.add(nbytes, uc_clock_ns(t0, t1))

    cdef int _raise_failed(self, str name, plan, Row *row, int64_t seq, exc) except -1:
        """A served call failed: the general path's handling of the failure (it raises)."""
        comm = self.comm
        if comm._telemetry is not None:
            comm._telemetry.failure(name)
        plan.entry = self._moved(row)
        raise _outcome.failed(comm, plan, seq, comm.timeout, exc) from None

    cdef Row *_enqueue(self, str name, uint64_t t) except? NULL:
        """The flight recorder's row of this call (entered at clock reading t), or NULL (recorder off)."""
        if self.ring is None or not self.recording:
            return NULL
        return self.ring.next(name, uc_clock_wall(t))

    cdef object _moved(self, Row *row):
        """A failing call's row as an entry of the recorder's own (the general path's error
        handling marks it failed), or None."""
        if row == NULL:
            return None
        entry = self.ring.take(row)
        self.entries_append(entry)
        return entry

    cdef _plan(self, sendbuf, recvbuf, op, entry):
        plan = _plans.all_reduce(self.comm, sendbuf, recvbuf, op)
        plan.args, plan.timeout, plan.entry = (self.comm, sendbuf, recvbuf, op), None, entry
        return plan

    cdef _mismatched(self, sendbuf, recvbuf, op, int64_t seq):
        """The records differ: the general path's judgement (it raises, or the difference is one
        the call allows and the data moves as after an agreement)."""
        comm = self.comm
        plan = self._plan(sendbuf, recvbuf, op, None)
        comm._in_data = False  # nothing moved: every rank judges the same records
        _agreement.judge(comm, plan, seq, None)
        comm._in_data = True
        plan.shm(self.engine)

    cdef _failed(self, sendbuf, recvbuf, op, entry, int64_t seq, exc):
        comm = self.comm
        if comm._telemetry is not None:
            comm._telemetry.failure("all_reduce")
        raise _outcome.failed(comm, self._plan(sendbuf, recvbuf, op, entry), seq, comm.timeout, exc) from None


# ------------------------------------------------------------------ the public methods
# Compiled, so that a steady-state call makes no Python frame at all; Communicator binds them.
def all_reduce(self, sendbuf, recvbuf=None, op=ReduceOp.SUM, *, async_op=False, timeout=None):
    """Reduce ``sendbuf`` over all ranks into ``recvbuf`` (None: in place)."""
    cdef FastPath fast = self._fast
    if fast is None or async_op or timeout is not None:
        return self._call("all_reduce", _plans.all_reduce, (self, sendbuf, recvbuf, op), async_op, timeout, 1)
    if type(sendbuf) is not cnp.ndarray:  # a device buffer (the native path), or another kind
        return fast.call("all_reduce", _plans.all_reduce, (self, sendbuf, recvbuf, op))
    result = fast._all_reduce(sendbuf, recvbuf, op)  # a call of the last shape
    if result is MISS:
        result = self._call("all_reduce", _plans.all_reduce, (self, sendbuf, recvbuf, op), False, None, 1)
        fast.learn_all_reduce(sendbuf, recvbuf, op)
    return result


cdef inline object _general(self, str name, planner, tuple args, async_op, timeout):
    cdef FastPath fast = self._fast
    if fast is None or async_op or timeout is not None:
        return self._call(name, planner, args, async_op, timeout, 1)
    return fast.call(name, planner, args)


def reduce(self, sendbuf, recvbuf=None, op=ReduceOp.SUM, root=0, *, async_op=False, timeout=None):
    """Reduce to ``root``'s ``recvbuf`` (None: in place in the root's ``sendbuf``)."""
    return _general(self, "reduce", _plans.reduce, (self, sendbuf, recvbuf, op, root), async_op, timeout)


def broadcast(self, buf, root=0, *, async_op=False, timeout=None):
    """Copy ``root``'s ``buf`` into every rank's ``buf``."""
    return _general(self, "broadcast", _plans.broadcast, (self, buf, root), async_op, timeout)


def all_gather(self, sendbuf, recvbuf, *, async_op=False, timeout=None):
    """``recvbuf`` (size x len(sendbuf), rank-major) gets every rank's ``sendbuf``.
    In place when ``sendbuf`` is block ``rank`` of ``recvbuf``."""
    return _general(self, "all_gather", _plans.all_gather, (self, sendbuf, recvbuf), async_op, timeout)


def reduce_scatter(self, sendbuf, recvbuf, op=ReduceOp.SUM, *, ring_order=False, async_op=False, timeout=None):
    """Block i of ``sendbuf`` (size x len(recvbuf)) reduced over all ranks lands in
    rank i's ``recvbuf``.  In place when ``recvbuf`` is block ``rank`` of ``sendbuf``.

    ``ring_order=True`` (host buffers): block b is combined as gloo's ring combines it,
    ((x[b-1] op x[b-2]) op ...) op x[b] with ranks mod size, on every transport alike, so
    float sums and products are the same bits whichever transport ran them (and gloo's;
    MAX/MIN may still differ in which NaN or which zero's sign wins)."""
    return _general(self, "reduce_scatter", _plans.reduce_scatter, (self, sendbuf, recvbuf, op, ring_order),
                    async_op, timeout)


def all_to_all(self, sendbuf, recvbuf, *, async_op=False, timeout=None):
    """Block i of ``sendbuf`` goes to rank i; block j of ``recvbuf`` comes from rank j."""
    return _general(self, "all_to_all", _plans.all_to_all, (self, sendbuf, recvbuf), async_op, timeout)


def gather(self, sendbuf, recvbuf=None, root=0, *, async_op=False, timeout=None):
    """``root``'s ``recvbuf`` (size x len(sendbuf)) gets every rank's ``sendbuf``."""
    return _general(self, "gather", _plans.gather, (self, sendbuf, recvbuf, root), async_op, timeout)


def scatter(self, sendbuf=None, recvbuf=None, root=0, *, async_op=False, timeout=None):
    """Block i of ``root``'s ``sendbuf`` goes to rank i's ``recvbuf``."""
    return _general(self, "scatter", _plans.scatter, (self, sendbuf, recvbuf, root), async_op, timeout)


def barrier(self, *, async_op=False, timeout=None):
    """Return once every rank has entered the barrier."""
    return _general(self, "barrier", _plans.barrier, (self,), async_op, timeout)


# ------------------------------------------------------------ persistent collectives
cdef class Persistent:
    """A persistent collective (MPI 4's ``MPI_Allreduce_init`` and kin): made by
    ``comm.all_reduce_init(...)`` and the other ``*_init`` methods, which check the arguments
    and agree on the call across ranks once; then ``start()`` runs it, as often as wanted, on
    the same buffers.

    ``start()`` completes the call before it returns (as uniccl's blocking calls do), unless
    ``async_op=True`` queues it on the communicator's executor; ``wait()`` returns its result
    (the output buffer, or None) and raises its error.  Every rank must start its persistent
    calls, and make its other calls, in the same order: the call's record still rides on the
    data, so a rank that starts something else gets ``InvalidUsage`` naming both sides.
    Over shared memory a start goes from here to the engine's call with only the communicator's
    state and the buffers' address, size, type and flags checked again (a buffer changed since
    init takes the ordinary call, which checks it in full); elsewhere (TCP, MPI, device buffers)
    it is the ordinary call.  Neither the init nor a start may be made inside ``uniccl.group()``
    (InvalidUsage): a group would only queue the call.
    Telemetry, the flight recorder and the call numbers see each start as a call."""

    cdef object comm, planner, args
    cdef object work  # the queued start's Work, or the completed start's result (done)
    cdef readonly str name
    cdef FastPath fast
    cdef Shape sh
    cdef bint freed, active, done

    def __init__(self, comm, str name, planner, tuple args, result):
        self.comm, self.name, self.planner, self.args = comm, name, planner, args
        self.fast = comm._fast
        cdef Shape sh = None if self.fast is None else self.fast.shape(name, planner, args, result)
        self.sh = sh if sh is not None and not sh.declined else None
        self.work = None
        self.freed = self.active = self.done = False

    def start(self, *, async_op=False):
        """Run the call (``async_op=True``: queue it; ``wait()`` then waits for it)."""
        cdef FastPath fast = self.fast
        if self.freed:
            raise InvalidUsage("start() of a freed persistent call", op=self.name, rank=self.comm.rank)
        if self.active:
            raise InvalidUsage("start() of a persistent call still active: wait() for it first", op=self.name,
                               rank=self.comm.rank)
        if _groups_open and _in_group():  # (as *_init: a group would only queue it, wait() never block)
            raise InvalidUsage("a persistent call cannot be started inside uniccl.group()", op=self.name,
                               rank=self.comm.rank)
        # the buffers as at init (address, size, type, flags: an array resized, retyped or made
        # read-only since takes the ordinary call, which checks it again)
        if not async_op and self.sh is not None and fast._ready(self.comm) and _matches(self.sh, self.args):
            self.work = fast._run(self.sh, self.name, self.args)
        else:
            self.work = self.comm._call(self.name, self.planner, self.args, async_op, None, 1)
        self.active, self.done = True, not async_op

    def wait(self, timeout=None):
        """The started call's result (its output buffer, or None); raises its error."""
        if not self.active:
            raise InvalidUsage("wait() of a persistent call that was not started", op=self.name,
                               rank=self.comm.rank)
        work = self.work
        if self.done:
            self.active, self.work = False, None
            return work
        try:
            result = work.wait(timeout)
        except BaseException:
            if not work.is_completed():
                raise  # still active: wait() again
            self.active, self.work = False, None
            raise
        self.active, self.work = False, None
        return result

    def test(self) -> bool:
        """True once the started call has completed (or when none is active)."""
        return not self.active or self.done or self.work.is_completed()

    def free(self):
        """Release the call (MPI_Request_free); a start afterwards is InvalidUsage."""
        if self.active and not self.test():
            raise InvalidUsage("free() of a persistent call still active: wait() for it first", op=self.name,
                               rank=self.comm.rank)
        self.freed, self.active, self.work, self.sh, self.args = True, False, None, None, ()

    def __repr__(self):
        state = "freed" if self.freed else "active" if self.active else "inactive"
        return f"<uniccl.Persistent {self.name} {state}>"


def all_reduce_init(self, sendbuf, recvbuf=None, op=ReduceOp.SUM):
    """A persistent :meth:`all_reduce` (collective; see :class:`Persistent`)."""
    return self._persistent("all_reduce", _plans.all_reduce, (self, sendbuf, recvbuf, op))


def reduce_init(self, sendbuf, recvbuf=None, op=ReduceOp.SUM, root=0):
    """A persistent :meth:`reduce`."""
    return self._persistent("reduce", _plans.reduce, (self, sendbuf, recvbuf, op, root))


def broadcast_init(self, buf, root=0):
    """A persistent :meth:`broadcast`."""
    return self._persistent("broadcast", _plans.broadcast, (self, buf, root))


def all_gather_init(self, sendbuf, recvbuf):
    """A persistent :meth:`all_gather`."""
    return self._persistent("all_gather", _plans.all_gather, (self, sendbuf, recvbuf))


def reduce_scatter_init(self, sendbuf, recvbuf, op=ReduceOp.SUM, *, ring_order=False):
    """A persistent :meth:`reduce_scatter`."""
    return self._persistent("reduce_scatter", _plans.reduce_scatter, (self, sendbuf, recvbuf, op, ring_order))


def all_to_all_init(self, sendbuf, recvbuf):
    """A persistent :meth:`all_to_all`."""
    return self._persistent("all_to_all", _plans.all_to_all, (self, sendbuf, recvbuf))


def gather_init(self, sendbuf, recvbuf=None, root=0):
    """A persistent :meth:`gather`."""
    return self._persistent("gather", _plans.gather, (self, sendbuf, recvbuf, root))


def scatter_init(self, sendbuf=None, recvbuf=None, root=0):
    """A persistent :meth:`scatter`."""
    return self._persistent("scatter", _plans.scatter, (self, sendbuf, recvbuf, root))


def barrier_init(self):
    """A persistent :meth:`barrier`."""
    return self._persistent("barrier", _plans.barrier, (self,))
