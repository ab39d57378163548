/* Multi-root init (ncclxCommInitRankScalable) with forked ranks on loopback:
 *
 *   init_scalable matrix      1, 2, 7 and 16 ranks x 1, 2, 3 and 4 ids (ids <= ranks): every
 *                             rank gets a communicator of the right shape whose allreduce
 *                             gives the exact sum, and a second comm from fresh ids works too
 *   init_scalable bad-args    nIds < 1, nIds > nranks, NULL ids, a corrupted id, NULL comm:
 *                             InvalidArgument with a message naming what was wrong
 *   init_scalable missing     7 ranks, 3 ids (roots 0, 3, 5), rank 4 never starts: every other
 *                             rank fails within 1-12 s (timeout_s = 3) naming rank 4
 *   init_scalable root-missing  the same with rank 3, the root of id 1, missing: every other
 *                             rank fails in time naming rank 3
 *   init_scalable root-missing-4  8 ranks, 4 ids (roots 0, 2, 4, 6), rank 2 missing: some roots
 *                             only see a timeout in the roots' exchange, so this checks that
 *                             every rank fails in time with a message, not the naming
 *
 * The parent makes every id before forking, so each id's root inherits its listener. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mp_fork.h"
#include "mp_util.h"

#define MAX_IDS 4

static ncclxUniqueId ids[MAX_IDS];
static int nIds;
static int missingRank = -1;
static int mustName = 1; /* the error must name the missing rank */

static int fails;
#define CHECK(rank, cond, ...)                                            \
  do {                                                                    \
    if (!(cond)) {                                                        \
      fprintf(stderr, "rank %d: FAIL %s:%d: ", rank, __FILE__, __LINE__); \
      fprintf(stderr, __VA_ARGS__);                                       \
      fprintf(stderr, "\n");                                              \
      fails++;                                                            \
    }                                                                     \
  } while (0)

/* Allreduce of 3 doubles per rank: {rank, 1, seed * (rank + 1)}, checked exactly. */
static void checkComm(int rank, int nranks, ncclxComm_t comm, double seed) {
  int n = -1, me = -1;
  MP_CALL(rank, comm, ncclxCommCount(comm, &n));
  MP_CALL(rank, comm, ncclxCommUserRank(comm, &me));
  CHECK(rank, n == nranks && me == rank, "comm is rank %d of %d, want %d of %d", me, n, rank, nranks);
  double in[3] = {rank, 1, seed * (rank + 1)}, out[3] = {-1, -1, -1};
  MP_CALL(rank, comm, ncclxAllReduce(in, out, 3, ncclxFloat64, ncclxSum, comm, NULL));
  double want[3] = {nranks * (nranks - 1) / 2.0, nranks, seed * nranks * (nranks + 1) / 2.0};
  for (int i = 0; i < 3; i++)
    CHECK(rank, out[i] == want[i], "allreduce element %d = %g, want %g (%d ranks, %d ids)", i, out[i], want[i],
          nranks, nIds);
}

static int matrixRank(int rank, int nranks, ncclxUniqueId id, void* arg) {
  (void)id;
  const ncclxUniqueId* second = arg; /* a second set of ids for a second communicator */
  ncclxComm_t a = NULL, b = NULL;
  ncclxConfig_t cfg = NCCLX_CONFIG_INITIALIZER;
  cfg.commName = "scalable";
  MP_CALL(rank, NULL, ncclxCommInitRankScalable(&a, nranks, rank, nIds, ids, &cfg));
  checkComm(rank, nranks, a, 3.0);
  MP_CALL(rank, NULL, ncclxCommInitRankScalable(&b, nranks, rank, nIds, second, NULL));
  checkComm(rank, nranks, b, 5.0);
  checkComm(rank, nranks, a, 7.0); /* the two never mix */
  ncclxCommDestroy(b);
  ncclxCommDestroy(a);
  return fails ? 1 : 0;
}

static int runJob(int nranks, int k, mpRankFn fn, const int* skip) {
  static ncclxUniqueId second[MAX_IDS];
  nIds = k;
  for (int i = 0; i < k; i++) {
    MP_CALL(-1, NULL, ncclxGetUniqueId(&ids[i]));
    MP_CALL(-1, NULL, ncclxGetUniqueId(&second[i]));
  }
  double t0 = mpNow();
  mpJob job;
  mpJobInit(&job, nranks);
  int started[MP_MAX_RANKS], n = 0;
  for (int r = 0; r < nranks; r++) {
    if (skip && *skip == r) continue;
    mpJobSpawn(&job, r, fn, ids[0], second);
    started[n++] = r;
  }
  mpJobWait(&job, started, n, t0 + 40.0);
  int bad = 0;
  char d[96];
  for (int i = 0; i < n; i++) {
    int ok = mpExitedZero(&job, started[i]);
    if (!ok) printf("  rank %d: %s\n", started[i], mpDescribeStatus(&job, started[i], d, sizeof d));
    bad += !ok;
  }
  if (mpJobKillRest(&job)) printf("  FAIL: ranks still running after 40 s were killed\n");
  printf("%d ranks, %d id%s: %.2f s %s\n", nranks, k, k == 1 ? "" : "s", mpNow() - t0, bad ? "FAIL" : "ok");
  return bad;
}

static int missingRankMain(int rank, int nranks, ncclxUniqueId id, void* arg) {
  (void)id;
  (void)arg;
  ncclxComm_t comm = NULL;
  double t0 = mpNow();
  ncclxResult_t res = ncclxCommInitRankScalable(&comm, nranks, rank, nIds, ids, NULL);
  double dt = mpNow() - t0;
  const char* msg = ncclxGetLastError(NULL);
  printf("  rank %d: %s after %.2f s: \"%s\"\n", rank, ncclxGetErrorString(res), dt, msg);
  if (res == ncclxSuccess) {
    ncclxCommAbort(comm);
    CHECK(rank, 0, "init succeeded with rank %d missing", missingRank);
    return 1;
  }
  char want[32];
  snprintf(want, sizeof(want), "rank %d", missingRank);
  CHECK(rank, res != ncclxInvalidArgument, "valid arguments reported as invalid");
  CHECK(rank, !mustName || mpContainsCI(msg, want), "the error does not name the missing rank (\"%s\")", want);
  CHECK(rank, msg && *msg, "empty ncclxGetLastError(NULL)");
  CHECK(rank, dt >= 1.0 && dt <= 12.0, "failed after %.2f s, expected 1-12 s with timeout_s=3", dt);
  return fails ? 1 : 0;
}

static int badArgs(void) {
  ncclxUniqueId good[2], corrupt;
  MP_CALL(-1, NULL, ncclxGetUniqueId(&good[0]));
  MP_CALL(-1, NULL, ncclxGetUniqueId(&good[1]));
  memset(&corrupt, 0x5a, sizeof(corrupt));
  ncclxUniqueId mixed[2] = {good[0], corrupt};
  struct {
    int nranks, rank, nIds;
    const ncclxUniqueId* ids;
    int nullComm;
    const char* want; /* in the message */
  } cases[] = {
      {4, 0, 0, good, 0, "nIds 0"},   {4, 1, -3, good, 0, "nIds -3"},     {2, 0, 3, good, 0, "nIds 3"},
      {4, 0, 2, NULL, 0, "NULL"},     {4, 0, 2, mixed, 0, "unique id 1"}, {4, 0, 2, good, 1, "comm pointer"},
      {4, 4, 2, good, 0, "rank 4"},   {0, 0, 1, good, 0, "nranks 0"},
  };
  int bad = 0;
  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
    ncclxComm_t comm = (ncclxComm_t)&comm; /* must be cleared */
    ncclxResult_t res = ncclxCommInitRankScalable(cases[i].nullComm ? NULL : &comm, cases[i].nranks, cases[i].rank,
                                                  cases[i].nIds, cases[i].ids, NULL);
    const char* msg = ncclxGetLastError(NULL);
    int ok = res == ncclxInvalidArgument && mpContainsCI(msg, cases[i].want) && (cases[i].nullComm || comm == NULL);
    printf("case %zu: %s \"%s\" %s\n", i, ncclxGetErrorString(res), msg, ok ? "ok" : "FAIL");
    if (!ok) printf("  FAIL: want InvalidArgument mentioning \"%s\"\n", cases[i].want);
    bad += !ok;
  }
  return bad;
}

int main(int argc, char** argv) {
  const char* sc = argc > 1 ? argv[1] : "";
  setvbuf(stdout, NULL, _IOLBF, 0);
  double t0 = mpNow();
  int bad = 0;
  if (!strcmp(sc, "matrix")) {
    setenv("NCCLX_CORE_TIMEOUT_S", "30", 0);
    static const int sizes[] = {1, 2, 7, 16};
    for (int s = 0; s < 4; s++)
      for (int k = 1; k <= MAX_IDS && k <= sizes[s]; k++) bad += runJob(sizes[s], k, matrixRank, NULL);
  } else if (!strcmp(sc, "bad-args")) {
    bad = badArgs();
  } else if (!strcmp(sc, "missing") || !strcmp(sc, "root-missing")) {
    setenv("NCCLX_CORE_TIMEOUT_S", "3", 1); /* before any ncclx call: children inherit it */
    missingRank = !strcmp(sc, "missing") ? 4 : 3;
    bad = runJob(7, 3, missingRankMain, &missingRank);
  } else if (!strcmp(sc, "root-missing-4")) {
    setenv("NCCLX_CORE_TIMEOUT_S", "3", 1);
    missingRank = 2;
    mustName = 0;
    bad = runJob(8, 4, missingRankMain, &missingRank);
  } else {
    fprintf(stderr, "usage: %s matrix|bad-args|missing|root-missing|root-missing-4\n", argv[0]);
    return 2;
  }
  printf("init_scalable %s: %.1f s: %s\n", sc, mpNow() - t0, bad ? "FAIL" : "PASS");
  return bad ? 1 : 0;
}
