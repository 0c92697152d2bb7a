/* Host-compile mode: lets reduce.cu build with a plain C++ compiler so that the
 * kernel logic is tested on machines without a GPU:
 *
 *   g++ -std=c++17 -x c++ -include host_compat.h -shared -fPIC reduce.cu -o libuc_host.so
 *
 * It supplies everything uc_dialect.h names.  A launch runs every block's every
 * thread in turn on the calling thread (streams are ignored: it returns when the
 * work is done), which is faithful only for kernels without shared memory or
 * __syncthreads, as reduce.cu's are.  float16 and bfloat16 are bit-exact software
 * conversions, rounding to nearest even like the devices' cvt.rn. */
#ifndef UC_HOST_COMPAT_H
#define UC_HOST_COMPAT_H

#define UC_HOST_COMPAT 1

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline

struct uc_dim3 {
    unsigned x, y, z;
};
// One set per host thread, so that concurrent callers do not disturb each other.
inline thread_local uc_dim3 blockIdx, threadIdx, blockDim, gridDim;

typedef void *uc_stream_t;
#define uc_launch_error() 0
#define UC_KERNELS_COMPILER "host emulation (g++ " __VERSION__ ")"

namespace uc_host {

template <typename... P> struct Launch {
    unsigned grid, block;
    void (*kernel)(P...);
    template <typename... A> void operator()(A... args) const {
        gridDim = uc_dim3{grid, 1, 1};
        blockDim = uc_dim3{block, 1, 1};
        for (unsigned b = 0; b < grid; b++)
            for (unsigned t = 0; t < block; t++) {
                blockIdx = uc_dim3{b, 0, 0};
                threadIdx = uc_dim3{t, 0, 0};
                kernel(args...);
            }
    }
};

template <typename... P> Launch<P...> launch(unsigned grid, unsigned block, void (*kernel)(P...)) {
    return Launch<P...>{grid, block, kernel};
}

inline uint32_t f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

inline float bits_f32(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

} // namespace uc_host

#define UC_LAUNCH(grid, block, stream, ...) ((void)(stream), ::uc_host::launch((grid), (block), __VA_ARGS__))

/* Storage types: 16 bits, nothing else, like __half and __nv_bfloat16. */
struct uc_f16 {
    uint16_t bits;
};
struct uc_bf16 {
    uint16_t bits;
};

inline float uc_f16_to_float(uc_f16 h) {
    const uint32_t sign = (uint32_t)(h.bits & 0x8000u) << 16;
    const uint32_t exp = (h.bits >> 10) & 0x1Fu, mant = h.bits & 0x3FFu;
    if (exp == 0x1F) return uc_host::bits_f32(sign | 0x7F800000u | (mant << 13)); // inf, NaN
    if (exp == 0) { // zero or subnormal: mant * 2^-24, exact in float
        const float v = (float)mant * 5.9604644775390625e-8f;
        return sign ? -v : v;
    }
    return uc_host::bits_f32(sign | ((exp + 112) << 23) | (mant << 13)); // rebias 15 -> 127
}

inline uc_f16 uc_float_to_f16(float f) {
    const uint32_t u = uc_host::f32_bits(f);
    const uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t ax = u & 0x7FFFFFFFu;
    if (ax > 0x7F800000u) // NaN, made quiet
        return uc_f16{(uint16_t)(sign | 0x7E00u | ((ax >> 13) & 0x3FFu))};
    if (ax >= 0x477FF000u) return uc_f16{(uint16_t)(sign | 0x7C00u)}; // >= 65520 rounds to inf
    if (ax >= 0x38800000u) { // normal half: round the 13 dropped bits to nearest even
        ax += 0xFFFu + ((ax >> 13) & 1u);
        return uc_f16{(uint16_t)(sign | ((ax - 0x38000000u) >> 13))};
    }
    if (ax <= 0x33000000u) return uc_f16{sign}; // <= 2^-25: rounds to (even) zero
    // subnormal half, in units of 2^-24: the 24-bit significand shifted right by 14..24
    const uint32_t shift = 126 - (ax >> 23), sig = (ax & 0x7FFFFFu) | 0x800000u;
    uint32_t q = sig >> shift;
    const uint32_t rem = sig & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (q & 1u))) q++; // may carry into the smallest normal
    return uc_f16{(uint16_t)(sign | q)};
}

/* bfloat16 is the top half of a float32. */
inline float uc_bf16_to_float(uc_bf16 h) {
    return uc_host::bits_f32((uint32_t)h.bits << 16);
}

inline uc_bf16 uc_float_to_bf16(float f) {
    const uint32_t u = uc_host::f32_bits(f);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) // NaN: truncate (rounding could carry it to inf), quiet
        return uc_bf16{(uint16_t)((u | 0x400000u) >> 16)};
    return uc_bf16{(uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16)};
}

#endif
