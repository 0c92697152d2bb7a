/* The one place where reduce.cu meets a vendor's CUDA dialect.
 *
 * reduce.cu uses only what every dialect maps: __global__/__device__, the
 * built-in blockIdx/threadIdx/blockDim/gridDim, and these names:
 *   uc_f16, uc_bf16            16-bit float storage types
 *   uc_f16_to_float(h), uc_float_to_f16(f), uc_bf16_to_float(h), uc_float_to_bf16(f)
 *                              conversions; float -> 16 bit rounds to nearest even
 *   uc_stream_t                the runtime's stream handle
 *   UC_LAUNCH(grid, block, stream, kernel)(args...)
 *                              kernel<<<grid, block, 0, stream>>>(args...): a macro
 *                              because host_compat.h must turn it into loops, and
 *                              `<<<` is no C++ that a macro could reach
 *   uc_launch_error()          int: the runtime's last error (0: none), cleared
 *   UC_KERNELS_COMPILER        string naming compiler and targets
 * CoreX (clang -x ivcore) accepts the CUDA spellings, so it takes the CUDA branch;
 * the MUSA and MACA spellings follow public code built with mcc and mxcc, not yet
 * compiled here. */
#ifndef UC_DIALECT_H
#define UC_DIALECT_H

#define UC_STR_(...) #__VA_ARGS__
#define UC_STR(x) UC_STR_(x)

#if defined(UC_HOST_COMPAT)
/* host_compat.h, force-included by the host build, has defined everything. */

#elif defined(UC_DIALECT_MUSA) || defined(__MUSACC__)
#include <musa_runtime.h>
#include <musa_fp16.h>
#include <musa_bf16.h>
typedef __half uc_f16;
typedef __mt_bfloat16 uc_bf16;
typedef musaStream_t uc_stream_t;
#define uc_f16_to_float(h) __half2float(h)
#define uc_float_to_f16(f) __float2half(f)
#define uc_bf16_to_float(h) __bfloat162float(h)
#define uc_float_to_bf16(f) __float2bfloat16(f)
#define uc_launch_error() ((int)musaGetLastError())
#define UC_KERNELS_COMPILER "mcc (musa)"

#elif defined(UC_DIALECT_MACA) || defined(__MACACC__)
#include <mc_runtime.h>
#include <maca_fp16.h>
#include <maca_bfloat16.h>
typedef __half uc_f16;
typedef __maca_bfloat16 uc_bf16;
typedef mcStream_t uc_stream_t;
#define uc_f16_to_float(h) __half2float(h)
#define uc_float_to_f16(f) __float2half(f)
#define uc_bf16_to_float(h) __bfloat162float(h)
#define uc_float_to_bf16(f) __float2bfloat16(f)
#define uc_launch_error() ((int)mcGetLastError())
#define UC_KERNELS_COMPILER "mxcc (maca)"

#else /* CUDA: nvcc, or CoreX clang -x ivcore */
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
typedef __half uc_f16;
typedef __nv_bfloat16 uc_bf16;
typedef cudaStream_t uc_stream_t;
#define uc_f16_to_float(h) __half2float(h)
#define uc_float_to_f16(f) __float2half_rn(f)
#define uc_bf16_to_float(h) __bfloat162float(h)
#define uc_float_to_bf16(f) __float2bfloat16_rn(f)
#define uc_launch_error() ((int)cudaGetLastError())
#if defined(UC_DIALECT_IVCORE)
#define UC_KERNELS_COMPILER "clang (ivcore)"
#elif defined(__CUDA_ARCH_LIST__)
/* nvcc >= 11.5 lists the targets it compiles for, e.g. 800,900 */
#define UC_KERNELS_COMPILER                                                                                  \
    "nvcc " UC_STR(__CUDACC_VER_MAJOR__) "." UC_STR(__CUDACC_VER_MINOR__) ": CUDA arch list " UC_STR(        \
        __CUDA_ARCH_LIST__)
#else
#define UC_KERNELS_COMPILER "cuda"
#endif
#endif

#ifndef UC_HOST_COMPAT
#define UC_LAUNCH(grid, block, stream, ...) __VA_ARGS__<<<(grid), (block), 0, (stream)>>>
#endif

#endif
