/* The AllToAllvDynamic operations: execution in the core's operation envelope (dynExecOp, for
 * the MoE helpers too), the group rule, and ncclxAllToAllvDynamic[Compact] as this module
 * implements them. The exchange itself is alltoallv_dynamic.c's engine. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alltoallv_dynamic.h"
#include "moe_module.h"

static unsigned long long callSeq(const dynCall* call) { return (unsigned long long)call->seq; }

/* ---------------- execution in the core's envelope ---------------- */

ncclxResult_t dynExecOp(ncclxComm_t comm, const char* name, ncclxResult_t (*fn)(const dynCall* call, void* arg),
                        void* arg, const dynOpInfo* info) {
  ncclxModuleOp_v1_t op = {.name = name, .path = "dynamic", .callKind = NCCLX_MODULE_NO_STEPS,
                           .bytesPerRank = NCCLX_MODULE_BYTES_PER_TRANSFER, .sendbuff = info->sendbuff,
                           .recvbuff = info->recvbuff, .count = info->count, .datatype = info->datatype,
                           .stream = info->stream};
  ncclxModuleOpEvent_v1_t event = {.func = name, .algo = "dynamic", .bytes = info->bytes};
  ncclxModuleOpCtx_v1_t ctx;
  NCCLX_CHECK(moeCore->opBeginNamed(comm, &op, &event, &ctx));
  dynCall call = {.comm = comm, .name = name, .seq = ctx.seq, .maxMessageBytes = moeCore->maxMessageBytes(comm)};
  moeCore->commInfo(comm, &call.info);
  MOE_INFO(NCCLX_LOG_COLL, "%s #%llu: %zu %s (%zu bytes) to send, comm %s nranks %d", name,
           (unsigned long long)ctx.seq, info->count, moeCore->typeName(info->datatype), info->bytes, call.info.name,
           call.info.nranks);
  ncclxResult_t res = fn(&call, arg);
  moeCore->opEnd(comm, &ctx, res);
  return res;
}

/* ---------------- groups ---------------- */

/* Dynamic calls are not grouped: a group runs its operations at ncclxGroupEnd with every
 * size known at call time, while ours learn their sizes when they execute. Refusing keeps
 * the order of operations the one the caller wrote. */
ncclxResult_t dynCheckNotGrouped(ncclxComm_t comm, const char* fn) {
  if (!moeCore->inGroup()) return ncclxSuccess;
  return moeCore->argError(comm, ncclxInvalidUsage,
                           "%s: cannot be called between ncclxGroupStart and ncclxGroupEnd (its counts are "
                           "read when it executes); call it outside the group, on the same stream",
                           fn);
}

/* ---------------- the public all-to-all ---------------- */

typedef struct {
  ncclxComm_t comm;
  const char* sendbuff;
  const size_t* sendcounts;
  char* recvbuff;
  size_t maxRecv; /* per peer, or in total (compact) */
  size_t* recvcounts;
  size_t* rdispls; /* compact only */
  size_t elemBytes;
  int nranks;
  ncclxDataType_t datatype;
  ncclxStream_t stream;
  int compact;
  int nextPeer;       /* compact: first peer not placed yet */
  uint64_t placedSum; /* compact: elements placed before nextPeer */
  /* nranks entries each */
  dynPeer* peers;
  const char** sendPtrs;
  uint64_t* sendSegs;
  uint64_t* recvSegs;
  char** recvDst;
} a2avTask;

static ncclxResult_t placePerPeer(dynExchange* x, int peer, int* placed) {
  a2avTask* t = x->ctx;
  uint64_t count = x->peers[peer].recvSegs[0];
  if (count > t->maxRecv) {
    char who[128];
    snprintf(x->why, sizeof(x->why), "%s sends %llu elements to rank %d, more than its maxRecvCount %zu",
             moeCore->describeRank(x->call->comm, peer, who, sizeof(who)), (unsigned long long)count,
             x->call->info.rank, t->maxRecv);
    return ncclxInvalidUsage;
  }
  t->recvcounts[peer] = (size_t)count;
  x->peers[peer].recvDst[0] = count ? t->recvbuff + (size_t)peer * t->maxRecv * t->elemBytes : NULL;
  *placed = 1;
  return ncclxSuccess;
}

/* Blocks are packed in peer order, so a peer is placed once every lower peer's count is known. */
static ncclxResult_t placePacked(dynExchange* x, int peer, int* placed) {
  a2avTask* t = x->ctx;
  while (t->nextPeer < x->call->info.nranks && x->peers[t->nextPeer].hdrKnown) {
    int q = t->nextPeer;
    uint64_t count = x->peers[q].recvSegs[0];
    if (count > t->maxRecv - t->placedSum) {
      char who[128];
      snprintf(x->why, sizeof(x->why),
               "%s sends %llu elements to rank %d, which has room for only %llu more: its maxRecvTotal "
               "is %zu and ranks before %d sent %llu",
               moeCore->describeRank(x->call->comm, q, who, sizeof(who)), (unsigned long long)count,
               x->call->info.rank,
               (unsigned long long)(t->maxRecv - t->placedSum), t->maxRecv, q,
               (unsigned long long)t->placedSum);
      return ncclxInvalidUsage;
    }
    t->recvcounts[q] = (size_t)count;
    t->rdispls[q] = (size_t)t->placedSum;
    x->peers[q].recvDst[0] = count ? t->recvbuff + (size_t)t->placedSum * t->elemBytes : NULL;
    t->placedSum += count;
    t->nextPeer++;
  }
  *placed = peer < t->nextPeer;
  return ncclxSuccess;
}

static ncclxResult_t a2avExec(const dynCall* call, void* arg) {
  a2avTask* t = arg;
  ncclxComm_t comm = call->comm;
  int n = call->info.nranks;
  const char* fn = t->compact ? "ncclxAllToAllvDynamicCompact" : "ncclxAllToAllvDynamic";
  /* The counts are the caller's at this moment: check them now (failures here must reach
   * the peers, which are already waiting for our headers: commFail). */
  uint64_t sum = 0, limit = (SIZE_MAX / 2) / t->elemBytes;
  for (int p = 0; p < n; p++) {
    size_t c = t->sendcounts[p];
    if (c > limit - sum)
      return moeCore->fail(comm, ncclxInvalidArgument,
                      "%s #%llu: sendcounts[%d] = %zu: the send counts add up to "
                      "more than fits in memory",
                      fn, callSeq(call), p, c);
    t->sendSegs[p] = c;
    t->sendPtrs[p] = t->sendbuff ? t->sendbuff + sum * t->elemBytes : NULL;
    sum += c;
  }
  if (sum > 0 && !t->sendbuff)
    return moeCore->fail(comm, ncclxInvalidArgument, "%s #%llu: sendbuff is NULL but the send counts add up to %llu",
                    fn, callSeq(call), (unsigned long long)sum);
  size_t recvBytes = (t->compact ? t->maxRecv : t->maxRecv * (size_t)n) * t->elemBytes;
  if (moeRangesOverlap(t->sendbuff, (size_t)sum * t->elemBytes, t->recvbuff, recvBytes))
    return moeCore->fail(comm, ncclxInvalidArgument,
                    "%s #%llu: sendbuff and recvbuff overlap (in place is not supported)", fn, callSeq(call));
  t->nextPeer = 0;
  t->placedSum = 0;
  dynExchange x = {.call = call,
                   .unitBytes = t->elemBytes,
                   .unitName = "elements",
                   .capName = t->compact ? "maxRecvTotal" : "maxRecvCount",
                   .capacity = t->compact ? DYN_NO_CAPACITY : t->maxRecv,
                   .peers = t->peers,
                   .place = t->compact ? placePacked : placePerPeer,
                   .ctx = t};
  return dynExchangeRun(&x);
}

static ncclxResult_t a2avRun(void* arg) {
  a2avTask* t = arg;
  /* The counts are valid now (they may have been produced by an earlier stream task). */
  size_t count = 0;
  for (int p = 0; p < t->nranks; p++) count += t->sendcounts[p];
  dynOpInfo info = {.sendbuff = t->sendbuff,
                    .recvbuff = t->recvbuff,
                    .count = count,
                    .bytes = count * t->elemBytes,
                    .datatype = t->datatype,
                    .stream = t->stream};
  return dynExecOp(t->comm, t->compact ? "alltoallv_dynamic_compact" : "alltoallv_dynamic", a2avExec, t, &info);
}

static ncclxResult_t a2avSubmit(const char* fn, const void* sendbuff, const size_t* sendcounts, void* recvbuff,
                                size_t maxRecv, size_t* recvcounts, size_t* rdispls, ncclxDataType_t datatype,
                                ncclxComm_t comm, ncclxStream_t stream, int compact) {
  NCCLX_CHECK(moeCore->checkCall(comm, stream, fn));
  NCCLX_CHECK(dynCheckNotGrouped(comm, fn));
  if ((unsigned)datatype >= ncclxNumTypes)
    return moeCore->argError(comm, ncclxInvalidArgument, "%s: invalid datatype %d", fn, (int)datatype);
  if (!sendcounts || !recvcounts || (compact && !rdispls))
    return moeCore->argError(comm, ncclxInvalidArgument, "%s: %s is NULL", fn,
                       !sendcounts   ? "sendcounts"
                       : !recvcounts ? "recvcounts"
                                     : "rdispls");
  ncclxModuleCommInfo_v1_t info;
  moeCore->commInfo(comm, &info);
  size_t n = (size_t)info.nranks, sz = moeCore->typeSize(datatype);
  size_t slots = compact ? 1 : n;
  if (maxRecv > 0 && maxRecv > ((SIZE_MAX / 2) / sz) / slots)
    return moeCore->argError(comm, ncclxInvalidArgument, "%s: %s %zu is too large", fn,
                       compact ? "maxRecvTotal" : "maxRecvCount", maxRecv);
  if (maxRecv > 0 && !recvbuff)
    return moeCore->argError(comm, ncclxInvalidArgument, "%s: recvbuff is NULL with %s %zu", fn,
                       compact ? "maxRecvTotal" : "maxRecvCount", maxRecv);
  if (sendbuff && moeRangesOverlap(sendbuff, 1, recvbuff, maxRecv * slots * sz))
    return moeCore->argError(comm, ncclxInvalidArgument,
                       "%s: sendbuff lies inside recvbuff (in place is not supported)", fn);
  /* Device memory or a CUDA-ordered stream: the GPU path's (alltoallv_dynamic_dev.c). */
  int gpuTaken = 0;
  ncclxResult_t gpuRes = dynDeviceSubmit(fn, sendbuff, sendcounts, recvbuff, maxRecv, recvcounts, rdispls,
                                              datatype, comm, stream, compact, &gpuTaken);
  if (gpuTaken || gpuRes != ncclxSuccess) return gpuRes;
  /* One allocation: the task and its per-peer arrays. */
  size_t bytes = sizeof(a2avTask) + n * (sizeof(dynPeer) + 2 * sizeof(uint64_t) + 2 * sizeof(char*));
  a2avTask* t = calloc(1, bytes);
  if (!t) return moeCore->argError(comm, ncclxSystemError, "%s: out of memory", fn);
  t->peers = (dynPeer*)(t + 1);
  t->sendSegs = (uint64_t*)(t->peers + n);
  t->recvSegs = t->sendSegs + n;
  t->recvDst = (char**)(t->recvSegs + n);
  t->sendPtrs = (const char**)(t->recvDst + n);
  for (size_t p = 0; p < n; p++) {
    t->peers[p] = (dynPeer){.sendPtr = &t->sendPtrs[p],
                            .sendSegs = &t->sendSegs[p],
                            .nSendSeg = 1,
                            .nRecvSeg = 1,
                            .recvSegs = &t->recvSegs[p],
                            .recvDst = &t->recvDst[p]};
  }
  t->comm = comm;
  t->nranks = (int)n;
  t->sendbuff = sendbuff;
  t->sendcounts = sendcounts;
  t->recvbuff = recvbuff;
  t->maxRecv = maxRecv;
  t->recvcounts = recvcounts;
  t->rdispls = rdispls;
  t->elemBytes = sz;
  t->datatype = datatype;
  t->stream = stream;
  t->compact = compact;
  return moeCore->enqueue(comm, stream, a2avRun, free, t);
}

ncclxResult_t moeAllToAllvDynamic(const void* sendbuff, const size_t* sendcounts, void* recvbuff,
                                        size_t maxRecvCount, size_t* recvcounts, ncclxDataType_t datatype,
                                        ncclxComm_t comm, ncclxStream_t stream) {
  return a2avSubmit("ncclxAllToAllvDynamic", sendbuff, sendcounts, recvbuff, maxRecvCount, recvcounts, NULL,
                    datatype, comm, stream, 0);
}

ncclxResult_t moeAllToAllvDynamicCompact(const void* sendbuff, const size_t* sendcounts, void* recvbuff,
                                               size_t maxRecvTotal, size_t* recvcounts, size_t* rdispls,
                                               ncclxDataType_t datatype, ncclxComm_t comm,
                                               ncclxStream_t stream) {
  return a2avSubmit("ncclxAllToAllvDynamicCompact", sendbuff, sendcounts, recvbuff, maxRecvTotal, recvcounts,
                    rdispls, datatype, comm, stream, 1);
}
