/* Hierarchical all-to-all with per-host aggregation.
 *
 * Ranks of one host exchange their blocks for each other directly (shared memory). What
 * goes to other hosts travels in three steps: every rank hands its blocks for remote ranks
 * to its host's leader, the leaders exchange one message per host pair, and each leader
 * scatters to its ranks what arrived for them. The network then carries H*(H-1) messages
 * instead of n*(n-k).
 *
 * The exchange runs window by window (bytes [off, off+w) of every block) so the leader's
 * staging stays bounded; w is derived from values every rank agrees on (nranks, the largest
 * host, the chunk size), so all ranks cut the same windows. In place, each window of the send
 * blocks is copied aside before any of it is overwritten.
 *
 * Layouts, for host h with k ranks and the remote ranks ordered by (host, rank):
 *   out   (every rank)  [host g != h][d in g]          its blocks for remote ranks
 *   gath  (leader)      [g != h][s in h][d in g]       the host's outgoing data, per host
 *   arriv (leader)      [g != h][s in g][d in h]       what the other leaders sent
 *   in    (every rank)  [g != h][s in g]               its blocks from remote ranks
 *   pack  (leader)      [local rank != leader][in]     the scatter, one message per rank
 * so that the section for host g of gath is the one message to g's leader. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "coll/coll_hier.h"
#include "util/debug.h"
#include "exec/xfer.h"

typedef struct {
  struct ncclxComm* comm;
  const struct ncclxHostMap* m;
  int h, k, leader, isLeader, localIdx;
  size_t remote;  /* blocks to or from other hosts: nranks - k */
  const char* src; /* this window's send blocks */
  size_t srcStride;
  char* dst;       /* this window's receive blocks */
  size_t dstStride;
  size_t w;        /* window bytes */
  char *out, *in, *gath, *arriv, *pack; /* staging, see the file comment */
  ncclxXfer* x;
} a2aHier;

/* Blocks before host g's section in a list of the remote ranks of host h. */
static size_t remoteOff(const struct ncclxHostMap* m, int h, int g) {
  return (size_t)(m->hostStart[g] - (g > h ? hostMapSize(m, h) : 0));
}

static int member(const struct ncclxHostMap* m, int g, int i) {
  return m->members[m->hostStart[g] + i];
}

static void addX(a2aHier* s, int* nx, int peer, int isSend, const void* buf, size_t bytes) {
  if (bytes)
    s->x[(*nx)++] = (ncclxXfer){.peer = peer, .isSend = isSend, .buf = (void*)buf, .bytes = bytes};
}

/* Direct exchange inside the host, and the remote-bound blocks to the leader. For one
 * (local rank, leader) pair both sides list the direct block first, then the sections by
 * host. */
static ncclxResult_t stepGather(a2aHier* s) {
  const struct ncclxHostMap* m = s->m;
  int r = s->comm->rank, nx = 0;
  size_t w = s->w;
  memmove(s->dst + (size_t)r * s->dstStride, s->src + (size_t)r * s->srcStride, w);
  for (int i = 0; i < s->k; i++) {
    int p = member(m, s->h, (s->localIdx + i) % s->k); /* start after self: spread the load */
    if (p == r) continue;
    addX(s, &nx, p, 0, s->dst + (size_t)p * s->dstStride, w);
    addX(s, &nx, p, 1, s->src + (size_t)p * s->srcStride, w);
  }
  /* Pack the blocks for remote ranks: into out, or (leader) straight into gath. */
  for (int g = 0; g < m->nhosts; g++) {
    if (g == s->h) continue;
    int kg = hostMapSize(m, g);
    char* sec = s->isLeader ? s->gath + ((size_t)s->k * remoteOff(m, s->h, g)) * w
                            : s->out + remoteOff(m, s->h, g) * w;
    for (int j = 0; j < kg; j++)
      memcpy(sec + (size_t)j * w, s->src + (size_t)member(m, g, j) * s->srcStride, w);
    if (!s->isLeader) addX(s, &nx, s->leader, 1, sec, (size_t)kg * w);
  }
  if (s->isLeader)
    for (int i = 1; i < s->k; i++)
      for (int g = 0; g < m->nhosts; g++) {
        if (g == s->h) continue;
        int kg = hostMapSize(m, g);
        char* sec = s->gath + ((size_t)s->k * remoteOff(m, s->h, g) + (size_t)i * kg) * w;
        addX(s, &nx, member(m, s->h, i), 0, sec, (size_t)kg * w);
      }
  return nx ? xferRun(s->comm, s->x, nx) : ncclxSuccess;
}

/* Leaders: one message to and from every other host's leader. */
static ncclxResult_t stepExchange(a2aHier* s) {
  const struct ncclxHostMap* m = s->m;
  int nx = 0;
  size_t w = s->w;
  for (int i = 1; i < m->nhosts; i++) {
    int g = (s->h + i) % m->nhosts, from = (s->h - i + m->nhosts) % m->nhosts;
    size_t kg = (size_t)hostMapSize(m, g), kf = (size_t)hostMapSize(m, from);
    addX(s, &nx, hostMapLeader(m, from), 0, s->arriv + (size_t)s->k * remoteOff(m, s->h, from) * w,
         kf * (size_t)s->k * w);
    addX(s, &nx, hostMapLeader(m, g), 1, s->gath + (size_t)s->k * remoteOff(m, s->h, g) * w,
         (size_t)s->k * kg * w);
  }
  return nx ? xferRun(s->comm, s->x, nx) : ncclxSuccess;
}

/* Leaders: pick out each local rank's blocks from arriv (into pack, or straight into place
 * for the leader's own) and send them; local ranks receive into in and unpack. */
static ncclxResult_t stepScatter(a2aHier* s) {
  const struct ncclxHostMap* m = s->m;
  int nx = 0;
  size_t w = s->w, k = (size_t)s->k;
  if (s->isLeader) {
    for (int d = 0; d < s->k; d++) {
      char* in = d ? s->pack + (size_t)(d - 1) * s->remote * w : NULL;
      for (int g = 0; g < m->nhosts; g++) {
        if (g == s->h) continue;
        size_t base = k * remoteOff(m, s->h, g);
        for (int j = 0; j < hostMapSize(m, g); j++) {
          const char* blk = s->arriv + (base + (size_t)j * k + (size_t)d) * w;
          char* to = d ? in + (remoteOff(m, s->h, g) + (size_t)j) * w
                       : s->dst + (size_t)member(m, g, j) * s->dstStride;
          memcpy(to, blk, w);
        }
      }
      if (d) addX(s, &nx, member(m, s->h, d), 1, in, s->remote * w);
    }
    return nx ? xferRun(s->comm, s->x, nx) : ncclxSuccess;
  }
  addX(s, &nx, s->leader, 0, s->in, s->remote * w);
  if (nx) NCCLX_CHECK(xferRun(s->comm, s->x, nx));
  for (int g = 0; g < m->nhosts; g++) {
    if (g == s->h) continue;
    for (int j = 0; j < hostMapSize(m, g); j++)
      memcpy(s->dst + (size_t)member(m, g, j) * s->dstStride,
             s->in + (remoteOff(m, s->h, g) + (size_t)j) * w, w);
  }
  return ncclxSuccess;
}

size_t alltoallHierWindow(size_t chunkBytes, int nranks, int ranksPerHostMax) {
  size_t chunk = chunkBytes ? chunkBytes : (size_t)1 << 20;
  size_t perWindow = 3 * (size_t)ranksPerHostMax * (size_t)nranks + (size_t)nranks;
  size_t w = HIER_A2A_STAGING_CHUNKS * chunk / perWindow;
  return w ? w : 1;
}

ncclxResult_t alltoallHier(struct ncclxComm* comm, const ncclxCollArgs* a) {
  int n = comm->nranks, r = comm->rank;
  size_t blk = a->count * ncclxTypeSize(a->datatype), total = (size_t)n * blk;
  if (blk == 0) return ncclxSuccess;
  int inPlace = a->sendbuff == a->recvbuff;
  if (!inPlace && collRangesOverlap(a->sendbuff, total, a->recvbuff, total))
    return commFail(comm, ncclxInvalidArgument,
                    "alltoall: sendbuff and recvbuff overlap without being equal");
  const struct ncclxHostMap* m = collHierMap(comm);
  if (!m) return ncclxSystemError;
  a2aHier s = {.comm = comm, .m = m, .h = m->hostOf[r], .localIdx = m->localIndex[r]};
  s.k = hostMapSize(m, s.h);
  s.leader = hostMapLeader(m, s.h);
  s.isLeader = r == s.leader;
  s.remote = (size_t)(n - s.k);
  /* Window: computed from values every rank shares, so all cut the same windows. */
  size_t w = alltoallHierWindow(comm->chunkBytes, n, m->maxLocal);
  if (w > blk) w = blk;
  s.w = w;
  size_t stageBlocks = inPlace ? (size_t)n : 0;
  size_t mine = s.isLeader ? 3 * (size_t)s.k * s.remote : 2 * s.remote;
  char* scratch = commScratch(comm, (stageBlocks + mine) * w + 1);
  /* Most transfers in one step: a leader's direct pairs plus a section per (local, host). */
  s.x = calloc(2 * (size_t)n + (size_t)s.k * (size_t)m->nhosts, sizeof(*s.x));
  if (!scratch || !s.x) {
    free(s.x);
    return commFail(comm, ncclxSystemError, "alltoall: out of memory for %zu bytes of staging",
                    (stageBlocks + mine) * w);
  }
  char* stage = scratch;
  char* area = scratch + stageBlocks * w;
  if (s.isLeader) {
    s.gath = area;
    s.arriv = area + (size_t)s.k * s.remote * w;
    s.pack = area + 2 * (size_t)s.k * s.remote * w;
  } else {
    s.out = area;
    s.in = area + s.remote * w;
  }
  ncclxResult_t res = ncclxSuccess;
  for (size_t off = 0; off < blk && res == ncclxSuccess; off += w) {
    s.w = blk - off < w ? blk - off : w;
    s.src = (const char*)a->sendbuff + off;
    s.srcStride = blk;
    s.dst = (char*)a->recvbuff + off;
    s.dstStride = blk;
    if (inPlace) {
      for (int b = 0; b < n; b++) memcpy(stage + (size_t)b * s.w, s.src + (size_t)b * blk, s.w);
      s.src = stage;
      s.srcStride = s.w;
    }
    res = stepGather(&s);
    if (res == ncclxSuccess && s.isLeader) res = stepExchange(&s);
    if (res == ncclxSuccess && s.remote) res = stepScatter(&s);
  }
  free(s.x);
  return res;
}
