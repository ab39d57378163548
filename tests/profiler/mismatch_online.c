/* [core] check_mismatch with real processes. Four forked ranks run a few good collectives,
 * then rank 2 makes a call that disagrees with the others':
 *
 *   mismatch_online count   rank 2 calls allreduce with half the count
 *   mismatch_online op      rank 2 calls allreduce with max where the others use sum
 *   mismatch_online root    rank 2 calls broadcast with root 1 where the others use root 0
 *   mismatch_online ok      no disagreement: every collective kind passes the check and
 *                           gives correct results (prints the check's cost per call)
 *
 * Every rank must fail the bad call with ncclxInvalidUsage well before the core timeout
 * (the check, not a timeout, caught it), with a message naming rank 2 and what it called,
 * the other ranks and what they called, and the field that differs; the communicator then
 * refuses further calls. The parent bounds every rank's run time. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mp_fork.h"
#include "mp_util.h"

#define NRANKS 4
#define COUNT 4096
#define CORE_TIMEOUT_S 20.0
#define DETECT_BOUND_S 5.0 /* far below the timeout: the check answered, not the timeout */

static const char* g_scenario;

static int is(const char* s) { return strcmp(g_scenario, s) == 0; }

static int fail(int rank, const char* what, const char* detail) {
  fprintf(stderr, "rank %d: FAIL: %s%s%s\n", rank, what, detail ? ": " : "", detail ? detail : "");
  return 1;
}

static int expectText(int rank, const char* msg, const char* text) {
  if (strstr(msg, text)) return 0;
  char what[256];
  snprintf(what, sizeof(what), "the error does not contain \"%s\"", text);
  return fail(rank, what, msg);
}

static int checkAllreduce(int rank, const float* r, size_t n, float expect) {
  for (size_t i = 0; i < n; i++)
    if (r[i] != expect) return fail(rank, "wrong allreduce result", NULL);
  return 0;
}

/* Every collective kind under the check, with results verified; times the check. */
static int runOk(int rank, ncclxComm_t comm, float* s, float* r) {
  int bad = 0;
  for (int i = 0; i < 20; i++) {
    MP_CALL(rank, comm, ncclxAllReduce(s, r, COUNT, ncclxFloat32, ncclxSum, comm, NULL));
    bad += checkAllreduce(rank, r, COUNT, 10.0f);
  }
  MP_CALL(rank, comm, ncclxBroadcast(s, r, COUNT, ncclxFloat32, 1, comm, NULL));
  bad += checkAllreduce(rank, r, COUNT, 2.0f);
  MP_CALL(rank, comm, ncclxReduce(s, r, COUNT, ncclxFloat32, ncclxMax, 3, comm, NULL));
  if (rank == 3) bad += checkAllreduce(rank, r, COUNT, 4.0f);
  MP_CALL(rank, comm, ncclxAllGather(s, r, COUNT / NRANKS, ncclxFloat32, comm, NULL));
  for (int q = 0; q < NRANKS; q++) bad += checkAllreduce(rank, r + q * (COUNT / NRANKS), COUNT / NRANKS, (float)(q + 1));
  /* alltoallv: counts differ per rank by design, and the check must not object. */
  size_t sc[NRANKS], sd[NRANKS], rc[NRANKS], rd[NRANKS];
  for (int q = 0; q < NRANKS; q++) {
    sc[q] = (size_t)(rank + 1), sd[q] = (size_t)q * NRANKS;
    rc[q] = (size_t)(q + 1), rd[q] = (size_t)q * NRANKS;
  }
  MP_CALL(rank, comm, ncclxAllToAllv(s, sc, sd, r, rc, rd, ncclxFloat32, comm, NULL));
  for (int q = 0; q < NRANKS; q++) bad += checkAllreduce(rank, r + rd[q], rc[q], (float)(q + 1));
  MP_CALL(rank, comm, ncclxBarrier(comm, NULL));
  int calls = 200;
  double t0 = mpNow();
  for (int i = 0; i < calls; i++) MP_CALL(rank, comm, ncclxAllReduce(s, r, 2, ncclxFloat32, ncclxSum, comm, NULL));
  if (rank == 0)
    printf("rank 0: 8-byte allreduce with check_mismatch on: %.1f us per call (%d ranks)\n",
           (mpNow() - t0) / calls * 1e6, NRANKS);
  MP_CALL(rank, comm, ncclxCommDestroy(comm));
  return bad;
}

static int rankMain(int rank, int nranks, ncclxUniqueId id, void* arg) {
  (void)arg;
  ncclxComm_t comm = NULL;
  MP_CALL(rank, NULL, ncclxCommInitRank(&comm, nranks, id, rank));
  float* s = malloc(COUNT * sizeof(float));
  float* r = malloc(COUNT * sizeof(float));
  for (size_t i = 0; i < COUNT; i++) s[i] = (float)(rank + 1);
  int bad = 0;
  if (is("ok")) {
    bad = runOk(rank, comm, s, r);
    free(s), free(r);
    return bad;
  }
  for (int i = 0; i < 3; i++) {
    MP_CALL(rank, comm, ncclxAllReduce(s, r, COUNT, ncclxFloat32, ncclxSum, comm, NULL));
    bad += checkAllreduce(rank, r, COUNT, 10.0f);
  }
  int odd = rank == 2;
  double t0 = mpNow();
  ncclxResult_t res;
  if (is("count")) res = ncclxAllReduce(s, r, odd ? COUNT / 2 : COUNT, ncclxFloat32, ncclxSum, comm, NULL);
  else if (is("op")) res = ncclxAllReduce(s, r, COUNT, ncclxFloat32, odd ? ncclxMax : ncclxSum, comm, NULL);
  else res = ncclxBroadcast(s, r, COUNT, ncclxFloat32, odd ? 1 : 0, comm, NULL);
  double dt = mpNow() - t0;
  const char* msg = ncclxGetLastError(comm);
  printf("rank %d: collective #4 returned %s after %.3f s: \"%s\"\n", rank, ncclxGetErrorString(res), dt, msg);
  if (res != ncclxInvalidUsage) bad += fail(rank, "the mismatched call did not fail with ncclxInvalidUsage", NULL);
  if (dt > DETECT_BOUND_S) bad += fail(rank, "detection took longer than the bound", NULL);
  bad += expectText(rank, msg, "mismatched collective #4");
  if (is("count")) {
    bad += expectText(rank, msg, "rank 2 called allreduce (count 2048 float32, sum)");
    bad += expectText(rank, msg, "ranks 0, 1, 3 called allreduce (count 4096 float32, sum)");
    bad += expectText(rank, msg, "differ in the count");
  } else if (is("op")) {
    bad += expectText(rank, msg, "rank 2 called allreduce (count 4096 float32, max)");
    bad += expectText(rank, msg, "ranks 0, 1, 3 called allreduce (count 4096 float32, sum)");
    bad += expectText(rank, msg, "differ in the reduction op");
  } else {
    bad += expectText(rank, msg, "rank 2 called broadcast (count 4096 float32, root 1)");
    bad += expectText(rank, msg, "ranks 0, 1, 3 called broadcast (count 4096 float32, root 0)");
    bad += expectText(rank, msg, "differ in the root");
  }
  /* The communicator is out of step with the program's intent: it refuses further calls. */
  res = ncclxAllReduce(s, r, COUNT, ncclxFloat32, ncclxSum, comm, NULL);
  if (res == ncclxSuccess) bad += fail(rank, "the communicator accepted a call after the mismatch", NULL);
  ncclxCommAbort(comm);
  free(s), free(r);
  return bad ? 1 : 0;
}

int main(int argc, char** argv) {
  if (argc < 2 || !(!strcmp(argv[1], "count") || !strcmp(argv[1], "op") || !strcmp(argv[1], "root") ||
                    !strcmp(argv[1], "ok"))) {
    fprintf(stderr, "usage: %s count|op|root|ok\n", argv[0]);
    return 2;
  }
  g_scenario = argv[1];
  setvbuf(stdout, NULL, _IOLBF, 0);
  /* Before any ncclx call: the configuration is read once per process; children inherit it. */
  setenv("NCCLX_CORE_CHECK_MISMATCH", "true", 1);
  char timeout[32];
  snprintf(timeout, sizeof(timeout), "%.0f", CORE_TIMEOUT_S);
  setenv("NCCLX_CORE_TIMEOUT_S", timeout, 1);
  mpJob job;
  mpJobInit(&job, NRANKS);
  double t0 = mpNow();
  ncclxUniqueId id;
  MP_CALL(-1, NULL, ncclxGetUniqueId(&id));
  for (int r = 0; r < NRANKS; r++) mpJobSpawn(&job, r, rankMain, id, NULL);
  int all[NRANKS];
  for (int r = 0; r < NRANKS; r++) all[r] = r;
  int bad = 0;
  if (mpJobWait(&job, all, NRANKS, mpNow() + CORE_TIMEOUT_S + 30.0) != 0)
    bad += fail(-1, "ranks still running past the bound (a hang)", NULL);
  char d[96];
  for (int r = 0; r < NRANKS; r++) {
    int ok = mpExitedZero(&job, r);
    printf("parent: rank %d %s (%s)\n", r, mpDescribeStatus(&job, r, d, sizeof d), ok ? "ok" : "WRONG");
    bad += !ok;
  }
  mpJobKillRest(&job);
  printf("mismatch_online %s: %s (%.1f s)\n", g_scenario, bad ? "FAIL" : "PASS", mpNow() - t0);
  return bad ? 1 : 0;
}
