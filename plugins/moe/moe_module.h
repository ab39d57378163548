/* The calls of ncclx/moe.h as this module implements them (the family table in
 * moe_module.c): the all-to-all in alltoallv_dynamic_api.c, the MoE handle in moe.c. */
#ifndef NCCLX_MOE_MODULE_H
#define NCCLX_MOE_MODULE_H

#include "moe_core.h"

ncclxResult_t moeAllToAllvDynamic(const void* sendbuff, const size_t* sendcounts, void* recvbuff, size_t maxRecvCount,
                                  size_t* recvcounts, ncclxDataType_t datatype, ncclxComm_t comm,
                                  ncclxStream_t stream);
ncclxResult_t moeAllToAllvDynamicCompact(const void* sendbuff, const size_t* sendcounts, void* recvbuff,
                                         size_t maxRecvTotal, size_t* recvcounts, size_t* rdispls,
                                         ncclxDataType_t datatype, ncclxComm_t comm, ncclxStream_t stream);
ncclxResult_t moeCreate(ncclxMoe_t* moe, const ncclxMoeConfig_t* config, ncclxComm_t comm);
ncclxResult_t moeDestroy(ncclxMoe_t moe);
ncclxResult_t moeLocalExperts(ncclxMoe_t moe, int* firstExpert, int* nLocalExperts);
ncclxResult_t moeDispatch(ncclxMoe_t moe, const void* tokens, size_t nTokens, const int32_t* expertIds,
                          void* expertIn, size_t* expertCounts, ncclxStream_t stream);
ncclxResult_t moeDroppedCounts(ncclxMoe_t moe, size_t* dropped);
ncclxResult_t moeCombine(ncclxMoe_t moe, const void* expertOut, const float* weights, void* out,
                         ncclxStream_t stream);

#endif
