/* CommFuse as a feature module (ncclx/module.h): the descriptor the core loads, the family
 * of calls it implements, and its per-communicator state. */
#include <stdlib.h>
#include <string.h>

#include "commfuse_internal.h"

const ncclxModuleCore_v1_t* fuseCore;
int fuseSlot;

static ncclxResult_t init(const ncclxModuleCore_v1_t* core, int slot) {
  /* Every operation used here exists from the first version of the table on. */
  if (!core) return ncclxInvalidUsage;
  if (core->abiVersion != NCCLX_MODULE_ABI_VERSION || core->size < sizeof(ncclxModuleCore_v1_t))
    return core->setError(ncclxInvalidUsage, "%s module: the core offers module ABI v%d with a %zu-byte table, this "
                          "module needs v%d with %zu bytes", "commfuse", core->abiVersion, core->size,
                          NCCLX_MODULE_ABI_VERSION, sizeof(ncclxModuleCore_v1_t));
  fuseCore = core;
  fuseSlot = slot;
  return ncclxSuccess;
}

static const ncclxModuleFuse_v1_t calls = {
    .allGatherCompute = fuseAllGatherCompute,
    .computeReduceScatter = fuseComputeReduceScatter,
    .allToAllCompute = fuseAllToAllCompute,
    .lastSchedule = fuseLastSchedule,
    .schedulePieces = fuseSchedulePieces,
};

static const void* family(const char* name) { return strcmp(name, NCCLX_MODULE_FAMILY_FUSE) == 0 ? &calls : NULL; }

struct fuseCommState* fuseCommState(ncclxComm_t comm) {
  struct fuseCommState* s = fuseCore->getState(comm, fuseSlot);
  if (s) return s;
  /* Only the thread running the communicator's operations creates it. */
  if (!(s = calloc(1, sizeof(*s)))) return NULL;
  s->lastSchedule = -1;
  fuseCore->setState(comm, fuseSlot, s);
  return s;
}

static void commDestroy(ncclxComm_t comm, void* state) {
  (void)comm;
  struct fuseCommState* s = state;
  free(s->autoTable);
  free(s);
}

__attribute__((visibility("default"))) const ncclxModule_v1_t ncclxModule_v1 = {
    .name = "commfuse",
    .abiVersion = NCCLX_MODULE_ABI_VERSION,
    .init = init,
    .family = family,
    .commDestroy = commDestroy,
};
