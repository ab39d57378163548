/* CommFuse timeline tracing (see commfuse_trace.h); empty unless NCCLX_FUSE_TRACE. */
#include "commfuse_trace.h"

#ifdef NCCLX_FUSE_TRACE
#include <stdatomic.h>
#include <stdio.h>
#include <time.h>

#define TRACE_MAX 4096
static struct {
  double t;
  const char* what;
  int a, b;
} traceBuf[TRACE_MAX];
static atomic_int traceLen;

void fuseTraceMark(const char* what, int a, int b) {
  int i = atomic_fetch_add(&traceLen, 1);
  if (i >= TRACE_MAX) return;
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  traceBuf[i].t = (double)ts.tv_sec * 1e6 + 1e-3 * (double)ts.tv_nsec;
  traceBuf[i].what = what;
  traceBuf[i].a = a;
  traceBuf[i].b = b;
}

void fuseTraceDump(int rank, const char* opName, int algo, int pieces) {
  int n = atomic_load(&traceLen);
  if (n > TRACE_MAX) n = TRACE_MAX;
  for (int i = 0; i < n; i++)
    fprintf(stderr, "TRACE %.1f r%d %s/%d/%d %s %d %d\n", traceBuf[i].t, rank, opName, algo, pieces,
            traceBuf[i].what, traceBuf[i].a, traceBuf[i].b);
  atomic_store(&traceLen, 0);
}
#else
typedef int fuseTraceUnused; /* ISO C: a translation unit must not be empty */
#endif
