/* CRC-32C: see crc32c.h.  Reflected polynomial 0x82F63B78, initial value and final
 * xor 0xFFFFFFFF (so that crc32c("123456789") == 0xE3069283). */
#include "crc32c.h"

#include <string.h>

#define POLY 0x82F63B78u

static uint32_t table[8][256];
static int initialised, hw;

static void init(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++)
            c = c & 1 ? (c >> 1) ^ POLY : c >> 1;
        table[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; i++)
        for (int t = 1; t < 8; t++)
            table[t][i] = (table[t - 1][i] >> 8) ^ table[0][table[t - 1][i] & 0xFF];
#if defined(__x86_64__) && !defined(UC_CRC32C_NO_HW)
    __builtin_cpu_init();
    hw = __builtin_cpu_supports("sse4.2") != 0;
#endif
    initialised = 1;
}

/* slicing by 8: eight table lookups per 8 bytes */
static uint32_t soft(uint32_t c, const unsigned char *p, size_t n) {
    while (n && ((uintptr_t)p & 7)) {
        c = (c >> 8) ^ table[0][(c ^ *p++) & 0xFF];
        n--;
    }
    for (; n >= 8; n -= 8, p += 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        w ^= c;
        c = table[7][w & 0xFF] ^ table[6][(w >> 8) & 0xFF] ^ table[5][(w >> 16) & 0xFF] ^
            table[4][(w >> 24) & 0xFF] ^ table[3][(w >> 32) & 0xFF] ^ table[2][(w >> 40) & 0xFF] ^
            table[1][(w >> 48) & 0xFF] ^ table[0][w >> 56];
    }
    while (n--)
        c = (c >> 8) ^ table[0][(c ^ *p++) & 0xFF];
    return c;
}

#if defined(__x86_64__)
__attribute__((target("sse4.2"))) static uint32_t hard(uint32_t c, const unsigned char *p, size_t n) {
    uint64_t c64 = c;
    while (n && ((uintptr_t)p & 7)) {
        c64 = __builtin_ia32_crc32qi((uint32_t)c64, *p++);
        n--;
    }
    for (; n >= 8; n -= 8, p += 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        c64 = __builtin_ia32_crc32di(c64, w);
    }
    while (n--)
        c64 = __builtin_ia32_crc32qi((uint32_t)c64, *p++);
    return (uint32_t)c64;
}
#endif

uint32_t uc_crc32c(uint32_t crc, const void *buf, size_t n) {
    if (!initialised) init(); /* idempotent: racing first callers compute the same tables */
    uint32_t c = ~crc;
#if defined(__x86_64__)
    if (hw) return ~hard(c, (const unsigned char *)buf, n);
#endif
    return ~soft(c, (const unsigned char *)buf, n);
}

int uc_crc32c_hw(void) {
    if (!initialised) init();
    return hw;
}

uint32_t uc_crc32c_copy(uint32_t crc, void *dst, const void *src, size_t n) {
    unsigned char *d = (unsigned char *)dst;
    const unsigned char *s = (const unsigned char *)src;
    for (size_t off = 0; off < n; off += 4096) {
        size_t k = n - off < 4096 ? n - off : 4096;
        memcpy(d + off, s + off, k);
        crc = uc_crc32c(crc, d + off, k);
    }
    return crc;
}
