/* ncclx-perf -np: fork N local ranks and wait for them with a bound, naming the rank that
 * failed or was killed. Included by ncclx-perf.c only. */
#ifndef NCCLX_PERF_LAUNCH_H
#define NCCLX_PERF_LAUNCH_H

#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* After the first rank fails, how long the others get to notice and exit by themselves. */
#define PERF_FAIL_GRACE_SEC 10.0

typedef int (*PerfRankMain)(int rank, int nranks, void* arg);

/* Pin rank r to the (r mod n)-th of the n CPUs we may run on, as mpirun --map-by core
 * --bind-to core:overload-allowed does. Unpinned, the scheduler sometimes leaves two spinning
 * ranks on one CPU for a whole run while another CPU idles, or three of four ranks on one of
 * two CPUs: every exchange then waits for a context switch (~7 us instead of ~0.6 us for a
 * 2-rank 8-byte all-reduce), and 4 ranks' 256 KiB all-reduce takes 165 us instead of 95-105.
 * More ranks than CPUs are pinned only where we may use every online CPU: a rank pinned to one
 * CPU counts the host's CPUs as its share (hostCpus, util/host.c), which in a smaller cpuset would
 * hide the oversubscription. NCCLX_PERF_BIND=0 leaves the ranks unpinned. */
static int perfPinnedCpus; /* N of "rank r on CPU r mod N" once this rank is pinned, else 0 */

static void perfBindRank(int r, int n) {
  const char* env = getenv("NCCLX_PERF_BIND");
  if (env && strcmp(env, "0") == 0) return;
  cpu_set_t allowed, mine;
  if (sched_getaffinity(0, sizeof(allowed), &allowed) != 0 || CPU_COUNT(&allowed) == 0) return;
  if (n > CPU_COUNT(&allowed) && CPU_COUNT(&allowed) < sysconf(_SC_NPROCESSORS_ONLN)) return;
  int want = r % CPU_COUNT(&allowed);
  for (int cpu = 0, seen = 0; cpu < CPU_SETSIZE; cpu++) {
    if (!CPU_ISSET(cpu, &allowed)) continue;
    if (seen++ != want) continue;
    CPU_ZERO(&mine);
    CPU_SET(cpu, &mine);
    /* best effort: unpinned still works */
    if (sched_setaffinity(0, sizeof(mine), &mine) == 0) perfPinnedCpus = CPU_COUNT(&allowed);
    return;
  }
}

static double perfNowSec(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static const char* perfExitMeaning(int code) {
  switch (code) {
    case 1: return "an ncclx call failed";
    case 2: return "bad arguments";
    case 3: return "wrong results";
    case 4: return "--verify: the rules were slower";
    default: return "unexpected status";
  }
}

/* Records one child's end; returns the parent's exit status contribution (0 = fine). */
static int perfReportChild(int rank, int status) {
  if (WIFEXITED(status)) {
    int code = WEXITSTATUS(status);
    if (code == 0) return 0;
    /* rank 0's output already says FAILED or SLOWER: no line per rank */
    if (code == 3 || code == 4) return code;
    fprintf(stderr, "ncclx-perf: rank %d exited with status %d (%s)\n", rank, code,
            perfExitMeaning(code));
    return code;
  }
  if (WIFSIGNALED(status)) {
    int sig = WTERMSIG(status);
    fprintf(stderr, "ncclx-perf: rank %d was killed by signal %d (%s)\n", rank, sig,
            strsignal(sig));
    return 1;
  }
  return 1;
}

/* SIGKILL the ranks still running and reap them; says which ones and why. */
static void perfKillRemaining(const pid_t* pids, int* alive, int n, const char* why) {
  fprintf(stderr, "ncclx-perf: %s; killing rank(s)", why);
  for (int r = 0; r < n; r++)
    if (alive[r]) {
      fprintf(stderr, " %d", r);
      kill(pids[r], SIGKILL);
    }
  fprintf(stderr, "\n");
  for (int r = 0; r < n; r++)
    if (alive[r]) {
      waitpid(pids[r], NULL, 0); /* prompt: SIGKILL cannot be caught */
      alive[r] = 0;
    }
}

/* Runs rankMain(r, n, arg) in n forked children. Returns 0 when all exit 0, else the status
 * of the first rank to fail (1 for a signal or a timeout). */
static int perfLaunch(int n, double timeoutSec, PerfRankMain rankMain, void* arg) {
  pid_t* pids = calloc((size_t)n, sizeof *pids);
  int* alive = calloc((size_t)n, sizeof *alive);
  if (!pids || !alive) {
    fprintf(stderr, "ncclx-perf: out of memory\n");
    free(pids);
    free(alive);
    return 1;
  }
  /* SIGCHLD stays blocked so sigtimedwait wakes the parent as soon as a rank ends. */
  sigset_t chld, old;
  sigemptyset(&chld);
  sigaddset(&chld, SIGCHLD);
  sigprocmask(SIG_BLOCK, &chld, &old);
  pid_t parent = getpid();
  fflush(stdout);
  fflush(stderr);
  int result = 0, live = 0;
  for (int r = 0; r < n; r++) {
    pid_t pid = fork();
    if (pid < 0) {
      perror("ncclx-perf: fork");
      perfKillRemaining(pids, alive, n, "could not start all ranks");
      free(pids);
      free(alive);
      return 1;
    }
    if (pid == 0) {
      sigprocmask(SIG_SETMASK, &old, NULL);
      /* A rank must not outlive a launcher that was killed (e.g. by a test timeout). */
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (getppid() != parent) _exit(1);
      perfBindRank(r, n);
      free(pids);
      free(alive);
      exit(rankMain(r, n, arg));
    }
    pids[r] = pid;
    alive[r] = 1;
    live++;
  }

  double start = perfNowSec(), graceEnd = 0;
  int firstBad = -1;
  while (live > 0) {
    int status;
    pid_t pid;
    while (live > 0 && (pid = waitpid(-1, &status, WNOHANG)) > 0) {
      for (int r = 0; r < n; r++) {
        if (!alive[r] || pids[r] != pid) continue;
        alive[r] = 0;
        live--;
        int code = perfReportChild(r, status);
        if (code && firstBad < 0) {
          firstBad = r;
          result = code;
          graceEnd = perfNowSec() + PERF_FAIL_GRACE_SEC;
        }
      }
    }
    if (live == 0) break;
    double now = perfNowSec();
    char why[160];
    if (now - start > timeoutSec) {
      snprintf(why, sizeof why, "timed out after %.0f s (raise with -T)", timeoutSec);
      perfKillRemaining(pids, alive, n, why);
      if (!result) result = 1;
      break;
    }
    if (firstBad >= 0 && now > graceEnd) {
      snprintf(why, sizeof why, "still running %.0f s after rank %d failed",
               PERF_FAIL_GRACE_SEC, firstBad);
      perfKillRemaining(pids, alive, n, why);
      break;
    }
    struct timespec tick = {0, 100 * 1000 * 1000};
    sigtimedwait(&chld, NULL, &tick);
  }
  sigprocmask(SIG_SETMASK, &old, NULL);
  free(pids);
  free(alive);
  return result;
}

#endif
