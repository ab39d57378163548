/* Calibration of the trace plugin's tick clock against CLOCK_MONOTONIC (see trace_clock.h). */
#include "trace_clock.h"

#include <pthread.h>

#if defined(__x86_64__)
#include <cpuid.h>
#endif

#define SAMPLE_TRIES 8
#define SAMPLE_MAX_NS 2000         /* a (ticks, ns) pair taken over longer was interrupted */
#define INIT_SPAN_NS 1000000ull    /* first calibration: 1 ms */
#define STEER_NS 100000000.0       /* an offset is worked off over the next 100 ms */
#define MAX_STEER 1e-3             /* ... changing the rate by at most 0.1% */
#define JUMP_NS 1000000            /* beyond 1 ms off (suspend, a bad first estimate): re-anchor */
#define REFRESH_NS 1000000000ull   /* the hot path refines when the anchor is 1 s old */

TraceClock traceClock;

static pthread_mutex_t refineLock = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t initOnce = PTHREAD_ONCE_INIT;
static uint64_t firstTick, firstNs; /* the longest baseline, for the rate */
static double rate;                 /* ns per tick, times 2^32, from that baseline */

/* A counter that runs at a constant rate in every power state and on every CPU. */
static int haveInvariantTicks(void) {
#if defined(__x86_64__)
  unsigned a, b, c, d;
  if (!__get_cpuid(0x80000000u, &a, &b, &c, &d) || a < 0x80000007u) return 0;
  __get_cpuid(0x80000007u, &a, &b, &c, &d);
  return (d >> 8) & 1;
#elif defined(__aarch64__)
  return 1; /* the generic timer's virtual count is architecturally constant-rate */
#else
  return 0;
#endif
}

/* One (ticks, ns) pair taken close together; 0 when every try was interrupted. */
static int sample(uint64_t* tick, uint64_t* ns) {
  for (int i = 0; i < SAMPLE_TRIES; i++) {
    uint64_t a = traceTicks();
    uint64_t n = traceMonoNs();
    uint64_t b = traceTicks();
    uint64_t n2 = traceMonoNs();
    if (b > a && n2 - n < SAMPLE_MAX_NS) {
      *tick = a + (b - a) / 2;
      *ns = n;
      return 1;
    }
  }
  return 0;
}

static void publish(uint64_t tick0, uint64_t ns0, double mult) {
  uint64_t s = __atomic_load_n(&traceClock.seq, __ATOMIC_RELAXED);
  __atomic_store_n(&traceClock.seq, s + 1, __ATOMIC_RELAXED);
  __atomic_thread_fence(__ATOMIC_RELEASE);
  __atomic_store_n(&traceClock.tick0, tick0, __ATOMIC_RELAXED);
  __atomic_store_n(&traceClock.ns0, ns0, __ATOMIC_RELAXED);
  __atomic_store_n(&traceClock.mult, (uint64_t)mult, __ATOMIC_RELAXED);
  __atomic_store_n(&traceClock.refresh, (uint64_t)((double)REFRESH_NS * 4294967296.0 / mult), __ATOMIC_RELAXED);
  __atomic_store_n(&traceClock.seq, s + 2, __ATOMIC_RELEASE);
}

static void calibrate(void) {
  if (!TRACE_HAVE_TICKS || !haveInvariantTicks()) return; /* mult stays 0: clock_gettime */
  uint64_t t1, n1, t2, n2;
  if (!sample(&t1, &n1)) return;
  while (traceMonoNs() < n1 + INIT_SPAN_NS) {
  }
  if (!sample(&t2, &n2) || t2 <= t1) return;
  firstTick = t1, firstNs = n1;
  rate = (double)(n2 - n1) * 4294967296.0 / (double)(t2 - t1);
  pthread_mutex_lock(&refineLock);
  publish(t2, n2, rate);
  pthread_mutex_unlock(&refineLock);
}

void traceClockInit(void) { pthread_once(&initOnce, calibrate); }

void traceClockRefine(void) {
  if (__atomic_load_n(&traceClock.mult, __ATOMIC_RELAXED) == 0) return;
  if (pthread_mutex_trylock(&refineLock) != 0) return; /* someone else is at it */
  uint64_t t = 0, n = 0;
  uint64_t t0 = traceClock.tick0, n0 = traceClock.ns0, m = traceClock.mult;
  int ok = sample(&t, &n);
  if (!ok) t = traceTicks();
  if (ok && t > firstTick && t > t0) {
    rate = (double)(n - firstNs) * 4294967296.0 / (double)(t - firstTick);
    uint64_t cur = n0 + (uint64_t)(((unsigned __int128)(t - t0) * m) >> 32);
    double err = (double)(int64_t)(n - cur);
    if (err > JUMP_NS || err < -JUMP_NS) {
      publish(t, n, rate);
    } else {
      double steer = err / STEER_NS;
      steer = steer > MAX_STEER ? MAX_STEER : steer < -MAX_STEER ? -MAX_STEER : steer;
      publish(t, cur, rate * (1.0 + steer));
    }
  } else if (t > t0) {
    /* Interrupted every time: keep the rate, move the anchor so the hot path stops asking. */
    publish(t, n0 + (uint64_t)(((unsigned __int128)(t - t0) * m) >> 32), (double)m);
  }
  pthread_mutex_unlock(&refineLock);
}
