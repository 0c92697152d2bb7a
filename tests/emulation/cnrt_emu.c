/* Emulated Cambricon CNRT 6.x (libcnrt ABI) over host memory, for the cambricon
 * plugin's tests.
 *
 * It is a translation layer over cudart_emu.c, which is compiled into the same
 * library with its cuda* symbols renamed to inner_cuda* and hidden (the library
 * exports cnrt* and uniccl_emu_* only): queues are the emulated streams, notifiers
 * its events, MLU memory its device memory.  What differs from CUDA is CNRT's own:
 * the names, cnrtRet_t values (cnrtErrorBusy 632014 for "not ready",
 * cnrtErrorArgsInvalid 100006 …), cnrtGetDeviceCount(unsigned *), copies taking
 * (dst, src, bytes, queue, dir) with cnrtMemTransDir_t (HostToDev 0, DevToDev 1,
 * DevToHost 2, HostToHost 3, PeerToPeer 4, NoDirection 5), notifier-first
 * argument order (cnrtPlaceNotifier(n, q), cnrtQueueWaitNotifier(n, q, flag)),
 * cnrtPointerAttributes_t, versions as (major, minor, patch).  Values follow the
 * public cnrt.h of CNRT 6.x; nothing here ran against Cambricon hardware.
 *
 * Every cnrt* entry counts and takes injected failures under its own name
 * (uniccl_emu_fail("cnrtMemcpyAsync_V2", 632006, …)); an injected status is a
 * cnrtRet_t and is returned as it is.  Exports cnrtMemcpyAsync and _V2 but not
 * _V3 (the binding's fallback), cnrtGetDeviceProperties_V2 (name only). */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "emu.h"

typedef int cnrtRet_t;
enum {
    cnrtSuccess = 0,
    cnrtErrorNotReady = 1,
    cnrtErrorInit = 100002,
    cnrtErrorNoDevice = 100004,
    cnrtErrorDeviceInvalid = 100005,
    cnrtErrorArgsInvalid = 100006,
    cnrtErrorSys = 100007,
    cnrtErrorSysNoMem = 100010,
    cnrtErrorInvalidResourceHandle = 100014,
    cnrtErrorNotSupport = 100050,
    cnrtErrorNoMem = 100100,
    cnrtErrorDevice = 632006,
    cnrtErrorMemcpyDirectionInvalid = 632013,
    cnrtErrorBusy = 632014,
    cnrtErrorCndrvFuncCall = 632015,
    cnrtErrorUnknown = 999991,
};

/* the renamed CUDA emulation (cudart_emu.c) inside this library */
int uniccl_emu__enter(const char *call);
int inner_cudaGetDeviceCount(int *);
int inner_cudaSetDevice(int);
int inner_cudaGetDevice(int *);
int inner_cudaDeviceSynchronize(void);
int inner_cudaGetLastError(void);
int inner_cudaPeekAtLastError(void);
int inner_cudaMemGetInfo(size_t *, size_t *);
int inner_cudaMalloc(void **, size_t);
int inner_cudaFree(void *);
int inner_cudaMallocHost(void **, size_t);
int inner_cudaFreeHost(void *);
int inner_cudaMemcpy(void *, const void *, size_t, int);
int inner_cudaMemcpyAsync(void *, const void *, size_t, int, void *);
int inner_cudaMemset(void *, int, size_t);
int inner_cudaMemsetAsync(void *, int, size_t, void *);
int inner_cudaStreamCreate(void **);
int inner_cudaStreamDestroy(void *);
int inner_cudaStreamSynchronize(void *);
int inner_cudaStreamQuery(void *);
int inner_cudaStreamWaitEvent(void *, void *, unsigned);
int inner_cudaEventCreate(void **);
int inner_cudaEventDestroy(void *);
int inner_cudaEventRecord(void *, void *);
int inner_cudaEventQuery(void *);
int inner_cudaEventSynchronize(void *);
int inner_cudaEventElapsedTime(float *, void *, void *);
struct inner_attrs {
    int type, device;
    void *devicePointer, *hostPointer;
};
int inner_cudaPointerGetAttributes(struct inner_attrs *, const void *);

/* A CUDA emulation status as the cnrtRet_t CNRT gives for the same condition. */
static cnrtRet_t from_cuda(int st) {
    switch (st) {
    case 0: return cnrtSuccess;
    case 1: return cnrtErrorArgsInvalid;    /* cudaErrorInvalidValue */
    case 2: return cnrtErrorNoMem;          /* cudaErrorMemoryAllocation */
    case 3: return cnrtErrorInit;           /* cudaErrorInitializationError */
    case 35: return cnrtErrorCndrvFuncCall; /* cudaErrorInsufficientDriver */
    case 100: return cnrtErrorNoDevice;
    case 101: return cnrtErrorDeviceInvalid;
    case 400: return cnrtErrorInvalidResourceHandle;
    case 600: return cnrtErrorBusy;   /* cudaErrorNotReady */
    case 700: return cnrtErrorDevice; /* cudaErrorIllegalAddress */
    case 801: return cnrtErrorNotSupport;
    default: return cnrtErrorUnknown;
    }
}

#define CNRT(name, call)                                                                                     \
    do {                                                                                                     \
        int inj_ = uniccl_emu__enter(name);                                                                  \
        if (inj_) return inj_;                                                                               \
        return from_cuda(call);                                                                              \
    } while (0)

static const struct {
    cnrtRet_t code;
    const char *name, *text;
} k_errors[] = {
    {cnrtSuccess, "cnrtSuccess", "success"},
    {cnrtErrorNotReady, "cnrtErrorNotReady", "device or resource busy"},
    {cnrtErrorInit, "cnrtErrorInit", "initialization error"},
    {cnrtErrorNoDevice, "cnrtErrorNoDevice", "no MLU device found"},
    {cnrtErrorDeviceInvalid, "cnrtErrorDeviceInvalid", "invalid device ordinal"},
    {cnrtErrorArgsInvalid, "cnrtErrorArgsInvalid", "invalid argument"},
    {cnrtErrorSys, "cnrtErrorSys", "system error"},
    {cnrtErrorSysNoMem, "cnrtErrorSysNoMem", "out of host memory"},
    {cnrtErrorInvalidResourceHandle, "cnrtErrorInvalidResourceHandle", "invalid resource handle"},
    {cnrtErrorNotSupport, "cnrtErrorNotSupport", "operation not supported"},
    {cnrtErrorNoMem, "cnrtErrorNoMem", "out of MLU memory"},
    {cnrtErrorDevice, "cnrtErrorDevice", "device error"},
    {cnrtErrorMemcpyDirectionInvalid, "cnrtErrorMemcpyDirectionInvalid", "invalid memcpy direction"},
    {cnrtErrorBusy, "cnrtErrorBusy", "work still pending"},
    {cnrtErrorCndrvFuncCall, "cnrtErrorCndrvFuncCall", "driver call failed"},
    {cnrtErrorUnknown, "cnrtErrorUnknown", "unknown error"},
};

EMU_EXPORT const char *cnrtGetErrorName(cnrtRet_t e) {
    for (size_t i = 0; i < sizeof k_errors / sizeof k_errors[0]; i++)
        if (k_errors[i].code == e) return k_errors[i].name;
    return "cnrtErrorUnknown";
}

EMU_EXPORT const char *cnrtGetErrorStr(cnrtRet_t e) {
    for (size_t i = 0; i < sizeof k_errors / sizeof k_errors[0]; i++)
        if (k_errors[i].code == e) return k_errors[i].text;
    return "unknown error";
}

/* -------------------------------------------------------------- devices */
EMU_EXPORT cnrtRet_t cnrtGetDeviceCount(unsigned *count) {
    int inj = uniccl_emu__enter("cnrtGetDeviceCount");
    if (inj) return inj;
    int n = 0, st = inner_cudaGetDeviceCount(&n);
    if (count) *count = st == 0 ? (unsigned)n : 0u;
    return count ? from_cuda(st) : cnrtErrorArgsInvalid;
}

EMU_EXPORT cnrtRet_t cnrtSetDevice(int dev) {
    CNRT("cnrtSetDevice", inner_cudaSetDevice(dev));
}
EMU_EXPORT cnrtRet_t cnrtGetDevice(int *dev) {
    CNRT("cnrtGetDevice", inner_cudaGetDevice(dev));
}
EMU_EXPORT cnrtRet_t cnrtSyncDevice(void) {
    CNRT("cnrtSyncDevice", inner_cudaDeviceSynchronize());
}
EMU_EXPORT cnrtRet_t cnrtGetLastError(void) {
    return from_cuda(inner_cudaGetLastError());
}
EMU_EXPORT cnrtRet_t cnrtPeekAtLastError(void) {
    return from_cuda(inner_cudaPeekAtLastError());
}
EMU_EXPORT cnrtRet_t cnrtMemGetInfo(size_t *free_b, size_t *total) {
    CNRT("cnrtMemGetInfo", inner_cudaMemGetInfo(free_b, total));
}

static void version3(int *maj, int *min, int *patch, int a, int b, int c) {
    *maj = a;
    *min = b;
    *patch = c;
}

EMU_EXPORT cnrtRet_t cnrtGetLibVersion(int *maj, int *min, int *patch) {
    int inj = uniccl_emu__enter("cnrtGetLibVersion");
    if (inj) return inj;
    if (!maj || !min || !patch) return cnrtErrorArgsInvalid;
    version3(maj, min, patch, 6, 14, 1);
    return cnrtSuccess;
}

EMU_EXPORT cnrtRet_t cnrtDriverGetVersion(int *maj, int *min, int *patch) {
    int inj = uniccl_emu__enter("cnrtDriverGetVersion");
    if (inj) return inj;
    if (!maj || !min || !patch) return cnrtErrorArgsInvalid;
    version3(maj, min, patch, 6, 2, 5);
    return cnrtSuccess;
}

/* cnrtDeviceProp_t: name[256] first (all this emulation fills); the caller's buffer must
 * hold the struct of its CNRT version */
EMU_EXPORT cnrtRet_t cnrtGetDeviceProperties_V2(void *prop, int dev) {
    int inj = uniccl_emu__enter("cnrtGetDeviceProperties_V2");
    if (inj) return inj;
    int n = 0;
    if (!prop) return cnrtErrorArgsInvalid;
    int st = inner_cudaGetDeviceCount(&n);
    if (st) return from_cuda(st);
    if (dev < 0 || dev >= n) return cnrtErrorDeviceInvalid;
    snprintf((char *)prop, 256, "Cambricon emulated MLU %d", dev);
    return cnrtSuccess;
}

/* attribute 0x405 (cnrtAttrTotalMemSize, MB) only */
EMU_EXPORT cnrtRet_t cnrtDeviceGetAttribute(int *value, int attr, int dev) {
    int inj = uniccl_emu__enter("cnrtDeviceGetAttribute");
    if (inj) return inj;
    if (!value || attr != 0x405) return cnrtErrorArgsInvalid;
    int cur = 0, st = inner_cudaGetDevice(&cur);
    if (!st) st = inner_cudaSetDevice(dev);
    if (st) return from_cuda(st);
    size_t free_b = 0, total = 0;
    st = inner_cudaMemGetInfo(&free_b, &total);
    inner_cudaSetDevice(cur);
    if (!st) *value = (int)(total >> 20);
    return from_cuda(st);
}

/* --------------------------------------------------------------- memory */
EMU_EXPORT cnrtRet_t cnrtMalloc(void **p, size_t n) {
    CNRT("cnrtMalloc", inner_cudaMalloc(p, n));
}
EMU_EXPORT cnrtRet_t cnrtFree(void *p) {
    CNRT("cnrtFree", inner_cudaFree(p));
}
EMU_EXPORT cnrtRet_t cnrtHostMalloc(void **p, size_t n) {
    CNRT("cnrtHostMalloc", inner_cudaMallocHost(p, n));
}
EMU_EXPORT cnrtRet_t cnrtFreeHost(void *p) {
    CNRT("cnrtFreeHost", inner_cudaFreeHost(p));
}

/* cnrtMemTransDir_t -> cudaMemcpyKind, or -1 */
static int kind_of(int dir) {
    switch (dir) {
    case 0: return 1; /* HostToDev */
    case 1: return 3; /* DevToDev */
    case 2: return 2; /* DevToHost */
    case 3: return 0; /* HostToHost */
    case 4: return 3; /* PeerToPeer: one address space here */
    case 5: return 4; /* NoDirection: inferred from the pointers */
    default: return -1;
    }
}

EMU_EXPORT cnrtRet_t cnrtMemcpy(void *dst, void *src, size_t n, int dir) {
    int inj = uniccl_emu__enter("cnrtMemcpy");
    if (inj) return inj;
    int kind = kind_of(dir);
    return kind < 0 ? cnrtErrorMemcpyDirectionInvalid : from_cuda(inner_cudaMemcpy(dst, src, n, kind));
}

static cnrtRet_t memcpy_async(const char *name, void *dst, void *src, size_t n, void *q, int dir) {
    int inj = uniccl_emu__enter(name);
    if (inj) return inj;
    int kind = kind_of(dir);
    return kind < 0 ? cnrtErrorMemcpyDirectionInvalid
                    : from_cuda(inner_cudaMemcpyAsync(dst, src, n, kind, q));
}

EMU_EXPORT cnrtRet_t cnrtMemcpyAsync(void *dst, void *src, size_t n, void *q, int dir) {
    return memcpy_async("cnrtMemcpyAsync", dst, src, n, q, dir);
}

EMU_EXPORT cnrtRet_t cnrtMemcpyAsync_V2(void *dst, void *src, size_t n, void *q, int dir) {
    return memcpy_async("cnrtMemcpyAsync_V2", dst, src, n, q, dir);
}

EMU_EXPORT cnrtRet_t cnrtMemset(void *p, int v, size_t n) {
    CNRT("cnrtMemset", inner_cudaMemset(p, v, n));
}
EMU_EXPORT cnrtRet_t cnrtMemsetAsync(void *p, int v, size_t n, void *q) {
    CNRT("cnrtMemsetAsync", inner_cudaMemsetAsync(p, v, n, q));
}

/* cnrtPointerAttributes_t (48 bytes): type, device, size, devicePointer, hostPointer,
 * cacheMode, deviceBasePointer; cnrtMemType_t Unregistered 0, Host 1, Device 2 */
struct cnrt_attrs {
    int type, device;
    size_t size;
    void *devicePointer, *hostPointer;
    int cacheMode;
    void *deviceBasePointer;
};
_Static_assert(sizeof(struct cnrt_attrs) == 48, "cnrtPointerAttributes_t is 48 bytes");

EMU_EXPORT cnrtRet_t cnrtPointerGetAttributes(struct cnrt_attrs *a, const void *p) {
    int inj = uniccl_emu__enter("cnrtPointerGetAttributes");
    if (inj) return inj;
    struct inner_attrs in;
    if (!a) return cnrtErrorArgsInvalid;
    int st = inner_cudaPointerGetAttributes(&in, p);
    if (st) return from_cuda(st);
    memset(a, 0, sizeof *a);
    a->type = in.type == 1 ? 1 : in.type == 0 ? 0 : 2; /* host, unregistered, device (managed too) */
    a->device = in.device;
    a->devicePointer = in.devicePointer;
    a->hostPointer = in.hostPointer;
    return cnrtSuccess;
}

/* --------------------------------------------------------------- queues */
EMU_EXPORT cnrtRet_t cnrtQueueCreate(void **q) {
    CNRT("cnrtQueueCreate", inner_cudaStreamCreate(q));
}
EMU_EXPORT cnrtRet_t cnrtQueueDestroy(void *q) {
    CNRT("cnrtQueueDestroy", inner_cudaStreamDestroy(q));
}
EMU_EXPORT cnrtRet_t cnrtQueueSync(void *q) {
    CNRT("cnrtQueueSync", inner_cudaStreamSynchronize(q));
}
EMU_EXPORT cnrtRet_t cnrtQueueQuery(void *q) {
    CNRT("cnrtQueueQuery", inner_cudaStreamQuery(q));
}
EMU_EXPORT cnrtRet_t cnrtQueueWaitNotifier(void *n, void *q, unsigned flag) {
    int inj = uniccl_emu__enter("cnrtQueueWaitNotifier");
    if (inj) return inj;
    return flag ? cnrtErrorArgsInvalid : from_cuda(inner_cudaStreamWaitEvent(q, n, 0));
}

/* ------------------------------------------------------------ notifiers */
EMU_EXPORT cnrtRet_t cnrtNotifierCreate(void **n) {
    CNRT("cnrtNotifierCreate", inner_cudaEventCreate(n));
}
EMU_EXPORT cnrtRet_t cnrtNotifierDestroy(void *n) {
    CNRT("cnrtNotifierDestroy", inner_cudaEventDestroy(n));
}
EMU_EXPORT cnrtRet_t cnrtPlaceNotifier(void *n, void *q) {
    CNRT("cnrtPlaceNotifier", inner_cudaEventRecord(n, q));
}
EMU_EXPORT cnrtRet_t cnrtQueryNotifier(void *n) {
    CNRT("cnrtQueryNotifier", inner_cudaEventQuery(n));
}
EMU_EXPORT cnrtRet_t cnrtWaitNotifier(void *n) {
    CNRT("cnrtWaitNotifier", inner_cudaEventSynchronize(n));
}
EMU_EXPORT cnrtRet_t cnrtNotifierElapsedTime(void *start, void *end, float *ms) {
    CNRT("cnrtNotifierElapsedTime", inner_cudaEventElapsedTime(ms, start, end));
}
EMU_EXPORT cnrtRet_t cnrtNotifierDuration(void *start, void *end, float *us) {
    int inj = uniccl_emu__enter("cnrtNotifierDuration");
    if (inj) return inj;
    float ms = 0;
    int st = inner_cudaEventElapsedTime(&ms, start, end);
    if (!st && us) *us = ms * 1000.0f;
    return from_cuda(st);
}
