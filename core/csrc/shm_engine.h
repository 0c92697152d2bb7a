/* uniccl intra-node shared-memory collective engine.
 *
 * One POSIX shared-memory segment per communicator holds a header, one control
 * block per rank (sequence counters on separate cache lines, an argument record,
 * the buffer address published for single-copy reads, an abort record) and two
 * data slots per rank.  Each collective is one call that runs to completion
 * without Python: the caller releases the GIL around it.
 *
 * Every rank must make the same sequence of calls with the same arguments (the
 * caller agrees on them first); the engine numbers the chunks it moves the same
 * way on every rank and synchronizes through monotonic per-rank counters.
 *
 * Pointers are host addresses; dtype and op are uniccl's codes (uniccl._types):
 * op is SUM, PROD, MAX or MIN only (AVG is SUM then a scale, done by the caller).
 * Functions return UC_SHM_OK (0) or an error code; the details (message, rank,
 * pid, missing ranks) are in uc_shm_last_error().  After an error other than
 * UC_SHM_EBUSY the engine is unusable and every peer waiting on it fails promptly.
 */
#ifndef UNICCL_SHM_ENGINE_H
#define UNICCL_SHM_ENGINE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* int fn(void *dst, const void *a, const void *b, size_t count, int dtype, int op):
 * dst[i] = op(a[i], b[i]); dst may equal a or b; 0 on success (hookspecs'
 * uniccl_host_reduce_kernel). */
typedef int (*uc_shm_reduce_fn)(void *dst, const void *a, const void *b, size_t count, int dtype, int op);

typedef struct uc_shm uc_shm;

enum {
    UC_SHM_OK = 0,
    UC_SHM_EINVAL,    /* bad argument (message names it) */
    UC_SHM_EDEAD,     /* a peer process died: remote_rank, remote_pid */
    UC_SHM_EREMOTE,   /* a peer failed or closed its engine: remote_rank (the culprit) */
    UC_SHM_ETIMEOUT,  /* missing[0..nmissing) never arrived within the timeout */
    UC_SHM_ESYS,      /* a system call failed: sys_errno */
    UC_SHM_EKERNEL,   /* the reduce kernel returned an error status */
    UC_SHM_EBROKEN,   /* an earlier error made the engine unusable */
    UC_SHM_EBUSY,     /* another thread is inside a call on this engine (engine still usable) */
    UC_SHM_EINTR,     /* the interrupt callback asked to stop (e.g. a pending KeyboardInterrupt) */
    UC_SHM_EABORTED,  /* uc_shm_abort was called on this rank (maybe from another thread) */
    UC_SHM_ECORRUPT,  /* data from remote_rank failed its checksum (checksums on) */
    UC_SHM_EMISMATCH, /* uc_shm_agreed: the ranks' records differ; nothing moved (engine usable) */
    UC_SHM_EREVOKED,  /* the communicator was revoked on remote_rank (uc_shm_revoke; maybe this rank) */
};

/* Called about every 10 ms while a call waits; nonzero stops the call with UC_SHM_EINTR. */
typedef int (*uc_shm_interrupt_fn)(void *ctx);

typedef struct {
    int code;
    int remote_rank; /* EDEAD / EREMOTE: the rank at fault, else -1 */
    long remote_pid; /* EDEAD: its pid */
    int sys_errno;   /* ESYS */
    int nmissing;    /* ETIMEOUT: ranks that had not arrived */
    const int *missing;
    const char *op; /* the call that failed ("all_reduce", "open", ...) */
    char message[512];
} uc_shm_error;

/* Tuning; zero fields take the defaults.  The creator's values are stored in the
 * segment and used by every rank (they select algorithms, so ranks must agree);
 * spin_ns/yield_ns are local. */
typedef struct {
    size_t small_bytes;          /* all_reduce/reduce up to this size: one round, every rank folds all */
    size_t cma_min_bytes;        /* single-copy reads for per-peer transfers of at least this many bytes */
    size_t nt_min_bytes;         /* outputs at least this large are written with non-temporal stores */
    size_t cma_reduce_min_bytes; /* reductions with single-copy pulls/pushes from this many bytes
                                    per rank's part ((size_t)-1: never) */
    size_t cma_bcast_max_bytes;  /* broadcasts this large or larger go through the slots even where
                                    single-copy reads are on ((size_t)-1: no limit; 0: the default,
                                    32 MiB, none where the calls' speeds choose) */
    uint64_t spin_ns;            /* busy-wait this long before yielding (default 20 us; none with
                                    more ranks than CPUs) */
    uint64_t yield_ns;           /* then sched_yield until this long, then sleep on a futex */
    int checksum;      /* creator: CRC-32C on every region read from a peer's slot (single-copy reads off) */
    uint32_t flip_ppm; /* creator, with checksum: flip a bit in this many per million copies (tests) */
    uint32_t cma_speed_ppm; /* creator: a single-copy read's speed over a plain copy's, per million, which
                               picks single-copy or the slots per collective (use_cma); 0: measured at
                               open where cma_allowed is 2, else UC_SHM_CMA_ALWAYS.  Measured, the engine
                               then follows the speeds its calls show (uc_shm_live_choices) */
    float slot_gbps;        /* creator, tests: every copy out of a peer's slot takes at least its bytes
                               / slot_gbps ns (a slow path between the ranks' cores); 0: off */
} uc_shm_tuning;

/* cma_speed_ppm of "not measured": every path that may read single-copy does */
#define UC_SHM_CMA_ALWAYS 0xFFFFFFFFu

/* Create (create != 0: O_CREAT|O_EXCL, mode 0600) or attach to segment `name`
 * ("/something"), as `rank` of `size`.  slot_bytes: a multiple of 4096 (attach: 0
 * or the creator's value).  reduce may be NULL if no reduction is ever called.
 * timeout in seconds per call (0: wait forever; dead peers are still detected).
 * cma_allowed = 0 forces the slot-copy fallback for this rank (and thereby for all); 1 allows
 * single-copy reads on every path that may take them; 2 (the creator's choice holds) measures them
 * against a plain copy first and takes them only where they win (uc_shm_tuning.cma_speed_ppm).
 * Returns NULL with *err filled on failure. */
uc_shm *uc_shm_open(const char *name, int rank, int size, int create, size_t slot_bytes,
                    uc_shm_reduce_fn reduce, double timeout, int cma_allowed, const uc_shm_tuning *tuning,
                    uc_shm_error *err);

void uc_shm_set_interrupt(uc_shm *e, uc_shm_interrupt_fn fn, void *ctx);

/* Remove the segment's name (creator; idempotent).  Also done automatically by the
 * creator once it has seen every rank attached (first call). */
int uc_shm_unlink(uc_shm *e);

/* Unmap and free (the creator also unlinks if it has not yet).  A peer still
 * waiting on this rank fails with UC_SHM_EREMOTE.  In a forked child it only
 * unmaps (the parent still owns the rank).  UC_SHM_EBUSY (and nothing done)
 * while a call is running on another thread. */
int uc_shm_close(uc_shm *e);

const uc_shm_error *uc_shm_last_error(const uc_shm *e);

/* Single-copy (process_vm_readv) state: -1 not decided yet (first call decides,
 * collectively), 0 off, 1 on; reason says why it is off. */
int uc_shm_cma(const uc_shm *e);
const char *uc_shm_cma_reason(const uc_shm *e);
void uc_shm_get_tuning(const uc_shm *e, uc_shm_tuning *out, size_t *slot_bytes);

/* Mark the engine failed with `message` (a bad argument found by the caller), so
 * that peers waiting on this rank fail too.  Returns UC_SHM_EINVAL. */
int uc_shm_fail(uc_shm *e, const char *op, const char *message);

/* From any thread: peers fail at once ("rank r failed: <why>"), and a call waiting on
 * this engine returns UC_SHM_EABORTED within about 10-20 ms.  The engine stays unusable. */
void uc_shm_abort(uc_shm *e, const char *why);

/* From any thread: every later or waiting call of every rank returns UC_SHM_EREVOKED with
 * `why` (within about 10-20 ms), remote_rank naming this rank; close works as usual.  A no-op
 * once this rank's engine failed, was aborted or was revoked. */
void uc_shm_revoke(uc_shm *e, const char *why);

/* Checksums: on?, regions that failed their check, copies made again. */
void uc_shm_integrity(const uc_shm *e, int *on, uint64_t *failures, uint64_t *recopies);

/* Arrivals: at each call's first rendezvous, how long this rank waited for the last rank to
 * arrive (its arrival skew; 0 when it was the last itself).  hist[b]: calls whose wait was
 * below 2^b ns (b = 0: no wait); the last bucket takes the rest. */
#define UC_SHM_ARRIVAL_BUCKETS 40
typedef struct {
    uint64_t calls, last, wait_ns;
    uint64_t hist[UC_SHM_ARRIVAL_BUCKETS];
} uc_shm_arrivals;
void uc_shm_get_arrivals(const uc_shm *e, uc_shm_arrivals *out);
/* Benchmarks only (the placebo method): count arrivals (1, the default) or not (0). */
void uc_shm_count_arrivals(uc_shm *e, int on);

/* Seconds each later call may wait (0: forever; dead peers are still detected). */
int uc_shm_set_timeout(uc_shm *e, double timeout);

/* Live choices (cma_speed_ppm measured at open): for collective `coll` (a UC_SHM_COLL_* code but
 * barrier) per size class of its transfer per peer (class b: from 16 KiB << b, the last from 2 MiB
 * up), the path in force on this rank (choice[b]: 0 none yet: the open's measure against the
 * collective's break-even; 1 the slots; 2 single-copy reads; every rank of a call holds the same, see
 * shm_engine.c) and this rank's running estimates of its calls' speed on each path, GB/s of the
 * transfer per peer (0: none yet).  Returns 0, or UC_SHM_EINVAL where the choices are not live (the
 * speed ratio is fixed) or coll is not one. */
#define UC_SHM_SPEED_CLASSES 8
int uc_shm_live_choices(const uc_shm *e, int coll, int *choice, double *slot_gbps, double *cma_gbps);

/* Tracing (UNICCL_TRACE): with a capacity > 0 the engine records what each call does with
 * its peers' data, one event per transfer: read from or written to a peer's memory
 * (single-copy), copied out of a peer's slot, or reduced; wall-clock (CLOCK_REALTIME) ns.
 * uc_shm_take_events copies out up to `max` events, oldest first, and empties the record
 * (events beyond the capacity are counted in *dropped).  Capacity 0 turns it off. */
enum { UC_SHM_EV_READ = 0, UC_SHM_EV_WRITE = 1, UC_SHM_EV_COPY = 2, UC_SHM_EV_REDUCE = 3 };
typedef struct {
    uint64_t t0_ns, t1_ns, bytes;
    int32_t kind, peer; /* peer -1: every rank's data (a reduction) */
} uc_shm_event;
int uc_shm_trace(uc_shm *e, size_t capacity);
size_t uc_shm_take_events(uc_shm *e, uc_shm_event *out, size_t max, uint64_t *dropped);
size_t uc_shm_event_count(const uc_shm *e); /* events recorded since the last take */

/* A call's record: the words every rank must agree on before data moves (the one definition:
 * Python reads it as uniccl.transport.record.RECORD_WORDS, through _shm, for every transport). */
#define UC_SHM_RECORD_WORDS 8

/* Allgather of one UC_SHM_RECORD_WORDS x int64 record per rank: out[size][UC_SHM_RECORD_WORDS].
 * A barrier. */
int uc_shm_agree(uc_shm *e, const int64_t *record, int64_t *out);
int uc_shm_barrier(uc_shm *e);

int uc_shm_all_reduce(uc_shm *e, const void *send, void *recv, size_t count, int dtype, int op);
/* The collectives' codes: the COLL field of a call's record (uniccl.transport.record.COLLECTIVES). */
enum {
    UC_SHM_COLL_BARRIER = 0,
    UC_SHM_COLL_ALL_REDUCE = 1,
    UC_SHM_COLL_REDUCE = 2,
    UC_SHM_COLL_BROADCAST = 3,
    UC_SHM_COLL_ALL_GATHER = 4,
    UC_SHM_COLL_REDUCE_SCATTER = 5,
    UC_SHM_COLL_ALL_TO_ALL = 6,
    UC_SHM_COLL_GATHER = 7,
    UC_SHM_COLL_SCATTER = 8,
};
/* uc_shm_agree and collective `coll` in one rendezvous: ``record`` is published with the
 * data's first signal; UC_SHM_EMISMATCH (out filled, nothing moved) when the records differ or
 * a peer agreed alone (uc_shm_agree: its data moves in a rendezvous of its own; the caller then
 * runs the collective's own entry point, as that peer does).  The arguments are those of the collective's own
 * entry point below: n its count (reductions), nbytes (broadcast, whose buffer is recv) or block_bytes (the
 * others); op, root where it has them. record NULL: the collective alone, with no agreement (its callers
 * agreed already). */
int uc_shm_agreed(uc_shm *e, const int64_t *record, int64_t *out, int coll, const void *send, void *recv,
                  size_t n, int dtype, int op, int root);
/* uc_shm_agreed by a caller that holds a lock other threads may want (Python's GIL): the call
 * runs unlock(ctx) the first time it has to wait longer than a short spin, once (never if
 * it does not).  A small call usually completes within the spin, saving the lock's release
 * and reacquisition. */
typedef void (*uc_shm_unlock_fn)(void *ctx);
int uc_shm_agreed_held(uc_shm *e, const int64_t *record, int64_t *out, int coll, const void *send, void *recv,
                       size_t n, int dtype, int op, int root, uc_shm_unlock_fn unlock, void *ctx);
/* count: elements per rank block; recv may be block `rank` of send.  op | UC_SHM_RING_ORDER:
 * block b is folded as gloo's ring adds it, ((x[b-1] + x[b-2]) + ...) + x[b] (ranks mod n). */
#define UC_SHM_RING_ORDER 0x100
int uc_shm_reduce_scatter(uc_shm *e, const void *send, void *recv, size_t count, int dtype, int op);
/* recv only used at root (may equal send there). */
int uc_shm_reduce(uc_shm *e, const void *send, void *recv, size_t count, int dtype, int op, int root);
int uc_shm_broadcast(uc_shm *e, void *buf, size_t nbytes, int root);
/* send may be block `rank` of recv. */
int uc_shm_all_gather(uc_shm *e, const void *send, void *recv, size_t block_bytes);
/* send and recv must not overlap. */
int uc_shm_all_to_all(uc_shm *e, const void *send, void *recv, size_t block_bytes);
/* recv used at root only; send may be block `root` of recv there. */
int uc_shm_gather(uc_shm *e, const void *send, void *recv, size_t block_bytes, int root);
/* send used at root only; recv may be block `root` of send there. */
int uc_shm_scatter(uc_shm *e, const void *send, void *recv, size_t block_bytes, int root);

#ifdef __cplusplus
}
#endif
#endif
