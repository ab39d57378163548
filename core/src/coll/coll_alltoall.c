/* Alltoall (pairwise, linear, Bruck) and alltoallv (pairwise, linear).
 *
 * Alltoall algorithms work on a "view": n source blocks and n destination blocks of len bytes
 * with their own strides. Out of place the view is the user's buffers. In place
 * (sendbuff == recvbuff) the exchange runs window by window: window w of every block is first
 * copied to scratch and only then overwritten, and later windows are untouched until their
 * turn, so nothing is clobbered before it is sent. Alltoallv in place stages the send data
 * whole (its blocks do not line up with the receive blocks). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "coll/coll.h"
#include "util/debug.h"
#include "transport/shm/net_shm.h"
#include "exec/xfer.h"

typedef struct {
  const char* src;
  size_t srcStride;
  char* dst;
  size_t dstStride;
  size_t len; /* bytes per block */
} a2aView;

typedef ncclxResult_t (*a2aFn)(struct ncclxComm* comm, const a2aView* v, ncclxXfer* xfers,
                               char* work);

static void copySelf(const struct ncclxComm* comm, const a2aView* v) {
  size_t r = (size_t)comm->rank;
  memmove(v->dst + r * v->dstStride, v->src + r * v->srcStride, v->len);
}

/* n-1 steps; step k sends to r+k and receives from r-k, so every pair meets exactly once.
 * With a CPU per rank our own block is copied while step 1 runs (xferRunCopying), not before
 * it: the peer reads our block meanwhile, and we do not sit idle at the end of the step
 * while it finishes. 2 ranks, alternating runs: 8 MiB 725 -> 586 us, 16 MiB 1434 -> 1174
 * (Open MPI 697 and 1371); ordinary buffers, 16 MiB: 1797 -> 1431 (Open MPI 1581); 1 MiB and
 * less unchanged. The transfers are the same either way, so ranks may choose apart. */
static ncclxResult_t viewPairwise(struct ncclxComm* comm, const a2aView* v, ncclxXfer* xfers,
                                  char* work) {
  (void)xfers, (void)work;
  int n = comm->nranks, r = comm->rank, k = 1;
  char* ownDst = v->dst + (size_t)r * v->dstStride;
  const char* ownSrc = v->src + (size_t)r * v->srcStride;
  if (n > 1 && v->len > 0 && collRootCopyAlongside(comm, ownSrc, ownDst, v->len)) {
    size_t to = (size_t)((r + 1) % n), from = (size_t)((r - 1 + n) % n);
    ncclxXfer x[2] = {
        {.peer = (int)to, .isSend = 1, .buf = (void*)(v->src + to * v->srcStride), .bytes = v->len},
        {.peer = (int)from, .isSend = 0, .buf = v->dst + from * v->dstStride, .bytes = v->len}};
    NCCLX_CHECK(xferRunCopying(comm, x, 2, ownDst, ownSrc, v->len));
    k = 2;
  } else {
    copySelf(comm, v);
  }
  for (; k < n; k++) {
    size_t to = (size_t)((r + k) % n), from = (size_t)((r - k + n) % n);
    NCCLX_CHECK(collSendRecv(comm, (int)to, v->src + to * v->srcStride, v->len, (int)from,
                         v->dst + from * v->dstStride, v->len));
  }
  return ncclxSuccess;
}

/* Everything posted in one xferRun, peers in r+k / r-k order so ranks do not all start on
 * the same victim. */
static ncclxResult_t viewLinear(struct ncclxComm* comm, const a2aView* v, ncclxXfer* xfers,
                                char* work) {
  (void)work;
  int n = comm->nranks, r = comm->rank, nx = 0;
  copySelf(comm, v);
  for (int k = 1; k < n; k++) {
    size_t to = (size_t)((r + k) % n), from = (size_t)((r - k + n) % n);
    xfers[nx++] = (ncclxXfer){.peer = (int)from, .isSend = 0, .buf = v->dst + from * v->dstStride,
                              .bytes = v->len};
    xfers[nx++] = (ncclxXfer){.peer = (int)to, .isSend = 1,
                              .buf = (void*)(v->src + to * v->srcStride), .bytes = v->len};
  }
  return nx ? xferRun(comm, xfers, nx) : ncclxSuccess;
}

/* Bruck: position i of the work array starts with this rank's block for rank r+i. In
 * round k every block whose position has bit k set moves to rank r+k (same position), so a
 * block reaches its destination after ceil(log2 n) rounds; position i then holds the block
 * from rank r-i. work holds n + 2*ceil(n/2) blocks: the array and two packing buffers. */
static ncclxResult_t viewBruck(struct ncclxComm* comm, const a2aView* v, ncclxXfer* xfers,
                               char* work) {
  (void)xfers;
  int n = comm->nranks, r = comm->rank;
  size_t len = v->len, half = (size_t)(n + 1) / 2;
  char* packOut = work + (size_t)n * len;
  char* packIn = packOut + half * len;
  for (int i = 0; i < n; i++)
    memcpy(work + (size_t)i * len, v->src + (size_t)((r + i) % n) * v->srcStride, len);
  for (int k = 1; k < n; k <<= 1) {
    size_t cnt = 0;
    for (int i = 1; i < n; i++)
      if (i & k) memcpy(packOut + len * cnt++, work + (size_t)i * len, len);
    NCCLX_CHECK(collSendRecv(comm, (r + k) % n, packOut, cnt * len, (r - k + n) % n, packIn,
                         cnt * len));
    cnt = 0;
    for (int i = 1; i < n; i++)
      if (i & k) memcpy(work + (size_t)i * len, packIn + len * cnt++, len);
  }
  for (int i = 0; i < n; i++)
    memcpy(v->dst + (size_t)((r - i + n) % n) * v->dstStride, work + (size_t)i * len, len);
  return ncclxSuccess;
}

/* Run fn over the whole buffers, or window by window through scratch when it needs work
 * space (workBlocks blocks of the window) or in-place staging. An algorithm that copies all
 * of its input into work space before writing any output (copiesFirst) needs no staging. */
static ncclxResult_t alltoallRun(struct ncclxComm* comm, const ncclxCollArgs* a, a2aFn fn,
                                 size_t workBlocks, int copiesFirst) {
  int n = comm->nranks;
  size_t blk = a->count * ncclxTypeSize(a->datatype), total = (size_t)n * blk;
  if (blk == 0) return ncclxSuccess;
  int inPlace = a->sendbuff == a->recvbuff;
  if (!inPlace && collRangesOverlap(a->sendbuff, total, a->recvbuff, total))
    return commFail(comm, ncclxInvalidArgument,
                        "alltoall: sendbuff and recvbuff overlap without being equal");
  int stage = inPlace && !copiesFirst;
  ncclxXfer* xfers = calloc(2 * (size_t)n, sizeof(*xfers));
  if (!xfers) return commFail(comm, ncclxSystemError, "alltoall: out of memory");
  ncclxResult_t res = ncclxSuccess;
  if (!stage && workBlocks == 0) {
    a2aView v = {a->sendbuff, blk, a->recvbuff, blk, blk};
    res = fn(comm, &v, xfers, NULL);
  } else {
    size_t perWindowBlocks = (stage ? (size_t)n : 0) + workBlocks;
    size_t win = collPieceBytes(comm) / perWindowBlocks;
    if (win == 0) win = 1;
    if (win > blk) win = blk;
    char* scratch;
    res = collScratch(comm, "alltoall", perWindowBlocks * win, &scratch);
    char* work = res == ncclxSuccess ? scratch + (stage ? (size_t)n * win : 0) : NULL;
    for (size_t off = 0; res == ncclxSuccess && off < blk; off += win) {
      size_t w = blk - off < win ? blk - off : win;
      a2aView v = {(const char*)a->sendbuff + off, blk, (char*)a->recvbuff + off, blk, w};
      if (stage) {
        for (int b = 0; b < n; b++) memcpy(scratch + (size_t)b * w, v.src + (size_t)b * blk, w);
        v.src = scratch;
        v.srcStride = w;
      }
      res = fn(comm, &v, xfers, work);
    }
  }
  free(xfers);
  return res;
}

/* Linear posts every send and receive at once and forwards nothing it receives, so its
 * sends may wait for their receivers' copies without chaining one step to the next
 * (comm->xferSendKind). Pairwise's step k sends to r+k but receives from r-k, and Bruck
 * forwards blocks from round to round: chains, so they are not marked. */
static int beginExchange(struct ncclxComm* comm) {
  int kind = comm->xferSendKind;
  comm->xferSendKind = NCCLX_SHM_SEND_EXCHANGE;
  return kind;
}
static ncclxResult_t endExchange(struct ncclxComm* comm, int kind, ncclxResult_t res) {
  comm->xferSendKind = kind;
  return res;
}

ncclxResult_t alltoallPairwise(struct ncclxComm* comm, const ncclxCollArgs* a) {
  return alltoallRun(comm, a, viewPairwise, 0, 0);
}

ncclxResult_t alltoallLinear(struct ncclxComm* comm, const ncclxCollArgs* a) {
  int kind = beginExchange(comm);
  return endExchange(comm, kind, alltoallRun(comm, a, viewLinear, 0, 0));
}

ncclxXfer* collLinearXfers(struct ncclxComm* comm) {
  ncclxXfer* x = calloc(2 * (size_t)comm->nranks, sizeof(*x));
  if (!x) (void)commFail(comm, ncclxSystemError, "linear exchange: out of memory for %d transfers",
                         2 * comm->nranks);
  return x;
}

ncclxResult_t alltoallLinearWindow(struct ncclxComm* comm, ncclxXfer* xfers, const char* src,
                                   size_t srcStride, char* dst, size_t dstStride, size_t len) {
  a2aView v = {src, srcStride, dst, dstStride, len};
  int kind = beginExchange(comm);
  return endExchange(comm, kind, viewLinear(comm, &v, xfers, NULL));
}

ncclxResult_t alltoallBruck(struct ncclxComm* comm, const ncclxCollArgs* a) {
  size_t n = (size_t)comm->nranks;
  return alltoallRun(comm, a, viewBruck, n + 2 * ((n + 1) / 2), 1);
}

/* ---------------- alltoallv ---------------- */

typedef struct {
  const char* sendBase; /* sendbuff, or the staged copy */
  size_t sendShift;     /* bytes to subtract from a send displacement in the staged copy */
  size_t sz;
} a2avSrc;

/* NULL for an empty block: its displacement may lie outside the staged range. */
static const char* a2avSendPtr(const a2avSrc* s, const ncclxCollArgs* a, int peer) {
  if (a->sendcounts[peer] == 0) return NULL;
  return s->sendBase + (a->sdispls[peer] * s->sz - s->sendShift);
}

static char* a2avRecvPtr(const a2avSrc* s, const ncclxCollArgs* a, int peer) {
  if (a->recvcounts[peer] == 0) return NULL;
  return (char*)a->recvbuff + a->rdispls[peer] * s->sz;
}

/* Byte extent [lo, hi) touched by the non-empty blocks of counts/displs. */
static void extentOf(const size_t* counts, const size_t* displs, int n, size_t sz, size_t* lo,
                     size_t* hi) {
  *lo = SIZE_MAX;
  *hi = 0;
  for (int p = 0; p < n; p++) {
    if (!counts[p]) continue;
    if (displs[p] * sz < *lo) *lo = displs[p] * sz;
    if ((displs[p] + counts[p]) * sz > *hi) *hi = (displs[p] + counts[p]) * sz;
  }
  if (*hi == 0) *lo = 0;
}

/* Checks the self block, stages overlapping send data, copies the self block. */
static ncclxResult_t alltoallvPrepare(struct ncclxComm* comm, const ncclxCollArgs* a,
                                      a2avSrc* s) {
  int r = comm->rank, n = comm->nranks;
  s->sz = ncclxTypeSize(a->datatype);
  s->sendBase = a->sendbuff;
  s->sendShift = 0;
  if (a->sendcounts[r] != a->recvcounts[r])
    return commFail(comm, ncclxInvalidArgument,
                        "alltoallv: rank %d sends %zu elements to itself but receives %zu", r,
                        a->sendcounts[r], a->recvcounts[r]);
  size_t slo, shi, rlo, rhi;
  extentOf(a->sendcounts, a->sdispls, n, s->sz, &slo, &shi);
  extentOf(a->recvcounts, a->rdispls, n, s->sz, &rlo, &rhi);
  if (shi > slo && rhi > rlo &&
      collRangesOverlap((const char*)a->sendbuff + slo, shi - slo, (char*)a->recvbuff + rlo,
                    rhi - rlo)) {
    char* stage;
    NCCLX_CHECK(collScratch(comm, "alltoallv", shi - slo, &stage));
    memcpy(stage, (const char*)a->sendbuff + slo, shi - slo);
    s->sendBase = stage;
    s->sendShift = slo;
  }
  if (a->recvcounts[r])
    memmove(a2avRecvPtr(s, a, r), a2avSendPtr(s, a, r),
            a->recvcounts[r] * s->sz);
  return ncclxSuccess;
}

ncclxResult_t alltoallvPairwise(struct ncclxComm* comm, const ncclxCollArgs* a) {
  int n = comm->nranks, r = comm->rank;
  a2avSrc s;
  NCCLX_CHECK(alltoallvPrepare(comm, a, &s));
  for (int k = 1; k < n; k++) {
    int to = (r + k) % n, from = (r - k + n) % n;
    NCCLX_CHECK(collSendRecv(comm, to, a2avSendPtr(&s, a, to), a->sendcounts[to] * s.sz, from,
                         a2avRecvPtr(&s, a, from), a->recvcounts[from] * s.sz));
  }
  return ncclxSuccess;
}

static ncclxResult_t a2avLinear(struct ncclxComm* comm, const ncclxCollArgs* a) {
  int n = comm->nranks, r = comm->rank, nx = 0;
  a2avSrc s;
  NCCLX_CHECK(alltoallvPrepare(comm, a, &s));
  if (n == 1) return ncclxSuccess;
  ncclxXfer* xfers = calloc(2 * (size_t)n, sizeof(*xfers));
  if (!xfers) return commFail(comm, ncclxSystemError, "alltoallv: out of memory");
  for (int k = 1; k < n; k++) {
    int to = (r + k) % n, from = (r - k + n) % n;
    /* Empty blocks are skipped on both sides (the peer sees the same count). */
    if (a->recvcounts[from])
      xfers[nx++] = (ncclxXfer){.peer = from, .isSend = 0,
                                .buf = a2avRecvPtr(&s, a, from),
                                .bytes = a->recvcounts[from] * s.sz};
    if (a->sendcounts[to])
      xfers[nx++] = (ncclxXfer){.peer = to, .isSend = 1, .buf = (void*)a2avSendPtr(&s, a, to),
                                .bytes = a->sendcounts[to] * s.sz};
  }
  ncclxResult_t res = nx ? xferRun(comm, xfers, nx) : ncclxSuccess;
  free(xfers);
  return res;
}

ncclxResult_t alltoallvLinear(struct ncclxComm* comm, const ncclxCollArgs* a) {
  int kind = beginExchange(comm);
  return endExchange(comm, kind, a2avLinear(comm, a));
}
