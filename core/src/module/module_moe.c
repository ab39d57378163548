/* The calls of ncclx/moe.h (AllToAllvDynamic and the MoE helpers): forwarded to the module
 * that implements the family ([modules] moe, default libncclx-module-moe.so). */
#include "module/module.h"

#define API __attribute__((visibility("default")))

static const ncclxModuleMoe_v1_t* moe(const char* fn) { return moduleFamily(MODULE_MOE, fn); }

API ncclxResult_t ncclxAllToAllvDynamic(const void* sendbuff, const size_t* sendcounts, void* recvbuff,
                                        size_t maxRecvCount, size_t* recvcounts, ncclxDataType_t datatype,
                                        ncclxComm_t comm, ncclxStream_t stream) {
  const ncclxModuleMoe_v1_t* m = moe("ncclxAllToAllvDynamic");
  return m ? m->allToAllvDynamic(sendbuff, sendcounts, recvbuff, maxRecvCount, recvcounts, datatype, comm, stream)
           : ncclxInvalidUsage;
}

API ncclxResult_t ncclxAllToAllvDynamicCompact(const void* sendbuff, const size_t* sendcounts, void* recvbuff,
                                               size_t maxRecvTotal, size_t* recvcounts, size_t* rdispls,
                                               ncclxDataType_t datatype, ncclxComm_t comm, ncclxStream_t stream) {
  const ncclxModuleMoe_v1_t* m = moe("ncclxAllToAllvDynamicCompact");
  return m ? m->allToAllvDynamicCompact(sendbuff, sendcounts, recvbuff, maxRecvTotal, recvcounts, rdispls, datatype,
                                        comm, stream)
           : ncclxInvalidUsage;
}

API ncclxResult_t ncclxMoeCreate(ncclxMoe_t* handle, const ncclxMoeConfig_t* config, ncclxComm_t comm) {
  if (handle) *handle = NULL;
  const ncclxModuleMoe_v1_t* m = moe("ncclxMoeCreate");
  return m ? m->moeCreate(handle, config, comm) : ncclxInvalidUsage;
}

API ncclxResult_t ncclxMoeDestroy(ncclxMoe_t handle) {
  const ncclxModuleMoe_v1_t* m = moe("ncclxMoeDestroy");
  return m ? m->moeDestroy(handle) : ncclxInvalidUsage;
}

API ncclxResult_t ncclxMoeLocalExperts(ncclxMoe_t handle, int* firstExpert, int* nLocalExperts) {
  const ncclxModuleMoe_v1_t* m = moe("ncclxMoeLocalExperts");
  return m ? m->moeLocalExperts(handle, firstExpert, nLocalExperts) : ncclxInvalidUsage;
}

API ncclxResult_t ncclxMoeDispatch(ncclxMoe_t handle, const void* tokens, size_t nTokens, const int32_t* expertIds,
                                   void* expertIn, size_t* expertCounts, ncclxStream_t stream) {
  const ncclxModuleMoe_v1_t* m = moe("ncclxMoeDispatch");
  return m ? m->moeDispatch(handle, tokens, nTokens, expertIds, expertIn, expertCounts, stream) : ncclxInvalidUsage;
}

API ncclxResult_t ncclxMoeDroppedCounts(ncclxMoe_t handle, size_t* dropped) {
  const ncclxModuleMoe_v1_t* m = moe("ncclxMoeDroppedCounts");
  return m ? m->moeDroppedCounts(handle, dropped) : ncclxInvalidUsage;
}

API ncclxResult_t ncclxMoeCombine(ncclxMoe_t handle, const void* expertOut, const float* weights, void* out,
                                  ncclxStream_t stream) {
  const ncclxModuleMoe_v1_t* m = moe("ncclxMoeCombine");
  return m ? m->moeCombine(handle, expertOut, weights, out, stream) : ncclxInvalidUsage;
}
