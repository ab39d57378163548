/* Split communicators share the parent's transport listeners (white box: links the core's
 * internal archive for the listener counters and peer info).
 *
 * 4 forked ranks. After init every rank has opened one listener set. A color split, a
 * group split (members in reverse order) and a NOCOLOR opt-out must open none: the
 * children publish the parent's handles. Then the parent and a child make their first
 * connections at the same moment from two threads (one listener: each thread files the
 * other communicator's connections for it), results are checked, the parent is destroyed
 * BEFORE the children, and a child that was never used makes all its connections through
 * the listener the dead parent opened (reference counted). The listeners close with the
 * last communicator. */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "comm/comm.h"
#include "init_fork.h"
#include "ncclx.h"
#include "transport/peers.h"

#define NRANKS 4
#define ITERS 10
#define COUNT 8192 /* 64 KB: above the shared-memory LL protocol's limit, so transports carry it */

static pthread_barrier_t startLine;

struct opArg {
  ncclxComm_t comm;
  int bad;
};

/* ITERS allreduces of rank + it + element index, checked. */
static int allreduces(ncclxComm_t comm) {
  int n = 0, r = 0, bad = 0;
  ncclxCommCount(comm, &n);
  ncclxCommUserRank(comm, &r);
  double* v = malloc(sizeof(double) * COUNT);
  double* out = malloc(sizeof(double) * COUNT);
  if (!v || !out) bad++;
  for (int it = 0; it < ITERS && !bad; it++) {
    for (int i = 0; i < COUNT; i++) v[i] = r + it + i, out[i] = -1;
    if (ncclxAllReduce(v, out, COUNT, ncclxFloat64, ncclxSum, comm, NULL) != ncclxSuccess) {
      fprintf(stderr, "allreduce failed: %s\n", ncclxGetLastError(comm));
      bad++;
      break;
    }
    for (int i = 0; i < COUNT; i++) bad += out[i] != n * (n - 1) / 2.0 + (double)n * (it + i);
  }
  free(v);
  free(out);
  return bad;
}

static void* opMain(void* p) {
  struct opArg* a = p;
  pthread_barrier_wait(&startLine);
  a->bad = allreduces(a->comm);
  return NULL;
}

static int sameHandles(struct ncclxComm* a, struct ncclxComm* b) {
  const struct ncclxPeerInfo *x = &a->peerInfo[a->rank], *y = &b->peerInfo[b->rank];
  return !memcmp(x->netHandle, y->netHandle, sizeof(x->netHandle)) &&
         !memcmp(x->shmHandle, y->shmHandle, sizeof(x->shmHandle));
}

static int rankMain(int rank, ncclxUniqueId id) {
  int bad = 0;
  ncclxConfig_t cfg = NCCLX_CONFIG_INITIALIZER;
  cfg.lazyConnect = 1;
  cfg.timeoutSec = 30;
  ncclxComm_t world = NULL, half = NULL, rev = NULL, none = NULL;
  if (ncclxCommInitRankConfig(&world, NRANKS, id, rank, &cfg) != ncclxSuccess) {
    fprintf(stderr, "rank %d: init failed: %s\n", rank, ncclxGetLastError(NULL));
    return 1;
  }
  if (peersListenersOpened() != 1 || peersListenersLive() != 1) {
    fprintf(stderr, "rank %d: FAIL: %d listener sets opened, %d open after init (want 1, 1)\n", rank,
            peersListenersOpened(), peersListenersLive());
    bad++;
  }
  int members[NRANKS];
  for (int i = 0; i < NRANKS; i++) members[i] = NRANKS - 1 - i;
  if (ncclxCommSplit(world, rank % 2, rank, &half, &cfg) != ncclxSuccess ||
      ncclxCommSplitGroup(world, members, NRANKS, &rev, &cfg) != ncclxSuccess ||
      ncclxCommSplit(world, NCCLX_SPLIT_NOCOLOR, 0, &none, &cfg) != ncclxSuccess || none != NULL) {
    fprintf(stderr, "rank %d: FAIL: splits: %s\n", rank, ncclxGetLastError(NULL));
    return 1;
  }
  if (peersListenersOpened() != 1 || peersListenersLive() != 1) {
    fprintf(stderr, "rank %d: FAIL: the splits opened listeners: %d opened, %d open (want 1, 1)\n", rank,
            peersListenersOpened(), peersListenersLive());
    bad++;
  }
  if (!sameHandles(world, half) || !sameHandles(world, rev)) {
    fprintf(stderr, "rank %d: FAIL: a child publishes other handles than its parent\n", rank);
    bad++;
  }

  /* First connections of the parent and of a child at once: one listener, two communicators. */
  pthread_barrier_init(&startLine, NULL, 2);
  struct opArg oa[2] = {{world, 0}, {half, 0}};
  pthread_t th[2];
  for (int t = 0; t < 2; t++) pthread_create(&th[t], NULL, opMain, &oa[t]);
  for (int t = 0; t < 2; t++) pthread_join(th[t], NULL);
  pthread_barrier_destroy(&startLine);
  struct ncclxComm *w = world, *h = half;
  if (oa[0].bad || oa[1].bad || w->acceptsRefused || h->acceptsRefused) {
    fprintf(stderr, "rank %d: FAIL: concurrent first use: %d parent and %d child errors, %d + %d hellos refused\n",
            rank, oa[0].bad, oa[1].bad, w->acceptsRefused, h->acceptsRefused);
    bad++;
  }

  /* The parent goes first; the children keep its listeners alive. */
  ncclxCommDestroy(world);
  if (peersListenersLive() != 1) {
    fprintf(stderr, "rank %d: FAIL: %d listener sets open after the parent's destroy (want 1)\n", rank,
            peersListenersLive());
    bad++;
  }
  struct ncclxComm* rc = rev;
  if (peersOpenCount(rc) != 0) {
    fprintf(stderr, "rank %d: FAIL: the unused child has %d connections\n", rank, peersOpenCount(rc));
    bad++;
  }
  int e = allreduces(rev) + allreduces(half);
  if (e || rc->acceptsRefused || peersOpenCount(rc) == 0) {
    fprintf(stderr, "rank %d: FAIL: children after the parent's destroy: %d errors, %d refused, %d connections\n",
            rank, e, rc->acceptsRefused, peersOpenCount(rc));
    bad++;
  }
  ncclxCommDestroy(half);
  if (peersListenersLive() != 1) {
    fprintf(stderr, "rank %d: FAIL: listeners closed while a child still uses them\n", rank);
    bad++;
  }
  ncclxCommDestroy(rev);
  if (peersListenersLive() != 0 || peersListenersOpened() != 1) {
    fprintf(stderr, "rank %d: FAIL: after the last destroy %d listener sets open, %d ever opened (want 0, 1)\n", rank,
            peersListenersLive(), peersListenersOpened());
    bad++;
  }
  return bad ? 1 : 0;
}

int main(void) { return initForkRanks("init_split_share", NRANKS, rankMain, 90); }
