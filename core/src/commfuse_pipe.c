/* CommFuse RING_P2P as a pipeline: the helper runs every ring step of the call as one job,
 * piece after piece, while the executing thread computes on what has arrived.
 *
 * Handing each step over separately costs two thread handoffs per step, and consumption
 * could only start on a block once all of it had arrived. Here the helper is handed one
 * job per call; the two threads then meet only through piece counters (fuseProgress):
 * the consumer of a counter reads it without a system call and sleeps on a condition
 * variable only when it is behind. With p pieces per block, a received block is consumed
 * (all-gather) or a partial is reduced and forwarded (reduce-scatter) piece by piece, so
 * when communication is slower than compute only one piece of compute is left after the
 * last transfer, instead of one block.
 *
 * Orders, results and callbacks are those of the step-by-step RING_P2P: blocks r, r-1, ...
 * consumed in that order (own first); partials for r-1, r-2, ..., r produced in that
 * order (own last), each sum taken as own + received, the same chain as SEQUENTIAL. */
#include <errno.h>
#include <string.h>
#include <time.h>

#include "commfuse_internal.h"
#include "debug.h"
#include "reduce.h"

/* ---------------- piece counters ---------------- */

static void progInit(fuseProgress* p) {
  pthread_mutex_init(&p->lock, NULL);
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&p->cond, &ca);
  pthread_condattr_destroy(&ca);
  atomic_store(&p->produced, 0);
  atomic_store(&p->moved, 0);
  atomic_store(&p->ended, 0);
  atomic_store(&p->sleepers, 0);
}

static void progDestroy(fuseProgress* p) {
  pthread_cond_destroy(&p->cond);
  pthread_mutex_destroy(&p->lock);
}

/* Publish: the store is seq_cst and so is the sleepers load, and a sleeper counts itself
 * before re-reading the counter, so one of the two always sees the other. */
static void progPublish(fuseProgress* p, atomic_long* counter, long value) {
  atomic_store(counter, value);
  if (atomic_load(&p->sleepers) > 0) {
    pthread_mutex_lock(&p->lock);
    pthread_cond_broadcast(&p->cond);
    pthread_mutex_unlock(&p->lock);
  }
}

static void progEnd(fuseProgress* p) {
  atomic_store(&p->ended, 1);
  pthread_mutex_lock(&p->lock); /* always wake: the waiter may be about to sleep */
  pthread_cond_broadcast(&p->cond);
  pthread_mutex_unlock(&p->lock);
}

/* Sleep until *counter >= target (returns 1), or until stop() says to give up (returns 0).
 * The 10 ms bound on each sleep is only a safety net for stop(); wakeups come from
 * progPublish. */
static int progWait(fuseProgress* p, atomic_long* counter, long target,
                    int (*stop)(fuseOp*), fuseOp* f) {
  if (atomic_load(counter) >= target) return 1;
  pthread_mutex_lock(&p->lock);
  atomic_fetch_add(&p->sleepers, 1);
  int ok;
  for (;;) {
    if ((ok = atomic_load(counter) >= target) || stop(f)) break;
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    ts.tv_nsec += 10 * 1000 * 1000;
    if (ts.tv_nsec >= 1000000000L) ts.tv_sec++, ts.tv_nsec -= 1000000000L;
    (void)pthread_cond_timedwait(&p->cond, &p->lock, &ts);
  }
  atomic_fetch_sub(&p->sleepers, 1);
  pthread_mutex_unlock(&p->lock);
  return ok;
}

/* The executing thread stops waiting when the helper's job is over (it failed). */
static int helperEnded(fuseOp* f) { return atomic_load(&f->prog.ended); }
/* The helper stops waiting for the compute when the operation is being aborted. */
static int aborted(fuseOp* f) { return atomic_load(&f->comm->abortFlag) != 0; }

/* The executing thread waits for the helper's piece `target`; on failure, collect it. */
static ncclxResult_t waitMoved(fuseOp* f, long target) {
  if (progWait(&f->prog, &f->prog.moved, target, helperEnded, f)) return ncclxSuccess;
  ncclxResult_t res = fuseWait(f);
  return res != ncclxSuccess ? res
                             : ncclxSetError(ncclxInternalError, "%s #%llu: the ring ended early", f->name,
                                             (unsigned long long)f->seq);
}

static char* blockAt(const fuseOp* f, int rank, size_t offElems) {
  return (char*)f->recvbuff + ((size_t)rank * f->count + offElems) * f->typeSize;
}

/* ---------------- all-gather ---------------- */

/* Helper: step t, piece q forwards piece q of block r-t to r+1 and receives piece q of
 * block r-t-1 from r-1; piece number t*p+q+1 is then complete. */
static ncclxResult_t jobAgRing(void* arg) {
  fuseOp* f = arg;
  ncclxLogSetRank(f->comm->rank);
  int n = f->comm->nranks, r = f->comm->rank, p = fuseSliceCount(f);
  ncclxResult_t res = ncclxSuccess;
  for (int t = 0; t < n - 1 && res == ncclxSuccess; t++)
    for (int q = 0; q < p && res == ncclxSuccess; q++) {
      size_t off, len;
      fuseSlice(f, p, q, &off, &len);
      ncclxXfer x[2];
      memset(x, 0, sizeof(x));
      x[0] = (ncclxXfer){.peer = (r + 1) % n, .isSend = 1, .buf = blockAt(f, (r - t + n) % n, off),
                         .bytes = len * f->typeSize};
      x[1] = (ncclxXfer){.peer = (r - 1 + n) % n, .isSend = 0, .buf = blockAt(f, (r - t - 1 + n) % n, off),
                         .bytes = len * f->typeSize};
      res = fuseStepRun(f, x, 2);
      if (res == ncclxSuccess) progPublish(&f->prog, &f->prog.moved, (long)t * p + q + 1);
    }
  progEnd(&f->prog);
  return res;
}

static ncclxResult_t agConsume(fuseOp* f, int src, int q, int p) {
  size_t off, len;
  fuseSlice(f, p, q, &off, &len);
  int rc = f->consume(f->user, src, off, blockAt(f, src, off), len);
  return rc ? fuseCallbackFailed(f, "consume", src, rc) : ncclxSuccess;
}

ncclxResult_t fusePipeAllGather(fuseOp* f) {
  int n = f->comm->nranks, r = f->comm->rank, p = fuseSliceCount(f);
  char* own = blockAt(f, r, 0);
  if (own != (const char*)f->sendbuff) memmove(own, f->sendbuff, f->count * f->typeSize);
  if (n > 1 && !f->helper)
    return ncclxSetError(ncclxInternalError, "%s: a pipelined ring needs a progress helper", f->name);
  progInit(&f->prog);
  if (n > 1) fuseHelperStart(f->helper, jobAgRing, f);
  ncclxResult_t res = ncclxSuccess;
  for (int q = 0; q < p && res == ncclxSuccess; q++) res = agConsume(f, r, q, p); /* no head */
  for (int t = 1; t < n && res == ncclxSuccess; t++)
    for (int q = 0; q < p && res == ncclxSuccess; q++) {
      res = waitMoved(f, (long)(t - 1) * p + q + 1);
      if (res == ncclxSuccess) res = agConsume(f, (r - t + n) % n, q, p);
    }
  if (res == ncclxSuccess) res = fuseWait(f);
  progDestroy(&f->prog);
  return res;
}

/* ---------------- reduce-scatter ---------------- */

static char* rsOut(const fuseOp* f, int t) {
  return t == f->comm->nranks - 1 ? (char*)f->recvbuff : f->pipeTmp[t % 2];
}

/* Helper: for step t, piece q, once the executing thread has produced it: add the partial
 * received for it (t > 0), then send the sum to r+1 while receiving r-1's partial for step
 * t+1 (t < n-1). The adds happen here, off the compute thread. */
static ncclxResult_t jobRsRing(void* arg) {
  fuseOp* f = arg;
  ncclxLogSetRank(f->comm->rank);
  int n = f->comm->nranks, r = f->comm->rank, p = fuseSliceCount(f);
  ncclxResult_t res = ncclxSuccess;
  for (int t = 0; t < n && res == ncclxSuccess; t++)
    for (int q = 0; q < p && res == ncclxSuccess; q++) {
      long piece = (long)t * p + q + 1;
      if (!progWait(&f->prog, &f->prog.produced, piece, aborted, f)) {
        res = commCheckHealthy(f->comm);
        if (res == ncclxSuccess) res = ncclxSetError(ncclxInvalidUsage, "%s #%llu: aborted", f->name,
                                                     (unsigned long long)f->seq);
        break;
      }
      size_t off, len;
      fuseSlice(f, p, q, &off, &len);
      size_t offB = off * f->typeSize, lenB = len * f->typeSize;
      char* out = rsOut(f, t) + offB;
      if (t > 0) ncclxReduce2(out, out, f->pipeAcc[t % 2] + offB, len, f->type, f->op);
      if (t < n - 1) {
        ncclxXfer x[2];
        memset(x, 0, sizeof(x));
        x[0] = (ncclxXfer){.peer = (r + 1) % n, .isSend = 1, .buf = out, .bytes = lenB};
        x[1] = (ncclxXfer){.peer = (r - 1 + n) % n, .isSend = 0, .buf = f->pipeAcc[(t + 1) % 2] + offB,
                           .bytes = lenB};
        res = fuseStepRun(f, x, 2);
      }
      if (res == ncclxSuccess) progPublish(&f->prog, &f->prog.moved, piece);
    }
  progEnd(&f->prog);
  return res;
}

static size_t align64(size_t bytes) { return (bytes + 63) & ~(size_t)63; }

ncclxResult_t fusePipeReduceScatter(fuseOp* f) {
  int n = f->comm->nranks, r = f->comm->rank, p = fuseSliceCount(f);
  if (n > 1 && !f->helper)
    return ncclxSetError(ncclxInternalError, "%s: a pipelined ring needs a progress helper", f->name);
  size_t stride = align64(f->count * f->typeSize);
  char* scratch = NULL;
  if (n > 1) NCCLX_CHECK(fuseScratch(f, 4 * stride, &scratch));
  for (int i = 0; i < 2; i++) {
    f->pipeTmp[i] = scratch ? scratch + (size_t)i * stride : NULL;
    f->pipeAcc[i] = scratch ? scratch + (size_t)(2 + i) * stride : NULL;
  }
  progInit(&f->prog);
  if (n > 1) fuseHelperStart(f->helper, jobRsRing, f);
  ncclxResult_t res = ncclxSuccess;
  for (int t = 0; t < n && res == ncclxSuccess; t++) {
    int b = (r - t - 1 + n) % n;
    /* tmp[t % 2] held step t-2's partials: wait until the helper has sent all of them. */
    if (t >= 2 && t < n - 1) res = waitMoved(f, (long)(t - 1) * p);
    for (int q = 0; q < p && res == ncclxSuccess; q++) {
      size_t off, len;
      fuseSlice(f, p, q, &off, &len);
      int rc = f->produce(f->user, b, off, rsOut(f, t) + off * f->typeSize, len);
      if (rc) res = fuseCallbackFailed(f, "produce", b, rc);
      else if (n > 1) progPublish(&f->prog, &f->prog.produced, (long)t * p + q + 1);
    }
  }
  if (res == ncclxSuccess) res = fuseWait(f);
  progDestroy(&f->prog);
  if (res == ncclxSuccess && f->op == ncclxAvg) ncclxAvgFinish(f->recvbuff, f->count, f->type, n);
  return res;
}
