/* Link-cut victim: all-reduce in a loop until a call fails, then report how long the failure
 * took to surface and what the library said. Run under tools/ncclx-hosts with --cut-on
 * "netns_cut: looping" so the link is cut in the middle of the loop.
 *
 *   netns_cut [BYTES] [MAX_SECONDS]        (default 1 MiB, 60 s)
 *
 * Exit status: 1 when a call failed (the expected outcome, with a "netns_cut: rank R: ..."
 * line naming the failed call, the seconds since the last good iteration, and the error),
 * 0 when MAX_SECONDS passed without any error (the cut went unnoticed: the test fails on it),
 * 2 on bad arguments or setup failure. Public API only. */
#ifndef _GNU_SOURCE
#define _POSIX_C_SOURCE 200809L /* clock_gettime */
#endif
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ncclx.h"

static double nowSec(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int main(int argc, char** argv) {
  size_t bytes = argc > 1 ? strtoull(argv[1], NULL, 10) : (size_t)1 << 20;
  double maxSec = argc > 2 ? atof(argv[2]) : 60.0;
  if (bytes < sizeof(float) || maxSec <= 0) {
    fprintf(stderr, "usage: netns_cut [BYTES >= 4] [MAX_SECONDS > 0]\n");
    return 2;
  }
  setvbuf(stdout, NULL, _IOLBF, 0);
  ncclxComm_t comm = NULL;
  ncclxResult_t res = ncclxCommInitFromEnv(&comm);
  if (res != ncclxSuccess) {
    fprintf(stderr, "netns_cut: init failed: %s: %s\n", ncclxGetErrorString(res),
            ncclxGetLastError(NULL));
    return 2;
  }
  int rank = -1, nranks = 0;
  ncclxCommUserRank(comm, &rank);
  ncclxCommCount(comm, &nranks);
  size_t count = bytes / sizeof(float);
  float* buf = malloc(count * sizeof(float));
  if (!buf) return 2;

  double start = nowSec(), lastGood = start;
  long iter = 0;
  for (;; iter++) {
    for (size_t i = 0; i < count; i++) buf[i] = 1.0f;
    res = ncclxAllReduce(buf, buf, count, ncclxFloat32, ncclxSum, comm, NULL);
    double t = nowSec();
    if (res != ncclxSuccess) {
      const char* why = ncclxGetLastError(comm);
      printf("netns_cut: rank %d: ncclxAllReduce failed at iteration %ld, %.2f s after the last "
             "good one: %s: %s\n", rank, iter, t - lastGood, ncclxGetErrorString(res),
             why && *why ? why : "(no message)");
      ncclxCommAbort(comm);
      free(buf);
      return 1;
    }
    if (buf[0] != (float)nranks || buf[count - 1] != (float)nranks) {
      printf("netns_cut: rank %d: wrong result %g at iteration %ld (expected %d)\n", rank,
             (double)buf[0], iter, nranks);
      return 2;
    }
    if (iter == 3) printf("netns_cut: looping (rank %d of %d, %zu bytes)\n", rank, nranks, bytes);
    lastGood = t;
    if (t - start > maxSec) break;
  }
  printf("netns_cut: rank %d: no error in %.0f s (%ld iterations): the cut went unnoticed\n", rank,
         maxSec, iter);
  ncclxCommDestroy(comm);
  free(buf);
  return 0;
}
