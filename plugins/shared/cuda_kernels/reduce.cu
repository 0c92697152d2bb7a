// Elementwise reduction and scale kernels for every CUDA-dialect plugin (nvidia,
// iluvatar, metax, moore): dst[i] = op(a[i], b[i]) and dst[i] = src[i] / divisor for
// uniccl's 12 dtypes.  Plain __global__ kernels only (no cooperative groups, no
// inline PTX, no shared memory or __syncthreads) so that every vendor's compiler
// accepts them and host_compat.h can run them as loops for the CPU-only tests.
// Vendor spellings live in uc_dialect.h; the C ABI is in uniccl_kernels.h.
#include <stdint.h>

#include "uc_dialect.h"
#include "uniccl_kernels.h"

namespace {

// ------------------------------------------------------------------ arithmetic
// Num<T>: the compute type C of storage type T, load/store between them, and the
// operations.  Integers add and multiply in the unsigned type U (at least 32
// bits, so narrow types are not promoted to signed int): wraps like numpy, with
// no signed-overflow undefined behaviour.
template <typename T, typename U> struct IntNum {
    typedef T C;
    static __device__ __forceinline__ C load(T v) { return v; }
    static __device__ __forceinline__ T store(C v) { return v; }
    static __device__ __forceinline__ C add(C x, C y) { return (T)((U)x + (U)y); }
    static __device__ __forceinline__ C mul(C x, C y) { return (T)((U)x * (U)y); }
    static __device__ __forceinline__ bool isnan(C) { return false; }
};

template <typename C_> struct FloatNum {
    typedef C_ C;
    static __device__ __forceinline__ C add(C x, C y) { return x + y; }
    static __device__ __forceinline__ C mul(C x, C y) { return x * y; }
    static __device__ __forceinline__ bool isnan(C x) { return x != x; }
};

template <typename T> struct Num;
template <> struct Num<int8_t> : IntNum<int8_t, uint32_t> {};
template <> struct Num<uint8_t> : IntNum<uint8_t, uint32_t> {};
template <> struct Num<int16_t> : IntNum<int16_t, uint32_t> {};
template <> struct Num<uint16_t> : IntNum<uint16_t, uint32_t> {};
template <> struct Num<int32_t> : IntNum<int32_t, uint32_t> {};
template <> struct Num<uint32_t> : IntNum<uint32_t, uint32_t> {};
template <> struct Num<int64_t> : IntNum<int64_t, uint64_t> {};
template <> struct Num<uint64_t> : IntNum<uint64_t, uint64_t> {};
template <> struct Num<float> : FloatNum<float> {
    static __device__ __forceinline__ float load(float v) { return v; }
    static __device__ __forceinline__ float store(float v) { return v; }
};
template <> struct Num<double> : FloatNum<double> {
    static __device__ __forceinline__ double load(double v) { return v; }
    static __device__ __forceinline__ double store(double v) { return v; }
};
// 16-bit floats compute in float32 and round once, as numpy and ml_dtypes do.
template <> struct Num<uc_f16> : FloatNum<float> {
    static __device__ __forceinline__ float load(uc_f16 v) { return uc_f16_to_float(v); }
    static __device__ __forceinline__ uc_f16 store(float v) { return uc_float_to_f16(v); }
};
template <> struct Num<uc_bf16> : FloatNum<float> {
    static __device__ __forceinline__ float load(uc_bf16 v) { return uc_bf16_to_float(v); }
    static __device__ __forceinline__ uc_bf16 store(float v) { return uc_float_to_bf16(v); }
};

// The element functions the kernel maps: f(a[i], b[i]).
template <typename T, int OP> struct Reduce {
    __device__ __forceinline__ T operator()(T a, T b) const {
        typedef Num<T> N;
        const typename N::C x = N::load(a), y = N::load(b);
        switch (OP) {
        case UNICCL_KSUM: return N::store(N::add(x, y));
        case UNICCL_KPROD: return N::store(N::mul(x, y));
        // a NaN in either input gives NaN and ties return y, like np.maximum on
        // float32/float64 (-0.0 versus 0.0)
        case UNICCL_KMAX: return N::store((x > y || N::isnan(x)) ? x : y);
        default: return N::store((x < y || N::isnan(x)) ? x : y);
        }
    }
};

// src / q in the division type D: the compute type for floats; for integers a
// signed or unsigned type wide enough for T and q, so C's truncation toward zero
// is NCCL's ncclAvg rounding.
template <typename T, typename D> struct Scale {
    D q;
    __device__ __forceinline__ T operator()(T a, T) const {
        typedef Num<T> N;
        return N::store((typename N::C)((D)N::load(a) / q));
    }
};

// ---------------------------------------------------------------------- kernel
const unsigned kThreads = 256;    // a multiple of every vendor's warp (32, 64, 128)
const unsigned kMaxBlocks = 2048; // enough to fill any current GPU; grid-stride beyond

// 16 bytes of T: one 128-bit load or store where the pointers allow.  Loops over
// v[] have a constant trip count, which every device compiler unrolls.
template <typename T> struct alignas(16) Pack {
    static const unsigned N = 16 / sizeof(T);
    T v[N];
};

// dst[i] = f(a[i], b[i]) for i < count.  Elements [head, head + nvec*N) go as
// 16-byte packs; [0, head) and the tail after the packs one by one (fewer than N
// each when vectorised, everything when the pointers cannot be).  Every element is
// read before it is written by the same thread, so dst may equal a or b.
template <typename T, typename F>
__global__ void uc_map_kernel(T *dst, const T *a, const T *b, size_t count, size_t head, size_t nvec, F f) {
    typedef Pack<T> P;
    const size_t tid = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    P *dv = reinterpret_cast<P *>(dst + head);
    const P *av = reinterpret_cast<const P *>(a + head);
    const P *bv = reinterpret_cast<const P *>(b + head);
    for (size_t i = tid; i < nvec; i += stride) {
        const P x = av[i], y = bv[i];
        P r;
        for (unsigned k = 0; k < P::N; k++)
            r.v[k] = f(x.v[k], y.v[k]);
        dv[i] = r;
    }
    for (size_t i = tid; i < head; i += stride)
        dst[i] = f(a[i], b[i]);
    for (size_t i = head + nvec * P::N + tid; i < count; i += stride)
        dst[i] = f(a[i], b[i]);
}

template <typename T, typename F>
int run(void *dst_, const void *a_, const void *b_, size_t count, F f, void *stream) {
    if (count == 0) return 0;
    T *dst = static_cast<T *>(dst_);
    const T *a = static_cast<const T *>(a_), *b = static_cast<const T *>(b_);
    const size_t n = Pack<T>::N;
    // Packs need all three pointers at the same offset from a 16-byte boundary;
    // the head then brings them to it.
    const uintptr_t mis = (uintptr_t)dst % 16;
    size_t head = count, nvec = 0;
    if ((uintptr_t)a % 16 == mis && (uintptr_t)b % 16 == mis && mis % sizeof(T) == 0) {
        head = (16 - mis) % 16 / sizeof(T);
        if (head > count) head = count;
        nvec = (count - head) / n;
    }
    const size_t tail = count - head - nvec * n;
    size_t work = nvec > head ? nvec : head;
    if (tail > work) work = tail;
    const size_t want = (work + kThreads - 1) / kThreads;
    const unsigned blocks = want < kMaxBlocks ? (unsigned)want : kMaxBlocks;
    UC_LAUNCH(blocks, kThreads, static_cast<uc_stream_t>(stream), uc_map_kernel<T, F>)(dst, a, b, count, head,
                                                                                       nvec, f);
    return uc_launch_error();
}

template <typename T>
int reduce_t(void *dst, const void *a, const void *b, size_t count, int op, void *stream) {
    switch (op) {
    case UNICCL_KSUM: return run<T>(dst, a, b, count, Reduce<T, UNICCL_KSUM>(), stream);
    case UNICCL_KPROD: return run<T>(dst, a, b, count, Reduce<T, UNICCL_KPROD>(), stream);
    case UNICCL_KMAX: return run<T>(dst, a, b, count, Reduce<T, UNICCL_KMAX>(), stream);
    case UNICCL_KMIN: return run<T>(dst, a, b, count, Reduce<T, UNICCL_KMIN>(), stream);
    default: return UNICCL_KERNELS_EINVAL;
    }
}

template <typename T, typename D>
int scale_t(void *dst, const void *src, size_t count, D divisor, void *stream) {
    Scale<T, D> f;
    f.q = divisor;
    return run<T>(dst, src, src, count, f, stream);
}

// Integers of up to 32 bits divide in 32 bits (S32) while the divisor fits
// (64-bit division is several times slower on GPUs), else in 64 bits (S64).
template <typename T, typename S32, typename S64>
int scale_int(void *dst, const void *src, size_t count, unsigned long long divisor, unsigned long long max32,
              void *stream) {
    if (divisor <= max32) return scale_t<T, S32>(dst, src, count, (S32)divisor, stream);
    return scale_t<T, S64>(dst, src, count, (S64)divisor, stream);
}

} // namespace

extern "C" int uniccl_cuda_reduce(void *dst, const void *a, const void *b, size_t count, int dtype, int op,
                                  void *stream) {
    if (op < UNICCL_KSUM || op > UNICCL_KMIN) return UNICCL_KERNELS_EINVAL;
    switch (dtype) {
    case UNICCL_KINT8: return reduce_t<int8_t>(dst, a, b, count, op, stream);
    case UNICCL_KUINT8: return reduce_t<uint8_t>(dst, a, b, count, op, stream);
    case UNICCL_KINT16: return reduce_t<int16_t>(dst, a, b, count, op, stream);
    case UNICCL_KUINT16: return reduce_t<uint16_t>(dst, a, b, count, op, stream);
    case UNICCL_KINT32: return reduce_t<int32_t>(dst, a, b, count, op, stream);
    case UNICCL_KUINT32: return reduce_t<uint32_t>(dst, a, b, count, op, stream);
    case UNICCL_KINT64: return reduce_t<int64_t>(dst, a, b, count, op, stream);
    case UNICCL_KUINT64: return reduce_t<uint64_t>(dst, a, b, count, op, stream);
    case UNICCL_KFLOAT16: return reduce_t<uc_f16>(dst, a, b, count, op, stream);
    case UNICCL_KBFLOAT16: return reduce_t<uc_bf16>(dst, a, b, count, op, stream);
    case UNICCL_KFLOAT32: return reduce_t<float>(dst, a, b, count, op, stream);
    case UNICCL_KFLOAT64: return reduce_t<double>(dst, a, b, count, op, stream);
    default: return UNICCL_KERNELS_EINVAL;
    }
}

extern "C" int uniccl_cuda_scale(void *dst, const void *src, size_t count, int dtype,
                                 unsigned long long divisor, void *stream) {
    // the cpu plugin's divisor is an int64: the same range here
    if (divisor == 0 || divisor > (unsigned long long)INT64_MAX) return UNICCL_KERNELS_EINVAL;
    const unsigned long long I32 = INT32_MAX, U32 = UINT32_MAX;
    switch (dtype) {
    case UNICCL_KINT8: return scale_int<int8_t, int32_t, int64_t>(dst, src, count, divisor, I32, stream);
    case UNICCL_KUINT8: return scale_int<uint8_t, uint32_t, uint64_t>(dst, src, count, divisor, U32, stream);
    case UNICCL_KINT16: return scale_int<int16_t, int32_t, int64_t>(dst, src, count, divisor, I32, stream);
    case UNICCL_KUINT16:
        return scale_int<uint16_t, uint32_t, uint64_t>(dst, src, count, divisor, U32, stream);
    case UNICCL_KINT32: return scale_int<int32_t, int32_t, int64_t>(dst, src, count, divisor, I32, stream);
    case UNICCL_KUINT32:
        return scale_int<uint32_t, uint32_t, uint64_t>(dst, src, count, divisor, U32, stream);
    case UNICCL_KINT64: return scale_t<int64_t, int64_t>(dst, src, count, (int64_t)divisor, stream);
    case UNICCL_KUINT64: return scale_t<uint64_t, uint64_t>(dst, src, count, divisor, stream);
    case UNICCL_KFLOAT16: return scale_t<uc_f16, float>(dst, src, count, (float)divisor, stream);
    case UNICCL_KBFLOAT16: return scale_t<uc_bf16, float>(dst, src, count, (float)divisor, stream);
    case UNICCL_KFLOAT32: return scale_t<float, float>(dst, src, count, (float)divisor, stream);
    case UNICCL_KFLOAT64: return scale_t<double, double>(dst, src, count, (double)divisor, stream);
    default: return UNICCL_KERNELS_EINVAL;
    }
}

extern "C" const char *uniccl_cuda_kernels_info(void) {
    return UC_KERNELS_COMPILER;
}
