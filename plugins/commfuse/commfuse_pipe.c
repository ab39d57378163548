/* CommFuse RING_P2P as a pipeline driven by the computing thread: every ring step of the
 * call is a flow (commfuse_flow.h) of pieces; the thread posts the transfers, computes one
 * piece at a time, and between pieces lets the flow test, forward and post what is ready.
 *
 * With p pieces per block, a received block is consumed (all-gather) or a partial is
 * reduced and forwarded (reduce-scatter) piece by piece, so when communication is slower
 * than compute only one piece of compute is left after the last transfer, instead of one
 * block; and the pieces of the own block are the moments at which the first transfers
 * make progress while the own block is being computed.
 *
 * Orders, results and callbacks are those of the step-by-step RING_P2P: blocks r, r-1, ...
 * consumed in that order (own first); partials for r-1, r-2, ..., r produced in that
 * order (own last), each sum taken as own + received, the same chain as SEQUENTIAL. */
#include <string.h>

#include "commfuse_flow.h"
#include "commfuse_trace.h"

static char* blockAt(const fuseOp* f, int rank, size_t offElems) {
  return (char*)f->recvbuff + ((size_t)rank * f->count + offElems) * f->typeSize;
}

/* ---------------- all-gather ---------------- */

static ncclxResult_t agConsume(fuseOp* f, int src, int q, int p) {
  size_t off, len;
  fuseSlice(f, p, q, &off, &len);
  FUSE_TRACE("c.consume", src, q);
  int rc = f->consume(f->user, src, off, blockAt(f, src, off), len);
  FUSE_TRACE("c.consumed", src, q);
  return rc ? fuseCallbackFailed(f, "consume", src, rc) : ncclxSuccess;
}

/* Step k = t*p + q forwards piece q of block r-t to r+1 (for t > 0 once it has arrived:
 * step k-p's receive) and receives piece q of block r-t-1 from r-1. */
static ncclxResult_t agFlow(fuseOp* f, fuseFlow* w, int p) {
  int n = f->info.nranks, r = f->info.rank;
  NCCLX_CHECK(fuseFlowInit(w, f, (n - 1) * p));
  for (int t = 0; t < n - 1; t++)
    for (int q = 0; q < p; q++) {
      fuseFlowStep* s = &w->steps[t * p + q];
      size_t off, len;
      fuseSlice(f, p, q, &off, &len);
      /* Step 0 sends the own block from sendbuff: it is copied into recvbuff meanwhile. */
      char* src = t == 0 ? (char*)f->sendbuff + off * f->typeSize : blockAt(f, (r - t + n) % n, off);
      s->send = (fuseHalf){.peer = (r + 1) % n, .buf = src, .bytes = len * f->typeSize};
      s->recv = (fuseHalf){.peer = (r - 1 + n) % n, .buf = blockAt(f, (r - t - 1 + n) % n, off),
                           .bytes = len * f->typeSize};
      s->sendAfterRecv = t > 0 ? (t - 1) * p + q : -1;
    }
  return ncclxSuccess;
}

ncclxResult_t fusePipeAllGather(fuseOp* f) {
  int n = f->info.nranks, r = f->info.rank, p = fuseRingPieces(f);
  char* own = blockAt(f, r, 0);
  fuseFlow w = {0};
  ncclxResult_t res = ncclxSuccess;
  if (n > 1) {
    NCCLX_CHECK(agFlow(f, &w, p));
    res = fuseFlowStart(&w);
  }
  /* After posting (the transfers start at once); in place, nothing to copy. */
  FUSE_TRACE("c.placeown", 0, 0);
  if (own != (const char*)f->sendbuff) memmove(own, f->sendbuff, f->count * f->typeSize);
  FUSE_TRACE("c.placedown", 0, 0);
  if (res == ncclxSuccess && n > 1) res = fuseFlowPump(&w);
  FUSE_TRACE("c.pumped", 0, 0);
  for (int q = 0; q < p && res == ncclxSuccess; q++) { /* no head */
    res = agConsume(f, r, q, p);
    if (res == ncclxSuccess && n > 1) res = fuseFlowPump(&w);
  }
  for (int t = 1; t < n && res == ncclxSuccess; t++)
    for (int q = 0; q < p && res == ncclxSuccess; q++) {
      res = fuseFlowWait(&w, (t - 1) * p + q, 0);
      if (res == ncclxSuccess) res = agConsume(f, (r - t + n) % n, q, p);
      if (res == ncclxSuccess) res = fuseFlowPump(&w);
    }
  if (n > 1) res = fuseFlowEnd(&w, res);
  return res;
}

/* ---------------- reduce-scatter ---------------- */

static size_t align64(size_t bytes) { return (bytes + 63) & ~(size_t)63; }

/* Step k = t*p + q sends piece q of step t's sum (once produced and reduced: held) to r+1
 * and receives r-1's partial for step t+1's piece q into acc[(t+1) % 2]. That buffer was
 * read by the reduction of step t-1, so receives from t = 2 on are held until then. */
static ncclxResult_t rsFlow(fuseOp* f, fuseFlow* w, int p, char* tmp[2], char* acc[2]) {
  int n = f->info.nranks, r = f->info.rank;
  NCCLX_CHECK(fuseFlowInit(w, f, (n - 1) * p));
  for (int t = 0; t < n - 1; t++)
    for (int q = 0; q < p; q++) {
      fuseFlowStep* s = &w->steps[t * p + q];
      size_t off, len;
      fuseSlice(f, p, q, &off, &len);
      size_t offB = off * f->typeSize, lenB = len * f->typeSize;
      s->send = (fuseHalf){.peer = (r + 1) % n, .buf = tmp[t % 2] + offB, .bytes = lenB, .held = 1};
      s->recv = (fuseHalf){.peer = (r - 1 + n) % n, .buf = acc[(t + 1) % 2] + offB, .bytes = lenB, .held = t >= 2};
    }
  return ncclxSuccess;
}

/* Add the partial received for piece q of step t (t > 0) and let the sum go on (t < n-1). */
static ncclxResult_t rsReduce(fuseOp* f, fuseFlow* w, int t, int q, int p, char* out, char* acc[2]) {
  int n = f->info.nranks, k = (t - 1) * p + q; /* the receive of r-1's partial for it */
  size_t off, len;
  fuseSlice(f, p, q, &off, &len);
  size_t offB = off * f->typeSize;
  NCCLX_CHECK(fuseFlowWait(w, k, 0));
  fuseCore->reduce(out + offB, out + offB, acc[t % 2] + offB, len, f->type, f->op);
  fuseFlowRelease(w, k + 2 * p, 0); /* acc[t % 2] is free for step t+1's receive */
  if (t < n - 1) fuseFlowRelease(w, t * p + q, 1);
  return ncclxSuccess;
}

/* Step t: produce every piece; between pieces, add each received partial as soon as it is
 * here (in piece order), so a late partial never stops the compute; then add the rest. */
static ncclxResult_t rsStep(fuseOp* f, fuseFlow* w, int t, int p, char* out, char* acc[2]) {
  int n = f->info.nranks, r = f->info.rank, b = (r - t - 1 + n) % n, reduced = 0;
  for (int q = 0; q < p; q++) {
    size_t off, len;
    fuseSlice(f, p, q, &off, &len);
    /* tmp[t % 2] held step t-2's sums: they must have gone. */
    if (t >= 2 && t < n - 1) NCCLX_CHECK(fuseFlowWait(w, (t - 2) * p + q, 1));
    FUSE_TRACE("c.produce", t, q);
    int rc = f->produce(f->user, b, off, out + off * f->typeSize, len);
    FUSE_TRACE("c.produced", t, q);
    if (rc) return fuseCallbackFailed(f, "produce", b, rc);
    if (n == 1) continue;
    if (t == 0) fuseFlowRelease(w, q, 1);
    NCCLX_CHECK(fuseFlowPump(w));
    while (t > 0 && reduced <= q && fuseFlowDone(w, (t - 1) * p + reduced, 0))
      NCCLX_CHECK(rsReduce(f, w, t, reduced++, p, out, acc));
  }
  while (t > 0 && n > 1 && reduced < p) NCCLX_CHECK(rsReduce(f, w, t, reduced++, p, out, acc));
  return n > 1 ? fuseFlowPump(w) : ncclxSuccess;
}

ncclxResult_t fusePipeReduceScatter(fuseOp* f) {
  int n = f->info.nranks, p = fuseRingPieces(f);
  size_t stride = align64(f->count * f->typeSize);
  char *scratch = NULL, *tmp[2] = {NULL, NULL}, *acc[2] = {NULL, NULL};
  fuseFlow w = {0};
  ncclxResult_t res = ncclxSuccess;
  if (n > 1) {
    NCCLX_CHECK(fuseScratch(f, 4 * stride, &scratch));
    for (int i = 0; i < 2; i++) tmp[i] = scratch + (size_t)i * stride, acc[i] = scratch + (size_t)(2 + i) * stride;
    NCCLX_CHECK(rsFlow(f, &w, p, tmp, acc));
    res = fuseFlowStart(&w);
  }
  for (int t = 0; t < n && res == ncclxSuccess; t++) {
    char* out = t == n - 1 ? (char*)f->recvbuff : tmp[t % 2];
    res = rsStep(f, &w, t, p, out, acc);
  }
  if (n > 1) res = fuseFlowEnd(&w, res);
  if (res == ncclxSuccess && f->op == ncclxAvg) fuseCore->avgFinish(f->recvbuff, f->count, f->type, n);
  return res;
}
