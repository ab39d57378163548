/* CommFuse's calls (ncclx/fuse.h; libncclx forwards them here): validate, then run now
 * (stream NULL) or queue on a stream. The core's operation envelope holds the communicator
 * for the whole fused operation; a progress helper is lent to the schedules that overlap. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "commfuse_internal.h"
#include "commfuse_trace.h"

static const char* const algoNames[ncclxFuseNumAlgos] = {
    [ncclxFuseSequential] = "sequential",
    [ncclxFuseSliced] = "sliced",
    [ncclxFuseRingP2P] = "ring_p2p",
    [ncclxFuseDirectP2P] = "direct_p2p",
    [ncclxFuseAuto] = "auto",
};

/* ncclxFuseAlgoName's table: the module may not call into libncclx (ncclx/module.h). */
const char* fuseAlgoName(ncclxFuseAlgo_t algo) {
  return (unsigned)algo < ncclxFuseNumAlgos ? algoNames[algo] : "unknown";
}

ncclxResult_t fuseLastSchedule(ncclxComm_t comm, ncclxFuseSchedule_t* schedule) {
  NCCLX_CHECK(fuseCore->checkCall(comm, NULL, "ncclxFuseLastSchedule"));
  if (!schedule) return fuseCore->argError(comm, ncclxInvalidArgument, "ncclxFuseLastSchedule: schedule is NULL");
  const struct fuseCommState* cs = fuseCore->getState(comm, fuseSlot);
  int last = cs ? cs->lastSchedule : -1; /* a queued fused call may be running: one atomic read */
  if (last < 0)
    return fuseCore->argError(comm, ncclxInvalidUsage, "ncclxFuseLastSchedule: no fused call has run on this communicator");
  *schedule = (ncclxFuseSchedule_t){(ncclxFuseAlgo_t)(last >> 16), last & 0xffff, 0, 0.0};
  return ncclxSuccess;
}

int fuseSchedulePieces(ncclxFuseSchedule_t schedule, size_t count, ncclxDataType_t datatype, int nranks) {
  if ((unsigned)datatype >= ncclxNumTypes || count == 0) return 1;
  size_t unit = schedule.unit ? schedule.unit : 1, units = count / unit;
  if (schedule.algo == ncclxFuseRingP2P && schedule.slices == 0)
    return fuseAutoPieces(count, fuseCore->typeSize(datatype), unit, nranks);
  if ((schedule.algo != ncclxFuseRingP2P && schedule.algo != ncclxFuseSliced) || schedule.slices < 1) return 1;
  size_t k = (size_t)schedule.slices;
  if (k > units) k = units;
  return k ? (int)k : 1;
}

/* ---------------- validation ---------------- */

static ncclxResult_t checkSchedule(ncclxComm_t comm, ncclxFuseSchedule_t* s, size_t count,
                                   const char* fn) {
  if ((unsigned)s->algo >= ncclxFuseNumAlgos)
    return fuseCore->argError(comm, ncclxInvalidArgument, "%s: invalid schedule algorithm %d", fn, (int)s->algo);
  if (s->algo == ncclxFuseSliced && s->slices < 1)
    return fuseCore->argError(comm, ncclxInvalidArgument, "%s: SLICED needs slices >= 1, not %d", fn, s->slices);
  if (s->algo == ncclxFuseRingP2P && s->slices < 0)
    return fuseCore->argError(comm, ncclxInvalidArgument, "%s: RING_P2P needs pieces (slices) >= 1, or 0 for automatic, not %d",
                        fn, s->slices);
  if (s->algo == ncclxFuseAuto) s->slices = 0;
  else if (s->algo != ncclxFuseSliced && s->algo != ncclxFuseRingP2P) s->slices = 1;
  if (s->unit == 0) s->unit = 1;
  if (count % s->unit != 0)
    return fuseCore->argError(comm, ncclxInvalidArgument, "%s: count %zu is not a multiple of the schedule's unit %zu", fn, count,
                    s->unit);
  if (!(s->linkBytesPerSec >= 0) || (s->linkBytesPerSec > 0 && s->linkBytesPerSec < 1e3))
    return fuseCore->argError(comm, ncclxInvalidArgument, "%s: linkBytesPerSec %g must be 0 (off) or at least 1000", fn,
                    s->linkBytesPerSec);
  return ncclxSuccess;
}

static ncclxResult_t checkCommon(ncclxComm_t comm, int nranks, ncclxDataType_t type, size_t count,
                                 int haveCallback, void* recvbuff, const char* fn) {
  if ((unsigned)type >= ncclxNumTypes) return fuseCore->argError(comm, ncclxInvalidArgument, "%s: invalid datatype %d", fn, (int)type);
  if (!haveCallback) return fuseCore->argError(comm, ncclxInvalidArgument, "%s: the callback is NULL", fn);
  size_t n = (size_t)nranks, size = fuseCore->typeSize(type);
  if (count > 0 && (n > SIZE_MAX / count || count * n > (SIZE_MAX / 8) / size))
    return fuseCore->argError(comm, ncclxInvalidArgument, "%s: count %zu is too large", fn, count);
  if (count > 0 && !recvbuff) return fuseCore->argError(comm, ncclxInvalidArgument, "%s: recvbuff is NULL with count %zu", fn, count);
  return ncclxSuccess;
}

/* ---------------- execution ---------------- */

/* RING_P2P and SLICED all-gather and reduce-scatter progress on the computing thread
 * (flows); the all-to-all and DIRECT_P2P hand steps to a helper. */
static int needsHelper(const fuseOp* f) {
  if (f->info.nranks < 2 || f->count == 0) return 0;
  switch (f->sched.algo) {
    case ncclxFuseRingP2P: return f->kind == FUSE_A2A;
    case ncclxFuseDirectP2P: return 1;
    case ncclxFuseSliced: return f->kind == FUSE_A2A && fuseSliceCount(f) > 1;
    default: return 0;
  }
}

/* AUTO measures the callbacks: the caller's run behind these, on the executing thread
 * (monotonic time: a thread CPU clock costs a system call per read, microseconds in a VM). */

static int timedConsume(void* user, int src, size_t off, const void* data, size_t count) {
  fuseOp* f = user;
  double t0 = fuseNow();
  int rc = f->userConsume(f->userData, src, off, data, count);
  f->computeSec += fuseNow() - t0;
  return rc;
}

static int timedProduce(void* user, int dst, size_t off, void* out, size_t count) {
  fuseOp* f = user;
  double t0 = fuseNow();
  int rc = f->userProduce(f->userData, dst, off, out, count);
  f->computeSec += fuseNow() - t0;
  return rc;
}

static void timeCallbacks(fuseOp* f) {
  f->userConsume = f->consume;
  f->userProduce = f->produce;
  f->userData = f->user;
  if (f->consume) f->consume = timedConsume;
  if (f->produce) f->produce = timedProduce;
  f->user = f;
}

/* The operation as the core runs it: reported to the profiler as the all-gather, reduce-scatter
 * or all-to-all it is, its messages signed with its kind and block size. */
static ncclxModuleOp_v1_t opOf(const fuseOp* f, ncclxStream_t stream) {
  static const ncclxCollType_t colls[] = {[FUSE_AG] = NCCLX_COLL_ALLGATHER, [FUSE_RS] = NCCLX_COLL_REDUCESCATTER,
                                          [FUSE_A2A] = NCCLX_COLL_ALLTOALL};
  int pairwise = f->sched.algo == ncclxFuseDirectP2P || f->kind == FUSE_A2A;
  return (ncclxModuleOp_v1_t){.name = f->name, .path = "CommFuse", .callKind = (int)f->kind,
                              .bytesPerRank = f->count * f->typeSize, .profColl = colls[f->kind],
                              .profAlgo = pairwise ? NCCLX_ALGO_PAIRWISE : NCCLX_ALGO_RING,
                              .sendbuff = f->sendbuff, .recvbuff = f->recvbuff, .count = f->count,
                              .datatype = f->type, .op = f->kind == FUSE_RS ? f->op : ncclxSum, .stream = stream};
}

static ncclxResult_t fuseExec(fuseOp* f, ncclxStream_t stream) {
  ncclxComm_t comm = f->comm;
  fuseCore->logSetRank(f->info.rank);
  ncclxModuleOp_v1_t op = opOf(f, stream);
  ncclxModuleOpCtx_v1_t ctx;
  NCCLX_CHECK(fuseCore->opBegin(comm, &op, &ctx));
  f->seq = ctx.seq;
  struct fuseCommState* cs = fuseCommState(comm);
  ncclxResult_t res = cs ? ncclxSuccess
                         : fuseCore->fail(comm, ncclxSystemError, "%s #%llu: out of memory", f->name,
                                          (unsigned long long)f->seq);
  fuseAutoResolve(f); /* AUTO: this shape's schedule, before anything reads f->sched */
  if (f->autoShape) timeCallbacks(f);
  FUSE_INFO(NCCLX_LOG_COLL, "%s #%llu: count %zu %s schedule %s(%d) comm %s nranks %d", f->name,
            (unsigned long long)f->seq, f->count, fuseCore->typeName(f->type), fuseAlgoName(f->sched.algo),
            f->sched.slices, f->info.name, f->info.nranks);
  f->helper = NULL;
  if (res == ncclxSuccess && needsHelper(f) && fuseHelperAcquire(&f->helper) != ncclxSuccess)
    res = fuseCore->fail(comm, ncclxSystemError, "%s #%llu: %s", f->name, (unsigned long long)f->seq,
                         fuseCore->lastError());
  FUSE_TRACE("op.start", f->sched.algo, f->sched.slices);
  f->linkEnd = NULL;
  if (res == ncclxSuccess && f->sched.linkBytesPerSec > 0 &&
      !(f->linkEnd = calloc((size_t)f->info.nranks, sizeof(double))))
    res = fuseCore->fail(comm, ncclxSystemError, "%s #%llu: out of memory", f->name, (unsigned long long)f->seq);
  if (res == ncclxSuccess && f->count > 0)
    res = f->kind == FUSE_AG ? fuseAllGather(f) : f->kind == FUSE_RS ? fuseReduceScatter(f) : fuseAllToAll(f);
  res = fuseAutoRecord(f, res);
  if (cs) cs->lastSchedule = (int)f->sched.algo << 16 | (f->sched.slices & 0xffff);
  if (fuseHelperBusy(f->helper)) { /* only after an error path that left it running */
    fuseCore->abort(comm);
    (void)fuseHelperWait(f->helper, 0, NULL, 0);
  }
  fuseHelperRelease(f->helper);
  f->helper = NULL;
  free(f->linkEnd);
  f->linkEnd = NULL;
  FUSE_TRACE("op.end", 0, 0);
  FUSE_TRACE_DUMP(f->info.rank, f->name, f->sched.algo, f->sched.slices);
  fuseCore->opEnd(comm, &ctx, res);
  return res;
}

/* ---------------- streams ---------------- */

struct fuseTask {
  fuseOp op;
  ncclxStream_t stream;
};

static ncclxResult_t fuseTaskRun(void* arg) {
  struct fuseTask* t = arg;
  return fuseExec(&t->op, t->stream);
}

static ncclxResult_t submit(const fuseOp* f, ncclxStream_t stream) {
  if (!stream) {
    fuseOp op = *f;
    return fuseExec(&op, NULL);
  }
  struct fuseTask* t = calloc(1, sizeof(*t));
  if (!t) return fuseCore->setError(ncclxSystemError, "%s: out of memory queueing the call", f->name);
  t->op = *f;
  t->stream = stream;
  ncclxResult_t res = fuseCore->enqueue(f->comm, stream, fuseTaskRun, free, t);
  return res;
}

/* ---------------- public calls ---------------- */

ncclxResult_t fuseAllGatherCompute(const void* sendbuff, void* recvbuff, size_t sendcount,
                                        ncclxDataType_t datatype, ncclxFuseConsumeFn consume,
                                        void* user, ncclxFuseSchedule_t schedule, ncclxComm_t comm,
                                        ncclxStream_t stream) {
  const char* fn = "ncclxAllGatherCompute";
  NCCLX_CHECK(fuseCore->checkCall(comm, stream, fn));
  ncclxModuleCommInfo_v1_t info;
  fuseCore->commInfo(comm, &info);
  NCCLX_CHECK(checkCommon(comm, info.nranks, datatype, sendcount, consume != NULL, recvbuff, fn));
  if (sendcount > 0 && !sendbuff) return fuseCore->argError(comm, ncclxInvalidArgument, "%s: sendbuff is NULL with count %zu", fn, sendcount);
  NCCLX_CHECK(checkSchedule(comm, &schedule, sendcount, fn));
  fuseOp f = {.comm = comm, .info = info, .kind = FUSE_AG, .name = "allgather-compute", .sched = schedule, .type = datatype,
              .typeSize = fuseCore->typeSize(datatype), .count = sendcount, .sendbuff = sendbuff,
              .recvbuff = recvbuff, .consume = consume, .op = ncclxSum, .user = user};
  return submit(&f, stream);
}

ncclxResult_t fuseComputeReduceScatter(ncclxFuseProduceFn produce, void* user, void* recvbuff,
                                            size_t recvcount, ncclxDataType_t datatype,
                                            ncclxRedOp_t op, ncclxFuseSchedule_t schedule,
                                            ncclxComm_t comm, ncclxStream_t stream) {
  const char* fn = "ncclxComputeReduceScatter";
  NCCLX_CHECK(fuseCore->checkCall(comm, stream, fn));
  ncclxModuleCommInfo_v1_t info;
  fuseCore->commInfo(comm, &info);
  NCCLX_CHECK(checkCommon(comm, info.nranks, datatype, recvcount, produce != NULL, recvbuff, fn));
  if ((unsigned)op >= ncclxNumOps) return fuseCore->argError(comm, ncclxInvalidArgument, "%s: invalid reduction op %d", fn, (int)op);
  NCCLX_CHECK(checkSchedule(comm, &schedule, recvcount, fn));
  fuseOp f = {.comm = comm, .info = info, .kind = FUSE_RS, .name = "compute-reducescatter", .sched = schedule, .type = datatype,
              .typeSize = fuseCore->typeSize(datatype), .count = recvcount, .recvbuff = recvbuff,
              .produce = produce, .op = op, .user = user};
  return submit(&f, stream);
}

ncclxResult_t fuseAllToAllCompute(ncclxFuseProduceFn produce, ncclxFuseConsumeFn consume,
                                       void* user, void* recvbuff, size_t count,
                                       ncclxDataType_t datatype, ncclxFuseSchedule_t schedule,
                                       ncclxComm_t comm, ncclxStream_t stream) {
  const char* fn = "ncclxAllToAllCompute";
  NCCLX_CHECK(fuseCore->checkCall(comm, stream, fn));
  ncclxModuleCommInfo_v1_t info;
  fuseCore->commInfo(comm, &info);
  NCCLX_CHECK(checkCommon(comm, info.nranks, datatype, count, produce != NULL, recvbuff, fn));
  NCCLX_CHECK(checkSchedule(comm, &schedule, count, fn));
  fuseOp f = {.comm = comm, .info = info, .kind = FUSE_A2A, .name = "alltoall-compute", .sched = schedule,
              .type = datatype, .typeSize = fuseCore->typeSize(datatype), .count = count,
              .recvbuff = recvbuff, .produce = produce, .consume = consume, .op = ncclxSum,
              .user = user};
  return submit(&f, stream);
}
