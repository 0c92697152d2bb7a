/* Elementwise reduction and scale kernels, compiled once per instruction-set
 * variant (kernels_impl.c) and dispatched at run time (kernels.c). */
#ifndef UNICCL_CPU_KERNELS_H
#define UNICCL_CPU_KERNELS_H

#include <stddef.h>
#include <stdint.h>

/* Codes equal uniccl._types.DType and ReduceOp (the plugin ABI). */
enum {
    UC_INT8,
    UC_UINT8,
    UC_INT32,
    UC_UINT32,
    UC_INT64,
    UC_UINT64,
    UC_FLOAT16,
    UC_FLOAT32,
    UC_FLOAT64,
    UC_BFLOAT16,
    UC_INT16,
    UC_UINT16,
    UC_NUM_DTYPES
};
enum { UC_SUM, UC_PROD, UC_MAX, UC_MIN, UC_NUM_OPS }; /* AVG is SUM then scale */

typedef void (*uc_reduce_kernel)(void *dst, const void *a, const void *b, size_t n);
typedef void (*uc_scale_kernel)(void *dst, const void *src, size_t n, int64_t divisor);

typedef struct {
    uc_reduce_kernel reduce[UC_NUM_DTYPES][UC_NUM_OPS];
    uc_scale_kernel scale[UC_NUM_DTYPES];
} uc_kernel_table;

/* dst may equal a, b or src exactly (in place); partial overlap is not supported.
 * Both return a status.h code and touch no memory unless it is UC_OK. */
int uc_reduce(void *dst, const void *a, const void *b, size_t count, int dtype, int op);
int uc_scale(void *dst, const void *src, size_t count, int dtype, int64_t divisor);
int uc_reduce_check(int dtype, int op);
int uc_scale_check(int dtype, int64_t divisor);

/* Variants this CPU can run, best first: name of the i-th, or NULL past the end. */
const char *uc_kernels_available(int i);
const char *uc_kernels_variant(void);
/* Switch to a named variant (benchmarks, tests); -1 when unknown or unsupported here. */
int uc_kernels_select(const char *name);
const char *uc_kernels_compiler(void);

#endif
