/* The clock of the compiled call path (comm/_fastpath): two readings a call, for the flight
 * recorder's wall-clock times and telemetry's durations.
 *
 * Where the kernel itself keeps time by the TSC (clocksource "tsc": one constant rate, the same
 * on every CPU) a reading is the TSC alone, converted by a rate this process measures against
 * CLOCK_REALTIME; the conversion re-anchors on CLOCK_REALTIME every ANCHOR_NS, so a wall time is
 * never far from the system's and a clock step is taken up within that.  Elsewhere a reading is
 * clock_gettime(CLOCK_REALTIME) in nanoseconds.  On 2026-12-07's AMD EPYC VM a TSC reading took
 * 11.5 ns against clock_gettime's 29.
 *
 * Not thread-safe on its own: every caller holds the GIL (the anchor is one shared state). */
#ifndef UNICCL_CALL_CLOCK_H
#define UNICCL_CALL_CLOCK_H

#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#if defined(__x86_64__) || defined(__i386__)
#include <x86intrin.h>
#define UC_CLOCK_TSC 1
#endif

#define UC_CLOCK_ANCHOR_NS 250000000ULL /* re-anchor this often (0.25 s) */
#define UC_CLOCK_MIN_NS 1000000ULL      /* the first rate: from at least 1 ms of both clocks */
#define UC_CLOCK_STEP_NS 1000000.0      /* a re-anchor off by more: the wall clock was stepped */

typedef struct {
    int tsc;              /* 1: readings are TSC ticks; 0: CLOCK_REALTIME nanoseconds */
    uint64_t tick0;       /* the anchor: a TSC reading ... */
    double wall0;         /* ... and CLOCK_REALTIME (s) read beside it */
    uint64_t base_tick;   /* the rate's baseline: the first anchor since the last step */
    double base_wall;     /* ... */
    double s_per_tick;    /* seconds per tick */
    uint64_t anchor_span; /* ticks between anchors */
} uc_call_clock;

static uc_call_clock uc_clk = {0, 0, 0.0, 0, 0.0, 1e-9, 0};

static inline uint64_t uc_realtime_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

#ifdef UC_CLOCK_TSC
static int uc_clock_source_is_tsc(void) {
    char name[32] = {0};
    FILE *f = fopen("/sys/devices/system/clocksource/clocksource0/current_clocksource", "r");
    if (!f) return 0;
    int ok = fgets(name, sizeof name, f) != NULL;
    fclose(f);
    return ok && strncmp(name, "tsc", 3) == 0 && (name[3] == '\n' || name[3] == 0);
}

static void uc_clock_anchor(uint64_t t, uint64_t wall_ns) {
    uc_clk.tick0 = t;
    uc_clk.wall0 = wall_ns * 1e-9;
}
#endif

/* Once, before the first reading: choose the source and measure the first rate. */
static void uc_clock_init(void) {
#ifdef UC_CLOCK_TSC
    if (!uc_clock_source_is_tsc()) return;
    uint64_t w0 = uc_realtime_ns(), t0 = __rdtsc(), w1, t1;
    do { /* ~1 ms of both clocks, from which the first rate */
        w1 = uc_realtime_ns();
        t1 = __rdtsc();
    } while (w1 - w0 < UC_CLOCK_MIN_NS && w1 >= w0);
    if (w1 <= w0 || t1 <= t0) return; /* a clock went backwards: keep clock_gettime */
    uc_clk.s_per_tick = (w1 - w0) * 1e-9 / (double)(t1 - t0);
    uc_clk.anchor_span = (uint64_t)(UC_CLOCK_ANCHOR_NS * 1e-9 / uc_clk.s_per_tick);
    uc_clk.base_tick = t0;
    uc_clk.base_wall = w0 * 1e-9;
    uc_clock_anchor(t1, w1);
    uc_clk.tsc = 1;
#endif
}

#ifdef UC_CLOCK_TSC
/* Every ANCHOR_NS: the rate refined over the whole baseline, the anchor moved to now. */
static void uc_clock_reanchor(uint64_t t) {
    uint64_t w = uc_realtime_ns();
    double predicted = uc_clk.wall0 + (double)(t - uc_clk.tick0) * uc_clk.s_per_tick;
    if ((w * 1e-9 - predicted) * 1e9 > UC_CLOCK_STEP_NS || (predicted - w * 1e-9) * 1e9 > UC_CLOCK_STEP_NS) {
        uc_clk.base_tick = t; /* stepped: the baseline starts again, the rate is kept */
        uc_clk.base_wall = w * 1e-9;
    } else if (t > uc_clk.base_tick && w * 1e-9 > uc_clk.base_wall) {
        uc_clk.s_per_tick = (w * 1e-9 - uc_clk.base_wall) / (double)(t - uc_clk.base_tick);
    }
    uc_clock_anchor(t, w);
}
#endif

/* A reading: TSC ticks or nanoseconds (uc_clock_wall and uc_clock_ns convert it). */
static inline uint64_t uc_clock_ticks(void) {
#ifdef UC_CLOCK_TSC
    if (uc_clk.tsc) {
        uint64_t t = __rdtsc();
        if (t - uc_clk.tick0 >= uc_clk.anchor_span) uc_clock_reanchor(t);
        return t;
    }
#endif
    return uc_realtime_ns();
}

/* A reading as CLOCK_REALTIME seconds. */
static inline double uc_clock_wall(uint64_t t) {
    if (uc_clk.tsc) return uc_clk.wall0 + ((double)(int64_t)(t - uc_clk.tick0)) * uc_clk.s_per_tick;
    return t * 1e-9;
}

/* Nanoseconds between two readings t0 <= t1 (a clock step backwards: 0). */
static inline uint64_t uc_clock_ns(uint64_t t0, uint64_t t1) {
    if (t1 <= t0) return 0;
    return uc_clk.tsc ? (uint64_t)((double)(t1 - t0) * uc_clk.s_per_tick * 1e9) : t1 - t0;
}

#endif
