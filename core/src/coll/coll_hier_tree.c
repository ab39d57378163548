/* Hierarchical broadcast, reduce, allreduce and allgather.
 *
 * Rooted collectives run over a two-level tree: a binomial tree among hosts whose nodes are
 * the hosts' heads (the root on its own host, the leader elsewhere), and inside each host a
 * binomial tree rooted at its head. Only head-to-head links cross hosts, and one pipelined
 * pass covers both levels, so a piece goes on to the next host while the previous one spreads
 * inside the host.
 *
 * Allreduce uses the same trees for small messages (reduce to rank 0, broadcast back). From
 * HIER_RING_MIN_BYTES it reduces inside each host to the leader, runs a ring allreduce among
 * the leaders and broadcasts inside each host. Each element is reduced on exactly one rank
 * and then copied, so every rank gets the same bits; Avg is a Sum finished once with nranks.
 *
 * Allgather gathers each host's blocks at its leader, rings the host blocks among leaders
 * (one message per run of consecutive ranks) and broadcasts the whole result in the host. */
#include <stdlib.h>
#include <string.h>

#include "coll/coll_hier.h"
#include "util/debug.h"
#include "util/reduce.h"
#include "exec/xfer.h"

#define HIER_MAX_CHILDREN 64 /* binomial children inside a host plus among hosts (< 2^32 each) */

typedef struct {
  int parent; /* -1 at the root of the tree */
  int nchildren;
  int children[HIER_MAX_CHILDREN]; /* largest subtree first, other hosts before this one */
} hierTree;

enum { TREE_INTRA = 1, TREE_INTER = 2, TREE_BOTH = 3 };

/* Binomial tree over positions 0..n-1 rooted at 0: returns v's parent (-1 for 0) and fills
 * its children, largest subtree first. */
static int binomialLinks(int v, int n, int* children, int* nchildren) {
  int low = 1;
  while (low < n && !(v & low)) low <<= 1;
  *nchildren = 0;
  for (int mask = low >> 1; mask >= 1; mask >>= 1)
    if (v + mask < n) children[(*nchildren)++] = v + mask;
  return v ? v - low : -1;
}

static int headOf(const struct ncclxHostMap* m, int host, int root) {
  return m->hostOf[root] == host ? root : hostMapLeader(m, host);
}

/* This rank's links in the two-level tree rooted at root (levels: which of the two). With
 * TREE_INTRA alone, each host's tree is rooted at its head and the hosts stay separate. */
static void treeBuild(const struct ncclxHostMap* m, int rank, int root, int levels,
                      hierTree* t) {
  int links[32], nlinks, v;
  int host = m->hostOf[rank], rootHost = m->hostOf[root];
  int head = headOf(m, host, root);
  t->parent = -1;
  t->nchildren = 0;
  if ((levels & TREE_INTER) && rank == head) {
    int H = m->nhosts;
    v = binomialLinks((host - rootHost + H) % H, H, links, &nlinks);
    if (v >= 0) t->parent = headOf(m, (v + rootHost) % H, root);
    for (int i = 0; i < nlinks; i++)
      t->children[t->nchildren++] = headOf(m, (links[i] + rootHost) % H, root);
  }
  if (levels & TREE_INTRA) {
    int k = hostMapSize(m, host), base = m->hostStart[host], rootLocal = m->localIndex[head];
    v = binomialLinks((m->localIndex[rank] - rootLocal + k) % k, k, links, &nlinks);
    if (v >= 0) t->parent = m->members[base + (v + rootLocal) % k];
    for (int i = 0; i < nlinks; i++)
      t->children[t->nchildren++] = m->members[base + (links[i] + rootLocal) % k];
  }
}

/* Pipelined broadcast down t: piece j arrives from the parent while piece j-1 goes to the
 * children. src is what this rank forwards (the root's source, buf elsewhere). A root with
 * copyTo also copies each piece there while it goes out (xferRunCopying). */
static ncclxResult_t treeBcast(struct ncclxComm* comm, const hierTree* t, const char* src,
                               char* buf, size_t bytes, char* copyTo) {
  size_t piece = collPieceBytes(comm), npieces = (bytes + piece - 1) / piece;
  ncclxXfer x[HIER_MAX_CHILDREN + 1];
  for (size_t j = 0; j <= npieces; j++) {
    int nx = 0;
    if (t->parent >= 0 && j < npieces) {
      size_t off = j * piece, len = bytes - off < piece ? bytes - off : piece;
      x[nx++] = (ncclxXfer){.peer = t->parent, .isSend = 0, .buf = buf + off, .bytes = len};
    }
    if (j >= 1) {
      size_t off = (j - 1) * piece, len = bytes - off < piece ? bytes - off : piece;
      for (int c = 0; c < t->nchildren; c++)
        x[nx++] = (ncclxXfer){.peer = t->children[c], .isSend = 1, .buf = (void*)(src + off),
                              .bytes = len};
      if (copyTo) {
        NCCLX_CHECK(xferRunCopying(comm, x, nx, copyTo + off, src + off, len));
        continue;
      }
    }
    if (nx) NCCLX_CHECK(xferRun(comm, x, nx));
  }
  return ncclxSuccess;
}

/* Pipelined reduce up t: piece j of every child's partial arrives (each in its own slot)
 * while piece j-1 of this rank's partial goes to the parent; children are combined in list
 * order, so the result does not depend on timing. The root writes into out (may alias
 * send); other ranks keep their partials in scratch (two pieces, alternating). Avg is left
 * as a Sum. */
static ncclxResult_t treeReduce(struct ncclxComm* comm, const hierTree* t, const char* send,
                                char* out, size_t count, ncclxDataType_t type, ncclxRedOp_t op) {
  size_t sz = ncclxTypeSize(type), piece = collPieceBytes(comm) / sz;
  if (piece == 0) piece = 1;
  size_t npieces = (count + piece - 1) / piece;
  int isRoot = t->parent < 0;
  char* scratch;
  NCCLX_CHECK(collScratch(comm, "reduce", ((size_t)t->nchildren + 2) * piece * sz, &scratch));
  char* acc[2] = {scratch + (size_t)t->nchildren * piece * sz,
                  scratch + ((size_t)t->nchildren + 1) * piece * sz};
  const char* partial[2] = {NULL, NULL}; /* what goes to the parent, per piece parity */
  ncclxXfer x[HIER_MAX_CHILDREN + 1];
  for (size_t j = 0; j <= npieces; j++) {
    int nx = 0;
    size_t off = j * piece, len = j < npieces ? (count - off < piece ? count - off : piece) : 0;
    for (int c = 0; c < t->nchildren && len; c++)
      x[nx++] = (ncclxXfer){.peer = t->children[c], .isSend = 0,
                            .buf = scratch + (size_t)c * piece * sz, .bytes = len * sz};
    if (j >= 1 && !isRoot) {
      size_t poff = (j - 1) * piece, plen = count - poff < piece ? count - poff : piece;
      x[nx++] = (ncclxXfer){.peer = t->parent, .isSend = 1, .buf = (void*)partial[(j - 1) % 2],
                            .bytes = plen * sz};
    }
    if (nx) NCCLX_CHECK(xferRun(comm, x, nx));
    if (!len) continue;
    const char* cur = send + off * sz;
    char* dst = isRoot ? out + off * sz : acc[j % 2];
    for (int c = 0; c < t->nchildren; c++) {
      ncclxReduce2(dst, cur, scratch + (size_t)c * piece * sz, len, type, op);
      cur = dst;
    }
    if (isRoot && cur != dst) memmove(dst, cur, len * sz); /* a root without children */
    partial[j % 2] = cur; /* a leaf forwards its input as is */
  }
  return ncclxSuccess;
}

/* ---------------- broadcast and reduce ---------------- */

ncclxResult_t broadcastHier(struct ncclxComm* comm, const ncclxCollArgs* a) {
  size_t bytes = a->count * ncclxTypeSize(a->datatype);
  if (bytes == 0) return ncclxSuccess;
  const struct ncclxHostMap* m = collHierMap(comm);
  if (!m) return ncclxSystemError;
  hierTree t;
  treeBuild(m, comm->rank, a->root, TREE_BOTH, &t);
  int isRoot = comm->rank == a->root;
  const char* src = isRoot ? (const char*)a->sendbuff : (const char*)a->recvbuff;
  int alongside = isRoot && collRootCopyAlongside(comm, a->sendbuff, a->recvbuff, bytes);
  NCCLX_CHECK(treeBcast(comm, &t, src, a->recvbuff, bytes, alongside ? a->recvbuff : NULL));
  if (isRoot && !alongside && a->recvbuff != a->sendbuff) memmove(a->recvbuff, a->sendbuff, bytes);
  return ncclxSuccess;
}

ncclxResult_t reduceHier(struct ncclxComm* comm, const ncclxCollArgs* a) {
  if (a->count == 0) return ncclxSuccess;
  const struct ncclxHostMap* m = collHierMap(comm);
  if (!m) return ncclxSystemError;
  hierTree t;
  treeBuild(m, comm->rank, a->root, TREE_BOTH, &t);
  int isRoot = comm->rank == a->root;
  NCCLX_CHECK(treeReduce(comm, &t, a->sendbuff, isRoot ? a->recvbuff : NULL, a->count,
                         a->datatype, a->op));
  if (isRoot && a->op == ncclxAvg)
    ncclxAvgFinish(a->recvbuff, a->count, a->datatype, comm->nranks);
  return ncclxSuccess;
}

/* ---------------- allreduce ---------------- */

static size_t blockOff(size_t count, int n, int i) {
  size_t base = count / (size_t)n, rem = count % (size_t)n, ui = (size_t)i;
  return ui * base + (ui < rem ? ui : rem);
}

/* Ring allreduce among the hosts' leaders, in place on buf (this rank is a leader). Avg
 * stays a Sum. Segments of nhosts pieces keep the scratch at one piece. */
static ncclxResult_t leadersRing(struct ncclxComm* comm, const struct ncclxHostMap* m,
                                 char* buf, size_t count, ncclxDataType_t type,
                                 ncclxRedOp_t op) {
  int H = m->nhosts, me = m->hostOf[comm->rank];
  int next = hostMapLeader(m, (me + 1) % H), prev = hostMapLeader(m, (me + H - 1) % H);
  size_t sz = ncclxTypeSize(type), piece = collPieceBytes(comm) / sz;
  if (piece == 0) piece = 1;
  size_t segMax = piece * (size_t)H;
  char* tmp;
  NCCLX_CHECK(collScratch(comm, "allreduce", piece * sz, &tmp));
  for (size_t segOff = 0; segOff < count; segOff += segMax) {
    size_t len = count - segOff < segMax ? count - segOff : segMax;
    char* seg = buf + segOff * sz;
#define BLK(b) (seg + blockOff(len, H, (b)) * sz)
#define BLEN(b) ((blockOff(len, H, (b) + 1) - blockOff(len, H, (b))) * sz)
    /* Reduce-scatter: after H-1 steps this leader holds block me+1 complete. */
    for (int s = 0; s < H - 1; s++) {
      int sb = (me - s + H) % H, rb = (me - s - 1 + H) % H;
      NCCLX_CHECK(collSendRecv(comm, next, BLK(sb), BLEN(sb), prev, tmp, BLEN(rb)));
      ncclxReduce2(BLK(rb), BLK(rb), tmp, BLEN(rb) / sz, type, op);
    }
    /* Allgather the finished blocks around the ring. */
    int own = (me + 1) % H;
    for (int s = 0; s < H - 1; s++) {
      int sb = (own - s + H) % H, rb = (me - s + H) % H;
      NCCLX_CHECK(collSendRecv(comm, next, BLK(sb), BLEN(sb), prev, BLK(rb), BLEN(rb)));
    }
#undef BLK
#undef BLEN
  }
  return ncclxSuccess;
}

ncclxResult_t allreduceHier(struct ncclxComm* comm, const ncclxCollArgs* a) {
  size_t sz = ncclxTypeSize(a->datatype), bytes = a->count * sz;
  if (bytes == 0) return ncclxSuccess;
  const struct ncclxHostMap* m = collHierMap(comm);
  if (!m) return ncclxSystemError;
  int r = comm->rank, leader = hostMapLeader(m, m->hostOf[r]);
  char* recv = a->recvbuff;
  hierTree t;
  if (bytes < HIER_RING_MIN_BYTES || m->nhosts == 1) {
    treeBuild(m, r, 0, TREE_BOTH, &t);
    NCCLX_CHECK(treeReduce(comm, &t, a->sendbuff, r == 0 ? recv : NULL, a->count, a->datatype,
                           a->op));
    if (r == 0 && a->op == ncclxAvg) ncclxAvgFinish(recv, a->count, a->datatype, comm->nranks);
    return treeBcast(comm, &t, recv, recv, bytes, NULL);
  }
  treeBuild(m, r, 0, TREE_INTRA, &t); /* every host's tree is rooted at its leader */
  NCCLX_CHECK(treeReduce(comm, &t, a->sendbuff, r == leader ? recv : NULL, a->count,
                         a->datatype, a->op));
  if (r == leader) {
    NCCLX_CHECK(leadersRing(comm, m, recv, a->count, a->datatype, a->op));
    if (a->op == ncclxAvg) ncclxAvgFinish(recv, a->count, a->datatype, comm->nranks);
  }
  return treeBcast(comm, &t, recv, recv, bytes, NULL);
}

/* ---------------- allgather ---------------- */

/* Transfers moving host h's blocks of buf to or from peer: one per run of consecutive
 * ranks (a host of consecutive ranks is one message). */
static int addHostBlocks(ncclxXfer* x, int nx, const struct ncclxHostMap* m, int h, int peer,
                         int isSend, char* buf, size_t blk) {
  const int* mem = m->members + m->hostStart[h];
  int k = hostMapSize(m, h);
  for (int i = 0; i < k;) {
    int j = i + 1;
    while (j < k && mem[j] == mem[j - 1] + 1) j++;
    x[nx++] = (ncclxXfer){.peer = peer, .isSend = isSend, .buf = buf + (size_t)mem[i] * blk,
                          .bytes = (size_t)(j - i) * blk};
    i = j;
  }
  return nx;
}

ncclxResult_t allgatherHier(struct ncclxComm* comm, const ncclxCollArgs* a) {
  size_t blk = a->count * ncclxTypeSize(a->datatype);
  if (blk == 0) return ncclxSuccess;
  const struct ncclxHostMap* m = collHierMap(comm);
  if (!m) return ncclxSystemError;
  int r = comm->rank, h = m->hostOf[r], H = m->nhosts, leader = hostMapLeader(m, h);
  int k = hostMapSize(m, h);
  char* recv = a->recvbuff;
  char* own = recv + (size_t)r * blk;
  if (own != a->sendbuff) memmove(own, a->sendbuff, blk);
  ncclxXfer* x = calloc(2 * (size_t)m->maxLocal, sizeof(*x));
  if (!x) return commFail(comm, ncclxSystemError, "allgather: out of memory");
  ncclxResult_t res = ncclxSuccess;
  /* Gather the host's blocks at the leader, straight into place. */
  if (r != leader) {
    res = collSendRecv(comm, leader, own, blk, -1, NULL, 0);
  } else if (k > 1) {
    int nx = 0;
    for (int i = 1; i < k; i++) {
      int p = m->members[m->hostStart[h] + i];
      x[nx++] = (ncclxXfer){.peer = p, .isSend = 0, .buf = recv + (size_t)p * blk, .bytes = blk};
    }
    res = xferRun(comm, x, nx);
  }
  /* Leaders pass host blocks around a ring: after H-1 steps each has them all. */
  if (r == leader) {
    int next = hostMapLeader(m, (h + 1) % H), prev = hostMapLeader(m, (h + H - 1) % H);
    for (int s = 0; s < H - 1 && res == ncclxSuccess; s++) {
      int nx = addHostBlocks(x, 0, m, (h - s + H) % H, next, 1, recv, blk);
      nx = addHostBlocks(x, nx, m, (h - s - 1 + H) % H, prev, 0, recv, blk);
      res = xferRun(comm, x, nx);
    }
  }
  free(x);
  NCCLX_CHECK(res);
  hierTree t;
  treeBuild(m, r, 0, TREE_INTRA, &t);
  return treeBcast(comm, &t, recv, recv, (size_t)comm->nranks * blk, NULL);
}
