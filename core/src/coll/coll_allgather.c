/* Allgather: ring, recursive doubling (power-of-two rank counts), Bruck (any count) and
 * linear. recvbuff holds nranks blocks of count elements; in place means sendbuff is this
 * rank's block of recvbuff. Pure byte moves: no alignment assumptions. */
#include <stdlib.h>
#include <string.h>

#include "coll/coll.h"
#include "util/debug.h"
#include "exec/xfer.h"

static size_t blockBytes(const ncclxCollArgs* a) { return a->count * ncclxTypeSize(a->datatype); }

/* Put this rank's contribution at position pos of recvbuff (memmove: in place may overlap). */
static void placeOwn(const ncclxCollArgs* a, int pos) {
  size_t blk = blockBytes(a);
  char* dst = (char*)a->recvbuff + (size_t)pos * blk;
  if (dst != a->sendbuff) memmove(dst, a->sendbuff, blk);
}

ncclxResult_t allgatherRing(struct ncclxComm* comm, const ncclxCollArgs* a) {
  int n = comm->nranks, r = comm->rank;
  size_t blk = blockBytes(a);
  char* recv = a->recvbuff;
  if (blk == 0) return ncclxSuccess;
  int next = (r + 1) % n, prev = (r + n - 1) % n;
  /* Step s forwards the block that arrived in step s-1 (own block first). The own block goes
   * from sendbuff, which placeOwn only reads: a receiver reading our memory directly (mapped
   * ncclxMemAlloc buffers, CMA) then finds clean lines, not ones our copy just dirtied (2
   * ranks, 256 KiB: 2x slower that way). With a CPU per rank our own copy then rides along
   * with step 0 instead of preceding it, as a broadcast root's does. */
  int fromSend = !collRangesOverlap(a->sendbuff, blk, recv, (size_t)n * blk);
  char* own = recv + (size_t)r * blk;
  if (fromSend && n > 1 && collRootCopyAlongside(comm, a->sendbuff, own, blk)) {
    ncclxXfer x[2] = {{.peer = next, .isSend = 1, .buf = (void*)a->sendbuff, .bytes = blk},
                      {.peer = prev, .isSend = 0, .buf = recv + (size_t)prev * blk, .bytes = blk}};
    NCCLX_CHECK(xferRunCopying(comm, x, 2, own, a->sendbuff, blk));
  } else {
    placeOwn(a, r);
    if (n > 1) NCCLX_CHECK(collSendRecv(comm, next, fromSend ? (const char*)a->sendbuff : own, blk, prev,
                                        recv + (size_t)prev * blk, blk));
  }
  for (int s = 1; s < n - 1; s++) {
    int sb = (r - s + n) % n, rb = (r - s - 1 + n) % n;
    NCCLX_CHECK(collSendRecv(comm, next, recv + (size_t)sb * blk, blk, prev, recv + (size_t)rb * blk, blk));
  }
  return ncclxSuccess;
}

ncclxResult_t allgatherRecursiveDoubling(struct ncclxComm* comm, const ncclxCollArgs* a) {
  int n = comm->nranks, r = comm->rank;
  size_t blk = blockBytes(a);
  char* recv = a->recvbuff;
  if (n & (n - 1))
    return commFail(comm, ncclxInternalError,
                        "allgather: recursive doubling needs a power-of-two rank count, not %d", n);
  if (blk == 0) return ncclxSuccess;
  placeOwn(a, r);
  /* Before the step at distance mask, each rank holds the aligned window of mask blocks that
   * contains its own; partners swap windows and both end up with twice as many. */
  for (int mask = 1; mask < n; mask <<= 1) {
    int partner = r ^ mask;
    size_t myLo = (size_t)(r & ~(mask - 1)), pLo = (size_t)(partner & ~(mask - 1));
    NCCLX_CHECK(collSendRecv(comm, partner, recv + myLo * blk, (size_t)mask * blk, partner,
                         recv + pLo * blk, (size_t)mask * blk));
  }
  return ncclxSuccess;
}

static void reverseBytes(char* p, size_t len) {
  if (len < 2) return;
  for (size_t i = 0, j = len - 1; i < j; i++, j--) {
    char t = p[i];
    p[i] = p[j];
    p[j] = t;
  }
}

/* Bruck: position i of the working layout holds rank (r+i)'s block. At distance k each rank
 * sends its first min(k, n-k) blocks to r-k and appends the same number from r+k, so after
 * ceil(log2 n) steps it has all n. The working layout lives in recvbuff itself and is
 * rotated into rank order at the end (three reversals: no scratch). */
ncclxResult_t allgatherBruck(struct ncclxComm* comm, const ncclxCollArgs* a) {
  int n = comm->nranks, r = comm->rank;
  size_t blk = blockBytes(a);
  char* recv = a->recvbuff;
  if (blk == 0) return ncclxSuccess;
  placeOwn(a, 0);
  for (int k = 1; k < n; k <<= 1) {
    size_t cnt = (size_t)(k < n - k ? k : n - k);
    NCCLX_CHECK(collSendRecv(comm, (r - k + n) % n, recv, cnt * blk, (r + k) % n,
                         recv + (size_t)k * blk, cnt * blk));
  }
  /* Rotate right by r blocks: position i moves to rank (r+i) mod n. */
  size_t total = (size_t)n * blk, shift = (size_t)r * blk;
  if (shift) {
    reverseBytes(recv, total);
    reverseBytes(recv, shift);
    reverseBytes(recv + shift, total - shift);
  }
  return ncclxSuccess;
}

/* Linear: this rank's block goes to every rank at once (a linear all-to-all window whose
 * blocks are all the same one), so nothing waits on a step's partner. */
ncclxResult_t allgatherLinear(struct ncclxComm* comm, const ncclxCollArgs* a) {
  size_t blk = a->count * ncclxTypeSize(a->datatype);
  if (blk == 0) return ncclxSuccess;
  ncclxXfer* xfers = collLinearXfers(comm);
  if (!xfers) return ncclxSystemError;
  ncclxResult_t res = alltoallLinearWindow(comm, xfers, a->sendbuff, 0, a->recvbuff, blk, blk);
  free(xfers);
  return res;
}
