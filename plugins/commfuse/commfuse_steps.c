/* CommFuse step machinery: point-to-point steps on the executing thread or on the helper,
 * ring collectives on one slice run to completion (SEQUENTIAL; SLICED and RING_P2P run the
 * same rings as flows, commfuse_flow.c), waiting, and aborting on a failed callback. */
#include <errno.h>
#include <string.h>
#include <time.h>

#include "commfuse_internal.h"
#include "commfuse_trace.h"

/* ---------------- steps ---------------- */

ncclxResult_t fuseStepRun(fuseOp* f, fuseXfer* x, int n) {
  if (f->sched.linkBytesPerSec <= 0) {
    NCCLX_CHECK(fuseCore->stepRun(f->comm, x, n));
    FUSE_TRACE("h.landed", 0, 0);
    return ncclxSuccess;
  }
  /* Emulated link: every transfer to or from a peer is preceded by its 8-byte stamp (the
   * same rule as flows), and the step ends when the last link time has passed. */
  enum { MAXX = 8 };
  if (n > MAXX / 2)
    return fuseCore->setError(ncclxInternalError, "%s: a step of %d transfers", f->name, n);
  fuseXfer all[MAXX];
  double stamps[MAXX / 2];
  int m = 0;
  memset(all, 0, sizeof(all));
  for (int i = 0; i < n; i++) {
    if (x[i].peer != f->info.rank) {
      stamps[i] = x[i].isSend ? fuseLinkStamp(f, x[i].peer, x[i].bytes) : 0;
      all[m++] = (fuseXfer){.peer = x[i].peer, .isSend = x[i].isSend, .buf = &stamps[i], .bytes = sizeof(double)};
    } else {
      stamps[i] = 0;
    }
    all[m++] = x[i];
  }
  NCCLX_CHECK(fuseCore->stepRun(f->comm, all, m));
  FUSE_TRACE("h.landed", 0, 0);
  double until = 0;
  for (int i = 0; i < n; i++)
    if (stamps[i] > until) until = stamps[i];
  fuseSleepUntil(until); /* a sleep: the link costs no CPU, like a DMA engine */
  FUSE_TRACE("h.linkdone", 0, 0);
  return ncclxSuccess;
}

static ncclxResult_t jobStep(void* arg) {
  fuseOp* f = arg;
  fuseCore->logSetRank(f->info.rank);
  return fuseStepRun(f, f->xfers, f->nxfers);
}

void fuseStepStart(fuseOp* f, const fuseXfer* x, int n) {
  memcpy(f->xfers, x, sizeof(*x) * (size_t)n);
  f->nxfers = n;
  if (f->helper) fuseHelperStart(f->helper, jobStep, f);
  else f->inlineRes = jobStep(f);
}

/* ---------------- ring collectives on a slice ---------------- */

/* All-gather, in recvbuff, of bytes [off, off+len) of every block: the ring forwards each
 * rank's slice (own first). This rank's slice must already be in place. */
ncclxResult_t fuseAgSliceRun(fuseOp* f, size_t off, size_t len) {
  int n = f->info.nranks, r = f->info.rank;
  size_t blk = f->count * f->typeSize;
  char* base = (char*)f->recvbuff + off;
  for (int s = 0; s < n - 1; s++) {
    int sb = (r - s + n) % n, rb = (r - s - 1 + n) % n;
    fuseXfer x[2];
    memset(x, 0, sizeof(x));
    x[0] = (fuseXfer){.peer = (r + 1) % n, .isSend = 1, .buf = base + (size_t)sb * blk, .bytes = len};
    x[1] = (fuseXfer){.peer = (r - 1 + n) % n, .isSend = 0, .buf = base + (size_t)rb * blk, .bytes = len};
    NCCLX_CHECK(fuseStepRun(f, x, 2));
  }
  return ncclxSuccess;
}

/* Reduce-scatter of nranks contiguous pieces of len bytes (piece b = this rank's
 * contribution to rank b's block) into dst. The partial of piece b starts at rank b+1 and
 * moves one rank forward per step, each rank adding its own piece, until it reaches rank b:
 * the same chain and operand order as RING_P2P, so both give bit-identical results.
 * partials: two pieces of scratch. */
ncclxResult_t fuseRsSliceRun(fuseOp* f, char* blocks, size_t len, char* dst, char* partials) {
  int n = f->info.nranks, r = f->info.rank;
  size_t elems = len / f->typeSize;
  if (n == 1) {
    if (dst != blocks) memmove(dst, blocks, len);
    return ncclxSuccess;
  }
  char* part[2] = {partials, partials + len};
  for (int s = 0; s < n - 1; s++) {
    int sb = (r - s - 1 + n) % n, rb = (r - s - 2 + 2 * n) % n;
    fuseXfer x[2];
    memset(x, 0, sizeof(x));
    x[0] = (fuseXfer){.peer = (r + 1) % n, .isSend = 1,
                       .buf = s == 0 ? blocks + (size_t)sb * len : part[(s - 1) % 2], .bytes = len};
    x[1] = (fuseXfer){.peer = (r - 1 + n) % n, .isSend = 0, .buf = part[s % 2], .bytes = len};
    NCCLX_CHECK(fuseStepRun(f, x, 2));
    char* out = s == n - 2 ? dst : part[s % 2]; /* the last one is this rank's block */
    fuseCore->reduce(out, blocks + (size_t)rb * len, part[s % 2], elems, f->type, f->op);
  }
  return ncclxSuccess;
}

/* ---------------- waiting and failing ---------------- */

/* How long a helper job may take before we stop trusting it: the transports give up after
 * the communicator's timeout of no progress, plus the emulated link's sleeps. */
static double waitBoundSec(const fuseOp* f) {
  if (f->info.timeoutSec <= 0) return 0;
  double bound = f->info.timeoutSec + 30;
  if (f->sched.linkBytesPerSec > 0)
    bound += (double)f->count * (double)f->typeSize * f->info.nranks / f->sched.linkBytesPerSec;
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
    res = fuseCore->fail(f->comm, ncclxInternalError,
                   "%s #%llu: the progress thread did not finish a step within %.0f s",
                   f->name, (unsigned long long)f->seq, waitBoundSec(f));
    fuseCore->abort(f->comm);
    (void)fuseHelperWait(f->helper, 0, NULL, 0);
    return res;
  }
  /* The failure was recorded (and logged) on the helper's thread; repeat it on ours so
   * ncclxGetLastError(NULL) tells the caller. */
  if (res != ncclxSuccess) fuseCore->setError(res, "%s", err);
  return res;
}

ncclxResult_t fuseCallbackFailed(fuseOp* f, const char* which, int rank, int rc) {
  ncclxResult_t res =
      fuseCore->fail(f->comm, ncclxInvalidUsage,
               "%s #%llu: the %s callback returned %d for the block of rank %d; the operation "
               "is aborted on every rank",
               f->name, (unsigned long long)f->seq, which, rc, rank);
  /* Our own step in flight must stop too: the abort flag ends it at its next wait. */
  fuseCore->abort(f->comm);
  if (fuseHelperBusy(f->helper)) (void)fuseHelperWait(f->helper, 0, NULL, 0);
  return res;
}

/* ---------------- memory and slicing ---------------- */

ncclxResult_t fuseScratch(fuseOp* f, size_t bytes, char** out) {
  void* p = NULL;
  ncclxResult_t res = fuseCore->scratch(f->comm, bytes ? bytes : 1, &p);
  *out = p;
  return res;
}

int fuseSliceCount(const fuseOp* f) {
  size_t units = f->count / f->sched.unit;
  size_t k = (size_t)f->sched.slices;
  if (k > units) k = units;
  return k ? (int)k : 1;
}

/* RING_P2P's automatic piece count: pieces of about FUSE_AUTO_PIECE_BYTES, at most
 * FUSE_AUTO_PIECES_BUDGET / nranks of them: 2 at 2 ranks, 1 from 3 ranks on. With p = 1,
 * what is left after the last transfer when communication dominates is one block of
 * compute, G/N, so more pieces pay most at few ranks; but each piece costs a handshake and
 * a smaller GEMM (measured: up to 13% more compute at 4 pieces for wide GEMMs, which
 * re-read the whole right-hand matrix per piece). fuse-bench's best p at M ~ G was 2 at
 * 2 ranks and 1 at 4; p = 1 won wherever compute dominated. */
#define FUSE_AUTO_PIECE_BYTES ((size_t)256 << 10)
#define FUSE_AUTO_PIECES_BUDGET 4

int fuseAutoPieces(size_t count, size_t typeSize, size_t unit, int nranks) {
  size_t bytes = count * typeSize, units = unit ? count / unit : count;
  size_t p = (bytes + FUSE_AUTO_PIECE_BYTES / 2) / FUSE_AUTO_PIECE_BYTES;
  size_t cap = nranks > 0 ? (size_t)(FUSE_AUTO_PIECES_BUDGET / nranks) : 1;
  if (p > cap) p = cap;
  if (p > units) p = units;
  return p ? (int)p : 1;
}

int fuseRingPieces(const fuseOp* f) {
  if (f->sched.slices > 0) return fuseSliceCount(f);
  return fuseAutoPieces(f->count, f->typeSize, f->sched.unit, f->info.nranks);
}

void fuseSlice(const fuseOp* f, int k, int s, size_t* off, size_t* len) {
  size_t units = f->count / f->sched.unit;
  /* Balanced: the first units % k slices get one unit more (no overflow for any count). */
  size_t base = units / (size_t)k, extra = units % (size_t)k, ss = (size_t)s;
  size_t lo = base * ss + (ss < extra ? ss : extra);
  *off = lo * f->sched.unit;
  *len = (base + (ss < extra)) * f->sched.unit;
}
