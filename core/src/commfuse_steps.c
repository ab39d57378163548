/* CommFuse step machinery: point-to-point steps on the executing thread or on the helper,
 * ring collectives on one slice (the SEQUENTIAL and SLICED baselines, over the very same
 * steps as the fused schedules), waiting, and aborting on a failed callback. */
#include <errno.h>
#include <string.h>
#include <time.h>

#include "commfuse_internal.h"
#include "debug.h"
#include "reduce.h"

/* ---------------- steps ---------------- */

static void sleepUntil(const struct timespec* t) {
  while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, t, NULL) == EINTR) {
  }
}

ncclxResult_t fuseStepRun(fuseOp* f, ncclxXfer* x, int n) {
  struct timespec start;
  double bps = f->sched.linkBytesPerSec;
  if (bps > 0) clock_gettime(CLOCK_MONOTONIC, &start);
  NCCLX_CHECK(xferRun(f->comm, x, n));
  if (bps <= 0) return ncclxSuccess;
  /* Emulated link: the step lasts as long as its largest send would take at bps. The
   * wait is a sleep, so it costs no CPU, like a DMA engine moving the bytes. */
  size_t bytes = 0;
  for (int i = 0; i < n; i++)
    if (x[i].isSend && x[i].peer != f->comm->rank && x[i].bytes > bytes) bytes = x[i].bytes;
  double sec = (double)bytes / bps;
  time_t whole = (time_t)sec;
  start.tv_sec += whole;
  start.tv_nsec += (long)((sec - (double)whole) * 1e9);
  if (start.tv_nsec >= 1000000000L) start.tv_sec++, start.tv_nsec -= 1000000000L;
  sleepUntil(&start);
  return ncclxSuccess;
}

static ncclxResult_t jobStep(void* arg) {
  fuseOp* f = arg;
  ncclxLogSetRank(f->comm->rank);
  return fuseStepRun(f, f->xfers, f->nxfers);
}

void fuseStepStart(fuseOp* f, const ncclxXfer* x, int n) {
  memcpy(f->xfers, x, sizeof(*x) * (size_t)n);
  f->nxfers = n;
  if (f->helper) fuseHelperStart(f->helper, jobStep, f);
  else f->inlineRes = jobStep(f);
}

/* ---------------- ring collectives on a slice ---------------- */

/* All-gather, in recvbuff, of bytes [off, off+len) of every block: the ring forwards each
 * rank's slice (own first). This rank's slice must already be in place. */
ncclxResult_t fuseAgSliceRun(fuseOp* f, size_t off, size_t len) {
  struct ncclxComm* comm = f->comm;
  int n = comm->nranks, r = comm->rank;
  size_t blk = f->count * f->typeSize;
  char* base = (char*)f->recvbuff + off;
  for (int s = 0; s < n - 1; s++) {
    int sb = (r - s + n) % n, rb = (r - s - 1 + n) % n;
    ncclxXfer x[2];
    memset(x, 0, sizeof(x));
    x[0] = (ncclxXfer){.peer = (r + 1) % n, .isSend = 1, .buf = base + (size_t)sb * blk, .bytes = len};
    x[1] = (ncclxXfer){.peer = (r - 1 + n) % n, .isSend = 0, .buf = base + (size_t)rb * blk, .bytes = len};
    NCCLX_CHECK(fuseStepRun(f, x, 2));
  }
  return ncclxSuccess;
}

static ncclxResult_t jobAgSlice(void* arg) {
  fuseOp* f = arg;
  ncclxLogSetRank(f->comm->rank);
  return fuseAgSliceRun(f, f->jobOff, f->jobLen);
}

void fuseAgSliceStart(fuseOp* f, size_t off, size_t len) {
  f->jobOff = off;
  f->jobLen = len;
  if (f->helper) fuseHelperStart(f->helper, jobAgSlice, f);
  else f->inlineRes = jobAgSlice(f);
}

/* Reduce-scatter of nranks contiguous pieces of len bytes (piece b = this rank's
 * contribution to rank b's block) into dst. The partial of piece b starts at rank b+1 and
 * moves one rank forward per step, each rank adding its own piece, until it reaches rank b:
 * the same chain and operand order as RING_P2P, so both give bit-identical results.
 * partials: two pieces of scratch. */
ncclxResult_t fuseRsSliceRun(fuseOp* f, char* blocks, size_t len, char* dst, char* partials) {
  struct ncclxComm* comm = f->comm;
  int n = comm->nranks, r = comm->rank;
  size_t elems = len / f->typeSize;
  if (n == 1) {
    if (dst != blocks) memmove(dst, blocks, len);
    return ncclxSuccess;
  }
  char* part[2] = {partials, partials + len};
  for (int s = 0; s < n - 1; s++) {
    int sb = (r - s - 1 + n) % n, rb = (r - s - 2 + 2 * n) % n;
    ncclxXfer x[2];
    memset(x, 0, sizeof(x));
    x[0] = (ncclxXfer){.peer = (r + 1) % n, .isSend = 1,
                       .buf = s == 0 ? blocks + (size_t)sb * len : part[(s - 1) % 2], .bytes = len};
    x[1] = (ncclxXfer){.peer = (r - 1 + n) % n, .isSend = 0, .buf = part[s % 2], .bytes = len};
    NCCLX_CHECK(fuseStepRun(f, x, 2));
    char* out = s == n - 2 ? dst : part[s % 2]; /* the last one is this rank's block */
    ncclxReduce2(out, blocks + (size_t)rb * len, part[s % 2], elems, f->type, f->op);
  }
  return ncclxSuccess;
}

static ncclxResult_t jobRsSlice(void* arg) {
  fuseOp* f = arg;
  ncclxLogSetRank(f->comm->rank);
  return fuseRsSliceRun(f, f->jobBase, f->jobLen, f->jobDst, f->jobPartials);
}

void fuseRsSliceStart(fuseOp* f, char* blocks, size_t len, char* dst, char* partials) {
  f->jobBase = blocks;
  f->jobLen = len;
  f->jobDst = dst;
  f->jobPartials = partials;
  if (f->helper) fuseHelperStart(f->helper, jobRsSlice, f);
  else f->inlineRes = jobRsSlice(f);
}

/* ---------------- waiting and failing ---------------- */

/* How long a helper job may take before we stop trusting it: the transports give up after
 * the communicator's timeout of no progress, plus the emulated link's sleeps. */
static double waitBoundSec(const fuseOp* f) {
  if (f->comm->timeoutSec <= 0) return 0;
  double bound = f->comm->timeoutSec + 30;
  if (f->sched.linkBytesPerSec > 0)
    bound += (double)f->count * (double)f->typeSize * f->comm->nranks / f->sched.linkBytesPerSec;
  return bound;
}

ncclxResult_t fuseWait(fuseOp* f) {
  if (!f->helper) {
    ncclxResult_t res = f->inlineRes;
    f->inlineRes = ncclxSuccess;
    return res;
  }
  if (!fuseHelperBusy(f->helper)) return ncclxSuccess;
  char err[1024];
  ncclxResult_t res = fuseHelperWait(f->helper, waitBoundSec(f), err, sizeof(err));
  if (res == ncclxInProgress) {
    /* Should not happen (every transport wait is bounded); make it return, then fail. */
    res = commFail(f->comm, ncclxInternalError,
                   "%s #%llu: the progress thread did not finish a step within %.0f s",
                   f->name, (unsigned long long)f->seq, waitBoundSec(f));
    atomic_store(&f->comm->abortFlag, 1);
    (void)fuseHelperWait(f->helper, 0, NULL, 0);
    return res;
  }
  /* The failure was recorded (and logged) on the helper's thread; repeat it on ours so
   * ncclxGetLastError(NULL) tells the caller. */
  if (res != ncclxSuccess) ncclxSetError(res, "%s", err);
  return res;
}

ncclxResult_t fuseCallbackFailed(fuseOp* f, const char* which, int rank, int rc) {
  ncclxResult_t res =
      commFail(f->comm, ncclxInvalidUsage,
               "%s #%llu: the %s callback returned %d for the block of rank %d; the operation "
               "is aborted on every rank",
               f->name, (unsigned long long)f->seq, which, rc, rank);
  /* Our own step in flight must stop too: the abort flag ends it at its next wait. */
  atomic_store(&f->comm->abortFlag, 1);
  if (fuseHelperBusy(f->helper)) (void)fuseHelperWait(f->helper, 0, NULL, 0);
  return res;
}

/* ---------------- memory and slicing ---------------- */

ncclxResult_t fuseScratch(fuseOp* f, size_t bytes, char** out) {
  *out = commScratch(f->comm, bytes ? bytes : 1);
  if (*out) return ncclxSuccess;
  return commFail(f->comm, ncclxSystemError, "%s #%llu: cannot allocate %zu bytes of staging",
                  f->name, (unsigned long long)f->seq, bytes);
}

int fuseSliceCount(const fuseOp* f) {
  size_t units = f->count / f->sched.unit;
  size_t k = (size_t)f->sched.slices;
  if (k > units) k = units;
  return k ? (int)k : 1;
}

void fuseSlice(const fuseOp* f, int k, int s, size_t* off, size_t* len) {
  size_t units = f->count / f->sched.unit;
  /* Balanced: the first units % k slices get one unit more (no overflow for any count). */
  size_t base = units / (size_t)k, extra = units % (size_t)k, ss = (size_t)s;
  size_t lo = base * ss + (ss < extra ? ss : extra);
  *off = lo * f->sched.unit;
  *len = (base + (ss < extra)) * f->sched.unit;
}
