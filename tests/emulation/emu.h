/* Shared definitions of the uniccl ABI emulation (tests only).
 *
 * libcudart (cudart_emu.c) owns all process state: devices, the allocation
 * table, streams, events and the error-injection table.  libnccl (nccl_emu.c)
 * reaches it through the private uniccl_emu__* entry points below, looked up
 * with dlsym on the cudart it was linked against, so that two emulations
 * (nvidia and iluvatar) can live in one process without binding to each other.
 */
#ifndef UNICCL_EMU_H
#define UNICCL_EMU_H

#include <stddef.h>

#define EMU_EXPORT __attribute__((visibility("default")))

/* Public control API, exported by both libraries (same table behind them). */
EMU_EXPORT int uniccl_emu_fail(const char *call, int status, int after, int times);
EMU_EXPORT int uniccl_emu_calls(const char *call);

/* Private entry points of libcudart used by libnccl. */
typedef int (*emu_enter_fn)(const char *call); /* count; 0 or injected status */
typedef int (*emu_launch_fn)(void *stream, void (*fn)(void *), void *arg);
typedef int (*emu_ptr_fn)(const void *p, size_t n, int *type, int *dev);
typedef int (*emu_device_fn)(void);
typedef int (*emu_fail_fn)(const char *call, int status, int after, int times);
typedef int (*emu_calls_fn)(const char *call);

#endif
