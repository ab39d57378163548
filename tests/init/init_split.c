/* Splits, through the public API, with 6 forked ranks (lazy connections, the default):
 *
 *   1. every rank in its own color: 1-rank communicators that work;
 *   2. all ranks in one color with reversed keys: numbering follows the key;
 *   3. odd ranks opt out with NCCLX_SPLIT_NOCOLOR: they get NULL, the others a working comm;
 *   4. ncclxCommSplitGroup with non-contiguous, unordered members {5,1,3}: only they call it,
 *      member i becomes rank i; the others go straight on to an allreduce on the parent
 *      (which would hang if the group split needed them);
 *   5. two disjoint groups at once, one of them split twice with the same list: the two
 *      same-member children never mix traffic;
 *   6. concurrent first use: the two same-member children, never used yet, run collectives
 *      and point-to-point from two threads at the same time (lazy connects in parallel);
 *   7. bad member lists are refused with InvalidArgument and a message.
 * Every result is checked against values computed independently on each rank. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mp_fork.h"
#include "mp_util.h"

#define NRANKS 6

static int fails;
#define CHECK(rank, cond, ...)                                  \
  do {                                                          \
    if (!(cond)) {                                              \
      fprintf(stderr, "rank %d: FAIL %s:%d: ", rank, __FILE__, __LINE__); \
      fprintf(stderr, __VA_ARGS__);                             \
      fprintf(stderr, "\n");                                    \
      fails++;                                                  \
    }                                                           \
  } while (0)

static double allreduceSum(int rank, ncclxComm_t comm, double v) {
  double out = -1;
  MP_CALL(rank, comm, ncclxAllReduce(&v, &out, 1, ncclxFloat64, ncclxSum, comm, NULL));
  return out;
}

static void checkShape(int rank, ncclxComm_t c, int wantN, int wantRank, const char* what) {
  int n = -1, r = -1;
  MP_CALL(rank, c, ncclxCommCount(c, &n));
  MP_CALL(rank, c, ncclxCommUserRank(c, &r));
  CHECK(rank, n == wantN && r == wantRank, "%s: size %d rank %d, want size %d rank %d", what, n, r, wantN, wantRank);
}

struct worker {
  int rank; /* parent rank, for messages */
  ncclxComm_t comm;
  int base, iters, p2p;
  int bad;
};

/* Collectives (and a ring of send/recv) on one comm, each with values unique to this comm. */
static void* workerMain(void* arg) {
  struct worker* w = arg;
  int n = 0, me = 0;
  ncclxCommCount(w->comm, &n);
  ncclxCommUserRank(w->comm, &me);
  for (int it = 0; it < w->iters; it++) {
    double v = w->base + 100.0 * it + me, out = -1;
    if (ncclxAllReduce(&v, &out, 1, ncclxFloat64, ncclxSum, w->comm, NULL) != ncclxSuccess) {
      fprintf(stderr, "rank %d: allreduce failed: %s\n", w->rank, ncclxGetLastError(w->comm));
      w->bad++;
      break;
    }
    double want = n * (w->base + 100.0 * it) + n * (n - 1) / 2.0;
    if (out != want) {
      fprintf(stderr, "rank %d: FAIL comm base %d iter %d: sum %g want %g\n", w->rank, w->base, it, out, want);
      w->bad++;
    }
    if (!w->p2p || n < 2) continue;
    int to = (me + 1) % n, from = (me + n - 1) % n;
    double sendv = w->base * 7.0 + me + it, recvv = -1;
    ncclxResult_t res = ncclxGroupStart();
    if (res == ncclxSuccess) res = ncclxSend(&sendv, 1, ncclxFloat64, to, w->comm, NULL);
    if (res == ncclxSuccess) res = ncclxRecv(&recvv, 1, ncclxFloat64, from, w->comm, NULL);
    ncclxResult_t end = ncclxGroupEnd();
    if (res != ncclxSuccess || end != ncclxSuccess || recvv != w->base * 7.0 + from + it) {
      fprintf(stderr, "rank %d: FAIL p2p on comm base %d iter %d: got %g want %g (%s)\n", w->rank, w->base, it, recvv,
              w->base * 7.0 + from + it, ncclxGetLastError(w->comm));
      w->bad++;
    }
  }
  return NULL;
}

static int rankMain(int rank, int nranks, ncclxUniqueId id, void* arg) {
  (void)arg;
  ncclxComm_t world = NULL, c = NULL;
  MP_CALL(rank, NULL, ncclxCommInitRank(&world, nranks, id, rank));

  /* 1. every rank its own color */
  MP_CALL(rank, world, ncclxCommSplit(world, rank, 0, &c, NULL));
  CHECK(rank, c != NULL, "own color: no communicator");
  if (c) {
    checkShape(rank, c, 1, 0, "own color");
    CHECK(rank, allreduceSum(rank, c, rank + 0.5) == rank + 0.5, "own color: allreduce of one rank");
    ncclxCommDestroy(c);
  }

  /* 2. all in one, keys reversed */
  MP_CALL(rank, world, ncclxCommSplit(world, 3, nranks - 1 - rank, &c, NULL));
  checkShape(rank, c, nranks, nranks - 1 - rank, "all in one");
  CHECK(rank, allreduceSum(rank, c, rank) == nranks * (nranks - 1) / 2.0, "all in one: allreduce");
  ncclxCommDestroy(c);

  /* 3. odd ranks opt out */
  c = (ncclxComm_t)&c; /* must be overwritten with NULL */
  MP_CALL(rank, world, ncclxCommSplit(world, rank % 2 ? NCCLX_SPLIT_NOCOLOR : 7, rank, &c, NULL));
  if (rank % 2) {
    CHECK(rank, c == NULL, "NOCOLOR: got a communicator");
  } else {
    checkShape(rank, c, (nranks + 1) / 2, rank / 2, "even ranks");
    CHECK(rank, allreduceSum(rank, c, rank) == 0 + 2 + 4, "even ranks: allreduce");
    ncclxCommDestroy(c);
  }

  /* 4. group fast path, members {5,1,3}; the others never call */
  static const int group[3] = {5, 1, 3};
  int gi = -1;
  for (int i = 0; i < 3; i++)
    if (group[i] == rank) gi = i;
  if (gi >= 0) {
    MP_CALL(rank, world, ncclxCommSplitGroup(world, group, 3, &c, NULL));
    checkShape(rank, c, 3, gi, "group {5,1,3}");
    CHECK(rank, allreduceSum(rank, c, rank) == 9, "group: allreduce");
    double b = gi == 0 ? 42.0 : -1, out = -1;
    MP_CALL(rank, c, ncclxBroadcast(&b, &out, 1, ncclxFloat64, 0, c, NULL));
    CHECK(rank, out == 42.0, "group: broadcast from member 0 (parent rank 5) gave %g", out);
    ncclxCommDestroy(c);
  }
  CHECK(rank, allreduceSum(rank, world, 1) == nranks, "parent after the group split");

  /* 5. two disjoint groups at once; the even group splits twice with the same list */
  static const int evens[3] = {0, 2, 4}, odds[3] = {1, 3, 5};
  const int* mine = rank % 2 ? odds : evens;
  ncclxComm_t a = NULL, b = NULL;
  MP_CALL(rank, world, ncclxCommSplitGroup(world, mine, 3, &a, NULL));
  MP_CALL(rank, world, ncclxCommSplitGroup(world, mine, 3, &b, NULL));
  checkShape(rank, a, 3, rank / 2, "disjoint group, first");
  checkShape(rank, b, 3, rank / 2, "disjoint group, second");
  /* b first, then a: each must see only its own values */
  CHECK(rank, allreduceSum(rank, b, 1000 + rank) == 3000 + (rank % 2 ? 9 : 6), "second same-member child");

  /* 6. concurrent first use of a (never used) and c2 (a third child, never used) from two threads */
  ncclxComm_t c2 = NULL;
  MP_CALL(rank, world, ncclxCommSplitGroup(world, mine, 3, &c2, NULL));
  struct worker w[2] = {{rank, a, 10, 20, 1, 0}, {rank, c2, 20000, 20, 1, 0}};
  pthread_t th[2];
  for (int i = 0; i < 2; i++) pthread_create(&th[i], NULL, workerMain, &w[i]);
  for (int i = 0; i < 2; i++) pthread_join(th[i], NULL);
  fails += w[0].bad + w[1].bad;
  ncclxCommDestroy(a);
  ncclxCommDestroy(b);
  ncclxCommDestroy(c2);

  /* 7. refused lists */
  int notMe[2] = {(rank + 1) % nranks, (rank + 2) % nranks}, dup[3] = {rank, rank, (rank + 1) % nranks};
  int outOfRange[2] = {rank, nranks};
  c = NULL;
  CHECK(rank, ncclxCommSplitGroup(world, notMe, 2, &c, NULL) == ncclxInvalidArgument && c == NULL,
        "a list without the caller was accepted");
  CHECK(rank, mpContainsCI(ncclxGetLastError(NULL), "not in the member list"), "message: %s",
        ncclxGetLastError(NULL));
  CHECK(rank, ncclxCommSplitGroup(world, dup, 3, &c, NULL) == ncclxInvalidArgument, "duplicate accepted");
  CHECK(rank, ncclxCommSplitGroup(world, outOfRange, 2, &c, NULL) == ncclxInvalidArgument, "rank %d accepted",
        nranks);
  CHECK(rank, ncclxCommSplitGroup(world, NULL, 2, &c, NULL) == ncclxInvalidArgument, "NULL list accepted");

  CHECK(rank, allreduceSum(rank, world, 2) == 2 * nranks, "parent at the end");
  ncclxCommDestroy(world);
  if (fails) fprintf(stderr, "rank %d: %d failures\n", rank, fails);
  return fails ? 1 : 0;
}

int main(void) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  setenv("NCCLX_CORE_TIMEOUT_S", "30", 0);
  double t0 = mpNow();
  ncclxUniqueId id;
  MP_CALL(-1, NULL, ncclxGetUniqueId(&id));
  mpJob job;
  mpJobInit(&job, NRANKS);
  int all[NRANKS];
  for (int r = 0; r < NRANKS; r++) {
    mpJobSpawn(&job, r, rankMain, id, NULL);
    all[r] = r;
  }
  mpJobWait(&job, all, NRANKS, t0 + 100.0);
  int bad = 0;
  char d[96];
  for (int r = 0; r < NRANKS; r++) {
    int ok = mpExitedZero(&job, r);
    if (!ok) printf("rank %d: %s\n", r, mpDescribeStatus(&job, r, d, sizeof d));
    bad += !ok;
  }
  if (mpJobKillRest(&job)) printf("FAIL: ranks still running after 100 s were killed\n");
  printf("init_split: %.1f s: %s\n", mpNow() - t0, bad ? "FAIL" : "PASS");
  return bad ? 1 : 0;
}
