/* Allreduce: ring, recursive doubling, Rabenseifner, and tree (reduce + broadcast).
 *
 * Every algorithm leaves bit-identical results on all ranks: either each element is reduced
 * on exactly one rank and then copied (ring, Rabenseifner, tree), or both partners of an
 * exchange combine the same two values in the same operand order (recursive doubling: the
 * lower rank's value is always the left operand). Avg is a Sum finished once on the final
 * value. Temporary space comes from the comm's scratch buffer in pieces of chunkBytes, so
 * memory stays bounded whatever the count. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "coll/coll.h"
#include "util/debug.h"
#include "util/reduce.h"
#include "exec/xfer.h"

/* Element offset of block i when count elements are split into n near-equal blocks
 * (the first count % n blocks get one extra element). */
static size_t blockOff(size_t count, int n, int i) {
  size_t base = count / (size_t)n, rem = count % (size_t)n, ui = (size_t)i;
  return ui * base + (ui < rem ? ui : rem);
}
static size_t blockLen(size_t count, int n, int i) {
  return blockOff(count, n, i + 1) - blockOff(count, n, i);
}

static void copyIfDistinct(void* dst, const void* src, size_t bytes) {
  if (bytes && dst != src) memmove(dst, src, bytes);
}

/* Bytes per message of a receive-and-reduce whose staging area is tmpElems elements: the
 * area holds XFER_MAX_INFLIGHT messages. Both sides compute the same value. */
static size_t reduceChunkBytes(size_t tmpElems, size_t typeSize) {
  size_t e = tmpElems / XFER_MAX_INFLIGHT;
  return (e ? e : 1) * typeSize;
}

/* Send sendCount elements to sendPeer while receiving recvCount elements from recvPeer and
 * writing dst = incoming op other (other may be dst itself, or the user's send buffer on the
 * first step, which saves copying the input into the output up front). The receive is
 * staged in tmp (tmpElems elements, so it stays in cache) and each piece is reduced as soon
 * as it arrives, while the next ones are in flight. peerFirst puts the incoming value on the
 * left of op. When src and dst overlap (recursive doubling sends the vector it reduces
 * into), piece k is reduced only after piece k has been sent. The peer runs the mirror call
 * with the same tmpElems. */
static ncclxResult_t exchangeReduce(struct ncclxComm* comm, const ncclxCollArgs* a, int sendPeer,
                                    const char* src, size_t sendCount, int recvPeer, char* dst,
                                    const char* other, size_t recvCount, int peerFirst,
                                    char* tmp, size_t tmpElems) {
  size_t sz = ncclxTypeSize(a->datatype);
  if (sendPeer < 0) sendCount = 0;
  if (recvPeer < 0) recvCount = 0;
  size_t chunk = reduceChunkBytes(tmpElems, sz);
  ncclxXfer x[2];
  int n = 0;
  memset(x, 0, sizeof(x));
  if (sendCount)
    x[n++] = (ncclxXfer){.peer = sendPeer, .isSend = 1, .buf = (void*)src,
                         .bytes = sendCount * sz, .chunk = chunk};
  if (recvCount) {
    int gate = sendCount && collRangesOverlap(src, sendCount * sz, dst, recvCount * sz) ? n : 0;
    x[n++] = (ncclxXfer){.peer = recvPeer, .isSend = 0, .buf = tmp, .bytes = recvCount * sz,
                         .chunk = chunk, .redDst = dst, .redOther = (void*)other,
                         .redType = a->datatype, .redOp = a->op, .redPeerFirst = peerFirst,
                         .redAfter = gate};
  }
  return n ? xferRun(comm, x, n) : ncclxSuccess;
}

/* ---------------- ring ---------------- */

/* One ring pass over seg[0, count): reduce-scatter, Avg on the owned block, allgather. */
static ncclxResult_t ringSegment(struct ncclxComm* comm, const ncclxCollArgs* a,
                                 const char* send, char* recv, size_t count, char* tmp,
                                 size_t tmpElems) {
  int n = comm->nranks, r = comm->rank;
  int next = (r + 1) % n, prev = (r + n - 1) % n;
  size_t sz = ncclxTypeSize(a->datatype);
  /* Reduce-scatter: block b starts at rank b (its own input) and travels around the ring,
   * each rank adding its contribution; after n-1 steps rank r holds block r+1 complete. */
  for (int s = 0; s < n - 1; s++) {
    int sb = (r - s + n) % n, rb = (r - s - 1 + n) % n;
    const char* sp = (s == 0 ? send : recv) + blockOff(count, n, sb) * sz;
    size_t rlen = blockLen(count, n, rb), slen = blockLen(count, n, sb);
    size_t ro = blockOff(count, n, rb) * sz;
    if (rlen == 0) { /* nothing to reduce, but the send half still goes */
      NCCLX_CHECK(collSendRecv(comm, next, sp, slen * sz, -1, NULL, 0));
      continue;
    }
    /* Received pieces are reduced as they arrive (block rb into recv = own + incoming);
     * the block sent (sb) is another one, so no ordering between the two. */
    size_t chunk = reduceChunkBytes(tmpElems, sz);
    ncclxXfer x[2];
    int nx = 0;
    memset(x, 0, sizeof(x));
    if (slen)
      x[nx++] = (ncclxXfer){.peer = next, .isSend = 1, .buf = (void*)sp, .bytes = slen * sz,
                            .chunk = chunk};
    x[nx++] = (ncclxXfer){.peer = prev, .isSend = 0, .buf = tmp, .bytes = rlen * sz,
                          .chunk = chunk, .redDst = recv + ro, .redOther = send + ro,
                          .redType = a->datatype, .redOp = a->op};
    NCCLX_CHECK(xferRun(comm, x, nx));
  }
  int own = (r + 1) % n;
  if (a->op == ncclxAvg)
    ncclxAvgFinish(recv + blockOff(count, n, own) * sz, blockLen(count, n, own), a->datatype, n);
  /* Allgather: pass the finished blocks around. */
  for (int s = 0; s < n - 1; s++) {
    int sb = (own - s + n) % n, rb = (r - s + n) % n;
    NCCLX_CHECK(collSendRecv(comm, next, recv + blockOff(count, n, sb) * sz,
                         blockLen(count, n, sb) * sz, prev, recv + blockOff(count, n, rb) * sz,
                         blockLen(count, n, rb) * sz));
  }
  return ncclxSuccess;
}

ncclxResult_t allreduceRing(struct ncclxComm* comm, const ncclxCollArgs* a) {
  int n = comm->nranks;
  size_t sz = ncclxTypeSize(a->datatype);
  const char* send = a->sendbuff;
  char* recv = a->recvbuff;
  if (a->count == 0) return ncclxSuccess;
  if (n == 1) {
    copyIfDistinct(recv, send, a->count * sz);
    return ncclxSuccess;
  }
  /* Segments of n pieces: each step moves at most one piece per rank. */
  size_t piece = collPieceElems(comm, sz);
  size_t segMax = piece * (size_t)n;
  char* tmp;
  NCCLX_CHECK(collScratch(comm, "allreduce", piece * sz, &tmp));
  for (size_t off = 0; off < a->count; off += segMax) {
    size_t len = a->count - off < segMax ? a->count - off : segMax;
    NCCLX_CHECK(ringSegment(comm, a, send + off * sz, recv + off * sz, len, tmp, piece));
  }
  return ncclxSuccess;
}

/* ---------------- power-of-two folding (recursive doubling, Rabenseifner) ---------------- */

/* With pof2 the largest power of two <= n and rem = n - pof2, the first 2*rem ranks pair up:
 * each even one hands its data to the odd one above it and sits out, so pof2 ranks remain.
 * newRank is the rank among those (-1 for ranks that sit out). */
typedef struct {
  int pof2, rem, newRank;
} foldInfo;

static foldInfo foldMake(int rank, int n) {
  foldInfo f;
  f.pof2 = 1;
  while (f.pof2 * 2 <= n) f.pof2 *= 2;
  f.rem = n - f.pof2;
  if (rank < 2 * f.rem)
    f.newRank = (rank % 2) ? rank / 2 : -1;
  else
    f.newRank = rank - f.rem;
  return f;
}
static int foldRealRank(const foldInfo* f, int newRank) {
  return newRank < f->rem ? newRank * 2 + 1 : newRank + f->rem;
}

/* Fold in: even ranks below 2*rem send their input (*cur) to rank+1, which reduces it
 * into buf. *cur is where this rank's current values live: the user's send buffer until
 * the first reduction writes buf. */
static ncclxResult_t foldIn(struct ncclxComm* comm, const ncclxCollArgs* a, const foldInfo* f,
                            const char** cur, char* buf, char* tmp, size_t tmpElems) {
  int r = comm->rank;
  if (r >= 2 * f->rem) return ncclxSuccess;
  if (r % 2 == 0)
    return exchangeReduce(comm, a, r + 1, *cur, a->count, -1, NULL, NULL, 0, 0, tmp,
                          tmpElems);
  NCCLX_CHECK(exchangeReduce(comm, a, -1, NULL, 0, r - 1, buf, *cur, a->count, 1, tmp,
                             tmpElems));
  *cur = buf;
  return ncclxSuccess;
}

/* Fold out: the odd ranks hand the final result back. */
static ncclxResult_t foldOut(struct ncclxComm* comm, const ncclxCollArgs* a, const foldInfo* f,
                             char* buf) {
  int r = comm->rank;
  size_t bytes = a->count * ncclxTypeSize(a->datatype);
  if (r >= 2 * f->rem) return ncclxSuccess;
  if (r % 2) return collSendRecv(comm, r - 1, buf, bytes, -1, NULL, 0);
  return collSendRecv(comm, -1, NULL, 0, r + 1, buf, bytes);
}

/* ---------------- recursive doubling ---------------- */

ncclxResult_t allreduceRecursiveDoubling(struct ncclxComm* comm, const ncclxCollArgs* a) {
  int n = comm->nranks, r = comm->rank;
  size_t sz = ncclxTypeSize(a->datatype);
  char* recv = a->recvbuff;
  const char* cur = a->sendbuff; /* no input copy: the first reduction reads it in place */
  if (a->count == 0) return ncclxSuccess;
  if (n == 1) {
    copyIfDistinct(recv, cur, a->count * sz);
    return ncclxSuccess;
  }
  size_t piece = collPieceElems(comm, sz);
  char* tmp;
  NCCLX_CHECK(collScratch(comm, "allreduce", piece * sz, &tmp));
  foldInfo f = foldMake(r, n);
  NCCLX_CHECK(foldIn(comm, a, &f, &cur, recv, tmp, piece));
  if (f.newRank >= 0) {
    /* Exchange whole vectors with partners at distance 1, 2, 4, ...; the lower rank's value
     * is the left operand on both sides, so both compute the same bits. */
    for (int mask = 1; mask < f.pof2; mask <<= 1) {
      int partner = foldRealRank(&f, f.newRank ^ mask);
      NCCLX_CHECK(exchangeReduce(comm, a, partner, cur, a->count, partner, recv, cur,
                                 a->count, partner < r, tmp, piece));
      cur = recv;
    }
    if (a->op == ncclxAvg) ncclxAvgFinish(recv, a->count, a->datatype, n);
  }
  return foldOut(comm, a, &f, recv);
}

/* ---------------- Rabenseifner ---------------- */

/* One pass over a whole (segment) vector a. */
static ncclxResult_t rabenseifnerSegment(struct ncclxComm* comm, const ncclxCollArgs* a, char* tmp,
                                         size_t piece) {
  int r = comm->rank;
  size_t sz = ncclxTypeSize(a->datatype), count = a->count;
  char* recv = a->recvbuff;
  const char* cur = a->sendbuff; /* no input copy: the first reduction reads it in place */
  foldInfo f = foldMake(r, comm->nranks);
  NCCLX_CHECK(foldIn(comm, a, &f, &cur, recv, tmp, piece));
  if (f.newRank >= 0) {
    int me = f.newRank, p = f.pof2;
    /* Reduce-scatter by recursive halving over p blocks: at distance mask each rank keeps the
     * half of its current window on its side of the partner and sends the other half. After
     * the last step rank `me` owns block `me`. */
    for (int mask = p / 2; mask >= 1; mask >>= 1) {
      int partner = foldRealRank(&f, me ^ mask);
      int lo = me & ~(2 * mask - 1), mid = lo + mask, hi = lo + 2 * mask;
      int keepLo = (me & mask) ? mid : lo, keepHi = (me & mask) ? hi : mid;
      int sendLo = (me & mask) ? lo : mid, sendHi = (me & mask) ? mid : hi;
      size_t so = blockOff(count, p, sendLo), ko = blockOff(count, p, keepLo);
      NCCLX_CHECK(exchangeReduce(comm, a, partner, cur + so * sz,
                                 blockOff(count, p, sendHi) - so, partner, recv + ko * sz,
                                 cur + ko * sz, blockOff(count, p, keepHi) - ko, partner < r,
                                 tmp, piece));
      cur = recv;
    }
    if (a->op == ncclxAvg)
      ncclxAvgFinish(recv + blockOff(count, p, me) * sz, blockLen(count, p, me), a->datatype, comm->nranks);
    /* Allgather by recursive doubling: windows of mask blocks merge with the partner's. */
    for (int mask = 1; mask < p; mask <<= 1) {
      int pnew = me ^ mask, partner = foldRealRank(&f, pnew);
      int myLo = me & ~(mask - 1), pLo = pnew & ~(mask - 1);
      size_t mo = blockOff(count, p, myLo), po = blockOff(count, p, pLo);
      NCCLX_CHECK(collSendRecv(comm, partner, recv + mo * sz,
                           (blockOff(count, p, myLo + mask) - mo) * sz, partner, recv + po * sz,
                           (blockOff(count, p, pLo + mask) - po) * sz));
    }
  }
  return foldOut(comm, a, &f, recv);
}

/* Segments of nranks pieces, like the ring: each segment's halves are reduced and sent on
 * while still in cache. Whole-vector passes were 1.5-2x slower from 2 MiB up over the socket
 * network (the allgather re-read the reduced half from memory) and 15% at 16 MiB over shm. */
ncclxResult_t allreduceRabenseifner(struct ncclxComm* comm, const ncclxCollArgs* a) {
  size_t sz = ncclxTypeSize(a->datatype);
  if (a->count == 0) return ncclxSuccess;
  if (comm->nranks == 1) {
    copyIfDistinct(a->recvbuff, a->sendbuff, a->count * sz);
    return ncclxSuccess;
  }
  size_t piece = collPieceElems(comm, sz);
  size_t segMax = piece * (size_t)comm->nranks;
  char* tmp;
  NCCLX_CHECK(collScratch(comm, "allreduce", piece * sz, &tmp));
  for (size_t off = 0; off < a->count; off += segMax) {
    ncclxCollArgs seg = *a;
    seg.sendbuff = (const char*)a->sendbuff + off * sz;
    seg.recvbuff = (char*)a->recvbuff + off * sz;
    seg.count = a->count - off < segMax ? a->count - off : segMax;
    NCCLX_CHECK(rabenseifnerSegment(comm, &seg, tmp, piece));
  }
  return ncclxSuccess;
}

/* ---------------- tree ---------------- */

ncclxResult_t allreduceTree(struct ncclxComm* comm, const ncclxCollArgs* a) {
  ncclxCollArgs step = *a;
  step.root = 0;
  step.coll = NCCLX_COLL_REDUCE;
  NCCLX_CHECK(reduceTree(comm, &step)); /* Avg finished at rank 0 */
  step.coll = NCCLX_COLL_BROADCAST;
  step.sendbuff = a->recvbuff;
  return broadcastTree(comm, &step);
}

/* ---------------- linear ---------------- */

/* A linear reduce-scatter and a linear all-gather (reducescatterLinear's exchanges), window by
 * window: every rank sends each block's window to its owner at once, the owner reduces the
 * nranks contributions in rank order, then sends the result to every rank at once. Nothing
 * waits on a step's partner, which is what counts where ranks share CPUs. The vector is cut
 * into nranks equal blocks; the count % nranks elements left over go by recursive doubling. */
ncclxResult_t allreduceLinear(struct ncclxComm* comm, const ncclxCollArgs* a) {
  int n = comm->nranks, r = comm->rank;
  size_t sz = ncclxTypeSize(a->datatype), q = a->count / (size_t)n, tail = a->count % (size_t)n;
  const char* send = a->sendbuff;
  char* recv = a->recvbuff;
  if (a->count == 0) return ncclxSuccess;
  if (n == 1) {
    copyIfDistinct(recv, send, a->count * sz);
    return ncclxSuccess;
  }
  if (q > 0) {
    size_t win = collLinearWindowElems(comm, sz, q);
    char* scratch;
    NCCLX_CHECK(collScratch(comm, "allreduce", (size_t)n * win * sz, &scratch));
    ncclxXfer* xfers = collLinearXfers(comm);
    if (!xfers) return ncclxSystemError;
    ncclxResult_t res = ncclxSuccess;
    /* In place, a window of recv is written only after its exchange has sent it. */
    for (size_t off = 0; off < q && res == ncclxSuccess; off += win) {
      size_t len = q - off < win ? q - off : win;
      char* own = recv + ((size_t)r * q + off) * sz;
      res = collLinearReduceWindow(comm, xfers, send + off * sz, q * sz, scratch, own, len, a);
      if (res != ncclxSuccess) break;
      if (a->op == ncclxAvg) ncclxAvgFinish(own, len, a->datatype, n);
      res = alltoallLinearWindow(comm, xfers, own, 0, recv + off * sz, q * sz, len * sz);
    }
    free(xfers);
    NCCLX_CHECK(res);
  }
  if (tail == 0) return ncclxSuccess;
  ncclxCollArgs rest = *a;
  rest.sendbuff = send + (size_t)n * q * sz;
  rest.recvbuff = recv + (size_t)n * q * sz;
  rest.count = tail;
  return allreduceRecursiveDoubling(comm, &rest);
}
