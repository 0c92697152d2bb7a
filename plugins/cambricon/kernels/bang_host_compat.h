/* Host-compile mode for reduce.mlu: the BANG C it uses, spelled for a plain C++
 * compiler, so the kernel logic runs in CPU-only tests (the conformance suite on the
 * emulated Cambricon platform):
 *
 *   g++ -std=c++17 -x c++ -include bang_host_compat.h -shared -fPIC reduce.mlu -o lib.so
 *
 * A launch runs every task in turn on the calling thread (the queue is ignored; it
 * returns when the work is done), which is faithful for kernels whose tasks share
 * nothing, as reduce.mlu's do.  NRAM is a thread-local array; __memcpy is memcpy;
 * the __bang_* vector functions are loops.  Never used with cncc. */
#ifndef UC_BANG_HOST_COMPAT_H
#define UC_BANG_HOST_COMPAT_H

#define UC_BANG_HOST 1

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define __mlu_global__
#define __mlu_func__ inline
#define __nram__ static thread_local

enum uc_host_dir { GDRAM2NRAM, NRAM2GDRAM };
inline thread_local int taskId, taskDim;

inline void __memcpy(void *dst, const void *src, int bytes, uc_host_dir) {
    memcpy(dst, src, (size_t)bytes);
}
inline void __bang_add(float *dst, const float *a, const float *b, int n) {
    for (int i = 0; i < n; i++)
        dst[i] = a[i] + b[i];
}
inline void __bang_mul(float *dst, const float *a, const float *b, int n) {
    for (int i = 0; i < n; i++)
        dst[i] = a[i] * b[i];
}

struct cnrtDim3_t {
    unsigned x, y, z;
};
enum cnrtFunctionType_t { cnrtFuncTypeBlock = 1 };
typedef void *cnrtQueue_t;

#define UC_BANG_LAUNCH(kernel, dim, ktype, queue, ...)                                                       \
    do {                                                                                                     \
        (void)(ktype), (void)(queue);                                                                        \
        taskDim = (int)((dim).x * (dim).y * (dim).z);                                                        \
        for (taskId = 0; taskId < taskDim; taskId++)                                                         \
            kernel(__VA_ARGS__);                                                                             \
    } while (0)
#define uc_bang_last_error() 0
#define UC_BANG_COMPILER "host emulation (g++ " __VERSION__ ")"

#endif
