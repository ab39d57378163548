/* The AllToAllvDynamic operations: execution under the communicator's lock (dynExecOp, for the
 * MoE helpers too), the group rule, and the public ncclxAllToAllvDynamic[Compact]. The
 * exchange itself is alltoallv_dynamic.c's engine. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coll/coll.h"
#include "gpu/gpu.h"
#include "moe/alltoallv_dynamic.h"
#include "ncclx/moe.h"
#include "prof/prof.h"
#include "sched/stream.h"
#include "util/debug.h"

#define API __attribute__((visibility("default")))

static unsigned long long opSeq(const struct ncclxComm* comm) { return (unsigned long long)comm->curOpSeq; }

/* ---------------- execution under the comm's lock ---------------- */

/* A COLL event with our own op name (profCollStart names only the core's collectives). */
static void* profDynStart(struct ncclxComm* comm, const char* name, uint64_t seq, const dynOpInfo* info) {
  if (!profEnabled(comm, NCCLX_PROFILE_COLL | NCCLX_PROFILE_STEP)) return NULL;
  ncclxProfilerEventDescr_v1_t d;
  memset(&d, 0, sizeof(d));
  d.type = NCCLX_PROFILE_COLL;
  d.rank = comm->rank;
  d.coll.seq = seq;
  d.coll.func = name;
  d.coll.sendbuff = info->sendbuff;
  d.coll.recvbuff = info->recvbuff;
  d.coll.count = info->count;
  d.coll.bytes = info->bytes;
  d.coll.root = -1;
  d.coll.datatype = ncclxTypeName(info->datatype);
  d.coll.algo = "dynamic";
  d.coll.proto = "simple";
  d.coll.stream = info->stream;
  void* handle = NULL;
  if (comm->profiler->startEvent(comm->profilerCtx, &handle, &d) != ncclxSuccess) return NULL;
  return handle;
}

ncclxResult_t dynExecOp(struct ncclxComm* comm, const char* name,
                        ncclxResult_t (*fn)(struct ncclxComm* comm, void* arg), void* arg,
                        const dynOpInfo* info) {
  ncclxLogSetRank(comm->rank);
  pthread_mutex_lock(&comm->execLock);
  ncclxResult_t res =
      atomic_load(&comm->destroyed)
          ? ncclxSetError(ncclxInvalidUsage, "%s: communicator was destroyed before the queued call ran", name)
          : commCheckHealthy(comm);
  if (res == ncclxSuccess) {
    uint64_t seq = ++comm->collSeq;
    comm->curOpName = name;
    comm->curOpSeq = seq;
    comm->curAlgo = comm->curProto = -1, comm->curPathText = NULL;
    INFO(NCCLX_LOG_COLL, "%s #%llu: %zu %s (%zu bytes) to send, comm %s nranks %d", name,
         (unsigned long long)seq, info->count, ncclxTypeName(info->datatype), info->bytes, comm->name,
         comm->nranks);
    void* ev = profDynStart(comm, name, seq, info);
    comm->curProfEvent = ev;
    res = fn(comm, arg);
    if (res != ncclxSuccess) profFailed(comm, ev, res, ncclxThreadLastError());
    profStop(comm, ev);
    comm->curProfEvent = NULL;
    comm->curOpName = NULL;
  }
  pthread_mutex_unlock(&comm->execLock);
  return res;
}

/* ---------------- groups ---------------- */

int dynInGroup(void) { return enqueueGroupDepth() > 0; }

/* Dynamic calls are not grouped: a group runs its operations at ncclxGroupEnd with every
 * size known at call time, while ours learn their sizes when they execute. Refusing keeps
 * the order of operations the one the caller wrote. */
ncclxResult_t dynCheckNotGrouped(struct ncclxComm* comm, const char* fn) {
  if (!dynInGroup()) return ncclxSuccess;
  return commArgError(comm, ncclxInvalidUsage,
                      "%s: cannot be called between ncclxGroupStart and ncclxGroupEnd (its counts are "
                      "read when it executes); call it outside the group, on the same stream",
                      fn);
}

/* ---------------- the public all-to-all ---------------- */

typedef struct {
  ncclxTask base;
  struct ncclxComm* comm;
  const char* sendbuff;
  const size_t* sendcounts;
  char* recvbuff;
  size_t maxRecv; /* per peer, or in total (compact) */
  size_t* recvcounts;
  size_t* rdispls; /* compact only */
  size_t elemBytes;
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
             commDescribeRank(x->comm, peer, who, sizeof(who)), (unsigned long long)count, x->comm->rank,
             t->maxRecv);
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
  while (t->nextPeer < x->comm->nranks && x->peers[t->nextPeer].hdrKnown) {
    int q = t->nextPeer;
    uint64_t count = x->peers[q].recvSegs[0];
    if (count > t->maxRecv - t->placedSum) {
      char who[128];
      snprintf(x->why, sizeof(x->why),
               "%s sends %llu elements to rank %d, which has room for only %llu more: its maxRecvTotal "
               "is %zu and ranks before %d sent %llu",
               commDescribeRank(x->comm, q, who, sizeof(who)), (unsigned long long)count, x->comm->rank,
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

static ncclxResult_t a2avExec(struct ncclxComm* comm, void* arg) {
  a2avTask* t = arg;
  int n = comm->nranks;
  const char* fn = t->compact ? "ncclxAllToAllvDynamicCompact" : "ncclxAllToAllvDynamic";
  /* The counts are the caller's at this moment: check them now (failures here must reach
   * the peers, which are already waiting for our headers: commFail). */
  uint64_t sum = 0, limit = (SIZE_MAX / 2) / t->elemBytes;
  for (int p = 0; p < n; p++) {
    size_t c = t->sendcounts[p];
    if (c > limit - sum)
      return commFail(comm, ncclxInvalidArgument,
                      "%s #%llu: sendcounts[%d] = %zu: the send counts add up to "
                      "more than fits in memory",
                      fn, opSeq(comm), p, c);
    t->sendSegs[p] = c;
    t->sendPtrs[p] = t->sendbuff ? t->sendbuff + sum * t->elemBytes : NULL;
    sum += c;
  }
  if (sum > 0 && !t->sendbuff)
    return commFail(comm, ncclxInvalidArgument, "%s #%llu: sendbuff is NULL but the send counts add up to %llu",
                    fn, opSeq(comm), (unsigned long long)sum);
  size_t recvBytes = (t->compact ? t->maxRecv : t->maxRecv * (size_t)n) * t->elemBytes;
  if (collRangesOverlap(t->sendbuff, (size_t)sum * t->elemBytes, t->recvbuff, recvBytes))
    return commFail(comm, ncclxInvalidArgument,
                    "%s #%llu: sendbuff and recvbuff overlap (in place is not supported)", fn, opSeq(comm));
  t->nextPeer = 0;
  t->placedSum = 0;
  dynExchange x = {.comm = comm,
                   .unitBytes = t->elemBytes,
                   .unitName = "elements",
                   .capName = t->compact ? "maxRecvTotal" : "maxRecvCount",
                   .capacity = t->compact ? DYN_NO_CAPACITY : t->maxRecv,
                   .peers = t->peers,
                   .place = t->compact ? placePacked : placePerPeer,
                   .ctx = t};
  return dynExchangeRun(&x);
}

static ncclxResult_t a2avRun(ncclxTask* task) {
  a2avTask* t = (a2avTask*)task;
  /* The counts are valid now (they may have been produced by an earlier stream task). */
  size_t count = 0;
  for (int p = 0; p < t->comm->nranks; p++) count += t->sendcounts[p];
  dynOpInfo info = {.sendbuff = t->sendbuff,
                    .recvbuff = t->recvbuff,
                    .count = count,
                    .bytes = count * t->elemBytes,
                    .datatype = t->datatype,
                    .stream = t->stream};
  return dynExecOp(t->comm, t->compact ? "alltoallv_dynamic_compact" : "alltoallv_dynamic", a2avExec, t, &info);
}

static void a2avRelease(ncclxTask* task) {
  a2avTask* t = (a2avTask*)task;
  commRelease(t->comm);
  free(t);
}

static ncclxResult_t a2avSubmit(const char* fn, const void* sendbuff, const size_t* sendcounts, void* recvbuff,
                                size_t maxRecv, size_t* recvcounts, size_t* rdispls, ncclxDataType_t datatype,
                                ncclxComm_t comm, ncclxStream_t stream, int compact) {
  NCCLX_CHECK(commCheckCall(comm, stream, fn));
  NCCLX_CHECK(dynCheckNotGrouped(comm, fn));
  if ((unsigned)datatype >= ncclxNumTypes)
    return commArgError(comm, ncclxInvalidArgument, "%s: invalid datatype %d", fn, (int)datatype);
  if (!sendcounts || !recvcounts || (compact && !rdispls))
    return commArgError(comm, ncclxInvalidArgument, "%s: %s is NULL", fn,
                       !sendcounts   ? "sendcounts"
                       : !recvcounts ? "recvcounts"
                                     : "rdispls");
  size_t n = (size_t)comm->nranks, sz = ncclxTypeSize(datatype);
  size_t slots = compact ? 1 : n;
  if (maxRecv > 0 && maxRecv > ((SIZE_MAX / 2) / sz) / slots)
    return commArgError(comm, ncclxInvalidArgument, "%s: %s %zu is too large", fn,
                       compact ? "maxRecvTotal" : "maxRecvCount", maxRecv);
  if (maxRecv > 0 && !recvbuff)
    return commArgError(comm, ncclxInvalidArgument, "%s: recvbuff is NULL with %s %zu", fn,
                       compact ? "maxRecvTotal" : "maxRecvCount", maxRecv);
  if (sendbuff && collRangesOverlap(sendbuff, 1, recvbuff, maxRecv * slots * sz))
    return commArgError(comm, ncclxInvalidArgument,
                       "%s: sendbuff lies inside recvbuff (in place is not supported)", fn);
  /* Device memory or a CUDA-ordered stream: the GPU path's (alltoallv_dynamic_dev.c). */
  int gpuTaken = 0;
  ncclxResult_t gpuRes = gpuA2avDynamicSubmit(fn, sendbuff, sendcounts, recvbuff, maxRecv, recvcounts, rdispls,
                                              datatype, comm, stream, compact, &gpuTaken);
  if (gpuTaken || gpuRes != ncclxSuccess) return gpuRes;
  /* One allocation: the task and its per-peer arrays. */
  size_t bytes = sizeof(a2avTask) + n * (sizeof(dynPeer) + 2 * sizeof(uint64_t) + 2 * sizeof(char*));
  a2avTask* t = calloc(1, bytes);
  if (!t) return commArgError(comm, ncclxSystemError, "%s: out of memory", fn);
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
  t->base.run = a2avRun;
  t->base.release = a2avRelease;
  t->comm = comm;
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
  commRetain(comm);
  return streamEnqueue(stream, &t->base);
}

API ncclxResult_t ncclxAllToAllvDynamic(const void* sendbuff, const size_t* sendcounts, void* recvbuff,
                                        size_t maxRecvCount, size_t* recvcounts, ncclxDataType_t datatype,
                                        ncclxComm_t comm, ncclxStream_t stream) {
  return a2avSubmit("ncclxAllToAllvDynamic", sendbuff, sendcounts, recvbuff, maxRecvCount, recvcounts, NULL,
                    datatype, comm, stream, 0);
}

API ncclxResult_t ncclxAllToAllvDynamicCompact(const void* sendbuff, const size_t* sendcounts, void* recvbuff,
                                               size_t maxRecvTotal, size_t* recvcounts, size_t* rdispls,
                                               ncclxDataType_t datatype, ncclxComm_t comm,
                                               ncclxStream_t stream) {
  return a2avSubmit("ncclxAllToAllvDynamicCompact", sendbuff, sendcounts, recvbuff, maxRecvTotal, recvcounts,
                    rdispls, datatype, comm, stream, 1);
}
