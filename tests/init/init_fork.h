/* Forked ranks for the init tests that link the core statically (ncclx_internal), where the
 * tests/mp launcher, which links the shared library, cannot be used. */
#ifndef NCCLX_TESTS_INIT_FORK_H
#define NCCLX_TESTS_INIT_FORK_H

#include <signal.h>
#include <stdio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "ncclx.h"

/* Runs rankMain(r, id) in n forked children on a fresh unique id; every child must exit 0
 * within timeoutSec (stragglers are killed). Prints "name: PASS|FAIL"; returns 0 on PASS. */
static int initForkRanks(const char* name, int n, int (*rankMain)(int rank, ncclxUniqueId id),
                         int timeoutSec) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  ncclxUniqueId id;
  if (ncclxGetUniqueId(&id) != ncclxSuccess) {
    fprintf(stderr, "ncclxGetUniqueId: %s\n", ncclxGetLastError(NULL));
    return 1;
  }
  pid_t pids[64];
  if (n > 64) return 1;
  for (int r = 0; r < n; r++) {
    pids[r] = fork();
    if (pids[r] == 0) _exit(rankMain(r, id));
  }
  int bad = 0, left = n;
  time_t deadline = time(NULL) + timeoutSec;
  while (left > 0 && time(NULL) < deadline) {
    int st;
    pid_t p = waitpid(-1, &st, WNOHANG);
    if (p > 0) {
      left--;
      if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) bad++;
    } else {
      usleep(10000);
    }
  }
  if (left > 0) {
    fprintf(stderr, "FAIL: %d ranks still running after %d s, killed\n", left, timeoutSec);
    for (int r = 0; r < n; r++) kill(pids[r], SIGKILL);
    while (waitpid(-1, NULL, 0) > 0) {
    }
    bad += left;
  }
  printf("%s: %s\n", name, bad ? "FAIL" : "PASS");
  return bad ? 1 : 0;
}
#endif
