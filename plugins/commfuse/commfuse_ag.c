/* CommFuse all-gather schedules: the ring collective then compute (SEQUENTIAL), slice by
 * slice (SLICED), and one block of compute per point-to-point step (RING_P2P, DIRECT_P2P).
 * Every schedule consumes blocks in the same order, own block first, so an order-dependent
 * consumer (one that accumulates across blocks) gets the same result under each. */
#include <string.h>

#include "commfuse_flow.h"

static char* blockAt(const fuseOp* f, int rank, size_t offElems) {
  return (char*)f->recvbuff + ((size_t)rank * f->count + offElems) * f->typeSize;
}

/* memmove: sendbuff may be this rank's own block of recvbuff (in place). */
static void placeOwn(const fuseOp* f) {
  char* own = blockAt(f, f->info.rank, 0);
  if (own != (const char*)f->sendbuff) memmove(own, f->sendbuff, f->count * f->typeSize);
}

static ncclxResult_t consumeBlock(fuseOp* f, int src, size_t off, size_t len) {
  int rc = f->consume(f->user, src, off, blockAt(f, src, off), len);
  return rc ? fuseCallbackFailed(f, "consume", src, rc) : ncclxSuccess;
}

/* The ring all-gather of elements [off, off+len) of every block as a flow: step i
 * forwards block r-i's slice (received in step i-1) and receives block r-i-1's. */
static ncclxResult_t agSliceFlow(fuseOp* f, fuseFlow* w, size_t off, size_t len) {
  int n = f->info.nranks, r = f->info.rank;
  NCCLX_CHECK(fuseFlowInit(w, f, n - 1));
  for (int i = 0; i < n - 1; i++) {
    fuseFlowStep* st = &w->steps[i];
    st->send = (fuseHalf){.peer = (r + 1) % n, .buf = blockAt(f, (r - i + n) % n, off), .bytes = len * f->typeSize};
    st->recv = (fuseHalf){.peer = (r - 1 + n) % n, .buf = blockAt(f, (r - i - 1 + n) % n, off),
                          .bytes = len * f->typeSize};
    st->sendAfterRecv = i - 1;
  }
  ncclxResult_t res = fuseFlowStart(w);
  return res == ncclxSuccess ? res : fuseFlowEnd(w, res); /* frees it */
}

/* SLICED(k), and SEQUENTIAL as its k = 1: slice 0 is gathered with nothing to overlap (the
 * head), then slice s+1's ring moves while slice s is consumed: the computing thread
 * makes it progress between the consume calls, as RING_P2P does between pieces. */
static ncclxResult_t agSliced(fuseOp* f, int k) {
  int n = f->info.nranks, r = f->info.rank;
  size_t ts = f->typeSize, off, len;
  placeOwn(f);
  fuseSlice(f, k, 0, &off, &len);
  if (k == 1) {
    NCCLX_CHECK(fuseAgSliceRun(f, off * ts, len * ts));
    for (int t = 0; t < n; t++) NCCLX_CHECK(consumeBlock(f, (r - t + n) % n, off, len));
    return ncclxSuccess;
  }
  fuseFlow w;
  NCCLX_CHECK(agSliceFlow(f, &w, off, len));
  NCCLX_CHECK(fuseFlowEnd(&w, ncclxSuccess));
  for (int s = 0; s < k; s++) {
    size_t curOff = off, curLen = len;
    int next = s + 1 < k;
    if (next) {
      fuseSlice(f, k, s + 1, &off, &len);
      NCCLX_CHECK(agSliceFlow(f, &w, off, len));
    }
    ncclxResult_t res = ncclxSuccess;
    for (int t = 0; t < n && res == ncclxSuccess; t++) {
      res = consumeBlock(f, (r - t + n) % n, curOff, curLen);
      if (res == ncclxSuccess && next) res = fuseFlowPump(&w);
    }
    if (next) res = fuseFlowEnd(&w, res);
    NCCLX_CHECK(res);
  }
  return ncclxSuccess;
}

/* DIRECT_P2P: step t consumes block r-t while the own block goes to r+t+1 and block r-t-1
 * arrives from its owner. The own block needs no transfer: no head. (RING_P2P, the same
 * order with every block forwarded along the ring, is a pipeline: commfuse_pipe.c.) */
static ncclxResult_t agDirect(fuseOp* f) {
  int n = f->info.nranks, r = f->info.rank;
  size_t blk = f->count * f->typeSize;
  placeOwn(f);
  for (int t = 0; t < n; t++) {
    int j = (r - t + n) % n, incoming = (r - t - 1 + n) % n;
    if (t < n - 1) {
      fuseXfer x[2];
      memset(x, 0, sizeof(x));
      x[0] = (fuseXfer){.peer = (r + t + 1) % n, .isSend = 1,
                         .buf = blockAt(f, r, 0), .bytes = blk};
      x[1] = (fuseXfer){.peer = incoming, .isSend = 0,
                         .buf = blockAt(f, incoming, 0), .bytes = blk};
      fuseStepStart(f, x, 2);
    }
    NCCLX_CHECK(consumeBlock(f, j, 0, f->count));
    NCCLX_CHECK(fuseWait(f));
  }
  return ncclxSuccess;
}

ncclxResult_t fuseAllGather(fuseOp* f) {
  switch (f->sched.algo) {
    case ncclxFuseSequential: return agSliced(f, 1);
    case ncclxFuseSliced: return agSliced(f, fuseSliceCount(f));
    case ncclxFuseRingP2P: return fusePipeAllGather(f);
    case ncclxFuseDirectP2P: return agDirect(f);
    default: return fuseCore->setError(ncclxInternalError, "%s: schedule %d", f->name, (int)f->sched.algo);
  }
}
