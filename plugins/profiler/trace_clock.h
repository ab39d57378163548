/* The trace plugin's clock: CLOCK_MONOTONIC nanoseconds, read on the hot path from the CPU's
 * invariant time-stamp counter (rdtsc on x86-64, cntvct on aarch64: ~9 ns where
 * clock_gettime takes ~23 ns, and a collective reads the clock twice).
 *
 * ns = ns0 + (ticks - tick0) * mult / 2^32, with (tick0, ns0, mult) calibrated against
 * CLOCK_MONOTONIC at the first init (a 1 ms measurement) and refined at least once a second
 * (by the hot path when the anchor is older, and by the background thread on every tick):
 * the rate comes from the longest baseline, and the offset left over is steered away over
 * the next 100 ms instead of jumping, so the clock does not run backwards by more than the
 * sampling error (~0.1 us). Published with a sequence counter; a read that overlaps an
 * update falls back to clock_gettime rather than spin. Without an invariant counter every
 * read is clock_gettime. */
#ifndef NCCLX_PROFILER_TRACE_CLOCK_H
#define NCCLX_PROFILER_TRACE_CLOCK_H

#include <stdint.h>
#include <time.h>

#if defined(__x86_64__)
#include <x86intrin.h>
#define TRACE_HAVE_TICKS 1
static inline uint64_t traceTicks(void) { return __rdtsc(); }
#elif defined(__aarch64__)
#define TRACE_HAVE_TICKS 1
static inline uint64_t traceTicks(void) {
  uint64_t v;
  __asm__ volatile("mrs %0, cntvct_el0" : "=r"(v));
  return v;
}
#else
#define TRACE_HAVE_TICKS 0
static inline uint64_t traceTicks(void) { return 0; }
#endif

typedef struct {
  uint64_t seq;   /* odd while an update is being written */
  uint64_t tick0; /* anchor */
  uint64_t ns0;
  uint64_t mult;    /* ns per tick, times 2^32; 0 = use clock_gettime */
  uint64_t refresh; /* ticks after tick0 when the hot path refines the calibration */
} TraceClock;

extern TraceClock traceClock;

static inline uint64_t traceMonoNs(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* Calibrate once per process (idempotent, thread-safe); call before the first traceNowNs. */
void traceClockInit(void);
/* Re-measure against CLOCK_MONOTONIC and steer (any thread; concurrent calls skip). */
void traceClockRefine(void);

/* Monotonic nanoseconds. */
static inline uint64_t traceNowNs(void) {
#if TRACE_HAVE_TICKS
  uint64_t s = __atomic_load_n(&traceClock.seq, __ATOMIC_ACQUIRE);
  uint64_t t0 = __atomic_load_n(&traceClock.tick0, __ATOMIC_RELAXED);
  uint64_t n0 = __atomic_load_n(&traceClock.ns0, __ATOMIC_RELAXED);
  uint64_t m = __atomic_load_n(&traceClock.mult, __ATOMIC_RELAXED);
  uint64_t refresh = __atomic_load_n(&traceClock.refresh, __ATOMIC_RELAXED);
  uint64_t t = traceTicks();
  __atomic_thread_fence(__ATOMIC_ACQUIRE);
  /* An update in progress, no calibration, or a stale one: the system clock, never a spin. */
  if (__builtin_expect((s & 1) || m == 0 || __atomic_load_n(&traceClock.seq, __ATOMIC_RELAXED) != s, 0))
    return traceMonoNs();
  uint64_t d = t - t0;
  if ((int64_t)d < 0) d = 0; /* another CPU's counter a few ticks behind the anchor's */
  if (__builtin_expect(d > refresh, 0)) {
    traceClockRefine();
    return traceMonoNs();
  }
  return n0 + (uint64_t)(((unsigned __int128)d * m) >> 32);
#else
  return traceMonoNs();
#endif
}
#endif
