/* C ABI of the Cambricon reduction kernels (reduce.mlu, BANG C).
 *
 * Same contract as the CUDA-dialect kernels' uniccl_kernels.h, under the prefix
 * uniccl_bang: pointers are MLU device pointers of CNRT, `queue` a cnrtQueue_t
 * (NULL: the default queue); launches are asynchronous on the queue. */
#ifndef UNICCL_BANG_KERNELS_H
#define UNICCL_BANG_KERNELS_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__) || defined(__clang__)
#define UNICCL_BANG_API __attribute__((visibility("default")))
#else
#define UNICCL_BANG_API
#endif

/* Codes equal uniccl._types.DType and ReduceOp (the plugin ABI). */
enum {
    UNICCL_BINT8,
    UNICCL_BUINT8,
    UNICCL_BINT32,
    UNICCL_BUINT32,
    UNICCL_BINT64,
    UNICCL_BUINT64,
    UNICCL_BFLOAT16_,
    UNICCL_BFLOAT32,
    UNICCL_BFLOAT64,
    UNICCL_BBFLOAT16,
    UNICCL_BINT16,
    UNICCL_BUINT16
};
enum { UNICCL_BSUM, UNICCL_BPROD, UNICCL_BMAX, UNICCL_BMIN };

/* Unknown dtype or op, or a divisor of 0 or above INT64_MAX (never a cnrtRet_t). */
#define UNICCL_BANG_EINVAL (-1)

/* dst[i] = op(a[i], b[i]); dst may equal a or b.  Integers wrap like numpy, float16
 * and bfloat16 compute in float32 and round to nearest even once, MAX/MIN propagate
 * NaN.  Returns 0, UNICCL_BANG_EINVAL or the launch's cnrtRet_t. */
UNICCL_BANG_API int uniccl_bang_reduce(void *dst, const void *a, const void *b, size_t count, int dtype,
                                       int op, void *queue);

/* dst[i] = src[i] / divisor: integers truncate toward zero, floats divide in float32
 * (float64 for float64).  dst may equal src. */
UNICCL_BANG_API int uniccl_bang_scale(void *dst, const void *src, size_t count, int dtype,
                                      unsigned long long divisor, void *queue);

/* The compiler and MLU architectures this library was built for, one line. */
UNICCL_BANG_API const char *uniccl_bang_kernels_info(void);

#ifdef __cplusplus
}
#endif

#endif
