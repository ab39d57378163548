/* CommFuse public calls (ncclx/fuse.h): validate, then run now (stream NULL) or queue on a
 * stream; execution holds the communicator's execLock for the whole fused operation, lends
 * a progress helper to the schedules that overlap, and reports to the profiler as the
 * all-gather or reduce-scatter it is. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "commfuse_internal.h"
#include "commfuse_trace.h"
#include "debug.h"
#include "prof.h"
#include "stream.h"

#define API __attribute__((visibility("default")))

static const char* const algoNames[ncclxFuseNumAlgos] = {
    [ncclxFuseSequential] = "sequential",
    [ncclxFuseSliced] = "sliced",
    [ncclxFuseRingP2P] = "ring_p2p",
    [ncclxFuseDirectP2P] = "direct_p2p",
    [ncclxFuseAuto] = "auto",
};

API const char* ncclxFuseAlgoName(ncclxFuseAlgo_t algo) {
  return (unsigned)algo < ncclxFuseNumAlgos ? algoNames[algo] : "unknown";
}

API ncclxResult_t ncclxFuseLastSchedule(ncclxComm_t comm, ncclxFuseSchedule_t* schedule) {
  NCCLX_CHECK(commCheckHandle(comm));
  if (!schedule) return commArgError(comm, ncclxInvalidArgument, "ncclxFuseLastSchedule: schedule is NULL");
  int ref = commExecLock(comm); /* a queued fused call may be running */
  int algo = comm->lastFuseAlgo, slices = comm->lastFuseSlices;
  commExecUnlock(comm, ref);
  if (algo < 0) return commArgError(comm, ncclxInvalidUsage, "ncclxFuseLastSchedule: no fused call has run on this communicator");
  *schedule = (ncclxFuseSchedule_t){(ncclxFuseAlgo_t)algo, slices, 0, 0.0};
  return ncclxSuccess;
}

API int ncclxFuseSchedulePieces(ncclxFuseSchedule_t schedule, size_t count, ncclxDataType_t datatype,
                                int nranks) {
  if ((unsigned)datatype >= ncclxNumTypes || count == 0) return 1;
  size_t unit = schedule.unit ? schedule.unit : 1, units = count / unit;
  if (schedule.algo == ncclxFuseRingP2P && schedule.slices == 0)
    return fuseAutoPieces(count, ncclxTypeSize(datatype), unit, nranks);
  if ((schedule.algo != ncclxFuseRingP2P && schedule.algo != ncclxFuseSliced) || schedule.slices < 1) return 1;
  size_t k = (size_t)schedule.slices;
  if (k > units) k = units;
  return k ? (int)k : 1;
}

/* ---------------- validation ---------------- */

static ncclxResult_t checkSchedule(struct ncclxComm* comm, ncclxFuseSchedule_t* s, size_t count,
                                   const char* fn) {
  if ((unsigned)s->algo >= ncclxFuseNumAlgos)
    return commArgError(comm, ncclxInvalidArgument, "%s: invalid schedule algorithm %d", fn, (int)s->algo);
  if (s->algo == ncclxFuseSliced && s->slices < 1)
    return commArgError(comm, ncclxInvalidArgument, "%s: SLICED needs slices >= 1, not %d", fn, s->slices);
  if (s->algo == ncclxFuseRingP2P && s->slices < 0)
    return commArgError(comm, ncclxInvalidArgument, "%s: RING_P2P needs pieces (slices) >= 1, or 0 for automatic, not %d",
                        fn, s->slices);
  if (s->algo == ncclxFuseAuto) s->slices = 0;
  else if (s->algo != ncclxFuseSliced && s->algo != ncclxFuseRingP2P) s->slices = 1;
  if (s->unit == 0) s->unit = 1;
  if (count % s->unit != 0)
    return commArgError(comm, ncclxInvalidArgument, "%s: count %zu is not a multiple of the schedule's unit %zu", fn, count,
                    s->unit);
  if (!(s->linkBytesPerSec >= 0) || (s->linkBytesPerSec > 0 && s->linkBytesPerSec < 1e3))
    return commArgError(comm, ncclxInvalidArgument, "%s: linkBytesPerSec %g must be 0 (off) or at least 1000", fn,
                    s->linkBytesPerSec);
  return ncclxSuccess;
}

static ncclxResult_t checkCommon(struct ncclxComm* comm, ncclxDataType_t type, size_t count,
                                 int haveCallback, void* recvbuff, const char* fn) {
  if ((unsigned)type >= ncclxNumTypes) return commArgError(comm, ncclxInvalidArgument, "%s: invalid datatype %d", fn, (int)type);
  if (!haveCallback) return commArgError(comm, ncclxInvalidArgument, "%s: the callback is NULL", fn);
  size_t n = (size_t)comm->nranks, size = ncclxTypeSize(type);
  if (count > 0 && (n > SIZE_MAX / count || count * n > (SIZE_MAX / 8) / size))
    return commArgError(comm, ncclxInvalidArgument, "%s: count %zu is too large", fn, count);
  if (count > 0 && !recvbuff) return commArgError(comm, ncclxInvalidArgument, "%s: recvbuff is NULL with count %zu", fn, count);
  return ncclxSuccess;
}

/* ---------------- execution ---------------- */

/* RING_P2P and SLICED all-gather and reduce-scatter progress on the computing thread
 * (flows); the all-to-all and DIRECT_P2P hand steps to a helper. */
static int needsHelper(const fuseOp* f) {
  if (f->comm->nranks < 2 || f->count == 0) return 0;
  switch (f->sched.algo) {
    case ncclxFuseRingP2P: return f->kind == FUSE_A2A;
    case ncclxFuseDirectP2P: return 1;
    case ncclxFuseSliced: return f->kind == FUSE_A2A && fuseSliceCount(f) > 1;
    default: return 0;
  }
}

static void* profStartFused(fuseOp* f, ncclxStream_t stream) {
  if (!profEnabled(f->comm, NCCLX_PROFILE_COLL | NCCLX_PROFILE_STEP)) return NULL;
  static const int colls[] = {[FUSE_AG] = NCCLX_COLL_ALLGATHER, [FUSE_RS] = NCCLX_COLL_REDUCESCATTER,
                              [FUSE_A2A] = NCCLX_COLL_ALLTOALL};
  int pairwise = f->sched.algo == ncclxFuseDirectP2P || f->kind == FUSE_A2A;
  ncclxCollArgs a = {.coll = colls[f->kind],
                     .sendbuff = f->sendbuff, .recvbuff = f->recvbuff, .count = f->count,
                     .datatype = f->type, .op = f->kind == FUSE_RS ? f->op : ncclxSum, .root = -1,
                     .algo = pairwise ? NCCLX_ALGO_PAIRWISE : NCCLX_ALGO_RING,
                     .proto = NCCLX_PROTO_SIMPLE, .chunkBytes = f->comm->chunkBytes};
  return profCollStart(f->comm, &a, f->seq, stream);
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

static ncclxResult_t fuseExec(fuseOp* f, ncclxStream_t stream) {
  struct ncclxComm* comm = f->comm;
  ncclxLogSetRank(comm->rank);
  int ref = commExecLock(comm); /* a direct call holds no reference of its own */
  ncclxResult_t res = atomic_load(&comm->destroyed)
                          ? ncclxSetError(ncclxInvalidUsage, "%s: communicator was destroyed before the queued call ran",
                                          f->name)
                          : commCheckHealthy(comm);
  if (res == ncclxSuccess) {
    f->seq = ++comm->collSeq; /* every rank makes the same calls: sequences stay in step */
    comm->curOpName = f->name;
    comm->curOpSeq = f->seq;
    snprintf(comm->curPath, sizeof(comm->curPath), "CommFuse");
    fuseAutoResolve(f); /* AUTO: this shape's schedule, before anything reads f->sched */
    if (f->autoShape) timeCallbacks(f);
    INFO(NCCLX_LOG_COLL, "%s #%llu: count %zu %s schedule %s(%d) comm %s nranks %d", f->name,
         (unsigned long long)f->seq, f->count, ncclxTypeName(f->type),
         ncclxFuseAlgoName(f->sched.algo), f->sched.slices, comm->name, comm->nranks);
    void* ev = profStartFused(f, stream);
    comm->curProfEvent = ev;
    f->helper = NULL;
    if (needsHelper(f) && fuseHelperAcquire(&f->helper) != ncclxSuccess)
      res = commFail(comm, ncclxSystemError, "%s #%llu: %s", f->name, (unsigned long long)f->seq,
                     ncclxThreadLastError());
    FUSE_TRACE("op.start", f->sched.algo, f->sched.slices);
    f->linkEnd = NULL;
    if (res == ncclxSuccess && f->sched.linkBytesPerSec > 0 &&
        !(f->linkEnd = calloc((size_t)comm->nranks, sizeof(double))))
      res = commFail(comm, ncclxSystemError, "%s #%llu: out of memory", f->name, (unsigned long long)f->seq);
    xferSetCall(comm, XFER_SIG_FUSE + (int)f->kind, f->count * f->typeSize); /* messages carry it */
    if (res == ncclxSuccess && f->count > 0)
      res = f->kind == FUSE_AG ? fuseAllGather(f) : f->kind == FUSE_RS ? fuseReduceScatter(f) : fuseAllToAll(f);
    res = fuseAutoRecord(f, res);
    comm->lastFuseAlgo = (int)f->sched.algo;
    comm->lastFuseSlices = f->sched.slices;
    if (fuseHelperBusy(f->helper)) { /* only after an error path that left it running */
      atomic_store(&comm->abortFlag, 1);
      (void)fuseHelperWait(f->helper, 0, NULL, 0);
    }
    fuseHelperRelease(f->helper);
    f->helper = NULL;
    xferSetCall(comm, XFER_SIG_P2P, XFER_SIG_PER_TRANSFER);
    free(f->linkEnd);
    f->linkEnd = NULL;
    FUSE_TRACE("op.end", 0, 0);
    FUSE_TRACE_DUMP(comm->rank, f->name, f->sched.algo, f->sched.slices);
    if (res != ncclxSuccess) profFailed(comm, ev, res, ncclxThreadLastError());
    profStop(comm, ev);
    comm->curProfEvent = NULL;
    comm->curOpName = NULL;
  }
  commExecUnlock(comm, ref);
  return res;
}

/* ---------------- streams ---------------- */

struct fuseTask {
  ncclxTask task;
  fuseOp op;
  ncclxStream_t stream;
};

static ncclxResult_t fuseTaskRun(ncclxTask* t) {
  struct fuseTask* ft = (struct fuseTask*)t;
  return fuseExec(&ft->op, ft->stream);
}

static void fuseTaskRelease(ncclxTask* t) {
  struct fuseTask* ft = (struct fuseTask*)t;
  commRelease(ft->op.comm);
  free(ft);
}

static ncclxResult_t submit(const fuseOp* f, ncclxStream_t stream) {
  if (!stream) {
    fuseOp op = *f;
    return fuseExec(&op, NULL);
  }
  struct fuseTask* t = calloc(1, sizeof(*t));
  if (!t) return ncclxSetError(ncclxSystemError, "%s: out of memory queueing the call", f->name);
  t->task.run = fuseTaskRun;
  t->task.release = fuseTaskRelease;
  t->op = *f;
  t->stream = stream;
  commRetain(f->comm);
  return streamEnqueue(stream, &t->task);
}

/* ---------------- public calls ---------------- */

API ncclxResult_t ncclxAllGatherCompute(const void* sendbuff, void* recvbuff, size_t sendcount,
                                        ncclxDataType_t datatype, ncclxFuseConsumeFn consume,
                                        void* user, ncclxFuseSchedule_t schedule, ncclxComm_t comm,
                                        ncclxStream_t stream) {
  const char* fn = "ncclxAllGatherCompute";
  NCCLX_CHECK(commCheckCall(comm, stream, fn));
  NCCLX_CHECK(checkCommon(comm, datatype, sendcount, consume != NULL, recvbuff, fn));
  if (sendcount > 0 && !sendbuff) return commArgError(comm, ncclxInvalidArgument, "%s: sendbuff is NULL with count %zu", fn, sendcount);
  NCCLX_CHECK(checkSchedule(comm, &schedule, sendcount, fn));
  fuseOp f = {.comm = comm, .kind = FUSE_AG, .name = "allgather-compute", .sched = schedule, .type = datatype,
              .typeSize = ncclxTypeSize(datatype), .count = sendcount, .sendbuff = sendbuff,
              .recvbuff = recvbuff, .consume = consume, .op = ncclxSum, .user = user};
  return submit(&f, stream);
}

API ncclxResult_t ncclxComputeReduceScatter(ncclxFuseProduceFn produce, void* user, void* recvbuff,
                                            size_t recvcount, ncclxDataType_t datatype,
                                            ncclxRedOp_t op, ncclxFuseSchedule_t schedule,
                                            ncclxComm_t comm, ncclxStream_t stream) {
  const char* fn = "ncclxComputeReduceScatter";
  NCCLX_CHECK(commCheckCall(comm, stream, fn));
  NCCLX_CHECK(checkCommon(comm, datatype, recvcount, produce != NULL, recvbuff, fn));
  if ((unsigned)op >= ncclxNumOps) return commArgError(comm, ncclxInvalidArgument, "%s: invalid reduction op %d", fn, (int)op);
  NCCLX_CHECK(checkSchedule(comm, &schedule, recvcount, fn));
  fuseOp f = {.comm = comm, .kind = FUSE_RS, .name = "compute-reducescatter", .sched = schedule, .type = datatype,
              .typeSize = ncclxTypeSize(datatype), .count = recvcount, .recvbuff = recvbuff,
              .produce = produce, .op = op, .user = user};
  return submit(&f, stream);
}

API ncclxResult_t ncclxAllToAllCompute(ncclxFuseProduceFn produce, ncclxFuseConsumeFn consume,
                                       void* user, void* recvbuff, size_t count,
                                       ncclxDataType_t datatype, ncclxFuseSchedule_t schedule,
                                       ncclxComm_t comm, ncclxStream_t stream) {
  const char* fn = "ncclxAllToAllCompute";
  NCCLX_CHECK(commCheckCall(comm, stream, fn));
  NCCLX_CHECK(checkCommon(comm, datatype, count, produce != NULL, recvbuff, fn));
  NCCLX_CHECK(checkSchedule(comm, &schedule, count, fn));
  fuseOp f = {.comm = comm, .kind = FUSE_A2A, .name = "alltoall-compute", .sched = schedule,
              .type = datatype, .typeSize = ncclxTypeSize(datatype), .count = count,
              .recvbuff = recvbuff, .produce = produce, .consume = consume, .op = ncclxSum,
              .user = user};
  return submit(&f, stream);
}
