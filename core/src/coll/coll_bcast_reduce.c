/* Broadcast (binomial tree, pipelined chain) and reduce (binomial tree).
 *
 * Trees are built on root-relative ranks (vrank = rank - root mod n), so any root works.
 * Large buffers move in pieces of chunkBytes; a broadcast rank receives from its parent and
 * forwards to its children in one xferRun, each piece forwarded as soon as it has arrived
 * (xfer sendAfter), which pipelines the tree levels. */
#include <string.h>

#include "coll/coll.h"
#include "util/debug.h"
#include "util/reduce.h"
#include "exec/xfer.h"

#define MAX_TREE_CHILDREN 33 /* a binomial tree over < 2^32 ranks, plus the parent */

static int realRank(int vrank, int root, int n) { return (vrank + root) % n; }

/* Pipelined one-to-many copy: receive the buffer from parent (unless < 0) into buf and
 * forward it to the children, all in one xferRun: each chunk goes on to the children as soon
 * as it has arrived, while later chunks are still coming. src is what this rank forwards
 * from (the root's sendbuff, everyone else's buf); a root also copies src to buf. */
static ncclxResult_t pipelineForward(struct ncclxComm* comm, int parent, const int* children,
                                     int nchildren, const char* src, char* buf, size_t bytes) {
  ncclxXfer x[MAX_TREE_CHILDREN + 1]; /* entries are set whole below: no memset of all 34 */
  int nx = 0;
  if (parent >= 0) x[nx++] = (ncclxXfer){.peer = parent, .isSend = 0, .buf = buf, .bytes = bytes};
  for (int c = 0; c < nchildren; c++)
    x[nx++] = (ncclxXfer){.peer = children[c], .isSend = 1, .buf = (void*)src, .bytes = bytes,
                          .sendAfter = parent >= 0 ? 1 : 0};
  if (parent >= 0 || src == buf) return nx ? xferRun(comm, x, nx) : ncclxSuccess;
  /* A root: its own copy rides along with the sends (after them it doubled a 2-rank
   * broadcast's time at 16 MiB and beyond), or follows them. */
  if (collRootCopyAlongside(comm, src, buf, bytes)) return xferRunCopying(comm, x, nx, buf, src, bytes);
  NCCLX_CHECK(nx ? xferRun(comm, x, nx) : ncclxSuccess);
  memmove(buf, src, bytes);
  return ncclxSuccess;
}

ncclxResult_t broadcastTree(struct ncclxComm* comm, const ncclxCollArgs* a) {
  int n = comm->nranks, r = comm->rank, root = a->root;
  size_t bytes = a->count * ncclxTypeSize(a->datatype);
  if (bytes == 0) return ncclxSuccess;
  int vrank = (r - root + n) % n;
  /* Parent: clear the lowest set bit. Children: add each lower bit (largest subtree first). */
  int low = 1;
  while (low < n && !(vrank & low)) low <<= 1;
  int parent = vrank ? realRank(vrank - low, root, n) : -1;
  int children[MAX_TREE_CHILDREN], nchildren = 0;
  for (int m = low >> 1; m >= 1; m >>= 1)
    if (vrank + m < n) children[nchildren++] = realRank(vrank + m, root, n);
  const char* src = vrank ? (const char*)a->recvbuff : (const char*)a->sendbuff;
  return pipelineForward(comm, parent, children, nchildren, src, a->recvbuff, bytes);
}

ncclxResult_t broadcastRing(struct ncclxComm* comm, const ncclxCollArgs* a) {
  int n = comm->nranks, r = comm->rank, root = a->root;
  size_t bytes = a->count * ncclxTypeSize(a->datatype);
  if (bytes == 0) return ncclxSuccess;
  int vrank = (r - root + n) % n;
  int parent = vrank ? realRank(vrank - 1, root, n) : -1;
  int next = realRank(vrank + 1, root, n);
  int nchildren = vrank + 1 < n ? 1 : 0;
  const char* src = vrank ? (const char*)a->recvbuff : (const char*)a->sendbuff;
  return pipelineForward(comm, parent, &next, nchildren, src, a->recvbuff, bytes);
}

/* Binomial reduce towards root, one piece at a time. Each rank reduces its children's
 * partial results in increasing distance (a fixed order), so the result does not depend on
 * timing. Non-root ranks accumulate in scratch: their recvbuff may be NULL. */
ncclxResult_t reduceTree(struct ncclxComm* comm, const ncclxCollArgs* a) {
  int n = comm->nranks, r = comm->rank, root = a->root;
  size_t sz = ncclxTypeSize(a->datatype);
  if (a->count == 0) return ncclxSuccess;
  int vrank = (r - root + n) % n;
  size_t piece = collPieceBytes(comm) / sz;
  if (piece == 0) piece = 1;
  char* scratch = commScratch(comm, 2 * piece * sz);
  if (!scratch)
    return commFail(comm, ncclxSystemError, "reduce: cannot allocate %zu bytes of scratch",
                    2 * piece * sz);
  char* tmp = scratch + piece * sz;
  for (size_t off = 0; off < a->count; off += piece) {
    size_t len = a->count - off < piece ? a->count - off : piece;
    const char* cur = (const char*)a->sendbuff + off * sz;
    char* acc = vrank == 0 ? (char*)a->recvbuff + off * sz : scratch;
    for (int mask = 1; mask < n; mask <<= 1) {
      if (vrank & mask) {
        NCCLX_CHECK(collSendRecv(comm, realRank(vrank - mask, root, n), cur, len * sz, -1, NULL, 0));
        break;
      }
      if (vrank + mask < n) {
        NCCLX_CHECK(collSendRecv(comm, -1, NULL, 0, realRank(vrank + mask, root, n), tmp, len * sz));
        ncclxReduce2(acc, cur, tmp, len, a->datatype, a->op);
        cur = acc;
      }
    }
    if (vrank == 0) {
      if (cur != acc) memmove(acc, cur, len * sz); /* n == 1 */
      if (a->op == ncclxAvg) ncclxAvgFinish(acc, len, a->datatype, n);
    }
  }
  return ncclxSuccess;
}
