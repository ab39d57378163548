/* The public collective and point-to-point calls: validate, then run now (stream NULL),
 * queue on a stream, or collect into the current group. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coll/coll.h"
#include "comm/comm.h"
#include "util/debug.h"
#include "gpu/gpu.h"
#include "sched/enqueue.h"
#include "sched/mismatch.h"
#include "transport/shm/net_shm.h"
#include "prof/prof.h"
#include "exec/stream.h"
#include "tune/tune.h"
#include "exec/xfer.h"

#define API __attribute__((visibility("default")))

typedef enum { OP_COLL, OP_SEND, OP_RECV } opKind;

struct ncclxOp {
  opKind kind;
  struct ncclxComm* comm;
  ncclxStream_t stream;
  ncclxCollArgs coll; /* OP_COLL */
  void* buf;          /* OP_SEND / OP_RECV */
  size_t count;
  ncclxDataType_t type;
  int peer;
  size_t* vcounts; /* owned copy of the alltoallv count and displacement arrays */
  struct ncclxOp* next;
};

/* ---------------- validation ---------------- */

static const char* collFuncName(ncclxCollType_t c) {
  static const char* names[] = {"ncclxBroadcast", "ncclxReduce", "ncclxAllGather",
                                "ncclxReduceScatter", "ncclxAllReduce", "ncclxAllToAll",
                                "ncclxAllToAllv", "ncclxBarrier"};
  return (unsigned)c < NCCLX_NUM_COLLS ? names[c] : "collective";
}

static int collReduces(ncclxCollType_t c) {
  return c == NCCLX_COLL_ALLREDUCE || c == NCCLX_COLL_REDUCE || c == NCCLX_COLL_REDUCESCATTER;
}

static ncclxResult_t checkType(struct ncclxComm* comm, ncclxDataType_t t, const char* fn) {
  if ((unsigned)t >= ncclxNumTypes)
    return commArgError(comm, ncclxInvalidArgument, "%s: invalid datatype %d", fn, (int)t);
  return ncclxSuccess;
}

/* count * elements-per-rank-multiplier * type size must fit in half of size_t. Checked
 * with overflow builtins: the two 64-bit divisions this took were 30% of submitColl's
 * samples in a small broadcast. */
static ncclxResult_t checkCount(struct ncclxComm* comm, size_t count, size_t mult,
                                ncclxDataType_t t, const char* fn) {
  size_t elems, bytes;
  if (__builtin_mul_overflow(count, mult, &elems) ||
      __builtin_mul_overflow(elems, dataTypeSize(t), &bytes) || bytes > SIZE_MAX / 2)
    return commArgError(comm, ncclxInvalidArgument, "%s: count %zu is too large", fn, count);
  return ncclxSuccess;
}

static ncclxResult_t checkDeviceBuffers(struct ncclxComm* comm, const char* fn, const void* send,
                                        const void* recv) {
  char msg[512];
  ncclxResult_t res = gpuCheckBuffer(fn, "sendbuff", send, msg, sizeof msg);
  if (res == ncclxSuccess) res = gpuCheckBuffer(fn, "recvbuff", recv, msg, sizeof msg);
  return res == ncclxSuccess ? res : commArgError(comm, res, "%s", msg);
}

/* Device buffers need a CUDA build on a machine with a usable device. *hostOnly (if given)
 * says whether the buffers were found to be host memory without asking the driver. */
static inline ncclxResult_t checkBuffers(struct ncclxComm* comm, const char* fn, const void* send,
                                         const void* recv, int* hostOnly) {
  int driver = gpuDriverLoaded();
  if (hostOnly) *hostOnly = !driver;
  if (!driver) return ncclxSuccess; /* no driver, no device memory */
  return checkDeviceBuffers(comm, fn, send, recv);
}

/* All-reduce, all-gather, reduce-scatter: buffers that overlap must be NCCL's in-place form
 * exactly (docs/api.md); any other overlap would have the call read what it already wrote. */
static ncclxResult_t checkInPlace(struct ncclxComm* comm, const ncclxCollArgs* a, const char* fn) {
  size_t blk = a->count * dataTypeSize(a->datatype), n = (size_t)comm->nranks, sendBytes = blk, recvBytes = blk;
  uintptr_t send = (uintptr_t)a->sendbuff, recv = (uintptr_t)a->recvbuff, own = (size_t)comm->rank * blk;
  int inPlace = send == recv; /* addresses as integers: recv - own may lie outside any object */
  const char* form = "sendbuff == recvbuff";
  if (a->coll == NCCLX_COLL_ALLGATHER) {
    recvBytes = n * blk;
    inPlace = send == recv + own;
    form = "sendbuff == recvbuff + rank * sendcount";
  } else if (a->coll == NCCLX_COLL_REDUCESCATTER) {
    sendBytes = n * blk;
    inPlace = recv == send + own;
    form = "recvbuff == sendbuff + rank * recvcount";
  }
  if (inPlace || !collRangesOverlap(a->sendbuff, sendBytes, a->recvbuff, recvBytes)) return ncclxSuccess;
  return commArgError(comm, ncclxInvalidArgument,
                      "%s: sendbuff %p and recvbuff %p overlap but are not the in-place form (%s)", fn,
                      a->sendbuff, (void*)a->recvbuff, form);
}

static ncclxResult_t validateColl(struct ncclxComm* comm, ncclxCollArgs* a) {
  const char* fn = collFuncName(a->coll);
  NCCLX_CHECK(checkType(comm, a->datatype, fn));
  NCCLX_CHECK(checkBuffers(comm, fn, a->sendbuff, a->recvbuff, &a->hostBuffers));
  if (collReduces(a->coll) && (unsigned)a->op >= ncclxNumOps)
    return commArgError(comm, ncclxInvalidArgument, "%s: invalid reduction op %d", fn, (int)a->op);
  int hasRoot = a->coll == NCCLX_COLL_BROADCAST || a->coll == NCCLX_COLL_REDUCE;
  if (hasRoot && (a->root < 0 || a->root >= comm->nranks))
    return commArgError(comm, ncclxInvalidArgument, "%s: root %d is not a rank of this %d-rank communicator",
                    fn, a->root, comm->nranks);
  size_t mult = (a->coll == NCCLX_COLL_ALLGATHER || a->coll == NCCLX_COLL_REDUCESCATTER ||
                 a->coll == NCCLX_COLL_ALLTOALL) ? (size_t)comm->nranks : 1;
  NCCLX_CHECK(checkCount(comm, a->count, mult, a->datatype, fn));
  if (a->coll == NCCLX_COLL_ALLTOALLV) {
    if (!a->sendcounts || !a->sdispls || !a->recvcounts || !a->rdispls)
      return commArgError(comm, ncclxInvalidArgument, "%s: count and displacement arrays must not be NULL", fn);
    int anySend = 0, anyRecv = 0;
    for (int r = 0; r < comm->nranks; r++) {
      size_t sendEnd, recvEnd; /* a count plus its displacement may wrap: SIZE_MAX is refused */
      if (__builtin_add_overflow(a->sendcounts[r], a->sdispls[r], &sendEnd)) sendEnd = SIZE_MAX;
      if (__builtin_add_overflow(a->recvcounts[r], a->rdispls[r], &recvEnd)) recvEnd = SIZE_MAX;
      NCCLX_CHECK(checkCount(comm, sendEnd, 1, a->datatype, fn));
      NCCLX_CHECK(checkCount(comm, recvEnd, 1, a->datatype, fn));
      anySend |= a->sendcounts[r] > 0;
      anyRecv |= a->recvcounts[r] > 0;
    }
    if ((anySend && !a->sendbuff) || (anyRecv && !a->recvbuff))
      return commArgError(comm, ncclxInvalidArgument, "%s: %s is NULL but its counts are not all zero", fn,
                      anySend && !a->sendbuff ? "sendbuff" : "recvbuff");
    /* Checked here, not in the algorithm: a bad argument leaves the communicator usable. */
    int r = comm->rank;
    if (a->sendcounts[r] != a->recvcounts[r])
      return commArgError(comm, ncclxInvalidArgument, "%s: rank %d sends %zu elements to itself but receives %zu",
                          fn, r, a->sendcounts[r], a->recvcounts[r]);
    return ncclxSuccess;
  }
  if (a->count == 0 || a->coll == NCCLX_COLL_BARRIER) return ncclxSuccess;
  int needSend = !(a->coll == NCCLX_COLL_BROADCAST && comm->rank != a->root);
  int needRecv = !(a->coll == NCCLX_COLL_REDUCE && comm->rank != a->root);
  if (needSend && !a->sendbuff)
    return commArgError(comm, ncclxInvalidArgument, "%s: sendbuff is NULL with count %zu", fn, a->count);
  if (needRecv && !a->recvbuff)
    return commArgError(comm, ncclxInvalidArgument, "%s: recvbuff is NULL with count %zu", fn, a->count);
  /* Broadcast (a root's shifted recvbuff) and all-to-all stage overlapping data themselves. */
  int staged = a->coll == NCCLX_COLL_BROADCAST || a->coll == NCCLX_COLL_ALLTOALL || a->coll == NCCLX_COLL_REDUCE;
  return needSend && needRecv && !staged ? checkInPlace(comm, a, fn) : ncclxSuccess;
}

/* ---------------- execution ---------------- */

/* The profiler's COLL event of a collective (only built when a profiler wants it). */
static void* profCollOf(struct ncclxComm* comm, const ncclxCollArgs* a, uint64_t seq, void* stream) {
  profColl c = {.coll = (int)a->coll, .sendbuff = a->sendbuff, .recvbuff = a->recvbuff, .count = a->count,
                .bytes = tuneCallBytes(comm, a), .root = a->root, .datatype = a->datatype, .op = a->op,
                .algo = a->algo, .proto = a->proto};
  return profCollStart(comm, &c, seq, stream);
}

static ncclxResult_t execColl(struct ncclxComm* comm, ncclxCollArgs* coll, ncclxStream_t stream) {
  ncclxLogSetRank(comm->rank);
  int ref = commExecLock(comm);
  ncclxResult_t res = atomic_load(&comm->destroyed)
                          ? ncclxSetError(ncclxInvalidUsage, "%s: communicator was destroyed before the queued call ran",
                                          collFuncName(coll->coll))
                          : commCheckHealthy(comm);
  if (res == ncclxSuccess) {
    uint64_t seq = ++comm->collSeq;
    comm->curOpName = ncclxCollName(coll->coll);
    comm->curOpSeq = seq;
    tuneSelect(comm, coll);
    comm->curAlgo = coll->algo, comm->curProto = coll->proto, comm->curPathText = NULL;
    INFO(NCCLX_LOG_COLL, "%s #%llu: count %zu %s op %s root %d comm %s nranks %d algo %s proto %s",
         collFuncName(coll->coll), (unsigned long long)seq, coll->count,
         ncclxTypeName(coll->datatype), ncclxOpName(coll->op), coll->root, comm->name,
         comm->nranks, ncclxAlgoName(coll->algo), ncclxProtoName(coll->proto));
    /* STEP and NET events need their operation as parent: emit it for them too. */
    void* ev = profEnabled(comm, NCCLX_PROFILE_COLL | NCCLX_PROFILE_STEP | NCCLX_PROFILE_NET)
                   ? profCollOf(comm, coll, seq, stream)
                   : NULL;
    comm->curProfEvent = ev;
    /* Only with net events on: a thread-local costs a call in a shared library. */
    int netOn = profEnabled(comm, NCCLX_PROFILE_NET);
    struct ncclxComm* netScope = netOn ? profNetScope(comm) : NULL;
    /* [core] check_mismatch: agree on the call before moving any data. */
    if (mismatchEnabled()) res = mismatchCheck(comm, coll, seq);
    if (res == ncclxSuccess) {
      /* The progress engine and the algorithms chunk by comm->chunkBytes: lend it the
       * tuner's choice for this call. */
      size_t defaultChunk = comm->chunkBytes;
      comm->chunkBytes = coll->chunkBytes;
      /* Messages carry the call: all-to-all-v's sizes differ per peer, so each its own. */
      xferSetCall(comm, XFER_SIG_COLL + (int)coll->coll,
                  coll->coll == NCCLX_COLL_ALLTOALLV ? XFER_SIG_PER_TRANSFER
                                                     : coll->count * dataTypeSize(coll->datatype));
      res = gpuCollRun(comm, coll);
      xferSetCall(comm, XFER_SIG_P2P, XFER_SIG_PER_TRANSFER);
      comm->chunkBytes = defaultChunk;
    }
    if (res != ncclxSuccess) profFailed(comm, ev, res, ncclxThreadLastError());
    profStop(comm, ev);
    if (netOn) profNetScope(netScope);
    comm->curProfEvent = NULL;
    comm->curOpName = NULL;
  }
  commExecUnlock(comm, ref);
  return res;
}

static int compareCommAddr(const void* a, const void* b) {
  uintptr_t x = (uintptr_t) * (struct ncclxComm* const*)a, y = (uintptr_t) * (struct ncclxComm* const*)b;
  return x < y ? -1 : x > y;
}

/* All sends and receives of a group, over every communicator involved, progress together. */
static ncclxResult_t execP2p(struct ncclxOp** ops, int n) {
  struct ncclxComm** comms = malloc(sizeof(*comms) * (size_t)n);
  ncclxXfer* x = calloc((size_t)n, sizeof(*x));
  void** events = calloc((size_t)n, sizeof(*events));
  if (!comms || !x || !events) {
    free(comms), free(x), free(events);
    return ncclxSetError(ncclxSystemError, "out of memory for %d send/recv operations", n);
  }
  int ncomms = 0;
  for (int i = 0; i < n; i++) {
    int seen = 0;
    for (int j = 0; j < ncomms; j++) seen |= comms[j] == ops[i]->comm;
    if (!seen) comms[ncomms++] = ops[i]->comm;
  }
  qsort(comms, (size_t)ncomms, sizeof(*comms), compareCommAddr); /* lock order: no deadlock */
  int* refs = calloc(2 * (size_t)ncomms, sizeof(*refs)); /* and the comms' send kinds */
  if (!refs) {
    free(comms), free(x), free(events);
    return ncclxSetError(ncclxSystemError, "out of memory for %d send/recv operations", n);
  }
  for (int j = 0; j < ncomms; j++) refs[j] = commExecLock(comms[j]);
  ncclxResult_t res = ncclxSuccess;
  for (int j = 0; j < ncomms && res == ncclxSuccess; j++) {
    res = atomic_load(&comms[j]->destroyed)
              ? ncclxSetError(ncclxInvalidUsage, "send/recv: communicator was destroyed before the queued call ran")
              : commCheckHealthy(comms[j]);
    comms[j]->curOpName = "send/recv";
    comms[j]->curOpIsP2p = 1;
    comms[j]->curOpSeq = comms[j]->p2pSeq + 1;
    comms[j]->curAlgo = comms[j]->curProto = -1, comms[j]->curPathText = NULL;
  }
  if (res == ncclxSuccess) {
    for (int i = 0; i < n; i++) {
      struct ncclxOp* op = ops[i];
      uint64_t seq = ++op->comm->p2pSeq;
      x[i] = (ncclxXfer){.comm = op->comm, .peer = op->peer, .isSend = op->kind == OP_SEND,
                         .buf = op->buf, .bytes = op->count * ncclxTypeSize(op->type)};
      if (profEnabled(op->comm, NCCLX_PROFILE_P2P | NCCLX_PROFILE_STEP | NCCLX_PROFILE_NET))
        events[i] = profP2pStart(op->comm, op->kind == OP_SEND, op->buf, op->count, op->type, op->peer, seq);
      /* A group's steps hang under its first operation on each communicator. */
      if (!op->comm->curProfEvent) op->comm->curProfEvent = events[i];
    }
    /* Net events of a group that spans communicators go to the first one's profiler. */
    int netOn = profEnabled(ops[0]->comm, NCCLX_PROFILE_NET);
    struct ncclxComm* netScope = netOn ? profNetScope(ops[0]->comm) : NULL;
    /* The application's sends: eager while a slot holds them (ncclxShmSendKind). */
    int* kinds = refs + ncomms;
    for (int j = 0; j < ncomms; j++) kinds[j] = comms[j]->xferSendKind, comms[j]->xferSendKind = NCCLX_SHM_SEND_USER;
    res = gpuXferRun(ops[0]->comm, x, n);
    for (int j = 0; j < ncomms; j++) comms[j]->xferSendKind = kinds[j];
    if (netOn) profNetScope(netScope);
    for (int i = 0; i < n; i++) {
      if (res != ncclxSuccess) profFailed(ops[i]->comm, events[i], res, ncclxThreadLastError());
      profStop(ops[i]->comm, events[i]);
    }
  }
  for (int j = 0; j < ncomms; j++) {
    comms[j]->curOpName = NULL;
    comms[j]->curOpIsP2p = 0;
    comms[j]->curProfEvent = NULL;
    commExecUnlock(comms[j], refs[j]);
  }
  free(comms), free(x), free(events), free(refs);
  return res;
}

/* Run a list in a fixed order every rank agrees on: collectives in call order, then all
 * sends and receives together. */
static ncclxResult_t execList(struct ncclxOp* ops) {
  ncclxResult_t first = ncclxSuccess;
  int np = 0;
  for (struct ncclxOp* op = ops; op; op = op->next) {
    if (op->kind != OP_COLL) {
      np++;
      continue;
    }
    ncclxResult_t res = execColl(op->comm, &op->coll, op->stream);
    if (first == ncclxSuccess) first = res;
  }
  if (np == 0) return first;
  struct ncclxOp** p2p = malloc(sizeof(*p2p) * (size_t)np);
  if (!p2p) return ncclxSetError(ncclxSystemError, "out of memory");
  np = 0;
  for (struct ncclxOp* op = ops; op; op = op->next)
    if (op->kind != OP_COLL) p2p[np++] = op;
  ncclxResult_t res = execP2p(p2p, np);
  free(p2p);
  return first != ncclxSuccess ? first : res;
}

static void freeList(struct ncclxOp* ops) {
  while (ops) {
    struct ncclxOp* next = ops->next;
    commRelease(ops->comm);
    free(ops->vcounts);
    free(ops);
    ops = next;
  }
}

/* ---------------- streams ---------------- */

struct opTask {
  ncclxTask task;
  struct ncclxOp* ops;
};

static ncclxResult_t opTaskRun(ncclxTask* t) { return execList(((struct opTask*)t)->ops); }

static void opTaskRelease(ncclxTask* t) {
  freeList(((struct opTask*)t)->ops);
  free(t);
}

static ncclxResult_t enqueueList(ncclxStream_t stream, struct ncclxOp* ops) {
  struct opTask* t = calloc(1, sizeof(*t));
  if (!t) {
    freeList(ops);
    return ncclxSetError(ncclxSystemError, "out of memory queueing an operation");
  }
  t->task.run = opTaskRun;
  t->task.release = opTaskRelease;
  t->ops = ops;
  return gpuStreamEnqueue(stream, &t->task);
}

/* ---------------- the entry check ---------------- */

ncclxResult_t commCheckCall(struct ncclxComm* comm, ncclxStream_t stream, const char* fn) {
  char why[512];
  ncclxResult_t res = commCheckHandle(comm);
  if (res != ncclxSuccess) {
    snprintf(why, sizeof(why), "%s", ncclxThreadLastError());
    return ncclxSetError(res, "%s: %s", fn, why);
  }
  ncclxLogSetRank(comm->rank);
  if (atomic_load(&comm->finalized))
    return commArgError(comm, ncclxInvalidUsage,
                        "%s: the communicator was finalized (ncclxCommFinalize); only ncclxCommDestroy "
                        "or ncclxCommAbort may follow", fn);
  NCCLX_CHECK(commCheckHealthy(comm));
  res = streamCheckHandle(stream);
  if (res != ncclxSuccess) {
    snprintf(why, sizeof(why), "%s", ncclxThreadLastError());
    return commArgError(comm, res, "%s: %s", fn, why);
  }
  return ncclxSuccess;
}

/* ---------------- groups ---------------- */

static _Thread_local struct ncclxOp* groupHead;
static _Thread_local struct ncclxOp* groupTail;

/* Feature modules refuse some calls inside a group (the module ABI's inGroup). */
int enqueueGroupDepth(void) { return threadGroupDepth; }

API ncclxResult_t ncclxGroupStart(void) {
  threadGroupDepth++;
  return ncclxSuccess;
}

API ncclxResult_t ncclxGroupEnd(void) {
  if (threadGroupDepth == 0)
    return ncclxSetError(ncclxInvalidUsage, "ncclxGroupEnd called without a matching ncclxGroupStart");
  if (--threadGroupDepth > 0) return ncclxSuccess;
  struct ncclxOp* ops = groupHead;
  groupHead = groupTail = NULL;
  ncclxResult_t first = ncclxSuccess;
  /* One batch per stream, in order of first appearance. */
  while (ops) {
    ncclxStream_t stream = ops->stream;
    struct ncclxOp *mine = NULL, **mineTail = &mine, *rest = NULL, **restTail = &rest;
    for (struct ncclxOp* op = ops; op;) {
      struct ncclxOp* next = op->next;
      op->next = NULL;
      if (op->stream == stream) *mineTail = op, mineTail = &op->next;
      else *restTail = op, restTail = &op->next;
      op = next;
    }
    ncclxResult_t res;
    if (stream == NULL) {
      res = execList(mine);
      freeList(mine);
    } else {
      res = enqueueList(stream, mine);
    }
    if (first == ncclxSuccess) first = res;
    ops = rest;
  }
  return first;
}

/* ---------------- submission ---------------- */

static ncclxResult_t submit(struct ncclxOp* tmpl) {
  if (threadGroupDepth == 0 && !tmpl->stream) {
    /* Runs now on the calling thread: the caller's copy serves, no allocation, and no
     * reference unless it waits for a lock (see submitColl). */
    tmpl->next = NULL;
    ncclxResult_t res = execList(tmpl);
    free(tmpl->vcounts);
    return res;
  }
  struct ncclxOp* op = malloc(sizeof(*op));
  if (!op) {
    free(tmpl->vcounts);
    return ncclxSetError(ncclxSystemError, "out of memory");
  }
  *op = *tmpl;
  op->next = NULL;
  commRetain(op->comm);
  if (threadGroupDepth > 0) {
    if (groupTail) groupTail->next = op;
    else groupHead = op;
    groupTail = op;
    return ncclxSuccess;
  }
  if (op->stream) return enqueueList(op->stream, op);
  ncclxResult_t res = execList(op);
  freeList(op);
  return res;
}

static ncclxResult_t submitColl(struct ncclxComm* comm, ncclxStream_t stream, ncclxCollArgs* a) {
  NCCLX_CHECK(commCheckCall(comm, stream, collFuncName(a->coll)));
  NCCLX_CHECK(validateColl(comm, a));
  if (threadGroupDepth == 0 && !stream) {
    /* Runs now on the calling thread, straight from the caller's arguments: no op to fill
     * and copy (a 160-byte zero fill and a copy per small call), and alltoallv's arrays
     * stay valid for the whole call without a copy. No reference is taken unless the
     * call has to wait for execLock (commExecLock): holding the lock keeps ncclxCommAbort
     * or Destroy from freeing the communicator, and nothing touches it after the unlock.
     * The two atomic instructions a reference costs wait for this rank's stores to other
     * cores' lines (the LL protocol's): 9% of a 2-rank 8-byte broadcast. */
    return execColl(comm, a, NULL);
  }
  struct ncclxOp op = {.kind = OP_COLL, .comm = comm, .stream = stream, .coll = *a};
  if (a->coll == NCCLX_COLL_ALLTOALLV) {
    size_t n = (size_t)comm->nranks;
    op.vcounts = malloc(4 * n * sizeof(size_t));
    if (!op.vcounts) return ncclxSetError(ncclxSystemError, "out of memory");
    memcpy(op.vcounts, a->sendcounts, n * sizeof(size_t));
    memcpy(op.vcounts + n, a->sdispls, n * sizeof(size_t));
    memcpy(op.vcounts + 2 * n, a->recvcounts, n * sizeof(size_t));
    memcpy(op.vcounts + 3 * n, a->rdispls, n * sizeof(size_t));
    op.coll.sendcounts = op.vcounts;
    op.coll.sdispls = op.vcounts + n;
    op.coll.recvcounts = op.vcounts + 2 * n;
    op.coll.rdispls = op.vcounts + 3 * n;
  }
  return submit(&op);
}

static ncclxResult_t submitP2p(opKind kind, void* buf, size_t count, ncclxDataType_t type, int peer,
                               struct ncclxComm* comm, ncclxStream_t stream) {
  const char* fn = kind == OP_SEND ? "ncclxSend" : "ncclxRecv";
  NCCLX_CHECK(commCheckCall(comm, stream, fn));
  NCCLX_CHECK(checkType(comm, type, fn));
  NCCLX_CHECK(checkCount(comm, count, 1, type, fn));
  if (peer < 0 || peer >= comm->nranks)
    return commArgError(comm, ncclxInvalidArgument, "%s: peer %d is not a rank of this %d-rank communicator",
                    fn, peer, comm->nranks);
  if (count > 0 && !buf) return commArgError(comm, ncclxInvalidArgument, "%s: buffer is NULL with count %zu", fn, count);
  NCCLX_CHECK(checkBuffers(comm, fn, kind == OP_SEND ? buf : NULL, kind == OP_RECV ? buf : NULL, NULL));
  struct ncclxOp op = {.kind = kind, .comm = comm, .stream = stream, .buf = buf, .count = count,
                       .type = type, .peer = peer};
  return submit(&op);
}

API ncclxResult_t ncclxAllReduce(const void* sendbuff, void* recvbuff, size_t count,
                                 ncclxDataType_t datatype, ncclxRedOp_t op, ncclxComm_t comm,
                                 ncclxStream_t stream) {
  ncclxCollArgs a = {.coll = NCCLX_COLL_ALLREDUCE, .sendbuff = sendbuff, .recvbuff = recvbuff,
                     .count = count, .datatype = datatype, .op = op, .root = -1};
  return submitColl(comm, stream, &a);
}

API ncclxResult_t ncclxBroadcast(const void* sendbuff, void* recvbuff, size_t count,
                                 ncclxDataType_t datatype, int root, ncclxComm_t comm,
                                 ncclxStream_t stream) {
  ncclxCollArgs a = {.coll = NCCLX_COLL_BROADCAST, .sendbuff = sendbuff, .recvbuff = recvbuff,
                     .count = count, .datatype = datatype, .op = ncclxSum, .root = root};
  return submitColl(comm, stream, &a);
}

API ncclxResult_t ncclxReduce(const void* sendbuff, void* recvbuff, size_t count,
                              ncclxDataType_t datatype, ncclxRedOp_t op, int root, ncclxComm_t comm,
                              ncclxStream_t stream) {
  ncclxCollArgs a = {.coll = NCCLX_COLL_REDUCE, .sendbuff = sendbuff, .recvbuff = recvbuff,
                     .count = count, .datatype = datatype, .op = op, .root = root};
  return submitColl(comm, stream, &a);
}

API ncclxResult_t ncclxAllGather(const void* sendbuff, void* recvbuff, size_t sendcount,
                                 ncclxDataType_t datatype, ncclxComm_t comm, ncclxStream_t stream) {
  ncclxCollArgs a = {.coll = NCCLX_COLL_ALLGATHER, .sendbuff = sendbuff, .recvbuff = recvbuff,
                     .count = sendcount, .datatype = datatype, .op = ncclxSum, .root = -1};
  return submitColl(comm, stream, &a);
}

API ncclxResult_t ncclxReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount,
                                     ncclxDataType_t datatype, ncclxRedOp_t op, ncclxComm_t comm,
                                     ncclxStream_t stream) {
  ncclxCollArgs a = {.coll = NCCLX_COLL_REDUCESCATTER, .sendbuff = sendbuff, .recvbuff = recvbuff,
                     .count = recvcount, .datatype = datatype, .op = op, .root = -1};
  return submitColl(comm, stream, &a);
}

API ncclxResult_t ncclxAllToAll(const void* sendbuff, void* recvbuff, size_t count,
                                ncclxDataType_t datatype, ncclxComm_t comm, ncclxStream_t stream) {
  ncclxCollArgs a = {.coll = NCCLX_COLL_ALLTOALL, .sendbuff = sendbuff, .recvbuff = recvbuff,
                     .count = count, .datatype = datatype, .op = ncclxSum, .root = -1};
  return submitColl(comm, stream, &a);
}

API ncclxResult_t ncclxAllToAllv(const void* sendbuff, const size_t sendcounts[],
                                 const size_t sdispls[], void* recvbuff, const size_t recvcounts[],
                                 const size_t rdispls[], ncclxDataType_t datatype, ncclxComm_t comm,
                                 ncclxStream_t stream) {
  ncclxCollArgs a = {.coll = NCCLX_COLL_ALLTOALLV, .sendbuff = sendbuff, .recvbuff = recvbuff,
                     .datatype = datatype, .op = ncclxSum, .root = -1, .sendcounts = sendcounts,
                     .sdispls = sdispls, .recvcounts = recvcounts, .rdispls = rdispls};
  return submitColl(comm, stream, &a);
}

API ncclxResult_t ncclxBarrier(ncclxComm_t comm, ncclxStream_t stream) {
  ncclxCollArgs a = {.coll = NCCLX_COLL_BARRIER, .datatype = ncclxUint8, .op = ncclxSum, .root = -1};
  return submitColl(comm, stream, &a);
}

API ncclxResult_t ncclxSend(const void* sendbuff, size_t count, ncclxDataType_t datatype, int peer,
                            ncclxComm_t comm, ncclxStream_t stream) {
  return submitP2p(OP_SEND, (void*)sendbuff, count, datatype, peer, comm, stream);
}

API ncclxResult_t ncclxRecv(void* recvbuff, size_t count, ncclxDataType_t datatype, int peer,
                            ncclxComm_t comm, ncclxStream_t stream) {
  return submitP2p(OP_RECV, recvbuff, count, datatype, peer, comm, stream);
}
