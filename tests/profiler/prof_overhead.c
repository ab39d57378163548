/* What the trace profiler costs a small collective, measured with the plugin on and off in
 * one run: every rank creates two communicators, A without a profiler and B with the trace
 * plugin (events = coll, the configuration re-read in between), then alternates batches of
 * allreduces on A and B, so load changes on a shared machine hit both alike.
 *
 *   prof_overhead [-np N] [-n ITERS] [-r ROUNDS] [SIZE...]   (defaults: 2, 2000, 15, 8 64 1024 8192)
 *
 * PROF_OVERHEAD_PLUGIN=PATH loads that profiler .so for B instead of the trace plugin.
 *
 * Prints per size the median and the best batch mean (us per call) of A and B and their
 * ratios. The best batch is the figure for an idle machine; the median moves with the load.
 * tools/prof-overhead runs this and an ncclx-perf comparison. Exit 0, or 1 on an error. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "config/config.h"
#include "mp_fork.h"
#include "mp_util.h"

#define MAX_SIZES 16
#define MAX_ROUNDS 200

typedef struct {
  ncclxUniqueId idB;
  int iters, rounds, nsizes;
  size_t sizes[MAX_SIZES];
  int resultFd; /* rank 0 writes its table here */
} Params;

static double batch(ncclxComm_t comm, float* s, float* r, size_t count, int iters, int rank) {
  double t0 = mpNow();
  for (int i = 0; i < iters; i++) MP_CALL(rank, comm, ncclxAllReduce(s, r, count, ncclxFloat32, ncclxSum, comm, NULL));
  return (mpNow() - t0) / iters * 1e6;
}

static int cmpDouble(const void* a, const void* b) {
  double x = *(const double*)a, y = *(const double*)b;
  return x < y ? -1 : x > y;
}

static double median(double* v, int n) {
  qsort(v, (size_t)n, sizeof(*v), cmpDouble);
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static double minimum(const double* v, int n) {
  double m = v[0];
  for (int i = 1; i < n; i++) m = v[i] < m ? v[i] : m;
  return m;
}

static int rankMain(int rank, int nranks, ncclxUniqueId idA, void* arg) {
  Params* p = arg;
  ncclxComm_t a = NULL, b = NULL;
  unsetenv("NCCLX_PROFILER_PLUGIN");
  ncclxConfigReset();
  MP_CALL(rank, NULL, ncclxCommInitRank(&a, nranks, idA, rank));
  /* PROF_OVERHEAD_PLUGIN=/path/to/a.so compares another build of the plugin. */
  const char* plugin = getenv("PROF_OVERHEAD_PLUGIN");
  setenv("NCCLX_PROFILER_PLUGIN", plugin && *plugin ? plugin : "trace", 1);
  ncclxConfigReset(); /* B reads the profiler setting again */
  MP_CALL(rank, NULL, ncclxCommInitRank(&b, nranks, p->idB, rank));
  size_t maxCount = 1;
  for (int i = 0; i < p->nsizes; i++) maxCount = p->sizes[i] / 4 > maxCount ? p->sizes[i] / 4 : maxCount;
  float* s = calloc(maxCount, sizeof(float));
  float* r = calloc(maxCount, sizeof(float));
  static double ta[MAX_SIZES][MAX_ROUNDS], tb[MAX_SIZES][MAX_ROUNDS];
  for (int i = 0; i < p->nsizes; i++) { /* warm-up: connections, caches, metrics buckets */
    size_t count = p->sizes[i] / 4 ? p->sizes[i] / 4 : 1;
    batch(a, s, r, count, p->iters / 4 + 1, rank);
    batch(b, s, r, count, p->iters / 4 + 1, rank);
  }
  for (int round = 0; round < p->rounds; round++)
    for (int i = 0; i < p->nsizes; i++) {
      size_t count = p->sizes[i] / 4 ? p->sizes[i] / 4 : 1;
      if (round % 2 == 0) {
        ta[i][round] = batch(a, s, r, count, p->iters, rank);
        tb[i][round] = batch(b, s, r, count, p->iters, rank);
      } else {
        tb[i][round] = batch(b, s, r, count, p->iters, rank);
        ta[i][round] = batch(a, s, r, count, p->iters, rank);
      }
    }
  MP_CALL(rank, b, ncclxCommDestroy(b));
  MP_CALL(rank, a, ncclxCommDestroy(a));
  free(s), free(r);
  if (rank != 0) return 0;
  FILE* out = fdopen(p->resultFd, "w");
  if (!out) return 1;
  fprintf(out, "%10s %12s %12s %8s %12s %12s %8s\n", "size (B)", "off med us", "trace med us", "ratio",
          "off best us", "trace best us", "ratio");
  for (int i = 0; i < p->nsizes; i++) {
    double bestA = minimum(ta[i], p->rounds), bestB = minimum(tb[i], p->rounds);
    double medA = median(ta[i], p->rounds), medB = median(tb[i], p->rounds);
    fprintf(out, "%10zu %12.3f %12.3f %8.3f %12.3f %12.3f %8.3f\n", p->sizes[i], medA, medB, medB / medA, bestA,
            bestB, bestB / bestA);
  }
  fclose(out);
  return 0;
}

int main(int argc, char** argv) {
  static Params p = {.iters = 2000, .rounds = 15};
  int nranks = 2;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "-np") && i + 1 < argc) nranks = atoi(argv[++i]);
    else if (!strcmp(argv[i], "-n") && i + 1 < argc) p.iters = atoi(argv[++i]);
    else if (!strcmp(argv[i], "-r") && i + 1 < argc) p.rounds = atoi(argv[++i]);
    else if (argv[i][0] != '-' && p.nsizes < MAX_SIZES) p.sizes[p.nsizes++] = strtoull(argv[i], NULL, 10);
    else {
      fprintf(stderr, "usage: %s [-np N] [-n ITERS] [-r ROUNDS] [SIZE...]\n", argv[0]);
      return 2;
    }
  }
  if (nranks < 1 || nranks > MP_MAX_RANKS || p.iters < 1 || p.rounds < 1 || p.rounds > MAX_ROUNDS) {
    fprintf(stderr, "%s: -np 1..%d, -n >= 1, -r 1..%d\n", argv[0], MP_MAX_RANKS, MAX_ROUNDS);
    return 2;
  }
  if (p.nsizes == 0) {
    size_t def[] = {8, 64, 1024, 8192};
    for (int i = 0; i < 4; i++) p.sizes[p.nsizes++] = def[i];
  }
  char dir[] = "/tmp/ncclx-prof-overhead-XXXXXX";
  if (!mkdtemp(dir)) return 1;
  setenv("NCCLX_PROFILER_TRACE_DIR", dir, 1);
  setenv("NCCLX_PROFILER_TRACE_EVENTS", "coll", 1);
  setenv("NCCLX_PROFILER_TRACE_SUMMARY", "none", 1);
  int fds[2];
  if (pipe(fds) != 0) return 1;
  p.resultFd = fds[1];
  printf("prof_overhead: %d rank(s), %d rounds of %d calls per size, plugin off (A) and on (B) alternating\n",
         nranks, p.rounds, p.iters);
  fflush(stdout);
  mpJob job;
  mpJobInit(&job, nranks);
  ncclxUniqueId idA;
  MP_CALL(-1, NULL, ncclxGetUniqueId(&idA));
  MP_CALL(-1, NULL, ncclxGetUniqueId(&p.idB));
  for (int r = 0; r < nranks; r++) mpJobSpawn(&job, r, rankMain, idA, &p);
  close(fds[1]);
  int all[MP_MAX_RANKS];
  for (int r = 0; r < nranks; r++) all[r] = r;
  int stuck = mpJobWait(&job, all, nranks, mpNow() + 600.0);
  char buf[4096];
  ssize_t n;
  while ((n = read(fds[0], buf, sizeof(buf))) > 0) fwrite(buf, 1, (size_t)n, stdout);
  int bad = stuck != 0;
  for (int r = 0; r < nranks; r++) bad += !mpExitedZero(&job, r);
  mpJobKillRest(&job);
  char cmd[128];
  snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
  if (system(cmd) != 0) bad++;
  return bad ? 1 : 0;
}
