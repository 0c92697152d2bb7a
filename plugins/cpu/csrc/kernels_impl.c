/* One instruction-set variant of every kernel.  CMake compiles this file once per
 * variant with UC_VARIANT=<name> and that variant's -m flags; the plain loops are
 * auto-vectorized at -O3 for whatever vector width the flags allow.  The result is
 * the table uc_kernels_<name>, which kernels.c dispatches to. */
#include <string.h>

#if defined(__F16C__)
#include <immintrin.h>
#endif

#include "kernels.h"

#ifndef __FLT16_MAX__
#error "the float16 kernels need a compiler with _Float16 (GCC >= 12, Clang >= 15)"
#endif

#define CAT_(a, b) a##b
#define CAT(a, b) CAT_(a, b)

/* dst is either disjoint from the inputs or exactly equal to one of them, so
 * element i is always read before it is written and no iteration depends on
 * another: ivdep lets GCC drop its runtime overlap checks, which would otherwise
 * send the in-place case to the scalar loop. */
#define EACH(body)                                                                                           \
    _Pragma("GCC ivdep") for (size_t i = 0; i < n; i++) {                                                    \
        body;                                                                                                \
    }

/* dst[i] = narrow(expr) with x = widen(a[i]), y = widen(b[i]) of compute type C. */
#define REDUCE(name, T, C, widen, narrow, expr)                                                              \
    static void name(void *dst, const void *pa, const void *pb, size_t n) {                                  \
        T *d = dst;                                                                                          \
        const T *a = pa, *b = pb;                                                                            \
        EACH(C x = widen(a[i]); C y = widen(b[i]); d[i] = narrow(expr))                                      \
    }
#define SAME(v) (v)

/* Integers: sum and product in the unsigned type U (at least unsigned int, so
 * that narrow types are not promoted to signed int), which wraps like numpy
 * instead of overflowing signed arithmetic (undefined behaviour).  Scale divides
 * in the 64-bit type W, truncating toward zero like C and NCCL's ncclAvg. */
#define INT_KERNELS(tag, T, U, W)                                                                            \
    REDUCE(sum_##tag, T, T, SAME, SAME, (T)((U)x + (U)y))                                                    \
    REDUCE(prod_##tag, T, T, SAME, SAME, (T)((U)x * (U)y))                                                   \
    REDUCE(max_##tag, T, T, SAME, SAME, x > y ? x : y)                                                       \
    REDUCE(min_##tag, T, T, SAME, SAME, x < y ? x : y)                                                       \
    static void scale_##tag(void *dst, const void *ps, size_t n, int64_t div) {                              \
        T *d = dst;                                                                                          \
        const T *s = ps;                                                                                     \
        const W q = (W)div;                                                                                  \
        EACH(d[i] = (T)((W)s[i] / q))                                                                        \
    }

/* Floats, computed in C and narrowed once.  A NaN in either input gives NaN and
 * ties return y, exactly like np.maximum / np.minimum (-0.0 versus 0.0). */
#define FLOAT_KERNELS(tag, T, C, widen, narrow)                                                              \
    REDUCE(sum_##tag, T, C, widen, narrow, x + y)                                                            \
    REDUCE(prod_##tag, T, C, widen, narrow, x *y)                                                            \
    REDUCE(max_##tag, T, C, widen, narrow, (x > y || x != x) ? x : y)                                        \
    REDUCE(min_##tag, T, C, widen, narrow, (x < y || x != x) ? x : y)                                        \
    static void scale_##tag(void *dst, const void *ps, size_t n, int64_t div) {                              \
        T *d = dst;                                                                                          \
        const T *s = ps;                                                                                     \
        const C q = (C)div;                                                                                  \
        EACH(d[i] = narrow(widen(s[i]) / q))                                                                 \
    }

/* bfloat16 is the top half of a float32.  Narrowing rounds to nearest even by
 * adding 0x7FFF plus the lowest kept bit; a NaN is truncated instead (rounding
 * could carry it into infinity) and made quiet so it stays a NaN.  Plain integer
 * code, so these vectorize inside the kernel loops. */
static inline float bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline uint16_t f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    uint32_t is_nan = (u & 0x7FFFFFFFu) > 0x7F800000u;
    return (uint16_t)((is_nan ? u | 0x400000u : u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

INT_KERNELS(i8, int8_t, uint32_t, int64_t)
INT_KERNELS(u8, uint8_t, uint32_t, uint64_t)
INT_KERNELS(i16, int16_t, uint32_t, int64_t)
INT_KERNELS(u16, uint16_t, uint32_t, uint64_t)
INT_KERNELS(i32, int32_t, uint32_t, int64_t)
INT_KERNELS(u32, uint32_t, uint32_t, uint64_t)
INT_KERNELS(i64, int64_t, uint64_t, int64_t)
INT_KERNELS(u64, uint64_t, uint64_t, uint64_t)
FLOAT_KERNELS(f32, float, float, SAME, SAME)
FLOAT_KERNELS(f64, double, double, SAME, SAME)
FLOAT_KERNELS(bf16, uint16_t, float, bf16_to_f32, f32_to_bf16)

/* ------------------------------------------------------------ float16 <-> float32
 * F16C vector conversion where the variant has it, _Float16 for the tail and for
 * the baseline variant (libgcc, correctly rounded).  float32 -> float16 rounds to
 * nearest even, as numpy's cast does.  The avx512 variant uses these 256-bit
 * conversions too: the 512-bit ones were ~20% slower once memory-bound. */
static void f16_to_f32(float *restrict f, const uint16_t *restrict h, size_t n) {
    size_t i = 0;
#if defined(__F16C__)
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(f + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(h + i))));
#endif
    for (; i < n; i++) {
        _Float16 v;
        memcpy(&v, h + i, 2);
        f[i] = (float)v;
    }
}

static void f32_to_f16(uint16_t *restrict h, const float *restrict f, size_t n) {
    size_t i = 0;
#if defined(__F16C__)
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(h + i),
                         _mm256_cvtps_ph(_mm256_loadu_ps(f + i), _MM_FROUND_TO_NEAREST_INT));
#endif
    for (; i < n; i++) {
        _Float16 v = (_Float16)f[i];
        memcpy(h + i, &v, 2);
    }
}

/* GCC does not vectorize _Float16 conversions inside a loop, so float16 widens a
 * block to float32 on the stack (with the vector conversions above), runs the
 * float32 kernel and narrows once: one rounding per element.  512 floats per
 * operand keeps both blocks in L1. */
#define F16_BLOCK 512
#define F16_REDUCE(op)                                                                                       \
    static void op##_f16(void *dst, const void *pa, const void *pb, size_t n) {                              \
        uint16_t *d = dst;                                                                                   \
        const uint16_t *a = pa, *b = pb;                                                                     \
        float x[F16_BLOCK], y[F16_BLOCK];                                                                    \
        for (size_t i = 0; i < n; i += F16_BLOCK) {                                                          \
            size_t m = n - i < F16_BLOCK ? n - i : F16_BLOCK;                                                \
            f16_to_f32(x, a + i, m);                                                                         \
            f16_to_f32(y, b + i, m);                                                                         \
            op##_f32(x, x, y, m);                                                                            \
            f32_to_f16(d + i, x, m);                                                                         \
        }                                                                                                    \
    }

F16_REDUCE(sum)
F16_REDUCE(prod)
F16_REDUCE(max)
F16_REDUCE(min)

static void scale_f16(void *dst, const void *ps, size_t n, int64_t div) {
    uint16_t *d = dst;
    const uint16_t *s = ps;
    float x[F16_BLOCK];
    for (size_t i = 0; i < n; i += F16_BLOCK) {
        size_t m = n - i < F16_BLOCK ? n - i : F16_BLOCK;
        f16_to_f32(x, s + i, m);
        scale_f32(x, x, m, div);
        f32_to_f16(d + i, x, m);
    }
}

#define OPS(tag) {sum_##tag, prod_##tag, max_##tag, min_##tag}

const uc_kernel_table CAT(uc_kernels_, UC_VARIANT) = {
    .reduce =
        {
            [UC_INT8] = OPS(i8),
            [UC_UINT8] = OPS(u8),
            [UC_INT16] = OPS(i16),
            [UC_UINT16] = OPS(u16),
            [UC_INT32] = OPS(i32),
            [UC_UINT32] = OPS(u32),
            [UC_INT64] = OPS(i64),
            [UC_UINT64] = OPS(u64),
            [UC_FLOAT16] = OPS(f16),
            [UC_BFLOAT16] = OPS(bf16),
            [UC_FLOAT32] = OPS(f32),
            [UC_FLOAT64] = OPS(f64),
        },
    .scale =
        {
            [UC_INT8] = scale_i8,
            [UC_UINT8] = scale_u8,
            [UC_INT16] = scale_i16,
            [UC_UINT16] = scale_u16,
            [UC_INT32] = scale_i32,
            [UC_UINT32] = scale_u32,
            [UC_INT64] = scale_i64,
            [UC_UINT64] = scale_u64,
            [UC_FLOAT16] = scale_f16,
            [UC_BFLOAT16] = scale_bf16,
            [UC_FLOAT32] = scale_f32,
            [UC_FLOAT64] = scale_f64,
        },
};
