/* The AllToAllvDynamic/MoE module's view of the core: the table the core handed to its init
 * (ncclx/module.h). Nothing else of libncclx is reachable from here. */
#ifndef NCCLX_MOE_CORE_H
#define NCCLX_MOE_CORE_H

#include <stdint.h>

#include "ncclx/module.h"

extern const ncclxModuleCore_v1_t* moeCore;

#define NCCLX_CHECK(call)                              \
  do {                                                 \
    ncclxResult_t ncclx_res_ = (call);                 \
    if (ncclx_res_ != ncclxSuccess) return ncclx_res_; \
  } while (0)
#define MOE_INFO(subsys, ...) moeCore->log(NCCLX_LOG_INFO, (subsys), __FILE__, __LINE__, __VA_ARGS__)
#define MOE_WARN(...) moeCore->log(NCCLX_LOG_WARN, NCCLX_LOG_ALL, __FILE__, __LINE__, __VA_ARGS__)

/* Whether [a, a + alen) and [b, b + blen) share a byte (empty ranges share none). */
static inline int moeRangesOverlap(const void* a, size_t alen, const void* b, size_t blen) {
  uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;
  return alen && blen && x < y + blen && y < x + alen;
}

#endif
