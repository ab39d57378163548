/* libncclx-profiler-noop.so: a profiler that records nothing, for measuring what the core's
 * side of the profiler ABI costs (event descriptors, calls) apart from any plugin's work:
 *
 *   PROF_OVERHEAD_PLUGIN=.../libncclx-profiler-noop.so prof_overhead -np 1 8
 *
 * Its activation mask is NCCLX_PROF_NOOP_MASK (default 0x2: collectives), as a number. */
#include <stdlib.h>

#include "ncclx/profiler.h"

static int token; /* every event's handle: non-NULL, so the core sends the stops */

static ncclxResult_t noopInit(void** ctx, const ncclxProfilerCommInfo_v1_t* info, int* mask,
                              const ncclxPluginEnv_t* env) {
  (void)info, (void)env;
  const char* m = getenv("NCCLX_PROF_NOOP_MASK");
  *ctx = &token;
  __atomic_store_n(mask, m && *m ? (int)strtol(m, NULL, 0) : NCCLX_PROFILE_COLL, __ATOMIC_RELAXED);
  return ncclxSuccess;
}

static ncclxResult_t noopStart(void* ctx, void** eHandle, const ncclxProfilerEventDescr_v1_t* d) {
  (void)d;
  *eHandle = ctx;
  return ncclxSuccess;
}

static ncclxResult_t noopStop(void* eHandle) {
  (void)eHandle;
  return ncclxSuccess;
}

static ncclxResult_t noopState(void* eHandle, ncclxProfilerState_t s, const ncclxProfilerStateArgs_v1_t* a) {
  (void)eHandle, (void)s, (void)a;
  return ncclxSuccess;
}

static ncclxResult_t noopFinalize(void* ctx) {
  (void)ctx;
  return ncclxSuccess;
}

__attribute__((visibility("default"))) const ncclxProfiler_v1_t ncclxProfilerPlugin_v1 = {
    .name = "noop",
    .abiVersion = NCCLX_PROFILER_ABI_VERSION,
    .init = noopInit,
    .startEvent = noopStart,
    .stopEvent = noopStop,
    .recordEventState = noopState,
    .finalize = noopFinalize,
};
