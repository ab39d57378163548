/* Initialization with a missing rank fails in bounded time instead of hanging.
 *
 *   init_fail rank-missing   3 ranks, rank 2 never starts: ranks 0 and 1 fail
 *   init_fail root-missing   3 ranks, rank 0 (the rendezvous root) never starts: 1 and 2 fail
 *   init_fail rank-left      rank 2 joins, is killed, and rank 1 joins 1 s later: 0 and 1 fail
 *                            saying rank 2 connected and left (not "never connected")
 *   init_fail wrong-nranks   rank 2 says nranks = 4: every rank fails at once (within 2 s,
 *                            before the 3 s timeout), and every error names both counts
 *
 * [core] timeout_s = 3 (NCCLX_CORE_TIMEOUT_S). Every started rank must get an error from
 * ncclxCommInitRank within 12 s (not before 1 s where it has to wait for a missing rank) with a
 * non-empty ncclxGetLastError(NULL). Ranks are forked children; the parent creates the id. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "mp_fork.h"
#include "mp_util.h"

#define NRANKS 3

static const char* g_expect; /* a word every surviving rank's error must contain, or NULL */
static const char* g_expect2; /* and a second one */
static double g_minSec = 1.0; /* no rank may fail sooner: it has to wait for the missing one */
static double g_maxSec = 12.0;

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
  } else if ((g_expect && !mpContainsCI(msg, g_expect)) || (g_expect2 && !mpContainsCI(msg, g_expect2))) {
    fprintf(stderr, "rank %d: FAIL: the error does not say \"%s\"%s%s\n", rank, g_expect, g_expect2 ? " and " : "",
            g_expect2 ? g_expect2 : "");
    bad++;
  }
  if (dt > g_maxSec || dt < g_minSec) {
    fprintf(stderr, "rank %d: FAIL: failed after %.2f s, expected %.1f-%.1f s with timeout_s=3\n", rank, dt, g_minSec,
            g_maxSec);
    bad++;
  }
  return bad ? 1 : 0;
}

/* A rank that says nranks = 4 where the others say 3: refused at once, naming both. */
static int wrongNranksRank(int rank, int nranks, ncclxUniqueId id, void* arg) {
  (void)nranks, (void)arg;
  ncclxComm_t comm = NULL;
  double t0 = mpNow();
  ncclxResult_t res = ncclxCommInitRank(&comm, NRANKS + 1, id, rank);
  const char* msg = ncclxGetLastError(NULL);
  printf("rank %d (nranks %d): returned %s after %.2f s: \"%s\"\n", rank, NRANKS + 1, ncclxGetErrorString(res),
         mpNow() - t0, msg);
  if (res == ncclxSuccess || !mpContainsCI(msg, "nranks=4") || !mpContainsCI(msg, "nranks=3")) {
    fprintf(stderr, "rank %d: FAIL: expected a refusal naming nranks=4 and nranks=3\n", rank);
    return 1;
  }
  return mpNow() - t0 < 2.0 ? 0 : 1;
}

/* Rank 2 joins and then is killed; rank 1 arrives after that. */
static int runRankLeft(ncclxUniqueId id, double t0) {
  mpJob job;
  mpJobInit(&job, NRANKS);
  mpJobSpawn(&job, 0, initRank, id, NULL);
  mpJobSpawn(&job, 2, initRank, id, NULL);
  usleep(1000000);
  kill(job.pid[2], SIGKILL);
  usleep(1000000); /* the root notices a departure within its 0.2 s sweep */
  mpJobSpawn(&job, 1, initRank, id, NULL);
  int survivors[2] = {0, 1};
  mpJobWait(&job, survivors, 2, t0 + 30.0);
  int bad = !mpExitedZero(&job, 0) + !mpExitedZero(&job, 1);
  mpJobKillRest(&job);
  printf("init_fail rank-left: %.1f s: %s\n", mpNow() - t0, bad ? "FAIL" : "PASS");
  return bad ? 1 : 0;
}

int main(int argc, char** argv) {
  const char* sc = argc > 1 ? argv[1] : "";
  int missing = -1;
  if (!strcmp(sc, "rank-missing")) {
    missing = 2;
  } else if (!strcmp(sc, "root-missing")) {
    missing = 0;
  } else if (!strcmp(sc, "rank-left")) {
    g_expect = "left";
    g_minSec = 0.3; /* rank 1 arrives 2 s late: it waits only what is left of the 3 s */
  } else if (!strcmp(sc, "wrong-nranks")) {
    g_expect = "nranks=4";
    g_expect2 = "nranks=3";
    g_minSec = 0;
    g_maxSec = 2.0; /* the root knows at once: nobody waits for the timeout */
  } else {
    fprintf(stderr, "usage: %s rank-missing|root-missing|rank-left|wrong-nranks\n", argv[0]);
    return 2;
  }
  setvbuf(stdout, NULL, _IOLBF, 0);
  setenv("NCCLX_CORE_TIMEOUT_S", "3", 1); /* before any ncclx call: children inherit it */
  double t0 = mpNow();
  ncclxUniqueId id;
  MP_CALL(-1, NULL, ncclxGetUniqueId(&id));
  if (!strcmp(sc, "rank-left")) return runRankLeft(id, t0);
  mpJob job;
  mpJobInit(&job, NRANKS);
  int started[NRANKS], n = 0;
  for (int r = 0; r < NRANKS; r++) {
    if (r == missing) continue;
    mpJobSpawn(&job, r, r == 2 && g_expect ? wrongNranksRank : initRank, id, NULL);
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
