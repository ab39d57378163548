/* CommFuse reduce-scatter schedules: all the compute then the ring collective
 * (SEQUENTIAL), slice by slice (SLICED), and partials sent straight to their owner
 * (DIRECT_P2P). RING_P2P, a partial that travels the ring and gains one rank's
 * contribution per step, is a pipeline in commfuse_pipe.c. The own block is always produced last: after it, only a local reduction
 * remains for the P2P schedules. */
#include <string.h>

#include "commfuse_flow.h"

static size_t align64(size_t bytes) { return (bytes + 63) & ~(size_t)63; }

static ncclxResult_t produceInto(fuseOp* f, int dst, size_t off, void* out, size_t len) {
  int rc = f->produce(f->user, dst, off, out, len);
  return rc ? fuseCallbackFailed(f, "produce", dst, rc) : ncclxSuccess;
}

/* Avg is a Sum until here: divide once, on the finished block. */
static ncclxResult_t finish(fuseOp* f) {
  if (f->op == ncclxAvg) fuseCore->avgFinish(f->recvbuff, f->count, f->type, f->info.nranks);
  return ncclxSuccess;
}

/* The ring reduce-scatter of one slice as a flow: nranks pieces of len bytes in `blocks`
 * (piece b = this rank's contribution to rank b's block). The partial of piece b starts at
 * rank b+1 and gains one rank's piece per step until it reaches rank b, the same chain and
 * operand order as RING_P2P and fuseRsSliceRun; the last sum lands in dst. */
static ncclxResult_t rsSliceFlow(fuseOp* f, fuseFlow* w, char* blocks, size_t len, char* dst, char* partials) {
  int n = f->info.nranks, r = f->info.rank;
  char* part[2] = {partials, partials + len};
  NCCLX_CHECK(fuseFlowInit(w, f, n - 1));
  for (int i = 0; i < n - 1; i++) {
    int sb = (r - i - 1 + n) % n, rb = (r - i - 2 + 2 * n) % n;
    fuseFlowStep* st = &w->steps[i];
    st->send = (fuseHalf){.peer = (r + 1) % n, .buf = i == 0 ? blocks + (size_t)sb * len : part[(i - 1) % 2],
                          .bytes = len};
    st->recv = (fuseHalf){.peer = (r - 1 + n) % n, .buf = part[i % 2], .bytes = len};
    st->sendAfterRecv = i - 1;           /* forwards the sum completed in step i-1 */
    st->recvAfterSend = i >= 2 ? i - 1 : -1; /* part[i % 2] was sent in step i-1 */
    st->redDst = i == n - 2 ? dst : part[i % 2];
    st->redA = blocks + (size_t)rb * len;
    st->redElems = len / f->typeSize;
  }
  ncclxResult_t res = fuseFlowStart(w);
  return res == ncclxSuccess ? res : fuseFlowEnd(w, res); /* frees it */
}

/* SLICED(k), and SEQUENTIAL as its k = 1: slice s of every block is produced while slice
 * s-1's ring reduce-scatter moves (the computing thread makes it progress between the
 * produce calls); the last slice's has nothing left to overlap (the tail). */
static ncclxResult_t rsSliced(fuseOp* f, int k) {
  int n = f->info.nranks, r = f->info.rank;
  size_t ts = f->typeSize, off, len, maxLen;
  fuseSlice(f, k, 0, &off, &maxLen); /* the first slice is the largest */
  size_t stageBytes = align64((size_t)n * maxLen * ts), nstage = k > 1 ? 2 : 1;
  char* scratch;
  NCCLX_CHECK(fuseScratch(f, nstage * stageBytes + 2 * maxLen * ts, &scratch));
  char* partials = scratch + nstage * stageBytes;
  fuseFlow w;
  int inFlight = 0;
  for (int s = 0; s < k; s++) {
    fuseSlice(f, k, s, &off, &len);
    size_t lenB = len * ts;
    char* stage = scratch + (size_t)(s % 2) * stageBytes;
    ncclxResult_t res = ncclxSuccess;
    for (int t = 0; t < n && res == ncclxSuccess; t++) {
      int b = (r - t - 1 + n) % n;
      res = produceInto(f, b, off, stage + (size_t)b * lenB, len);
      if (res == ncclxSuccess && inFlight) res = fuseFlowPump(&w);
    }
    if (inFlight) res = fuseFlowEnd(&w, res); /* slice s-1: its stage and the partials are free */
    inFlight = 0;
    NCCLX_CHECK(res);
    char* dst = (char*)f->recvbuff + off * ts;
    if (k == 1 || n == 1) {
      NCCLX_CHECK(fuseRsSliceRun(f, stage, lenB, dst, partials));
    } else {
      NCCLX_CHECK(rsSliceFlow(f, &w, stage, lenB, dst, partials));
      inFlight = 1;
    }
  }
  if (inFlight) NCCLX_CHECK(fuseFlowEnd(&w, ncclxSuccess));
  return finish(f);
}

/* DIRECT_P2P: step t produces the partial for block b = r+t+1 while the partial of step
 * t-1 goes straight to its owner and the partial for our block from r-t arrives; received
 * partials are summed as they come and added to the own partial (produced last) at the end.
 * Traffic goes to every peer instead of one neighbour. */
static ncclxResult_t rsDirect(fuseOp* f) {
  int n = f->info.nranks, r = f->info.rank;
  size_t blk = f->count * f->typeSize, stride = align64(blk);
  char* scratch = NULL;
  if (n > 1) NCCLX_CHECK(fuseScratch(f, 5 * stride, &scratch));
  char *part[2] = {scratch, scratch + stride}, *in[2] = {scratch + 2 * stride, scratch + 3 * stride};
  char* acc = scratch + 4 * stride;
  for (int t = 0; t < n; t++) {
    int b = (r + t + 1) % n;
    char* out = t == n - 1 ? (char*)f->recvbuff : part[t % 2];
    NCCLX_CHECK(produceInto(f, b, 0, out, f->count));
    if (t > 0) NCCLX_CHECK(fuseWait(f));
    if (t < n - 1) {
      fuseXfer x[2];
      memset(x, 0, sizeof(x));
      x[0] = (fuseXfer){.peer = b, .isSend = 1, .buf = out, .bytes = blk};
      x[1] = (fuseXfer){.peer = (r - t - 1 + n) % n, .isSend = 0, .buf = in[t % 2], .bytes = blk};
      fuseStepStart(f, x, 2);
    }
    /* The partial that arrived in step t-1 (in[(t-1)%2], not the one now in flight). */
    if (t == 1) memcpy(acc, in[0], blk);
    else if (t > 1) fuseCore->reduce(acc, acc, in[(t - 1) % 2], f->count, f->type, f->op);
  }
  if (n > 1) fuseCore->reduce(f->recvbuff, f->recvbuff, acc, f->count, f->type, f->op);
  return finish(f);
}

ncclxResult_t fuseReduceScatter(fuseOp* f) {
  switch (f->sched.algo) {
    case ncclxFuseSequential: return rsSliced(f, 1);
    case ncclxFuseSliced: return rsSliced(f, fuseSliceCount(f));
    case ncclxFuseRingP2P: return fusePipeReduceScatter(f); /* commfuse_pipe.c */
    case ncclxFuseDirectP2P: return rsDirect(f);
    default: return fuseCore->setError(ncclxInternalError, "%s: schedule %d", f->name, (int)f->sched.algo);
  }
}
