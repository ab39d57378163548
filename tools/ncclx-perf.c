/* ncclx-perf: nccl-tests style benchmark of the ncclx collectives, on the public API only.
 *
 *   ncclx-perf allreduce -b 8 -e 64M -np 4        fork 4 local ranks
 *   NCCLX_COMM_ID=host:port mpirun -np 4 ncclx-perf all
 *
 * Each row is one size: time = max over ranks of the per-rank mean, algbw = size / time,
 * busbw = algbw * the nccl-tests factor of the op, #wrong = elements that differed from the
 * locally computed expectation, summed over ranks. Rank 0 prints.
 *
 *   ncclx-perf --calibrate -np 2 -o model.conf     cost model constants (perf_calib.h)
 *   ncclx-perf --tune -np 4 -o my.rules --verify   rules from a sweep, then checked (perf_tune.h) */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ncclx.h"
#include "perf_args.h"
#include "perf_data.h"
#include "perf_launch.h"
#include "perf_ops.h"
#include "perf_calib.h"
#include "perf_tune.h"

typedef struct {
  double mean, p50, p99; /* us */
  uint64_t wrong;
} PerfTiming;

/* Warmup, timed loop, then (with -c 1) a fresh fill, one call and a check. This rank only. */
static PerfTiming perfMeasure(PerfCtx* c, int op, const PerfGeom* g, int inPlace,
                              const PerfCheck* chk) {
  const PerfOptions* o = c->opt;
  PerfTiming t = {0, 0, 0, 0};
  perfPrepare(c, op, g, inPlace, chk, 0);
  for (long k = 0; k < o->warmup; k++) {
    if (o->barrier) PERF_CHECK(c, ncclxBarrier(c->comm, NULL));
    perfIssue(c, op, g->count, inPlace);
  }
  /* Line the ranks up so the first timed op does not absorb their skew. */
  PERF_CHECK(c, ncclxBarrier(c->comm, NULL));
  double prev = perfNowUs();
  for (long k = 0; k < o->iters; k++) {
    if (o->barrier) {
      PERF_CHECK(c, ncclxBarrier(c->comm, NULL));
      prev = perfNowUs();
    }
    perfIssue(c, op, g->count, inPlace);
    double now = perfNowUs();
    c->samples[k] = now - prev; /* back to back, these add up to the whole loop */
    prev = now;
  }
  double sum = 0;
  for (long k = 0; k < o->iters; k++) sum += c->samples[k];
  t.mean = sum / o->iters;
  if (o->percentiles) {
    qsort(c->samples, (size_t)o->iters, sizeof(double), perfCmpDouble);
    t.p50 = perfPercentile(c->samples, o->iters, 0.50);
    t.p99 = perfPercentile(c->samples, o->iters, 0.99);
  }
  if (o->check) {
    perfPrepare(c, op, g, inPlace, chk, 1);
    perfIssue(c, op, g->count, inPlace);
    t.wrong = perfVerify(c, op, g, inPlace, chk);
  }
  return t;
}

/* Characters one placement's columns take: "  time" [+ p50 p99] + algbw busbw #wrong. */
static int perfSetWidth(const PerfOptions* o) { return 11 + (o->percentiles ? 22 : 0) + 35; }

static void perfPrintHeader(const PerfCtx* c, int op) {
  const PerfOptions* o = c->opt;
  const PerfOpInfo* info = &perfOps[op];
  printf("# ncclx-perf %s: nranks %d, dtype %s, op %s, iters %ld, warmup %ld, check %d",
         info->name, c->nranks, o->type->name,
         info->isReduction ? perfRedOpNames[o->redop] : "none", o->iters, o->warmup, o->check);
  if (info->hasRoot) printf(", root %d", o->root);
  if (o->plainBuffers) printf(", buffers malloc");
  if (perfPinnedCpus) printf(", rank r on CPU r mod %d", perfPinnedCpus);
  printf(", barrier %d, sizes %zu..%zu x%zu\n", o->barrier, o->minBytes, o->maxBytes, o->factor);
  int sets = o->inPlace ? 2 : 1;
  printf("#%50s", "");
  int labelWidth = perfSetWidth(o) - 2;
  for (int s = 0; s < sets; s++)
    printf("  %-*s", s + 1 < sets ? labelWidth : 0, s == 0 ? "out-of-place" : "in-place");
  printf("\n#%11s  %12s  %8s  %6s  %5s", "size(B)", "count(elems)", "type", "redop", "root");
  for (int s = 0; s < sets; s++) {
    printf("  %9s", "time(us)");
    if (o->percentiles) printf("  %9s  %9s", "p50(us)", "p99(us)");
    printf("  %11s  %11s  %7s", "algbw(GB/s)", "busbw(GB/s)", "#wrong");
  }
  printf("\n");
  fflush(stdout);
}

/* Prints one placement's columns; returns its busbw (negative when not applicable). */
static double perfPrintSet(const PerfCtx* c, int op, const PerfGeom* g, const double* stats,
                           uint64_t wrong, int applicable) {
  const PerfOptions* o = c->opt;
  if (!applicable) {
    printf("  %9s", "N/A");
    if (o->percentiles) printf("  %9s  %9s", "N/A", "N/A");
    printf("  %11s  %11s  %7s", "N/A", "N/A", "N/A");
    return -1;
  }
  double algbw = stats[0] > 0 ? (double)g->size / stats[0] / 1e3 : 0; /* B/us = MB/s */
  double busbw = algbw * perfBusFactor(op, c->nranks);
  printf("  %9.3f", stats[0]);
  if (o->percentiles) printf("  %9.3f  %9.3f", stats[1], stats[2]);
  printf("  %11.3f  %11.3f", algbw, busbw);
  if (o->check) printf("  %7llu", (unsigned long long)wrong);
  else printf("  %7s", "N/A");
  return busbw;
}

/* Runs every size of one op; returns the total #wrong over sizes, placements and ranks. */
static uint64_t perfRunOp(PerfCtx* c, int op) {
  const PerfOptions* o = c->opt;
  const PerfOpInfo* info = &perfOps[op];
  PerfCheck chk;
  if (perfCheckInit(&chk, o->type, info->isReduction, o->redop, c->nranks)) {
    fprintf(stderr, "ncclx-perf: out of memory\n");
    if (c->comm) ncclxCommAbort(c->comm);
    exit(1);
  }
  if (c->rank == 0) perfPrintHeader(c, op);
  uint64_t wrongTotal = 0;
  double busSum = 0;
  int busRows = 0;
  size_t lastCount = 0;
  for (size_t size = o->minBytes;; size *= o->factor) {
    PerfGeom g = perfGeometry(op, size, o->type->size, c->nranks);
    if (g.count > 0 && g.count != lastCount) {
      lastCount = g.count;
      /* stats: mean, p50, p99 per placement, max over ranks; wrong: summed over ranks. */
      double stats[6] = {0};
      uint64_t wrong[2] = {0, 0};
      int sets = o->inPlace ? 2 : 1;
      for (int s = 0; s < sets; s++) {
        if (s == 1 && !info->inPlace) continue;
        PerfTiming t = perfMeasure(c, op, &g, s == 1, &chk);
        stats[3 * s] = t.mean;
        stats[3 * s + 1] = t.p50;
        stats[3 * s + 2] = t.p99;
        wrong[s] = t.wrong;
      }
      PERF_CHECK(c, ncclxAllReduce(stats, stats, 6, ncclxFloat64, ncclxMax, c->comm, NULL));
      PERF_CHECK(c, ncclxAllReduce(wrong, wrong, 2, ncclxUint64, ncclxSum, c->comm, NULL));
      wrongTotal += wrong[0] + wrong[1];
      if (c->rank == 0) {
        printf("%12zu  %12zu  %8s  %6s  %5d", g.size, g.size / o->type->size, o->type->name,
               info->isReduction ? perfRedOpNames[o->redop] : "none",
               info->hasRoot ? o->root : -1);
        for (int s = 0; s < sets; s++) {
          double bw = perfPrintSet(c, op, &g, stats + 3 * s, wrong[s], s == 0 || info->inPlace);
          if (bw >= 0) {
            busSum += bw;
            busRows++;
          }
        }
        printf("\n");
        fflush(stdout);
      }
    }
    if (size > o->maxBytes / o->factor) break; /* the next size would pass -e (or overflow) */
  }
  if (c->rank == 0) {
    if (busRows == 0)
      printf("# no size in %zu..%zu bytes gives %s a whole %s element per call (%d ranks)\n",
             o->minBytes, o->maxBytes, info->name, o->type->name, c->nranks);
    printf("# Out of bounds values : %llu %s\n", (unsigned long long)wrongTotal,
           wrongTotal ? "FAILED" : "OK");
    printf("# Avg bus bandwidth : %.4f\n", busRows ? busSum / busRows : 0.0);
    fflush(stdout);
  }
  perfCheckFree(&chk);
  return wrongTotal;
}

/* -r is only known to be valid once the rank count is; prints from rank 0 (or rank < 0). */
static int perfRootValid(const PerfOptions* o, int nranks, int rank) {
  int needsRoot = 0;
  for (int i = 0; i < o->nops; i++) needsRoot |= perfOps[o->ops[i]].hasRoot;
  if (!needsRoot || o->root < nranks) return 1;
  if (rank <= 0)
    fprintf(stderr, "ncclx-perf: -r %d: root must be below the rank count %d\n", o->root, nranks);
  return 0;
}

/* Everything after the communicator exists. Returns the process exit status. */
static int perfRun(const PerfOptions* o, ncclxComm_t comm) {
  PerfCtx c = {.opt = o, .comm = comm, .rank = -1};
  PERF_CHECK(&c, ncclxCommUserRank(comm, &c.rank));
  PERF_CHECK(&c, ncclxCommCount(comm, &c.nranks));
  if (!perfRootValid(o, c.nranks, c.rank)) {
    PERF_CHECK(&c, ncclxCommDestroy(comm));
    return 2;
  }
  /* Every op's input and output fit in -e bytes (the size counts the larger of the two). */
  size_t bytes = o->maxBytes < 4096 ? 4096 : o->maxBytes;
  if (o->plainBuffers) {
    c.sendbuf = aligned_alloc(4096, (bytes + 4095) & ~(size_t)4095);
    c.recvbuf = aligned_alloc(4096, (bytes + 4095) & ~(size_t)4095);
  } else {
    PERF_CHECK(&c, ncclxMemAlloc(&c.sendbuf, bytes));
    PERF_CHECK(&c, ncclxMemAlloc(&c.recvbuf, bytes));
  }
  c.samples = malloc((size_t)o->iters * sizeof(double));
  if (!c.samples || !c.sendbuf || !c.recvbuf) {
    fprintf(stderr, "ncclx-perf: out of memory for %ld samples and two %zu-byte buffers\n", o->iters, bytes);
    ncclxCommAbort(comm);
    return 1;
  }
  if (c.rank == 0) setvbuf(stdout, NULL, _IOLBF, 0);
  int status = 0;
  if (o->mode == PERF_MODE_CALIBRATE) status = perfCalibrate(&c);
  else if (o->mode == PERF_MODE_TUNE) status = perfTune(&c);
  else if (o->mode == PERF_MODE_VERIFY) status = perfVerifyRules(&c, o->verifyPath);
  else {
    uint64_t wrong = 0;
    for (int i = 0; i < o->nops; i++) {
      if (i > 0 && c.rank == 0) printf("\n");
      wrong += perfRunOp(&c, o->ops[i]);
    }
    status = wrong ? 3 : 0;
  }
  free(c.samples);
  if (o->plainBuffers) {
    free(c.sendbuf);
    free(c.recvbuf);
  } else {
    PERF_CHECK(&c, ncclxMemFree(c.sendbuf));
    PERF_CHECK(&c, ncclxMemFree(c.recvbuf));
  }
  PERF_CHECK(&c, ncclxCommFinalize(comm));
  PERF_CHECK(&c, ncclxCommDestroy(comm));
  return status;
}

typedef struct {
  const PerfOptions* opt;
  ncclxUniqueId id;
} PerfForkArgs;

static int perfForkedRank(int rank, int nranks, void* arg) {
  PerfForkArgs* a = arg;
  ncclxComm_t comm = NULL;
  ncclxResult_t res = ncclxCommInitRank(&comm, nranks, a->id, rank);
  if (res != ncclxSuccess) perfFail("ncclxCommInitRank", res, NULL, rank);
  return perfRun(a->opt, comm);
}

/* A launcher already started several copies of us: -np would multiply them. */
static const char* perfLauncherSize(void) {
  /* Only variables a launched task has (not, e.g., an salloc shell's SLURM_NTASKS). */
  static const char* const vars[] = {"NCCLX_NRANKS", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE",
                                     "SLURM_STEP_NUM_TASKS", "WORLD_SIZE"};
  for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
    const char* v = getenv(vars[i]);
    if (v && atoi(v) > 1) return vars[i];
  }
  return NULL;
}

int main(int argc, char** argv) {
  PerfOptions opt;
  int parsed = perfParseArgs(argc, argv, &opt);
  if (parsed == 1) {
    perfUsage(stdout);
    return 0;
  }
  if (parsed < 0) {
    perfUsage(stderr);
    return 2;
  }
  if (opt.mode == PERF_MODE_CALIBRATE && !opt.outPath) opt.outPath = "ncclx-model.conf";
  if (opt.mode == PERF_MODE_TUNE && !opt.outPath) opt.outPath = "ncclx-tuner.rules";
  if (opt.mode == PERF_MODE_TUNE || opt.mode == PERF_MODE_VERIFY) {
    /* The baseline is the core's own model: no tuner plugin and no NCCLX_ALGO on the first
     * communicator (--verify adds the rules tuner on a second one). */
    if (getenv("NCCLX_ALGO") && *getenv("NCCLX_ALGO"))
      fprintf(stderr, "ncclx-perf: NCCLX_ALGO=%s ignored by --tune/--verify\n", getenv("NCCLX_ALGO"));
    unsetenv("NCCLX_ALGO");
    setenv("NCCLX_TUNER_PLUGIN", "none", 1);
  }
  if (opt.nprocs > 0) {
    const char* var = perfLauncherSize();
    if (var) {
      fprintf(stderr, "ncclx-perf: -np %d cannot be combined with a launcher (%s=%s); "
              "drop -np to use the launcher's ranks\n", opt.nprocs, var, getenv(var));
      return 2;
    }
    if (!perfRootValid(&opt, opt.nprocs, -1)) return 2;
    PerfForkArgs a = {.opt = &opt};
    ncclxResult_t res = ncclxGetUniqueId(&a.id);
    if (res != ncclxSuccess) perfFail("ncclxGetUniqueId", res, NULL, -1);
    return perfLaunch(opt.nprocs, opt.timeoutSec, perfForkedRank, &a);
  }
  ncclxComm_t comm = NULL;
  ncclxResult_t res = ncclxCommInitFromEnv(&comm);
  if (res != ncclxSuccess) {
    const char* detail = ncclxGetLastError(NULL);
    fprintf(stderr, "ncclx-perf: ncclxCommInitFromEnv failed: %s: %s\n",
            ncclxGetErrorString(res), detail && *detail ? detail : "(no detail)");
    fprintf(stderr, "ncclx-perf: run under mpirun/srun/torchrun (or set NCCLX_RANK and "
            "NCCLX_NRANKS) with NCCLX_COMM_ID=host:port, or pass -np N to fork local ranks\n");
    return 1;
  }
  return perfRun(&opt, comm);
}
