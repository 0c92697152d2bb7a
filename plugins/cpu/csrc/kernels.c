/* Run-time dispatch over the kernel variants built from kernels_impl.c: the wheel
 * runs on any x86-64 and still uses AVX2 or AVX-512 where the CPU has them. */
#include <string.h>

#include "kernels.h"
#include "status.h"

extern const uc_kernel_table uc_kernels_baseline;

#ifdef UC_X86_VARIANTS
extern const uc_kernel_table uc_kernels_avx512, uc_kernels_avx2;

/* The avx512 variant is compiled with F/BW/DQ/VL (byte and 64-bit integer
 * lanes) and uses F16C-style conversions; __builtin_cpu_supports also checks
 * that the OS saves the wide registers. */
static int cpu_avx512(void) {
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl") &&
           __builtin_cpu_supports("f16c");
}

static int cpu_avx2(void) {
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c");
}
#endif

static int cpu_any(void) {
    return 1;
}

static const struct {
    const char *name;
    const uc_kernel_table *table;
    int (*supported)(void);
} variants[] = {
#ifdef UC_X86_VARIANTS
    {"avx512", &uc_kernels_avx512, cpu_avx512},
    {"avx2", &uc_kernels_avx2, cpu_avx2},
#endif
    {"baseline", &uc_kernels_baseline, cpu_any},
};
enum { NUM_VARIANTS = sizeof variants / sizeof variants[0] };

/* Index into variants; atomic so that uc_kernels_select racing a kernel is defined. */
static int current;

__attribute__((constructor)) static void pick_best(void) {
#ifdef UC_X86_VARIANTS
    __builtin_cpu_init(); /* needed before constructors have run */
#endif
    int i = 0;
    while (!variants[i].supported())
        i++;
    current = i;
}

static const uc_kernel_table *table(void) {
    return variants[__atomic_load_n(&current, __ATOMIC_RELAXED)].table;
}

int uc_reduce_check(int dtype, int op) {
    if (dtype < 0 || dtype >= UC_NUM_DTYPES) return UC_EDTYPE;
    if (op < 0 || op >= UC_NUM_OPS) return UC_EOP;
    return UC_OK;
}

int uc_scale_check(int dtype, int64_t divisor) {
    if (dtype < 0 || dtype >= UC_NUM_DTYPES) return UC_EDTYPE;
    if (divisor < 1) return UC_EDIVISOR;
    return UC_OK;
}

int uc_reduce(void *dst, const void *a, const void *b, size_t count, int dtype, int op) {
    int status = uc_reduce_check(dtype, op);
    if (status == UC_OK) table()->reduce[dtype][op](dst, a, b, count);
    return status;
}

int uc_scale(void *dst, const void *src, size_t count, int dtype, int64_t divisor) {
    int status = uc_scale_check(dtype, divisor);
    if (status == UC_OK) table()->scale[dtype](dst, src, count, divisor);
    return status;
}

const char *uc_kernels_available(int i) {
    for (int k = 0; k < NUM_VARIANTS; k++)
        if (variants[k].supported() && i-- == 0) return variants[k].name;
    return NULL;
}

const char *uc_kernels_variant(void) {
    return variants[__atomic_load_n(&current, __ATOMIC_RELAXED)].name;
}

int uc_kernels_select(const char *name) {
    for (int k = 0; k < NUM_VARIANTS; k++) {
        if (strcmp(variants[k].name, name) == 0 && variants[k].supported()) {
            __atomic_store_n(&current, k, __ATOMIC_RELAXED);
            return 0;
        }
    }
    return -1;
}

const char *uc_kernels_compiler(void) {
#if defined(__clang__)
    return "clang " __clang_version__;
#elif defined(__GNUC__)
    return "gcc " __VERSION__;
#else
    return "unknown";
#endif
}
