/* The host map (coll_hier.c) on hand-made and random layouts, checked against a naive
 * O(n^2) reading of the same peer infos; the hierarchical cost model and when the tuner may
 * offer the algorithm. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coll/coll.h"
#include "coll/coll_hier.h"

static int failures;

#define EXPECT(cond, ...)                                           \
  do {                                                              \
    if (!(cond)) {                                                  \
      failures++;                                                   \
      fprintf(stderr, "%s:%d: FAIL %s: ", __FILE__, __LINE__, #cond); \
      fprintf(stderr, __VA_ARGS__);                                 \
      fprintf(stderr, "\n");                                        \
    }                                                               \
  } while (0)

static struct ncclxPeerInfo* infos(const uint64_t* hashes, int n) {
  struct ncclxPeerInfo* info = calloc((size_t)n, sizeof(*info));
  for (int r = 0; r < n; r++) info[r].rank = r, info[r].hostHash = hashes[r];
  return info;
}

/* Every property the algorithms rely on, derived independently from the hashes. */
static void checkMap(const char* name, const uint64_t* hashes, int n) {
  struct ncclxPeerInfo* info = infos(hashes, n);
  struct ncclxHostMap* m = hostMapBuild(info, n);
  EXPECT(m != NULL, "%s: no map", name);
  if (!m) {
    free(info);
    return;
  }
  int hosts = 0, minK = n, maxK = 0;
  for (int r = 0; r < n; r++) {
    int lowest = r, before = 0, k = 0;
    for (int q = 0; q < n; q++) {
      if (hashes[q] != hashes[r]) continue;
      if (q < lowest) lowest = q;
      if (q < r) before++;
      k++;
    }
    if (lowest == r) {
      /* Hosts are numbered in order of their lowest rank. */
      EXPECT(m->hostOf[r] == hosts, "%s: rank %d opens host %d, map says %d", name, r, hosts,
             m->hostOf[r]);
      hosts++;
      if (k < minK) minK = k;
      if (k > maxK) maxK = k;
    }
    int h = m->hostOf[r];
    EXPECT(h >= 0 && h < m->nhosts, "%s: rank %d host %d", name, r, h);
    if (h < 0 || h >= m->nhosts) continue;
    EXPECT(m->hostOf[lowest] == h, "%s: rank %d and %d share a host but not an index", name, r,
           lowest);
    EXPECT(hostMapLeader(m, h) == lowest, "%s: leader of rank %d is %d, want %d", name, r,
           hostMapLeader(m, h), lowest);
    EXPECT(hostMapSize(m, h) == k, "%s: host of rank %d has %d ranks, want %d", name, r,
           hostMapSize(m, h), k);
    EXPECT(m->localIndex[r] == before, "%s: rank %d local index %d, want %d", name, r,
           m->localIndex[r], before);
    EXPECT(m->members[m->hostStart[h] + m->localIndex[r]] == r, "%s: members miss rank %d", name,
           r);
  }
  EXPECT(m->nhosts == hosts, "%s: %d hosts, want %d", name, m->nhosts, hosts);
  EXPECT(m->minLocal == minK && m->maxLocal == maxK, "%s: sizes %d..%d, want %d..%d", name,
         m->minLocal, m->maxLocal, minK, maxK);
  EXPECT(m->hostStart[0] == 0 && m->hostStart[m->nhosts] == n, "%s: host offsets", name);
  for (int h = 0; h < m->nhosts; h++)
    for (int i = m->hostStart[h] + 1; i < m->hostStart[h + 1]; i++)
      EXPECT(m->members[i - 1] < m->members[i], "%s: host %d members not ascending", name, h);
  free(m);
  free(info);
}

static void handMade(void) {
  /* 3 + 2, contiguous. */
  const uint64_t a[] = {7, 7, 7, 3, 3};
  checkMap("3+2", a, 5);
  struct ncclxPeerInfo* info = infos(a, 5);
  struct ncclxHostMap* m = hostMapBuild(info, 5);
  EXPECT(m && m->nhosts == 2 && m->minLocal == 2 && m->maxLocal == 3, "3+2 shape");
  EXPECT(m && hostMapLeader(m, 0) == 0 && hostMapLeader(m, 1) == 3, "3+2 leaders");
  EXPECT(m && m->hostOf[4] == 1 && m->localIndex[4] == 1, "3+2 rank 4");
  free(m);
  free(info);
  /* Interleaved and unequal (3, 3, 1); hash order differs from rank order. */
  const uint64_t b[] = {90, 10, 90, 55, 10, 90, 10};
  checkMap("interleaved 3+3+1", b, 7);
  info = infos(b, 7);
  m = hostMapBuild(info, 7);
  static const int wantMembers[] = {0, 2, 5, 1, 4, 6, 3};
  EXPECT(m && m->nhosts == 3 && m->minLocal == 1 && m->maxLocal == 3, "interleaved shape");
  for (int i = 0; m && i < 7; i++)
    EXPECT(m->members[i] == wantMembers[i], "members[%d] = %d, want %d", i, m->members[i],
           wantMembers[i]);
  EXPECT(m && hostMapLeader(m, 2) == 3, "singleton host leader");
  free(m);
  free(info);
  const uint64_t one[] = {5, 5, 5, 5};
  checkMap("one host", one, 4);
  const uint64_t each[] = {4, 3, 2, 1};
  checkMap("one rank per host", each, 4);
  const uint64_t single[] = {42};
  checkMap("single rank", single, 1);
}

static void randomLayouts(void) {
  unsigned seed = 12345;
  for (int trial = 0; trial < 20; trial++) {
    int n = 1 + (int)(rand_r(&seed) % 500), hosts = 1 + (int)(rand_r(&seed) % 40);
    uint64_t* h = malloc(sizeof(*h) * (size_t)n);
    for (int r = 0; r < n; r++) h[r] = 0x9e3779b97f4a7c15ull * (uint64_t)(rand_r(&seed) % hosts);
    char name[64];
    snprintf(name, sizeof(name), "random %d ranks / %d hashes", n, hosts);
    checkMap(name, h, n);
    free(h);
  }
}

static struct ncclxComm* fakeComm(int nranks, int nhosts, int perHostMax) {
  struct ncclxComm* c = calloc(1, sizeof(*c));
  c->nranks = nranks, c->nhosts = nhosts, c->ranksPerHostMax = perHostMax;
  return c;
}

static double cost(const struct ncclxComm* c, ncclxCollType_t coll, double bytes) {
  /* Shared memory 1 us and 10 GB/s, network 20 us and 1 GB/s, reduction 5 GB/s. */
  return collHierModelCost(c, coll, bytes, 1.0, 1e-4, 20.0, 1e-3, 2e-4);
}

static void costModel(void) {
  struct ncclxComm* c = fakeComm(8, 2, 4);
  ncclxCollType_t with[] = {NCCLX_COLL_ALLREDUCE, NCCLX_COLL_BROADCAST, NCCLX_COLL_REDUCE,
                            NCCLX_COLL_ALLGATHER, NCCLX_COLL_ALLTOALL};
  for (size_t i = 0; i < sizeof(with) / sizeof(with[0]); i++) {
    double small = cost(c, with[i], 1024), large = cost(c, with[i], 16 << 20);
    EXPECT(small > 0 && large > small, "%s: cost %.1f us at 1 KiB, %.1f us at 16 MiB",
           ncclxCollName(with[i]), small, large);
    EXPECT(collAlgoSupportedOn(c, with[i], NCCLX_ALGO_HIERARCHICAL), "%s offered on 2x4",
           ncclxCollName(with[i]));
  }
  EXPECT(cost(c, NCCLX_COLL_REDUCESCATTER, 1024) < 0, "no hierarchical reducescatter");
  EXPECT(cost(c, NCCLX_COLL_ALLTOALLV, 1024) < 0, "no hierarchical alltoallv");
  EXPECT(cost(c, NCCLX_COLL_ALLREDUCE, -1) < 0, "negative size");
  EXPECT(!collAlgoSupportedOn(c, NCCLX_COLL_REDUCESCATTER, NCCLX_ALGO_HIERARCHICAL),
         "reducescatter not offered");
  EXPECT(collAlgoSupportedOn(c, NCCLX_COLL_ALLREDUCE, NCCLX_ALGO_RING), "ring still offered");
  /* Large allreduce: the leaders' ring moves 2(H-1)/H of the data over the network, the tree
   * 2 log2(H) times all of it; with 4 hosts the ring variant must be the cheaper model. */
  struct ncclxComm* four = fakeComm(8, 4, 2);
  double at = (double)HIER_RING_MIN_BYTES;
  double justBelow = cost(four, NCCLX_COLL_ALLREDUCE, at - 1), atRing = cost(four, NCCLX_COLL_ALLREDUCE, at);
  EXPECT(atRing < justBelow, "ring variant %.1f us should beat the tree %.1f us at %.0f bytes",
         atRing, justBelow, at);
  free(four);
  free(c);
  /* Not useful, not offered: one host, or one rank per host. */
  struct ncclxComm* oneHost = fakeComm(4, 1, 4);
  struct ncclxComm* flat = fakeComm(4, 4, 1);
  EXPECT(cost(oneHost, NCCLX_COLL_ALLREDUCE, 1024) < 0, "one host");
  EXPECT(cost(flat, NCCLX_COLL_ALLREDUCE, 1024) < 0, "one rank per host");
  EXPECT(!collAlgoSupportedOn(oneHost, NCCLX_COLL_ALLREDUCE, NCCLX_ALGO_HIERARCHICAL),
         "one host: not offered");
  EXPECT(!collAlgoSupportedOn(flat, NCCLX_COLL_ALLREDUCE, NCCLX_ALGO_HIERARCHICAL),
         "one rank per host: not offered");
  free(oneHost);
  free(flat);
  /* All-to-all windows: the leader's staging fits the budget; never 0. */
  size_t w = alltoallHierWindow(512 * 1024, 8, 4);
  EXPECT(w == HIER_A2A_STAGING_CHUNKS * 512 * 1024 / (3 * 4 * 8 + 8), "window %zu", w);
  EXPECT(alltoallHierWindow(4096, 100000, 1000) == 1, "tiny budget still moves a byte");
  EXPECT(alltoallHierWindow(0, 8, 4) > 0, "default chunk");
  /* More windows (smaller chunks) cost more for the same call. */
  struct ncclxComm* a2a = fakeComm(8, 2, 4);
  a2a->chunkBytes = 1 << 20;
  double few = cost(a2a, NCCLX_COLL_ALLTOALL, 64 << 20);
  a2a->chunkBytes = 4096;
  double many = cost(a2a, NCCLX_COLL_ALLTOALL, 64 << 20);
  EXPECT(many > few, "alltoall with 4 KiB chunks %.1f us, with 1 MiB %.1f us", many, few);
  free(a2a);
}

int main(void) {
  handMade();
  randomLayouts();
  costModel();
  if (failures) {
    fprintf(stderr, "hier_map_test: %d failure(s)\n", failures);
    return 1;
  }
  printf("hier_map_test: PASS\n");
  return 0;
}
