/* Emulated NCCL 2.x (libnccl ABI) for ranks that are processes on one host.
 *
 * The unique id names a POSIX shared-memory segment (mode 0600) and carries a
 * random tag; ncclCommInitRank attaches it, waits for all ranks and unlinks
 * it.  Every collective is enqueued on the caller's stream as a host function
 * of the emulated cudart (this library is linked against it, as real NCCL
 * depends on libcudart) and runs when the stream reaches it:
 *
 *  - collectives move through per-rank, double-buffered, sequence-numbered
 *    slots; each step is post -> wait for all -> read -> mark consumed, with
 *    a descriptor so mismatched calls across ranks give ncclInvalidUsage;
 *  - every rank reduces all contributions in rank order, so results are
 *    bitwise identical on all ranks; fp16/bf16 accumulate in float and round
 *    once; integer sums/products wrap, integer ncclAvg truncates;
 *  - send/recv use one byte ring per ordered pair, framed by a length header;
 *    inside a group all send/recv progress together (any order, no deadlock),
 *    then the group's collectives run in call order;
 *  - a dead peer (pid gone or zombie), a peer that left or aborted, or no
 *    progress for UNICCL_EMU_TIMEOUT seconds (default 60) fails the op:
 *    ncclCommGetAsyncError then reports ncclRemoteError (peer) or
 *    ncclSystemError (timeout), later calls on the comm return it, and the
 *    segment's abort flag makes the other ranks fail fast instead of waiting.
 *
 * Buffers are always checked like NCCL_CHECK_POINTERS=1: they must be device
 * (or pinned host) memory of the emulated cudart, on the comm's device.
 * Limitations: one rank per process per clique inside a group; no
 * ncclCommInitAll/Split/config; injected failures are returned by the call
 * itself (nothing is enqueued).
 * Tunables (read by ncclGetUniqueId, carried in the id): UNICCL_EMU_NCCL_CHUNK
 * (slot bytes, default 1 MiB), UNICCL_EMU_NCCL_P2P (ring bytes, default 256 KiB).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "emu.h"

#ifndef EMU_NCCL_VERSION
#define EMU_NCCL_VERSION 22105
#endif
#ifndef EMU_CUDART_SONAME
#define EMU_CUDART_SONAME "libcudart.so.12"
#endif

typedef enum {
    ncclSuccess = 0,
    ncclUnhandledCudaError = 1,
    ncclSystemError = 2,
    ncclInternalError = 3,
    ncclInvalidArgument = 4,
    ncclInvalidUsage = 5,
    ncclRemoteError = 6,
    ncclInProgress = 7,
} ncclResult_t;

/* EMU_INT16 (the CNCL build): 16-bit integers too, as codes 10 and 11 (NCCL has none) */
#ifdef EMU_INT16
enum { T_I8, T_U8, T_I32, T_U32, T_I64, T_U64, T_F16, T_F32, T_F64, T_BF16, T_I16, T_U16, T_COUNT };
static const size_t k_size[T_COUNT] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2, 2, 2};
#else
enum { T_I8, T_U8, T_I32, T_U32, T_I64, T_U64, T_F16, T_F32, T_F64, T_BF16, T_COUNT };
static const size_t k_size[T_COUNT] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2};
#endif
enum { OP_SUM, OP_PROD, OP_MAX, OP_MIN, OP_AVG, OP_COUNT };
enum { C_ALLREDUCE = 1, C_BCAST, C_REDUCE, C_ALLGATHER, C_REDSCAT, C_SEND, C_RECV };

typedef struct {
    char internal[128];
} ncclUniqueId;

struct emu_id {
    char magic[8];
    uint64_t tag, chunk, p2p;
    char shm[64];
};
_Static_assert(sizeof(struct emu_id) <= sizeof(ncclUniqueId), "id too large");

/* ------------------------------------------------------------ cudart links */
static emu_enter_fn p_enter;
static emu_launch_fn p_launch;
static emu_ptr_fn p_ptr;
static emu_device_fn p_device;
static emu_fail_fn p_fail;
static emu_calls_fn p_calls;
static double g_timeout = 60.0;

/* Bind to the cudart we were linked against (by soname), not to whatever
 * libcudart happens to be global in the process. */
__attribute__((constructor)) static void nccl_emu_init(void) {
    void *h = dlopen(EMU_CUDART_SONAME, RTLD_LAZY | RTLD_NOLOAD);
    if (!h) h = RTLD_DEFAULT;
    p_enter = (emu_enter_fn)dlsym(h, "uniccl_emu__enter");
    p_launch = (emu_launch_fn)dlsym(h, "uniccl_emu__launch");
    p_ptr = (emu_ptr_fn)dlsym(h, "uniccl_emu__ptr");
    p_device = (emu_device_fn)dlsym(h, "uniccl_emu__device");
    p_fail = (emu_fail_fn)dlsym(h, "uniccl_emu_fail");
    p_calls = (emu_calls_fn)dlsym(h, "uniccl_emu_calls");
    const char *t = getenv("UNICCL_EMU_TIMEOUT");
    if (t && *t && atof(t) > 0) g_timeout = atof(t);
}

EMU_EXPORT int uniccl_emu_fail(const char *call, int status, int after, int times) {
    return p_fail ? p_fail(call, status, after, times) : -1;
}

EMU_EXPORT int uniccl_emu_calls(const char *call) {
    return p_calls ? p_calls(call) : 0;
}

static __thread char t_msg[256];

static ncclResult_t fail_msg(ncclResult_t rc, const char *fmt, const char *what) {
    snprintf(t_msg, sizeof t_msg, fmt, what);
    return rc;
}

#define ENTER(name)                                                                                          \
    do {                                                                                                     \
        if (!p_enter) return fail_msg(ncclUnhandledCudaError, "%s: emulated cudart not found", name);        \
        int inj_ = p_enter(name);                                                                            \
        if (inj_) return fail_msg((ncclResult_t)inj_, "%s: injected failure", name);                         \
    } while (0)

/* ---------------------------------------------------------- shared segment */
#define SHM_MAGIC 0x554e4943434c454dull
enum { R_EMPTY, R_JOINED, R_LEFT };

typedef struct {
    _Atomic uint64_t ready;
    uint64_t tag;
    int32_t nranks, pad;
    _Atomic int32_t joined;
    _Atomic int32_t aborted; /* first failure seen by any rank */
    char pad2[96];
} shm_hdr_t;

typedef struct {
    _Atomic int32_t pid, state;
    _Atomic uint64_t posted, consumed;
    char pad[40];
} shm_rank_t;

typedef struct {
    uint32_t coll, dtype, op;
    int32_t root;
    uint64_t count, seq;
    char pad[32];
} desc_t;

typedef struct {
    _Atomic uint64_t head;
    char pad1[56];
    _Atomic uint64_t tail;
    char pad2[56];
} ring_t;

_Static_assert(sizeof(shm_hdr_t) == 128 && sizeof(shm_rank_t) == 64 && sizeof(desc_t) == 64 &&
                   sizeof(ring_t) == 128,
               "shared layout");

#define COMM_MAGIC 0x434f4d4du

typedef struct comm {
    uint32_t magic;
    int rank, nranks, dev;
    char *base;
    size_t size, chunk, p2p, slot_sz, slots_off, rings_off;
    shm_hdr_t *hdr;
    shm_rank_t *ranks;
    uint64_t seq;    /* collective steps, touched only by the running job */
    _Atomic int err; /* async error */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    uint64_t next_ticket, serving;
    int pending, zombie;
    float *scratch;
    struct comm *next;
} comm_t;

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER; /* live comms, ticket order */
static comm_t *g_comms;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Spin, then yield, then sleep; report when a liveness check is due (1) or
 * the wait has lasted longer than the timeout (2). */
typedef struct {
    double deadline, next_check;
    unsigned iters;
} waiter_t;

static void w_init(waiter_t *w) {
    double t = now_s();
    w->deadline = t + g_timeout;
    w->next_check = t + 0.005;
    w->iters = 0;
}

static int w_tick(waiter_t *w) {
    w->iters++;
    if (w->iters < 64) {
#if defined(__x86_64__) || defined(__i386__)
        __builtin_ia32_pause();
#endif
    } else if (w->iters < 2048) {
        sched_yield();
    } else {
        struct timespec ts = {0, 100000};
        nanosleep(&ts, NULL);
    }
    if ((w->iters & 7) == 0) {
        double t = now_s();
        if (t > w->deadline) return 2;
        if (t >= w->next_check) {
            w->next_check = t + 0.01;
            return 1;
        }
    }
    return 0;
}

static int pid_dead(int pid) {
    if (pid <= 0) return 0;
    if (kill(pid, 0) == -1 && errno == ESRCH) return 1;
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/%d/stat", pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0) return 0;
    buf[n] = 0;
    char *p = strrchr(buf, ')'); /* an unreaped dead peer is a zombie */
    return p && p[1] == ' ' && (p[2] == 'Z' || p[2] == 'X');
}

/* Is peer (or any peer, -1) gone, or has some rank failed? */
static ncclResult_t peer_status(comm_t *c, int peer) {
    if (atomic_load(&c->hdr->aborted)) return ncclRemoteError;
    for (int j = peer < 0 ? 0 : peer; j < (peer < 0 ? c->nranks : peer + 1); j++) {
        if (j == c->rank) continue;
        if (atomic_load(&c->ranks[j].state) == R_LEFT || pid_dead(atomic_load(&c->ranks[j].pid)))
            return ncclRemoteError;
    }
    return ncclSuccess;
}

static ncclResult_t w_check(comm_t *c, waiter_t *w, int peer) {
    int k = w_tick(w);
    if (k == 2) return ncclSystemError;
    return k == 1 ? peer_status(c, peer) : ncclSuccess;
}

static void comm_fail(comm_t *c, ncclResult_t rc) {
    int zero = 0;
    atomic_compare_exchange_strong(&c->err, &zero, (int)rc);
    zero = 0;
    atomic_compare_exchange_strong(&c->hdr->aborted, &zero, (int)rc);
}

static desc_t *slot_desc(comm_t *c, int r, uint64_t seq) {
    return (desc_t *)(c->base + c->slots_off + ((size_t)r * 2 + (seq & 1)) * c->slot_sz);
}

static char *slot_data(comm_t *c, int r, uint64_t seq) {
    return (char *)(slot_desc(c, r, seq) + 1);
}

static ring_t *ring(comm_t *c, int src, int dst) {
    return (ring_t *)(c->base + c->rings_off + ((size_t)src * c->nranks + dst) * (sizeof(ring_t) + c->p2p));
}

/* ---------------------------------------------------------------- reduction */
static float h2f(uint16_t h) {
    uint32_t o = (uint32_t)(h & 0x7fff) << 13, exp = o & (0x7c00u << 13);
    o += (uint32_t)(127 - 15) << 23;
    if (exp == (0x7c00u << 13)) {
        o += (uint32_t)(128 - 16) << 23; /* inf, nan */
    } else if (exp == 0) {               /* subnormal: renormalise through the FPU */
        float f, magic;
        uint32_t m = 113u << 23;
        o += 1u << 23;
        memcpy(&f, &o, 4);
        memcpy(&magic, &m, 4);
        f -= magic;
        memcpy(&o, &f, 4);
    }
    o |= (uint32_t)(h & 0x8000) << 16;
    float r;
    memcpy(&r, &o, 4);
    return r;
}

static uint16_t f2h(float f) /* round to nearest even */
{
    uint32_t u, sign;
    memcpy(&u, &f, 4);
    sign = u & 0x80000000u;
    u ^= sign;
    uint16_t o;
    if (u >= (uint32_t)(127 + 16) << 23) {
        o = u > 255u << 23 ? 0x7e00 : 0x7c00;
    } else if (u < 113u << 23) {
        uint32_t dm_u = (uint32_t)((127 - 15) + (23 - 10) + 1) << 23, r;
        float fu, dm;
        memcpy(&fu, &u, 4);
        memcpy(&dm, &dm_u, 4);
        fu += dm;
        memcpy(&r, &fu, 4);
        o = (uint16_t)(r - dm_u);
    } else {
        uint32_t odd = (u >> 13) & 1;
        u += ((uint32_t)(15 - 127) << 23) + 0xfff + odd;
        o = (uint16_t)(u >> 13);
    }
    return (uint16_t)(o | (sign >> 16));
}

static float bf2f(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static uint16_t f2bf(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); /* quiet nan */
    u += 0x7fffu + ((u >> 16) & 1);
    return (uint16_t)(u >> 16);
}

#define RED_LOOP(T, EXPR)                                                                                    \
    for (int j = 1; j < n; j++) {                                                                            \
        const T *s = src[j];                                                                                 \
        for (size_t i = 0; i < m; i++)                                                                       \
            d[i] = EXPR;                                                                                     \
    }

/* Integers: sums/products in the unsigned type so overflow wraps. */
#define RED_INT(T, UT)                                                                                       \
    do {                                                                                                     \
        T *d = dst;                                                                                          \
        memcpy(d, src[0], m * sizeof(T));                                                                    \
        switch (op) {                                                                                        \
        case OP_SUM:                                                                                         \
        case OP_AVG: RED_LOOP(T, (T)(UT)((UT)d[i] + (UT)s[i])) break;                                        \
        case OP_PROD: RED_LOOP(T, (T)(UT)((UT)d[i] * (UT)s[i])) break;                                       \
        case OP_MAX: RED_LOOP(T, s[i] > d[i] ? s[i] : d[i]) break;                                           \
        default: RED_LOOP(T, s[i] < d[i] ? s[i] : d[i]) break;                                               \
        }                                                                                                    \
        if (op == OP_AVG)                                                                                    \
            for (size_t i = 0; i < m; i++)                                                                   \
                d[i] = (T)(d[i] / (T)n);                                                                     \
    } while (0)

#define RED_FLT(T)                                                                                           \
    do {                                                                                                     \
        T *d = dst;                                                                                          \
        memcpy(d, src[0], m * sizeof(T));                                                                    \
        switch (op) {                                                                                        \
        case OP_SUM:                                                                                         \
        case OP_AVG: RED_LOOP(T, d[i] + s[i]) break;                                                         \
        case OP_PROD: RED_LOOP(T, d[i] * s[i]) break;                                                        \
        case OP_MAX: RED_LOOP(T, s[i] > d[i] ? s[i] : d[i]) break;                                           \
        default: RED_LOOP(T, s[i] < d[i] ? s[i] : d[i]) break;                                               \
        }                                                                                                    \
        if (op == OP_AVG)                                                                                    \
            for (size_t i = 0; i < m; i++)                                                                   \
                d[i] = d[i] / (T)n;                                                                          \
    } while (0)

/* 16-bit floats: accumulate in float (scratch), round once. */
#define RED_HALF(TO_F, FROM_F)                                                                               \
    do {                                                                                                     \
        float *d = acc;                                                                                      \
        const uint16_t *s0 = src[0];                                                                         \
        for (size_t i = 0; i < m; i++)                                                                       \
            d[i] = TO_F(s0[i]);                                                                              \
        switch (op) {                                                                                        \
        case OP_SUM:                                                                                         \
        case OP_AVG: RED_LOOP(uint16_t, d[i] + TO_F(s[i])) break;                                            \
        case OP_PROD: RED_LOOP(uint16_t, d[i] * TO_F(s[i])) break;                                           \
        case OP_MAX: RED_LOOP(uint16_t, TO_F(s[i]) > d[i] ? TO_F(s[i]) : d[i]) break;                        \
        default: RED_LOOP(uint16_t, TO_F(s[i]) < d[i] ? TO_F(s[i]) : d[i]) break;                            \
        }                                                                                                    \
        uint16_t *out = dst;                                                                                 \
        for (size_t i = 0; i < m; i++)                                                                       \
            out[i] = FROM_F(op == OP_AVG ? d[i] / (float)n : d[i]);                                          \
    } while (0)

/* dst = src[0] op src[1] op ... in rank order (dst never aliases src). */
static void reduce(void *dst, const void *const *src, int n, size_t m, int dt, int op, float *acc) {
    switch (dt) {
    case T_I8: RED_INT(int8_t, uint8_t); break;
    case T_U8: RED_INT(uint8_t, uint8_t); break;
    case T_I32: RED_INT(int32_t, uint32_t); break;
    case T_U32: RED_INT(uint32_t, uint32_t); break;
    case T_I64: RED_INT(int64_t, uint64_t); break;
    case T_U64: RED_INT(uint64_t, uint64_t); break;
    case T_F32: RED_FLT(float); break;
    case T_F64: RED_FLT(double); break;
    case T_F16: RED_HALF(h2f, f2h); break;
#ifdef EMU_INT16
    case T_I16: RED_INT(int16_t, uint32_t); break;
    case T_U16: RED_INT(uint16_t, uint32_t); break;
#endif
    default: RED_HALF(bf2f, f2bf); break;
    }
}

/* ------------------------------------------------------------- collectives */
typedef struct {
    int coll, dt, op, root, peer;
    comm_t *c;
    const void *send;
    void *recv;
    size_t count;
    void *stream;
    /* send/recv progress */
    size_t done;
    int hdr_done, finished;
} task_t;

/* One step: wait until all ranks consumed my previous use of this slot, post,
 * wait for every rank's post of this step, check they called the same thing. */
static ncclResult_t step_begin(comm_t *c, uint64_t seq) {
    if (seq <= 2) return ncclSuccess;
    for (int j = 0; j < c->nranks; j++) {
        waiter_t w;
        w_init(&w);
        while (atomic_load_explicit(&c->ranks[j].consumed, memory_order_acquire) < seq - 2) {
            ncclResult_t rc = w_check(c, &w, j);
            /* re-check: a peer may have finished its part and then left */
            if (rc && atomic_load_explicit(&c->ranks[j].consumed, memory_order_acquire) < seq - 2) return rc;
        }
    }
    return ncclSuccess;
}

static ncclResult_t step_gather(comm_t *c, uint64_t seq, const desc_t *mine) {
    atomic_store_explicit(&c->ranks[c->rank].posted, seq, memory_order_release);
    for (int j = 0; j < c->nranks; j++) {
        waiter_t w;
        w_init(&w);
        while (atomic_load_explicit(&c->ranks[j].posted, memory_order_acquire) < seq) {
            ncclResult_t rc = w_check(c, &w, j);
            if (rc && atomic_load_explicit(&c->ranks[j].posted, memory_order_acquire) < seq) return rc;
        }
        const desc_t *d = slot_desc(c, j, seq);
        if (d->seq != seq || d->coll != mine->coll || d->dtype != mine->dtype || d->op != mine->op ||
            d->root != mine->root || d->count != mine->count)
            return fail_msg(ncclInvalidUsage, "%s: ranks called different collectives", "emulated nccl");
    }
    return ncclSuccess;
}

static ncclResult_t run_coll(task_t *t) {
    comm_t *c = t->c;
    int n = c->nranks, me = c->rank;
    size_t es = k_size[t->dt];
    size_t per = t->coll == C_REDSCAT ? c->chunk / (es * n) : c->chunk / es;
    const char *send = t->send;
    char *recv = t->recv;
    const void *srcs[n];
    desc_t mine = {(uint32_t)t->coll, (uint32_t)t->dt, (uint32_t)t->op, t->root, t->count, 0, {0}};
    for (size_t off = 0; off < t->count; off += per) {
        size_t m = t->count - off < per ? t->count - off : per;
        uint64_t seq = ++c->seq;
        ncclResult_t rc = step_begin(c, seq);
        if (rc) return rc;
        char *slot = slot_data(c, me, seq);
        switch (t->coll) {
        case C_ALLREDUCE:
        case C_REDUCE:
        case C_ALLGATHER: memcpy(slot, send + off * es, m * es); break;
        case C_BCAST:
            if (me == t->root) memcpy(slot, send + off * es, m * es);
            break;
        default: /* reduce-scatter: every rank's block for this step */
            for (int r = 0; r < n; r++)
                memcpy(slot + r * m * es, send + (r * t->count + off) * es, m * es);
        }
        mine.seq = seq;
        *slot_desc(c, me, seq) = mine;
        rc = step_gather(c, seq, &mine);
        if (rc) return rc;
        switch (t->coll) {
        case C_ALLREDUCE:
        case C_REDUCE:
            if (t->coll == C_ALLREDUCE || me == t->root) {
                for (int j = 0; j < n; j++)
                    srcs[j] = slot_data(c, j, seq);
                reduce(recv + off * es, srcs, n, m, t->dt, t->op, c->scratch);
            }
            break;
        case C_BCAST: memcpy(recv + off * es, slot_data(c, t->root, seq), m * es); break;
        case C_ALLGATHER:
            for (int j = 0; j < n; j++)
                memcpy(recv + (j * t->count + off) * es, slot_data(c, j, seq), m * es);
            break;
        default:
            for (int j = 0; j < n; j++)
                srcs[j] = slot_data(c, j, seq) + me * m * es;
            reduce(recv + off * es, srcs, n, m, t->dt, t->op, c->scratch);
        }
        atomic_store_explicit(&c->ranks[me].consumed, seq, memory_order_release);
    }
    return ncclSuccess;
}

static void ring_copy(ring_t *r, size_t cap, uint64_t pos, void *buf, size_t len, int write) {
    char *data = (char *)(r + 1);
    size_t off = pos % cap, first = len < cap - off ? len : cap - off;
    if (write) {
        memcpy(data + off, buf, first);
        memcpy(data, (char *)buf + first, len - first);
    } else {
        memcpy(buf, data + off, first);
        memcpy((char *)buf + first, data, len - first);
    }
}

/* Move as much of a send/recv as the ring allows.  1 progress, 0 none, <0 error. */
static int p2p_progress(task_t *t) {
    comm_t *c = t->c;
    size_t cap = c->p2p, bytes = t->count * k_size[t->dt];
    int progressed = 0;
    if (t->coll == C_SEND) {
        ring_t *r = ring(c, c->rank, t->peer);
        uint64_t head = atomic_load_explicit(&r->head, memory_order_relaxed);
        uint64_t space = cap - (head - atomic_load_explicit(&r->tail, memory_order_acquire));
        if (!t->hdr_done) {
            if (space < 8) return 0;
            uint64_t len = bytes;
            ring_copy(r, cap, head, &len, 8, 1);
            head += 8, space -= 8, t->hdr_done = progressed = 1;
        }
        size_t k = bytes - t->done < space ? bytes - t->done : space;
        if (k) {
            ring_copy(r, cap, head, (char *)t->send + t->done, k, 1);
            head += k, t->done += k, progressed = 1;
        }
        atomic_store_explicit(&r->head, head, memory_order_release);
    } else {
        ring_t *r = ring(c, t->peer, c->rank);
        uint64_t tail = atomic_load_explicit(&r->tail, memory_order_relaxed);
        uint64_t avail = atomic_load_explicit(&r->head, memory_order_acquire) - tail;
        if (!t->hdr_done) {
            if (avail < 8) return 0;
            uint64_t len;
            ring_copy(r, cap, tail, &len, 8, 0);
            if (len != bytes)
                return -(int)fail_msg(ncclInvalidUsage, "%s: send/recv sizes differ", "ncclRecv");
            tail += 8, avail -= 8, t->hdr_done = progressed = 1;
        }
        size_t k = bytes - t->done < avail ? bytes - t->done : avail;
        if (k) {
            ring_copy(r, cap, tail, (char *)t->recv + t->done, k, 0);
            tail += k, t->done += k, progressed = 1;
        }
        atomic_store_explicit(&r->tail, tail, memory_order_release);
    }
    if (t->hdr_done && t->done == bytes) t->finished = 1;
    return progressed;
}

/* All send/recv of a job progress together so their order cannot deadlock. */
static void run_p2p(task_t *tasks, int n) {
    waiter_t w;
    w_init(&w);
    for (;;) {
        int left = 0, progressed = 0;
        for (int i = 0; i < n; i++) {
            task_t *t = &tasks[i];
            if (t->finished || (t->coll != C_SEND && t->coll != C_RECV)) continue;
            if (atomic_load(&t->c->err)) {
                t->finished = 1;
                continue;
            }
            int p = p2p_progress(t);
            if (p < 0) {
                comm_fail(t->c, (ncclResult_t)-p);
                t->finished = 1;
                continue;
            }
            progressed |= p;
            left += !t->finished;
        }
        if (!left) return;
        if (progressed) {
            w_init(&w);
            continue;
        }
        int k = w_tick(&w);
        for (int i = 0; k && i < n; i++) {
            task_t *t = &tasks[i];
            if (t->finished || (t->coll != C_SEND && t->coll != C_RECV)) continue;
            ncclResult_t rc = k == 2 ? ncclSystemError : peer_status(t->c, t->peer);
            if (rc == ncclRemoteError) { /* the peer may have delivered, then left */
                int p = p2p_progress(t);
                if (p < 0)
                    rc = (ncclResult_t)-p;
                else if (p > 0 || t->finished)
                    continue;
            }
            if (rc) {
                comm_fail(t->c, rc);
                t->finished = 1;
            }
        }
    }
}

/* ------------------------------------------------------------------- jobs */
typedef struct {
    int ntasks, ncomms, nhelpers;
    task_t *tasks;
    comm_t **comms;
    uint64_t *tickets;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int arrived, done, refs;
} job_t;

static void comm_free(comm_t *c) {
    munmap(c->base, c->size);
    free(c->scratch);
    pthread_mutex_destroy(&c->mu);
    pthread_cond_destroy(&c->cv);
    free(c);
}

static void job_put(job_t *j) {
    pthread_mutex_lock(&j->mu);
    int last = --j->refs == 0;
    pthread_mutex_unlock(&j->mu);
    if (last) {
        pthread_mutex_destroy(&j->mu);
        pthread_cond_destroy(&j->cv);
        free(j->tasks);
        free(j->comms);
        free(j->tickets);
        free(j);
    }
}

static int timed_wait(pthread_cond_t *cv, pthread_mutex_t *mu, double deadline) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    double rem = deadline - now_s();
    if (rem <= 0) return ETIMEDOUT;
    double s = ts.tv_sec + ts.tv_nsec * 1e-9 + (rem < 0.05 ? rem : 0.05);
    ts.tv_sec = (time_t)s;
    ts.tv_nsec = (long)((s - (double)ts.tv_sec) * 1e9);
    pthread_cond_timedwait(cv, mu, &ts);
    return 0;
}

/* Host function on the other streams of a multi-stream group: hold them
 * until the group ran, so later work there is ordered after it. */
static void job_helper(void *arg) {
    job_t *j = arg;
    pthread_mutex_lock(&j->mu);
    j->arrived++;
    pthread_cond_broadcast(&j->cv);
    while (!j->done)
        pthread_cond_wait(&j->cv, &j->mu);
    pthread_mutex_unlock(&j->mu);
    job_put(j);
}

static void job_main(void *arg) {
    job_t *j = arg;
    double deadline = now_s() + g_timeout;
    int stalled = 0;
    pthread_mutex_lock(&j->mu);
    while (j->arrived < j->nhelpers && !stalled)
        stalled = timed_wait(&j->cv, &j->mu, deadline) == ETIMEDOUT;
    pthread_mutex_unlock(&j->mu);
    for (int k = 0; k < j->ncomms; k++) { /* run in call order on each comm */
        comm_t *c = j->comms[k];
        pthread_mutex_lock(&c->mu);
        while (c->serving != j->tickets[k])
            pthread_cond_wait(&c->cv, &c->mu);
        pthread_mutex_unlock(&c->mu);
        if (stalled) comm_fail(c, ncclSystemError);
    }
    run_p2p(j->tasks, j->ntasks);
    for (int i = 0; i < j->ntasks; i++) {
        task_t *t = &j->tasks[i];
        if (t->coll == C_SEND || t->coll == C_RECV || atomic_load(&t->c->err) || t->count == 0) continue;
        ncclResult_t rc = run_coll(t);
        if (rc) comm_fail(t->c, rc);
    }
    for (int k = 0; k < j->ncomms; k++) {
        comm_t *c = j->comms[k];
        pthread_mutex_lock(&c->mu);
        c->serving++;
        int last = --c->pending == 0 && c->zombie;
        pthread_cond_broadcast(&c->cv);
        pthread_mutex_unlock(&c->mu);
        if (last) comm_free(c); /* aborted while this job was queued */
    }
    pthread_mutex_lock(&j->mu);
    j->done = 1;
    pthread_cond_broadcast(&j->cv);
    pthread_mutex_unlock(&j->mu);
    job_put(j);
}

static ncclResult_t launch(task_t *tasks, int n) {
    job_t *j = calloc(1, sizeof *j);
    void **streams = calloc((size_t)n, sizeof *streams);
    if (j) {
        j->tasks = malloc((size_t)n * sizeof *tasks);
        j->comms = calloc((size_t)n, sizeof *j->comms);
        j->tickets = calloc((size_t)n, sizeof *j->tickets);
    }
    if (!j || !streams || !j->tasks || !j->comms || !j->tickets) {
        if (j) {
            free(j->tasks);
            free(j->comms);
            free(j->tickets);
        }
        free(j);
        free(streams);
        return ncclSystemError;
    }
    memcpy(j->tasks, tasks, (size_t)n * sizeof *tasks);
    j->ntasks = n;
    int ns = 0;
    for (int i = 0; i < n; i++) {
        int seen = 0;
        for (int k = 0; k < j->ncomms; k++)
            seen |= j->comms[k] == tasks[i].c;
        if (!seen) j->comms[j->ncomms++] = tasks[i].c;
        seen = 0;
        for (int k = 0; k < ns; k++)
            seen |= streams[k] == tasks[i].stream;
        if (!seen) streams[ns++] = tasks[i].stream;
    }
    pthread_mutex_init(&j->mu, NULL);
    pthread_cond_init(&j->cv, NULL);
    j->nhelpers = ns - 1;
    j->refs = ns;
    /* Tickets and enqueueing under one lock: call order = execution order. */
    pthread_mutex_lock(&g_mu);
    for (int k = 0; k < j->ncomms; k++) {
        comm_t *c = j->comms[k];
        pthread_mutex_lock(&c->mu);
        j->tickets[k] = c->next_ticket++;
        c->pending++;
        pthread_mutex_unlock(&c->mu);
    }
    int rc = 0, launched = 0;
    for (int k = 1; k < ns && !rc; k++)
        if (!(rc = p_launch(streams[k], job_helper, j))) launched++;
    if (!rc) rc = p_launch(streams[0], job_main, j);
    if (rc) { /* undo: nothing of this job will run */
        for (int k = 0; k < j->ncomms; k++) {
            comm_t *c = j->comms[k];
            pthread_mutex_lock(&c->mu);
            c->next_ticket--;
            c->pending--;
            pthread_mutex_unlock(&c->mu);
        }
        pthread_mutex_lock(&j->mu);
        j->refs = launched + 1;
        j->done = 1;
        pthread_cond_broadcast(&j->cv);
        pthread_mutex_unlock(&j->mu);
    }
    pthread_mutex_unlock(&g_mu);
    free(streams);
    if (rc) {
        job_put(j);
        return fail_msg(ncclUnhandledCudaError, "%s: cannot enqueue on the stream", "emulated nccl");
    }
    return ncclSuccess;
}

/* ------------------------------------------------------------------ groups */
static __thread int t_depth;
static __thread task_t *t_tasks;
static __thread int t_ntasks, t_cap;

static ncclResult_t submit(task_t *t) {
    if (t_depth == 0) return launch(t, 1);
    if (t_ntasks == t_cap) {
        int cap = t_cap ? 2 * t_cap : 16;
        task_t *n = realloc(t_tasks, (size_t)cap * sizeof *n);
        if (!n) return ncclSystemError;
        t_tasks = n;
        t_cap = cap;
    }
    t_tasks[t_ntasks++] = *t;
    return ncclSuccess;
}

EMU_EXPORT ncclResult_t ncclGroupStart(void) {
    ENTER("ncclGroupStart");
    t_depth++;
    return ncclSuccess;
}

EMU_EXPORT ncclResult_t ncclGroupEnd(void) {
    ENTER("ncclGroupEnd");
    if (t_depth == 0) return fail_msg(ncclInvalidUsage, "%s without ncclGroupStart", "ncclGroupEnd");
    if (--t_depth > 0 || t_ntasks == 0) return ncclSuccess;
    int n = t_ntasks;
    t_ntasks = 0;
    return launch(t_tasks, n);
}

/* ---------------------------------------------------------------- checking */
static ncclResult_t get_comm(void *h, comm_t **out, const char *who) {
    pthread_mutex_lock(&g_mu);
    comm_t *c = g_comms;
    while (c && c != h)
        c = c->next;
    pthread_mutex_unlock(&g_mu);
    if (!c || c->magic != COMM_MAGIC) return fail_msg(ncclInvalidArgument, "%s: invalid communicator", who);
    *out = c;
    return ncclSuccess;
}

static ncclResult_t check_buf(comm_t *c, const void *p, size_t bytes, const char *who) {
    if (bytes == 0) return ncclSuccess;
    int type = 0, dev = -1;
    if (!p || p_ptr(p, bytes, &type, &dev) != 0 || type == 0)
        return fail_msg(ncclInvalidArgument, "%s: buffer is not (all) device memory", who);
    if (type == 2 && dev != c->dev)
        return fail_msg(ncclInvalidArgument, "%s: buffer is on another device", who);
    return ncclSuccess;
}

/* Common front half of every operation. */
static ncclResult_t prepare(task_t *t, void *comm, const char *who) {
    ncclResult_t rc = get_comm(comm, &t->c, who);
    if (rc) return rc;
    int err = atomic_load(&t->c->err);
    if (err) return fail_msg((ncclResult_t)err, "%s: communicator has an asynchronous error", who);
    if (t->dt < 0 || t->dt >= T_COUNT) return fail_msg(ncclInvalidArgument, "%s: invalid datatype", who);
    if (t->op < 0 || t->op >= OP_COUNT)
        return fail_msg(ncclInvalidArgument, "%s: invalid reduction operation", who);
    int n = t->c->nranks, me = t->c->rank;
    if ((t->coll == C_BCAST || t->coll == C_REDUCE) && (t->root < 0 || t->root >= n))
        return fail_msg(ncclInvalidArgument, "%s: invalid root", who);
    if ((t->coll == C_SEND || t->coll == C_RECV) && (t->peer < 0 || t->peer >= n))
        return fail_msg(ncclInvalidArgument, "%s: invalid peer", who);
    size_t b = t->count * k_size[t->dt];
    size_t in = b, out = b;
    switch (t->coll) {
    case C_ALLGATHER: out = b * n; break;
    case C_REDSCAT: in = b * n; break;
    case C_BCAST: in = me == t->root ? b : 0; break;
    case C_REDUCE: out = me == t->root ? b : 0; break;
    case C_SEND: out = 0; break;
    case C_RECV: in = 0; break;
    default: break;
    }
    if ((rc = check_buf(t->c, t->send, in, who)) || (rc = check_buf(t->c, t->recv, out, who))) return rc;
    return submit(t);
}

/* ------------------------------------------------------------- public API */
EMU_EXPORT ncclResult_t ncclGetVersion(int *v) {
    ENTER("ncclGetVersion");
    if (!v) return ncclInvalidArgument;
    *v = EMU_NCCL_VERSION;
    return ncclSuccess;
}

EMU_EXPORT const char *ncclGetErrorString(ncclResult_t r) {
    if (p_enter) p_enter("ncclGetErrorString");
    switch (r) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
    case ncclSystemError: return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
    case ncclInternalError: return "internal error - please report this issue to the NCCL developers";
    case ncclInvalidArgument: return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case ncclInvalidUsage: return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    default: return "unknown result code";
    }
}

EMU_EXPORT const char *ncclGetLastError(void *comm) {
    (void)comm;
    if (p_enter) p_enter("ncclGetLastError");
    return t_msg;
}

static size_t env_size(const char *name, size_t dflt, size_t min) {
    const char *v = getenv(name);
    size_t s = v && *v ? (size_t)strtoull(v, NULL, 0) : dflt;
    s = (s + 63) & ~(size_t)63;
    return s < min ? min : s;
}

EMU_EXPORT ncclResult_t ncclGetUniqueId(ncclUniqueId *out) {
    ENTER("ncclGetUniqueId");
    if (!out) return fail_msg(ncclInvalidArgument, "%s: null id", "ncclGetUniqueId");
    struct emu_id id;
    memset(&id, 0, sizeof id);
    memcpy(id.magic, "UCCLEMU1", 8);
    if (getrandom(&id.tag, sizeof id.tag, 0) != (ssize_t)sizeof id.tag)
        id.tag = (uint64_t)getpid() * 0x9e3779b97f4a7c15ull ^ (uint64_t)(now_s() * 1e9);
    id.chunk = env_size("UNICCL_EMU_NCCL_CHUNK", 1 << 20, 4096);
    id.p2p = env_size("UNICCL_EMU_NCCL_P2P", 256 << 10, 64);
    snprintf(id.shm, sizeof id.shm, "/uniccl-emu-%d-%016llx", (int)getpid(), (unsigned long long)id.tag);
    memset(out, 0, sizeof *out);
    memcpy(out, &id, sizeof id);
    return ncclSuccess;
}

static ncclResult_t init_fail(comm_t *c, ncclResult_t rc, const char *what, const char *shm) {
    if (c) {
        if (c->hdr) comm_fail(c, rc);
        if (c->base) munmap(c->base, c->size);
        free(c->scratch);
        free(c);
    }
    if (shm) shm_unlink(shm); /* late joiners fail instead of waiting on a dead id */
    return fail_msg(rc, "ncclCommInitRank: %s", what);
}

EMU_EXPORT ncclResult_t ncclCommInitRank(void **out, int nranks, ncclUniqueId uid, int rank) {
    ENTER("ncclCommInitRank");
    struct emu_id id;
    memcpy(&id, &uid, sizeof id);
    id.shm[sizeof id.shm - 1] = 0;
    if (!out || nranks < 1 || rank < 0 || rank >= nranks || memcmp(id.magic, "UCCLEMU1", 8) ||
        id.chunk < 4096 || id.chunk % 64 || id.chunk < 8 * (uint64_t)nranks || id.p2p < 64 || id.p2p % 64)
        return fail_msg(ncclInvalidArgument, "%s: invalid arguments or unique id", "ncclCommInitRank");
    const char *t = getenv("UNICCL_EMU_TIMEOUT");
    if (t && *t && atof(t) > 0) g_timeout = atof(t);
    comm_t *c = calloc(1, sizeof *c);
    if (!c) return ncclSystemError;
    c->rank = rank;
    c->nranks = nranks;
    c->dev = p_device();
    c->chunk = id.chunk;
    c->p2p = id.p2p;
    c->slot_sz = sizeof(desc_t) + c->chunk;
    c->slots_off = sizeof(shm_hdr_t) + (size_t)nranks * sizeof(shm_rank_t);
    c->rings_off = c->slots_off + 2 * (size_t)nranks * c->slot_sz;
    c->size = c->rings_off + (size_t)nranks * nranks * (sizeof(ring_t) + c->p2p);
    c->scratch = malloc(2 * c->chunk); /* floats for fp16/bf16 accumulation */
    if (!c->scratch) return init_fail(c, ncclSystemError, "out of memory", NULL);

    waiter_t w;
    w_init(&w);
    int creator = 0, fd;
    for (;;) { /* the first rank to arrive creates the segment */
        fd = shm_open(id.shm, O_RDWR | O_CREAT | O_EXCL, 0600);
        if (fd >= 0) {
            creator = 1;
            if (ftruncate(fd, (off_t)c->size) != 0) {
                close(fd);
                return init_fail(c, ncclSystemError, "cannot size shared memory", id.shm);
            }
            break;
        }
        if (errno != EEXIST) return init_fail(c, ncclSystemError, "shm_open failed", NULL);
        fd = shm_open(id.shm, O_RDWR, 0600);
        struct stat st;
        off_t size = fd >= 0 && fstat(fd, &st) == 0 ? st.st_size : 0;
        if (size == (off_t)c->size) break;
        if (fd >= 0) close(fd);
        if (size != 0) /* sized by a rank with another nranks */
            return init_fail(c, ncclInvalidUsage, "nranks differs between ranks", NULL);
        if (w_tick(&w) == 2) return init_fail(c, ncclSystemError, "timeout waiting for the segment", NULL);
    }
    c->base = mmap(NULL, c->size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (c->base == MAP_FAILED) {
        c->base = NULL;
        return init_fail(c, ncclSystemError, "mmap failed", creator ? id.shm : NULL);
    }
    c->hdr = (shm_hdr_t *)c->base;
    c->ranks = (shm_rank_t *)(c->base + sizeof(shm_hdr_t));
    if (creator) {
        c->hdr->tag = id.tag;
        c->hdr->nranks = nranks;
        atomic_store_explicit(&c->hdr->ready, SHM_MAGIC, memory_order_release);
    }
    while (atomic_load_explicit(&c->hdr->ready, memory_order_acquire) != SHM_MAGIC)
        if (w_tick(&w) == 2) return init_fail(c, ncclSystemError, "timeout waiting for the segment", NULL);
    if (c->hdr->tag != id.tag || c->hdr->nranks != nranks) {
        c->hdr = NULL; /* not ours: leave its abort flag alone */
        return init_fail(c, ncclInvalidUsage, "nranks differs between ranks", NULL);
    }
    int zero = 0;
    if (!atomic_compare_exchange_strong(&c->ranks[rank].pid, &zero, (int)getpid())) {
        c->hdr = NULL;
        return init_fail(c, ncclInvalidUsage, "rank joined twice", NULL);
    }
    atomic_store(&c->ranks[rank].state, R_JOINED);
    if (atomic_fetch_add(&c->hdr->joined, 1) + 1 == nranks) shm_unlink(id.shm);
    while (atomic_load(&c->hdr->joined) < nranks) {
        int k = w_tick(&w);
        if (k == 2) return init_fail(c, ncclSystemError, "timeout waiting for all ranks", id.shm);
        if (k == 1 && peer_status(c, -1) && atomic_load(&c->hdr->joined) < nranks)
            return init_fail(c, ncclRemoteError, "a peer died during init", id.shm);
    }
    c->magic = COMM_MAGIC;
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->cv, NULL);
    pthread_mutex_lock(&g_mu);
    c->next = g_comms;
    g_comms = c;
    pthread_mutex_unlock(&g_mu);
    *out = c;
    return ncclSuccess;
}

static void unregister(comm_t *c) {
    pthread_mutex_lock(&g_mu);
    for (comm_t **pp = &g_comms; *pp; pp = &(*pp)->next)
        if (*pp == c) {
            *pp = c->next;
            break;
        }
    c->magic = 0;
    pthread_mutex_unlock(&g_mu);
}

EMU_EXPORT ncclResult_t ncclCommDestroy(void *comm) {
    ENTER("ncclCommDestroy");
    if (!comm) return ncclSuccess;
    comm_t *c;
    ncclResult_t rc = get_comm(comm, &c, "ncclCommDestroy");
    if (rc) return rc;
    unregister(c);
    pthread_mutex_lock(&c->mu); /* like NCCL: queued operations complete first */
    while (c->pending)
        pthread_cond_wait(&c->cv, &c->mu);
    pthread_mutex_unlock(&c->mu);
    atomic_store(&c->ranks[c->rank].state, R_LEFT);
    comm_free(c);
    return ncclSuccess;
}

EMU_EXPORT ncclResult_t ncclCommAbort(void *comm) {
    ENTER("ncclCommAbort");
    if (!comm) return ncclSuccess;
    comm_t *c;
    ncclResult_t rc = get_comm(comm, &c, "ncclCommAbort");
    if (rc) return rc;
    unregister(c);
    comm_fail(c, ncclRemoteError); /* peers and queued work stop waiting */
    atomic_store(&c->ranks[c->rank].state, R_LEFT);
    pthread_mutex_lock(&c->mu);
    int now = c->pending == 0;
    c->zombie = !now; /* otherwise the last queued job frees it */
    pthread_mutex_unlock(&c->mu);
    if (now) comm_free(c);
    return ncclSuccess;
}

EMU_EXPORT ncclResult_t ncclCommGetAsyncError(void *comm, ncclResult_t *res) {
    ENTER("ncclCommGetAsyncError");
    comm_t *c;
    ncclResult_t rc = get_comm(comm, &c, "ncclCommGetAsyncError");
    if (rc) return rc;
    if (!res) return ncclInvalidArgument;
    if (!atomic_load(&c->err) && atomic_load(&c->hdr->aborted))
        comm_fail(c, ncclRemoteError); /* another rank failed */
    *res = (ncclResult_t)atomic_load(&c->err);
    return ncclSuccess;
}

EMU_EXPORT ncclResult_t ncclCommCount(void *comm, int *count) {
    ENTER("ncclCommCount");
    comm_t *c;
    ncclResult_t rc = get_comm(comm, &c, "ncclCommCount");
    if (rc || !count) return rc ? rc : ncclInvalidArgument;
    *count = c->nranks;
    return ncclSuccess;
}

EMU_EXPORT ncclResult_t ncclCommCuDevice(void *comm, int *dev) {
    ENTER("ncclCommCuDevice");
    comm_t *c;
    ncclResult_t rc = get_comm(comm, &c, "ncclCommCuDevice");
    if (rc || !dev) return rc ? rc : ncclInvalidArgument;
    *dev = c->dev;
    return ncclSuccess;
}

EMU_EXPORT ncclResult_t ncclCommUserRank(void *comm, int *rank) {
    ENTER("ncclCommUserRank");
    comm_t *c;
    ncclResult_t rc = get_comm(comm, &c, "ncclCommUserRank");
    if (rc || !rank) return rc ? rc : ncclInvalidArgument;
    *rank = c->rank;
    return ncclSuccess;
}

EMU_EXPORT ncclResult_t ncclAllReduce(const void *send, void *recv, size_t count, int dt, int op, void *comm,
                                      void *stream) {
    ENTER("ncclAllReduce");
    task_t t = {.coll = C_ALLREDUCE,
                .dt = dt,
                .op = op,
                .send = send,
                .recv = recv,
                .count = count,
                .stream = stream};
    return prepare(&t, comm, "ncclAllReduce");
}

EMU_EXPORT ncclResult_t ncclBroadcast(const void *send, void *recv, size_t count, int dt, int root,
                                      void *comm, void *stream) {
    ENTER("ncclBroadcast");
    task_t t = {.coll = C_BCAST,
                .dt = dt,
                .root = root,
                .send = send,
                .recv = recv,
                .count = count,
                .stream = stream};
    return prepare(&t, comm, "ncclBroadcast");
}

EMU_EXPORT ncclResult_t ncclReduce(const void *send, void *recv, size_t count, int dt, int op, int root,
                                   void *comm, void *stream) {
    ENTER("ncclReduce");
    task_t t = {.coll = C_REDUCE,
                .dt = dt,
                .op = op,
                .root = root,
                .send = send,
                .recv = recv,
                .count = count,
                .stream = stream};
    return prepare(&t, comm, "ncclReduce");
}

EMU_EXPORT ncclResult_t ncclAllGather(const void *send, void *recv, size_t sendcount, int dt, void *comm,
                                      void *stream) {
    ENTER("ncclAllGather");
    task_t t = {
        .coll = C_ALLGATHER, .dt = dt, .send = send, .recv = recv, .count = sendcount, .stream = stream};
    return prepare(&t, comm, "ncclAllGather");
}

EMU_EXPORT ncclResult_t ncclReduceScatter(const void *send, void *recv, size_t recvcount, int dt, int op,
                                          void *comm, void *stream) {
    ENTER("ncclReduceScatter");
    task_t t = {.coll = C_REDSCAT,
                .dt = dt,
                .op = op,
                .send = send,
                .recv = recv,
                .count = recvcount,
                .stream = stream};
    return prepare(&t, comm, "ncclReduceScatter");
}

EMU_EXPORT ncclResult_t ncclSend(const void *buf, size_t count, int dt, int peer, void *comm, void *stream) {
    ENTER("ncclSend");
    task_t t = {.coll = C_SEND, .dt = dt, .peer = peer, .send = buf, .count = count, .stream = stream};
    return prepare(&t, comm, "ncclSend");
}

EMU_EXPORT ncclResult_t ncclRecv(void *buf, size_t count, int dt, int peer, void *comm, void *stream) {
    ENTER("ncclRecv");
    task_t t = {.coll = C_RECV, .dt = dt, .peer = peer, .recv = buf, .count = count, .stream = stream};
    return prepare(&t, comm, "ncclRecv");
}
