/* CommFuse all-to-all: produce the block for each destination, exchange pairwise, consume
 * each received block (Ulysses' sequence-shard <-> head-shard re-layout with the projection
 * before it and the attention after it).
 *
 * Pairwise (RING_P2P and DIRECT_P2P alike): step t = 1..N-1 sends to r+t and receives from
 * r-t; while step t moves, the executing thread produces the block for step t+1 and
 * consumes the block received in step t-1. The own block needs no transfer: it is produced
 * first (straight into recvbuff) and consumed while step 1 moves. SEQUENTIAL and SLICED(k)
 * run the same pairwise exchange per slice: produce all of slice s, exchange it on the
 * helper while producing slice s+1 and consuming slice s-1. Callbacks come in the same
 * orders under every schedule: produce for r, r+1, ..., r-1; consume r, r-1, ..., r+1. */
#include <string.h>

#include "commfuse_internal.h"

static size_t align64(size_t bytes) { return (bytes + 63) & ~(size_t)63; }

static char* blockAt(const fuseOp* f, int rank, size_t offElems) {
  return (char*)f->recvbuff + ((size_t)rank * f->count + offElems) * f->typeSize;
}

static ncclxResult_t produceOne(fuseOp* f, int dst, size_t off, void* out, size_t len) {
  int rc = f->produce(f->user, dst, off, out, len);
  return rc ? fuseCallbackFailed(f, "produce", dst, rc) : ncclxSuccess;
}

static ncclxResult_t consumeOne(fuseOp* f, int src, size_t off, size_t len) {
  if (!f->consume) return ncclxSuccess;
  int rc = f->consume(f->user, src, off, blockAt(f, src, off), len);
  return rc ? fuseCallbackFailed(f, "consume", src, rc) : ncclxSuccess;
}

/* ---------------- pairwise ---------------- */

static ncclxResult_t a2aPairwise(fuseOp* f) {
  int n = f->info.nranks, r = f->info.rank;
  size_t blk = f->count * f->typeSize, stride = align64(blk);
  char* stage = NULL;
  if (n > 1) NCCLX_CHECK(fuseScratch(f, 2 * stride, &stage));
  NCCLX_CHECK(produceOne(f, r, 0, blockAt(f, r, 0), f->count));
  for (int t = 1; t < n; t++) {
    int dst = (r + t) % n, src = (r - t + n) % n;
    char* out = stage + (size_t)(t % 2) * stride; /* step t-2 used it: waited for */
    NCCLX_CHECK(produceOne(f, dst, 0, out, f->count));
    NCCLX_CHECK(fuseWait(f)); /* step t-1 */
    fuseXfer x[2];
    memset(x, 0, sizeof(x));
    x[0] = (fuseXfer){.peer = dst, .isSend = 1, .buf = out, .bytes = blk};
    x[1] = (fuseXfer){.peer = src, .isSend = 0, .buf = blockAt(f, src, 0), .bytes = blk};
    fuseStepStart(f, x, 2);
    NCCLX_CHECK(consumeOne(f, (r - t + 1 + n) % n, 0, f->count)); /* arrived in step t-1 */
  }
  NCCLX_CHECK(fuseWait(f));
  return consumeOne(f, (r + 1) % n, 0, f->count); /* arrived in the last step (own if n == 1) */
}

/* ---------------- sequential and sliced ---------------- */

/* Exchange bytes [off, off+len) of every block: stage holds the outgoing pieces (piece d
 * for rank d, len bytes each), received pieces land in recvbuff. */
static ncclxResult_t a2aSliceRun(fuseOp* f, char* stage, size_t off, size_t len) {
  int n = f->info.nranks, r = f->info.rank;
  for (int t = 1; t < n; t++) {
    int dst = (r + t) % n, src = (r - t + n) % n;
    fuseXfer x[2];
    memset(x, 0, sizeof(x));
    x[0] = (fuseXfer){.peer = dst, .isSend = 1, .buf = stage + (size_t)dst * len, .bytes = len};
    x[1] = (fuseXfer){.peer = src, .isSend = 0, .buf = blockAt(f, src, 0) + off, .bytes = len};
    NCCLX_CHECK(fuseStepRun(f, x, 2));
  }
  return ncclxSuccess;
}

static ncclxResult_t jobA2aSlice(void* arg) {
  fuseOp* f = arg;
  fuseCore->logSetRank(f->info.rank);
  return a2aSliceRun(f, f->jobBase, f->jobOff, f->jobLen);
}

static void a2aSliceStart(fuseOp* f, char* stage, size_t off, size_t len) {
  f->jobBase = stage;
  f->jobOff = off;
  f->jobLen = len;
  if (f->helper) fuseHelperStart(f->helper, jobA2aSlice, f);
  else f->inlineRes = jobA2aSlice(f);
}

static ncclxResult_t consumeSlice(fuseOp* f, int k, int s) {
  int n = f->info.nranks, r = f->info.rank;
  size_t off, len;
  fuseSlice(f, k, s, &off, &len);
  for (int t = 0; t < n; t++) NCCLX_CHECK(consumeOne(f, (r - t + n) % n, off, len));
  return ncclxSuccess;
}

/* SLICED(k), and SEQUENTIAL as k = 1 (produce all, exchange, consume all). */
static ncclxResult_t a2aSliced(fuseOp* f, int k) {
  int n = f->info.nranks, r = f->info.rank;
  size_t ts = f->typeSize, off, maxLen;
  fuseSlice(f, k, 0, &off, &maxLen); /* the first slice is the largest */
  size_t stageBytes = align64((size_t)n * maxLen * ts);
  char* scratch;
  NCCLX_CHECK(fuseScratch(f, (k > 1 ? 2 : 1) * stageBytes, &scratch));
  for (int s = 0; s < k; s++) {
    size_t len;
    fuseSlice(f, k, s, &off, &len);
    char* stage = scratch + (size_t)(s % 2) * stageBytes; /* slice s-2's: waited for */
    for (int t = 0; t < n; t++) {
      int dst = (r + t) % n;
      char* out = dst == r ? blockAt(f, r, off) : stage + (size_t)dst * len * ts;
      NCCLX_CHECK(produceOne(f, dst, off, out, len));
    }
    NCCLX_CHECK(fuseWait(f)); /* slice s-1's exchange */
    a2aSliceStart(f, stage, off * ts, len * ts);
    if (s > 0) NCCLX_CHECK(consumeSlice(f, k, s - 1));
  }
  NCCLX_CHECK(fuseWait(f));
  return consumeSlice(f, k, k - 1);
}

ncclxResult_t fuseAllToAll(fuseOp* f) {
  switch (f->sched.algo) {
    case ncclxFuseSequential: return a2aSliced(f, 1);
    case ncclxFuseSliced: return a2aSliced(f, fuseSliceCount(f));
    case ncclxFuseRingP2P:
    case ncclxFuseDirectP2P: return a2aPairwise(f);
    default: return fuseCore->setError(ncclxInternalError, "%s: schedule %d", f->name, (int)f->sched.algo);
  }
}
