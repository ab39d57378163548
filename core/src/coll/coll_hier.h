/* Hierarchical collectives: ranks grouped by host (peerInfo[].hostHash), one leader per host.
 *
 * Traffic inside a host goes over shared memory, traffic between hosts only between
 * leaders (or, for rooted collectives, between the root and the other hosts' leaders), so
 * the network carries one message per host pair instead of one per rank pair. Every
 * algorithm is correct for any layout (unequal hosts, one host, one rank per host); the
 * tuner only offers it where it helps (collAlgoSupportedOn). */
#ifndef NCCLX_COLL_HIER_H
#define NCCLX_COLL_HIER_H

#include "coll/coll.h"

/* Who is on which host. Hosts are numbered in order of their lowest rank; the leader of a
 * host is its lowest rank; members of a host are listed in increasing rank order. */
struct ncclxHostMap {
  int nranks, nhosts;
  int minLocal, maxLocal; /* fewest and most ranks on one host */
  int* hostOf;            /* [nranks] host index of each rank */
  int* localIndex;        /* [nranks] position of each rank among its host's members */
  int* hostStart;         /* [nhosts + 1] host h's members are members[hostStart[h] ..] */
  int* members;           /* [nranks] ranks grouped by host */
};

static inline int hostMapSize(const struct ncclxHostMap* m, int host) {
  return m->hostStart[host + 1] - m->hostStart[host];
}
static inline int hostMapLeader(const struct ncclxHostMap* m, int host) {
  return m->members[m->hostStart[host]];
}

/* Build the map from nranks peer infos (one allocation: free() it). NULL when out of memory. */
struct ncclxHostMap* hostMapBuild(const struct ncclxPeerInfo* info, int nranks);
/* The comm's map, built on first use (execLock held). NULL (and the comm failed) when out
 * of memory. */
const struct ncclxHostMap* collHierMap(struct ncclxComm* comm);
/* Release comm->hostMap; called where the comm's resources are freed. */
void collHierCommFree(struct ncclxComm* comm);

/* Whether the hierarchical algorithms pay off on comm: several hosts, one of them with
 * several ranks. (They run correctly everywhere.) */
int collHierUseful(const struct ncclxComm* comm);

/* Estimated microseconds of the hierarchical algorithm of coll on comm, or < 0 when there
 * is none for coll or it does not pay off (collHierUseful is false).
 *
 * bytes is the tuner's size of the call (tuneCallBytes): count * element size for
 * allreduce, broadcast and reduce, the whole receive buffer (nranks blocks) for allgather
 * and alltoall. The model is alpha-beta per link: alphaShmUs / betaShmUsPerByte for a
 * message between ranks of one host, alphaNetUs / betaNetUsPerByte between hosts, and
 * gammaUsPerByte for reducing (and packing) one byte. It uses the largest host
 * (ranksPerHostMax) and the host count, and follows the variant the algorithm will run
 * (allreduce switches from two-level trees to a ring among leaders at HIER_RING_MIN_BYTES;
 * alltoall pays its latencies again for every window round, see alltoallHierWindow).
 * Same inputs, same result: it is deterministic and needs no communication. */
double collHierModelCost(const struct ncclxComm* comm, ncclxCollType_t coll, double bytes,
                         double alphaShmUs, double betaShmUsPerByte, double alphaNetUs,
                         double betaNetUsPerByte, double gammaUsPerByte);

/* Allreduce at and above this size reduces in the host, runs a ring among the leaders and
 * broadcasts in the host; below it, a two-level tree reduce then broadcast (fewer steps). */
#define HIER_RING_MIN_BYTES ((size_t)64 * 1024)

/* All-to-all window: bytes of every block exchanged per round, chosen so that the largest
 * staging any rank needs (3 * ranksPerHostMax * nranks blocks at a leader, plus nranks to
 * stage an in-place call) fits in HIER_A2A_STAGING_CHUNKS pipeline chunks. At least 1. */
#define HIER_A2A_STAGING_CHUNKS 8
size_t alltoallHierWindow(size_t chunkBytes, int nranks, int ranksPerHostMax);

/* Algorithms (registered under NCCLX_ALGO_HIERARCHICAL). */
ncclxResult_t allreduceHier(struct ncclxComm* comm, const ncclxCollArgs* a);
ncclxResult_t broadcastHier(struct ncclxComm* comm, const ncclxCollArgs* a);
ncclxResult_t reduceHier(struct ncclxComm* comm, const ncclxCollArgs* a);
ncclxResult_t allgatherHier(struct ncclxComm* comm, const ncclxCollArgs* a);
ncclxResult_t alltoallHier(struct ncclxComm* comm, const ncclxCollArgs* a);
#endif
