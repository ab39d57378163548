/* Reduce-scatter: ring, pairwise and linear. sendbuff holds nranks blocks of recvcount
 * elements; rank r ends with the reduction of everyone's block r. In place means recvbuff is
 * this rank's block of sendbuff, which every algorithm reads only when reducing into it.
 * Blocks are processed in pieces of chunkBytes so scratch stays bounded. */
#include <stdlib.h>
#include <string.h>

#include "coll/coll.h"
#include "util/debug.h"
#include "util/reduce.h"
#include "exec/xfer.h"

/* Avg is a Sum divided once at the end, on the finished block. */
static ncclxResult_t finish(const struct ncclxComm* comm, const ncclxCollArgs* a) {
  if (a->op == ncclxAvg) ncclxAvgFinish(a->recvbuff, a->count, a->datatype, comm->nranks);
  return ncclxSuccess;
}

static void copyOwnBlock(const struct ncclxComm* comm, const ncclxCollArgs* a) {
  size_t sz = ncclxTypeSize(a->datatype), bytes = a->count * sz;
  const char* own = (const char*)a->sendbuff + (size_t)comm->rank * bytes;
  if (a->recvbuff != own) memmove(a->recvbuff, own, bytes);
}

/* Ring: the partial sum of block b starts at rank b+1 and moves forward one rank per step,
 * each rank adding its own contribution, until it reaches rank b after n-1 steps. Partials
 * alternate between two scratch pieces (one being sent while the other receives). */
ncclxResult_t reducescatterRing(struct ncclxComm* comm, const ncclxCollArgs* a) {
  int n = comm->nranks, r = comm->rank;
  size_t sz = ncclxTypeSize(a->datatype), rc = a->count;
  if (rc == 0) return ncclxSuccess;
  if (n == 1) {
    copyOwnBlock(comm, a);
    return finish(comm, a);
  }
  const char* send = a->sendbuff;
  char* recv = a->recvbuff;
  int next = (r + 1) % n, prev = (r + n - 1) % n;
  size_t piece = collPieceElems(comm, sz);
  char* scratch;
  NCCLX_CHECK(collScratch(comm, "reducescatter", 3 * piece * sz, &scratch));
  char* bufs[2] = {scratch, scratch + piece * sz};
  char* stage = scratch + 2 * piece * sz;
  /* Incoming pieces are reduced as they arrive, staged in messages of a quarter piece. */
  size_t chunk = (piece / XFER_MAX_INFLIGHT ? piece / XFER_MAX_INFLIGHT : 1) * sz;
  for (size_t off = 0; off < rc; off += piece) {
    size_t len = rc - off < piece ? rc - off : piece, bytes = len * sz;
#define BLOCK(b) (send + ((size_t)(b) * rc + off) * sz)
    for (int s = 0; s < n - 1; s++) {
      int sb = (r - s - 1 + n) % n, rb = (r - s - 2 + 2 * n) % n;
      const char* sp = s == 0 ? BLOCK(sb) : bufs[(s - 1) % 2];
      char* dst = s == n - 2 ? recv + off * sz : bufs[s % 2]; /* the last one is block r */
      ncclxXfer x[2];
      memset(x, 0, sizeof(x));
      x[0] = (ncclxXfer){.peer = next, .isSend = 1, .buf = (void*)sp, .bytes = bytes,
                         .chunk = chunk};
      x[1] = (ncclxXfer){.peer = prev, .isSend = 0, .buf = stage, .bytes = bytes,
                         .chunk = chunk, .redDst = dst, .redOther = BLOCK(rb),
                         .redType = a->datatype, .redOp = a->op};
      NCCLX_CHECK(xferRun(comm, x, 2));
    }
#undef BLOCK
  }
  return finish(comm, a);
}

/* Pairwise: in step k every rank sends block r+k to its owner and reduces what r-k sent for
 * its own block. */
ncclxResult_t reducescatterPairwise(struct ncclxComm* comm, const ncclxCollArgs* a) {
  int n = comm->nranks, r = comm->rank;
  size_t sz = ncclxTypeSize(a->datatype), rc = a->count;
  if (rc == 0) return ncclxSuccess;
  copyOwnBlock(comm, a);
  if (n == 1) return finish(comm, a);
  const char* send = a->sendbuff;
  char* recv = a->recvbuff;
  size_t piece = collPieceElems(comm, sz);
  char* tmp;
  NCCLX_CHECK(collScratch(comm, "reducescatter", piece * sz, &tmp));
  for (size_t off = 0; off < rc; off += piece) {
    size_t len = rc - off < piece ? rc - off : piece, bytes = len * sz;
    for (int k = 1; k < n; k++) {
      int dst = (r + k) % n, src = (r - k + n) % n;
      NCCLX_CHECK(collSendRecv(comm, dst, send + ((size_t)dst * rc + off) * sz, bytes, src, tmp, bytes));
      ncclxReduce2(recv + off * sz, recv + off * sz, tmp, len, a->datatype, a->op);
    }
  }
  return finish(comm, a);
}

/* Linear: every block goes to its owner at once, as a linear all-to-all moves them (all
 * exchanges posted together, no step waiting on the one before), and each rank then reduces
 * the nranks contributions to its block in rank order. Window by window, nranks windows of
 * scratch at a time. Where ranks share CPUs a pairwise or ring step moves only while both
 * partners hold a CPU: 8 ranks on 2 CPUs, 8 KiB took 30 us by pairwise (Open MPI 25). */
ncclxResult_t reducescatterLinear(struct ncclxComm* comm, const ncclxCollArgs* a) {
  int n = comm->nranks;
  size_t sz = ncclxTypeSize(a->datatype), rc = a->count;
  if (rc == 0) return ncclxSuccess;
  if (n == 1) {
    copyOwnBlock(comm, a);
    return finish(comm, a);
  }
  const char* send = a->sendbuff;
  char* recv = a->recvbuff;
  size_t win = collLinearWindowElems(comm, sz, rc);
  char* scratch;
  NCCLX_CHECK(collScratch(comm, "reducescatter", (size_t)n * win * sz, &scratch));
  ncclxXfer* xfers = collLinearXfers(comm);
  if (!xfers) return ncclxSystemError;
  ncclxResult_t res = ncclxSuccess;
  /* In place, our own window of recv is only read (copied into scratch) before it is written. */
  for (size_t off = 0; off < rc && res == ncclxSuccess; off += win) {
    size_t len = rc - off < win ? rc - off : win;
    res = collLinearReduceWindow(comm, xfers, send + off * sz, rc * sz, scratch, recv + off * sz,
                                 len, a);
  }
  free(xfers);
  return res == ncclxSuccess ? finish(comm, a) : res;
}
