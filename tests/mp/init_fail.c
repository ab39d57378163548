/* Initialization with a missing rank fails in bounded time instead of hanging.
 *
 *   init_fail rank-missing   3 ranks, rank 2 never starts: ranks 0 and 1 fail
 *   init_fail root-missing   3 ranks, rank 0 (the rendezvous root) never starts: 1 and 2 fail
 *
 * [core] timeout_s = 3 (NCCLX_CORE_TIMEOUT_S). Every started rank must get an error from
 * ncclxCommInitRank within 12 s (not before 1 s: it has to wait for the missing rank) with a
 * non-empty ncclxGetLastError(NULL). Ranks are forked children; the parent creates the id. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mp_fork.h"
#include "mp_util.h"

#define NRANKS 3

static int initRank(int rank, int nranks, ncclxUniqueId id, void* arg) {
  (void)arg;
  ncclxComm_t comm = NULL;
  double t0 = mpNow();
  ncclxResult_t res = ncclxCommInitRank(&comm, nranks, id, rank);
  double dt = mpNow() - t0;
  const char* msg = ncclxGetLastError(NULL);
  printf("rank %d: ncclxCommInitRank returned %s after %.2f s: \"%s\"\n", rank, ncclxGetErrorString(res),
         dt, msg);
  int bad = 0;
  if (res == ncclxSuccess) {
    fprintf(stderr, "rank %d: FAIL: init succeeded with a rank missing\n", rank);
    ncclxCommAbort(comm);
    return 1;
  }
  if (res == ncclxInvalidArgument) {
    fprintf(stderr, "rank %d: FAIL: valid arguments reported as invalid\n", rank);
    bad++;
  }
  if (!msg || !*msg) {
    fprintf(stderr, "rank %d: FAIL: empty ncclxGetLastError(NULL)\n", rank);
    bad++;
  }
  if (dt > 12.0 || dt < 1.0) {
    fprintf(stderr, "rank %d: FAIL: failed after %.2f s, expected 1-12 s with timeout_s=3\n", rank, dt);
    bad++;
  }
  return bad ? 1 : 0;
}

int main(int argc, char** argv) {
  const char* sc = argc > 1 ? argv[1] : "";
  int missing;
  if (!strcmp(sc, "rank-missing")) {
    missing = 2;
  } else if (!strcmp(sc, "root-missing")) {
    missing = 0;
  } else {
    fprintf(stderr, "usage: %s rank-missing|root-missing\n", argv[0]);
    return 2;
  }
  setvbuf(stdout, NULL, _IOLBF, 0);
  setenv("NCCLX_CORE_TIMEOUT_S", "3", 1); /* before any ncclx call: children inherit it */
  double t0 = mpNow();
  ncclxUniqueId id;
  MP_CALL(-1, NULL, ncclxGetUniqueId(&id));
  mpJob job;
  mpJobInit(&job, NRANKS);
  int started[NRANKS], n = 0;
  for (int r = 0; r < NRANKS; r++) {
    if (r == missing) continue;
    mpJobSpawn(&job, r, initRank, id, NULL);
    started[n++] = r;
  }
  mpJobWait(&job, started, n, t0 + 30.0);
  int bad = 0;
  char d[96];
  for (int i = 0; i < n; i++) {
    int ok = mpExitedZero(&job, started[i]);
    printf("parent: rank %d %s (%s)\n", started[i], mpDescribeStatus(&job, started[i], d, sizeof d),
           ok ? "ok" : "WRONG");
    bad += !ok;
  }
  if (mpJobKillRest(&job)) printf("parent: FAIL: ranks still running after 30 s were killed\n");
  printf("init_fail %s: %.1f s: %s\n", sc, mpNow() - t0, bad ? "FAIL" : "PASS");
  return bad ? 1 : 0;
}
