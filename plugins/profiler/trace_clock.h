/* The trace plugin's clock. The hot path only reads the CPU's invariant time-stamp counter
 * (rdtsc on x86-64, cntvct on aarch64) and keeps the raw value (a "stamp"); everything that
 * leaves the hot path (spool records, metrics, dumps, the watchdog) converts stamps to
 * CLOCK_MONOTONIC nanoseconds:
 *
 * ns = ns0 + (ticks - tick0) * mult / 2^32, with (tick0, ns0, mult) calibrated against
 * CLOCK_MONOTONIC at the first init (a 1 ms measurement) and refined by the background thread
 * on every tick and by conversions of stamps more than a second past the anchor: the rate
 * comes from the longest baseline, and the offset left over is steered away over the next
 * 100 ms instead of jumping, so converted times do not run backwards by more than the
 * sampling error (~0.1 us). Published with a sequence counter. Without an invariant counter
 * stamps are clock_gettime nanoseconds and the conversion is the identity. */
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
  uint64_t refresh; /* ticks after tick0 when a conversion refines the calibration */
} TraceClock;

extern TraceClock traceClock;

static inline uint64_t traceMonoNs(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* Calibrate once per process (idempotent, thread-safe); call before the first traceStamp. */
void traceClockInit(void);
/* Re-measure against CLOCK_MONOTONIC and steer (any thread; concurrent calls skip). */
void traceClockRefine(void);

/* 1 once calibrated against an invariant counter: stamps are then raw ticks. Set once, before
 * the first event of the process, and never cleared. */
extern int traceStampIsTicks;

/* The hot path's time stamp: one counter read (~9 ns where clock_gettime takes ~23 ns), no
 * conversion; traceSnapNs turns it into CLOCK_MONOTONIC nanoseconds off the hot path. */
static inline uint64_t traceStamp(void) {
#if TRACE_HAVE_TICKS
  if (__builtin_expect(__atomic_load_n(&traceStampIsTicks, __ATOMIC_RELAXED), 1)) return traceTicks();
#endif
  return traceMonoNs();
}

/* The calibration as a chain of segments, each (tick0, ns0, mult) valid from its anchor
 * tick0 until the next one; every refinement starts a new segment where the previous one
 * ends, so converting a stamp with the segment of its time gives what converting it at once
 * would have given, however late the conversion (the drain runs up to flush_ms later, and a
 * refinement in between may change the rate by up to 0.1%). */
#define TRACE_CLOCK_SEGMENTS 256 /* about 25 s of history at one refinement per 100 ms */
typedef struct {
  uint64_t tick0, ns0, mult;
} TraceClockSeg;

/* One consistent copy of the calibration, to convert many stamps (a drained batch). */
typedef struct {
  int ticks; /* 0: stamps are nanoseconds already */
  int n;     /* segments, oldest first */
  TraceClockSeg seg[TRACE_CLOCK_SEGMENTS];
} TraceClockSnap;
void traceClockSnap(TraceClockSnap* s);
uint64_t traceSnapNs(const TraceClockSnap* s, uint64_t stamp);
#endif
