/* The CommFuse calls of ncclx/fuse.h: forwarded to the module that implements the family
 * ([modules] commfuse, default libncclx-module-commfuse.so). */
#include "module/module.h"

#define API __attribute__((visibility("default")))

static const ncclxModuleFuse_v1_t* fuse(const char* fn) { return moduleFamily(MODULE_COMMFUSE, fn); }

static const char* const algoNames[ncclxFuseNumAlgos] = {
    [ncclxFuseSequential] = "sequential",
    [ncclxFuseSliced] = "sliced",
    [ncclxFuseRingP2P] = "ring_p2p",
    [ncclxFuseDirectP2P] = "direct_p2p",
    [ncclxFuseAuto] = "auto",
};

/* Names are part of the public header's contract, not of a schedule's implementation. */
API const char* ncclxFuseAlgoName(ncclxFuseAlgo_t algo) {
  return (unsigned)algo < ncclxFuseNumAlgos ? algoNames[algo] : "unknown";
}

API ncclxResult_t ncclxAllGatherCompute(const void* sendbuff, void* recvbuff, size_t sendcount,
                                        ncclxDataType_t datatype, ncclxFuseConsumeFn consume, void* user,
                                        ncclxFuseSchedule_t schedule, ncclxComm_t comm, ncclxStream_t stream) {
  const ncclxModuleFuse_v1_t* f = fuse("ncclxAllGatherCompute");
  return f ? f->allGatherCompute(sendbuff, recvbuff, sendcount, datatype, consume, user, schedule, comm, stream)
           : ncclxInvalidUsage;
}

API ncclxResult_t ncclxComputeReduceScatter(ncclxFuseProduceFn produce, void* user, void* recvbuff,
                                            size_t recvcount, ncclxDataType_t datatype, ncclxRedOp_t op,
                                            ncclxFuseSchedule_t schedule, ncclxComm_t comm, ncclxStream_t stream) {
  const ncclxModuleFuse_v1_t* f = fuse("ncclxComputeReduceScatter");
  return f ? f->computeReduceScatter(produce, user, recvbuff, recvcount, datatype, op, schedule, comm, stream)
           : ncclxInvalidUsage;
}

API ncclxResult_t ncclxAllToAllCompute(ncclxFuseProduceFn produce, ncclxFuseConsumeFn consume, void* user,
                                       void* recvbuff, size_t count, ncclxDataType_t datatype,
                                       ncclxFuseSchedule_t schedule, ncclxComm_t comm, ncclxStream_t stream) {
  const ncclxModuleFuse_v1_t* f = fuse("ncclxAllToAllCompute");
  return f ? f->allToAllCompute(produce, consume, user, recvbuff, count, datatype, schedule, comm, stream)
           : ncclxInvalidUsage;
}

API ncclxResult_t ncclxFuseLastSchedule(ncclxComm_t comm, ncclxFuseSchedule_t* schedule) {
  const ncclxModuleFuse_v1_t* f = fuse("ncclxFuseLastSchedule");
  return f ? f->lastSchedule(comm, schedule) : ncclxInvalidUsage;
}

/* No communicator, no error channel: one piece when the module is not there. */
API int ncclxFuseSchedulePieces(ncclxFuseSchedule_t schedule, size_t count, ncclxDataType_t datatype, int nranks) {
  const ncclxModuleFuse_v1_t* f = moduleFamilyQuiet(MODULE_COMMFUSE);
  return f ? f->schedulePieces(schedule, count, datatype, nranks) : 1;
}
