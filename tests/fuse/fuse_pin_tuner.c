/* A tuner plugin for fuse_auto's "pinned" case: the v1 tuner leaves every collective to the
 * core, and the optional CommFuse entry pins NCCLX_FUSE_AUTO calls to SLICED(3). */
#include "ncclx/fuse.h"
#include "ncclx/tuner.h"

#define EXPORT __attribute__((visibility("default")))

static ncclxResult_t pinInit(void** ctx, const ncclxTunerCommInfo_v1_t* info, const ncclxPluginEnv_t* env) {
  (void)info, (void)env;
  *ctx = NULL;
  return ncclxSuccess;
}

static ncclxResult_t pinGetCollInfo(void* ctx, const ncclxTunerQuery_v1_t* query, float* costTable,
                                    size_t* chunkBytes, int* nChannels) {
  (void)ctx, (void)query, (void)costTable, (void)chunkBytes, (void)nChannels;
  return ncclxSuccess;
}

static ncclxResult_t pinFinalize(void* ctx) {
  (void)ctx;
  return ncclxSuccess;
}

static ncclxResult_t pinFuse(void* ctx, const ncclxTunerFuseQuery_v1_t* query, int* algo, int* pieces) {
  (void)ctx, (void)query;
  *algo = ncclxFuseSliced;
  *pieces = 3;
  return ncclxSuccess;
}

EXPORT const ncclxTuner_v1_t ncclxTunerPlugin_v1 = {
    .name = "fusepin",
    .abiVersion = NCCLX_TUNER_ABI_VERSION,
    .init = pinInit,
    .getCollInfo = pinGetCollInfo,
    .finalize = pinFinalize,
};

EXPORT const ncclxTunerFuse_v1_t ncclxTunerFuse_v1 = {
    .abiVersion = NCCLX_TUNER_FUSE_ABI_VERSION,
    .getFuseSchedule = pinFuse,
};
