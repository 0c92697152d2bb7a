# cython: language_level=3, boundscheck=False, wraparound=False
"""Intra-node shared-memory collectives: a thin wrapper over the C engine
(core/csrc/shm_engine.c).

One ``ShmEngine`` per rank and communicator.  Each collective is one C call that
runs with the GIL released from start to finish; pointers are ints (addresses),
``dtype``/``op`` uniccl's codes (``op``: SUM, PROD, MAX or MIN; AVG is the
caller's SUM + scale).  Every rank must call the same collectives in the same order
with the same sizes, dtype, op and root (the caller agrees on them first, e.g.
with :meth:`ShmEngine.agree`).

Set-up: one rank creates the segment (``create=True``), the others attach with the
same name once it exists; the creator calls :meth:`unlink` once every rank has
attached (and does so by itself at the first collective, when it sees them all),
so no segment can outlive the job.

Environment: ``UNICCL_SHM_CMA`` (unset or ``auto``: single-copy reads (process_vm_readv) where the
creator measured them fast enough to beat the slots, per collective; 1: wherever they may be used;
0: slot copies only); ``UNICCL_SHM_SMALL_BYTES``, ``UNICCL_SHM_CMA_MIN_BYTES``,
``UNICCL_SHM_CMA_REDUCE_MIN_BYTES`` (-1: never), ``UNICCL_SHM_CMA_BCAST_MAX_BYTES`` (-1: no
limit), ``UNICCL_SHM_NT_MIN_BYTES`` (the
creator's values hold for every rank),
``UNICCL_SHM_SPIN_NS`` and ``UNICCL_SHM_YIELD_NS`` tune it.
"""
cimport numpy as cnp
from cpython.buffer cimport PyBUF_SIMPLE, PyBuffer_Release, PyObject_GetBuffer
from cpython.exc cimport PyErr_Occurred
from cpython.pystate cimport PyThreadState
from libc.stdint cimport int32_t, int64_t, uint32_t, uint64_t, uintptr_t
from libc.stdlib cimport free, malloc

import atexit
import weakref

from uniccl import _env
from uniccl._errors import InternalError, InvalidArgument, InvalidUsage, RemoteError, Revoked, Timeout

cnp.import_array()

cdef extern from "Python.h":
    # declared here without Cython's "except -1" so that a raised KeyboardInterrupt stays
    # pending (for the collective's caller) instead of being reported as unraisable
    int _check_signals "PyErr_CheckSignals" ()

cdef extern from "shm_engine.h" nogil:
    enum: UC_SHM_RECORD_WORDS
    enum: UC_SHM_RING_ORDER
    enum: UC_SHM_CMA_ALWAYS
    ctypedef int (*uc_shm_reduce_fn)(void *dst, const void *a, const void *b, size_t count, int dtype,
                                     int op)
    enum:
        UC_SHM_OK
        UC_SHM_EINVAL
        UC_SHM_EDEAD
        UC_SHM_EREMOTE
        UC_SHM_ETIMEOUT
        UC_SHM_ESYS
        UC_SHM_EKERNEL
        UC_SHM_EBROKEN
        UC_SHM_EBUSY
        UC_SHM_EINTR
        UC_SHM_EABORTED
        UC_SHM_ECORRUPT
        UC_SHM_EMISMATCH
        UC_SHM_EREVOKED
    ctypedef int (*uc_shm_interrupt_fn)(void *ctx) noexcept
    ctypedef struct uc_shm_error:
        int code
        int remote_rank
        long remote_pid
        int sys_errno
        int nmissing
        const int *missing
        const char *op
        char message[512]
    ctypedef struct uc_shm_tuning:
        size_t small_bytes
        size_t cma_min_bytes
        size_t nt_min_bytes
        size_t cma_reduce_min_bytes
        size_t cma_bcast_max_bytes
        uint64_t spin_ns
        uint64_t yield_ns
        int checksum
        uint32_t flip_ppm
        uint32_t cma_speed_ppm
        float slot_gbps

    uc_shm *uc_shm_open(const char *name, int rank, int size, int create, size_t slot_bytes,
                        uc_shm_reduce_fn reduce, double timeout, int cma_allowed,
                        const uc_shm_tuning *tuning, uc_shm_error *err)
    void uc_shm_set_interrupt(uc_shm *e, uc_shm_interrupt_fn fn, void *ctx)
    int uc_shm_unlink(uc_shm *e)
    int uc_shm_close(uc_shm *e)
    const uc_shm_error *uc_shm_last_error(const uc_shm *e)
    int uc_shm_cma(const uc_shm *e)
    const char *uc_shm_cma_reason(const uc_shm *e)
    void uc_shm_get_tuning(const uc_shm *e, uc_shm_tuning *out, size_t *slot_bytes)
    enum: UC_SHM_SPEED_CLASSES
    int uc_shm_live_choices(const uc_shm *e, int coll, int *choice, double *slot_gbps, double *cma_gbps)
    int uc_shm_fail(uc_shm *e, const char *op, const char *message)
    void uc_shm_abort(uc_shm *e, const char *why)
    void uc_shm_revoke(uc_shm *e, const char *why)
    void uc_shm_integrity(const uc_shm *e, int *on, uint64_t *failures, uint64_t *recopies)
    enum: UC_SHM_ARRIVAL_BUCKETS
    ctypedef struct uc_shm_arrivals:
        uint64_t calls, last, wait_ns
        uint64_t hist[UC_SHM_ARRIVAL_BUCKETS]
    void uc_shm_get_arrivals(const uc_shm *e, uc_shm_arrivals *out)
    void uc_shm_count_arrivals(uc_shm *e, int on)
    int uc_shm_set_timeout(uc_shm *e, double timeout)
    ctypedef struct uc_shm_event:
        uint64_t t0_ns, t1_ns, bytes
        int32_t kind, peer
    int uc_shm_trace(uc_shm *e, size_t capacity)
    size_t uc_shm_take_events(uc_shm *e, uc_shm_event *out, size_t max, uint64_t *dropped)
    size_t uc_shm_event_count(const uc_shm *e)
    int uc_shm_barrier(uc_shm *e)
    enum: UC_SHM_COLL_BARRIER
    enum: UC_SHM_COLL_ALL_REDUCE
    enum: UC_SHM_COLL_REDUCE
    enum: UC_SHM_COLL_BROADCAST
    enum: UC_SHM_COLL_ALL_GATHER
    enum: UC_SHM_COLL_REDUCE_SCATTER
    enum: UC_SHM_COLL_ALL_TO_ALL
    enum: UC_SHM_COLL_GATHER
    enum: UC_SHM_COLL_SCATTER
    int uc_shm_agreed(uc_shm *e, const int64_t *record, int64_t *out, int coll, const void *send, void *recv,
                      size_t n, int dtype, int op, int root)
    ctypedef void (*uc_shm_unlock_fn)(void *ctx) noexcept nogil
    int uc_shm_agreed_held(uc_shm *e, const int64_t *record, int64_t *out, int coll, const void *send,
                           void *recv, size_t n, int dtype, int op, int root, uc_shm_unlock_fn unlock, void *ctx)

_EVENT_KINDS = ("read", "write", "copy", "reduce")  # shm_engine.h UC_SHM_EV_*

cdef extern from "crc32c.h" nogil:
    uint32_t uc_crc32c(uint32_t crc, const void *buf, size_t n)
    uint32_t uc_crc32c_copy(uint32_t crc, void *dst, const void *src, size_t n)
    int uc_crc32c_hw()


def crc32c(data, unsigned int crc=0):
    """CRC-32C of a buffer (bytes, bytearray, memoryview …); ``crc`` continues a previous one.
    SSE4.2 where the CPU has it (the C core of the engine; also TCP's payload checksum)."""
    cdef Py_buffer buf
    cdef uint32_t out
    PyObject_GetBuffer(data, &buf, PyBUF_SIMPLE)
    try:
        if buf.len == 0:
            return crc
        if buf.len < 65536:  # short: not worth releasing the GIL
            out = uc_crc32c(crc, buf.buf, <size_t>buf.len)
        else:
            with nogil:
                out = uc_crc32c(crc, buf.buf, <size_t>buf.len)
    finally:
        PyBuffer_Release(&buf)
    return out


def crc32c_at(uintptr_t ptr, size_t nbytes, unsigned int crc=0):
    """CRC-32C of ``nbytes`` at address ``ptr``."""
    cdef uint32_t out
    if nbytes == 0:
        return crc
    with nogil:
        out = uc_crc32c(crc, <const void *>ptr, nbytes)
    return out


def crc32c_copy(uintptr_t dst, uintptr_t src, size_t nbytes, unsigned int crc=0):
    """Copy ``nbytes`` from address ``src`` to ``dst`` and return their CRC-32C (one pass)."""
    cdef uint32_t out
    if nbytes == 0:
        return crc
    with nogil:
        out = uc_crc32c_copy(crc, <void *>dst, <const void *>src, nbytes)
    return out


def crc32c_hardware() -> bool:
    return uc_crc32c_hw() != 0


#: Words (int64) of a call's record, the agreement every transport runs (shm_engine.h's
#: UC_SHM_RECORD_WORDS), and the flag on a reduce_scatter's op for gloo's ring order.
RECORD_WORDS = UC_SHM_RECORD_WORDS
RING_ORDER_FLAG = UC_SHM_RING_ORDER
#: How many collective codes the engine's agreed calls know (transport.record.COLLECTIVES).
COLL_CODES = UC_SHM_COLL_SCATTER + 1

_TUNING_ENV = {
    "small_bytes": "UNICCL_SHM_SMALL_BYTES",
    "cma_min_bytes": "UNICCL_SHM_CMA_MIN_BYTES",
    "nt_min_bytes": "UNICCL_SHM_NT_MIN_BYTES",
    "cma_reduce_min_bytes": "UNICCL_SHM_CMA_REDUCE_MIN_BYTES",
    "cma_bcast_max_bytes": "UNICCL_SHM_CMA_BCAST_MAX_BYTES",
    "spin_ns": "UNICCL_SHM_SPIN_NS",
    "yield_ns": "UNICCL_SHM_YIELD_NS",
}

_MAY_BE_NEGATIVE = ("cma_reduce_min_bytes", "cma_bcast_max_bytes")  # -1: never / no limit

# Engines still open, closed at interpreter exit (the creator's close unlinks).
_open_engines = weakref.WeakSet()


@atexit.register
def _close_all():
    for engine in list(_open_engines):
        try:
            engine.close()
        except Exception:
            pass


def _cma_mode(cma) -> int:
    """The engine's cma_allowed: 0 never, 1 wherever possible, 2 where measured faster ("auto")."""
    if cma is None:
        cma = _env.get("UNICCL_SHM_CMA")
    if cma is None or cma == "auto":
        return 2
    if isinstance(cma, bool):
        return int(cma)
    raise InvalidArgument(f"must be True, False, 'auto' or None, got {cma!r}", op="open", argument="cma")


cdef extern from "Python.h":
    PyThreadState *PyEval_SaveThread() nogil
    void PyEval_RestoreThread(PyThreadState *) nogil


cdef void _release_gil(void *ctx) noexcept nogil:
    """uc_shm_agreed_held's unlock: called (holding the GIL) when a call must wait longer than its
    short spin; the caller takes the GIL back from the thread state left in ``ctx``."""
    (<PyThreadState **>ctx)[0] = PyEval_SaveThread()


# A call that may copy this much or less (its count x 8 bytes x ranks bounds every collective's
# copies) keeps the GIL until it has to wait: most such calls never do, and releasing the GIL and
# taking it back costs as much as the engine's whole 8-byte call.  Larger calls release it first.
cdef size_t _HOLD_GIL_BYTES = 65536


cdef int _interrupted(void *ctx) noexcept nogil:
    """Called by a waiting collective about every 10 ms: run Python's signal handlers
    (Ctrl-C) so that a wait on a hung peer can be interrupted.  The exception they
    raise stays pending and is re-raised when the call returns."""
    with gil:
        return _check_signals() != 0


cdef inline bint _is_int(object x):
    return isinstance(x, int) and not isinstance(x, bool)


cdef class ShmEngine:
    """One rank's handle on a shared-memory segment of ``size`` ranks.

    ``ShmEngine(name, rank, size, create, slot_bytes, reduce_fn, timeout)``:
    ``name`` "/something" (POSIX shm name), ``slot_bytes`` a multiple of 4096 (the
    same on every rank; 0 on an attaching rank takes the creator's), ``reduce_fn``
    the address of a ``uniccl_host_reduce_kernel`` (0: no reductions), ``timeout``
    seconds per call (0: none; dead peers are detected regardless).
    Keyword tuning (``small_bytes``, ``cma_min_bytes``, ``cma_reduce_min_bytes``, ``cma_bcast_max_bytes``,
    ``nt_min_bytes``, ``spin_ns``, ``yield_ns``, ``cma``) overrides the environment; ``cma``: True
    (single-copy reads wherever they may be used), False (never), "auto" (where faster: the creator
    measures their speed over a plain copy's, or takes ``cma_speed``; measured, the speeds the
    calls then show take over: :meth:`live_choices`).  ``slot_gbps`` (the creator's, for tests):
    copies out of a peer's slot take at least their bytes at that speed.
    """

    # its fields: _shm.pxd

    def __cinit__(self):
        self._e = NULL
        self._users = 0

    def __init__(self, name, rank, size, create, slot_bytes, reduce_fn, timeout, *, cma=None,
                 small_bytes=None, cma_min_bytes=None, nt_min_bytes=None, cma_reduce_min_bytes=None,
                 cma_bcast_max_bytes=None, spin_ns=None, yield_ns=None, checksum=False, flip_ppm=0,
                 cma_speed=None, slot_gbps=0):
        cdef uc_shm_error err
        cdef uc_shm_tuning tuning
        cdef uintptr_t fn
        if not isinstance(name, str):
            raise InvalidArgument(f"must be a str, got {type(name).__name__}", op="open", argument="name")
        for arg, value in (("rank", rank), ("size", size), ("slot_bytes", slot_bytes), ("reduce_fn", reduce_fn)):
            if not _is_int(value) or value < 0:
                raise InvalidArgument(f"must be an int >= 0, got {value!r}", op="open", argument=arg)
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout >= 0:
            raise InvalidArgument(f"must be a number of seconds >= 0, got {timeout!r}", op="open",
                                  argument="timeout")
        if reduce_fn >= 1 << 64:
            raise InvalidArgument("is not an address", op="open", argument="reduce_fn")
        given = dict(small_bytes=small_bytes, cma_min_bytes=cma_min_bytes, nt_min_bytes=nt_min_bytes,
                     cma_reduce_min_bytes=cma_reduce_min_bytes, cma_bcast_max_bytes=cma_bcast_max_bytes,
                     spin_ns=spin_ns, yield_ns=yield_ns)
        values = {}
        for key, env in _TUNING_ENV.items():
            value = given[key]
            if value is None:
                value = _env.get(env)  # the one parser of the variables (K/M/G, -1 where it means none)
            if value is not None and (not _is_int(value) or (value < 0 and key not in _MAY_BE_NEGATIVE)):
                raise InvalidArgument(f"must be an int >= 0, got {value!r}", op="open", argument=key)
            values[key] = value or 0
        tuning.small_bytes = values["small_bytes"]
        tuning.cma_min_bytes = values["cma_min_bytes"]
        tuning.nt_min_bytes = values["nt_min_bytes"]
        # -1 (any negative): never reduce with single-copy transfers
        tuning.cma_reduce_min_bytes = <size_t>-1 if values["cma_reduce_min_bytes"] < 0 else \
            values["cma_reduce_min_bytes"]
        # -1 (any negative): broadcasts of any size read single-copy
        tuning.cma_bcast_max_bytes = <size_t>-1 if values["cma_bcast_max_bytes"] < 0 else \
            values["cma_bcast_max_bytes"]
        tuning.spin_ns = values["spin_ns"]
        tuning.yield_ns = values["yield_ns"]
        tuning.checksum = 1 if checksum else 0  # the creator's choice holds for every rank
        if not _is_int(flip_ppm) or not 0 <= flip_ppm <= 1000000:
            raise InvalidArgument(f"must be an int in [0, 1000000], got {flip_ppm!r}", op="open", argument="flip_ppm")
        tuning.flip_ppm = flip_ppm
        # the creator's: a single-copy read's speed over a plain copy's, given instead of measured
        if cma_speed is None:
            tuning.cma_speed_ppm = 0
        elif isinstance(cma_speed, bool) or not isinstance(cma_speed, (int, float)) or not 0 < cma_speed < 4000:
            raise InvalidArgument(f"must be a speed ratio in (0, 4000), got {cma_speed!r}", op="open",
                                  argument="cma_speed")
        else:
            tuning.cma_speed_ppm = max(1, int(cma_speed * 1e6))
        # the creator's, tests: copies out of a peer's slot slowed to this speed (a slow path between cores)
        if isinstance(slot_gbps, bool) or not isinstance(slot_gbps, (int, float)) or not 0 <= slot_gbps < 1e4:
            raise InvalidArgument(f"must be a speed in GB/s in [0, 10000), got {slot_gbps!r}", op="open",
                                  argument="slot_gbps")
        tuning.slot_gbps = slot_gbps
        allowed = _cma_mode(cma)
        bname = name.encode()
        cdef const char *cname = bname
        cdef int crank = rank, csize = size, ccreate = bool(create), callowed = allowed
        cdef size_t cslot = slot_bytes
        cdef double ctimeout = timeout
        fn = reduce_fn
        with nogil:
            self._e = uc_shm_open(cname, crank, csize, ccreate, cslot, <uc_shm_reduce_fn>fn, ctimeout,
                                  callowed, &tuning, &err)
        if self._e == NULL:
            _raise_error(&err, rank)
        uc_shm_set_interrupt(self._e, _interrupted, NULL)
        self.name, self.rank, self.size, self.creator = name, rank, size, bool(create)
        _open_engines.add(self)

    def __dealloc__(self):
        if self._e != NULL:
            uc_shm_close(self._e)
            self._e = NULL

    def __repr__(self):
        state = "closed" if self._e == NULL else f"cma={self.cma}"
        return f"<ShmEngine {self.name} rank {self.rank}/{self.size} {state}>"

    # ------------------------------------------------------------- lifecycle
    def unlink(self):
        """Remove the segment's name (creator only; idempotent; a no-op elsewhere)."""
        cdef uc_shm *e = self._live("unlink")
        if uc_shm_unlink(e) != UC_SHM_OK:
            self._raise(UC_SHM_ESYS)

    def close(self):
        """Unmap the segment (idempotent).  The creator also unlinks it if it has not yet."""
        if self._e == NULL:
            return
        if self._users or uc_shm_close(self._e) == UC_SHM_EBUSY:
            raise InvalidUsage("close() while a collective is running on this engine", op="close",
                               rank=self.rank)
        self._e = NULL
        _open_engines.discard(self)

    def abort(self, why="aborted"):
        """From any thread: peers fail at once naming this rank, and a call waiting on this
        engine (in another thread) returns within about 10-20 ms.  Close it afterwards."""
        if self._e == NULL:
            return
        bwhy = str(why).encode()[:240]
        uc_shm_abort(self._e, bwhy)

    def revoke(self, why="revoked"):
        """From any thread: every later or waiting call of every rank raises ``Revoked`` with
        ``why`` (within about 10-20 ms); the engine stays mapped, to be closed as usual."""
        if self._e == NULL:
            return
        bwhy = str(why).encode()[:240]
        uc_shm_revoke(self._e, bwhy)

    def set_timeout(self, timeout):
        """Seconds each later call may wait (0: forever; dead peers are detected regardless)."""
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 <= timeout <= 1e9:
            raise InvalidArgument(f"must be a number of seconds >= 0, got {timeout!r}", op="set_timeout",
                                  argument="timeout")
        uc_shm_set_timeout(self._live("set_timeout"), timeout)

    def trace(self, size_t capacity):
        """Record each call's transfers (at most ``capacity`` events between takes; 0: off)."""
        if uc_shm_trace(self._live("trace"), capacity):
            raise MemoryError("uniccl shm engine: no memory for the trace")

    def take_events(self) -> tuple:
        """(events, dropped): the transfers recorded since the last take, oldest first, as
        (kind, peer, bytes, t0_ns, t1_ns) with kind "read", "write", "copy" or "reduce"
        (peer -1: every rank's data); dropped: those beyond the capacity."""
        cdef uc_shm *e = self._live("take_events")
        cdef size_t cap = uc_shm_event_count(e) or 1, n
        cdef uint64_t dropped = 0
        cdef uc_shm_event *buf = <uc_shm_event *>malloc(cap * sizeof(uc_shm_event))
        if buf == NULL:
            raise MemoryError()
        try:
            out = []
            n = uc_shm_take_events(e, buf, cap, &dropped)
            for i in range(n):
                out.append((_EVENT_KINDS[buf[i].kind], buf[i].peer, buf[i].bytes, buf[i].t0_ns, buf[i].t1_ns))
            return out, dropped
        finally:
            free(buf)

    @property
    def integrity(self) -> dict:
        """Checksums (see UNICCL_SHM_CHECKSUM): on, regions that failed the check, copies made again."""
        cdef int on = 0
        cdef uint64_t failures = 0, recopies = 0
        if self._e != NULL:
            uc_shm_integrity(self._e, &on, &failures, &recopies)
        return {"shm_checksums": bool(on), "shm_checksum_failures": failures, "shm_recopies": recopies}

    def arrivals(self) -> dict:
        """At each call's first rendezvous, how long this rank waited for the last rank: ``calls``,
        ``last`` (calls it arrived last in: no wait), ``wait_ns`` (their sum) and ``hist``
        (``hist[b]``: calls whose wait was below 2**b ns; ``hist[0]``: no wait)."""
        cdef uc_shm_arrivals a
        if self._e == NULL:
            return {"calls": 0, "last": 0, "wait_ns": 0, "hist": [0] * UC_SHM_ARRIVAL_BUCKETS}
        uc_shm_get_arrivals(self._e, &a)
        return {"calls": a.calls, "last": a.last, "wait_ns": a.wait_ns,
                "hist": [a.hist[b] for b in range(UC_SHM_ARRIVAL_BUCKETS)]}

    def _count_arrivals(self, bint on):
        """Benchmarks only (the placebo method): count arrivals or not."""
        uc_shm_count_arrivals(self._live("arrivals"), on)

    @property
    def closed(self) -> bool:
        return self._e == NULL

    @property
    def cma(self) -> bool:
        """True when single-copy reads (process_vm_readv) are in use; decided by every
        rank together at the first call (False before it)."""
        return self._e != NULL and uc_shm_cma(self._e) == 1

    @property
    def cma_reason(self) -> str:
        """Why single-copy reads are not in use ("" when they are)."""
        if self._e == NULL:
            return "closed"
        return uc_shm_cma_reason(self._e).decode(errors="replace")

    @property
    def tuning(self) -> dict:
        cdef uc_shm_tuning t
        cdef size_t slot_bytes
        uc_shm_get_tuning(self._live("tuning"), &t, &slot_bytes)
        return {"slot_bytes": slot_bytes, "small_bytes": t.small_bytes, "cma_min_bytes": t.cma_min_bytes,
                "cma_reduce_min_bytes": t.cma_reduce_min_bytes or -1, "nt_min_bytes": t.nt_min_bytes,
                "cma_bcast_max_bytes": -1 if t.cma_bcast_max_bytes == <size_t>-1 else t.cma_bcast_max_bytes,
                "spin_ns": t.spin_ns, "yield_ns": t.yield_ns,
                # a single-copy read's speed over a plain copy's as the creator measured it (None:
                # not measured, single-copy wherever possible); use_cma in shm_engine.c reads it
                "cma_speed": None if t.cma_speed_ppm == UC_SHM_CMA_ALWAYS else t.cma_speed_ppm / 1e6}

    def live_choices(self, str collective):
        """None where the speed ratio is fixed (given, or single-copy wherever possible); else, for
        ``collective`` ("broadcast", ...), per size class of a call's transfer per peer (its
        smallest size: 16 KiB << k, the last one taking the rest) a dict of the path in force
        ("slots", "single-copy", or None: not chosen yet, the open's measure decides; the same on
        every rank) and this rank's running estimates of its calls' speed on each, GB/s of the
        transfer per peer (0.0: none yet)."""
        cdef int choice[UC_SHM_SPEED_CLASSES]
        cdef double slot[UC_SHM_SPEED_CLASSES]
        cdef double cma[UC_SHM_SPEED_CLASSES]
        from ..record import COLLECTIVES  # the codes' one definition (it imports this module)
        choosing = COLLECTIVES[1:]  # every collective but barrier (code 0) may choose
        if collective not in choosing:
            raise InvalidArgument(f"must be one of {sorted(choosing)}, got {collective!r}", op="live_choices",
                                  argument="collective")
        code = COLLECTIVES.index(collective)
        if uc_shm_live_choices(self._live("live_choices"), code, choice, slot, cma):
            return None
        paths = (None, "slots", "single-copy")
        return {(16 << 10) << k: {"choice": paths[choice[k]], "slot_gbps": slot[k], "cma_gbps": cma[k]}
                for k in range(UC_SHM_SPEED_CLASSES)}

    # ------------------------------------------------------------- collectives
    cdef _records(self, header, out, str op):
        if not (isinstance(header, cnp.ndarray) and cnp.PyArray_TYPE(header) == cnp.NPY_INT64
                and cnp.PyArray_SIZE(header) == UC_SHM_RECORD_WORDS and cnp.PyArray_IS_C_CONTIGUOUS(header)):
            self._bad(op, f"header must be a C-contiguous int64 numpy array of {RECORD_WORDS} elements", "header")
        if not (isinstance(out, cnp.ndarray) and cnp.PyArray_TYPE(out) == cnp.NPY_INT64
                and cnp.PyArray_SIZE(out) == UC_SHM_RECORD_WORDS * self.size and cnp.PyArray_IS_C_CONTIGUOUS(out)
                and cnp.PyArray_ISWRITEABLE(out)):
            self._bad(op, f"out must be a writable C-contiguous int64 numpy array of {self.size} x {RECORD_WORDS}",
                      "out")

    def agree(self, header, out):
        """Allgather of one int64[RECORD_WORDS] record per rank into ``out`` (int64[size, RECORD_WORDS]),
        through shared memory; returns once every rank has called it (a barrier).
        Returns True when every rank's record equals ``header`` (compared here, in C)."""
        self._live("agree")
        self._records(header, out, "agree")
        return self.agree_records(<const int64_t *>cnp.PyArray_DATA(header), <int64_t *>cnp.PyArray_DATA(out)) == 1

    cdef int agree_records(self, const int64_t *rec, int64_t *res) except -1:
        """:meth:`agree` on checked records: 1 when every rank's equals ``rec``, else 0."""
        return self.agreed(rec, res, UC_SHM_COLL_BARRIER, 0, 0, 0, 0, 0, 0)

    def barrier(self):
        cdef uc_shm *e = self._live("barrier")
        cdef int rc
        self._users += 1  # the engine outlives every thread inside it (see close)
        try:
            with nogil:
                rc = uc_shm_barrier(e)
            if rc:
                self._raise(rc)
        finally:
            self._users -= 1

    def agreed_call(self, header, out, coll, send, recv, n, dtype, op, root):
        """:meth:`agree` and collective ``coll`` (the record's code, ``record.COLLECTIVES``) in
        one rendezvous: the record rides on the data's first signal.  The other arguments are
        those of that collective's method here (``n``: its count, nbytes or block_bytes; a
        broadcast's buffer is ``recv``).  False when the records differ, or a peer agreed
        alone (it moves the data in a rendezvous of its own): ``out`` holds them, nothing
        moved, and the caller runs the collective's own method next, as that peer does."""
        self._live("agreed_call")
        self._records(header, out, "agreed_call")
        cdef int c = self._code(coll, "agreed_call", "coll")
        cdef uintptr_t s = self._ptr(send, "agreed_call", "send"), r = self._ptr(recv, "agreed_call", "recv")
        cdef size_t k = self._count(n, "agreed_call", "n")
        cdef int dt = self._code(dtype, "agreed_call", "dtype"), o = self._code(op, "agreed_call", "op")
        cdef int rt = self._code(root, "agreed_call", "root")
        return self.agreed(<const int64_t *>cnp.PyArray_DATA(header), <int64_t *>cnp.PyArray_DATA(out),
                           c, s, r, k, dt, o, rt) == 1

    cdef int agreed(self, const int64_t *rec, int64_t *res, int coll, uintptr_t send, uintptr_t recv, size_t n,
                    int dtype, int op, int root) except -1:
        """:meth:`agreed_call` on checked C values (records of ``UC_SHM_RECORD_WORDS`` and
        ``size`` x that): 1 done, 0 the records differ (nothing moved)."""
        cdef uc_shm *e = self._live("agreed_call")
        cdef int rc
        cdef PyThreadState *released = NULL
        self._users += 1  # the engine outlives every thread inside it (see close)
        try:
            if n <= _HOLD_GIL_BYTES // 8 // <size_t>self.size:
                rc = uc_shm_agreed_held(e, rec, res, coll, <const void *>send, <void *>recv, n, dtype, op, root,
                                        _release_gil, &released)
                if released != NULL:
                    PyEval_RestoreThread(released)
            else:
                with nogil:
                    rc = uc_shm_agreed(e, rec, res, coll, <const void *>send, <void *>recv, n, dtype, op, root)
            if rc == UC_SHM_EMISMATCH:
                return 0
            if rc:
                self._raise(rc)
        finally:
            self._users -= 1
        return 1

    # The collectives alone (their callers agreed already): each is uc_shm_agreed with no record.
    def all_reduce(self, send, recv, count, dtype, op):
        """``recv = op over ranks of send`` for ``count`` elements; recv may be send."""
        self._alone(UC_SHM_COLL_ALL_REDUCE, "all_reduce", send, recv, count, "count", dtype, op, 0)

    def reduce_scatter(self, send, recv, count, dtype, op):
        """Block i (``count`` elements) of every rank's send, reduced, lands in rank i's
        recv; recv may be block ``rank`` of send."""
        self._alone(UC_SHM_COLL_REDUCE_SCATTER, "reduce_scatter", send, recv, count, "count", dtype, op, 0)

    def reduce(self, send, recv, count, dtype, op, root):
        """Reduce into ``root``'s recv (ignored elsewhere; may be send at the root)."""
        self._alone(UC_SHM_COLL_REDUCE, "reduce", send, recv, count, "count", dtype, op, root)

    def broadcast(self, ptr, nbytes, root):
        self._alone(UC_SHM_COLL_BROADCAST, "broadcast", 0, ptr, nbytes, "nbytes", 0, 0, root, "ptr")

    def all_gather(self, send, recv, block_bytes):
        """recv[i*block_bytes:(i+1)*block_bytes] = rank i's send; send may be block
        ``rank`` of recv."""
        self._alone(UC_SHM_COLL_ALL_GATHER, "all_gather", send, recv, block_bytes, "block_bytes", 0, 0, 0)

    def all_to_all(self, send, recv, block_bytes):
        """Block i of send goes to rank i; block j of recv comes from rank j (no overlap)."""
        self._alone(UC_SHM_COLL_ALL_TO_ALL, "all_to_all", send, recv, block_bytes, "block_bytes", 0, 0, 0)

    def gather(self, send, recv, block_bytes, root):
        self._alone(UC_SHM_COLL_GATHER, "gather", send, recv, block_bytes, "block_bytes", 0, 0, root)

    def scatter(self, send, recv, block_bytes, root):
        self._alone(UC_SHM_COLL_SCATTER, "scatter", send, recv, block_bytes, "block_bytes", 0, 0, root)

    cdef _alone(self, int coll, str op, send, recv, n, str n_name, dtype, rop, root, str recv_name="recv"):
        self._live(op)
        cdef uintptr_t s = self._ptr(send, op, "send"), r = self._ptr(recv, op, recv_name)
        cdef size_t k = self._count(n, op, n_name)
        self.agreed(NULL, NULL, coll, s, r, k, self._code(dtype, op, "dtype"), self._code(rop, op, "op"),
                    self._code(root, op, "root"))

    # ---------------------------------------------------------------- helpers
    cdef uc_shm *_live(self, str op) except NULL:
        if self._e == NULL:
            raise InvalidUsage("the shared-memory engine is closed", op=op, rank=self.rank)
        return self._e

    cdef int _bad(self, str op, str message, str argument) except -1:
        """A bad argument: fail the engine (so that peers do not wait for us) and raise."""
        if self._e != NULL:
            uc_shm_fail(self._e, op.encode(), message.encode())
        raise InvalidArgument(message, op=op, rank=self.rank, argument=argument)

    cdef uintptr_t _ptr(self, object x, str op, str arg) except? 0:
        if type(x) is int and x >= 0:
            try:
                return <uintptr_t>x
            except OverflowError:
                pass
        elif _is_int(x) and 0 <= x < (1 << 64):
            return <uintptr_t>int(x)
        self._bad(op, f"must be an address (int >= 0), got {x!r}", arg)
        return 0

    cdef size_t _count(self, object x, str op, str arg) except? 0:
        if _is_int(x) and x >= 0:
            try:
                return <size_t>x
            except OverflowError:
                pass
        self._bad(op, f"must be an int >= 0, got {x!r}", arg)
        return 0

    cdef int _code(self, object x, str op, str arg) except? -1:
        if _is_int(x) and -(1 << 31) <= x < (1 << 31):
            return <int>x
        self._bad(op, f"must be an int, got {x!r}", arg)
        return -1

    cdef int _raise(self, int rc) except -1:
        if rc == UC_SHM_EINTR and PyErr_Occurred() != NULL:
            return -1  # the signal handler's exception (KeyboardInterrupt) is pending
        if rc == UC_SHM_EBUSY:
            raise InvalidUsage("another thread is running a call on this engine", rank=self.rank)
        _raise_error(uc_shm_last_error(self._e), self.rank)
        return -1


cdef int _raise_error(const uc_shm_error *err, int rank) except -1:
    cdef int i
    msg = err.message.decode(errors="replace")
    op = err.op.decode() if err.op != NULL else None
    code = err.code
    if code == UC_SHM_EINVAL:
        raise InvalidArgument(msg, op=op, rank=rank)
    if code == UC_SHM_EDEAD:
        raise RemoteError(msg, op=op, rank=rank, remote_rank=err.remote_rank, remote_pid=err.remote_pid,
                          remote_type="died")
    if code == UC_SHM_EREMOTE:
        raise RemoteError(msg, op=op, rank=rank, remote_rank=err.remote_rank)
    if code == UC_SHM_ETIMEOUT:
        missing = [err.missing[i] for i in range(err.nmissing)] if err.missing != NULL else []
        raise Timeout(msg, op=op, rank=rank, missing_ranks=missing)
    if code == UC_SHM_ECORRUPT:
        raise InternalError(msg, op=op, rank=rank, remote_rank=err.remote_rank, corrupt=True)
    if code == UC_SHM_EABORTED:
        raise InvalidUsage(msg, op=op, rank=rank, aborted=True)
    if code == UC_SHM_EREVOKED:
        raise Revoked(msg, op=op, rank=rank, remote_rank=err.remote_rank)
    if code == UC_SHM_ESYS:
        raise InternalError(msg, op=op, rank=rank, errno=err.sys_errno)
    raise InternalError(msg, op=op, rank=rank)
