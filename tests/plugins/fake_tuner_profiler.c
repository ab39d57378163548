/* Fake tuner (FAKE_TUNER) or profiler (FAKE_PROFILER) plugin for the loader test. FAKE_ABI
 * overrides the claimed abiVersion. The operations are never called by the loader. */
#include "ncclx/profiler.h"
#include "ncclx/tuner.h"

#define FAKE_EXPORT __attribute__((visibility("default")))

#ifdef FAKE_TUNER
#ifndef FAKE_ABI
#define FAKE_ABI NCCLX_TUNER_ABI_VERSION
#endif
static ncclxResult_t tunerInit(void** ctx, const ncclxTunerCommInfo_v1_t* info, const ncclxPluginEnv_t* env) {
  (void)info, (void)env;
  *ctx = NULL;
  return ncclxSuccess;
}
static ncclxResult_t tunerGetCollInfo(void* ctx, const ncclxTunerQuery_v1_t* query, float* costTable,
                                      size_t* chunkBytes, int* nChannels) {
  (void)ctx, (void)query, (void)costTable, (void)chunkBytes, (void)nChannels;
  return ncclxSuccess;
}
static ncclxResult_t tunerFinalize(void* ctx) {
  (void)ctx;
  return ncclxSuccess;
}
FAKE_EXPORT const ncclxTuner_v1_t ncclxTunerPlugin_v1 = {
    .name = FAKE_NAME,
    .abiVersion = FAKE_ABI,
    .init = tunerInit,
    .getCollInfo = tunerGetCollInfo,
    .finalize = tunerFinalize,
};
#endif

#ifdef FAKE_PROFILER
#ifndef FAKE_ABI
#define FAKE_ABI NCCLX_PROFILER_ABI_VERSION
#endif
static ncclxResult_t profInit(void** ctx, const ncclxProfilerCommInfo_v1_t* info, int* mask,
                              const ncclxPluginEnv_t* env) {
  (void)info, (void)env;
  *ctx = NULL;
  *mask = 0;
  return ncclxSuccess;
}
static ncclxResult_t profStart(void* ctx, void** eHandle, const ncclxProfilerEventDescr_v1_t* descr) {
  (void)ctx, (void)descr;
  *eHandle = NULL;
  return ncclxSuccess;
}
static ncclxResult_t profStop(void* eHandle) {
  (void)eHandle;
  return ncclxSuccess;
}
static ncclxResult_t profState(void* eHandle, ncclxProfilerState_t state, const ncclxProfilerStateArgs_v1_t* args) {
  (void)eHandle, (void)state, (void)args;
  return ncclxSuccess;
}
static ncclxResult_t profFinalize(void* ctx) {
  (void)ctx;
  return ncclxSuccess;
}
FAKE_EXPORT const ncclxProfiler_v1_t ncclxProfilerPlugin_v1 = {
    .name = FAKE_NAME,
    .abiVersion = FAKE_ABI,
    .init = profInit,
    .startEvent = profStart,
    .stopEvent = profStop,
    .recordEventState = profState,
    .finalize = profFinalize,
};
#endif
