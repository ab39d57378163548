#include "mp_fork.h"

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "mp_util.h"

void mpJobInit(mpJob* job, int nranks) {
  memset(job, 0, sizeof *job);
  if (nranks < 1 || nranks > MP_MAX_RANKS) {
    fprintf(stderr, "mpJobInit: %d ranks not supported\n", nranks);
    exit(2);
  }
  job->nranks = nranks;
  if (pipe(job->releaseFd) != 0) {
    perror("pipe");
    exit(2);
  }
}

void mpJobSpawn(mpJob* job, int rank, mpRankFn fn, ncclxUniqueId id, void* arg) {
  fflush(stdout);
  fflush(stderr);
  pid_t pid = fork();
  if (pid < 0) {
    perror("fork");
    exit(2);
  }
  if (pid == 0) {
    close(job->releaseFd[1]); /* only the parent may hold the write end, or EOF never comes */
    int rc = fn(rank, job->nranks, id, arg);
    fflush(stdout);
    fflush(stderr);
    exit(rc);
  }
  job->pid[rank] = pid;
}

static void reap(mpJob* job, int rank, int blocking) {
  if (!job->pid[rank] || job->done[rank]) return;
  int st;
  pid_t r = waitpid(job->pid[rank], &st, blocking ? 0 : WNOHANG);
  if (r == job->pid[rank]) {
    job->done[rank] = 1;
    job->status[rank] = st;
    job->endTime[rank] = mpNow();
  } else if (r < 0 && errno != EINTR) {
    job->done[rank] = 1;
    job->status[rank] = -1;
    job->endTime[rank] = mpNow();
  }
}

int mpJobWait(mpJob* job, const int* ranks, int n, double deadline) {
  for (;;) {
    int running = 0;
    for (int i = 0; i < n; i++) {
      reap(job, ranks[i], 0);
      running += job->pid[ranks[i]] && !job->done[ranks[i]];
    }
    if (!running || mpNow() >= deadline) return running;
    usleep(10000);
  }
}

void mpJobRelease(mpJob* job) {
  if (job->releaseFd[1] >= 0) close(job->releaseFd[1]);
  job->releaseFd[1] = -1;
}

int mpJobKillRest(mpJob* job) {
  int killed = 0;
  for (int r = 0; r < job->nranks; r++) {
    if (!job->pid[r] || job->done[r]) continue;
    kill(job->pid[r], SIGKILL);
    reap(job, r, 1);
    killed++;
  }
  return killed;
}

int mpWaitRelease(mpJob* job, double maxSec) {
  double end = mpNow() + maxSec;
  for (;;) {
    double left = end - mpNow();
    if (left <= 0) return -1;
    struct pollfd p = {job->releaseFd[0], POLLIN, 0};
    int r = poll(&p, 1, (int)(left * 1000) + 1);
    if (r > 0) {
      char c;
      if (read(job->releaseFd[0], &c, 1) <= 0) return 0; /* EOF: released */
    } else if (r < 0 && errno != EINTR) {
      return -1;
    }
  }
}

const char* mpDescribeStatus(const mpJob* job, int rank, char* buf, size_t size) {
  int st = job->status[rank];
  if (!job->pid[rank]) snprintf(buf, size, "not started");
  else if (!job->done[rank]) snprintf(buf, size, "still running");
  else if (st == -1) snprintf(buf, size, "lost (waitpid failed)");
  else if (WIFEXITED(st)) snprintf(buf, size, "exit %d", WEXITSTATUS(st));
  else if (WIFSIGNALED(st)) snprintf(buf, size, "killed by signal %d (%s)", WTERMSIG(st), strsignal(WTERMSIG(st)));
  else snprintf(buf, size, "status 0x%x", (unsigned)st);
  return buf;
}

int mpExitedZero(const mpJob* job, int rank) {
  return job->done[rank] && job->status[rank] != -1 && WIFEXITED(job->status[rank]) &&
         WEXITSTATUS(job->status[rank]) == 0;
}

int mpKilledBy(const mpJob* job, int rank, int sig) {
  return job->done[rank] && job->status[rank] != -1 && WIFSIGNALED(job->status[rank]) &&
         WTERMSIG(job->status[rank]) == sig;
}

int mpRunJob(int nranks, mpRankFn fn, void* arg, double timeoutSec) {
  ncclxUniqueId id;
  if (ncclxGetUniqueId(&id) != ncclxSuccess) {
    fprintf(stderr, "mpRunJob: ncclxGetUniqueId: %s\n", ncclxGetLastError(NULL));
    return nranks;
  }
  if (nranks < 1 || nranks > MP_MAX_RANKS) {
    fprintf(stderr, "mpRunJob: %d ranks (1 to %d)\n", nranks, MP_MAX_RANKS);
    return nranks < 1 ? 1 : nranks;
  }
  mpJob job;
  int ranks[MP_MAX_RANKS] = {0};
  mpJobInit(&job, nranks);
  for (int r = 0; r < nranks; r++) {
    ranks[r] = r;
    mpJobSpawn(&job, r, fn, id, arg);
  }
  mpJobWait(&job, ranks, nranks, mpNow() + timeoutSec);
  int bad = 0;
  for (int r = 0; r < nranks; r++) {
    if (mpExitedZero(&job, r)) continue;
    char d[96];
    printf("rank %d: %s\n", r, mpDescribeStatus(&job, r, d, sizeof(d)));
    bad++;
  }
  mpJobKillRest(&job);
  return bad;
}
