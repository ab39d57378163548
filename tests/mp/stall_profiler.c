/* A profiler plugin for fault_stall's "inside" scenario: it stalls the calling rank in the
 * middle of a collective, at the NCCLX_TEST_STALL_AT-th transfer progress event (default 1)
 * after the program set NCCLX_TEST_STALL_SEC in its environment (once; the variable is then
 * removed). A profiler's callbacks run on the thread that makes the call, so this is a rank
 * stopped mid-call with part of its data moved. */
#include <stdlib.h>
#include <unistd.h>

#include "ncclx/profiler.h"

static ncclxResult_t stallInit(void** ctx, const ncclxProfilerCommInfo_v1_t* info, int* mask,
                               const ncclxPluginEnv_t* env) {
  (void)info, (void)env;
  *ctx = NULL;
  *mask = NCCLX_PROFILE_STEP;
  return ncclxSuccess;
}

static ncclxResult_t stallStart(void* ctx, void** eHandle, const ncclxProfilerEventDescr_v1_t* descr) {
  (void)ctx, (void)descr;
  *eHandle = (void*)1; /* any non-NULL handle: states are recorded on it */
  return ncclxSuccess;
}

static ncclxResult_t stallStop(void* eHandle) {
  (void)eHandle;
  return ncclxSuccess;
}

static ncclxResult_t stallState(void* eHandle, ncclxProfilerState_t state, const ncclxProfilerStateArgs_v1_t* args) {
  (void)eHandle, (void)args;
  static int seen;
  const char* sec = state == NCCLX_PROFILE_STATE_PROGRESS ? getenv("NCCLX_TEST_STALL_SEC") : NULL;
  const char* at = getenv("NCCLX_TEST_STALL_AT");
  if (sec && ++seen >= (at ? atoi(at) : 1)) {
    unsigned s = (unsigned)atoi(sec);
    unsetenv("NCCLX_TEST_STALL_SEC");
    sleep(s);
  }
  return ncclxSuccess;
}

static ncclxResult_t stallFinalize(void* ctx) {
  (void)ctx;
  return ncclxSuccess;
}

__attribute__((visibility("default"))) const ncclxProfiler_v1_t ncclxProfilerPlugin_v1 = {
    .name = "stall",
    .abiVersion = NCCLX_PROFILER_ABI_VERSION,
    .init = stallInit,
    .startEvent = stallStart,
    .stopEvent = stallStop,
    .recordEventState = stallState,
    .finalize = stallFinalize,
};
