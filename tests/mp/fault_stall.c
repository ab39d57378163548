/* A rank that stalls past the timeout: once its peers have failed a call, that call fails on
 * every rank, the stalled one included (it used to return success with the data its peers
 * had already delivered, and fail only at its next call).
 *
 *   fault_stall between   4 ranks, 1 MiB all-reduces, timeout_s = 3; rank 2 sleeps 8 s
 *                         before call STALL_CALL
 *   fault_stall stream    the same, the sleep a host function on rank 2's stream, queued
 *                         before the all-reduce on that stream
 *   fault_stall inside    the same, rank 2 stopped inside the call after data has moved: run
 *                         with NCCLX_PROFILER_PLUGIN naming stall_profiler.c's plugin, which
 *                         sleeps when NCCLX_TEST_STALL_SEC is set
 *
 * Every rank's call STALL_CALL must fail (no later call is made); the others within 15 s,
 * naming rank 2. The others keep their communicators until after rank 2 wakes. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "mp_fork.h"
#include "mp_util.h"

#define NRANKS 4
#define STALL_CALL 20
#define STALL_RANK 2
#define COUNT (256 * 1024) /* floats: 1 MiB, the size of the report */

static int g_stream, g_inside;

static void sleepHost(void* arg) {
  (void)arg;
  sleep(8);
}

static int rankMain(int rank, int nranks, ncclxUniqueId id, void* arg) {
  (void)arg;
  ncclxComm_t comm = NULL;
  MP_CALL(rank, NULL, ncclxCommInitRank(&comm, nranks, id, rank));
  ncclxStream_t stream = NULL;
  if (g_stream) MP_CALL(rank, comm, ncclxStreamCreate(&stream));
  float* x = malloc(COUNT * sizeof(float));
  float* y = malloc(COUNT * sizeof(float));
  for (size_t i = 0; i < COUNT; i++) x[i] = (float)(rank + 1);
  for (int call = 1; call <= STALL_CALL; call++) {
    int stall = call == STALL_CALL && rank == STALL_RANK;
    if (stall && g_inside) setenv("NCCLX_TEST_STALL_SEC", "8", 1);
    if (stall && !g_stream && !g_inside) sleep(8);
    if (stall && g_stream) MP_CALL(rank, comm, ncclxLaunchHostFunc(stream, sleepHost, NULL));
    double t0 = mpNow();
    ncclxResult_t res = ncclxAllReduce(x, y, COUNT, ncclxFloat32, ncclxSum, comm, stream);
    if (res == ncclxSuccess && stream) res = ncclxStreamSynchronize(stream);
    double dt = mpNow() - t0;
    if (call < STALL_CALL) {
      if (res != ncclxSuccess) {
        fprintf(stderr, "rank %d: FAIL call %d failed before the stall: %s\n", rank, call, ncclxGetLastError(comm));
        return 1;
      }
      continue;
    }
    const char* msg = ncclxGetLastError(comm);
    printf("rank %d: call %d returned %s after %.1f s: %s\n", rank, call, ncclxGetErrorString(res), dt, msg);
    int bad = 0;
    if (res == ncclxSuccess) {
      fprintf(stderr, "rank %d: FAIL call %d succeeded after its peers failed it\n", rank, call);
      bad = 1;
    } else if (!mpContainsCI(msg, "rank 2")) {
      fprintf(stderr, "rank %d: FAIL the error does not name rank 2\n", rank);
      bad = 1;
    } else if (rank != STALL_RANK && dt > 15.0) {
      fprintf(stderr, "rank %d: FAIL failing took %.1f s\n", rank, dt);
      bad = 1;
    }
    /* The others keep their failed communicator (connections open) until rank 2 is back, as
     * an application that only logs the error would: rank 2's data is all there. */
    if (rank != STALL_RANK) sleep(8);
    ncclxCommAbort(comm);
    free(x);
    free(y);
    return bad;
  }
  return 1;
}

int main(int argc, char** argv) {
  if (argc < 2 || (strcmp(argv[1], "between") && strcmp(argv[1], "stream") && strcmp(argv[1], "inside"))) {
    fprintf(stderr, "usage: %s between|stream|inside\n", argv[0]);
    return 2;
  }
  g_stream = !strcmp(argv[1], "stream");
  g_inside = !strcmp(argv[1], "inside");
  if (g_inside && !getenv("NCCLX_PROFILER_PLUGIN")) {
    fprintf(stderr, "fault_stall inside: set NCCLX_PROFILER_PLUGIN to the stall profiler plugin\n");
    return 2;
  }
  setenv("NCCLX_CORE_TIMEOUT_S", "3", 1);
  ncclxUniqueId id;
  MP_CALL(-1, NULL, ncclxGetUniqueId(&id));
  mpJob job;
  mpJobInit(&job, NRANKS);
  double t0 = mpNow();
  for (int r = 0; r < NRANKS; r++) mpJobSpawn(&job, r, rankMain, id, NULL);
  int ranks[NRANKS] = {0, 1, 2, 3};
  int stuck = mpJobWait(&job, ranks, NRANKS, t0 + 60);
  int bad = 0;
  char why[64];
  for (int r = 0; r < NRANKS; r++)
    if (!mpExitedZero(&job, r)) {
      fprintf(stderr, "fault_stall: rank %d: %s\n", r, mpDescribeStatus(&job, r, why, sizeof(why)));
      bad++;
    }
  if (stuck) mpJobKillRest(&job);
  printf("fault_stall %s: %s in %.1f s\n", argv[1], bad ? "FAILED" : "passed", mpNow() - t0);
  return bad ? 1 : 0;
}
