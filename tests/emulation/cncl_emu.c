/* Emulated Cambricon CNCL 1.x (libcncl ABI) for ranks that are processes on one host.
 *
 * A translation layer over nccl_emu.c, compiled into the same library with its
 * nccl* symbols renamed to inner_nccl* and hidden (exports cncl* and uniccl_emu_*);
 * libcncl is linked against the emulated libcnrt, whose queues carry the work.
 * CNCL's own parts: cnclResult_t values (CNCL_RET_SUCCESS 0, ERR_ARGUMENTS 0x07,
 * ERR_UNSUPPORTED 0x11, ERR_SYS_SOCKET 0x22 for a dead or departed peer …),
 * cnclDataType_t (Half 0x10, Bfloat16 0x11, Float32 0x12, Int8 0x20, Int16 0x21,
 * Int32 0x22, Int64 0x23, Uint8..Uint64 0x30..0x33; no float64), cnclReduceOp_t
 * (Sum, Prod, Max, Min; no Avg), a 136-byte cnclCliqueId (data[128], then a hash,
 * checked), cnclInitComms(comms, num_comm, dev_list, rank_list, nrank, clique_id),
 * cnclFreeComm/cnclAbortComm, cnclBcast and cnclBroadcast.  Values follow the public
 * cncl.h of CNCL 1.25; nothing here ran against Cambricon hardware.
 * Emulation limit: one communicator per cnclInitComms call (num_comm 1: one MLU per
 * process, how uniccl uses it); more give CNCL_RET_ERR_UNSUPPORTED. */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "emu.h"

typedef int cnclResult_t;
enum {
    CNCL_RET_SUCCESS = 0x00,
    CNCL_RET_ERR_INTERNAL = 0x01,
    CNCL_RET_ERR_SYSTEM = 0x02,
    CNCL_RET_ERR_MLU_RUNTIME = 0x03,
    CNCL_RET_ASYNC_IN_PROGRESS = 0x06,
    CNCL_RET_ERR_ARGUMENTS = 0x07,
    CNCL_RET_ERR_UNSUPPORTED = 0x11,
    CNCL_RET_ERR_NULL_POINTER = 0x21,
    CNCL_RET_ERR_SYS_SOCKET = 0x22,
    CNCL_RET_ERR_NOT_INIT = 0x61,
};

typedef struct {
    char data[128];
    uint64_t hash;
} cnclCliqueId;
_Static_assert(sizeof(cnclCliqueId) == 136, "cnclCliqueId is 136 bytes");

typedef struct {
    char internal[128];
} inner_id;

int uniccl_emu__enter(const char *call);
int inner_ncclGetUniqueId(inner_id *);
int inner_ncclCommInitRank(void **, int, inner_id, int);
int inner_ncclCommDestroy(void *);
int inner_ncclCommAbort(void *);
int inner_ncclCommGetAsyncError(void *, int *);
int inner_ncclCommCount(void *, int *);
int inner_ncclCommUserRank(void *, int *);
int inner_ncclCommCuDevice(void *, int *);
int inner_ncclAllReduce(const void *, void *, size_t, int, int, void *, void *);
int inner_ncclBroadcast(const void *, void *, size_t, int, int, void *, void *);
int inner_ncclReduce(const void *, void *, size_t, int, int, int, void *, void *);
int inner_ncclAllGather(const void *, void *, size_t, int, void *, void *);
int inner_ncclReduceScatter(const void *, void *, size_t, int, int, void *, void *);
int inner_ncclSend(const void *, size_t, int, int, void *, void *);
int inner_ncclRecv(void *, size_t, int, int, void *, void *);
int inner_ncclGroupStart(void);
int inner_ncclGroupEnd(void);
/* libcnrt (this library is linked against it) */
int cnrtSetDevice(int);

static cnclResult_t from_nccl(int st) {
    switch (st) {
    case 0: return CNCL_RET_SUCCESS;
    case 1: return CNCL_RET_ERR_MLU_RUNTIME; /* ncclUnhandledCudaError */
    case 2: return CNCL_RET_ERR_SYSTEM;
    case 3: return CNCL_RET_ERR_INTERNAL;
    case 4: return CNCL_RET_ERR_ARGUMENTS;   /* ncclInvalidArgument */
    case 5: return CNCL_RET_ERR_UNSUPPORTED; /* ncclInvalidUsage: mismatched calls, wrong state */
    case 6: return CNCL_RET_ERR_SYS_SOCKET;  /* ncclRemoteError: a peer died or left */
    case 7: return CNCL_RET_ASYNC_IN_PROGRESS;
    default: return CNCL_RET_ERR_INTERNAL;
    }
}

/* cnclDataType_t -> the inner emulation's type code (NCCL's, plus 10/11 int16/uint16), or -1 */
static int dtype_of(int dt) {
    switch (dt) {
    case 0x10: return 6;  /* Half */
    case 0x11: return 9;  /* Bfloat16 */
    case 0x12: return 7;  /* Float32 */
    case 0x20: return 0;  /* Int8 */
    case 0x21: return 10; /* Int16 */
    case 0x22: return 2;  /* Int32 */
    case 0x23: return 4;  /* Int64 */
    case 0x30: return 1;  /* Uint8 */
    case 0x31: return 11; /* Uint16 */
    case 0x32: return 3;  /* Uint32 */
    case 0x33: return 5;  /* Uint64 */
    default: return -1;
    }
}

#define ENTER(name)                                                                                          \
    do {                                                                                                     \
        int inj_ = uniccl_emu__enter(name);                                                                  \
        if (inj_) return inj_;                                                                               \
    } while (0)
#define DTYPE(dt, out)                                                                                       \
    int out = dtype_of(dt);                                                                                  \
    if (out < 0) return CNCL_RET_ERR_ARGUMENTS
#define OP(op)                                                                                               \
    if ((op) < 0 || (op) > 3) return CNCL_RET_ERR_ARGUMENTS

static const struct {
    cnclResult_t code;
    const char *name;
} k_results[] = {
    {CNCL_RET_SUCCESS, "CNCL_RET_SUCCESS"},
    {CNCL_RET_ERR_INTERNAL, "CNCL_RET_ERR_INTERNAL"},
    {CNCL_RET_ERR_SYSTEM, "CNCL_RET_ERR_SYSTEM"},
    {CNCL_RET_ERR_MLU_RUNTIME, "CNCL_RET_ERR_MLU_RUNTIME"},
    {CNCL_RET_ASYNC_IN_PROGRESS, "CNCL_RET_ASYNC_IN_PROGRESS"},
    {CNCL_RET_ERR_ARGUMENTS, "CNCL_RET_ERR_ARGUMENTS"},
    {CNCL_RET_ERR_UNSUPPORTED, "CNCL_RET_ERR_UNSUPPORTED"},
    {CNCL_RET_ERR_NULL_POINTER, "CNCL_RET_ERR_NULL_POINTER"},
    {CNCL_RET_ERR_SYS_SOCKET, "CNCL_RET_ERR_SYS_SOCKET"},
    {CNCL_RET_ERR_NOT_INIT, "CNCL_RET_ERR_NOT_INIT"},
};

EMU_EXPORT const char *cnclGetErrorStr(cnclResult_t r) {
    for (size_t i = 0; i < sizeof k_results / sizeof k_results[0]; i++)
        if (k_results[i].code == r) return k_results[i].name;
    return "CNCL_RET_ERR_UNKNOWN";
}

EMU_EXPORT cnclResult_t cnclGetLibVersion(int *maj, int *min, int *patch) {
    ENTER("cnclGetLibVersion");
    if (!maj || !min || !patch) return CNCL_RET_ERR_NULL_POINTER;
    *maj = 1, *min = 25, *patch = 0;
    return CNCL_RET_SUCCESS;
}

static uint64_t fnv1a(const char *p, size_t n) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ (unsigned char)p[i]) * 1099511628211ull;
    return h;
}

EMU_EXPORT cnclResult_t cnclGetCliqueId(cnclCliqueId *id) {
    ENTER("cnclGetCliqueId");
    if (!id) return CNCL_RET_ERR_NULL_POINTER;
    inner_id u;
    int st = inner_ncclGetUniqueId(&u);
    if (st) return from_nccl(st);
    memcpy(id->data, u.internal, sizeof id->data);
    id->hash = fnv1a(id->data, sizeof id->data);
    return CNCL_RET_SUCCESS;
}

EMU_EXPORT cnclResult_t cnclInitComms(void **comms, int num_comm, const int *dev_list, const int *rank_list,
                                      int nrank, const cnclCliqueId *id) {
    ENTER("cnclInitComms");
    if (!comms || !dev_list || !rank_list) return CNCL_RET_ERR_NULL_POINTER;
    if (num_comm != 1 || !id)
        return CNCL_RET_ERR_UNSUPPORTED; /* emulation: one MLU per process, ids from cnclGetCliqueId */
    if (id->hash != fnv1a(id->data, sizeof id->data) || nrank < 1 || rank_list[0] < 0 ||
        rank_list[0] >= nrank)
        return CNCL_RET_ERR_ARGUMENTS;
    if (cnrtSetDevice(dev_list[0]) != 0) return CNCL_RET_ERR_MLU_RUNTIME;
    inner_id u;
    memcpy(u.internal, id->data, sizeof u.internal);
    return from_nccl(inner_ncclCommInitRank(&comms[0], nrank, u, rank_list[0]));
}

EMU_EXPORT cnclResult_t cnclFreeComm(void *comm) {
    ENTER("cnclFreeComm");
    return from_nccl(inner_ncclCommDestroy(comm));
}

EMU_EXPORT cnclResult_t cnclDestroyComms(void **comms, int num) {
    ENTER("cnclDestroyComms");
    if (!comms) return CNCL_RET_ERR_NULL_POINTER;
    for (int i = 0; i < num; i++) {
        int st = inner_ncclCommDestroy(comms[i]);
        if (st) return from_nccl(st);
    }
    return CNCL_RET_SUCCESS;
}

EMU_EXPORT cnclResult_t cnclAbortComm(void *comm) {
    ENTER("cnclAbortComm");
    return from_nccl(inner_ncclCommAbort(comm));
}

/* the communicator's asynchronous error, as its return value */
EMU_EXPORT cnclResult_t cnclGetCommAsyncError(void *comm) {
    ENTER("cnclGetCommAsyncError");
    int res = 0, st = inner_ncclCommGetAsyncError(comm, &res);
    return from_nccl(st ? st : res);
}

EMU_EXPORT cnclResult_t cnclGetCommCount(int *count, void *comm) {
    ENTER("cnclGetCommCount");
    return from_nccl(inner_ncclCommCount(comm, count));
}

EMU_EXPORT cnclResult_t cnclGetCommRank(int *rank, void *comm) {
    ENTER("cnclGetCommRank");
    return from_nccl(inner_ncclCommUserRank(comm, rank));
}

EMU_EXPORT cnclResult_t cnclGetCommDevice(int *dev, void *comm) {
    ENTER("cnclGetCommDevice");
    return from_nccl(inner_ncclCommCuDevice(comm, dev));
}

EMU_EXPORT cnclResult_t cnclAllReduce(const void *send, void *recv, size_t count, int dt, int op, void *comm,
                                      void *q) {
    ENTER("cnclAllReduce");
    DTYPE(dt, t);
    OP(op);
    return from_nccl(inner_ncclAllReduce(send, recv, count, t, op, comm, q));
}

EMU_EXPORT cnclResult_t cnclBroadcast(const void *send, void *recv, size_t count, int dt, int root,
                                      void *comm, void *q) {
    ENTER("cnclBroadcast");
    DTYPE(dt, t);
    return from_nccl(inner_ncclBroadcast(send, recv, count, t, root, comm, q));
}

EMU_EXPORT cnclResult_t cnclBcast(void *buf, size_t count, int dt, int root, void *comm, void *q) {
    ENTER("cnclBcast");
    DTYPE(dt, t);
    return from_nccl(inner_ncclBroadcast(buf, buf, count, t, root, comm, q));
}

EMU_EXPORT cnclResult_t cnclReduce(const void *send, void *recv, size_t count, int dt, int op, int root,
                                   void *comm, void *q) {
    ENTER("cnclReduce");
    DTYPE(dt, t);
    OP(op);
    return from_nccl(inner_ncclReduce(send, recv, count, t, op, root, comm, q));
}

EMU_EXPORT cnclResult_t cnclAllGather(const void *send, void *recv, size_t count, int dt, void *comm,
                                      void *q) {
    ENTER("cnclAllGather");
    DTYPE(dt, t);
    return from_nccl(inner_ncclAllGather(send, recv, count, t, comm, q));
}

EMU_EXPORT cnclResult_t cnclReduceScatter(const void *send, void *recv, size_t recvcount, int dt, int op,
                                          void *comm, void *q) {
    ENTER("cnclReduceScatter");
    DTYPE(dt, t);
    OP(op);
    return from_nccl(inner_ncclReduceScatter(send, recv, recvcount, t, op, comm, q));
}

EMU_EXPORT cnclResult_t cnclSend(void *buf, size_t count, int dt, int peer, void *comm, void *q) {
    ENTER("cnclSend");
    DTYPE(dt, t);
    return from_nccl(inner_ncclSend(buf, count, t, peer, comm, q));
}

EMU_EXPORT cnclResult_t cnclRecv(void *buf, size_t count, int dt, int peer, void *comm, void *q) {
    ENTER("cnclRecv");
    DTYPE(dt, t);
    return from_nccl(inner_ncclRecv(buf, count, t, peer, comm, q));
}

EMU_EXPORT cnclResult_t cnclGroupStart(void) {
    ENTER("cnclGroupStart");
    return from_nccl(inner_ncclGroupStart());
}

EMU_EXPORT cnclResult_t cnclGroupEnd(void) {
    ENTER("cnclGroupEnd");
    return from_nccl(inner_ncclGroupEnd());
}
