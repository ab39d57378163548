/* Lazy connections under concurrent first use (white box: links the core's internal archive).
 *
 * 5 forked ranks init with lazy_connect. On every rank, 4 threads then ask for connections at
 * the same moment (peersEnsure, the entry every op uses), with overlapping peer sets in
 * different orders. Afterwards each peer must be connected exactly once per direction (the
 * comm's counters: one connect per peer, no refused duplicate hellos), and collectives over
 * the connections must be right.
 * A second communicator split from the first then makes its first connections from two
 * threads running different ops (allreduce on one comm, alltoall on another) at once. */
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

#define NRANKS 5
#define NTHREADS 4

struct ensureArg {
  struct ncclxComm* comm;
  int order; /* thread number: picks the peer order */
  ncclxResult_t res;
};

static pthread_barrier_t startLine;

static void* ensureMain(void* p) {
  struct ensureArg* a = p;
  int n = a->comm->nranks, peers[NRANKS], k = 0;
  for (int i = 0; i < n; i++) {
    int q = a->order % 2 ? n - 1 - i : (i + a->order) % n; /* overlapping, different orders */
    if (a->order == 3 && i % 2) continue;                  /* and one thread asks for a subset */
    peers[k++] = q;
  }
  pthread_barrier_wait(&startLine);
  a->res = peersEnsure(a->comm, peers, k, peers, k);
  return NULL;
}

struct opArg {
  ncclxComm_t comm;
  int rank, alltoall;
  int bad;
};

static void* opMain(void* p) {
  struct opArg* a = p;
  int n = 0;
  ncclxCommCount(a->comm, &n);
  pthread_barrier_wait(&startLine);
  for (int it = 0; it < 10; it++) {
    if (a->alltoall) {
      int send[NRANKS], recv[NRANKS];
      for (int i = 0; i < n; i++) send[i] = 1000 * a->rank + 10 * i + it;
      if (ncclxAllToAll(send, recv, 1, ncclxInt32, a->comm, NULL) != ncclxSuccess) {
        a->bad++;
        break;
      }
      for (int i = 0; i < n; i++) a->bad += recv[i] != 1000 * i + 10 * a->rank + it;
    } else {
      double v = a->rank + it, out = 0;
      if (ncclxAllReduce(&v, &out, 1, ncclxFloat64, ncclxSum, a->comm, NULL) != ncclxSuccess) {
        a->bad++;
        break;
      }
      a->bad += out != n * (n - 1) / 2.0 + n * it;
    }
  }
  return NULL;
}

static int countConns(struct ncclxComm* c, int* missingSend, int* missingRecv) {
  int n = 0;
  *missingSend = *missingRecv = 0;
  for (int p = 0; p < c->nranks; p++) {
    if (p == c->rank) continue;
    *missingSend += c->conns[p].sendComm == NULL;
    *missingRecv += c->conns[p].recvComm == NULL;
  }
  n = peersOpenCount(c);
  return n;
}

static int rankMain(int rank, ncclxUniqueId id) {
  int bad = 0;
  ncclxConfig_t cfg = NCCLX_CONFIG_INITIALIZER;
  cfg.lazyConnect = 1;
  cfg.timeoutSec = 30;
  ncclxComm_t world = NULL;
  if (ncclxCommInitRankConfig(&world, NRANKS, id, rank, &cfg) != ncclxSuccess) {
    fprintf(stderr, "rank %d: init failed: %s\n", rank, ncclxGetLastError(NULL));
    return 1;
  }
  struct ncclxComm* c = world;
  if (peersOpenCount(c) != 0) {
    fprintf(stderr, "rank %d: FAIL: %d connections right after a lazy init\n", rank, peersOpenCount(c));
    bad++;
  }
  pthread_barrier_init(&startLine, NULL, NTHREADS);
  struct ensureArg args[NTHREADS];
  pthread_t th[NTHREADS];
  for (int t = 0; t < NTHREADS; t++) {
    args[t] = (struct ensureArg){c, t, ncclxSuccess};
    pthread_create(&th[t], NULL, ensureMain, &args[t]);
  }
  for (int t = 0; t < NTHREADS; t++) {
    pthread_join(th[t], NULL);
    if (args[t].res != ncclxSuccess) {
      fprintf(stderr, "rank %d: FAIL: thread %d peersEnsure: %s\n", rank, t, ncclxGetLastError(NULL));
      bad++;
    }
  }
  pthread_barrier_destroy(&startLine);
  int missingSend, missingRecv, open = countConns(c, &missingSend, &missingRecv);
  if (open != 2 * (NRANKS - 1) || missingSend || missingRecv) {
    fprintf(stderr, "rank %d: FAIL: %d connection ends open (want %d), %d sends and %d receives missing\n", rank,
            open, 2 * (NRANKS - 1), missingSend, missingRecv);
    bad++;
  }
  if (c->connectsMade != NRANKS - 1 || c->acceptsRefused != 0) {
    fprintf(stderr, "rank %d: FAIL: %d connects made (want %d, one per peer), %d hellos refused (want 0)\n", rank,
            c->connectsMade, NRANKS - 1, c->acceptsRefused);
    bad++;
  }
  double v = rank, out = -1;
  if (ncclxAllReduce(&v, &out, 1, ncclxFloat64, ncclxSum, world, NULL) != ncclxSuccess ||
      out != NRANKS * (NRANKS - 1) / 2.0) {
    fprintf(stderr, "rank %d: FAIL: allreduce over the concurrently made connections gave %g\n", rank, out);
    bad++;
  }
  if (peersOpenCount(c) != open) {
    fprintf(stderr, "rank %d: FAIL: the allreduce opened more connections (%d -> %d)\n", rank, open,
            peersOpenCount(c));
    bad++;
  }

  /* Two fresh comms (same members), first used by different ops from two threads at once. */
  ncclxComm_t s1 = NULL, s2 = NULL;
  if (ncclxCommSplit(world, 0, rank, &s1, &cfg) != ncclxSuccess ||
      ncclxCommSplit(world, 0, NRANKS - rank, &s2, &cfg) != ncclxSuccess) {
    fprintf(stderr, "rank %d: FAIL: split: %s\n", rank, ncclxGetLastError(NULL));
    return 1;
  }
  int r2 = -1;
  ncclxCommUserRank(s2, &r2);
  pthread_barrier_init(&startLine, NULL, 2);
  struct opArg oa[2] = {{s1, rank, 0, 0}, {s2, r2, 1, 0}};
  for (int t = 0; t < 2; t++) pthread_create(&th[t], NULL, opMain, &oa[t]);
  for (int t = 0; t < 2; t++) pthread_join(th[t], NULL);
  pthread_barrier_destroy(&startLine);
  if (oa[0].bad || oa[1].bad) {
    fprintf(stderr, "rank %d: FAIL: concurrent first ops: %d allreduce and %d alltoall errors\n", rank, oa[0].bad,
            oa[1].bad);
    bad++;
  }
  ncclxCommDestroy(s1);
  ncclxCommDestroy(s2);
  ncclxCommDestroy(world);
  return bad ? 1 : 0;
}

int main(void) { return initForkRanks("init_lazy_concurrent", NRANKS, rankMain, 90); }
