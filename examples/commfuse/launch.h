/* Fork N local ranks for the CommFuse examples and wait for them with a bound. Each child
 * runs rankMain(rank, nranks, id, arg) and exits with its return value. Header-only so each
 * example stays one file plus this. */
#ifndef COMMFUSE_EXAMPLE_LAUNCH_H
#define COMMFUSE_EXAMPLE_LAUNCH_H

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "ncclx.h"

typedef int (*exRankMain)(int rank, int nranks, ncclxUniqueId id, void* arg);

static double exNow(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Returns 0 when every rank exits 0. */
static int exLaunch(int nranks, double timeoutSec, exRankMain rankMain, void* arg) {
  if (!getenv("NCCLX_NET_SOCKET_IFNAME")) setenv("NCCLX_NET_SOCKET_IFNAME", "lo", 1);
  ncclxUniqueId id;
  if (ncclxGetUniqueId(&id) != ncclxSuccess) {
    fprintf(stderr, "ncclxGetUniqueId: %s\n", ncclxGetLastError(NULL));
    return 1;
  }
  pid_t pids[64];
  if (nranks < 1 || nranks > 64) return 1;
  fflush(stdout);
  for (int r = 0; r < nranks; r++) {
    pids[r] = fork();
    if (pids[r] == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL); /* never outlive the launcher */
      exit(rankMain(r, nranks, id, arg));
    }
    if (pids[r] < 0) {
      perror("fork");
      for (int q = 0; q < r; q++) kill(pids[q], SIGKILL);
      return 1;
    }
  }
  int bad = 0, left = nranks;
  double deadline = exNow() + timeoutSec;
  while (left > 0) {
    int status;
    pid_t pid = waitpid(-1, &status, WNOHANG);
    if (pid > 0) {
      left--;
      if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) bad = 1;
    } else if (exNow() > deadline) {
      fprintf(stderr, "timed out after %.0f s; killing the ranks\n", timeoutSec);
      for (int r = 0; r < nranks; r++) kill(pids[r], SIGKILL);
      while (waitpid(-1, NULL, 0) > 0) {
      }
      return 1;
    } else {
      usleep(10000);
    }
  }
  return bad;
}

#define EX_CHECK(comm, call)                                                              \
  do {                                                                                    \
    ncclxResult_t ex_res_ = (call);                                                       \
    if (ex_res_ != ncclxSuccess) {                                                        \
      fprintf(stderr, "%s failed: %s\n", #call, ncclxGetLastError(comm));                \
      exit(1);                                                                            \
    }                                                                                     \
  } while (0)
#endif
