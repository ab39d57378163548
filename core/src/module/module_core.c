/* The core's side of the feature-module ABI (ncclx/module.h): each operation a module may use,
 * on top of the communicator, the progress engine, streams and the profiler. */
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm.h"
#include "config/config.h"
#include "gpu/gpu.h"
#include "module/module.h"
#include "plugin/plugin_loader.h"
#include "prof/prof.h"
#include "sched/enqueue.h"
#include "exec/stream.h"
#include "exec/xfer.h"
#include "transport/peers.h"
#include "tune/tune.h"
#include "tune/tune_model.h"
#include "util/debug.h"
#include "util/reduce.h"

#define TAG_MODULE_BASE 0x6d640000u /* "md": bootstrap tags of modules' out-of-band all-gathers */

/* ---------------- facts, checks, errors ---------------- */

static void commInfo(ncclxComm_t comm, ncclxModuleCommInfo_v1_t* info) {
  *info = (ncclxModuleCommInfo_v1_t){.rank = comm->rank, .nranks = comm->nranks, .nhosts = comm->nhosts,
                                     .timeoutSec = comm->timeoutSec, .chunkBytes = comm->chunkBytes,
                                     .name = comm->name};
}

static ncclxResult_t argError(ncclxComm_t comm, ncclxResult_t res, const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  commArgErrorV(comm, res, fmt, ap);
  va_end(ap);
  return res;
}

static ncclxResult_t fail(ncclxComm_t comm, ncclxResult_t res, const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  commFailV(comm, res, fmt, ap);
  va_end(ap);
  return res;
}

static ncclxResult_t setError(ncclxResult_t res, const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  ncclxSetErrorV(res, fmt, ap);
  va_end(ap);
  return res;
}

static void abortComm(ncclxComm_t comm) { atomic_store(&comm->abortFlag, 1); }
static int aborted(ncclxComm_t comm) { return atomic_load(&comm->abortFlag) != 0; }

/* ---------------- the operation envelope ---------------- */

/* The COLL event of an operation that is none of the collectives, under its own name. */
static void* profOwnStart(ncclxComm_t comm, const ncclxModuleOp_v1_t* op, const ncclxModuleOpEvent_v1_t* event,
                          uint64_t seq) {
  ncclxProfilerEventDescr_v1_t d;
  memset(&d, 0, sizeof(d));
  d.type = NCCLX_PROFILE_COLL;
  d.rank = comm->rank;
  d.coll.seq = seq;
  d.coll.func = event->func;
  d.coll.sendbuff = op->sendbuff;
  d.coll.recvbuff = op->recvbuff;
  d.coll.count = op->count;
  d.coll.bytes = event->bytes;
  d.coll.root = -1;
  d.coll.datatype = ncclxTypeName(op->datatype);
  d.coll.algo = event->algo ? event->algo : "module";
  d.coll.proto = "simple";
  d.coll.stream = op->stream;
  return profStart(comm, &d);
}

/* corePrivate: [0] whether opBegin took a reference (commExecLock), [1] the profiler event. */
static ncclxResult_t opBeginNamed(ncclxComm_t comm, const ncclxModuleOp_v1_t* op,
                                  const ncclxModuleOpEvent_v1_t* event, ncclxModuleOpCtx_v1_t* ctx) {
  ncclxLogSetRank(comm->rank);
  int ref = commExecLock(comm); /* a direct call holds no reference of its own */
  ncclxResult_t res = atomic_load(&comm->destroyed)
                          ? ncclxSetError(ncclxInvalidUsage, "%s: communicator was destroyed before the queued call ran",
                                          op->name)
                          : commCheckHealthy(comm);
  if (res != ncclxSuccess) {
    commExecUnlock(comm, ref);
    return res;
  }
  ctx->seq = ++comm->collSeq; /* every rank makes the same calls: sequences stay in step */
  comm->curOpName = op->name;
  comm->curOpSeq = ctx->seq;
  comm->curAlgo = comm->curProto = -1, comm->curPathText = op->path;
  void* ev = NULL;
  if (event && event->func && profEnabled(comm, NCCLX_PROFILE_COLL | NCCLX_PROFILE_STEP)) {
    ev = profOwnStart(comm, op, event, ctx->seq);
  } else if (profEnabled(comm, NCCLX_PROFILE_COLL | NCCLX_PROFILE_STEP)) {
    ncclxCollArgs a = {.coll = op->profColl, .sendbuff = op->sendbuff, .recvbuff = op->recvbuff, .count = op->count,
                       .datatype = op->datatype, .op = op->op, .root = -1, .algo = op->profAlgo,
                       .proto = NCCLX_PROTO_SIMPLE, .chunkBytes = comm->chunkBytes};
    profColl c = {.coll = (int)a.coll, .sendbuff = a.sendbuff, .recvbuff = a.recvbuff, .count = a.count,
                  .bytes = tuneCallBytes(comm, &a), .root = -1, .datatype = a.datatype, .op = a.op, .algo = a.algo,
                  .proto = a.proto};
    ev = profCollStart(comm, &c, ctx->seq, op->stream);
  }
  comm->curProfEvent = ev;
  if (op->callKind != NCCLX_MODULE_NO_STEPS) {
    int kind = op->callKind >= 0 && op->callKind < NCCLX_MODULE_CALL_KINDS ? op->callKind : 0;
    xferNameModuleKind(kind, op->name);
    xferSetCall(comm, XFER_SIG_MODULE + kind, op->bytesPerRank); /* its messages carry the call */
  }
  ctx->corePrivate[0] = (void*)(intptr_t)ref;
  ctx->corePrivate[1] = ev;
  return ncclxSuccess;
}

static ncclxResult_t opBegin(ncclxComm_t comm, const ncclxModuleOp_v1_t* op, ncclxModuleOpCtx_v1_t* ctx) {
  return opBeginNamed(comm, op, NULL, ctx);
}

static void opEnd(ncclxComm_t comm, ncclxModuleOpCtx_v1_t* ctx, ncclxResult_t res) {
  void* ev = ctx->corePrivate[1];
  xferSetCall(comm, XFER_SIG_P2P, XFER_SIG_PER_TRANSFER);
  if (res != ncclxSuccess) profFailed(comm, ev, res, ncclxThreadLastError());
  profStop(comm, ev);
  comm->curProfEvent = NULL;
  comm->curOpName = NULL;
  commExecUnlock(comm, (int)(intptr_t)ctx->corePrivate[0]);
}

/* ---------------- streams ---------------- */

struct moduleTask {
  ncclxTask task;
  struct ncclxComm* comm;
  ncclxResult_t (*run)(void*);
  void (*release)(void*);
  void* arg;
};

static ncclxResult_t taskRun(ncclxTask* t) {
  struct moduleTask* m = (struct moduleTask*)t;
  return m->run(m->arg);
}

static void taskRelease(ncclxTask* t) {
  struct moduleTask* m = (struct moduleTask*)t;
  if (m->release) m->release(m->arg);
  commRelease(m->comm);
  free(m);
}

static struct moduleTask* newTask(ncclxComm_t comm, ncclxResult_t (*run)(void*), void (*release)(void*), void* arg) {
  struct moduleTask* t = calloc(1, sizeof(*t));
  if (!t) return NULL;
  *t = (struct moduleTask){.task = {.run = taskRun, .release = taskRelease}, .comm = comm, .run = run,
                           .release = release, .arg = arg};
  commRetain(comm);
  return t;
}

/* Queueing failed: the module's argument is released all the same, as a stream does. */
static ncclxResult_t noTask(void (*release)(void*), void* arg) {
  if (release) release(arg);
  return ncclxSetError(ncclxSystemError, "out of memory queueing a call");
}

static ncclxResult_t enqueue(ncclxComm_t comm, ncclxStream_t stream, ncclxResult_t (*run)(void*),
                             void (*release)(void*), void* arg) {
  struct moduleTask* t = newTask(comm, run, release, arg);
  return t ? streamEnqueue(stream, &t->task) : noTask(release, arg);
}

/* ---------------- steps ---------------- */

struct ncclxModuleStep {
  ncclxXferRun run;
  int n;
  ncclxXfer x[]; /* the run points into it */
};

static void toXfers(const ncclxModuleXfer_v1_t* in, ncclxXfer* out, int n) {
  for (int i = 0; i < n; i++)
    out[i] = (ncclxXfer){.peer = in[i].peer, .isSend = in[i].isSend, .buf = in[i].buf, .bytes = in[i].bytes};
}

static ncclxResult_t stepRun(ncclxComm_t comm, const ncclxModuleXfer_v1_t* x, int n) {
  ncclxXfer stack[8];
  ncclxXfer* xs = n <= 8 ? stack : calloc((size_t)n, sizeof(*xs));
  if (!xs) return commFail(comm, ncclxSystemError, "out of memory for %d transfers", n);
  toXfers(x, xs, n);
  ncclxResult_t res = xferRun(comm, xs, n);
  if (xs != stack) free(xs);
  return res;
}

static ncclxResult_t stepStart(ncclxComm_t comm, const ncclxModuleXfer_v1_t* x, int n, ncclxModuleStep_t** out) {
  *out = NULL;
  struct ncclxModuleStep* s = calloc(1, sizeof(*s) + sizeof(ncclxXfer) * (size_t)(n > 0 ? n : 1));
  if (!s) return commFail(comm, ncclxSystemError, "out of memory for %d transfers", n);
  s->n = n;
  toXfers(x, s->x, n);
  *out = s;
  return xferStart(comm, s->x, n, &s->run);
}

static ncclxResult_t stepTest(ncclxModuleStep_t* s, int* progressed) { return xferTest(&s->run, progressed); }
static int stepPending(const ncclxModuleStep_t* s) { return s->run.pending; }
static ncclxResult_t stepIdle(ncclxModuleStep_t* s) { return xferIdle(&s->run); }

static ncclxResult_t stepEnd(ncclxModuleStep_t* s, ncclxResult_t abandonedFor) {
  if (!s) return ncclxSuccess;
  if (abandonedFor != ncclxSuccess && s->run.res == ncclxSuccess) s->run.res = abandonedFor; /* not a new error */
  ncclxResult_t res = xferEnd(&s->run);
  free(s);
  return res;
}

static ncclxResult_t connect(ncclxComm_t comm, const int* sendPeers, int nsend, const int* recvPeers, int nrecv) {
  return peersEnsure(comm, sendPeers, nsend, recvPeers, nrecv);
}

/* ---------------- memory, math, out of band, model, state ---------------- */

static ncclxResult_t scratch(ncclxComm_t comm, size_t bytes, void** out) {
  *out = commScratch(comm, bytes);
  if (*out) return ncclxSuccess;
  return commFail(comm, ncclxSystemError, "%s #%llu: cannot allocate %zu bytes of scratch",
                  comm->curOpName ? comm->curOpName : "module operation", (unsigned long long)comm->curOpSeq, bytes);
}

static size_t maxMessageBytes(ncclxComm_t comm) { return comm->maxMessageBytes; }

static ncclxResult_t oobAllGather(ncclxComm_t comm, void* all, size_t size, uint32_t tag) {
  if (tag > 255) return ncclxSetError(ncclxInternalError, "module all-gather tag %u is not in 0..255", tag);
  return bootstrapAllGather(comm->bootstrap, all, size, TAG_MODULE_BASE + tag);
}

static void linkCost(ncclxComm_t comm, double* alphaUs, double* betaUsPerByte) {
  const TuneLink* link = &tuneModelGet()->link[tuneModelTransport(comm)];
  *alphaUs = link->alphaUs;
  *betaUsPerByte = link->betaUsPerByte;
}

static const ncclxTunerFuse_v1_t* tunerFuse(ncclxComm_t comm, void** ctx) {
  *ctx = comm->tunerCtx;
  return comm->tuner ? pluginTunerFuse(comm->tuner) : NULL;
}

/* ---------------- a module's own handles on a communicator ---------------- */

static int execLock(ncclxComm_t comm) { return commExecLock(comm); }
static void execUnlock(ncclxComm_t comm, int ref) { commExecUnlock(comm, ref); }

static ncclxResult_t failQuiet(ncclxComm_t comm, ncclxResult_t res, const char* fmt, ...) {
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof(msg), fmt, ap);
  va_end(ap);
  return commSetError(comm, res, "%s", msg);
}

static const char* describeRank(ncclxComm_t comm, int rank, char* buf, size_t size) {
  return commDescribeRank(comm, rank, buf, size);
}

static int inGroup(void) { return enqueueGroupDepth() > 0; }

/* ---------------- device memory ---------------- */

static int memDevice(const void* p) {
  int device = -1;
  if (!p || !gpuDriverLoaded() || gpuProbePointer(p, &device) != GPU_MEM_DEVICE) return -1;
  return device < 0 ? 0 : device;
}

static ncclxResult_t enqueueDevice(ncclxComm_t comm, ncclxStream_t stream, ncclxResult_t (*run)(void*),
                                   void (*release)(void*), void* arg) {
  struct moduleTask* t = newTask(comm, run, release, arg);
  return t ? gpuStreamEnqueue(stream, &t->task) : noTask(release, arg);
}

/* Atomic: a module may read its state from a thread that runs no operation. */
static void* getState(ncclxComm_t comm, int slot) {
  return slot >= 0 && slot < MODULE_COUNT ? __atomic_load_n(&comm->moduleState[slot], __ATOMIC_ACQUIRE) : NULL;
}

static void setState(ncclxComm_t comm, int slot, void* state) {
  if (slot >= 0 && slot < MODULE_COUNT) __atomic_store_n(&comm->moduleState[slot], state, __ATOMIC_RELEASE);
}

static const ncclxModuleCore_v1_t coreTable = {
    .size = sizeof(ncclxModuleCore_v1_t),
    .abiVersion = NCCLX_MODULE_ABI_VERSION,
    .commInfo = commInfo,
    .checkCall = commCheckCall,
    .argError = argError,
    .fail = fail,
    .setError = setError,
    .lastError = ncclxThreadLastError,
    .clearError = ncclxClearThreadError,
    .abort = abortComm,
    .aborted = aborted,
    .checkHealth = commCheckHealthySlow,
    .opBegin = opBegin,
    .opEnd = opEnd,
    .enqueue = enqueue,
    .stepRun = stepRun,
    .stepStart = stepStart,
    .stepTest = stepTest,
    .stepPending = stepPending,
    .stepIdle = stepIdle,
    .stepEnd = stepEnd,
    .connect = connect,
    .scratch = scratch,
    .reduce = ncclxReduce2,
    .avgFinish = ncclxAvgFinish,
    .typeSize = ncclxTypeSize,
    .typeName = ncclxTypeName,
    .oobAllGather = oobAllGather,
    .linkCost = linkCost,
    .tunerFuse = tunerFuse,
    .getState = getState,
    .setState = setState,
    .configGet = ncclxConfigGet,
    .log = ncclxLog,
    .logSetRank = ncclxLogSetRank,
    .retain = commRetain,
    .release = commRelease,
    .execLock = execLock,
    .execUnlock = execUnlock,
    .failQuiet = failQuiet,
    .describeRank = describeRank,
    .inGroup = inGroup,
    .halfToFloat = ncclxHalfToFloat,
    .floatToHalf = ncclxFloatToHalf,
    .msgSend = moduleMsgSend,
    .msgRecv = moduleMsgRecv,
    .msgTest = moduleMsgTest,
    .linkFailed = moduleLinkFailed,
    .spinPolls = moduleSpinPolls,
    .waitPeers = moduleWaitPeers,
    .waitCheck = moduleWaitCheck,
    .memDevice = memDevice,
    .checkBuffer = gpuCheckBuffer,
    .streamIsDevice = gpuStreamIsCuda,
    .enqueueDevice = enqueueDevice,
    .devOpen = gpuModuleDevOpen,
    .devPinned = gpuModuleDevPinned,
    .devCopy = gpuModuleDevCopy,
    .devCopyBlocks = gpuModuleDevCopyBlocks,
    .devWait = gpuModuleDevWait,
    .devClose = gpuModuleDevClose,
    .opBeginNamed = opBeginNamed,
    .maxMessageBytes = maxMessageBytes,
};

const ncclxModuleCore_v1_t* moduleCoreTable(void) { return &coreTable; }
