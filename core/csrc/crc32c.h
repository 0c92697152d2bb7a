/* CRC-32C (Castagnoli, the polynomial of iSCSI, ext4 and SSE4.2's crc32 instruction).
 * uc_crc32c(0, buf, n) is the checksum of buf; pass a previous result to continue it.
 * The SSE4.2 instruction is used where the CPU has it (checked once), a table otherwise. */
#ifndef UC_CRC32C_H
#define UC_CRC32C_H

#include <stddef.h>
#include <stdint.h>

uint32_t uc_crc32c(uint32_t crc, const void *buf, size_t n);
/* memcpy(dst, src, n) and the CRC of the bytes, in one pass (4 KiB blocks checked while in cache) */
uint32_t uc_crc32c_copy(uint32_t crc, void *dst, const void *src, size_t n);
/* 1 when the hardware instruction is in use */
int uc_crc32c_hw(void);

#endif
