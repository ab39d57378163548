/* A rank of the cut-link scenario (tests/profiler/test_cut_link.py), run under
 * tools/ncclx-hosts with the trace profiler on: all-reduce in a loop until a call fails,
 * then dump the communicator's state for tools/ncclx-analyze.
 *
 *   prof_cut DIR [BYTES] [MAX_SECONDS]     (default 1 MiB, 60 s)
 *
 * With PROF_CUT_TIMEOUT_S=T the loop runs on ncclxCommSplit(comm, 0, rank) with timeoutSec
 * = T, so init can keep a longer [core] timeout_s.
 *
 * Prints "prof_cut: looping" after a few good iterations (the launcher's --cut-on cue), and
 * on a failure "prof_cut: rank R: allreduce #N failed after S s: ERROR", then writes
 * DIR/commdump-rank<R>.json (ncclxCommDump: the core's view and the profiler's view) and
 * aborts the communicator. Exit status: 1 after a failure (the expected outcome), 0 when
 * MAX_SECONDS passed with no error ("went unnoticed"), 2 on bad arguments or setup failure. */
#ifndef _GNU_SOURCE
#define _POSIX_C_SOURCE 200809L
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
  if (argc < 2) {
    fprintf(stderr, "usage: %s DIR [BYTES] [MAX_SECONDS]\n", argv[0]);
    return 2;
  }
  const char* dir = argv[1];
  size_t bytes = argc > 2 ? strtoull(argv[2], NULL, 10) : (size_t)1 << 20;
  double maxSec = argc > 3 ? atof(argv[3]) : 60.0;
  size_t count = bytes / sizeof(float);
  if (count == 0 || maxSec <= 0) {
    fprintf(stderr, "prof_cut: bad BYTES or MAX_SECONDS\n");
    return 2;
  }
  setvbuf(stdout, NULL, _IOLBF, 0);
  ncclxComm_t comm = NULL;
  ncclxResult_t res = ncclxCommInitFromEnv(&comm);
  if (res != ncclxSuccess) {
    fprintf(stderr, "prof_cut: init failed: %s: %s\n", ncclxGetErrorString(res), ncclxGetLastError(NULL));
    return 2;
  }
  int rank = 0;
  ncclxCommUserRank(comm, &rank);
  /* Init ran with the environment's (generous) timeout, for ranks that start late on a
   * loaded machine; the loop runs on a copy with the short one, so a cut fails it fast. */
  const char* t = getenv("PROF_CUT_TIMEOUT_S");
  if (t && atoi(t) > 0) {
    ncclxConfig_t cfg = NCCLX_CONFIG_INITIALIZER;
    cfg.timeoutSec = atoi(t);
    ncclxComm_t child = NULL;
    res = ncclxCommSplit(comm, 0, rank, &child, &cfg);
    if (res != ncclxSuccess) {
      fprintf(stderr, "prof_cut: split failed: %s: %s\n", ncclxGetErrorString(res), ncclxGetLastError(comm));
      return 2;
    }
    ncclxCommDestroy(comm);
    comm = child;
  }
  float* s = malloc(count * sizeof(float));
  float* r = malloc(count * sizeof(float));
  if (!s || !r) return 2;
  for (size_t i = 0; i < count; i++) s[i] = 1.0f;
  double start = nowSec(), last = start;
  for (long it = 1; nowSec() - start < maxSec; it++) {
    if (it == 4) printf("prof_cut: looping\n");
    res = ncclxAllReduce(s, r, count, ncclxFloat32, ncclxSum, comm, NULL);
    if (res != ncclxSuccess) {
      printf("prof_cut: rank %d: allreduce #%ld failed after %.2f s: %s\n", rank, it, nowSec() - last,
             ncclxGetLastError(comm));
      char path[4200];
      snprintf(path, sizeof(path), "%s/commdump-rank%d.json", dir, rank);
      if (ncclxCommDump(comm, path) != ncclxSuccess) printf("prof_cut: rank %d: ncclxCommDump failed\n", rank);
      ncclxCommAbort(comm);
      free(s), free(r);
      return 1;
    }
    last = nowSec();
  }
  printf("prof_cut: rank %d: no error in %.0f s: the cut went unnoticed\n", rank, maxSec);
  ncclxCommDestroy(comm);
  free(s), free(r);
  return 0;
}
