/* Jobs that share a rendezvous address never mix, and a stranger never joins (docs/api.md,
 * "Job identity"). Every rank is a forked process that sets its environment and calls
 * ncclxCommInitFromEnv with NCCLX_COMM_ID=127.0.0.1:<free port>, then all-reduces one float:
 * its job's value. A sum with the other job's value in it is a mix.
 *
 *   init_job_identity two-jobs RUNS     two 3-rank jobs started together, no job identity
 *   init_job_identity two-jobs-id RUNS  the same, each job with its own NCCLX_JOB_ID
 *   init_job_identity stranger          a 2-rank job with NCCLX_JOB_SECRET; a process without
 *                                       it starts first as rank 1 and must not get in
 *   init_job_identity flood             600 silent connections to the root before rank 1
 *                                       arrives: the job must still start
 *
 * Every rank must end with its job's correct sum or an error sentence; no run may mix. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "ncclx.h"

enum { EXIT_CORRECT = 0, EXIT_FAILED = 1, EXIT_MIXED = 3, EXIT_SILENT = 4 };

static const char* const identityVars[] = {"NCCLX_JOB_SECRET", "NCCLX_JOB_ID", "SLURM_JOB_ID", "SLURM_STEP_ID",
                                           "PMIX_NAMESPACE", "OMPI_MCA_ess_base_jobid", "TORCHELASTIC_RUN_ID",
                                           "NCCLX_COMM_IDS", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
                                           "PMIX_RANK", "PMI_RANK", "PMI_SIZE", "SLURM_PROCID", "SLURM_NTASKS",
                                           "RANK", "WORLD_SIZE"};

static int freePort(void) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t len = sizeof(a);
  if (fd < 0 || bind(fd, (struct sockaddr*)&a, sizeof(a)) != 0 || getsockname(fd, (struct sockaddr*)&a, &len) != 0) {
    perror("freePort");
    exit(2);
  }
  close(fd);
  return ntohs(a.sin_port);
}

typedef struct {
  int rank, nranks, port;
  float value, expectSum;
  const char* jobId;     /* NCCLX_JOB_ID, or NULL */
  const char* jobSecret; /* NCCLX_JOB_SECRET, or NULL */
  double delaySec;       /* before init */
} RankSpec;

static int runRank(const RankSpec* s) {
  for (size_t i = 0; i < sizeof(identityVars) / sizeof(identityVars[0]); i++) unsetenv(identityVars[i]);
  char buf[64];
  snprintf(buf, sizeof(buf), "127.0.0.1:%d", s->port);
  setenv("NCCLX_COMM_ID", buf, 1);
  snprintf(buf, sizeof(buf), "%d", s->rank);
  setenv("NCCLX_RANK", buf, 1);
  snprintf(buf, sizeof(buf), "%d", s->nranks);
  setenv("NCCLX_NRANKS", buf, 1);
  if (s->jobId) setenv("NCCLX_JOB_ID", s->jobId, 1);
  if (s->jobSecret) setenv("NCCLX_JOB_SECRET", s->jobSecret, 1);
  if (s->delaySec > 0) usleep((useconds_t)(s->delaySec * 1e6));
  ncclxComm_t comm = NULL;
  float x = s->value, y = 0;
  ncclxResult_t res = ncclxCommInitFromEnv(&comm);
  if (res == ncclxSuccess) res = ncclxAllReduce(&x, &y, 1, ncclxFloat32, ncclxSum, comm, NULL);
  if (res != ncclxSuccess) {
    const char* why = ncclxGetLastError(comm);
    fprintf(stderr, "  rank %d (value %g): %s\n", s->rank, s->value, why);
    if (comm) ncclxCommAbort(comm);
    return why[0] ? EXIT_FAILED : EXIT_SILENT;
  }
  ncclxCommDestroy(comm);
  if (y != s->expectSum) {
    fprintf(stderr, "  rank %d (value %g): sum %g where its job's is %g: jobs mixed\n", s->rank, s->value, y,
            s->expectSum);
    return EXIT_MIXED;
  }
  return EXIT_CORRECT;
}

/* Start every rank, wait for all; counts[exit status] += 1. Returns 0, or -1 on a hang. */
static int runAll(const RankSpec* specs, int n, int counts[8]) {
  pid_t pids[16];
  for (int i = 0; i < n; i++) {
    pids[i] = fork();
    if (pids[i] == 0) _exit(runRank(&specs[i]));
  }
  int hung = 0;
  for (int i = 0; i < n; i++) {
    int st = 0;
    for (int waited = 0; waitpid(pids[i], &st, WNOHANG) == 0; waited++) {
      if (waited > 3000) { /* 30 s: far past the 3 s timeout */
        kill(pids[i], SIGKILL);
        waitpid(pids[i], &st, 0);
        hung = 1;
        break;
      }
      usleep(10000);
    }
    int code = WIFEXITED(st) ? WEXITSTATUS(st) : 7;
    counts[code < 8 ? code : 7]++;
  }
  return hung ? -1 : 0;
}

static int twoJobs(int runs, int withIds) {
  int totals[8] = {0}, bad = 0;
  for (int run = 0; run < runs; run++) {
    RankSpec specs[6];
    int port = freePort();
    for (int i = 0; i < 6; i++) {
      int job = i % 2; /* interleaved starts: the jobs race for the root address */
      specs[i] = (RankSpec){.rank = i / 2, .nranks = 3, .port = port, .value = job ? 100.0f : 1.0f,
                            .expectSum = job ? 300.0f : 3.0f, .jobId = withIds ? (job ? "job-b" : "job-a") : NULL};
    }
    int counts[8] = {0};
    if (runAll(specs, 6, counts) != 0) {
      fprintf(stderr, "FAIL run %d: a rank hung\n", run);
      bad++;
    }
    for (int k = 0; k < 8; k++) totals[k] += counts[k];
    if (counts[EXIT_MIXED] || counts[EXIT_SILENT] || counts[7]) bad++;
  }
  printf("%s: %d runs: %d ranks correct, %d failed with a sentence, %d mixed, %d failed silently, %d crashed\n",
         withIds ? "two-jobs-id" : "two-jobs", runs, totals[EXIT_CORRECT], totals[EXIT_FAILED], totals[EXIT_MIXED],
         totals[EXIT_SILENT], totals[7]);
  /* With identities, the job that holds the root address must be untouched by the other. */
  return bad ? 1 : 0;
}

static int stranger(void) {
  int port = freePort();
  RankSpec specs[3] = {
      {.rank = 0, .nranks = 2, .port = port, .value = 1, .expectSum = 2, .jobSecret = "s3cret-of-job-a"},
      {.rank = 1, .nranks = 2, .port = port, .value = 1000, .expectSum = 1001, .delaySec = 0.1},
      {.rank = 1, .nranks = 2, .port = port, .value = 1, .expectSum = 2, .jobSecret = "s3cret-of-job-a",
       .delaySec = 0.5},
  };
  pid_t pids[3];
  int st[3];
  for (int i = 0; i < 3; i++) {
    pids[i] = fork();
    if (pids[i] == 0) _exit(runRank(&specs[i]));
  }
  for (int i = 0; i < 3; i++) waitpid(pids[i], &st[i], 0);
  int job0 = WIFEXITED(st[0]) ? WEXITSTATUS(st[0]) : 7, job1 = WIFEXITED(st[2]) ? WEXITSTATUS(st[2]) : 7;
  int strangerCode = WIFEXITED(st[1]) ? WEXITSTATUS(st[1]) : 7;
  int ok = job0 == EXIT_CORRECT && job1 == EXIT_CORRECT && strangerCode == EXIT_FAILED;
  printf("stranger: job ranks exit %d and %d (0: correct sum 2), stranger exit %d (1: refused with a sentence): %s\n",
         job0, job1, strangerCode, ok ? "passed" : "FAILED");
  return ok ? 0 : 1;
}

/* Connect to 127.0.0.1:port, retrying while nothing listens yet; -1 after 5 s. */
static int connectLoopback(int port) {
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                          .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  for (int tries = 0; tries < 500; tries++) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd >= 0 && connect(fd, (struct sockaddr*)&a, sizeof(a)) == 0) return fd;
    if (fd >= 0) close(fd);
    usleep(10000);
  }
  return -1;
}

static int flood(void) {
  enum { FLOOD = 600 };
  int port = freePort();
  RankSpec root = {.rank = 0, .nranks = 2, .port = port, .value = 1, .expectSum = 2, .jobSecret = "flood-job"};
  RankSpec rank1 = root;
  rank1.rank = 1;
  pid_t pids[2];
  pids[0] = fork();
  if (pids[0] == 0) _exit(runRank(&root));
  static int fds[FLOOD];
  int opened = 0;
  for (int i = 0; i < FLOOD; i++)
    if ((fds[i] = connectLoopback(port)) >= 0) opened++;
  pids[1] = fork();
  if (pids[1] == 0) _exit(runRank(&rank1));
  int st[2];
  for (int i = 0; i < 2; i++) waitpid(pids[i], &st[i], 0);
  for (int i = 0; i < FLOOD; i++)
    if (fds[i] >= 0) close(fds[i]);
  int ok = opened == FLOOD && WIFEXITED(st[0]) && WEXITSTATUS(st[0]) == EXIT_CORRECT && WIFEXITED(st[1]) &&
           WEXITSTATUS(st[1]) == EXIT_CORRECT;
  printf("flood: %d silent connections held; ranks exit %d and %d (0: correct sum): %s\n", opened,
         WIFEXITED(st[0]) ? WEXITSTATUS(st[0]) : -1, WIFEXITED(st[1]) ? WEXITSTATUS(st[1]) : -1,
         ok ? "passed" : "FAILED");
  return ok ? 0 : 1;
}

int main(int argc, char** argv) {
  setenv("NCCLX_CORE_TIMEOUT_S", "3", 0);
  setenv("NCCLX_NET_SOCKET_IFNAME", "lo", 0);
  if (argc >= 2 && !strcmp(argv[1], "stranger")) return stranger();
  if (argc >= 2 && !strcmp(argv[1], "flood")) return flood();
  if (argc >= 3 && !strcmp(argv[1], "two-jobs")) return twoJobs(atoi(argv[2]), 0);
  if (argc >= 3 && !strcmp(argv[1], "two-jobs-id")) return twoJobs(atoi(argv[2]), 1);
  fprintf(stderr, "usage: %s two-jobs RUNS | two-jobs-id RUNS | stranger | flood\n", argv[0]);
  return 2;
}
