/* uniccl intra-node shared-memory collective engine: see shm_engine.h.
 *
 * Segment layout (offsets from the mapping's base):
 *   0                 uc_hdr (one page)
 *   4096              uc_ctrl[size]       per-rank control blocks
 *   slot_off          slot[rank][2]       slot_bytes each, page aligned
 *
 * Synchronization.  Each rank has three monotonic counters, each on its own
 * 128-byte line: ready, reduced, consumed.  Data moves in "chunks" numbered g =
 * 0, 1, 2, ... identically on every rank (every call advances the same number).
 * A counter holds 1 + the last chunk for which its owner signalled that phase, so
 * waits are "counter >= g + 1" and stay exact when a peer runs ahead.  Invariants:
 *   - every rank signals consumed = g + 1 once it has finished every read of
 *     chunk g (also when it had nothing to read), in chunk order;
 *   - chunk g uses slot g % 2; before writing its slot for chunk g a rank waits
 *     for consumed >= g - 1 on every rank (chunk g - 2, the slot's previous user,
 *     finished everywhere);
 *   - a rank overwrites its published record / buffer address only after every
 *     peer consumed the chunk that published the previous one.
 * A call whose payload fits a box (uc_box, two per rank in its control block) skips the slots:
 * record and payload go in box g % 2 before READY, and the peers read them there.
 * A wait spins (pause), then yields, then sleeps on a futex (the signaller wakes
 * only when a sleeper registered); after CHECK_NS of waiting it checks every
 * CHECK_NS for aborted peers, dead awaited peers and the per-call timeout.
 *
 * Reductions: element i of the result is computed by exactly one rank (or, in the
 * one-round small variant, identically by every rank) as
 * ((x0 op x1) op x2) ... op x(n-1), so every rank gets the same bits. */
#define _GNU_SOURCE
#include "shm_engine.h"

#include "crc32c.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <linux/futex.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#if defined(__x86_64__) || defined(__i386__)
#include <emmintrin.h>
#define UC_X86 1
#endif

#define UC_SHM_MAGIC 0x48536c6363696e75ULL /* "uniccl SH" little endian */
#define UC_SHM_VERSION                                                                                       \
    12 /* 2: the record moved into the ready line; 3: its with_data flag; 4: cma_bcast_max_bytes; 5: boxes;  \
         6: cma_speed_ppm; 7: live speeds; 8: live choices per collective from whole calls (choice, obs);    \
         9: 8 KiB boxes; 10: a box's stamp, form and packed record in its first line;                        \
         11: stage_nt_max_bytes; 12: no pipe_min_bytes (a broadcast's chunks are whole slots) */
#define LINE 128 /* two 64-byte lines: the adjacent-line prefetcher moves pairs */
#define PAGE 4096
#define NREC UC_SHM_RECORD_WORDS
/* see uc_box: 8 KiB of payload and the record, in whole LINEs.  Up to there a box's one rendezvous beats
 * the slots (4 KiB calls, 4 ranks on 2 cores: 3.7-4.6 against 6.3-7.4 us; 2 ranks: up to 0.07 us less) */
#define BOX_BYTES (8192 + 2 * LINE)
#define INLINE_BYTES (8192 + 64) /* a call's payload that fits a box (uc_box: after the full record) */
#define NDTYPES 12
/* Live choices (see "live choices" below): per collective with a choice (UC_SHM_COLL_*, barrier has
 * none) and size class of its transfer per peer, from 16 KiB by powers of two, the last class taking
 * the rest; a choice is 2 bits (CHOICE_*), NCHOICE_BITS of them by parity in rank 0's ready line */
#define NBUCKETS UC_SHM_SPEED_CLASSES
#define BUCKET_MIN_LOG2 14
#define NCOLLS (UC_SHM_COLL_SCATTER + 1)
#define NCHOICE_WORDS 2 /* (NCOLLS - 1) * NBUCKETS choices of 2 bits in 64-bit words */
enum { CHOICE_MODEL = 0, CHOICE_SLOTS = 1, CHOICE_CMA = 2 };
_Static_assert((NCOLLS - 1) * NBUCKETS * 2 <= NCHOICE_WORDS * 64, "the choices fit their words");
#define PROBE_NS 1000000000ULL      /* the path a choice left is timed again after this long */
#define EXPLORE 4                   /* a class's first calls on each path where the two are near (decide) */
#define NOPS 4                      /* SUM PROD MAX MIN */
#define CHECK_NS 10000000ULL        /* health checks: after and every 10 ms of waiting */
#define SLEEP_NS 10000000L          /* futex sleeps at most this long between checks */
#define OPEN_WAIT_NS 10000000000ULL /* attach: wait this long for the creator's header */

/* ABORT_TIMEOUT: this rank's call timed out waiting for the ranks in abort_missing; peers
 * report a timeout too (naming the same ranks), not a remote failure.  ABORT_REVOKED: this rank
 * revoked the communicator (uc_shm_revoke): every call of every rank fails, the engine stays
 * mapped and closes as usual, and no peer echoes it (each reads the revoker's own record). */
enum {
    ABORT_NONE = 0,
    ABORT_FAILED = 1,
    ABORT_DEAD = 2,
    ABORT_CLOSED = 3,
    ABORT_TIMEOUT = 4,
    ABORT_REVOKED = 5
};
enum { REQUEST_ABORT = 1, REQUEST_REVOKE = 2 }; /* abort_requested: what this rank asked for */
#define MAX_MISSING 64                          /* ranks a timeout can name to its peers */

static const size_t ITEMSIZE[NDTYPES] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2, 2, 2};

/* ------------------------------------------------------------------ layout */
typedef struct {
    _Alignas(LINE) _Atomic uint64_t seq; /* 1 + last chunk signalled */
    _Atomic uint32_t sleepers;           /* ranks in futex_wait on seq */
    uint32_t with_data; /* ready line: 1 when the record published with this signal has its call's
                         * data in the same rendezvous (uc_shm_agreed), 0 after an agreement alone */
    uint64_t pub_addr;  /* ready line: buffers published for single-copy reads/writes (pid: uc_ctrl) */
    uint64_t pub_addr2; /* ... the second one (a reduction's recv) */
    /* ready line of rank 0: its choices between single-copy reads and the slots (live_publish),
     * double-buffered by the parity of the rendezvous they ride on */
    uint64_t choice[2][NCHOICE_WORDS];
    /* ready line: the call's record (agree_impl, rec_publish), in the 64 bytes after the
     * signal's: a peer that sees the signal has the record's line on its way (the adjacent-line
     * prefetcher moves the pair), not a third line to fetch */
    _Alignas(64) int64_t record[NREC];
} uc_line;
_Static_assert(sizeof(uc_line) == LINE,
               "a line is one LINE-sized unit: the signal's and the record's 64 bytes");

/* A small call's one rendezvous (box_meet): its record and its whole payload (every byte any
 * peer reads from this rank in that call), published together before the READY signal, read by
 * the peers straight from here -- no slot, no second line to fetch for the record.  Two boxes
 * used by chunk parity: a box is rewritten two calls later, when every peer is known to be past
 * the call that read it (its READY of the call between), so a run of small calls never waits
 * on a CONSUMED line. */
typedef struct {
    _Alignas(LINE) _Atomic uint64_t stamp; /* g + 1 once this box holds rendezvous g's publication */
    uint32_t form;                         /* BOX_*: where its record is */
    uint32_t pad_;
    int32_t packed[NREC]; /* BOX_PACKED: the record, every field fitting 32 bits */
    int64_t record[NREC]; /* BOX_FULL: the record */
    uint8_t data[BOX_BYTES - 48 - NREC * sizeof(int64_t)];
} uc_box;
_Static_assert(sizeof(uc_box) == BOX_BYTES, "a box is BOX_BYTES");
_Static_assert(offsetof(uc_box, record) == 48 && offsetof(uc_box, data) == 112, "the box's head as laid out");
_Static_assert(BOX_BYTES - offsetof(uc_box, data) >= INLINE_BYTES,
               "a box holds INLINE_BYTES after a full record");
/* The box's first 64 bytes hold its stamp, its form and a packed record, and then (BOX_PACKED) the
 * first 16 bytes of the payload: a peer waiting for an agreeing small call reads that one line,
 * where the READY line, the record's and the payload's were three misses in a row (in the VM's
 * slow spells, when a line between its cores costs most, a third of an 8-byte call). */
enum { BOX_NONE = 0, BOX_FULL = 2, BOX_PACKED = 3 };
#define BOX_PACKED_DATA 48 /* where a BOX_PACKED box's payload starts */

typedef struct {
    uc_line ready, reduced, consumed;
    uc_line hello;                      /* seq = 1 once attached (pid, start_time, base_addr valid) */
    uc_line probe;                      /* seq = 1 once the CMA verdict is published */
    _Alignas(LINE) _Atomic int32_t cpu; /* CPU this rank last waited on (co-location check) */
    _Alignas(LINE) _Atomic int64_t pid;
    uint64_t start_time; /* /proc/<pid>/stat starttime (pid reuse check), 0 unknown */
    uint64_t pidns;      /* inode of /proc/self/ns/pid, 0 unknown: pids mean nothing across namespaces */
    uint64_t base_addr;  /* where this rank mapped the segment: the CMA probe reads it */
    uint32_t verdict;    /* CMA: 1 could read every peer, 2 could not (or disabled) */
    int32_t verdict_errno, verdict_peer;
    _Atomic int32_t abort_code; /* ABORT_*: this rank failed / saw a death / closed */
    int32_t abort_rank;         /* the culprit */
    int64_t abort_pid;
    char abort_text[256];
    int32_t abort_nmissing;
    int32_t abort_missing[MAX_MISSING];
    uc_box box[2]; /* by chunk parity; ready.with_data == 2: the record of the rendezvous is here */
    /* this rank's running estimates of whole calls' speeds, bytes of transfer per peer per ns (float
     * bits; 0 none yet), per collective, size class and path (0 slots, 1 single-copy): rank 0 reads
     * them (live_publish) */
    _Alignas(LINE) _Atomic uint32_t obs[NCOLLS][NBUCKETS][2];
    /* when this rank chose its path in its call number path_seq that chose (choose_cma): a peer times
     * the call from the last rank's arrival (path_timed), not from its own early one */
    _Alignas(LINE) _Atomic uint64_t path_seq;
    _Atomic uint64_t path_t0;
} uc_ctrl;

typedef struct {
    _Atomic uint64_t magic; /* stored last by the creator */
    uint32_t version, size;
    uint64_t slot_bytes, total_bytes, ctrl_bytes;
    uint64_t small_bytes, cma_min_bytes, cma_reduce_min_bytes, nt_min_bytes, cma_bcast_max_bytes;
    uint64_t stage_nt_max_bytes; /* a broadcast's chunks up to this size are staged with streaming stores */
    int64_t creator_pid;
    uint32_t checksum; /* 1: every region read from a peer's slot is CRC-checked (the creator's choice) */
    uint32_t flip_ppm; /* fault injection: a reader's copy gets a bit flipped, per million copies */
    uint32_t cma_speed_ppm; /* single-copy read over plain copy speed (use_cma), the creator's */
    uint32_t live;          /* 1: cma_speed_ppm was measured, and the choices go live (live_publish) */
    float slot_gbps;        /* uc_shm_tuning.slot_gbps */
} uc_hdr;

struct uc_shm {
    int rank, size, creator, unlinked, cma_allowed, cma;
    char name[256];
    char cma_reason[256];
    uint8_t *base;
    size_t map_bytes;
    uc_hdr *hdr;
    uc_ctrl *ctrl;
    uint8_t *slots;
    size_t slot_bytes, small_bytes, cma_min_bytes, cma_reduce_min_bytes, nt_min_bytes, cma_bcast_max_bytes;
    size_t stage_nt_max_bytes;
    uint32_t cma_speed_ppm;
    int live;                            /* uc_hdr.live */
    uint64_t choice[NCHOICE_WORDS];      /* the choices in force (adopted at the last rendezvous) */
    uint64_t next_choice[NCHOICE_WORDS]; /* rank 0: what it publishes next */
    uint64_t judged;                     /* rendezvous judged so far (the same count on every rank) */
    size_t cls;                          /* this call's transfer per peer where it chose a path (0: none) */
    int path_coll, path;                 /* ... its collective and path (0 slots, 1 single-copy) */
    uint64_t t_path;                     /* ... when it chose */
    uint64_t chosen;                     /* calls that chose so far (the same count on every rank) */
    float slot_gbps;                     /* uc_hdr.slot_gbps */
    uint64_t spin_ns, yield_ns;
    int quick_spins; /* wait_for's spins before its first clock reading */
    uc_shm_reduce_fn reduce;
    uc_shm_interrupt_fn interrupt;
    void *interrupt_ctx;
    uc_shm_unlock_fn unlock; /* uc_shm_agreed_held: run before this call's first long wait */
    void *unlock_ctx;
    long owner_pid; /* the process that opened it (a forked child must not act for it) */
    uint64_t timeout_ns;
    uint64_t g;            /* next chunk number */
    uint64_t agree_g;      /* 1 + chunk of my last record in the ready line, 0 none */
    uint64_t boxed_g;      /* 1 + chunk of my last record in a box, 0 none */
    uint64_t box_g[2];     /* 1 + chunk that last wrote each box, 0 none */
    uint64_t floor;        /* every peer's CONSUMED is known to be >= this */
    const int64_t *rec_in; /* uc_shm_agreed: this rank's record, until judged */
    int64_t *rec_out;      /* ... and where every rank's record goes */
    int arriving;          /* in the rendezvous that starts a call: a timeout there means "never came" */
    _Atomic int busy;
    _Atomic int abort_requested; /* REQUEST_*: uc_shm_abort / uc_shm_revoke: the running call gives up */
    int broken;
    int used_nt;
    const char *op;
    uint64_t t_call; /* when the call first waited (its timeout counts from there), 0 not yet */
    uint64_t g_call; /* e->g when the call began: chunks are numbered from there in messages */
    int checksum;    /* see uc_hdr.checksum */
    uint32_t flip_ppm;
    uint64_t rng;   /* xorshift state of the fault injection */
    uint32_t *crcs; /* [rank][slot 2][size + 1]: CRC of each region a rank wrote in its slot */
    uint64_t crc_failures, recopies;
    uc_shm_arrivals arrivals; /* see uc_shm_get_arrivals */
    int count_arrivals;       /* ... counted (uc_shm_count_arrivals) */
    const void **src;         /* [2 * size] scratch for folds (the second half: fold's ring order) */
    uc_shm_event *ev;         /* uc_shm_trace: events of the calls since the last take */
    size_t ev_cap, ev_n;
    uint64_t ev_dropped;
    int ring_order; /* this call folds in gloo's ring order (UC_SHM_RING_ORDER) */
    long *pids;     /* [size] peers' pids (after the first call) */
    int *missing;   /* [size] */
    uc_shm_error err;
    char first_error[512];
    /* live choices, last: 3 KiB that only calls of 16 KiB or more touch, away from the fields every
     * small call reads (here an 8-byte all_reduce took 0.32 us with them after `live`, 0.31 before) */
    float est[NCOLLS][NBUCKETS][2];           /* this rank's running speeds (obs), bytes per ns */
    uint64_t sampled_ns[NCOLLS][NBUCKETS][2]; /* ... when last timed */
    uint32_t samples[NCOLLS][NBUCKETS][2];    /* ... how many calls timed (the first is cold) */
    uint8_t used[NCOLLS];                     /* rank 0: size classes (bits) of the calls that chose */
    uint64_t probed_ns[NCOLLS][NBUCKETS];     /* rank 0: when it last sent a class to the path it left */
};

#define OFF_READY offsetof(uc_ctrl, ready)
#define OFF_REDUCED offsetof(uc_ctrl, reduced)
#define OFF_CONSUMED offsetof(uc_ctrl, consumed)
#define OFF_HELLO offsetof(uc_ctrl, hello)
#define OFF_PROBE offsetof(uc_ctrl, probe)

/* ------------------------------------------------------------------ helpers */
/* This process's id, kept by a fork handler: every call checks that a forked child is not
 * using its parent's engine, and getpid() is a system call (measured 150 ns on a 2-core VM,
 * a fifth of an 8-byte call).  fork() (Python's os.fork too) runs the handler in the child. */
static _Atomic long self_pid_cache;
static pthread_once_t self_pid_once = PTHREAD_ONCE_INIT;

static void self_pid_reset(void) {
    atomic_store_explicit(&self_pid_cache, (long)getpid(), memory_order_relaxed);
}

static void self_pid_init(void) {
    self_pid_reset();
    pthread_atfork(NULL, NULL, self_pid_reset);
}

static inline long self_pid(void) {
    return atomic_load_explicit(&self_pid_cache, memory_order_relaxed);
}

static inline void cpu_relax(void) {
#if defined(UC_X86)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield" ::: "memory");
#else
    atomic_signal_fence(memory_order_seq_cst);
#endif
}

static inline uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

static inline uint32_t *futex_word(uc_line *l) {
#if __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    return (uint32_t *)&l->seq + 1;
#else
    return (uint32_t *)&l->seq; /* the low half of the counter */
#endif
}

static inline uc_line *line_of(uc_shm *e, int r, size_t off) {
    return (uc_line *)((char *)&e->ctrl[r] + off);
}

static inline uint8_t *slot(uc_shm *e, int r, uint64_t g) {
    return e->slots + ((size_t)r * 2 + (size_t)(g & 1)) * e->slot_bytes;
}

static inline void signal_line(uc_line *l, uint64_t v) {
    /* seq_cst store then load: either the waiter sees v or we see its registration */
    atomic_store_explicit(&l->seq, v, memory_order_seq_cst);
    if (atomic_load_explicit(&l->sleepers, memory_order_seq_cst))
        syscall(SYS_futex, futex_word(l), FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

static inline void sig(uc_shm *e, size_t off, uint64_t v) {
    signal_line(line_of(e, e->rank, off), v);
}

static void wake_all_mine(uc_shm *e) {
    static const size_t offs[] = {OFF_READY, OFF_REDUCED, OFF_CONSUMED, OFF_HELLO, OFF_PROBE};
    for (size_t i = 0; i < sizeof offs / sizeof offs[0]; i++)
        syscall(SYS_futex, futex_word(line_of(e, e->rank, offs[i])), FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

#if defined(UC_X86)
/* 64 bytes a step through SSE2 registers, with streaming (non-temporal) or plain stores. */
static void copy_vec(char *d, const char *s, size_t n, int stream) {
    for (; n >= 64; n -= 64, d += 64, s += 64) {
        __m128i a = _mm_loadu_si128((const __m128i *)s), b = _mm_loadu_si128((const __m128i *)(s + 16));
        __m128i c = _mm_loadu_si128((const __m128i *)(s + 32)),
                f = _mm_loadu_si128((const __m128i *)(s + 48));
        if (stream) {
            _mm_stream_si128((__m128i *)d, a);
            _mm_stream_si128((__m128i *)(d + 16), b);
            _mm_stream_si128((__m128i *)(d + 32), c);
            _mm_stream_si128((__m128i *)(d + 48), f);
        } else {
            _mm_storeu_si128((__m128i *)d, a);
            _mm_storeu_si128((__m128i *)(d + 16), b);
            _mm_storeu_si128((__m128i *)(d + 32), c);
            _mm_storeu_si128((__m128i *)(d + 48), f);
        }
    }
    memcpy(d, s, n);
}
#endif

/* Non-temporal copy for outputs that will not fit in cache: no read-for-ownership
 * of the destination, so DRAM sees one write instead of a read and a write. */
static void copy_nt(void *dst, const void *src, size_t n) {
#if defined(UC_X86)
    char *d = dst;
    const char *s = src;
    size_t head = (size_t)(-(uintptr_t)d) & 15;
    if (head > n) head = n;
    memcpy(d, s, head);
    copy_vec(d + head, s + head, n - head, 1);
#else
    memcpy(dst, src, n);
#endif
}

/* memcpy, but not for the copies glibc's memcpy makes ~10x slower on AMD Zen 3: from 2 KiB
 * (2.36's rep movsb) with the destination a few bytes past the source modulo 4 KiB -- a numpy
 * array 16 bytes into its page filled from a page-aligned slot moved 3 GB/s where a vector loop
 * moves 40 (from 1 MiB glibc copies otherwise).  Those go through the loop. */
static void copy_mem(void *dst, const void *src, size_t n) {
#if defined(UC_X86)
    size_t ahead = ((uintptr_t)dst - (uintptr_t)src) & 4095;
    if (n >= 2048 && ahead && ahead < 64) {
        copy_vec(dst, src, n, 0);
        return;
    }
#endif
    memcpy(dst, src, n);
}

static inline void copy_out(uc_shm *e, void *dst, const void *src, size_t n, int nt) {
    if (nt) {
        copy_nt(dst, src, n);
        e->used_nt = 1;
    } else {
        copy_mem(dst, src, n);
    }
}

static inline void nt_fence(uc_shm *e) {
#if defined(UC_X86)
    if (e->used_nt) _mm_sfence();
#endif
    e->used_nt = 0;
}

static int overlaps(const void *a, size_t na, const void *b, size_t nb) {
    uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;
    return na && nb && x < y + nb && y < x + na;
}

/* ------------------------------------------------------------------- errors */
static void set_err(uc_shm_error *err, int code, const char *op, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void set_err(uc_shm_error *err, int code, const char *op, const char *fmt, ...) {
    va_list ap;
    err->code = code;
    err->op = op;
    err->remote_rank = -1;
    err->remote_pid = 0;
    err->sys_errno = 0;
    err->nmissing = 0;
    va_start(ap, fmt);
    vsnprintf(err->message, sizeof err->message, fmt, ap);
    va_end(ap);
}

/* Publish this rank's failure so that peers waiting on it fail promptly. */
static void publish_abort(uc_shm *e, int code, int culprit, long pid, const char *text) {
    uc_ctrl *me = &e->ctrl[e->rank];
    if (atomic_load_explicit(&me->abort_code, memory_order_relaxed) != ABORT_NONE) return;
    me->abort_rank = culprit;
    me->abort_pid = pid;
    snprintf(me->abort_text, sizeof me->abort_text, "%s", text);
    atomic_store_explicit(&me->abort_code, code, memory_order_seq_cst);
    wake_all_mine(e);
}

/* Record e->err as fatal: the engine is unusable from now on. */
static int fatal(uc_shm *e) {
    if (!e->broken) {
        e->broken = 1;
        snprintf(e->first_error, sizeof e->first_error, "%s", e->err.message);
        if (e->err.code == UC_SHM_EDEAD)
            publish_abort(e, ABORT_DEAD, e->err.remote_rank, e->err.remote_pid, e->err.message);
        else if (e->err.code == UC_SHM_EREMOTE)
            ; /* published by the caller with the original culprit */
        else if (e->err.code == UC_SHM_ETIMEOUT) {
            uc_ctrl *me = &e->ctrl[e->rank];
            int k = e->err.nmissing < MAX_MISSING ? e->err.nmissing : MAX_MISSING;
            for (int i = 0; i < k; i++)
                me->abort_missing[i] = e->err.missing[i];
            me->abort_nmissing = k;
            publish_abort(e, ABORT_TIMEOUT, k ? e->err.missing[0] : e->rank, (long)getpid(), e->err.message);
        } else
            publish_abort(e, ABORT_FAILED, e->rank, (long)getpid(), e->err.message);
    }
    return e->err.code;
}

#define FAIL(e, code, ...) (set_err(&(e)->err, (code), (e)->op, __VA_ARGS__), fatal(e))

static int sys_fail(uc_shm *e, const char *what) {
    int saved = errno;
    set_err(&e->err, UC_SHM_ESYS, e->op, "%s failed: %s", what, strerror(saved));
    e->err.sys_errno = saved;
    return fatal(e);
}

/* ----------------------------------------------------------------- liveness */
/* Parse state and starttime (fields 3 and 22) of /proc/<pid>/stat.  0 ok, -1 no such
 * process, -2 cannot tell. */
static int proc_stat(long pid, char *state, uint64_t *start) {
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%ld/stat", pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return errno == ENOENT || errno == ESRCH ? -1 : -2;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0) return n < 0 && errno == ESRCH ? -1 : -2;
    buf[n] = 0;
    char *p = strrchr(buf, ')');
    if (!p || p[1] != ' ') return -2;
    p += 2;
    *state = *p;
    for (int field = 3; field < 22; field++) {
        p = strchr(p, ' ');
        if (!p) return -2;
        p++;
    }
    *start = strtoull(p, NULL, 10);
    return 0;
}

/* Do rank q's pids name processes in our pid namespace? */
static int same_pidns(uc_shm *e, int q) {
    uint64_t mine = e->ctrl[e->rank].pidns, theirs = e->ctrl[q].pidns;
    return !mine || !theirs || mine == theirs;
}

/* Is rank q's process gone (exited, zombie, or its pid reused)? */
static int peer_dead(uc_shm *e, int q) {
    long pid = (long)atomic_load_explicit(&e->ctrl[q].pid, memory_order_acquire);
    if (pid <= 0 || !same_pidns(e, q))
        return 0; /* not attached yet, or another pid namespace: cannot tell (timeouts still apply) */
    char state = 0;
    uint64_t start = 0;
    int rc = proc_stat(pid, &state, &start);
    if (rc == -1) return 1;
    if (rc == 0) {
        if (state == 'Z' || state == 'X' || state == 'x') return 1;
        uint64_t want = e->ctrl[q].start_time;
        return want && start != want;
    }
    return kill((pid_t)pid, 0) != 0 && errno == ESRCH;
}

/* ------------------------------------------------------------------- waits */
static int next_pending(uc_shm *e, size_t off, uint64_t target, int only, int from) {
    if (only >= 0)
        return from <= only &&
                       atomic_load_explicit(&line_of(e, only, off)->seq, memory_order_acquire) < target
                   ? only
                   : -1;
    for (int q = from; q < e->size; q++)
        if (q != e->rank && atomic_load_explicit(&line_of(e, q, off)->seq, memory_order_acquire) < target)
            return q;
    return -1;
}

static int remote_abort(uc_shm *e, int p) {
    uc_ctrl *c = &e->ctrl[p];
    int code = atomic_load_explicit(&c->abort_code, memory_order_acquire);
    if (code == ABORT_REVOKED) { /* not fatal here: the engine is left as it is, for close */
        set_err(&e->err, UC_SHM_EREVOKED, e->op, "%s", c->abort_text);
        e->err.remote_rank = c->abort_rank;
        return UC_SHM_EREVOKED;
    }
    if (code == ABORT_TIMEOUT) { /* the same verdict here: a timeout, naming the same ranks */
        int k = c->abort_nmissing < e->size ? c->abort_nmissing : e->size;
        for (int i = 0; i < k; i++)
            e->missing[i] = c->abort_missing[i];
        set_err(&e->err, UC_SHM_ETIMEOUT, e->op, "%s", c->abort_text);
        e->err.nmissing = k;
        e->err.missing = e->missing;
        e->err.remote_rank = c->abort_rank;
        if (!e->broken) {
            e->broken = 1;
            snprintf(e->first_error, sizeof e->first_error, "%s", e->err.message);
        }
        return UC_SHM_ETIMEOUT;
    }
    if (code == ABORT_DEAD) {
        set_err(&e->err, UC_SHM_EDEAD, e->op, "rank %d (pid %ld) died during %s (seen by rank %d)",
                c->abort_rank, (long)c->abort_pid, e->op, p);
        e->err.remote_rank = c->abort_rank;
        e->err.remote_pid = (long)c->abort_pid;
        return fatal(e);
    }
    set_err(&e->err, UC_SHM_EREMOTE, e->op, "rank %d failed during %s: %s", c->abort_rank, e->op,
            c->abort_text);
    e->err.remote_rank = c->abort_rank;
    fatal(e);
    publish_abort(e, ABORT_FAILED, c->abort_rank, (long)c->abort_pid, c->abort_text);
    return UC_SHM_EREMOTE;
}

/* What a wait on line `off` reaching `target` is for, in words. */
static const char *awaited(uc_shm *e, size_t off, uint64_t target) {
    static _Thread_local char buf[96];
    unsigned long long chunk = (unsigned long long)(target - 1 - e->g_call);
    if (e->arriving || strcmp(e->op ? e->op : "", "agree") == 0 || off == OFF_HELLO || off == OFF_PROBE)
        return "to arrive";
    const char *what = off == OFF_READY ? "post" : off == OFF_REDUCED ? "reduce" : "finish reading";
    snprintf(buf, sizeof buf, "to %s chunk %llu of this call", what, chunk);
    return buf;
}

/* This rank's own abort or revoke (from any thread), as the error of the call `op`; 0: neither. */
static int requested(uc_shm *e, const char *op) {
    int req = atomic_load_explicit(&e->abort_requested, memory_order_acquire);
    if (req == REQUEST_REVOKE) {
        set_err(&e->err, UC_SHM_EREVOKED, op, "%s", e->ctrl[e->rank].abort_text);
        e->err.remote_rank = e->rank;
        return UC_SHM_EREVOKED;
    }
    if (req == REQUEST_ABORT) {
        set_err(&e->err, UC_SHM_EABORTED, op, "the call was stopped: the communicator was aborted on rank %d",
                e->rank);
        return UC_SHM_EABORTED;
    }
    return 0;
}

/* A peer's published verdict that ends this rank's calls (not ABORT_CLOSED: that matters only
 * to a call waiting for that peer). */
static int ends_calls(int code) {
    return code == ABORT_FAILED || code == ABORT_DEAD || code == ABORT_TIMEOUT || code == ABORT_REVOKED;
}

static int check_health(uc_shm *e, size_t off, uint64_t target, int only, uint64_t t) {
    int rc = requested(e, e->op); /* before the peers' verdicts: they may echo this abort */
    if (rc) return rc;
    for (int p = 0; p < e->size; p++) {
        if (p == e->rank) continue;
        int code = atomic_load_explicit(&e->ctrl[p].abort_code, memory_order_acquire);
        if (ends_calls(code)) return remote_abort(e, p);
    }
    for (int q = next_pending(e, off, target, only, 0); q >= 0;
         q = next_pending(e, off, target, only, q + 1)) {
        if (atomic_load_explicit(&e->ctrl[q].abort_code, memory_order_acquire) == ABORT_CLOSED) {
            set_err(&e->err, UC_SHM_EREMOTE, e->op, "rank %d closed its engine while %s was waiting for it",
                    q, e->op);
            e->err.remote_rank = q;
            fatal(e);
            publish_abort(e, ABORT_FAILED, q, (long)e->ctrl[q].pid, e->err.message);
            return UC_SHM_EREMOTE;
        }
        if (peer_dead(e, q)) {
            long pid = (long)e->ctrl[q].pid;
            set_err(&e->err, UC_SHM_EDEAD, e->op, "rank %d (pid %ld) died during %s", q, pid, e->op);
            e->err.remote_rank = q;
            e->err.remote_pid = pid;
            return fatal(e);
        }
    }
    if (e->interrupt && e->interrupt(e->interrupt_ctx)) {
        set_err(&e->err, UC_SHM_EINTR, e->op, "%s was interrupted", e->op);
        return fatal(e);
    }
    if (e->timeout_ns && t - e->t_call > e->timeout_ns) {
        int k = 0, len = 0;
        char list[256] = "";
        for (int q = next_pending(e, off, target, only, 0); q >= 0;
             q = next_pending(e, off, target, only, q + 1)) {
            e->missing[k++] = q;
            if (len < (int)sizeof list - 16)
                len += snprintf(list + len, sizeof list - len, "%s%d", k > 1 ? ", " : "", q);
        }
        int arrival =
            e->arriving || strcmp(e->op ? e->op : "", "agree") == 0; /* the rendezvous that starts a call */
        set_err(&e->err, UC_SHM_ETIMEOUT, e->op, "rank %d timed out after %.3g s waiting for rank%s %s %s%s",
                e->rank, (double)e->timeout_ns * 1e-9, k > 1 ? "s" : "", list, awaited(e, off, target),
                arrival ? " (they never started this call)" : "");
        e->err.nmissing = k;
        e->err.missing = e->missing;
        return fatal(e);
    }
    return UC_SHM_OK;
}

static void sleep_on(uc_line *l, uint64_t target) {
    atomic_fetch_add_explicit(&l->sleepers, 1, memory_order_seq_cst);
    uint64_t v = atomic_load_explicit(&l->seq, memory_order_seq_cst);
    if (v < target) {
        struct timespec ts = {0, SLEEP_NS};
        syscall(SYS_futex, futex_word(l), FUTEX_WAIT, (uint32_t)v, &ts, NULL, 0);
    }
    atomic_fetch_sub_explicit(&l->sleepers, 1, memory_order_relaxed);
}

/* Record the CPU this rank runs on, for peers deciding whether spinning can help. */
static inline int note_cpu(uc_shm *e) {
    int c = sched_getcpu();
    _Atomic int32_t *slot_cpu = &e->ctrl[e->rank].cpu;
    if (atomic_load_explicit(slot_cpu, memory_order_relaxed) != c)
        atomic_store_explicit(slot_cpu, c, memory_order_relaxed);
    return c;
}

/* Wait until line `off` of rank `only` (or of every other rank, only < 0) reaches target.
 * First a short spin that reads no clock (a small call's peers are usually that close: a
 * clock reading costs as much as a cache line from a peer), unless ranks outnumber CPUs.  Then spin while the
 * awaited rank may be running elsewhere; yield at once when it last ran on this CPU (it cannot run until we
 * step aside); after yield_ns sleep.  *waited (if given): the nanoseconds waited after the short spin, 0 when
 * it ended there. */
#define QUICK_SPINS 16
static int wait_for(uc_shm *e, size_t off, uint64_t target, int only, uint64_t *waited) {
    int q = next_pending(e, off, target, only, 0);
    if (waited) *waited = 0;
    if (q < 0) return UC_SHM_OK;
    uc_line *l = line_of(e, q, off);
    for (int i = 0; i < e->quick_spins; i++) {
        cpu_relax();
        if (atomic_load_explicit(&l->seq, memory_order_acquire) >= target) {
            q = next_pending(e, off, target, only, q + 1);
            if (q < 0) return UC_SHM_OK;
            l = line_of(e, q, off);
        }
    }
    if (e->unlock) { /* a long wait: the caller's lock goes (once per call) */
        e->unlock(e->unlock_ctx);
        e->unlock = NULL;
    }
    uint64_t start = now_ns(), next_check = start + CHECK_NS;
    if (!e->t_call) e->t_call = start;
    int me_cpu = note_cpu(e);
    for (;;) {
        l = line_of(e, q, off);
        int together = atomic_load_explicit(&e->ctrl[q].cpu, memory_order_relaxed) == me_cpu;
        for (int i = together ? 1 : 32; i > 0; i--) {
            if (atomic_load_explicit(&l->seq, memory_order_acquire) >= target) {
                q = next_pending(e, off, target, only, q + 1);
                if (q < 0) {
                    if (waited) *waited = now_ns() - start;
                    return UC_SHM_OK;
                }
                l = line_of(e, q, off);
            }
            cpu_relax();
        }
        uint64_t t = now_ns();
        if (together || t - start >= e->spin_ns) {
            if (t - start < e->yield_ns)
                sched_yield();
            else
                sleep_on(l, target);
            me_cpu = note_cpu(e);
        }
        if (t >= next_check) {
            int rc = check_health(e, off, target, only, t);
            if (rc) return rc;
            next_check = t + CHECK_NS;
        }
    }
}

#define CHECKED(call)                                                                                        \
    do {                                                                                                     \
        int rc_ = (call);                                                                                    \
        if (rc_) return rc_;                                                                                 \
    } while (0)

#define WAIT(e, off, target, only)                                                                           \
    do {                                                                                                     \
        int rc_ = wait_for((e), (off), (target), (only), NULL);                                              \
        if (rc_) return rc_;                                                                                 \
    } while (0)

/* Every peer's CONSUMED >= target: known already (e->floor), or waited for. */
static inline int all_consumed(uc_shm *e, uint64_t target) {
    if (target <= e->floor) return UC_SHM_OK;
    int rc = wait_for(e, OFF_CONSUMED, target, -1, NULL);
    if (!rc) e->floor = target;
    return rc;
}

/* Before writing my slot for chunk g: its previous user, chunk g - 2, is done everywhere. */
#define WAIT_SLOT(e, g)                                                                                      \
    do {                                                                                                     \
        if ((g) >= 2) CHECKED(all_consumed((e), (g) - 1));                                                   \
    } while (0)

/* -------------------------------------------------------------- CMA copies */
/* A failed process_vm_readv/writev.  ESRCH: the peer is gone; EFAULT: it unmapped its
 * buffer, typically because it gave up after another rank died.  Name the dead rank
 * when there is one: it is the cause. */
static int cma_failed(uc_shm *e, int peer, int saved, const char *call, size_t n) {
    if (saved == ESRCH || saved == EFAULT) {
        int dead = saved == ESRCH ? peer : -1;
        for (int q = 0; q < e->size && dead < 0; q++)
            if (q != e->rank && peer_dead(e, q)) dead = q;
        /* It withdrew because it failed first: its abort record (published before its buffer
         * went) names the cause, e.g. a rank whose death is not yet visible in /proc here. */
        if (dead < 0 && atomic_load_explicit(&e->ctrl[peer].abort_code, memory_order_acquire) != ABORT_NONE)
            return remote_abort(e, peer);
        if (dead >= 0)
            set_err(&e->err, UC_SHM_EDEAD, e->op, "rank %d (pid %ld) died during %s", dead,
                    (long)e->pids[dead], e->op);
        else
            set_err(&e->err, UC_SHM_EDEAD, e->op,
                    "rank %d (pid %ld) withdrew its buffer during %s (it failed "
                    "or left the collective)",
                    peer, (long)e->pids[peer], e->op);
        e->err.remote_rank = dead >= 0 ? dead : peer;
        e->err.remote_pid = e->pids[e->err.remote_rank];
        return fatal(e);
    }
    set_err(&e->err, UC_SHM_ESYS, e->op, "%s of %zu bytes with rank %d failed: %s", call, n, peer,
            strerror(saved));
    e->err.sys_errno = saved;
    return fatal(e);
}

/* ============================================================ tracing */
static inline uint64_t wall_ns(uc_shm *e) {
    if (!e->ev) return 0;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static inline void event(uc_shm *e, uint64_t t0, int kind, int peer, size_t bytes) {
    if (!e->ev) return;
    if (e->ev_n == e->ev_cap) {
        e->ev_dropped++;
        return;
    }
    e->ev[e->ev_n++] = (uc_shm_event){t0, wall_ns(e), (uint64_t)bytes, kind, peer};
}

int uc_shm_trace(uc_shm *e, size_t capacity) {
    uc_shm_event *ev = NULL;
    if (capacity && !(ev = calloc(capacity, sizeof *ev))) return UC_SHM_ESYS;
    free(e->ev);
    e->ev = ev;
    e->ev_cap = capacity;
    e->ev_n = 0;
    e->ev_dropped = 0;
    return UC_SHM_OK;
}

size_t uc_shm_event_count(const uc_shm *e) {
    return e->ev_n;
}

size_t uc_shm_take_events(uc_shm *e, uc_shm_event *out, size_t max, uint64_t *dropped) {
    size_t n = e->ev_n < max ? e->ev_n : max;
    if (n) memcpy(out, e->ev, n * sizeof *out);
    *dropped = e->ev_dropped + (e->ev_n - n);
    e->ev_n = 0;
    e->ev_dropped = 0;
    return n;
}

/* ------------------------------------------------------------ live choices
 * Whether a peer's data is read single-copy or copied through the slots (use_cma) depends on how
 * fast each is on this host, and a VM changes for minutes at a time: on 2026-12-05 the slot paths
 * moved 18-23 GB/s in one spell and 1.5-2.5 GB/s in the next while single-copy reads and both MPIs
 * kept their speed (docs/performance.md).  And the break-even speeds counted from copies (`need`)
 * miss what a path costs beside its copies (at 2 ranks a 128 KiB all_gather was faster single-copy
 * where the copies' speeds said the slots).  So where the creator measured the speeds at open
 * (uc_hdr.live), that only starts it: every rank times each call that chose a path, from the choice
 * to the call's end, per collective and size class of its transfer per peer (running estimates,
 * obs); rank 0 chooses per class the path whose slowest rank was faster and publishes its choices
 * with its record; every rank adopts them when that rendezvous is judged, so the ranks of a call
 * choose alike.  A class's first calls take each path twice (the first of each is cold), up to
 * EXPLORE times where the two are near; then the path it left gets one call every PROBE_NS, to see
 * whether it got faster. */
static inline int bucket_of(size_t n) {
    int b = n ? 63 - __builtin_clzll((unsigned long long)n) - BUCKET_MIN_LOG2 : 0;
    return b < 0 ? 0 : b >= NBUCKETS ? NBUCKETS - 1 : b;
}

static inline uint32_t float_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static inline float bits_float(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline int choice_of(const uint64_t *words, int coll, int b) {
    unsigned i = (unsigned)(coll - 1) * NBUCKETS + (unsigned)b;
    return (int)(words[i / 32] >> (i % 32 * 2)) & 3;
}

static inline void set_choice(uint64_t *words, int coll, int b, int c) {
    unsigned i = (unsigned)(coll - 1) * NBUCKETS + (unsigned)b;
    words[i / 32] = (words[i / 32] & ~(3ULL << (i % 32 * 2))) | ((uint64_t)c << (i % 32 * 2));
}

/* Whether this call of `coll` reads single-copy (its transfer per peer `bytes`): the choice in
 * force, or where there is none yet the open's measure against the collective's break-even `need`. */
static int choose_cma(uc_shm *e, int coll, size_t bytes, uint32_t need) {
    if (!e->live) return e->cma_speed_ppm >= need;
    int b = bucket_of(bytes), c = choice_of(e->choice, coll, b);
    int cma = c == CHOICE_MODEL ? e->cma_speed_ppm >= need : c == CHOICE_CMA;
    e->cls = bytes, e->path_coll = coll, e->path = cma;
    if (e->rank == 0) e->used[coll] |= (uint8_t)(1u << b);
    e->t_path = now_ns();
    uc_ctrl *me = &e->ctrl[e->rank];
    atomic_store_explicit(&me->path_seq, 0, memory_order_relaxed); /* t0 changing */
    atomic_store_explicit(&me->path_t0, e->t_path, memory_order_release);
    atomic_store_explicit(&me->path_seq, ++e->chosen, memory_order_release);
    return cma;
}

/* When the last rank of this call arrived at its choice (this rank's own time where a peer's is
 * gone: it is in its next call already, which it cannot start before this rank's end). */
static uint64_t last_arrival(uc_shm *e) {
    uint64_t t = e->t_path;
    for (int q = 0; q < e->size; q++) {
        if (q == e->rank) continue;
        uc_ctrl *c = &e->ctrl[q];
        if (atomic_load_explicit(&c->path_seq, memory_order_acquire) != e->chosen) continue;
        uint64_t t0 = atomic_load_explicit(&c->path_t0, memory_order_acquire);
        if (atomic_load_explicit(&c->path_seq, memory_order_acquire) == e->chosen && t0 > t) t = t0;
    }
    return t;
}

/* The end of a call that chose (choose_cma): its speed into its class's estimate of its path, from the
 * last rank's arrival (a rank that waited for a late peer did not spend that on its path).  The
 * path's first figure (a cold call: page faults, caches) is replaced by the second, which the best of
 * the next EXPLORE - 2 betters (one VM-noisy figure would decide); a probe's, the first after
 * PROBE_NS on the path left for the other (news), replaces it too (not the first after a pause of
 * the job's: the path in use keeps its figure); after, one figure moves it by at most an eighth down or a
 * quarter up, so that one descheduled call does not move a class, while a change that lasts does. */
static void path_timed(uc_shm *e) {
    int c = e->path_coll, b = bucket_of(e->cls), p = e->path;
    uint64_t t = now_ns(), t0 = last_arrival(e), ns = t > t0 ? t - t0 : 0;
    uint32_t k = e->samples[c][b][p];
    uint64_t *when = e->sampled_ns[c][b];
    float v = (float)e->cls / (float)(ns ? ns : 1), *est = &e->est[c][b][p];
    if (k < 2 || (t - when[p] >= PROBE_NS && when[p] < when[!p])) {
        *est = v;
    } else if (k < EXPLORE) {
        if (v > *est) *est = v;
    } else {
        float lo = 0.5f * *est, hi = 2.0f * *est;
        *est = 0.75f * *est + 0.25f * (v < lo ? lo : v > hi ? hi : v);
    }
    e->samples[c][b][p] = k + 1;
    when[p] = t;
    atomic_store_explicit(&e->ctrl[e->rank].obs[c][b][p], float_bits(*est), memory_order_relaxed);
}

/* The slowest rank's estimate of a class's path (0: none yet). */
static float slowest(uc_shm *e, int c, int b, int p) {
    float worst = 0;
    for (int q = 0; q < e->size; q++) {
        float v = bits_float(atomic_load_explicit(&e->ctrl[q].obs[c][b][p], memory_order_relaxed));
        if (v > 0 && (worst == 0 || v < worst)) worst = v;
    }
    return worst;
}

/* Rank 0's choice for the next calls of class b of collective c (at time t). */
static int decide(uc_shm *e, int c, int b, uint64_t t) {
    const uint32_t *k = e->samples[c][b];
    float slots = slowest(e, c, b, 0), cma = slowest(e, c, b, 1);
    /* the path timed fewer times (the slots on a tie) until both were timed warm, and on near a tie
     * (within 1.5x) until both were timed EXPLORE times: a clear loser costs a few calls only */
    if (k[0] < 2 || k[1] < 2 ||
        ((k[0] < EXPLORE || k[1] < EXPLORE) && cma < 1.5f * slots && slots < 1.5f * cma))
        return k[0] <= k[1] ? CHOICE_SLOTS : CHOICE_CMA;
    int best = cma > slots;
    if (t - e->sampled_ns[c][b][!best] >= PROBE_NS && t - e->probed_ns[c][b] >= PROBE_NS) {
        e->probed_ns[c][b] = t; /* the other path, this once (its call is timed after the next publish) */
        best = !best;
    }
    return best ? CHOICE_CMA : CHOICE_SLOTS;
}

/* Rank 0, before the READY signal of a rendezvous that carries records: its choices for the calls
 * after it, anew where `fresh` (a call that may move data), else the last. */
static void live_publish(uc_shm *e, int fresh) {
    if (!e->live || e->rank != 0) return;
    if (fresh) {
        uint64_t t = now_ns();
        for (int c = 1; c < NCOLLS; c++)
            for (unsigned bits = e->used[c]; bits; bits &= bits - 1) {
                int b = __builtin_ctz(bits);
                set_choice(e->next_choice, c, b, decide(e, c, b, t));
            }
    }
    memcpy(e->ctrl[0].ready.choice[e->judged & 1], e->next_choice, sizeof e->next_choice);
}

/* Every rank, once a rendezvous with records is judged: rank 0's choices published with it. */
static inline void live_adopt(uc_shm *e) {
    if (e->live) memcpy(e->choice, e->ctrl[0].ready.choice[e->judged & 1], sizeof e->choice);
    e->judged++;
}

int uc_shm_live_choices(const uc_shm *e, int coll, int *choice, double *slot_gbps, double *cma_gbps) {
    if (!e->live || coll < 1 || coll >= NCOLLS) return UC_SHM_EINVAL;
    for (int b = 0; b < NBUCKETS; b++) {
        if (choice) choice[b] = choice_of(e->choice, coll, b);
        if (slot_gbps) slot_gbps[b] = e->est[coll][b][0];
        if (cma_gbps) cma_gbps[b] = e->est[coll][b][1];
    }
    return UC_SHM_OK;
}

static int cma_read(uc_shm *e, int peer, void *local, uint64_t remote, size_t n) {
    uint64_t t0 = wall_ns(e);
    size_t total = n;
    char *dst = local;
    while (n) {
        struct iovec l = {dst, n}, r = {(void *)(uintptr_t)remote, n};
        ssize_t got = process_vm_readv((pid_t)e->pids[peer], &l, 1, &r, 1, 0);
        if (got < 0 && errno == EINTR) continue;
        if (got < 0) return cma_failed(e, peer, errno, "process_vm_readv", n);
        if (got == 0) return FAIL(e, UC_SHM_ESYS, "process_vm_readv from rank %d made no progress", peer);
        dst += got, remote += (uint64_t)got, n -= (size_t)got;
    }
    event(e, t0, UC_SHM_EV_READ, peer, total);
    return UC_SHM_OK;
}

static int cma_write(uc_shm *e, int peer, uint64_t remote, const void *local, size_t n) {
    uint64_t t0 = wall_ns(e);
    size_t total = n;
    const char *src = local;
    while (n) {
        struct iovec l = {(void *)src, n}, r = {(void *)(uintptr_t)remote, n};
        ssize_t put = process_vm_writev((pid_t)e->pids[peer], &l, 1, &r, 1, 0);
        if (put < 0 && errno == EINTR) continue;
        if (put < 0) return cma_failed(e, peer, errno, "process_vm_writev", n);
        if (put == 0) return FAIL(e, UC_SHM_ESYS, "process_vm_writev to rank %d made no progress", peer);
        src += put, remote += (uint64_t)put, n -= (size_t)put;
    }
    event(e, t0, UC_SHM_EV_WRITE, peer, total);
    return UC_SHM_OK;
}

/* Publish `addr` for chunk g (the ready signal follows). */
static inline void publish(uc_shm *e, const void *addr) {
    e->ctrl[e->rank].ready.pub_addr = (uint64_t)(uintptr_t)addr;
}

static inline uint64_t published(uc_shm *e, int q) {
    return e->ctrl[q].ready.pub_addr;
}

/* --------------------------------------------------------------- the probe */
static int probe(uc_shm *e) {
    int me = e->rank, n = e->size;
    WAIT(e, OFF_HELLO, 1, -1);
    if (e->creator && !e->unlinked) {
        if (shm_unlink(e->name) != 0 && errno != ENOENT) return sys_fail(e, "shm_unlink");
        e->unlinked = 1;
    }
    for (int q = 0; q < n; q++)
        e->pids[q] = (long)atomic_load_explicit(&e->ctrl[q].pid, memory_order_acquire);
    uint32_t verdict = 1;
    int err = 0, peer = -1;
    if (!e->cma_allowed || e->checksum) { /* checksums cover the slot copies only */
        verdict = 2;
    } else {
        for (int k = 1; k < n; k++) {
            int q = (me + k) % n;
            if (!same_pidns(e, q)) {
                verdict = 2;
                err = EXDEV;
                peer = q;
                break;
            }
            uint64_t magic = 0;
            struct iovec l = {&magic, sizeof magic},
                         r = {(void *)(uintptr_t)e->ctrl[q].base_addr, sizeof magic};
            ssize_t got = process_vm_readv((pid_t)e->pids[q], &l, 1, &r, 1, 0);
            if (got != (ssize_t)sizeof magic || magic != UC_SHM_MAGIC) {
                verdict = 2;
                err = got < 0 ? errno : EIO;
                peer = q;
                break;
            }
        }
    }
    uc_ctrl *c = &e->ctrl[me];
    c->verdict = verdict;
    c->verdict_errno = err;
    c->verdict_peer = peer;
    sig(e, OFF_PROBE, 1);
    WAIT(e, OFF_PROBE, 1, -1);
    e->cma = 1;
    e->cma_reason[0] = 0;
    for (int q = 0; q < n && e->cma; q++) {
        uc_ctrl *o = &e->ctrl[q];
        if (o->verdict == 1) continue;
        e->cma = 0;
        if (o->verdict_peer < 0 && e->checksum)
            snprintf(e->cma_reason, sizeof e->cma_reason, "checksums are on (slot copies only)");
        else if (o->verdict_peer < 0)
            snprintf(e->cma_reason, sizeof e->cma_reason, "disabled on rank %d (UNICCL_SHM_CMA=0)", q);
        else if (o->verdict_errno == EXDEV)
            snprintf(e->cma_reason, sizeof e->cma_reason, "ranks %d and %d are in different pid namespaces",
                     q, o->verdict_peer);
        else
            snprintf(e->cma_reason, sizeof e->cma_reason,
                     "process_vm_readv by rank %d from rank %d failed: %s", q, o->verdict_peer,
                     strerror(o->verdict_errno));
    }
    return UC_SHM_OK;
}

/* ---------------------------------------------------------- call framing */
static int begin_held(uc_shm *e, const char *op, uc_shm_unlock_fn unlock, void *ctx) {
    int idle = 0;
    if (!atomic_compare_exchange_strong(&e->busy, &idle, 1))
        return UC_SHM_EBUSY;                 /* e->err belongs to the call in progress */
    e->unlock = unlock, e->unlock_ctx = ctx; /* (the first call's probe waits too) */
    e->op = op;
    e->arriving = 0;
    if (e->owner_pid != self_pid()) {
        set_err(&e->err, UC_SHM_EBROKEN, op, "this engine belongs to process %ld, not to this forked child",
                e->owner_pid);
        atomic_store(&e->busy, 0);
        return UC_SHM_EBROKEN;
    }
    int asked = requested(e, op);
    if (asked) {
        atomic_store(&e->busy, 0);
        return asked;
    }
    if (e->broken) {
        set_err(&e->err, UC_SHM_EBROKEN, op,
                "the shared-memory engine is unusable after an earlier error: %s", e->first_error);
        atomic_store(&e->busy, 0);
        return UC_SHM_EBROKEN;
    }
    e->t_call = 0; /* the first wait reads the clock (wait_for): a call that never waits reads none */
    e->g_call = e->g;
    e->cls = 0;                         /* set by the call's choose_cma, where it chooses */
    for (int p = 0; p < e->size; p++) { /* a peer already gave up: fail now, not half way */
        int code = atomic_load_explicit(&e->ctrl[p].abort_code, memory_order_relaxed);
        if (p != e->rank && ends_calls(code)) {
            atomic_thread_fence(memory_order_acquire);
            int rc = remote_abort(e, p);
            atomic_store(&e->busy, 0);
            return rc;
        }
    }
    if (e->cma < 0 && e->size > 1) {
        int rc = probe(e);
        if (rc) {
            atomic_store(&e->busy, 0);
            return rc;
        }
    }
    return UC_SHM_OK;
}

static int begin(uc_shm *e, const char *op) {
    return begin_held(e, op, NULL, NULL);
}

static int end(uc_shm *e, int rc) {
    nt_fence(e);
    if (e->cls && rc == UC_SHM_OK) path_timed(e);
    e->unlock = NULL;
    atomic_store_explicit(&e->busy, 0, memory_order_release);
    return rc;
}

static int bad(uc_shm *e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int bad(uc_shm *e, const char *fmt, ...) {
    va_list ap;
    set_err(&e->err, UC_SHM_EINVAL, e->op, "%s", "");
    va_start(ap, fmt);
    vsnprintf(e->err.message, sizeof e->err.message, fmt, ap);
    va_end(ap);
    return fatal(e);
}

static int check_reduce_args(uc_shm *e, size_t count, size_t blocks, int dtype, int op, size_t *isz) {
    if (dtype < 0 || dtype >= NDTYPES)
        return bad(e, "dtype code %d is not one of uniccl's 0..%d", dtype, NDTYPES - 1);
    if (op < 0 || op >= NOPS) return bad(e, "op code %d is not SUM, PROD, MAX or MIN (0..3)", op);
    if (!e->reduce && e->size > 1) return bad(e, "no reduce kernel was given to this engine");
    *isz = ITEMSIZE[dtype];
    if (count > SIZE_MAX / *isz / blocks) return bad(e, "count %zu is too large", count);
    return UC_SHM_OK;
}

/* dst = src[0] op src[1] op ... op src[n-1], left to right.  In ring order (a
 * reduce_scatter with UC_SHM_RING_ORDER, where the folding rank owns the block) the terms
 * are taken as gloo's ring adds them: ranks me-1, me-2, ..., me+1, then me. */
static int fold(uc_shm *e, void *dst, const void **src, size_t count, int dtype, int op) {
    if (!count) return UC_SHM_OK;
    if (e->ring_order) {
        int n = e->size, me = e->rank;
        const void **o = e->src + n;
        for (int j = 0; j < n - 1; j++)
            o[j] = src[((me - 1 - j) % n + n) % n];
        o[n - 1] = src[me];
        src = o;
    }
    uint64_t t0 = wall_ns(e);
    int rc = e->reduce(dst, src[0], src[1], count, dtype, op);
    for (int q = 2; !rc && q < e->size; q++)
        rc = e->reduce(dst, dst, src[q], count, dtype, op);
    event(e, t0, UC_SHM_EV_REDUCE, -1, count * ITEMSIZE[dtype]);
    if (rc)
        return FAIL(e, UC_SHM_EKERNEL, "the reduce kernel returned status %d (dtype %d, op %d)", rc, dtype,
                    op);
    return UC_SHM_OK;
}

/* ============================================================ integrity */
/* With checksums on (opt-in, uc_shm_tuning.checksum), a rank that writes a region of its
 * slot for others records the region's CRC-32C before it signals; whoever reads the
 * region checks it: a copy that does not match is copied again (up to 3 times), a
 * source that does not match before a fold fails the call with UC_SHM_ECORRUPT.
 * Regions: 0..n-1 a part or block meant for that rank, n the whole chunk. */
#define WHOLE(e) ((e)->size)

static inline uint32_t *crc_of(uc_shm *e, int r, uint64_t g) {
    return e->crcs + ((size_t)r * 2 + (size_t)(g & 1)) * (size_t)(e->size + 1);
}

static inline void seal(uc_shm *e, uint64_t g, int region, const void *p, size_t n) {
    if (e->checksum) crc_of(e, e->rank, g)[region] = uc_crc32c(0, p, n);
}

static int corrupt(uc_shm *e, int q, uint64_t g, int region, const char *what) {
    set_err(&e->err, UC_SHM_ECORRUPT, e->op,
            "%s of rank %d (chunk %llu of this call, region %d) failed its "
            "CRC-32C check%s",
            what, q, (unsigned long long)(g - e->g_call), region,
            e->flip_ppm ? " (fault injection is on)" : "");
    e->err.remote_rank = q;
    return fatal(e);
}

/* copy_out of a region of rank q's slot, checked and copied again on a mismatch */
static int take(uc_shm *e, int q, uint64_t g, int region, void *dst, const void *src, size_t n, int nt) {
    uint64_t t0 = wall_ns(e), s0 = e->slot_gbps > 0 && q != e->rank ? now_ns() : 0;
    copy_out(e, dst, src, n, nt);
    if (s0) { /* injected: a slow path between the cores */
        uint64_t until = s0 + (uint64_t)((double)n / e->slot_gbps);
        while (now_ns() < until)
            cpu_relax();
    }
    if (q != e->rank) /* a peer's data (not this rank's own, staged in its own slot) */
        event(e, t0, UC_SHM_EV_COPY, q, n);
    if (!e->checksum || !n) return UC_SHM_OK;
    nt_fence(e);
    uint32_t want = crc_of(e, q, g)[region];
    for (int tries = 0;; tries++) {
        if (e->flip_ppm) { /* injected: one bit of this copy flipped */
            e->rng ^= e->rng << 13, e->rng ^= e->rng >> 7, e->rng ^= e->rng << 17;
            if (e->rng % 1000000 < e->flip_ppm)
                ((unsigned char *)dst)[(e->rng >> 20) % n] ^= (unsigned char)(1u << ((e->rng >> 8) & 7));
        }
        if (uc_crc32c(0, dst, n) == want) return UC_SHM_OK;
        e->crc_failures++;
        if (tries == 3) return corrupt(e, q, g, region, "a copy of a region");
        e->recopies++;
        copy_mem(dst, src, n);
    }
}

/* a region of rank q's slot about to be folded, checked where it lies */
static inline int check_src(uc_shm *e, int q, uint64_t g, int region, const void *src, size_t n) {
    if (!e->checksum || !n || uc_crc32c(0, src, n) == crc_of(e, q, g)[region]) return UC_SHM_OK;
    e->crc_failures++;
    return corrupt(e, q, g, region, "a region");
}

/* Part q of a chunk of m elements: cache-line aligned, near equal. */
static inline void part(size_t m, int n, int q, size_t isz, size_t *lo, size_t *hi) {
    size_t align = isz >= 64 ? 1 : 64 / isz;
    size_t per = (m + (size_t)n - 1) / (size_t)n;
    per = (per + align - 1) / align * align;
    size_t a = (size_t)q * per;
    *lo = a < m ? a : m;
    *hi = a + per < m ? a + per : m;
}

/* Stage chunk g of a pipelined reduction: every part but mine (which I read from
 * my input directly) into my slot, then signal ready. */
static int stage_parts(uc_shm *e, uint64_t g, const char *src, size_t m, size_t isz) {
    size_t lo, hi;
    WAIT_SLOT(e, g);
    uint8_t *s = slot(e, e->rank, g);
    part(m, e->size, e->rank, isz, &lo, &hi);
    copy_mem(s, src, lo * isz);
    copy_mem(s + hi * isz, src + hi * isz, (m - hi) * isz);
    if (e->checksum)
        for (int q = 0; q < e->size; q++) {
            size_t a, b;
            part(m, e->size, q, isz, &a, &b);
            if (q != e->rank) seal(e, g, q, s + a * isz, (b - a) * isz);
        }
    sig(e, OFF_READY, g + 1);
    return UC_SHM_OK;
}

/* Copy my chunk g into my slot (`stream`: with streaming stores, fenced) and signal ready. */
static int stage(uc_shm *e, uint64_t g, const void *src, size_t nbytes, int stream) {
    WAIT_SLOT(e, g);
    copy_out(e, slot(e, e->rank, g), src, nbytes, stream);
    if (stream) nt_fence(e); /* the plain stages of the small calls skip it (end() fences outputs) */
    seal(e, g, WHOLE(e), slot(e, e->rank, g), nbytes);
    sig(e, OFF_READY, g + 1);
    return UC_SHM_OK;
}

/* ------------------------------------------------ the record in the rendezvous
 * uc_shm_agreed publishes the call's record (see agree_impl) in the data's
 * first rendezvous instead of a round of its own: the same line, the same generation and
 * the same READY signal, so a rank that calls uc_shm_agree there (another collective, or
 * an error) meets it and both see every record.  On a difference every rank leaves at
 * generation g + 1, as after agree_impl, with nothing read from anyone's data. */
/* Before this rank rewrites its ready line's record or with_data: every peer read the last ones. */
static inline int line_free(uc_shm *e) {
    return all_consumed(e, e->agree_g > e->boxed_g ? e->agree_g : e->boxed_g);
}

/* The record in a box, into out[NREC]. */
static inline void box_record(const uc_box *b, int64_t *out) {
    if (b->form == BOX_PACKED)
        for (int i = 0; i < NREC; i++)
            out[i] = b->packed[i];
    else
        memcpy(out, b->record, NREC * sizeof(int64_t));
}

/* The record rank q published for the rendezvous of generation g, into out[NREC]. */
static inline void peer_record(uc_shm *e, int q, uint64_t g, int64_t *out) {
    uc_ctrl *c = &e->ctrl[q];
    if (c->ready.with_data == 2)
        box_record(&c->box[g & 1], out);
    else
        memcpy(out, c->ready.record, NREC * sizeof(int64_t));
}

/* Rank q's box of rendezvous g, if it is one (stamped there, with a record). */
static inline const uc_box *stamped_box(uc_shm *e, int q, uint64_t g) {
    const uc_box *b = &e->ctrl[q].box[g & 1];
    return atomic_load_explicit(&b->stamp, memory_order_acquire) == g + 1 && b->form != BOX_NONE ? b : NULL;
}

static int rec_publish(uc_shm *e) {
    if (!e->rec_in) return UC_SHM_OK;
    CHECKED(line_free(e));
    memcpy(e->ctrl[e->rank].ready.record, e->rec_in, NREC * sizeof(int64_t));
    e->ctrl[e->rank].ready.with_data = 1;
    live_publish(e, 1);
    e->arriving = 1;
    return UC_SHM_OK;
}

/* After the rendezvous of generation g (every rank's READY >= g + 1). */
static int rec_judge(uc_shm *e, uint64_t g) {
    if (!e->rec_in) return UC_SHM_OK;
    const int64_t *mine = e->rec_in;
    int same = 1, boxes = e->ctrl[e->rank].ready.with_data == 2; /* every rank's record in its box */
    for (int q = 0; q < e->size; q++) {
        int64_t *r = e->rec_out + (size_t)q * NREC;
        if (q == e->rank) {
            memcpy(r, mine, NREC * sizeof(int64_t));
            continue;
        }
        const uc_box *b = stamped_box(e, q, g); /* a box call's: no need of its READY line */
        if (b) {
            box_record(b, r);
        } else {
            peer_record(e, q, g, r);
            boxes = 0;
        }
        /* a peer that agreed alone moves the data in a rendezvous of its own after this one:
         * leave as after a difference, so that this rank does too (the records may be equal) */
        if (memcmp(r, mine, NREC * sizeof(int64_t)) != 0 || (!b && !e->ctrl[q].ready.with_data)) same = 0;
    }
    e->rec_in = NULL;
    e->arriving = 0;
    e->agree_g = g + 1; /* the peers' CONSUMED g + 1 comes after they read the records */
    /* Rank 0 publishes no fresh choices with a box call (live_publish(e, 0)): where every rank made
     * the same box call, every rank keeps what it adopted last instead of reading rank 0's READY
     * line, and counts the rendezvous as judged all the same (the parity of the next publication) */
    if (same && boxes)
        e->judged++;
    else
        live_adopt(e);
    if (same) return UC_SHM_OK;
    sig(e, OFF_CONSUMED, g + 1);
    e->g = g + 1;
    return UC_SHM_EMISMATCH;
}

/* A call's first rendezvous counted: this rank arrived last (no wait at all), or waited w ns
 * (0: the short spin, under a microsecond). */
static inline void count_arrival(uc_shm *e, int last, uint64_t w) {
    uc_shm_arrivals *a = &e->arrivals;
    a->calls++;
    if (last) a->last++;
    int b = w ? 64 - __builtin_clzll(w) : 0;
    a->hist[b < UC_SHM_ARRIVAL_BUCKETS ? b : UC_SHM_ARRIVAL_BUCKETS - 1]++;
    a->wait_ns += w;
}

/* The call's first rendezvous: wait until every rank's line `off` reaches target, noting how long
 * this rank waited for the last to arrive.  The last itself reads no clock: the others read theirs
 * while they wait anyway. */
static int arrive_counted(uc_shm *e, size_t off, uint64_t target) {
    if (!e->count_arrivals) {
        WAIT(e, off, target, -1);
        return UC_SHM_OK;
    }
    if (next_pending(e, off, target, -1, 0) < 0) {
        count_arrival(e, 1, 0);
        return UC_SHM_OK;
    }
    uint64_t w;
    int rc = wait_for(e, off, target, -1, &w);
    if (!rc) count_arrival(e, 0, w);
    return rc;
}

/* Every peer arrived at the first rendezvous of a call, generation g: a rank signals it (READY,
 * or its box's stamp) once past every earlier chunk, so every peer consumed those. */
static inline void arrived(uc_shm *e, uint64_t g) {
    if (g > e->floor) e->floor = g;
}

static int arrive(uc_shm *e, size_t off, uint64_t target) {
    int rc = arrive_counted(e, off, target);
    if (!rc) arrived(e, target - 1);
    return rc;
}

/* With a record: the call's first rendezvous is everyone's, at generation g.  A rank that
 * would not signal READY there (a receiver of broadcast, scatter, gather's root) signals it
 * now, with no data; every rank waits for all and judges the records before it touches a
 * peer's slot or address or signals again (then a difference leaves nothing moved). */
static int rec_meet(uc_shm *e, uint64_t g, int signalled) {
    if (!e->rec_in) return UC_SHM_OK;
    if (!signalled) sig(e, OFF_READY, g + 1);
    int rc = arrive(e, OFF_READY, g + 1);
    return rc ? rc : rec_judge(e, g);
}

/* ------------------------------------------------------ small calls: the boxes
 * A call whose every rank's payload fits a box (INLINE_BYTES: a choice made from the record's
 * fields, so every rank of an agreeing call makes it) has one rendezvous, at generation g:
 * each rank puts its record and payload in its box g & 1 and signals READY; after everyone
 * arrived and the records agree it reads what it needs from the peers' boxes, then signals
 * CONSUMED.  One signal and one box to fetch per peer, where the slots cost a slot, a
 * record and a CONSUMED line. */
static inline int boxed(uc_shm *e, size_t payload) {
    return payload <= INLINE_BYTES && !e->checksum; /* checksums cover the slot copies */
}

/* Where a box's payload starts (its writer's form says). */
static inline uint8_t *box_payload(uc_box *b) {
    return b->form == BOX_PACKED ? (uint8_t *)b + BOX_PACKED_DATA : b->data;
}

/* The record as 32-bit fields into out, when every field fits (then 1). */
static inline int pack_record(const int64_t *rec, int32_t *out) {
    for (int i = 0; i < NREC; i++) {
        if (rec[i] != (int32_t)rec[i]) return 0;
        out[i] = (int32_t)rec[i];
    }
    return 1;
}

/* Every peer's box stamped for rendezvous g, seen within a short spin (then 1, counted as an
 * arrival in the short spin): else the caller waits on the READY lines (arrive). */
static int boxes_stamped(uc_shm *e, uint64_t g) {
    int q = 0, first = 1;
    for (int spins = e->quick_spins * 4; q < e->size;) {
        if (q == e->rank ||
            atomic_load_explicit(&e->ctrl[q].box[g & 1].stamp, memory_order_acquire) >= g + 1) {
            q++;
            continue;
        }
        if (spins-- <= 0) return 0;
        first = 0;
        cpu_relax();
    }
    if (e->count_arrivals) count_arrival(e, first, 0);
    arrived(e, g);
    return 1;
}

static int box_meet(uc_shm *e, uint64_t g, const void *payload, size_t n) {
    uc_ctrl *c = &e->ctrl[e->rank];
    uc_box *b = &c->box[g & 1];
    CHECKED(all_consumed(e, e->box_g[g & 1]));                       /* the box's last readers are done */
    if (e->rec_in && c->ready.with_data != 2) CHECKED(line_free(e)); /* with_data changes */
    b->form = !e->rec_in ? BOX_NONE : pack_record(e->rec_in, b->packed) ? BOX_PACKED : BOX_FULL;
    if (n) copy_mem(box_payload(b), payload, n);
    e->box_g[g & 1] = g + 1;
    if (e->rec_in) {
        if (b->form == BOX_FULL) memcpy(b->record, e->rec_in, sizeof b->record);
        c->ready.with_data = 2;
        e->boxed_g = g + 1;
        e->arriving = 1;
        live_publish(e, 0); /* a box call moves no data worth timing */
    }
    atomic_store_explicit(&b->stamp, g + 1, memory_order_release);
    sig(e, OFF_READY, g + 1);
    int rc = boxes_stamped(e, g) ? UC_SHM_OK : arrive(e, OFF_READY, g + 1);
    return rc ? rc : rec_judge(e, g);
}

/* Bytes [off, off + n) of rank q's payload in the rendezvous of generation g, into dst. */
static inline void box_take(uc_shm *e, int q, uint64_t g, void *dst, size_t off, size_t n) {
    uint64_t t0 = wall_ns(e);
    copy_mem(dst, box_payload(&e->ctrl[q].box[g & 1]) + off, n);
    event(e, t0, UC_SHM_EV_COPY, q, n);
}

static inline const void *box_data(uc_shm *e, int q, uint64_t g, size_t off) {
    return box_payload(&e->ctrl[q].box[g & 1]) + off;
}

/* ============================================================ reductions */
/* One round: everyone stages all, the folders (root, or all when root < 0) fold
 * every slot in rank order into recv. */
static int reduce_small(uc_shm *e, const void *send, void *recv, size_t count, size_t isz, int dtype, int op,
                        int root) {
    uint64_t g = e->g++;
    int rc = rec_publish(e);
    if (rc || (rc = stage(e, g, send, count * isz, 0)) || (rc = rec_meet(e, g, 1))) return rc;
    if (root < 0 || root == e->rank) {
        WAIT(e, OFF_READY, g + 1, -1);
        for (int q = 0; q < e->size; q++) {
            e->src[q] = slot(e, q, g);
            if (q != e->rank) CHECKED(check_src(e, q, g, WHOLE(e), e->src[q], count * isz));
        }
        if ((rc = fold(e, recv, e->src, count, dtype, op))) return rc;
    }
    sig(e, OFF_CONSUMED, g + 1);
    return UC_SHM_OK;
}

/* Through the boxes: the folders (root, or all when root < 0) fold every box in rank order. */
static int reduce_boxed(uc_shm *e, const void *send, void *recv, size_t count, int dtype, int op, int root) {
    uint64_t g = e->g++;
    CHECKED(box_meet(e, g, send, count * ITEMSIZE[dtype]));
    if (root < 0 || root == e->rank) {
        for (int q = 0; q < e->size; q++)
            e->src[q] = box_data(e, q, g, 0);
        CHECKED(fold(e, recv, e->src, count, dtype, op));
    }
    sig(e, OFF_CONSUMED, g + 1);
    return UC_SHM_OK;
}

/* Pipelined reduce-scatter + gather through the slots, chunk by chunk:
 *   A(k) stage chunk k;  B(k) reduce my part of chunk k from every slot into my
 *   slot;  C(k) copy every part into recv.  Order A(0), then B(k) A(k+1) C(k), so
 *   staging the next chunk hides the peers' skew.  With root >= 0 only the root
 *   runs C. */
static int reduce_pipe(uc_shm *e, const char *send, char *recv, size_t count, size_t isz, int dtype, int op,
                       int root) {
    int me = e->rank, n = e->size;
    int gather = root < 0 || root == me;
    size_t chunk = e->slot_bytes / isz;
    size_t nchunks = (count + chunk - 1) / chunk;
    int nt = gather && count * isz >= e->nt_min_bytes;
    uint64_t g0 = e->g;
    e->g += nchunks;
    int rc = rec_publish(e);
    if (rc || (rc = stage_parts(e, g0, send, count < chunk ? count : chunk, isz))) return rc;
    for (size_t k = 0; k < nchunks; k++) {
        uint64_t g = g0 + k;
        size_t off = k * chunk, m = count - off < chunk ? count - off : chunk;
        size_t lo, hi;
        /* B */
        WAIT(e, OFF_READY, g + 1, -1);
        if (k == 0 && (rc = rec_judge(e, g0))) return rc;
        part(m, n, me, isz, &lo, &hi);
        if (hi > lo) {
            for (int q = 0; q < n; q++) {
                e->src[q] = q == me ? (const void *)(send + (off + lo) * isz)
                                    : (const void *)(slot(e, q, g) + lo * isz);
                if (q != me) CHECKED(check_src(e, q, g, me, e->src[q], (hi - lo) * isz));
            }
            if ((rc = fold(e, slot(e, me, g) + lo * isz, e->src, hi - lo, dtype, op))) return rc;
        }
        seal(e, g, me, slot(e, me, g) + lo * isz, (hi - lo) * isz); /* my reduced part, read by all in C */
        sig(e, OFF_REDUCED, g + 1);
        if (!gather) sig(e, OFF_CONSUMED, g + 1);
        /* A(k+1) */
        if (k + 1 < nchunks) {
            size_t off1 = off + m, m1 = count - off1 < chunk ? count - off1 : chunk;
            if ((rc = stage_parts(e, g + 1, send + off1 * isz, m1, isz))) return rc;
        }
        /* C */
        if (gather) {
            WAIT(e, OFF_REDUCED, g + 1, -1);
            for (int q = 0; q < n; q++) {
                part(m, n, q, isz, &lo, &hi);
                if (hi > lo)
                    CHECKED(take(e, q, g, q, recv + (off + lo) * isz, slot(e, q, g) + lo * isz,
                                 (hi - lo) * isz, nt));
            }
            sig(e, OFF_CONSUMED, g + 1);
        }
    }
    return UC_SHM_OK;
}

/* Single-copy reduction (process_vm_readv/writev), for large messages.  Rank r owns
 * `len` elements at byte offset `src_off` of every rank's send.  Chunk by chunk it
 * pulls the peers' elements into its slots (used as one scratch area), folds them
 * with its own in rank order, and writes the result at byte offset `dst_off` of
 * the recv of: every rank (root == -1, all_reduce), the root (reduce), or only
 * itself (root == -2, reduce_scatter).  Two synchronizations per call, and no
 * freshly written cache line ever moves between cores: it reads peers' inputs where
 * they lie and writes results straight into their destination.  Nobody touches the
 * element range of another owner, so in place is safe. */
static int reduce_cma(uc_shm *e, const char *send, char *recv, size_t src_off, size_t dst_off, size_t len,
                      size_t isz, int dtype, int op, int root) {
    int me = e->rank, n = e->size, rc;
    uint64_t g = e->g++;
    uc_line *mine = &e->ctrl[me].ready;
    mine->pub_addr = (uint64_t)(uintptr_t)send;
    mine->pub_addr2 = (uint64_t)(uintptr_t)recv;
    if ((rc = rec_publish(e))) return rc;
    sig(e, OFF_READY, g + 1);
    WAIT(e, OFF_READY, g + 1, -1);
    if ((rc = rec_judge(e, g)))
        return rc; /* before any peer's address is used: theirs may be of another call */
    /* scratch: areas 0..n-1 for the ranks' inputs, area n for the result */
    uint8_t *scratch = slot(e, me, 0); /* slots [me][0] and [me][1] are adjacent */
    size_t area = (2 * e->slot_bytes / (size_t)(n + 1)) / 64 * 64, m = area / isz;
    int want_mine = root == -1 || root == -2 || root == me;
    /* An all_reduce past the cache streams my part of the result out of the scratch area (no
     * read-for-ownership of my recv) and writes the peers' from there, still in cache; folding
     * it into my recv first (below that size) would read each line of it twice from memory. */
    int nt = root == -1 && len * isz * (size_t)n >= e->nt_min_bytes;
    /* else fold straight into my recv unless that aliases my own input (in place) */
    int direct = want_mine && !nt && !overlaps(recv + dst_off, len * isz, send + src_off, len * isz);
    for (size_t off = 0; off < len; off += m) {
        size_t k = len - off < m ? len - off : m, nb = k * isz, so = src_off + off * isz,
               d = dst_off + off * isz;
        for (int j = 1; j < n; j++) {
            int q = (me + j) % n;
            if ((rc = cma_read(e, q, scratch + (size_t)q * area, e->ctrl[q].ready.pub_addr + so, nb)))
                return rc;
        }
        for (int q = 0; q < n; q++)
            e->src[q] = q == me ? (const void *)(send + so) : (const void *)(scratch + (size_t)q * area);
        uint8_t *res = direct ? (uint8_t *)recv + d : scratch + (size_t)n * area;
        if ((rc = fold(e, res, e->src, k, dtype, op))) return rc;
        if (want_mine && !direct) copy_out(e, recv + d, res, nb, nt);
        if (root == -2) continue;
        for (int j = 1; j < n; j++) {
            int q = (me + j) % n;
            if ((root == -1 || root == q) && (rc = cma_write(e, q, e->ctrl[q].ready.pub_addr2 + d, res, nb)))
                return rc;
        }
    }
    sig(e, OFF_CONSUMED, g + 1);      /* done with every peer's buffers */
    WAIT(e, OFF_CONSUMED, g + 1, -1); /* and they with mine */
    return UC_SHM_OK;
}

#define PPM(x) ((uint32_t)((x) * 1e6)) /* a speed ratio in the units of cma_speed_ppm */

static inline int use_cma_reduce(uc_shm *e, int coll, size_t part_bytes) {
    /* single-copy pulls replace the slots' copies in one for one: they must be about as fast */
    return e->cma == 1 && e->cma_reduce_min_bytes && part_bytes >= e->cma_reduce_min_bytes &&
           choose_cma(e, coll, part_bytes, PPM(0.9));
}

static int all_reduce_impl(uc_shm *e, const void *send, void *recv, size_t count, int dtype, int op) {
    int rc = UC_SHM_OK;
    size_t isz = 1;
    if ((rc = check_reduce_args(e, count, 1, dtype, op, &isz))) return rc;
    size_t nbytes = count * isz;
    if (nbytes && (!send || !recv)) return bad(e, "null buffer");
    if (send != recv && overlaps(send, nbytes, recv, nbytes))
        return bad(e, "sendbuf and recvbuf overlap without being the same buffer");
    if (!nbytes) return UC_SHM_OK;
    if (e->size == 1) {
        if (send != recv) copy_mem(recv, send, nbytes);
        return UC_SHM_OK;
    }
    size_t lo, hi;
    part(count, e->size, e->rank, isz, &lo, &hi);
    if (boxed(e, nbytes))
        rc = reduce_boxed(e, send, recv, count, dtype, op, -1);
    else if (nbytes <= e->small_bytes)
        rc = reduce_small(e, send, recv, count, isz, dtype, op, -1);
    else if (use_cma_reduce(e, UC_SHM_COLL_ALL_REDUCE, nbytes / (size_t)e->size))
        rc = reduce_cma(e, send, recv, lo * isz, lo * isz, hi - lo, isz, dtype, op, -1);
    else
        rc = reduce_pipe(e, send, recv, count, isz, dtype, op, -1);
    return rc;
}

#define PAIR_NT_MAX_BYTES (256u << 10)     /* reduce_pair's staging streams up to this (below) */
#define PAIR_HALVES_MIN_BYTES (768u << 10) /* and from this to a slot it halves the call (pair_chunk) */

/* reduce_pair's chunk, in elements.  The root folds a chunk once it is staged, so a call of one
 * chunk stages and folds in series; halves overlap the second staging with the first fold.
 * Halves up to PAIR_NT_MAX_BYTES (streamed) and from PAIR_HALVES_MIN_BYTES to a slot; between
 * them (calls of 384-640 KiB) halves in plain stores were slower than one chunk.  (2026-12-07, in-process
 * A/B, UNICCL_SHM_CMA=0, 2 ranks, medians of 5-7 rounds of 40 calls, two jobs: 64 KiB 8.1-8.3 ->
 * 6.9-7.1 us, 128 KiB 16.4 -> 12.8-13.3, 256 KiB 29.5-30.7 -> 25.2-26.3, 384 KiB 27-31 -> 33-40,
 * 512 KiB 31.5-32.0 -> 37.9-38.8, 768 KiB 45.7-48.6 -> 36.8-38.8, 1 MiB 59-67 -> 39.5-42.4;
 * from 2 MiB, 512 KiB chunks were no faster than a slot's.) */
static size_t pair_chunk(const uc_shm *e, size_t count, size_t isz) {
    size_t chunk = e->slot_bytes / isz, nbytes = count * isz;
    if (nbytes > PAIR_NT_MAX_BYTES && (nbytes < PAIR_HALVES_MIN_BYTES || nbytes > e->slot_bytes))
        return chunk;
    size_t half = (count + 1) / 2, page = 4096 % isz ? 1 : 4096 / isz; /* halves on page edges */
    half = (half + page - 1) / page * page;
    return half < chunk ? half : chunk;
}

/* A reduce of two ranks through the slots: the other rank stages its input chunk by chunk and
 * the root folds each chunk straight into recv, its own input and the staged chunk in rank order.
 * The root moves about 3 bytes (2 read, 1 written) per byte reduced, where the general pipeline
 * (each rank reduces half into its slot, the root gathers both halves) costs it about 4.5. */
static int reduce_pair(uc_shm *e, const char *send, char *recv, size_t count, size_t isz, int dtype, int op,
                       int root) {
    int me = e->rank, peer = 1 - me;
    size_t chunk = pair_chunk(e, count, isz), nchunks = (count + chunk - 1) / chunk;
    uint64_t g0 = e->g;
    e->g += nchunks;
    CHECKED(rec_publish(e));
    for (size_t k = 0; k < nchunks; k++) {
        uint64_t g = g0 + k;
        size_t off = k * chunk, m = count - off < chunk ? count - off : chunk;
        if (me != root) {
            /* streamed up to PAIR_NT_MAX_BYTES (2026-12-07, in-process A/B, 2 jobs outside a spell:
             * 32 KiB 6.2-6.4 -> 5.0-5.2 us, 128 KiB 17.4-17.6 -> 13.6-14.2, 256 KiB 23.1-25.1 ->
             * 27.1-28.7, 512 KiB 22.2-22.4 -> 42.2-45.8, 1 MiB 40-41 -> 75-77; in a spell 128 KiB
             * 67-75 -> 13.6-14.2: 256 KiB streams for that, and from 512 KiB the single-copy
             * reduce, which spells do not touch, is the live choices' other path) */
            CHECKED(stage(e, g, send + off * isz, m * isz, m * isz <= PAIR_NT_MAX_BYTES));
            if (k == 0) CHECKED(rec_meet(e, g0, 1));
        } else {
            if (k == 0) CHECKED(rec_meet(e, g0, 0));
            WAIT(e, OFF_READY, g + 1, peer);
            const void *theirs = slot(e, peer, g);
            CHECKED(check_src(e, peer, g, WHOLE(e), theirs, m * isz));
            e->src[me] = send + off * isz;
            e->src[peer] = theirs;
            CHECKED(fold(e, recv + off * isz, e->src, m, dtype, op));
        }
        sig(e, OFF_CONSUMED, g + 1);
    }
    return UC_SHM_OK;
}

static int reduce_impl(uc_shm *e, const void *send, void *recv, size_t count, int dtype, int op, int root) {
    int rc = UC_SHM_OK;
    size_t isz = 1;
    if ((rc = check_reduce_args(e, count, 1, dtype, op, &isz))) return rc;
    if (root < 0 || root >= e->size) return bad(e, "root %d is not a rank of 0..%d", root, e->size - 1);
    size_t nbytes = count * isz;
    int is_root = e->rank == root;
    if (nbytes && (!send || (is_root && !recv))) return bad(e, "null buffer");
    if (is_root && send != recv && overlaps(send, nbytes, recv, nbytes))
        return bad(e, "sendbuf and recvbuf overlap without being the same buffer");
    if (!nbytes) return UC_SHM_OK;
    if (e->size == 1) {
        if (send != recv) copy_mem(recv, send, nbytes);
        return UC_SHM_OK;
    }
    size_t lo, hi;
    part(count, e->size, e->rank, isz, &lo, &hi);
    if (boxed(e, nbytes))
        rc = reduce_boxed(e, send, recv, count, dtype, op, root);
    else if (nbytes <= e->small_bytes)
        rc = reduce_small(e, send, recv, count, isz, dtype, op, root);
    else if (use_cma_reduce(e, UC_SHM_COLL_REDUCE, nbytes / (size_t)e->size))
        rc = reduce_cma(e, send, is_root ? recv : NULL, lo * isz, lo * isz, hi - lo, isz, dtype, op, root);
    else if (e->size == 2)
        rc = reduce_pair(e, send, recv, count, isz, dtype, op, root);
    else
        rc = reduce_pipe(e, send, recv, count, isz, dtype, op, root);
    return rc;
}

/* Chunk k of every block goes through the slots: rank r packs the chunk of every
 * block q != r (and its own in place) at q*mb, then folds block r from every slot
 * straight into recv.  Staging runs one chunk ahead. */
static int reduce_scatter_impl(uc_shm *e, const void *send_, void *recv_, size_t count, int dtype, int op) {
    int rc = UC_SHM_OK;
    size_t isz = 1;
    int me = e->rank, n = e->size;
    if ((rc = check_reduce_args(e, count, (size_t)n, dtype, op, &isz))) return rc;
    const char *send = send_;
    char *recv = recv_;
    size_t bbytes = count * isz;
    if (bbytes && (!send || !recv)) return bad(e, "null buffer");
    int inplace = recv == send + (size_t)me * bbytes;
    if (!inplace && overlaps(send, bbytes * n, recv, bbytes))
        return bad(e, "recvbuf overlaps sendbuf without being block %d of it", me);
    if (!bbytes) return UC_SHM_OK;
    if (n == 1) {
        if (!inplace) copy_mem(recv, send, bbytes);
        return UC_SHM_OK;
    }
    if (boxed(e, bbytes * (size_t)n)) { /* fold block me of every box */
        uint64_t g = e->g++;
        CHECKED(box_meet(e, g, send, bbytes * (size_t)n));
        for (int q = 0; q < n; q++)
            e->src[q] = box_data(e, q, g, (size_t)me * bbytes);
        CHECKED(fold(e, recv, e->src, count, dtype, op));
        sig(e, OFF_CONSUMED, g + 1);
        return UC_SHM_OK;
    }
    if (use_cma_reduce(e, UC_SHM_COLL_REDUCE_SCATTER, bbytes))
        return reduce_cma(e, send, recv, (size_t)me * bbytes, 0, count, isz, dtype, op, -2);
    size_t mb = (e->slot_bytes / (size_t)n) / 64 * 64 / isz; /* elements per block per chunk */
    if (!mb) mb = 1;
    size_t nchunks = (count + mb - 1) / mb;
    uint64_t g0 = e->g;
    e->g += nchunks;
    CHECKED(rec_publish(e));
    for (size_t k = 0; k <= nchunks && !rc; k++) {
        if (k < nchunks) { /* A(k): stage */
            uint64_t g = g0 + k;
            size_t off = k * mb, m = count - off < mb ? count - off : mb;
            WAIT_SLOT(e, g);
            uint8_t *s = slot(e, me, g);
            for (int q = 0; q < n; q++)
                if (q != me || inplace) {
                    copy_mem(s + (size_t)q * mb * isz, send + ((size_t)q * count + off) * isz, m * isz);
                    seal(e, g, q, s + (size_t)q * mb * isz, m * isz);
                }
            sig(e, OFF_READY, g + 1);
            if (k == 0) CHECKED(rec_meet(e, g0, 1));
        }
        if (k >= 1) { /* B(k-1): fold my block */
            uint64_t g = g0 + k - 1;
            size_t off = (k - 1) * mb, m = count - off < mb ? count - off : mb;
            WAIT(e, OFF_READY, g + 1, -1);
            for (int q = 0; q < n; q++) {
                e->src[q] = q == me && !inplace ? (const void *)(send + ((size_t)me * count + off) * isz)
                                                : (const void *)(slot(e, q, g) + (size_t)me * mb * isz);
                if (q != me) CHECKED(check_src(e, q, g, me, e->src[q], m * isz));
            }
            rc = fold(e, recv + off * isz, e->src, m, dtype, op);
            sig(e, OFF_CONSUMED, g + 1);
        }
    }
    return rc;
}

/* ======================================================= data movement */
/* Whether a data mover reads single-copy: a peer is reachable, the transfer is large enough, and
 * single-copy reads are fast enough here (e->cma_speed_ppm) to beat the slots' form of the
 * collective, whose copies are more but plain and partly overlapped.  `need` is that break-even
 * speed in ppm of a plain copy's, from counting copies: broadcast and gather (the root's copy into
 * its slot overlaps the peers' copies out: the slots move at about one copy's speed) 0.9;
 * all_gather n-1 reads against n copies per rank, (n-1)/n; all_to_all n-1 reads against 2(n-1)
 * copies, 0.5; scatter one read per peer, in parallel, against the root's n-1 copies in, 0.9/(n-1). */
static inline int use_cma(uc_shm *e, int coll, size_t per_peer_bytes, uint32_t need) {
    return e->cma == 1 && per_peer_bytes >= e->cma_min_bytes && choose_cma(e, coll, per_peer_bytes, need);
}

/* Two ranks, single-copy, generation g: `n` bytes from rank `from`'s buffer into the other's, half
 * by each at once (the receiver reads the first half, `from` writes the second), so that both
 * cores copy where a read alone leaves one idle.  `mine`: this rank's end.  Returns after this
 * rank's CONSUMED; the caller waits for the peer's (its half done) before it returns. */
static int cma_halves(uc_shm *e, uint64_t g, int from, const void *mine, size_t n) {
    int peer = 1 - e->rank, rc;
    size_t half = n / 2 / 64 * 64;
    publish(e, mine);
    sig(e, OFF_READY, g + 1);
    CHECKED(rec_meet(e, g, 1));
    WAIT(e, OFF_READY, g + 1, peer);
    if (e->rank == from)
        rc = cma_write(e, peer, published(e, peer) + half, (const char *)mine + half, n - half);
    else
        rc = cma_read(e, peer, (void *)mine, published(e, peer), half);
    if (rc) return rc;
    sig(e, OFF_CONSUMED, g + 1);
    return UC_SHM_OK;
}

/* The root stages a broadcast's chunks (whole slots: the others copy out chunk k - 1 while it stages
 * chunk k) up to this size with streaming stores: a chunk of plain stores still dirty in the root's
 * cache is slow to read from another core, and in the VM's slow spells 5-7x slower.  2 ranks,
 * 2026-12-07, the two alternated in one process, six jobs outside a spell and three in one: 64 KiB
 * 9.0 -> 5.2-5.6 us outside, 30.6-33.5 -> 5.4-8.2 in; 256 KiB 27-29 -> 20-21, 115-126 -> 18.5-19.5;
 * 512 KiB 27-30 -> 35-38 outside (the one size that loses), 201-210 -> 31-32 in; from 1 MiB chunks
 * plain stores win outside (31 against 57; in a spell the live choices take single-copy reads).
 * With more ranks than CPUs every chunk (4 ranks on 2 cores: 16 KiB-2 MiB and 32 MiB 1.2-1.8x
 * faster, 8 MiB level).  Cut into quarters (56d64b6), calls of up to 512 KiB were slower in the same
 * jobs (512 KiB streamed 37-41 us outside a spell; 56d64b6's measure of the night before had the
 * quarters 1.05-1.2x faster, with plain stores, on a machine in another state). */
#define STAGE_NT_MAX_BYTES (512u << 10)

static int broadcast_impl(uc_shm *e, void *buf_, size_t nbytes, int root) {
    int rc = UC_SHM_OK;
    char *buf = buf_;
    int me = e->rank, n = e->size;
    if (root < 0 || root >= n) return bad(e, "root %d is not a rank of 0..%d", root, n - 1);
    if (nbytes && !buf) return bad(e, "null buffer");
    if (!nbytes || n == 1) return UC_SHM_OK;
    if (boxed(e, nbytes)) { /* the root's buffer in its box */
        uint64_t g = e->g++;
        CHECKED(box_meet(e, g, buf, me == root ? nbytes : 0));
        if (me != root) box_take(e, root, g, buf, 0, nbytes);
        sig(e, OFF_CONSUMED, g + 1);
        return UC_SHM_OK;
    }
    CHECKED(rec_publish(e));
    if (nbytes < e->cma_bcast_max_bytes && use_cma(e, UC_SHM_COLL_BROADCAST, nbytes, PPM(0.9))) {
        uint64_t g = e->g++;
        if (n == 2) { /* 2026-12-07, in-process A/B: 512 KiB 23.8 -> 12.3-15.5 us, 2 MiB 83-86 ->
                       * 44-53, 32 MiB 1800-1860 -> 1010-1150; 32 KiB level */
            CHECKED(cma_halves(e, g, root, buf, nbytes));
            WAIT(e, OFF_CONSUMED, g + 1, 1 - me);
            return UC_SHM_OK;
        }
        if (me == root) {
            publish(e, buf);
            sig(e, OFF_READY, g + 1);
            CHECKED(rec_meet(e, g, 1));
            sig(e, OFF_CONSUMED, g + 1);
            WAIT(e, OFF_CONSUMED, g + 1, -1);
        } else {
            CHECKED(rec_meet(e, g, 0));
            WAIT(e, OFF_READY, g + 1, root);
            if ((rc = cma_read(e, root, buf, published(e, root), nbytes))) return rc;
            sig(e, OFF_CONSUMED, g + 1);
        }
        return UC_SHM_OK;
    }
    size_t chunk = e->slot_bytes, nchunks = (nbytes + chunk - 1) / chunk;
    int nt = nbytes >= e->nt_min_bytes;
    uint64_t g0 = e->g;
    e->g += nchunks;
    for (size_t k = 0; k < nchunks; k++) {
        uint64_t g = g0 + k;
        size_t off = k * chunk, m = nbytes - off < chunk ? nbytes - off : chunk;
        if (me == root) {
            if ((rc = stage(e, g, buf + off, m, m <= e->stage_nt_max_bytes)) ||
                (k == 0 && (rc = rec_meet(e, g0, 1))))
                return rc;
        } else {
            if (k == 0) CHECKED(rec_meet(e, g0, 0));
            WAIT(e, OFF_READY, g + 1, root);
            CHECKED(take(e, root, g, WHOLE(e), buf + off, slot(e, root, g), m, nt));
        }
        sig(e, OFF_CONSUMED, g + 1);
    }
    return UC_SHM_OK;
}

static int all_gather_impl(uc_shm *e, const void *send_, void *recv_, size_t bb) {
    int rc = UC_SHM_OK;
    const char *send = send_;
    char *recv = recv_;
    int me = e->rank, n = e->size;
    if (bb > SIZE_MAX / (size_t)n) return bad(e, "block_bytes %zu is too large", bb);
    if (bb && (!send || !recv)) return bad(e, "null buffer");
    char *mine = recv + (size_t)me * bb;
    int inplace = send == mine;
    if (!inplace && overlaps(send, bb, recv, bb * n))
        return bad(e, "sendbuf overlaps recvbuf without being block %d of it", me);
    if (!bb) return UC_SHM_OK;
    if (n == 1) {
        if (!inplace) copy_mem(mine, send, bb);
        return UC_SHM_OK;
    }
    int nt = bb * n >= e->nt_min_bytes;
    if (boxed(e, bb)) {
        uint64_t g = e->g++;
        CHECKED(box_meet(e, g, send, bb));
        if (!inplace) copy_mem(mine, send, bb);
        for (int q = 0; q < n; q++)
            if (q != me) box_take(e, q, g, recv + (size_t)q * bb, 0, bb);
        sig(e, OFF_CONSUMED, g + 1);
        return UC_SHM_OK;
    }
    CHECKED(rec_publish(e));
    if (use_cma(e, UC_SHM_COLL_ALL_GATHER, bb, PPM((n - 1.0) / n))) {
        uint64_t g = e->g++;
        publish(e, send);
        sig(e, OFF_READY, g + 1);
        CHECKED(rec_meet(e, g, 1));
        for (int k = 1; k < n; k++) {
            int q = (me + k) % n;
            WAIT(e, OFF_READY, g + 1, q);
            if ((rc = cma_read(e, q, recv + (size_t)q * bb, published(e, q), bb))) return rc;
        }
        sig(e, OFF_CONSUMED, g + 1);
        if (!inplace) copy_out(e, mine, send, bb, nt); /* last, as below */
        WAIT(e, OFF_CONSUMED, g + 1, -1);
        return UC_SHM_OK;
    }
    size_t chunk = e->slot_bytes, nchunks = (bb + chunk - 1) / chunk;
    uint64_t g0 = e->g;
    e->g += nchunks;
    if ((rc = stage(e, g0, send, bb < chunk ? bb : chunk, 0)) || (rc = rec_meet(e, g0, 1))) return rc;
    for (size_t k = 0; k < nchunks; k++) {
        uint64_t g = g0 + k;
        size_t off = k * chunk, m = bb - off < chunk ? bb - off : chunk;
        if (k + 1 < nchunks) {
            size_t off1 = off + m, m1 = bb - off1 < chunk ? bb - off1 : chunk;
            if ((rc = stage(e, g + 1, send + off1, m1, 0))) return rc;
        }
        for (int j = 1; j < n; j++) {
            int q = (me + j) % n;
            WAIT(e, OFF_READY, g + 1, q);
            CHECKED(take(e, q, g, WHOLE(e), recv + (size_t)q * bb + off, slot(e, q, g), m, nt));
        }
        sig(e, OFF_CONSUMED, g + 1);
        /* my own block from my sendbuf, and last: copied out of my slot while the others read it
         * there, it made the two cores fight over its lines (2 ranks, 2 MiB: 130-140 against 75 us) */
        if (!inplace) copy_out(e, mine + off, send + off, m, nt);
    }
    return UC_SHM_OK;
}

static int all_to_all_impl(uc_shm *e, const void *send_, void *recv_, size_t bb) {
    int rc = UC_SHM_OK;
    const char *send = send_;
    char *recv = recv_;
    int me = e->rank, n = e->size;
    if (bb > SIZE_MAX / (size_t)n) return bad(e, "block_bytes %zu is too large", bb);
    if (bb && (!send || !recv)) return bad(e, "null buffer");
    if (overlaps(send, bb * n, recv, bb * n))
        return bad(e, "sendbuf and recvbuf overlap (in place all_to_all is not supported here)");
    if (!bb) return UC_SHM_OK;
    int nt = bb * n >= e->nt_min_bytes;
    char *mine = recv + (size_t)me * bb;
    const char *own = send + (size_t)me * bb;
    /* my own block is copied last (below): first, its lines were the oldest in cache when the
     * others' came in (2 ranks, 2026-12-07, in-process A/B: slots 8 MiB 697-866 -> 511-760 us,
     * 32 MiB 4130-4390 -> 3400-3850; single-copy reads level) */
    if (n == 1 || boxed(e, bb * (size_t)n)) copy_out(e, mine, own, bb, nt);
    if (n == 1) return UC_SHM_OK;
    if (boxed(e, bb * (size_t)n)) { /* block me of every box */
        uint64_t g = e->g++;
        CHECKED(box_meet(e, g, send, bb * (size_t)n));
        for (int q = 0; q < n; q++)
            if (q != me) box_take(e, q, g, recv + (size_t)q * bb, (size_t)me * bb, bb);
        sig(e, OFF_CONSUMED, g + 1);
        return UC_SHM_OK;
    }
    CHECKED(rec_publish(e));
    if (use_cma(e, UC_SHM_COLL_ALL_TO_ALL, bb, PPM(0.5))) {
        uint64_t g = e->g++;
        publish(e, send);
        sig(e, OFF_READY, g + 1);
        CHECKED(rec_meet(e, g, 1));
        for (int k = 1; k < n; k++) {
            int q = (me + k) % n;
            WAIT(e, OFF_READY, g + 1, q);
            if ((rc = cma_read(e, q, recv + (size_t)q * bb, published(e, q) + (uint64_t)me * bb, bb)))
                return rc;
        }
        sig(e, OFF_CONSUMED, g + 1);
        copy_out(e, mine, own, bb, nt);
        WAIT(e, OFF_CONSUMED, g + 1, -1);
        return UC_SHM_OK;
    }
    size_t mb = e->slot_bytes / (size_t)n / 64 * 64, nchunks = (bb + mb - 1) / mb;
    uint64_t g0 = e->g;
    e->g += nchunks;
    for (size_t k = 0; k <= nchunks; k++) {
        if (k < nchunks) {
            uint64_t g = g0 + k;
            size_t off = k * mb, m = bb - off < mb ? bb - off : mb;
            WAIT_SLOT(e, g);
            uint8_t *s = slot(e, me, g);
            for (int q = 0; q < n; q++)
                if (q != me) {
                    copy_mem(s + (size_t)q * mb, send + (size_t)q * bb + off, m);
                    seal(e, g, q, s + (size_t)q * mb, m);
                }
            sig(e, OFF_READY, g + 1);
            if (k == 0) CHECKED(rec_meet(e, g0, 1));
        }
        if (k >= 1) {
            uint64_t g = g0 + k - 1;
            size_t off = (k - 1) * mb, m = bb - off < mb ? bb - off : mb;
            for (int j = 1; j < n; j++) {
                int q = (me + j) % n;
                WAIT(e, OFF_READY, g + 1, q);
                CHECKED(
                    take(e, q, g, me, recv + (size_t)q * bb + off, slot(e, q, g) + (size_t)me * mb, m, nt));
            }
            sig(e, OFF_CONSUMED, g + 1);
            copy_out(e, mine + off, own + off, m, nt);
        }
    }
    return UC_SHM_OK;
}

static int gather_impl(uc_shm *e, const void *send_, void *recv_, size_t bb, int root) {
    int rc = UC_SHM_OK;
    const char *send = send_;
    char *recv = recv_;
    int me = e->rank, n = e->size, is_root = me == root;
    if (root < 0 || root >= n) return bad(e, "root %d is not a rank of 0..%d", root, n - 1);
    if (bb > SIZE_MAX / (size_t)n) return bad(e, "block_bytes %zu is too large", bb);
    if (bb && (!send || (is_root && !recv))) return bad(e, "null buffer");
    int inplace = is_root && send == recv + (size_t)me * bb;
    if (is_root && !inplace && overlaps(send, bb, recv, bb * n))
        return bad(e, "sendbuf overlaps recvbuf without being block %d of it", me);
    if (!bb) return UC_SHM_OK;
    int nt = bb * n >= e->nt_min_bytes, copy_own = is_root && !inplace;
    char *mine = recv + (size_t)me * bb;
    /* the root's own block last, while the others return (copy_own) */
    if (copy_own && (n == 1 || boxed(e, bb))) copy_out(e, mine, send, bb, nt), copy_own = 0;
    if (n == 1) return UC_SHM_OK;
    if (boxed(e, bb)) {
        uint64_t g = e->g++;
        CHECKED(box_meet(e, g, send, is_root ? 0 : bb));
        if (is_root)
            for (int q = 0; q < n; q++)
                if (q != me) box_take(e, q, g, recv + (size_t)q * bb, 0, bb);
        sig(e, OFF_CONSUMED, g + 1);
        return UC_SHM_OK;
    }
    CHECKED(rec_publish(e));
    if (use_cma(e, UC_SHM_COLL_GATHER, bb, PPM(0.9))) {
        uint64_t g = e->g++;
        if (n == 2) { /* the peer's block in halves (2026-12-07, in-process A/B: 512 KiB 23-29 ->
                       * 16-21 us, 8 MiB 288-343 -> 194-231, 32 MiB 1880 -> 1510; the slots stay as
                       * fast from 512 KiB: the live choices pick) */
            int peer = 1 - me;
            CHECKED(
                cma_halves(e, g, 1 - root, is_root ? (const void *)(recv + (size_t)peer * bb) : send, bb));
            if (copy_own) copy_out(e, mine, send, bb, nt);
            WAIT(e, OFF_CONSUMED, g + 1, peer);
            return UC_SHM_OK;
        }
        if (is_root) {
            CHECKED(rec_meet(e, g, 0));
            for (int k = 1; k < n; k++) {
                int q = (me + k) % n;
                WAIT(e, OFF_READY, g + 1, q);
                if ((rc = cma_read(e, q, recv + (size_t)q * bb, published(e, q), bb))) return rc;
            }
            sig(e, OFF_CONSUMED, g + 1);
            if (copy_own) copy_out(e, mine, send, bb, nt); /* while the others return */
        } else {
            publish(e, send);
            sig(e, OFF_READY, g + 1);
            CHECKED(rec_meet(e, g, 1));
            WAIT(e, OFF_CONSUMED, g + 1, root);
            sig(e, OFF_CONSUMED, g + 1);
        }
        return UC_SHM_OK;
    }
    size_t chunk = e->slot_bytes, nchunks = (bb + chunk - 1) / chunk;
    uint64_t g0 = e->g;
    e->g += nchunks;
    for (size_t k = 0; k < nchunks; k++) {
        uint64_t g = g0 + k;
        size_t off = k * chunk, m = bb - off < chunk ? bb - off : chunk;
        if (is_root) {
            if (k == 0) CHECKED(rec_meet(e, g0, 0));
            for (int j = 1; j < n; j++) {
                int q = (me + j) % n;
                WAIT(e, OFF_READY, g + 1, q);
                CHECKED(take(e, q, g, WHOLE(e), recv + (size_t)q * bb + off, slot(e, q, g), m, nt));
            }
        } else if ((rc = stage(e, g, send + off, m, 0)) || (k == 0 && (rc = rec_meet(e, g0, 1)))) {
            return rc;
        }
        sig(e, OFF_CONSUMED, g + 1);
        if (copy_own) copy_out(e, mine + off, send + off, m, nt);
    }
    return UC_SHM_OK;
}

static int scatter_impl(uc_shm *e, const void *send_, void *recv_, size_t bb, int root) {
    int rc = UC_SHM_OK;
    const char *send = send_;
    char *recv = recv_;
    int me = e->rank, n = e->size, is_root = me == root;
    if (root < 0 || root >= n) return bad(e, "root %d is not a rank of 0..%d", root, n - 1);
    if (bb > SIZE_MAX / (size_t)n) return bad(e, "block_bytes %zu is too large", bb);
    if (bb && (!recv || (is_root && !send))) return bad(e, "null buffer");
    int inplace = is_root && recv == send + (size_t)me * bb;
    if (is_root && !inplace && overlaps(send, bb * n, recv, bb))
        return bad(e, "recvbuf overlaps sendbuf without being block %d of it", me);
    if (!bb) return UC_SHM_OK;
    int nt = bb >= e->nt_min_bytes, copy_own = is_root && !inplace;
    const char *own = send + (size_t)me * bb;
    /* the root's own block while the others read theirs (copy_own; 2 ranks, 2026-12-07, in-process
     * A/B: single-copy reads 2 MiB 65 -> 41 us, 8 MiB 268 -> 164) */
    if (copy_own && (n == 1 || boxed(e, bb * (size_t)n))) copy_out(e, recv, own, bb, nt), copy_own = 0;
    if (n == 1) return UC_SHM_OK;
    if (boxed(e, bb * (size_t)n)) { /* the root's whole sendbuf in its box */
        uint64_t g = e->g++;
        CHECKED(box_meet(e, g, send, is_root ? bb * (size_t)n : 0));
        if (!is_root) box_take(e, root, g, recv, (size_t)me * bb, bb);
        sig(e, OFF_CONSUMED, g + 1);
        return UC_SHM_OK;
    }
    CHECKED(rec_publish(e));
    if (use_cma(e, UC_SHM_COLL_SCATTER, bb, PPM(0.9 / (n - 1)))) {
        uint64_t g = e->g++;
        if (is_root) {
            publish(e, send);
            sig(e, OFF_READY, g + 1);
            CHECKED(rec_meet(e, g, 1));
            sig(e, OFF_CONSUMED, g + 1);
            if (copy_own) copy_out(e, recv, own, bb, nt); /* while the others read */
            WAIT(e, OFF_CONSUMED, g + 1, -1);
        } else {
            CHECKED(rec_meet(e, g, 0));
            WAIT(e, OFF_READY, g + 1, root);
            if ((rc = cma_read(e, root, recv, published(e, root) + (uint64_t)me * bb, bb))) return rc;
            sig(e, OFF_CONSUMED, g + 1);
        }
        return UC_SHM_OK;
    }
    size_t mb = e->slot_bytes / (size_t)n / 64 * 64, nchunks = (bb + mb - 1) / mb;
    uint64_t g0 = e->g;
    e->g += nchunks;
    for (size_t k = 0; k < nchunks; k++) {
        uint64_t g = g0 + k;
        size_t off = k * mb, m = bb - off < mb ? bb - off : mb;
        if (is_root) {
            /* streamed as a broadcast's chunks are, where the root stages up to STAGE_NT_MAX_BYTES
             * (2 ranks, 2026-12-07: 64-512 KiB calls 6.8/19.7/34.4 -> 4.5/11.4/21.6 us, from 1 MiB
             * level; 4 ranks on 2 cores: 64-512 KiB 43/132/69 -> 22/27/44, 2 MiB 72 against 136) */
            int stream = (size_t)(n - 1) * m <= STAGE_NT_MAX_BYTES;
            WAIT_SLOT(e, g);
            uint8_t *s = slot(e, me, g);
            for (int q = 0; q < n; q++)
                if (q != me) copy_out(e, s + (size_t)q * mb, send + (size_t)q * bb + off, m, stream);
            nt_fence(e); /* before the checksums read the blocks back, and before the signal */
            for (int q = 0; q < n; q++)
                if (q != me) seal(e, g, q, s + (size_t)q * mb, m);
            sig(e, OFF_READY, g + 1);
            if (k == 0) CHECKED(rec_meet(e, g0, 1));
            if (copy_own) copy_out(e, recv + off, own + off, m, nt); /* while the others take chunk k */
        } else {
            if (k == 0) CHECKED(rec_meet(e, g0, 0));
            WAIT(e, OFF_READY, g + 1, root);
            CHECKED(take(e, root, g, me, recv + off, slot(e, root, g) + (size_t)me * mb, m, nt));
        }
        sig(e, OFF_CONSUMED, g + 1);
    }
    return UC_SHM_OK;
}

/* ================================================================ agree */
static int barrier_impl(uc_shm *e) {
    if (e->size == 1) return UC_SHM_OK;
    uint64_t g = e->g++;
    sig(e, OFF_READY, g + 1);
    WAIT(e, OFF_READY, g + 1, -1);
    sig(e, OFF_CONSUMED, g + 1);
    return UC_SHM_OK;
}

static int agree_impl(uc_shm *e, const int64_t *record, int64_t *out) {
    int me = e->rank, n = e->size;
    if (!record || !out) return bad(e, "null record");
    if (n == 1) {
        memmove(out, record, NREC * sizeof(int64_t));
        return UC_SHM_OK;
    }
    uint64_t g = e->g++;
    CHECKED(line_free(e)); /* everyone read my previous record */
    memcpy(e->ctrl[me].ready.record, record, NREC * sizeof(int64_t));
    e->ctrl[me].ready.with_data = 0;
    live_publish(e, 1);
    sig(e, OFF_READY, g + 1);
    int rc = arrive(e, OFF_READY, g + 1);
    if (rc) return rc;
    live_adopt(e);
    for (int q = 0; q < n; q++)
        if (q != me) peer_record(e, q, g, out + (size_t)q * NREC);
    memmove(out + (size_t)me * NREC, record, NREC * sizeof(int64_t));
    sig(e, OFF_CONSUMED, g + 1);
    e->agree_g = g + 1;
    return UC_SHM_OK;
}

/* ============================================================ entry points */
int uc_shm_all_reduce(uc_shm *e, const void *send, void *recv, size_t count, int dtype, int op) {
    int rc = begin(e, "all_reduce");
    return rc ? rc : end(e, all_reduce_impl(e, send, recv, count, dtype, op));
}

int uc_shm_reduce(uc_shm *e, const void *send, void *recv, size_t count, int dtype, int op, int root) {
    int rc = begin(e, "reduce");
    return rc ? rc : end(e, reduce_impl(e, send, recv, count, dtype, op, root));
}

int uc_shm_reduce_scatter(uc_shm *e, const void *send_, void *recv_, size_t count, int dtype, int op) {
    int rc = begin(e, "reduce_scatter");
    if (rc) return rc;
    e->ring_order = op >= 0 && (op & UC_SHM_RING_ORDER) != 0;
    rc = reduce_scatter_impl(e, send_, recv_, count, dtype, e->ring_order ? op & ~UC_SHM_RING_ORDER : op);
    e->ring_order = 0;
    return end(e, rc);
}

int uc_shm_broadcast(uc_shm *e, void *buf_, size_t nbytes, int root) {
    int rc = begin(e, "broadcast");
    return rc ? rc : end(e, broadcast_impl(e, buf_, nbytes, root));
}

int uc_shm_all_gather(uc_shm *e, const void *send_, void *recv_, size_t bb) {
    int rc = begin(e, "all_gather");
    return rc ? rc : end(e, all_gather_impl(e, send_, recv_, bb));
}

int uc_shm_all_to_all(uc_shm *e, const void *send_, void *recv_, size_t bb) {
    int rc = begin(e, "all_to_all");
    return rc ? rc : end(e, all_to_all_impl(e, send_, recv_, bb));
}

int uc_shm_gather(uc_shm *e, const void *send_, void *recv_, size_t bb, int root) {
    int rc = begin(e, "gather");
    return rc ? rc : end(e, gather_impl(e, send_, recv_, bb, root));
}

int uc_shm_scatter(uc_shm *e, const void *send_, void *recv_, size_t bb, int root) {
    int rc = begin(e, "scatter");
    return rc ? rc : end(e, scatter_impl(e, send_, recv_, bb, root));
}

int uc_shm_agree(uc_shm *e, const int64_t *record, int64_t *out) {
    int rc = begin(e, "agree");
    return rc ? rc : end(e, agree_impl(e, record, out));
}

/* One collective (coll: a UC_SHM_COLL_* code) run by its _impl. */
static int dispatch(uc_shm *e, int coll, const void *send, void *recv, size_t n, int dtype, int op,
                    int root) {
    switch (coll) {
    case UC_SHM_COLL_BARRIER: return barrier_impl(e);
    case UC_SHM_COLL_ALL_REDUCE: return all_reduce_impl(e, send, recv, n, dtype, op);
    case UC_SHM_COLL_REDUCE: return reduce_impl(e, send, recv, n, dtype, op, root);
    case UC_SHM_COLL_BROADCAST: return broadcast_impl(e, recv, n, root);
    case UC_SHM_COLL_ALL_GATHER: return all_gather_impl(e, send, recv, n);
    case UC_SHM_COLL_REDUCE_SCATTER: {
        e->ring_order = op >= 0 && (op & UC_SHM_RING_ORDER) != 0;
        int rc = reduce_scatter_impl(e, send, recv, n, dtype, e->ring_order ? op & ~UC_SHM_RING_ORDER : op);
        e->ring_order = 0;
        return rc;
    }
    case UC_SHM_COLL_ALL_TO_ALL: return all_to_all_impl(e, send, recv, n);
    case UC_SHM_COLL_GATHER: return gather_impl(e, send, recv, n, root);
    case UC_SHM_COLL_SCATTER: return scatter_impl(e, send, recv, n, root);
    }
    return bad(e, "collective code %d is not one of 0..%d", coll, UC_SHM_COLL_SCATTER);
}

static const char *const COLL_NAMES[] = {"barrier",        "all_reduce", "reduce", "broadcast", "all_gather",
                                         "reduce_scatter", "all_to_all", "gather", "scatter"};

int uc_shm_agreed(uc_shm *e, const int64_t *record, int64_t *out, int coll, const void *send, void *recv,
                  size_t n, int dtype, int op, int root) {
    return uc_shm_agreed_held(e, record, out, coll, send, recv, n, dtype, op, root, NULL, NULL);
}

int uc_shm_agreed_held(uc_shm *e, const int64_t *record, int64_t *out, int coll, const void *send, void *recv,
                       size_t n, int dtype, int op, int root, uc_shm_unlock_fn unlock, void *ctx) {
    int known = coll >= 0 && coll <= UC_SHM_COLL_SCATTER;
    const char *name = !known ? "agreed" : coll == UC_SHM_COLL_BARRIER && record ? "agree" : COLL_NAMES[coll];
    int rc = begin_held(e, name, unlock, ctx);
    if (rc) return rc;
    if (!record || !known) /* no record: the collective alone (its callers agreed already) */
        return end(e, dispatch(e, coll, send, recv, n, dtype, op, root));
    if (!out) return end(e, bad(e, "null record"));
    if (!n || e->size == 1 || coll == UC_SHM_COLL_BARRIER) { /* no data rendezvous to ride on */
        if (!(rc = agree_impl(e, record, out)))
            for (int q = 0; q < e->size; q++)
                if (memcmp(out + (size_t)q * NREC, record, NREC * sizeof(int64_t)) != 0)
                    rc = UC_SHM_EMISMATCH;
        /* the agreement was the barrier */
        return end(
            e, (rc || coll == UC_SHM_COLL_BARRIER) ? rc : dispatch(e, coll, send, recv, n, dtype, op, root));
    }
    e->rec_in = record;
    e->rec_out = out;
    rc = dispatch(e, coll, send, recv, n, dtype, op, root);
    e->rec_in = NULL; /* judged, or the call failed before its rendezvous */
    return end(e, rc);
}

int uc_shm_barrier(uc_shm *e) {
    int rc = begin(e, "barrier");
    return rc ? rc : end(e, barrier_impl(e));
}

/* ================================================================ setup */
static uint64_t self_pidns(void) {
    struct stat st;
    return stat("/proc/self/ns/pid", &st) == 0 ? (uint64_t)st.st_ino : 0;
}

static uint64_t self_start_time(void) {
    char state;
    uint64_t start = 0;
    return proc_stat((long)getpid(), &state, &start) == 0 ? start : 0;
}

static int cpu_count(void) {
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0) return CPU_COUNT(&set);
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

/* A single-copy read's speed over a plain copy's on this host, per million (UC_SHM_CMA_ALWAYS where
 * it cannot be measured): process_vm_readv of 1 MiB from this process into itself against copy_mem
 * of the same buffers, the best of 3 each, alternating.  Measured, not assumed: on the same VM type
 * it was 0.4x on one day and about 1x on another (the kernel pins every page it copies, and what
 * that costs varies), and it decides whether the single-copy reads or the slots win (use_cma).
 * About 2 ms of the creator's open, once (most of it the first touch of the buffers). */
static uint32_t measure_cma_speed(void) {
    const size_t n = 1u << 20, skew = 16; /* a numpy array's data lies 16 bytes into its page */
    char *a = mmap(NULL, 2 * n + 2 * PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE,
                   -1, 0); /* populated: no page faults in what is timed (nor a trap per page) */
    if (a == MAP_FAILED) return UC_SHM_CMA_ALWAYS;
    char *src = a + skew, *dst = a + n + PAGE + skew;
    uint64_t best_cma = UINT64_MAX, best_copy = UINT64_MAX;
    pid_t self = getpid();
    for (int k = 0; k < 3; k++) {
        struct iovec l = {dst, n}, r = {src, n};
        uint64_t t0 = now_ns();
        ssize_t got = process_vm_readv(self, &l, 1, &r, 1, 0);
        uint64_t t1 = now_ns();
        copy_mem(dst, src, n);
        uint64_t t2 = now_ns();
        if (got != (ssize_t)n) {
            munmap(a, 2 * n + 2 * PAGE);
            return UC_SHM_CMA_ALWAYS; /* the probe finds out why, and says so */
        }
        if (t1 - t0 < best_cma) best_cma = t1 - t0;
        if (t2 - t1 < best_copy) best_copy = t2 - t1;
    }
    munmap(a, 2 * n + 2 * PAGE);
    double ppm = best_cma ? 1e6 * (double)best_copy / (double)best_cma : 1e6;
    return ppm >= (double)(UC_SHM_CMA_ALWAYS - 1) ? UC_SHM_CMA_ALWAYS - 1 : ppm < 1 ? 1 : (uint32_t)ppm;
}

uc_shm *uc_shm_open(const char *name, int rank, int size, int create, size_t slot_bytes,
                    uc_shm_reduce_fn reduce, double timeout, int cma_allowed, const uc_shm_tuning *tuning,
                    uc_shm_error *err) {
    static const char *op = "open";
    uc_shm_tuning t = {0};
    if (tuning) t = *tuning;
    memset(err, 0, sizeof *err);
    if (!name || name[0] != '/' || strchr(name + 1, '/') || strlen(name) < 2 || strlen(name) > 250) {
        set_err(err, UC_SHM_EINVAL, op, "segment name must be '/' followed by 1-249 characters without '/'");
        return NULL;
    }
    if (size < 1 || size > 4096 || rank < 0 || rank >= size) {
        set_err(err, UC_SHM_EINVAL, op, "rank %d of size %d: need 0 <= rank < size <= 4096", rank, size);
        return NULL;
    }
    if ((create || slot_bytes) && (slot_bytes < PAGE || slot_bytes % PAGE || slot_bytes > (1UL << 30) ||
                                   slot_bytes < (size_t)size * 64)) {
        set_err(err, UC_SHM_EINVAL, op,
                "slot_bytes %zu must be a multiple of 4096 in [4096, 1 GiB] and at least 64 x size",
                slot_bytes);
        return NULL;
    }
    if (!(timeout >= 0) || timeout > 1e9) {
        set_err(err, UC_SHM_EINVAL, op, "timeout must be >= 0 seconds (0: none)");
        return NULL;
    }
    uc_shm *e = calloc(1, sizeof *e);
    if (!e) {
        set_err(err, UC_SHM_ESYS, op, "out of memory");
        return NULL;
    }
    e->count_arrivals = 1;
    e->src = calloc(2 * (size_t)size, sizeof *e->src);
    e->pids = calloc((size_t)size, sizeof *e->pids);
    e->missing = calloc((size_t)size, sizeof *e->missing);
    if (!e->src || !e->pids || !e->missing) {
        set_err(err, UC_SHM_ESYS, op, "out of memory");
        goto fail;
    }
    snprintf(e->name, sizeof e->name, "%s", name);
    e->rank = rank, e->size = size, e->creator = !!create;
    e->reduce = reduce;
    e->timeout_ns = (uint64_t)(timeout * 1e9);
    e->cma_allowed = cma_allowed ? 1 : 0;
    e->cma = size > 1 ? -1 : 0;
    snprintf(e->cma_reason, sizeof e->cma_reason, "%s",
             size > 1 ? "not decided yet (the first call probes it)" : "a single rank reads from nobody");

    size_t ctrl_bytes = ((size_t)size * sizeof(uc_ctrl) + PAGE - 1) / PAGE * PAGE;
    int fd;
    size_t crc_bytes = (((size_t)size * 2 * (size_t)(size + 1) * 4) + PAGE - 1) / PAGE * PAGE;
    if (create) {
        size_t total = PAGE + ctrl_bytes + (size_t)size * 2 * slot_bytes + (t.checksum ? crc_bytes : 0);
        fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
        if (fd < 0) {
            set_err(err, UC_SHM_ESYS, op, "shm_open(%s, O_CREAT|O_EXCL) failed: %s", name, strerror(errno));
            err->sys_errno = errno;
            goto fail;
        }
        if (ftruncate(fd, (off_t)total) != 0) {
            int saved = errno;
            set_err(err, UC_SHM_ESYS, op, "ftruncate(%s, %zu) failed: %s", name, total, strerror(saved));
            err->sys_errno = saved;
            close(fd);
            shm_unlink(name);
            goto fail;
        }
        /* ftruncate only sizes a sparse file: on a /dev/shm too small for it the first touch of
         * a page past the free space is a SIGBUS.  Reserve every page now, or fail here. */
        struct statvfs vfs;
        unsigned long long avail =
            fstatvfs(fd, &vfs) == 0 ? (unsigned long long)vfs.f_bavail * vfs.f_frsize : 0;
        int frc = posix_fallocate(fd, 0, (off_t)total);
        if (frc != 0 && frc != EOPNOTSUPP && frc != EINVAL) { /* EOPNOTSUPP/EINVAL: cannot reserve here */
            set_err(err, UC_SHM_ESYS, op,
                    "/dev/shm has %llu bytes free, the shared-memory segment needs %zu bytes "
                    "(posix_fallocate: %s)",
                    avail, total, strerror(frc));
            err->sys_errno = frc;
            close(fd);
            shm_unlink(name);
            goto fail;
        }
        e->map_bytes = total;
    } else {
        fd = shm_open(name, O_RDWR | O_CLOEXEC, 0);
        if (fd < 0) {
            set_err(err, UC_SHM_ESYS, op, "shm_open(%s) failed: %s", name, strerror(errno));
            err->sys_errno = errno;
            goto fail;
        }
        struct stat st;
        uint64_t t0 = now_ns();
        for (;;) { /* the creator may still be sizing it */
            if (fstat(fd, &st) != 0) {
                set_err(err, UC_SHM_ESYS, op, "fstat(%s) failed: %s", name, strerror(errno));
                close(fd);
                goto fail;
            }
            if (st.st_size >= PAGE) break;
            if (now_ns() - t0 > OPEN_WAIT_NS) {
                set_err(err, UC_SHM_ETIMEOUT, op, "segment %s was never sized by its creator", name);
                close(fd);
                goto fail;
            }
            usleep(1000);
        }
        e->map_bytes = (size_t)st.st_size;
    }
    void *base = mmap(NULL, e->map_bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
    int saved = errno;
    close(fd);
    if (base == MAP_FAILED) {
        set_err(err, UC_SHM_ESYS, op, "mmap of %zu bytes failed: %s", e->map_bytes, strerror(saved));
        err->sys_errno = saved;
        if (create) shm_unlink(name);
        goto fail;
    }
    e->base = base;
    e->hdr = (uc_hdr *)e->base;
    e->ctrl = (uc_ctrl *)(e->base + PAGE);
    uc_hdr *h = e->hdr;
    if (create) {
        h->version = UC_SHM_VERSION;
        h->size = (uint32_t)size;
        h->slot_bytes = slot_bytes;
        h->total_bytes = e->map_bytes;
        h->ctrl_bytes = ctrl_bytes;
        /* Defaults measured on a 2-core EPYC VM (benchmarks/bench_shm.py): the one-round
         * all_reduce wins below ~4 KiB at 2 ranks and ~16 KiB at 4; single-copy reads
         * win from ~16 KiB per peer at 2 ranks and ~64-128 KiB at 4; streaming stores
         * only help once the output cannot stay in the last-level cache (32 MiB here;
         * sysconf's L3 size is not trustworthy in VMs); a broadcast of 32 MiB or more is
         * faster through the pipelined slots than read by every peer at once (1.0-1.7x
         * at 2 and 4 ranks from 32-256 MiB; equal or slower below: docs/performance.md) --
         * a fixed limit only where the calls' speeds do not decide (live): in the VM's slow
         * spells the slots move 1.8 GB/s there against single-copy reads' 18. */
        h->small_bytes = t.small_bytes ? t.small_bytes : size <= 2 ? 4096 : 16384;
        h->cma_min_bytes = t.cma_min_bytes ? t.cma_min_bytes : size <= 2 ? 16384 : 65536;
        h->nt_min_bytes = t.nt_min_bytes ? t.nt_min_bytes : (32u << 20);
        /* single-copy reductions from a 32 KiB part at 2 ranks (2026-12-07, the API's calls, two
         * jobs each way: all_reduce 64 KiB 10.3-10.5 -> 7.9 us, 128 KiB 18.6-18.7 -> 10.8-11.0,
         * 256 KiB 26.5 -> 17.0-20.7; reduce 128 KiB 16.1 -> 10.4, 256 KiB 30.0 -> 17.7), 256 KiB
         * at more (4 ranks on 2 cores: level at 64 KiB-1 MiB totals, the engine alone 1.3-1.6x
         * slower below 1 MiB for all_reduce) */
        h->cma_reduce_min_bytes = t.cma_reduce_min_bytes == (size_t)-1 ? 0 /* never */
                                  : t.cma_reduce_min_bytes             ? t.cma_reduce_min_bytes
                                  : size <= 2                          ? (32u << 10)
                                                                       : (256u << 10);
        if (h->small_bytes > slot_bytes) h->small_bytes = slot_bytes;
        h->stage_nt_max_bytes = size > cpu_count() ? (uint64_t)-1 : STAGE_NT_MAX_BYTES;
        int measure = !t.cma_speed_ppm && cma_allowed == 2 && size > 1 && !t.checksum;
        h->cma_speed_ppm = t.cma_speed_ppm ? t.cma_speed_ppm
                           : measure       ? measure_cma_speed()
                                           : UC_SHM_CMA_ALWAYS;
        h->live = measure && h->cma_speed_ppm != UC_SHM_CMA_ALWAYS; /* then the calls' own speeds decide */
        h->cma_bcast_max_bytes = t.cma_bcast_max_bytes ? t.cma_bcast_max_bytes
                                 : h->live             ? (uint64_t)-1
                                                       : (32u << 20);
        h->slot_gbps = t.slot_gbps > 0 ? t.slot_gbps : 0;
        h->creator_pid = getpid();
        h->checksum = t.checksum ? 1 : 0;
        h->flip_ppm = t.checksum ? t.flip_ppm : 0;
        atomic_store_explicit(&h->magic, UC_SHM_MAGIC, memory_order_release);
    } else {
        uint64_t t0 = now_ns();
        while (atomic_load_explicit(&h->magic, memory_order_acquire) != UC_SHM_MAGIC) {
            if (now_ns() - t0 > OPEN_WAIT_NS) {
                set_err(err, UC_SHM_EINVAL, op, "%s is not a uniccl shared-memory segment", name);
                goto fail_unmap;
            }
            usleep(1000);
        }
        if (h->version != UC_SHM_VERSION) {
            set_err(err, UC_SHM_EINVAL, op, "segment %s has layout version %u, this engine %u", name,
                    h->version, UC_SHM_VERSION);
            goto fail_unmap;
        }
        if ((int)h->size != size) {
            set_err(err, UC_SHM_EINVAL, op, "segment %s was created for %u ranks, not %d", name, h->size,
                    size);
            goto fail_unmap;
        }
        if (slot_bytes && h->slot_bytes != slot_bytes) {
            set_err(err, UC_SHM_EINVAL, op, "segment %s has slot_bytes %llu, not %zu", name,
                    (unsigned long long)h->slot_bytes, slot_bytes);
            goto fail_unmap;
        }
        if (h->ctrl_bytes != ctrl_bytes || h->total_bytes != e->map_bytes ||
            h->total_bytes !=
                PAGE + ctrl_bytes + (size_t)size * 2 * h->slot_bytes + (h->checksum ? crc_bytes : 0)) {
            set_err(err, UC_SHM_EINVAL, op, "segment %s has an inconsistent layout", name);
            goto fail_unmap;
        }
    }
    e->slot_bytes = h->slot_bytes;
    e->small_bytes = h->small_bytes;
    e->cma_min_bytes = h->cma_min_bytes;
    e->nt_min_bytes = h->nt_min_bytes;
    e->cma_reduce_min_bytes = h->cma_reduce_min_bytes;
    e->cma_bcast_max_bytes = h->cma_bcast_max_bytes;
    e->stage_nt_max_bytes = h->stage_nt_max_bytes;
    e->cma_speed_ppm = h->cma_speed_ppm;
    e->live = (int)h->live;
    e->slot_gbps = h->slot_gbps;
    e->slots = e->base + PAGE + ctrl_bytes;
    e->checksum = (int)h->checksum;
    e->flip_ppm = h->flip_ppm;
    e->rng = 0x9E3779B97F4A7C15ULL ^ ((uint64_t)rank + 1) * 0x100000001B3ULL;
    e->crcs = e->checksum ? (uint32_t *)(e->slots + (size_t)size * 2 * e->slot_bytes) : NULL;
    int over = size > cpu_count();
    /* more ranks than CPUs: yield at once (an awaited peer is likely waiting for this CPU; 4 ranks on
     * 2 cores, 8-512 B calls: 5.4 us with 2 us of spin, 3.8 us without: docs/performance.md) */
    e->spin_ns = t.spin_ns ? t.spin_ns : over ? 0 : 20000;
    e->yield_ns = t.yield_ns ? t.yield_ns : over ? 200000 : 1000000;
    if (e->yield_ns < e->spin_ns) e->yield_ns = e->spin_ns;
    e->quick_spins = over ? 0 : QUICK_SPINS; /* more ranks than CPUs: a peer may need this CPU */

    uc_ctrl *c = &e->ctrl[rank];
    int64_t other = atomic_load_explicit(&c->pid, memory_order_acquire);
    if (other) {
        set_err(err, UC_SHM_EINVAL, op, "rank %d of %s is already attached by pid %lld", rank, name,
                (long long)other);
        goto fail_unmap;
    }
    pthread_once(&self_pid_once, self_pid_init);
    e->owner_pid = self_pid();
    atomic_store_explicit(&c->cpu, -1, memory_order_relaxed);
    c->start_time = self_start_time();
    c->pidns = self_pidns();
    c->base_addr = (uint64_t)(uintptr_t)e->base;
    atomic_store_explicit(&c->pid, (int64_t)getpid(), memory_order_release);
    sig(e, OFF_HELLO, 1);
    return e;

fail_unmap:
    munmap(e->base, e->map_bytes);
fail:
    free(e->src);
    free(e->pids);
    free(e->missing);
    free(e);
    return NULL;
}

int uc_shm_unlink(uc_shm *e) {
    if (!e->creator || e->unlinked) return UC_SHM_OK;
    e->unlinked = 1;
    if (shm_unlink(e->name) != 0 && errno != ENOENT) {
        int saved = errno;
        set_err(&e->err, UC_SHM_ESYS, "unlink", "shm_unlink(%s) failed: %s", e->name, strerror(saved));
        e->err.sys_errno = saved;
        return UC_SHM_ESYS;
    }
    return UC_SHM_OK;
}

int uc_shm_close(uc_shm *e) {
    if (!e) return UC_SHM_OK;
    int idle = 0;
    if (!atomic_compare_exchange_strong(&e->busy, &idle, 2)) return UC_SHM_EBUSY;
    if (e->owner_pid == (long)getpid()) {
        if (e->creator && !e->unlinked) shm_unlink(e->name);
        publish_abort(e, ABORT_CLOSED, e->rank, (long)getpid(), "closed");
    }
    munmap(e->base, e->map_bytes);
    free(e->src);
    free(e->ev);
    free(e->pids);
    free(e->missing);
    free(e);
    return UC_SHM_OK;
}

void uc_shm_set_interrupt(uc_shm *e, uc_shm_interrupt_fn fn, void *ctx) {
    e->interrupt = fn;
    e->interrupt_ctx = ctx;
}

void uc_shm_get_arrivals(const uc_shm *e, uc_shm_arrivals *out) {
    *out = e->arrivals;
}

void uc_shm_count_arrivals(uc_shm *e, int on) {
    e->count_arrivals = on != 0;
}

const uc_shm_error *uc_shm_last_error(const uc_shm *e) {
    return &e->err;
}

int uc_shm_cma(const uc_shm *e) {
    return e->cma;
}

const char *uc_shm_cma_reason(const uc_shm *e) {
    return e->cma_reason;
}

void uc_shm_get_tuning(const uc_shm *e, uc_shm_tuning *out, size_t *slot_bytes) {
    out->small_bytes = e->small_bytes;
    out->cma_min_bytes = e->cma_min_bytes;
    out->nt_min_bytes = e->nt_min_bytes;
    out->cma_reduce_min_bytes = e->cma_reduce_min_bytes;
    out->cma_bcast_max_bytes = e->cma_bcast_max_bytes;
    out->cma_speed_ppm = e->cma_speed_ppm;
    out->spin_ns = e->spin_ns;
    out->yield_ns = e->yield_ns;
    *slot_bytes = e->slot_bytes;
}

int uc_shm_fail(uc_shm *e, const char *op, const char *message) {
    set_err(&e->err, UC_SHM_EINVAL, op, "%s", message);
    return fatal(e);
}

void uc_shm_abort(uc_shm *e, const char *why) {
    if (e->owner_pid != (long)getpid()) return; /* a forked child's abort must never end its parent's job */
    atomic_store_explicit(&e->abort_requested, REQUEST_ABORT, memory_order_release);
    publish_abort(e, ABORT_FAILED, e->rank, (long)getpid(), why);
}

void uc_shm_revoke(uc_shm *e, const char *why) {
    if (e->owner_pid != (long)getpid()) return; /* (as uc_shm_abort) */
    uc_ctrl *me = &e->ctrl[e->rank];
    if (atomic_load_explicit(&me->abort_code, memory_order_acquire) != ABORT_NONE ||
        atomic_load_explicit(&e->abort_requested, memory_order_acquire))
        return; /* failed, aborted or revoked already: that verdict stands */
    publish_abort(e, ABORT_REVOKED, e->rank, (long)getpid(), why); /* the text first: requested() reads it */
    int none = 0;
    if (atomic_load_explicit(&me->abort_code, memory_order_acquire) == ABORT_REVOKED)
        atomic_compare_exchange_strong(&e->abort_requested, &none, REQUEST_REVOKE);
}

int uc_shm_set_timeout(uc_shm *e, double timeout) {
    if (!(timeout >= 0) || timeout > 1e9) return UC_SHM_EINVAL;
    e->timeout_ns = (uint64_t)(timeout * 1e9);
    return UC_SHM_OK;
}

void uc_shm_integrity(const uc_shm *e, int *on, uint64_t *failures, uint64_t *recopies) {
    *on = e->checksum;
    *failures = e->crc_failures;
    *recopies = e->recopies;
}
