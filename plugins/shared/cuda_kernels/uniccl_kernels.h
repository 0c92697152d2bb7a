/* C ABI of the shared CUDA-dialect reduction kernels (reduce.cu).
 *
 * One source serves nvidia (nvcc), iluvatar (CoreX clang -x ivcore), metax
 * (mxcc -x maca) and moore (mcc -x musa); each plugin builds it with
 * cuda_kernels.cmake and calls these three functions, from C or through ctypes.
 * Pointers are device pointers of the calling plugin's runtime; `stream` is that
 * runtime's stream handle (cudaStream_t, mcStream_t, musaStream_t), NULL for the
 * default stream.  Launches are asynchronous on `stream`. */
#ifndef UNICCL_KERNELS_H
#define UNICCL_KERNELS_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define UNICCL_KERNELS_API __attribute__((visibility("default")))
#else
#define UNICCL_KERNELS_API
#endif

/* Codes equal uniccl._types.DType and ReduceOp (the plugin ABI). */
enum {
    UNICCL_KINT8,
    UNICCL_KUINT8,
    UNICCL_KINT32,
    UNICCL_KUINT32,
    UNICCL_KINT64,
    UNICCL_KUINT64,
    UNICCL_KFLOAT16,
    UNICCL_KFLOAT32,
    UNICCL_KFLOAT64,
    UNICCL_KBFLOAT16,
    UNICCL_KINT16,
    UNICCL_KUINT16
};
enum { UNICCL_KSUM, UNICCL_KPROD, UNICCL_KMAX, UNICCL_KMIN }; /* AVG: SUM, then scale */

/* Returned for an unknown dtype or op, or a divisor of 0 or above INT64_MAX;
 * negative so that it never equals a runtime's error code. */
#define UNICCL_KERNELS_EINVAL (-1)

/* dst[i] = op(a[i], b[i]) for i < count.  dst may equal a or b (in place); other
 * overlaps are not supported.  Integers wrap like numpy; float16 and bfloat16 are
 * computed in float32 and rounded to nearest even once; MAX/MIN propagate NaN like
 * np.maximum/np.minimum.  Returns 0, UNICCL_KERNELS_EINVAL, or the launch error
 * (the runtime's cudaGetLastError after the launch). */
UNICCL_KERNELS_API int uniccl_cuda_reduce(void *dst, const void *a, const void *b, size_t count, int dtype,
                                          int op, void *stream);

/* dst[i] = src[i] / divisor (AVG's last step).  Integers truncate toward zero like
 * NCCL's ncclAvg; floats divide in float32 (float64 for float64).  dst may equal
 * src.  Returns like uniccl_cuda_reduce. */
UNICCL_KERNELS_API int uniccl_cuda_scale(void *dst, const void *src, size_t count, int dtype,
                                         unsigned long long divisor, void *stream);

/* Which compiler and architectures this library was built for, one line. */
UNICCL_KERNELS_API const char *uniccl_cuda_kernels_info(void);

#ifdef __cplusplus
}
#endif

#endif
