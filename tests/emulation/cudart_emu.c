/* Emulated CUDA runtime (libcudart ABI, CUDA 12; CoreX flavour with -DEMU_COREX;
 * MACA mc* and MUSA musa* flavours with -DEMU_RT_PREFIX/-DEMU_CCL_PREFIX, their symbols
 * renamed after compiling by tests/_emulation.py).
 *
 * Everything lives in host memory: "device" allocations are aligned host
 * blocks recorded in an allocation table, so bindings can be checked for the
 * mistakes a real GPU punishes (wrong memcpy kind, overruns, freed pointers)
 * without a GPU.  Each stream is a worker thread running its queue in order;
 * stream 0 is the legacy default stream with its implicit synchronisation.
 *
 * Behaviour worth knowing (tests rely on it):
 *  - env UNICCL_EMU_DEVICES (default 2; 0 = cudaErrorNoDevice),
 *    UNICCL_EMU_DEVICE_MEMORY (bytes, K/M/G suffix; default 1G per device),
 *    UNICCL_EMU_DRIVER_VERSION (default = runtime version; lower makes
 *    device calls return cudaErrorInsufficientDriver), UNICCL_EMU_FAIL.
 *  - Error injection: an injected status is returned by the call itself, also
 *    for asynchronous calls (nothing is enqueued), and sets the last error.
 *  - Errors are not sticky: an injected cudaErrorIllegalAddress does not
 *    poison later calls as it would on a GPU.
 *  - cudaGetDeviceProperties(_v2) fills name (offset 0) and totalGlobalMem
 *    (offset 288) plus a few ints; callers must pass >= 4 KiB.
 *  - cudaFree/cudaFreeHost synchronise all streams first (as CUDA does).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "emu.h"

enum {
    cudaSuccess = 0,
    cudaErrorInvalidValue = 1,
    cudaErrorMemoryAllocation = 2,
    cudaErrorInitializationError = 3,
    cudaErrorInvalidMemcpyDirection = 21,
    cudaErrorInsufficientDriver = 35,
    cudaErrorNoDevice = 100,
    cudaErrorInvalidDevice = 101,
    cudaErrorInvalidResourceHandle = 400,
    cudaErrorNotReady = 600,
    cudaErrorIllegalAddress = 700,
    cudaErrorLaunchFailure = 719,
    cudaErrorNotSupported = 801,
    cudaErrorUnknown = 999,
};

#ifdef EMU_COREX
#define EMU_RUNTIME_VERSION 10020 /* CoreX 3.x/4.x expose the CUDA 10.2 API */
#define EMU_DEVICE_NAME "Iluvatar emulated device"
#define EMU_CC_MAJOR 7
#define EMU_CC_MINOR 1
#else
#ifndef EMU_RUNTIME_VERSION /* vendor builds (metax, moore) pass their own */
#define EMU_RUNTIME_VERSION 12040
#endif
#ifndef EMU_DEVICE_NAME
#define EMU_DEVICE_NAME "uniccl emulated device"
#endif
#define EMU_CC_MAJOR 8
#define EMU_CC_MINOR 0
#endif

#define MAX_DEV 64
#define DEV_ALIGN 256
#define MEM_DEVICE 2
#define MEM_HOST 1
#define STREAM_MAGIC 0x5354524du
#define EVENT_MAGIC 0x45564e54u
#define cudaStreamNonBlocking 1u
#define cudaEventDisableTiming 2u

typedef int cudaError_t;

/* ------------------------------------------------------------ global state */
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER; /* streams, events, allocs */
static pthread_cond_t g_done = PTHREAD_COND_INITIALIZER; /* some stream progressed */
static int g_ndev = 2;
static size_t g_devmem = (size_t)1 << 30;
static size_t g_used[MAX_DEV];
static int g_driver = EMU_RUNTIME_VERSION;
static __thread int t_dev;
static __thread cudaError_t t_err;

static cudaError_t set_err(cudaError_t rc) {
    if (rc != cudaSuccess && rc != cudaErrorNotReady) t_err = rc;
    return rc;
}

/* ---------------------------------------------------- injection + counters */
#define MAX_CALLS 256
struct callstat {
    char name[64];
    long calls;
    int armed, status, skip, times;
};
static pthread_mutex_t g_inj_mu = PTHREAD_MUTEX_INITIALIZER;
static struct callstat g_calls[MAX_CALLS];
static int g_ncalls;

static struct callstat *callstat(const char *name) {
    for (int i = 0; i < g_ncalls; i++)
        if (strcmp(g_calls[i].name, name) == 0) return &g_calls[i];
    if (g_ncalls == MAX_CALLS) return NULL;
    struct callstat *cs = &g_calls[g_ncalls++];
    memset(cs, 0, sizeof *cs);
    snprintf(cs->name, sizeof cs->name, "%s", name);
    return cs;
}

#ifdef EMU_RT_PREFIX
/* Vendor builds (metax: mc/mccl, moore: musa/mccl): the exported symbols are renamed
 * after compiling (objcopy --redefine-syms); the names this emulation counts, injects
 * and reports follow them: "cudaX" -> EMU_RT_PREFIX "X", "ncclX" -> EMU_CCL_PREFIX "X". */
static const char *vendor_name(const char *name, char *buf, size_t n) {
    if (name && strncmp(name, "cuda", 4) == 0)
        snprintf(buf, n, "%s%s", EMU_RT_PREFIX, name + 4);
    else if (name && strncmp(name, "nccl", 4) == 0)
        snprintf(buf, n, "%s%s", EMU_CCL_PREFIX, name + 4);
    else
        return name;
    return buf;
}
#endif

EMU_EXPORT int uniccl_emu__enter(const char *call) {
    int rc = 0;
#ifdef EMU_RT_PREFIX
    char vname[64];
    call = vendor_name(call, vname, sizeof vname);
#endif
    pthread_mutex_lock(&g_inj_mu);
    struct callstat *cs = callstat(call);
    if (cs) {
        cs->calls++;
        if (cs->armed) {
            if (cs->skip > 0)
                cs->skip--;
            else if (cs->times != 0) {
                rc = cs->status;
                if (cs->times > 0) cs->times--;
            }
        }
    }
    pthread_mutex_unlock(&g_inj_mu);
    return rc;
}

EMU_EXPORT int uniccl_emu_fail(const char *call, int status, int after, int times) {
    pthread_mutex_lock(&g_inj_mu);
    int rc = 0;
    if (!call) {
        g_ncalls = 0; /* clears rules and counters */
    } else {
        struct callstat *cs = callstat(call);
        if (!cs)
            rc = -1;
        else {
            cs->armed = status != 0 && times != 0;
            cs->status = status;
            cs->skip = after < 0 ? 0 : after;
            cs->times = times;
        }
    }
    pthread_mutex_unlock(&g_inj_mu);
    return rc;
}

EMU_EXPORT int uniccl_emu_calls(const char *call) {
    long n = 0;
    pthread_mutex_lock(&g_inj_mu);
    if (!call) {
        for (int i = 0; i < g_ncalls; i++)
            n += g_calls[i].calls;
    } else {
        for (int i = 0; i < g_ncalls; i++)
            if (strcmp(g_calls[i].name, call) == 0) n = g_calls[i].calls;
    }
    pthread_mutex_unlock(&g_inj_mu);
    return n > 0x7fffffff ? 0x7fffffff : (int)n;
}

/* "name=status[@after[:times]];..." -- times defaults to forever. */
static void parse_fail_env(const char *spec) {
    char buf[1024];
    snprintf(buf, sizeof buf, "%s", spec);
    char *save = NULL;
    for (char *tok = strtok_r(buf, ";,", &save); tok; tok = strtok_r(NULL, ";,", &save)) {
        char *eq = strchr(tok, '=');
        if (!eq) continue;
        *eq = 0;
        char *end;
        int status = (int)strtol(eq + 1, &end, 0), after = 0, times = -1;
        if (*end == '@') {
            after = (int)strtol(end + 1, &end, 0);
            if (*end == ':') times = (int)strtol(end + 1, &end, 0);
        }
        while (*tok == ' ')
            tok++;
        uniccl_emu_fail(tok, status, after, times);
    }
}

#define ENTER(name)                                                                                          \
    do {                                                                                                     \
        int inj_ = uniccl_emu__enter(name);                                                                  \
        if (inj_) return set_err(inj_);                                                                      \
    } while (0)

/* Device calls fail like the real runtime when there is no usable device. */
static cudaError_t dev_ok(void) {
    if (g_driver < EMU_RUNTIME_VERSION) return cudaErrorInsufficientDriver;
    return g_ndev > 0 ? cudaSuccess : cudaErrorNoDevice;
}

#define DEV_OK()                                                                                             \
    do {                                                                                                     \
        cudaError_t d_ = dev_ok();                                                                           \
        if (d_) return set_err(d_);                                                                          \
    } while (0)

/* ------------------------------------------------------- allocation table */
typedef struct {
    uintptr_t base;
    size_t size;
    int dev, type;
} alloc_t;
static alloc_t *g_allocs;
static size_t g_nalloc, g_capalloc;

/* Index of the allocation containing p, or -1.  Caller holds g_mu. */
static long alloc_find(uintptr_t p) {
    size_t lo = 0, hi = g_nalloc;
    while (lo < hi) { /* first base > p */
        size_t mid = (lo + hi) / 2;
        if (g_allocs[mid].base <= p)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo == 0) return -1;
    alloc_t *a = &g_allocs[lo - 1];
    return p < a->base + a->size ? (long)(lo - 1) : -1;
}

static int alloc_insert(uintptr_t base, size_t size, int dev, int type) {
    if (g_nalloc == g_capalloc) {
        size_t cap = g_capalloc ? 2 * g_capalloc : 64;
        alloc_t *n = realloc(g_allocs, cap * sizeof *n);
        if (!n) return -1;
        g_allocs = n;
        g_capalloc = cap;
    }
    size_t i = g_nalloc;
    while (i > 0 && g_allocs[i - 1].base > base) {
        g_allocs[i] = g_allocs[i - 1];
        i--;
    }
    g_allocs[i] = (alloc_t){base, size, dev, type};
    g_nalloc++;
    return 0;
}

static void alloc_remove(size_t i) {
    memmove(&g_allocs[i], &g_allocs[i + 1], (g_nalloc - i - 1) * sizeof *g_allocs);
    g_nalloc--;
}

/* Classify [p, p+n): 0 unknown (host), MEM_HOST, MEM_DEVICE, or -1 when it starts
 * inside an allocation but runs past its end.  Caller holds g_mu. */
static int range_type(const void *p, size_t n, int *dev) {
    long i = alloc_find((uintptr_t)p);
    if (i < 0) {
        /* Unknown (host) memory, unless the range runs into an allocation. */
        size_t lo = 0, hi = g_nalloc;
        while (lo < hi) {
            size_t mid = (lo + hi) / 2;
            if (g_allocs[mid].base <= (uintptr_t)p)
                lo = mid + 1;
            else
                hi = mid;
        }
        return lo < g_nalloc && g_allocs[lo].base - (uintptr_t)p < n ? -1 : 0;
    }
    alloc_t *a = &g_allocs[i];
    if (dev) *dev = a->dev;
    if ((uintptr_t)p + n > a->base + a->size || (uintptr_t)p + n < (uintptr_t)p) return -1;
    return a->type;
}

/* Private: used by libnccl to check buffers like NCCL_CHECK_POINTERS=1. */
EMU_EXPORT int uniccl_emu__ptr(const void *p, size_t n, int *type, int *dev) {
    pthread_mutex_lock(&g_mu);
    int d = -1, t = range_type(p, n, &d);
    pthread_mutex_unlock(&g_mu);
    if (type) *type = t;
    if (dev) *dev = d;
    return t < 0 ? cudaErrorInvalidValue : cudaSuccess;
}

EMU_EXPORT int uniccl_emu__device(void) {
    return t_dev;
}

/* --------------------------------------------------------- streams, events */
enum { OP_COPY, OP_SET, OP_HOST, OP_RECORD, OP_WAIT };

struct stream;
struct event;

typedef struct op {
    struct op *next;
    int type;
    uint64_t seq;
    void *dst;
    const void *src;
    size_t n;
    int val;
    void (*fn)(void *);
    void *arg;
    struct event *ev;
    uint64_t gen;
    struct stream *ws;
    uint64_t wseq;
} op_t;

typedef struct stream {
    uint32_t magic;
    int dev, legacy, dying, refs;
    unsigned flags;
    pthread_t thr;
    pthread_cond_t cv;
    op_t *head, *tail;
    uint64_t submitted, completed;
    struct stream *next;
} stream_t;

typedef struct event {
    uint32_t magic;
    unsigned flags;
    int refs;
    stream_t *s; /* stream of the last record, NULL if never recorded */
    uint64_t seq, gen;
    double t;
    int t_valid;
    struct event *next;
} event_t;

static stream_t *g_streams; /* live streams, legacy ones included */
static stream_t *g_legacy[MAX_DEV];
static event_t *g_events;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void stream_put(stream_t *s) {
    if (--s->refs == 0) {
        pthread_cond_destroy(&s->cv);
        free(s);
    }
}

static void event_put(event_t *e) {
    if (--e->refs == 0) {
        if (e->s) stream_put(e->s);
        free(e);
    }
}

static void *worker(void *arg) {
    stream_t *s = arg;
    pthread_mutex_lock(&g_mu);
    for (;;) {
        while (!s->head && !s->dying)
            pthread_cond_wait(&s->cv, &g_mu);
        if (!s->head) break;
        op_t *op = s->head;
        switch (op->type) {
        case OP_WAIT:
            while (op->ws->completed < op->wseq)
                pthread_cond_wait(&g_done, &g_mu);
            break;
        case OP_RECORD:
            if (op->ev->gen == op->gen) {
                op->ev->t = now_s();
                op->ev->t_valid = 1;
            }
            break;
        default:
            pthread_mutex_unlock(&g_mu);
            if (op->type == OP_COPY)
                memmove(op->dst, op->src, op->n);
            else if (op->type == OP_SET)
                memset(op->dst, op->val, op->n);
            else
                op->fn(op->arg);
            pthread_mutex_lock(&g_mu);
        }
        s->head = op->next;
        if (!s->head) s->tail = NULL;
        s->completed = op->seq;
        if (op->ws) stream_put(op->ws);
        if (op->ev) event_put(op->ev);
        free(op);
        pthread_cond_broadcast(&g_done);
    }
    pthread_mutex_unlock(&g_mu);
    return NULL;
}

/* Caller holds g_mu. */
static cudaError_t stream_new(int dev, unsigned flags, int legacy, stream_t **out) {
    stream_t *s = calloc(1, sizeof *s);
    if (!s) return cudaErrorMemoryAllocation;
    s->magic = STREAM_MAGIC;
    s->dev = dev;
    s->flags = flags;
    s->legacy = legacy;
    s->refs = 1;
    pthread_cond_init(&s->cv, NULL);
    if (pthread_create(&s->thr, NULL, worker, s) != 0) {
        pthread_cond_destroy(&s->cv);
        free(s);
        return cudaErrorMemoryAllocation;
    }
    s->next = g_streams;
    g_streams = s;
    *out = s;
    return cudaSuccess;
}

/* Resolve a handle: NULL, cudaStreamLegacy (1) and cudaStreamPerThread (2) all
 * mean the legacy default stream of the current device.  Caller holds g_mu. */
static cudaError_t get_stream(void *h, stream_t **out) {
    if (h == NULL || h == (void *)1 || h == (void *)2) {
        int d = t_dev;
        if (!g_legacy[d]) {
            cudaError_t rc = stream_new(d, 0, 1, &g_legacy[d]);
            if (rc) return rc;
        }
        *out = g_legacy[d];
        return cudaSuccess;
    }
    for (stream_t *s = g_streams; s; s = s->next)
        if (s == h && s->magic == STREAM_MAGIC) {
            *out = s;
            return cudaSuccess;
        }
    return cudaErrorInvalidResourceHandle;
}

static cudaError_t get_event(void *h, event_t **out) {
    for (event_t *e = g_events; e; e = e->next)
        if (e == h && e->magic == EVENT_MAGIC) {
            *out = e;
            return cudaSuccess;
        }
    return cudaErrorInvalidResourceHandle;
}

static void push(stream_t *s, op_t *op) {
    op->seq = ++s->submitted;
    if (s->tail)
        s->tail->next = op;
    else
        s->head = op;
    s->tail = op;
    pthread_cond_signal(&s->cv);
}

static void push_wait(stream_t *s, stream_t *on, uint64_t seq) {
    op_t *w = calloc(1, sizeof *w);
    if (!w) abort(); /* tiny allocation; nothing sensible to return mid-enqueue */
    w->type = OP_WAIT;
    w->ws = on;
    w->wseq = seq;
    on->refs++;
    push(s, w);
}

/* Legacy default stream semantics: it waits for prior work of all blocking
 * streams of its device, and blocking streams wait for prior legacy work. */
static void enqueue(stream_t *s, op_t *op) {
    if (s->legacy) {
        for (stream_t *t = g_streams; t; t = t->next)
            if (t != s && !t->legacy && t->dev == s->dev && !(t->flags & cudaStreamNonBlocking) &&
                t->completed < t->submitted)
                push_wait(s, t, t->submitted);
    } else if (!(s->flags & cudaStreamNonBlocking)) {
        stream_t *l = g_legacy[s->dev];
        if (l && l->completed < l->submitted) push_wait(s, l, l->submitted);
    }
    push(s, op);
}

static void wait_seq(stream_t *s, uint64_t seq) {
    while (s->completed < seq)
        pthread_cond_wait(&g_done, &g_mu);
}

/* Wait for everything submitted so far on all streams (of dev, or all if -1). */
static void sync_all(int dev) {
    for (;;) {
        stream_t *busy = NULL;
        for (stream_t *s = g_streams; s; s = s->next)
            if ((dev < 0 || s->dev == dev) && s->completed < s->submitted) {
                busy = s;
                break;
            }
        if (!busy) return;
        busy->refs++;
        wait_seq(busy, busy->submitted);
        stream_put(busy);
    }
}

/* ------------------------------------------------------------------ device */
EMU_EXPORT cudaError_t cudaGetDeviceCount(int *count) {
    ENTER("cudaGetDeviceCount");
    if (!count) return set_err(cudaErrorInvalidValue);
    *count = 0;
    DEV_OK();
    *count = g_ndev;
    return cudaSuccess;
}

EMU_EXPORT cudaError_t cudaSetDevice(int dev) {
    ENTER("cudaSetDevice");
    DEV_OK();
    if (dev < 0 || dev >= g_ndev) return set_err(cudaErrorInvalidDevice);
    t_dev = dev;
    return cudaSuccess;
}

EMU_EXPORT cudaError_t cudaGetDevice(int *dev) {
    ENTER("cudaGetDevice");
    if (!dev) return set_err(cudaErrorInvalidValue);
    DEV_OK();
    *dev = t_dev;
    return cudaSuccess;
}

EMU_EXPORT cudaError_t cudaRuntimeGetVersion(int *v) {
    ENTER("cudaRuntimeGetVersion");
    if (!v) return set_err(cudaErrorInvalidValue);
    *v = EMU_RUNTIME_VERSION;
    return cudaSuccess;
}

EMU_EXPORT cudaError_t cudaDriverGetVersion(int *v) {
    ENTER("cudaDriverGetVersion");
    if (!v) return set_err(cudaErrorInvalidValue);
    *v = g_driver;
    return cudaSuccess;
}

EMU_EXPORT cudaError_t cudaDeviceSynchronize(void) {
    ENTER("cudaDeviceSynchronize");
    DEV_OK();
    pthread_mutex_lock(&g_mu);
    sync_all(t_dev);
    pthread_mutex_unlock(&g_mu);
    return cudaSuccess;
}

EMU_EXPORT cudaError_t cudaGetLastError(void) {
    ENTER("cudaGetLastError");
    cudaError_t e = t_err;
    t_err = cudaSuccess;
    return e;
}

EMU_EXPORT cudaError_t cudaPeekAtLastError(void) {
    ENTER("cudaPeekAtLastError");
    return t_err;
}

static const struct {
    int code;
    const char *name, *text;
} k_errors[] = {
    {cudaSuccess, "cudaSuccess", "no error"},
    {cudaErrorInvalidValue, "cudaErrorInvalidValue", "invalid argument"},
    {cudaErrorMemoryAllocation, "cudaErrorMemoryAllocation", "out of memory"},
    {cudaErrorInitializationError, "cudaErrorInitializationError", "initialization error"},
    {cudaErrorInvalidMemcpyDirection, "cudaErrorInvalidMemcpyDirection", "invalid copy direction for memcpy"},
    {cudaErrorInsufficientDriver, "cudaErrorInsufficientDriver",
     "CUDA driver version is insufficient for CUDA runtime version"},
    {cudaErrorNoDevice, "cudaErrorNoDevice", "no CUDA-capable device is detected"},
    {cudaErrorInvalidDevice, "cudaErrorInvalidDevice", "invalid device ordinal"},
    {cudaErrorInvalidResourceHandle, "cudaErrorInvalidResourceHandle", "invalid resource handle"},
    {cudaErrorNotReady, "cudaErrorNotReady", "device not ready"},
    {cudaErrorIllegalAddress, "cudaErrorIllegalAddress", "an illegal memory access was encountered"},
    {cudaErrorLaunchFailure, "cudaErrorLaunchFailure", "unspecified launch failure"},
    {cudaErrorNotSupported, "cudaErrorNotSupported", "operation not supported"},
    {cudaErrorUnknown, "cudaErrorUnknown", "unknown error"},
};

#define N_ERRORS (sizeof k_errors / sizeof k_errors[0])
#ifdef EMU_RT_PREFIX
static char g_err_names[N_ERRORS][64]; /* k_errors' names with the vendor's prefix */

static void vendor_error_names(void) {
    for (size_t i = 0; i < N_ERRORS; i++)
        vendor_name(k_errors[i].name, g_err_names[i], sizeof g_err_names[i]); /* all start with "cuda" */
}
#endif

EMU_EXPORT const char *cudaGetErrorName(cudaError_t e) {
    uniccl_emu__enter("cudaGetErrorName");
    for (size_t i = 0; i < N_ERRORS; i++)
        if (k_errors[i].code == e)
#ifdef EMU_RT_PREFIX
            return g_err_names[i];
#else
            return k_errors[i].name;
#endif
    return "unrecognized error code";
}

EMU_EXPORT const char *cudaGetErrorString(cudaError_t e) {
    uniccl_emu__enter("cudaGetErrorString");
    for (size_t i = 0; i < sizeof k_errors / sizeof k_errors[0]; i++)
        if (k_errors[i].code == e) return k_errors[i].text;
    return "unrecognized error code";
}

EMU_EXPORT cudaError_t cudaMemGetInfo(size_t *free_b, size_t *total) {
    ENTER("cudaMemGetInfo");
    if (!free_b || !total) return set_err(cudaErrorInvalidValue);
    DEV_OK();
    pthread_mutex_lock(&g_mu);
    *free_b = g_devmem - g_used[t_dev];
    *total = g_devmem;
    pthread_mutex_unlock(&g_mu);
    return cudaSuccess;
}

/* cudaDeviceAttr values from driver_types.h. */
EMU_EXPORT cudaError_t cudaDeviceGetAttribute(int *value, int attr, int dev) {
    ENTER("cudaDeviceGetAttribute");
    if (!value) return set_err(cudaErrorInvalidValue);
    DEV_OK();
    if (dev < 0 || dev >= g_ndev) return set_err(cudaErrorInvalidDevice);
    switch (attr) {
    case 1: *value = 1024; break;          /* MaxThreadsPerBlock */
    case 10: *value = 32; break;           /* WarpSize */
    case 16: *value = 8; break;            /* MultiProcessorCount */
    case 18: *value = 0; break;            /* Integrated */
    case 19: *value = 1; break;            /* CanMapHostMemory */
    case 33: *value = dev + 1; break;      /* PciBusId */
    case 34: *value = 0; break;            /* PciDeviceId */
    case 41: *value = 1; break;            /* UnifiedAddressing */
    case 50: *value = 0; break;            /* PciDomainId */
    case 75: *value = EMU_CC_MAJOR; break; /* ComputeCapabilityMajor */
    case 76: *value = EMU_CC_MINOR; break; /* ComputeCapabilityMinor */
    default: return set_err(cudaErrorInvalidValue);
    }
    return cudaSuccess;
}

/* cudaDeviceProp offsets of the CUDA 12 (and 10.2) layout. */
static cudaError_t fill_props(void *prop, int dev) {
    if (!prop) return set_err(cudaErrorInvalidValue);
    DEV_OK();
    if (dev < 0 || dev >= g_ndev) return set_err(cudaErrorInvalidDevice);
    char *p = prop;
    memset(p, 0, 1032); /* sizeof(cudaDeviceProp) in CUDA 12.4 is 1008 */
    snprintf(p, 256, "%s %d", EMU_DEVICE_NAME, dev);
    memcpy(p + 288, &g_devmem, sizeof g_devmem); /* totalGlobalMem */
    int warp = 32, threads = 1024, sms = 8;
    int major = EMU_CC_MAJOR, minor = EMU_CC_MINOR;
    memcpy(p + 308, &warp, sizeof warp);       /* warpSize */
    memcpy(p + 320, &threads, sizeof threads); /* maxThreadsPerBlock */
    memcpy(p + 360, &major, sizeof major);     /* major */
    memcpy(p + 364, &minor, sizeof minor);     /* minor */
    memcpy(p + 388, &sms, sizeof sms);         /* multiProcessorCount */
    return cudaSuccess;
}

EMU_EXPORT cudaError_t cudaGetDeviceProperties(void *prop, int dev) {
    ENTER("cudaGetDeviceProperties");
    return fill_props(prop, dev);
}

#if !defined(EMU_COREX) && !defined(EMU_NO_PROPS_V2) /* the _v2 entry point appeared with CUDA 12.0 */
EMU_EXPORT cudaError_t cudaGetDeviceProperties_v2(void *prop, int dev) {
    ENTER("cudaGetDeviceProperties_v2");
    return fill_props(prop, dev);
}
#endif

/* ------------------------------------------------------------------ memory */
EMU_EXPORT cudaError_t cudaMalloc(void **ptr, size_t n) {
    ENTER("cudaMalloc");
    if (!ptr) return set_err(cudaErrorInvalidValue);
    DEV_OK();
    *ptr = NULL;
    if (n == 0) return cudaSuccess;
    size_t rounded = (n + DEV_ALIGN - 1) & ~(size_t)(DEV_ALIGN - 1);
    if (rounded < n) return set_err(cudaErrorMemoryAllocation);
    pthread_mutex_lock(&g_mu);
    int d = t_dev;
    cudaError_t rc = cudaSuccess;
    void *p = NULL;
    if (rounded > g_devmem - g_used[d] || posix_memalign(&p, DEV_ALIGN, rounded) != 0)
        rc = cudaErrorMemoryAllocation;
    else if (alloc_insert((uintptr_t)p, n, d, MEM_DEVICE) != 0) {
        free(p);
        rc = cudaErrorMemoryAllocation;
    } else {
        g_used[d] += rounded;
        *ptr = p;
    }
    pthread_mutex_unlock(&g_mu);
    return set_err(rc);
}

static cudaError_t free_typed(void *p, int type) {
    if (!p) return cudaSuccess;
    pthread_mutex_lock(&g_mu);
    long i = alloc_find((uintptr_t)p);
    if (i < 0 || g_allocs[i].base != (uintptr_t)p || g_allocs[i].type != type) {
        pthread_mutex_unlock(&g_mu);
        return set_err(cudaErrorInvalidValue);
    }
    sync_all(-1);                 /* no queued copy may touch freed memory */
    i = alloc_find((uintptr_t)p); /* the table may have changed while waiting */
    if (i < 0 || g_allocs[i].base != (uintptr_t)p) {
        pthread_mutex_unlock(&g_mu);
        return set_err(cudaErrorInvalidValue);
    }
    if (type == MEM_DEVICE)
        g_used[g_allocs[i].dev] -= (g_allocs[i].size + DEV_ALIGN - 1) & ~(size_t)(DEV_ALIGN - 1);
    alloc_remove((size_t)i);
    pthread_mutex_unlock(&g_mu);
    free(p);
    return cudaSuccess;
}

EMU_EXPORT cudaError_t cudaFree(void *p) {
    ENTER("cudaFree");
    DEV_OK();
    return free_typed(p, MEM_DEVICE);
}

static cudaError_t host_alloc(void **ptr, size_t n) {
    if (!ptr) return set_err(cudaErrorInvalidValue);
    DEV_OK();
    *ptr = NULL;
    if (n == 0) return cudaSuccess;
    void *p = NULL;
    if (posix_memalign(&p, 4096, n) != 0) return set_err(cudaErrorMemoryAllocation);
    pthread_mutex_lock(&g_mu);
    int rc = alloc_insert((uintptr_t)p, n, t_dev, MEM_HOST);
    pthread_mutex_unlock(&g_mu);
    if (rc) {
        free(p);
        return set_err(cudaErrorMemoryAllocation);
    }
    *ptr = p;
    return cudaSuccess;
}

EMU_EXPORT cudaError_t cudaMallocHost(void **ptr, size_t n) {
    ENTER("cudaMallocHost");
    return host_alloc(ptr, n);
}

EMU_EXPORT cudaError_t cudaHostAlloc(void **ptr, size_t n, unsigned flags) {
    ENTER("cudaHostAlloc");
    if (flags & ~0xfu) return set_err(cudaErrorInvalidValue);
    return host_alloc(ptr, n);
}

EMU_EXPORT cudaError_t cudaFreeHost(void *p) {
    ENTER("cudaFreeHost");
    DEV_OK();
    return free_typed(p, MEM_HOST);
}

struct cudaPointerAttributes { /* CUDA >= 11 layout */
    int type;
    int device;
    void *devicePointer;
    void *hostPointer;
};

EMU_EXPORT cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes *a, const void *p) {
    ENTER("cudaPointerGetAttributes");
    if (!a || !p) return set_err(cudaErrorInvalidValue);
    DEV_OK();
    pthread_mutex_lock(&g_mu);
    long i = alloc_find((uintptr_t)p);
    if (i < 0) {
        *a = (struct cudaPointerAttributes){0, -2, NULL, NULL}; /* unregistered */
    } else {
        a->type = g_allocs[i].type;
        a->device = g_allocs[i].dev;
        a->devicePointer = (void *)p;
        a->hostPointer = g_allocs[i].type == MEM_HOST ? (void *)p : NULL;
    }
    pthread_mutex_unlock(&g_mu);
    return cudaSuccess;
}

/* ------------------------------------------------------------------- copies */
/* Validate a copy against the allocation table.  Caller holds g_mu. */
static cudaError_t check_copy(void *dst, const void *src, size_t n, int kind) {
    if (kind < 0 || kind > 4) return cudaErrorInvalidMemcpyDirection;
    if (n == 0) return cudaSuccess;
    if (!dst || !src) return cudaErrorInvalidValue;
    int td = range_type(dst, n, NULL), ts = range_type(src, n, NULL);
    if (td < 0 || ts < 0) return cudaErrorInvalidValue;
    int dd = td == MEM_DEVICE, sd = ts == MEM_DEVICE;
    static const int want[4][2] = {{0, 0}, {1, 0}, {0, 1}, {1, 1}}; /* {dst, src} on device */
    if (kind != 4 && (want[kind][0] != dd || want[kind][1] != sd)) return cudaErrorInvalidValue;
    return cudaSuccess;
}

/* Enqueue a copy/memset op; with sync, wait for it on the legacy stream. */
static cudaError_t submit(int type, void *dst, const void *src, size_t n, int val, int kind, void *stream,
                          int sync) {
    DEV_OK();
    pthread_mutex_lock(&g_mu);
    cudaError_t rc;
    if (type == OP_COPY)
        rc = check_copy(dst, src, n, kind);
    else {
        int t = n ? range_type(dst, n, NULL) : MEM_DEVICE;
        rc = t == MEM_DEVICE || t == MEM_HOST ? cudaSuccess : cudaErrorInvalidValue;
    }
    stream_t *s = NULL;
    if (rc == cudaSuccess) rc = get_stream(stream, &s);
    if (rc == cudaSuccess && n > 0) {
        op_t *op = calloc(1, sizeof *op);
        if (!op)
            rc = cudaErrorMemoryAllocation;
        else {
            op->type = type;
            op->dst = dst;
            op->src = src;
            op->n = n;
            op->val = val;
            enqueue(s, op);
            if (sync) wait_seq(s, s->submitted);
        }
    } else if (rc == cudaSuccess && sync) {
        wait_seq(s, s->submitted);
    }
    pthread_mutex_unlock(&g_mu);
    return set_err(rc);
}

EMU_EXPORT cudaError_t cudaMemcpy(void *dst, const void *src, size_t n, int kind) {
    ENTER("cudaMemcpy");
    return submit(OP_COPY, dst, src, n, 0, kind, NULL, 1);
}

EMU_EXPORT cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, int kind, void *stream) {
    ENTER("cudaMemcpyAsync");
    return submit(OP_COPY, dst, src, n, 0, kind, stream, 0);
}

EMU_EXPORT cudaError_t cudaMemset(void *dst, int value, size_t n) {
    ENTER("cudaMemset");
    return submit(OP_SET, dst, NULL, n, value, 0, NULL, 1);
}

EMU_EXPORT cudaError_t cudaMemsetAsync(void *dst, int value, size_t n, void *stream) {
    ENTER("cudaMemsetAsync");
    return submit(OP_SET, dst, NULL, n, value, 0, stream, 0);
}

/* ------------------------------------------------------------------ streams */
EMU_EXPORT cudaError_t cudaStreamCreateWithFlags(void **out, unsigned flags) {
    ENTER("cudaStreamCreateWithFlags");
    if (!out || (flags & ~cudaStreamNonBlocking)) return set_err(cudaErrorInvalidValue);
    DEV_OK();
    pthread_mutex_lock(&g_mu);
    stream_t *s = NULL;
    cudaError_t rc = stream_new(t_dev, flags, 0, &s);
    pthread_mutex_unlock(&g_mu);
    if (rc == cudaSuccess) *out = s;
    return set_err(rc);
}

EMU_EXPORT cudaError_t cudaStreamCreate(void **out) {
    ENTER("cudaStreamCreate");
    if (!out) return set_err(cudaErrorInvalidValue);
    DEV_OK();
    pthread_mutex_lock(&g_mu);
    stream_t *s = NULL;
    cudaError_t rc = stream_new(t_dev, 0, 0, &s);
    pthread_mutex_unlock(&g_mu);
    if (rc == cudaSuccess) *out = s;
    return set_err(rc);
}

EMU_EXPORT cudaError_t cudaStreamDestroy(void *h) {
    ENTER("cudaStreamDestroy");
    DEV_OK();
    pthread_mutex_lock(&g_mu);
    stream_t *s = NULL;
    cudaError_t rc =
        h && h != (void *)1 && h != (void *)2 ? get_stream(h, &s) : cudaErrorInvalidResourceHandle;
    if (rc) {
        pthread_mutex_unlock(&g_mu);
        return set_err(rc);
    }
    for (stream_t **pp = &g_streams; *pp; pp = &(*pp)->next)
        if (*pp == s) {
            *pp = s->next;
            break;
        }
    s->magic = 0;
    s->dying = 1; /* the worker drains the queue, then exits */
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&g_mu);
    pthread_join(s->thr, NULL);
    pthread_mutex_lock(&g_mu);
    stream_put(s);
    pthread_mutex_unlock(&g_mu);
    return cudaSuccess;
}

EMU_EXPORT cudaError_t cudaStreamSynchronize(void *h) {
    ENTER("cudaStreamSynchronize");
    DEV_OK();
    pthread_mutex_lock(&g_mu);
    stream_t *s = NULL;
    cudaError_t rc = get_stream(h, &s);
    if (rc == cudaSuccess) wait_seq(s, s->submitted);
    pthread_mutex_unlock(&g_mu);
    return set_err(rc);
}

EMU_EXPORT cudaError_t cudaStreamQuery(void *h) {
    ENTER("cudaStreamQuery");
    DEV_OK();
    pthread_mutex_lock(&g_mu);
    stream_t *s = NULL;
    cudaError_t rc = get_stream(h, &s);
    if (rc == cudaSuccess && s->completed < s->submitted) rc = cudaErrorNotReady;
    pthread_mutex_unlock(&g_mu);
    return set_err(rc);
}

EMU_EXPORT cudaError_t cudaStreamWaitEvent(void *h, void *ev, unsigned flags) {
    ENTER("cudaStreamWaitEvent");
#ifdef EMU_COREX
    (void)h, (void)ev, (void)flags;
    return set_err(cudaErrorNotSupported); /* unimplemented in (some) CoreX SDKs */
#else
    DEV_OK();
    if (flags & ~1u) return set_err(cudaErrorInvalidValue);
    pthread_mutex_lock(&g_mu);
    stream_t *s = NULL;
    event_t *e = NULL;
    cudaError_t rc = get_stream(h, &s);
    if (rc == cudaSuccess) rc = get_event(ev, &e);
    if (rc == cudaSuccess && e->s && e->s->completed < e->seq) {
        op_t *op = calloc(1, sizeof *op);
        if (!op)
            rc = cudaErrorMemoryAllocation;
        else {
            op->type = OP_WAIT;
            op->ws = e->s;
            op->wseq = e->seq;
            e->s->refs++;
            enqueue(s, op);
        }
    }
    pthread_mutex_unlock(&g_mu);
    return set_err(rc);
#endif
}

static cudaError_t launch_host(void *h, void (*fn)(void *), void *arg) {
    if (!fn) return cudaErrorInvalidValue;
    cudaError_t rc = dev_ok();
    if (rc) return rc;
    pthread_mutex_lock(&g_mu);
    stream_t *s = NULL;
    rc = get_stream(h, &s);
    if (rc == cudaSuccess) {
        op_t *op = calloc(1, sizeof *op);
        if (!op)
            rc = cudaErrorMemoryAllocation;
        else {
            op->type = OP_HOST;
            op->fn = fn;
            op->arg = arg;
            enqueue(s, op);
        }
    }
    pthread_mutex_unlock(&g_mu);
    return rc;
}

EMU_EXPORT cudaError_t cudaLaunchHostFunc(void *h, void (*fn)(void *), void *arg) {
    ENTER("cudaLaunchHostFunc");
    return set_err(launch_host(h, fn, arg));
}

/* Private: libnccl enqueues its work without touching the public counters. */
EMU_EXPORT int uniccl_emu__launch(void *h, void (*fn)(void *), void *arg) {
    return launch_host(h, fn, arg);
}

/* ------------------------------------------------------------------- events */
/* Both creators: each counts and fails under its own name (ENTER), then shares this. */
static cudaError_t event_create(void **out, unsigned flags) {
    if (!out || (flags & ~0xfu)) return set_err(cudaErrorInvalidValue);
    DEV_OK();
    event_t *e = calloc(1, sizeof *e);
    if (!e) return set_err(cudaErrorMemoryAllocation);
    e->magic = EVENT_MAGIC;
    e->flags = flags;
    e->refs = 1;
    pthread_mutex_lock(&g_mu);
    e->next = g_events;
    g_events = e;
    pthread_mutex_unlock(&g_mu);
    *out = e;
    return cudaSuccess;
}

EMU_EXPORT cudaError_t cudaEventCreateWithFlags(void **out, unsigned flags) {
    ENTER("cudaEventCreateWithFlags");
    return event_create(out, flags);
}

EMU_EXPORT cudaError_t cudaEventCreate(void **out) {
    ENTER("cudaEventCreate");
    return event_create(out, 0);
}

EMU_EXPORT cudaError_t cudaEventDestroy(void *h) {
    ENTER("cudaEventDestroy");
    DEV_OK();
    pthread_mutex_lock(&g_mu);
    event_t *e = NULL;
    cudaError_t rc = get_event(h, &e);
    if (rc == cudaSuccess) {
        for (event_t **pp = &g_events; *pp; pp = &(*pp)->next)
            if (*pp == e) {
                *pp = e->next;
                break;
            }
        e->magic = 0;
        event_put(e); /* a pending record keeps it alive until reached */
    }
    pthread_mutex_unlock(&g_mu);
    return set_err(rc);
}

EMU_EXPORT cudaError_t cudaEventRecord(void *h, void *stream) {
    ENTER("cudaEventRecord");
    DEV_OK();
    pthread_mutex_lock(&g_mu);
    event_t *e = NULL;
    stream_t *s = NULL;
    cudaError_t rc = get_event(h, &e);
    if (rc == cudaSuccess) rc = get_stream(stream, &s);
    op_t *op = rc == cudaSuccess ? calloc(1, sizeof *op) : NULL;
    if (rc == cudaSuccess && !op) rc = cudaErrorMemoryAllocation;
    if (rc == cudaSuccess) {
        if (e->s != s) {
            s->refs++;
            if (e->s) stream_put(e->s);
            e->s = s;
        }
        e->gen++;
        e->t_valid = 0;
        op->type = OP_RECORD;
        op->ev = e;
        op->gen = e->gen;
        e->refs++;
        enqueue(s, op);
        e->seq = op->seq;
    }
    pthread_mutex_unlock(&g_mu);
    return set_err(rc);
}

EMU_EXPORT cudaError_t cudaEventQuery(void *h) {
    ENTER("cudaEventQuery");
    DEV_OK();
    pthread_mutex_lock(&g_mu);
    event_t *e = NULL;
    cudaError_t rc = get_event(h, &e);
    if (rc == cudaSuccess && e->s && e->s->completed < e->seq) rc = cudaErrorNotReady;
    pthread_mutex_unlock(&g_mu);
    return set_err(rc);
}

EMU_EXPORT cudaError_t cudaEventSynchronize(void *h) {
    ENTER("cudaEventSynchronize");
    DEV_OK();
    pthread_mutex_lock(&g_mu);
    event_t *e = NULL;
    cudaError_t rc = get_event(h, &e);
    if (rc == cudaSuccess && e->s) wait_seq(e->s, e->seq);
    pthread_mutex_unlock(&g_mu);
    return set_err(rc);
}

EMU_EXPORT cudaError_t cudaEventElapsedTime(float *ms, void *start, void *end) {
    ENTER("cudaEventElapsedTime");
    if (!ms) return set_err(cudaErrorInvalidValue);
    DEV_OK();
    pthread_mutex_lock(&g_mu);
    event_t *a = NULL, *b = NULL;
    cudaError_t rc = get_event(start, &a);
    if (rc == cudaSuccess) rc = get_event(end, &b);
    if (rc == cudaSuccess && ((a->flags | b->flags) & cudaEventDisableTiming || !a->s || !b->s))
        rc = cudaErrorInvalidResourceHandle;
    else if (rc == cudaSuccess &&
             (a->s->completed < a->seq || b->s->completed < b->seq || !a->t_valid || !b->t_valid))
        rc = cudaErrorNotReady;
    else if (rc == cudaSuccess)
        *ms = (float)((b->t - a->t) * 1e3);
    pthread_mutex_unlock(&g_mu);
    return set_err(rc);
}

/* ------------------------------------------------------------------- setup */
static size_t parse_size(const char *s, size_t dflt) {
    if (!s || !*s) return dflt;
    char *end;
    unsigned long long v = strtoull(s, &end, 0);
    switch (*end) {
    case 'k':
    case 'K': v <<= 10; break;
    case 'm':
    case 'M': v <<= 20; break;
    case 'g':
    case 'G': v <<= 30; break;
    default: break;
    }
    return (size_t)v;
}

/* A forked child has no stream threads: forget the streams (CUDA forbids
 * using a context across fork; this only keeps the child from deadlocking). */
static void fork_prepare(void) {
    pthread_mutex_lock(&g_inj_mu);
    pthread_mutex_lock(&g_mu);
}

static void fork_parent(void) {
    pthread_mutex_unlock(&g_mu);
    pthread_mutex_unlock(&g_inj_mu);
}

static void fork_child(void) {
    g_streams = NULL;
    memset(g_legacy, 0, sizeof g_legacy);
    for (event_t *e = g_events; e; e = e->next)
        e->s = NULL;
    pthread_cond_init(&g_done, NULL); /* no waiter survives fork */
    pthread_mutex_unlock(&g_mu);
    pthread_mutex_unlock(&g_inj_mu);
}

__attribute__((constructor)) static void emu_init(void) {
    const char *v = getenv("UNICCL_EMU_DEVICES");
    if (v && *v) {
        long n = strtol(v, NULL, 0);
        g_ndev = n < 0 ? 0 : n > MAX_DEV ? MAX_DEV : (int)n;
    }
    g_devmem = parse_size(getenv("UNICCL_EMU_DEVICE_MEMORY"), g_devmem);
    v = getenv("UNICCL_EMU_DRIVER_VERSION");
    if (v && *v) g_driver = (int)strtol(v, NULL, 0);
#ifdef EMU_RT_PREFIX
    vendor_error_names();
#endif
    v = getenv("UNICCL_EMU_FAIL");
    if (v && *v) parse_fail_env(v);
    pthread_atfork(fork_prepare, fork_parent, fork_child);
}
