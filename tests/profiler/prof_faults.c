/* Fault injection with the trace profiler loaded, then tools/ncclx-analyze on what the ranks
 * left behind. Four forked ranks loop over 1 MiB allreduces:
 *
 *   prof_faults kill      the parent SIGKILLs rank 2 while the ranks are in allreduces
 *   prof_faults stop      the parent SIGSTOPs rank 1 (hung); the others hit the core timeout
 *   prof_faults skip      rank 3 skips its 5th allreduce: the others wait in #10 for it
 *   prof_faults mismatch  rank 3 calls broadcast where the others call allreduce #5
 *   prof_faults slow      rank 2 sleeps 500 ms before each of 6 allreduces (all complete)
 *
 * Every rank that sees a failure calls ncclxCommDump(DIR/commdump-rank<R>.json), which also
 * writes the plugin's view (.profiler), and checks that it failed within the bound; the
 * watchdog (1 s) writes dump-*.json files on its own. The parent bounds every rank's run
 * time, then runs `ncclx-analyze DIR` and checks that its VERDICT line names the culprit.
 *
 * usage: prof_faults SCENARIO ANALYZER [DIR]   (DIR defaults to ./prof-SCENARIO) */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include "mp_fork.h"
#include "mp_util.h"

#define NRANKS 4
#define COUNT (1u << 18) /* 1 MiB of float32 */
#define CORE_TIMEOUT_S 4.0
#define LOOP_LIMIT_S 60.0 /* kill/stop: the fault must come long before this */

static mpJob g_job;
static const char* g_scenario;
static char g_dir[1024];
static int g_readyPipe[2];

static int is(const char* s) { return strcmp(g_scenario, s) == 0; }

static int fail(int rank, const char* what) {
  fprintf(stderr, "rank %d: FAIL: %s\n", rank, what);
  return 1;
}

/* Tell the parent this rank is up and running collectives. */
static void signalReady(void) {
  char c = 'r';
  ssize_t n = write(g_readyPipe[1], &c, 1);
  (void)n;
}

/* A rank whose collective failed: dump the state, check the error, leave. */
static int onFailure(int rank, ncclxComm_t comm, ncclxResult_t res, int it, double dt) {
  const char* msg = ncclxGetLastError(comm);
  printf("rank %d: call %d failed after %.2f s with %s: \"%s\"\n", rank, it, dt, ncclxGetErrorString(res), msg);
  char path[1200];
  snprintf(path, sizeof(path), "%s/commdump-rank%d.json", g_dir, rank);
  ncclxResult_t dr = ncclxCommDump(comm, path);
  int bad = 0;
  if (dr != ncclxSuccess) bad += fail(rank, "ncclxCommDump failed");
  if (!msg || !*msg) bad += fail(rank, "no error message");
  if (dt > CORE_TIMEOUT_S + 10.0) bad += fail(rank, "the failure took longer than the core timeout + 10 s");
  ncclxCommAbort(comm);
  return bad;
}

static int rankMain(int rank, int nranks, ncclxUniqueId id, void* arg) {
  (void)arg;
  ncclxComm_t comm = NULL;
  MP_CALL(rank, NULL, ncclxCommInitRank(&comm, nranks, id, rank));
  float* s = malloc(COUNT * sizeof(float));
  float* r = malloc(COUNT * sizeof(float));
  for (size_t i = 0; i < COUNT; i++) s[i] = (float)(rank + 1);
  int untilFault = is("kill") || is("stop");
  int iters = untilFault ? 1 << 30 : is("slow") ? 6 : 10;
  double start = mpNow();
  for (int it = 0; it < iters; it++) {
    if (it == 3) signalReady();
    if (untilFault && mpNow() - start > LOOP_LIMIT_S) return fail(rank, "no fault was injected within the limit");
    if (is("skip") && rank == 3 && it == 4) continue;
    if (is("slow") && rank == 2) usleep(500000);
    double t0 = mpNow();
    ncclxResult_t res;
    if (is("mismatch") && rank == 3 && it == 4)
      res = ncclxBroadcast(s, r, COUNT, ncclxFloat32, 0, comm, NULL);
    else
      res = ncclxAllReduce(s, r, COUNT, ncclxFloat32, ncclxSum, comm, NULL);
    if (res != ncclxSuccess) {
      if (is("slow")) return fail(rank, "a collective failed in the slow scenario");
      int bad = onFailure(rank, comm, res, it, mpNow() - t0);
      free(s), free(r);
      return bad ? 1 : 0;
    }
  }
  free(s), free(r);
  if (is("slow")) {
    MP_CALL(rank, comm, ncclxCommDestroy(comm));
    return 0;
  }
  if (is("skip") && rank == 3) {
    /* All its calls went through; the others wait in #10. The parent asks for a dump with
     * SIGUSR1 like an operator would, then lets it go. */
    printf("rank 3: done with 9 allreduces, idle\n");
    if (mpWaitRelease(&g_job, 60.0) != 0) return fail(rank, "never released");
    ncclxCommAbort(comm);
    return 0;
  }
  return fail(rank, "every collective succeeded although a fault was injected");
}

/* Parent: wait for `n` ready bytes (the ranks are inside their collective loop). */
static int waitReady(int n, double maxSec) {
  double end = mpNow() + maxSec;
  while (n > 0 && mpNow() < end) {
    struct pollfd p = {g_readyPipe[0], POLLIN, 0};
    if (poll(&p, 1, 100) > 0) {
      char buf[16];
      ssize_t got = read(g_readyPipe[0], buf, sizeof(buf));
      if (got > 0) n -= (int)got;
    }
  }
  return n <= 0 ? 0 : -1;
}

/* Parent: wait until DIR holds dump-<hash>-rank<R>.json (the SIGUSR1 dump). */
static int waitForDump(int rank, double maxSec) {
  char suffix[32];
  snprintf(suffix, sizeof(suffix), "-rank%d.json", rank);
  double end = mpNow() + maxSec;
  while (mpNow() < end) {
    DIR* d = opendir(g_dir);
    struct dirent* e;
    int found = 0;
    while (d && (e = readdir(d)) != NULL) {
      size_t n = strlen(e->d_name), k = strlen(suffix);
      found |= !strncmp(e->d_name, "dump-", 5) && n > k && !strcmp(e->d_name + n - k, suffix);
    }
    if (d) closedir(d);
    if (found) return 0;
    usleep(20000);
  }
  return -1;
}

/* Runs the analyzer; returns 0 when it exits 0 and its VERDICT line contains `expect`. */
static int analyze(const char* analyzer, const char* expect) {
  char cmd[2400];
  snprintf(cmd, sizeof(cmd), "python3 '%s' '%s' --svg '%s/picture.svg' 2>&1", analyzer, g_dir, g_dir);
  printf("parent: %s\n", cmd);
  FILE* p = popen(cmd, "r");
  if (!p) return fail(-1, "cannot run the analyzer");
  char line[4096];
  int verdictOk = 0, verdicts = 0;
  printf("----- analyzer output -----\n");
  while (fgets(line, sizeof(line), p)) {
    fputs(line, stdout);
    if (!strncmp(line, "VERDICT:", 8)) {
      verdicts++;
      verdictOk |= strstr(line, expect) != NULL;
    }
  }
  int status = pclose(p);
  printf("----- end of analyzer output (status %d) -----\n", status);
  int bad = 0;
  if (status != 0) bad += fail(-1, "the analyzer did not exit 0");
  if (!verdicts) bad += fail(-1, "the analyzer printed no VERDICT line");
  else if (!verdictOk) {
    char what[256];
    snprintf(what, sizeof(what), "no VERDICT line contains \"%s\"", expect);
    bad += fail(-1, what);
  }
  return bad;
}

int main(int argc, char** argv) {
  if (argc < 3 || !(!strcmp(argv[1], "kill") || !strcmp(argv[1], "stop") || !strcmp(argv[1], "skip") ||
                    !strcmp(argv[1], "mismatch") || !strcmp(argv[1], "slow"))) {
    fprintf(stderr, "usage: %s kill|stop|skip|mismatch|slow ANALYZER [DIR]\n", argv[0]);
    return 2;
  }
  g_scenario = argv[1];
  snprintf(g_dir, sizeof(g_dir), "%s", argc > 3 ? argv[3] : "");
  if (!g_dir[0]) snprintf(g_dir, sizeof(g_dir), "prof-%s", g_scenario);
  char cmd[1200];
  snprintf(cmd, sizeof(cmd), "rm -rf '%s'", g_dir);
  if (system(cmd) != 0 || mkdir(g_dir, 0755) != 0) {
    fprintf(stderr, "cannot create %s: %s\n", g_dir, strerror(errno));
    return 2;
  }
  setvbuf(stdout, NULL, _IOLBF, 0);
  /* Before any ncclx call: the configuration is read once per process; children inherit it. */
  setenv("NCCLX_PROFILER_PLUGIN", "trace", 1);
  setenv("NCCLX_PROFILER_TRACE_DIR", g_dir, 1);
  setenv("NCCLX_PROFILER_TRACE_EVENTS", "coll,p2p,step", 1);
  setenv("NCCLX_PROFILER_TRACE_WATCHDOG_TIMEOUT_MS", "1000", 1);
  setenv("NCCLX_PROFILER_TRACE_SUMMARY", "none", 1);
  char timeout[32];
  snprintf(timeout, sizeof(timeout), "%.0f", CORE_TIMEOUT_S);
  setenv("NCCLX_CORE_TIMEOUT_S", timeout, 1);
  if (pipe(g_readyPipe) != 0) return 2;
  mpJobInit(&g_job, NRANKS);
  printf("prof_faults %s: %d forked ranks, core timeout %.0f s, output in %s\n", g_scenario, NRANKS,
         CORE_TIMEOUT_S, g_dir);

  double t0 = mpNow();
  ncclxUniqueId id;
  MP_CALL(-1, NULL, ncclxGetUniqueId(&id));
  for (int r = 0; r < NRANKS; r++) mpJobSpawn(&g_job, r, rankMain, id, NULL);
  int bad = 0, culprit = -1;
  if (waitReady(NRANKS, 60.0) != 0) bad += fail(-1, "the ranks did not start their collectives within 60 s");
  if (is("kill") || is("stop")) {
    culprit = is("kill") ? 2 : 1;
    usleep(300000);
    printf("parent: sending %s to rank %d\n", is("kill") ? "SIGKILL" : "SIGSTOP", culprit);
    kill(g_job.pid[culprit], is("kill") ? SIGKILL : SIGSTOP);
  }
  if (is("skip")) culprit = 3;
  /* Everyone but the stopped rank and the idle skipper ends on its own. */
  int survivors[NRANKS], ns = 0;
  for (int r = 0; r < NRANKS; r++)
    if (r != culprit || is("kill")) survivors[ns++] = r;
  double bound = CORE_TIMEOUT_S + 30.0;
  if (mpJobWait(&g_job, survivors, ns, mpNow() + bound) != 0) bad += fail(-1, "ranks still running past the bound");
  if (is("skip")) {
    kill(g_job.pid[3], SIGUSR1);
    if (waitForDump(3, 5.0) != 0) bad += fail(-1, "rank 3 wrote no dump on SIGUSR1 within 5 s");
    mpJobRelease(&g_job);
    int three[1] = {3};
    mpJobWait(&g_job, three, 1, mpNow() + 20.0);
  }
  char d[96];
  for (int r = 0; r < NRANKS; r++) {
    int ok = r == culprit && is("kill") ? mpKilledBy(&g_job, r, SIGKILL)
             : r == culprit && is("stop") ? !g_job.done[r] /* still stopped */
                                          : mpExitedZero(&g_job, r);
    printf("parent: rank %d %s (%s)\n", r, mpDescribeStatus(&g_job, r, d, sizeof d), ok ? "ok" : "WRONG");
    bad += !ok;
  }
  mpJobKillRest(&g_job); /* the stopped rank */
  printf("parent: ranks done after %.1f s\n", mpNow() - t0);

  const char* expect = is("kill") ? "rank 2 died"
                       : is("stop") ? "rank 1 hung"
                       : is("skip") ? "rank 3 never entered allreduce #10"
                       : is("mismatch") ? "rank 3 called broadcast"
                                        : "rank 2 is slow";
  bad += analyze(argv[2], expect);
  printf("prof_faults %s: %s (%.1f s)\n", g_scenario, bad ? "FAIL" : "PASS", mpNow() - t0);
  return bad ? 1 : 0;
}
