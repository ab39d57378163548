/* AllToAllvDynamic and the MoE helpers as a feature module (ncclx/module.h): the descriptor
 * the core loads and the family of calls it implements. It keeps no per-communicator state:
 * the engine's staging lives in the communicator's scratch memory, an MoE layer in its
 * handle. */
#include <string.h>

#include "moe_module.h"

const ncclxModuleCore_v1_t* moeCore;

static ncclxResult_t init(const ncclxModuleCore_v1_t* core, int slot) {
  (void)slot;
  /* Needs the table up to the device operations (its last entry). */
  if (!core) return ncclxInvalidUsage;
  if (core->abiVersion != NCCLX_MODULE_ABI_VERSION || core->size < sizeof(ncclxModuleCore_v1_t))
    return core->setError(ncclxInvalidUsage, "%s module: the core offers module ABI v%d with a %zu-byte table, this "
                          "module needs v%d with %zu bytes", "moe", core->abiVersion, core->size,
                          NCCLX_MODULE_ABI_VERSION, sizeof(ncclxModuleCore_v1_t));
  moeCore = core;
  return ncclxSuccess;
}

static const ncclxModuleMoe_v1_t calls = {
    .allToAllvDynamic = moeAllToAllvDynamic,
    .allToAllvDynamicCompact = moeAllToAllvDynamicCompact,
    .moeCreate = moeCreate,
    .moeDestroy = moeDestroy,
    .moeLocalExperts = moeLocalExperts,
    .moeDispatch = moeDispatch,
    .moeDroppedCounts = moeDroppedCounts,
    .moeCombine = moeCombine,
};

static const void* family(const char* name) { return strcmp(name, NCCLX_MODULE_FAMILY_MOE) == 0 ? &calls : NULL; }

__attribute__((visibility("default"))) const ncclxModule_v1_t ncclxModule_v1 = {
    .name = "moe",
    .abiVersion = NCCLX_MODULE_ABI_VERSION,
    .init = init,
    .family = family,
};
