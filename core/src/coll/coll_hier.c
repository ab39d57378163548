/* The host map behind the hierarchical collectives, and their cost model. */
#include "coll/coll_hier.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "util/debug.h"

typedef struct {
  uint64_t hash;
  int rank;
} hashRank;

static int compareHashRank(const void* x, const void* y) {
  const hashRank *a = x, *b = y;
  if (a->hash != b->hash) return a->hash < b->hash ? -1 : 1;
  return a->rank - b->rank;
}

/* Sorting by (hash, rank) makes each host one run with its lowest rank first, in
 * O(n log n) whatever the number of hosts; hosts are then numbered by walking the ranks in
 * order and taking each host when its lowest rank comes up. */
struct ncclxHostMap* hostMapBuild(const struct ncclxPeerInfo* info, int nranks) {
  if (nranks < 1) return NULL;
  size_t n = (size_t)nranks;
  struct ncclxHostMap* m = malloc(sizeof(*m) + sizeof(int) * (4 * n + 1));
  hashRank* sorted = malloc(sizeof(*sorted) * n);
  int* runOf = malloc(sizeof(int) * n); /* rank -> index of its run's first entry in sorted */
  if (!m || !sorted || !runOf) {
    free(m), free(sorted), free(runOf);
    return NULL;
  }
  m->nranks = nranks;
  m->hostOf = (int*)(m + 1);
  m->localIndex = m->hostOf + n;
  m->members = m->localIndex + n;
  m->hostStart = m->members + n; /* up to nranks + 1 entries */
  for (int r = 0; r < nranks; r++) sorted[r] = (hashRank){info[r].hostHash, r};
  qsort(sorted, n, sizeof(*sorted), compareHashRank);
  for (size_t i = 0, first = 0; i < n; i++) {
    if (i > 0 && sorted[i].hash != sorted[i - 1].hash) first = i;
    runOf[sorted[i].rank] = (int)first;
  }
  int nhosts = 0, next = 0;
  m->minLocal = nranks;
  m->maxLocal = 0;
  for (int r = 0; r < nranks; r++) {
    int first = runOf[r];
    if (sorted[first].rank != r) continue; /* not the lowest rank of its host */
    int h = nhosts++;
    m->hostStart[h] = next;
    for (int i = first; i < nranks && sorted[i].hash == sorted[first].hash; i++) {
      int member = sorted[i].rank;
      m->hostOf[member] = h;
      m->localIndex[member] = next - m->hostStart[h];
      m->members[next++] = member;
    }
    int size = next - m->hostStart[h];
    if (size < m->minLocal) m->minLocal = size;
    if (size > m->maxLocal) m->maxLocal = size;
  }
  m->hostStart[nhosts] = next;
  m->nhosts = nhosts;
  free(sorted);
  free(runOf);
  return m;
}

const struct ncclxHostMap* collHierMap(struct ncclxComm* comm) {
  if (comm->hostMap) return comm->hostMap;
  comm->hostMap = hostMapBuild(comm->peerInfo, comm->nranks);
  if (!comm->hostMap) {
    commFail(comm, ncclxSystemError, "hierarchical: out of memory for the host map of %d ranks",
             comm->nranks);
    return NULL;
  }
  const struct ncclxHostMap* m = comm->hostMap;
  INFO(NCCLX_LOG_COLL, "hierarchical: comm %s rank %d host %d of %d (%d..%d ranks per host), leader %d",
       comm->name, comm->rank, m->hostOf[comm->rank], m->nhosts, m->minLocal, m->maxLocal,
       hostMapLeader(m, m->hostOf[comm->rank]));
  return m;
}

void collHierCommFree(struct ncclxComm* comm) {
  free(comm->hostMap);
  comm->hostMap = NULL;
}

int collHierUseful(const struct ncclxComm* comm) {
  return comm->nhosts > 1 && comm->ranksPerHostMax > 1;
}

/* ---------------- cost model ---------------- */

static double ceilLog2(int p) {
  int l = 0;
  while ((1 << l) < p) l++;
  return (double)l;
}

double collHierModelCost(const struct ncclxComm* comm, ncclxCollType_t coll, double bytes,
                         double alphaShmUs, double betaShmUsPerByte, double alphaNetUs,
                         double betaNetUsPerByte, double gammaUsPerByte) {
  if (!comm || !collHierUseful(comm) || bytes < 0) return -1.0;
  const double aS = alphaShmUs, bS = betaShmUsPerByte, aN = alphaNetUs, bN = betaNetUsPerByte;
  const double g = gammaUsPerByte, S = bytes;
  const int n = comm->nranks, H = comm->nhosts, k = comm->ranksPerHostMax;
  const double Lk = ceilLog2(k), LH = ceilLog2(H);
  /* Two-level binomial trees: LH network levels, Lk shared-memory levels. */
  const double bcast = LH * (aN + S * bN) + Lk * (aS + S * bS);
  const double reduce = LH * (aN + S * (bN + g)) + Lk * (aS + S * (bS + g));
  switch (coll) {
    case NCCLX_COLL_BROADCAST:
      return bcast;
    case NCCLX_COLL_REDUCE:
      return reduce;
    case NCCLX_COLL_ALLREDUCE: {
      /* The same switch as allreduceHier. */
      if (S < (double)HIER_RING_MIN_BYTES) return reduce + bcast;
      double frac = (double)(H - 1) / H;
      double ring = 2 * (H - 1) * aN + 2 * frac * S * bN + frac * S * g;
      return Lk * (aS + S * (bS + g)) + ring + Lk * (aS + S * bS);
    }
    case NCCLX_COLL_ALLGATHER: {
      /* Leader gathers k-1 blocks, leaders ring the host blocks, leader broadcasts all. */
      double gather = (k - 1) * aS + (double)(k - 1) / n * S * bS;
      double ring = (H - 1) * (aN + (double)k / n * S * bN);
      return gather + ring + Lk * (aS + S * bS);
    }
    case NCCLX_COLL_ALLTOALL: {
      /* Per window: direct exchange in the host plus the gather to the leader, one message
       * per host pair among leaders (all posted at once), the scatter from the leader; the
       * leader packs what it moves. Windows of the block are processed one after another. */
      double remote = (double)(n - k) / n; /* share of a rank's data leaving its host */
      double intra = (k - 1) * aS + (k - 1) * (1.0 / n + remote) * S * bS;
      double inter = (H - 1) * aN * 0.5 + aN + k * remote * S * bN;
      double scatter = (k - 1) * aS + (k - 1) * remote * S * bS;
      double pack = 3 * k * remote * S * g;
      /* Rounds beyond the first pay their latencies again. */
      double w = (double)alltoallHierWindow(comm->chunkBytes, n, k);
      double rounds = ceil(S / n / w);
      double extra = rounds > 1 ? (rounds - 1) * (2 * aS + aN) : 0.0;
      return intra + inter + scatter + pack + extra;
    }
    default:
      return -1.0;
  }
}
