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
#define REFRESH_NS 1000000000ull   /* a conversion refines when the anchor is 1 s old */
#define SNAP_TRIES 1000            /* an update holds the sequence odd for a few stores */

TraceClock traceClock;
int traceStampIsTicks;
/* Every published calibration, the last TRACE_CLOCK_SEGMENTS of them (under traceClock.seq). */
static TraceClockSeg history[TRACE_CLOCK_SEGMENTS];
static uint64_t nhistory;

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
  TraceClockSeg* g = &history[nhistory % TRACE_CLOCK_SEGMENTS];
  __atomic_store_n(&g->tick0, tick0, __ATOMIC_RELAXED);
  __atomic_store_n(&g->ns0, ns0, __ATOMIC_RELAXED);
  __atomic_store_n(&g->mult, (uint64_t)mult, __ATOMIC_RELAXED);
  __atomic_store_n(&nhistory, nhistory + 1, __ATOMIC_RELAXED);
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
  __atomic_store_n(&traceStampIsTicks, 1, __ATOMIC_RELEASE);
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

void traceClockSnap(TraceClockSnap* s) {
  s->ticks = __atomic_load_n(&traceStampIsTicks, __ATOMIC_ACQUIRE);
  s->n = 0;
  if (!s->ticks) return;
  for (int i = 0;; i++) {
    uint64_t q = __atomic_load_n(&traceClock.seq, __ATOMIC_ACQUIRE);
    uint64_t tick0 = __atomic_load_n(&traceClock.tick0, __ATOMIC_RELAXED);
    uint64_t refresh = __atomic_load_n(&traceClock.refresh, __ATOMIC_RELAXED);
    uint64_t total = __atomic_load_n(&nhistory, __ATOMIC_RELAXED);
    int n = total < TRACE_CLOCK_SEGMENTS ? (int)total : TRACE_CLOCK_SEGMENTS;
    for (int k = 0; k < n; k++) {
      const TraceClockSeg* g = &history[(total - (uint64_t)n + (uint64_t)k) % TRACE_CLOCK_SEGMENTS];
      s->seg[k].tick0 = __atomic_load_n(&g->tick0, __ATOMIC_RELAXED);
      s->seg[k].ns0 = __atomic_load_n(&g->ns0, __ATOMIC_RELAXED);
      s->seg[k].mult = __atomic_load_n(&g->mult, __ATOMIC_RELAXED);
    }
    s->n = n;
    __atomic_thread_fence(__ATOMIC_ACQUIRE);
    int torn = (q & 1) || __atomic_load_n(&traceClock.seq, __ATOMIC_RELAXED) != q;
    if (!torn && i == 0 && (int64_t)(traceTicks() - tick0) > (int64_t)refresh) {
      traceClockRefine(); /* an old anchor: refine (skipped if another thread is at it), reread */
      continue;
    }
    if (!torn || i >= SNAP_TRIES) break; /* a writer stuck mid-update: its values are close */
  }
  if (s->n == 0) s->ticks = 0; /* cannot happen once calibrated; never divide by nothing */
}

uint64_t traceSnapNs(const TraceClockSnap* s, uint64_t stamp) {
  if (!s->ticks) return stamp;
  /* The newest segment that started at or before the stamp (older stamps: the oldest). */
  int k = s->n - 1;
  while (k > 0 && (int64_t)(stamp - s->seg[k].tick0) < 0) k--;
  const TraceClockSeg* g = &s->seg[k];
  if ((int64_t)(stamp - g->tick0) >= 0)
    return g->ns0 + (uint64_t)(((unsigned __int128)(stamp - g->tick0) * g->mult) >> 32);
  uint64_t back = (uint64_t)(((unsigned __int128)(g->tick0 - stamp) * g->mult) >> 32);
  return back < g->ns0 ? g->ns0 - back : 0;
}
