#include "a2av_util.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

int a2avRunRanks(const char* what, int nranks, mpRankFn fn, void* arg, double timeoutSec) {
  mpJob job;
  mpJobInit(&job, nranks);
  ncclxUniqueId id;
  MP_CALL(-1, NULL, ncclxGetUniqueId(&id));
  double t0 = mpNow();
  for (int r = 0; r < nranks; r++) mpJobSpawn(&job, r, fn, id, arg);
  int all[MP_MAX_RANKS];
  for (int r = 0; r < nranks; r++) all[r] = r;
  mpJobWait(&job, all, nranks, t0 + timeoutSec);
  int bad = 0;
  char d[96];
  for (int r = 0; r < nranks; r++) {
    if (mpExitedZero(&job, r)) continue;
    printf("%s: rank %d: %s\n", what, r, mpDescribeStatus(&job, r, d, sizeof d));
    bad++;
  }
  int killed = mpJobKillRest(&job);
  if (killed) printf("%s: FAIL: %d rank(s) still running after %.0f s were killed\n", what, killed, timeoutSec);
  printf("%s: %d ranks, %s in %.2f s\n", what, nranks, bad ? "FAILED" : "ok", mpNow() - t0);
  fflush(stdout);
  return bad ? 1 : 0;
}

ncclxComm_t a2avInit(int rank, int nranks, ncclxUniqueId id) {
  ncclxComm_t comm = NULL;
  MP_CALL(rank, NULL, ncclxCommInitRank(&comm, nranks, id, rank));
  return comm;
}

int a2avFail(int rank, const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "rank %d: FAIL: ", rank);
  vfprintf(stderr, fmt, ap);
  fprintf(stderr, "\n");
  va_end(ap);
  return 1;
}

int a2avArgInt(const char* s, const char* what) {
  char* end = NULL;
  long v = s ? strtol(s, &end, 10) : 0;
  if (!s || *end || v < 0 || v > 1000000) {
    fprintf(stderr, "bad %s '%s'\n", what, s ? s : "(missing)");
    exit(2);
  }
  return (int)v;
}
