/* ncclx-perf --tune and --verify.
 *
 * --tune: for each collective, every algorithm that can run on this communicator (forced
 * through the core's tool hook) and the default tuner's own choice are timed at each size,
 * alternately within each iteration so that load changes hit them alike; per size the
 * median over -n iterations (max over ranks) decides the winner. Adjacent sizes with the
 * same winner become one rule; the rules file is for libncclx-tuner-rules.so.
 *
 * --verify FILE: for each size, two fresh communicators are split from the first, one with
 * the default tuner and one with the rules tuner reading FILE; they are timed alternately,
 * and the ratio rules/default is printed per size.
 * Included by ncclx-perf.c only. */
#ifndef NCCLX_PERF_TUNE_H
#define NCCLX_PERF_TUNE_H

#include <limits.h>
#include <stdarg.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "ncclx/tuner.h"
#include "perf_calib.h"
#include "perf_hooks.h"
#include "perf_ops.h"

static int perfCollOf(int op) {
  switch (op) {
    case PERF_ALLREDUCE: return NCCLX_COLL_ALLREDUCE;
    case PERF_BROADCAST: return NCCLX_COLL_BROADCAST;
    case PERF_REDUCE: return NCCLX_COLL_REDUCE;
    case PERF_ALLGATHER: return NCCLX_COLL_ALLGATHER;
    case PERF_REDUCESCATTER: return NCCLX_COLL_REDUCESCATTER;
    case PERF_ALLTOALL: return NCCLX_COLL_ALLTOALL;
    default: return -1;
  }
}

/* A growing text buffer for the rules file. */
typedef struct {
  char* text;
  size_t len, cap;
} PerfText;

__attribute__((format(printf, 2, 3))) static void perfAppend(PerfText* t, const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int need = vsnprintf(NULL, 0, fmt, ap);
  va_end(ap);
  if (need < 0) return;
  if (t->len + (size_t)need + 1 > t->cap) {
    size_t cap = (t->cap + (size_t)need + 1) * 2;
    char* grown = realloc(t->text, cap);
    if (!grown) {
      fprintf(stderr, "ncclx-perf: out of memory\n");
      exit(1);
    }
    t->text = grown;
    t->cap = cap;
  }
  va_start(ap, fmt);
  vsnprintf(t->text + t->len, t->cap - t->len, fmt, ap);
  va_end(ap);
  t->len += (size_t)need;
}

/* The sizes the size loop visits with a whole element per call, in order (count deduped as
 * in the benchmark). Returns how many. */
static int perfTuneSizes(const PerfCtx* c, int op, PerfGeom* out, int max) {
  const PerfOptions* o = c->opt;
  int n = 0;
  size_t lastCount = 0;
  for (size_t size = o->minBytes;; size *= o->factor) {
    PerfGeom g = perfGeometry(op, size, o->type->size, c->nranks);
    if (g.count > 0 && g.count != lastCount && n < max) out[n++] = g, lastCount = g.count;
    if (size > o->maxBytes / o->factor) break;
  }
  return n;
}

/* Times `ncols` variants of one op at one size, alternately: before each call, setup(col)
 * selects the variant (forced algorithm or communicator). Returns the median per variant in
 * med[] (max over ranks) and the number of wrong elements of a checked call of each. */
typedef ncclxComm_t (*PerfSelect)(void* arg, int col);

static uint64_t perfTimeVariants(PerfCtx* c, int op, const PerfGeom* g, const PerfCheck* chk,
                                 int ncols, PerfSelect select, void* arg, double* med) {
  const PerfOptions* o = c->opt;
  uint64_t wrong = 0;
  double* samples = malloc((size_t)ncols * (size_t)o->iters * sizeof(double));
  if (!samples) {
    fprintf(stderr, "ncclx-perf: out of memory\n");
    ncclxCommAbort(c->comm);
    exit(1);
  }
  PerfCtx v = *c;
  if (o->check)
    for (int col = 0; col < ncols; col++) {
      v.comm = select(arg, col);
      perfPrepare(&v, op, g, 0, chk, 1);
      perfIssue(&v, op, g->count, 0);
      wrong += perfVerify(&v, op, g, 0, chk);
    }
  perfPrepare(c, op, g, 0, chk, 0);
  for (long k = 0; k < o->warmup; k++)
    for (int col = 0; col < ncols; col++) {
      v.comm = select(arg, col);
      perfIssue(&v, op, g->count, 0);
    }
  for (long k = 0; k < o->iters; k++)
    for (int i = 0; i < ncols; i++) {
      /* Odd iterations go in reverse, so no variant always follows the same one. */
      int col = k % 2 ? ncols - 1 - i : i;
      v.comm = select(arg, col);
      PERF_CHECK(&v, ncclxBarrier(v.comm, NULL));
      double t0 = perfNowUs();
      perfIssue(&v, op, g->count, 0);
      samples[(size_t)col * (size_t)o->iters + (size_t)k] = perfNowUs() - t0;
    }
  for (int col = 0; col < ncols; col++) med[col] = perfMedian(samples + (size_t)col * (size_t)o->iters, o->iters);
  free(samples);
  PERF_CHECK(c, ncclxAllReduce(med, med, (size_t)ncols, ncclxFloat64, ncclxMax, c->comm, NULL));
  PERF_CHECK(c, ncclxAllReduce(&wrong, &wrong, 1, ncclxUint64, ncclxSum, c->comm, NULL));
  return wrong;
}

/* ---------------- --tune ---------------- */

typedef struct {
  ncclxComm_t comm;
  int coll;
  const int* algos; /* algorithm per column; -1 = the default tuner's choice */
} PerfForceArg;

static ncclxComm_t perfForceSelect(void* arg, int col) {
  PerfForceArg* a = arg;
  ncclxTuneToolForceAlgo(a->coll, a->algos[col]);
  return a->comm;
}

/* Where one winner's range ends and the next begins: the geometric midpoint of the last
 * size of the one and the first of the other (sizes are swept on a log scale). */
static size_t perfBoundary(size_t lastOfA, size_t firstOfB) {
  double mid = sqrt((double)lastOfA * (double)firstOfB);
  size_t b = (size_t)ceil(mid);
  return b <= lastOfA ? lastOfA + 1 : b;
}

/* Sweeps one op; appends its rules. Returns the wrong elements seen. */
static uint64_t perfTuneOp(PerfCtx* c, int op, int nhosts, PerfText* rules) {
  const PerfOptions* o = c->opt;
  int coll = perfCollOf(op);
  int algos[NCCLX_NUM_ALGOS + 1], nalg = 0;
  for (int a = 0; a < NCCLX_NUM_ALGOS; a++)
    if (ncclxTuneToolAlgoSupported(c->comm, coll, a)) algos[nalg++] = a;
  if (c->rank == 0 && nalg < 2) {
    printf("# %s: only %s can run on %d ranks: nothing to tune, no rule\n\n", perfOps[op].name,
           nalg ? ncclxAlgoName(algos[0]) : "no algorithm", c->nranks);
    fflush(stdout);
  }
  if (nalg < 2) return 0;
  algos[nalg] = -1; /* last column: the default tuner */
  int ncols = nalg + 1;
  PerfCheck chk;
  if (perfCheckInit(&chk, o->type, perfOps[op].isReduction, o->redop, c->nranks)) {
    fprintf(stderr, "ncclx-perf: out of memory\n");
    exit(1);
  }
  PerfGeom sizes[PERF_MAX_SIZES];
  int nsizes = perfTuneSizes(c, op, sizes, PERF_MAX_SIZES);
  int winners[PERF_MAX_SIZES];
  if (c->rank == 0) {
    printf("# --tune %s: nranks %d, nhosts %d, median of %ld (us, max over ranks), load average %s\n",
           perfOps[op].name, c->nranks, nhosts, o->iters, perfLoadAvg());
    printf("#%11s", "size(B)");
    for (int i = 0; i < nalg; i++) printf("  %18s", ncclxAlgoName(algos[i]));
    printf("  %10s  %-18s  %14s  %s\n", "default", "winner", "default/winner", "rule");
  }
  PerfForceArg arg = {c->comm, coll, algos};
  uint64_t wrong = 0;
  for (int s = 0; s < nsizes; s++) {
    double med[NCCLX_NUM_ALGOS + 1];
    wrong += perfTimeVariants(c, op, &sizes[s], &chk, ncols, perfForceSelect, &arg, med);
    int best = 0;
    for (int i = 1; i < nalg; i++)
      if (med[i] < med[best]) best = i;
    /* A rule only where the winner clearly beats the default tuner: within the margin the
     * difference is noise, and the default's own choice is the safer one to keep. */
    double gain = med[best] > 0 ? med[nalg] / med[best] : 1.0;
    winners[s] = gain > 1.0 + o->tolerance / 2 ? algos[best] : -1;
    if (c->rank == 0) {
      printf("%12zu", sizes[s].size);
      for (int i = 0; i < nalg; i++) printf("  %18.2f", med[i]);
      printf("  %10.2f  %-18s  %14.2f  %s\n", med[nalg], ncclxAlgoName(algos[best]), gain,
             winners[s] >= 0 ? ncclxAlgoName(winners[s]) : "(default)");
      fflush(stdout);
    }
  }
  ncclxTuneToolForceAlgo(coll, -1);
  perfCheckFree(&chk);
  /* Merge runs of one winner: [0 or the boundary, next boundary - 1], the last one open.
   * Runs where the default stays (-1) get no rule. */
  for (int s = 0; s < nsizes;) {
    int e = s;
    while (e + 1 < nsizes && winners[e + 1] == winners[s]) e++;
    if (winners[s] < 0) {
      s = e + 1;
      continue;
    }
    char lo[32], hi[32];
    snprintf(lo, sizeof lo, "%zu", s == 0 ? (size_t)0 : perfBoundary(sizes[s - 1].size, sizes[s].size));
    if (e + 1 < nsizes) snprintf(hi, sizeof hi, "%zu", perfBoundary(sizes[e].size, sizes[e + 1].size) - 1);
    else snprintf(hi, sizeof hi, "any");
    char name[32], algo[32];
    snprintf(name, sizeof name, "%s,", perfOps[op].name);
    snprintf(algo, sizeof algo, "%s,", ncclxAlgoName(winners[s]));
    strcat(lo, ","), strcat(hi, ",");
    perfAppend(rules, "%-14s %-9s %-9s %-19s simple, 0, 0, %d, %d\n", name, lo, hi, algo, nhosts,
               c->nranks);
    s = e + 1;
  }
  if (c->rank == 0) printf("# %s: %s\n\n", perfOps[op].name, wrong ? "WRONG RESULTS" : "results checked, OK");
  return wrong;
}

static int perfVerifyRules(PerfCtx* c, const char* path);

static int perfTune(PerfCtx* c) {
  const PerfOptions* o = c->opt;
  int nhosts = 1, tp = 0;
  if (ncclxTuneToolCommTopo(c->comm, &nhosts, &tp, NULL, NULL) != 0) {
    fprintf(stderr, "ncclx-perf: cannot read the communicator's topology\n");
    ncclxCommAbort(c->comm);
    exit(1);
  }
  PerfText rules = {0};
  char host[64] = "?";
  gethostname(host, sizeof host - 1);
  time_t now = time(NULL);
  char when[32];
  strftime(when, sizeof when, "%Y-%m-%d %H:%M:%S UTC", gmtime(&now));
  perfAppend(&rules, "# ncclx tuner rules, written by ncclx-perf --tune on %s at %s\n", host, when);
  perfAppend(&rules, "# %d ranks, %d host(s), model transport %s, sizes %zu..%zu x%zu, median of %ld, "
             "load average %s\n", c->nranks, nhosts, tp == PERF_TP_SHM ? "shm" : "net",
             o->minBytes, o->maxBytes, o->factor, o->iters, perfLoadAvg());
  perfAppend(&rules, "# Use: [tuner] plugin = rules, [tuner.rules] file = PATH\n"
             "# (or NCCLX_TUNER_PLUGIN=rules NCCLX_TUNER_RULES_FILE=PATH)\n"
             "# collective, min bytes, max bytes, algorithm, protocol, chunk, channels, hosts, ranks\n");
  uint64_t wrong = 0;
  for (int i = 0; i < o->nops; i++) wrong += perfTuneOp(c, o->ops[i], nhosts, &rules);
  int32_t status = wrong ? 3 : 0;
  if (c->rank == 0 && !wrong) {
    FILE* f = fopen(o->outPath, "w");
    if (!f || fputs(rules.text ? rules.text : "", f) < 0 || fclose(f) != 0) {
      fprintf(stderr, "ncclx-perf: cannot write the rules to '%s': %s\n", o->outPath, strerror(errno));
      status = 1;
    } else {
      printf("# wrote %s:\n%s", o->outPath, rules.text);
    }
    fflush(stdout);
  }
  free(rules.text);
  PERF_CHECK(c, ncclxBroadcast(&status, &status, 1, ncclxInt32, 0, c->comm, NULL));
  if (status == 0 && o->verify) return perfVerifyRules(c, o->outPath);
  return status;
}

/* ---------------- --verify ---------------- */

typedef struct {
  ncclxComm_t comms[2]; /* default tuner, rules tuner */
} PerfPairArg;

static ncclxComm_t perfPairSelect(void* arg, int col) { return ((PerfPairArg*)arg)->comms[col]; }

/* A communicator with the same ranks whose tuner is the rules plugin reading `path`, or
 * none when path is NULL. The plugin and its file are chosen from the environment when a
 * communicator is created. Both sides of the comparison are made this way, so neither
 * carries the history (connections, scratch, a sweep) of the first communicator. */
static ncclxComm_t perfTunerComm(PerfCtx* c, const char* path) {
  char abs[PATH_MAX];
  if (path && !realpath(path, abs)) snprintf(abs, sizeof abs, "%s", path);
  setenv("NCCLX_TUNER_PLUGIN", path ? "rules" : "none", 1);
  if (path) setenv("NCCLX_TUNER_RULES_FILE", abs, 1);
  ncclxComm_t rc = NULL;
  PERF_CHECK(c, ncclxCommSplit(c->comm, 0, c->rank, &rc, NULL));
  setenv("NCCLX_TUNER_PLUGIN", "none", 1);
  if (!path) return rc;
  const char* name = NULL;
  ncclxTuneToolCommTopo(rc, NULL, NULL, NULL, &name);
  int32_t loaded = name && strcmp(name, "rules") == 0;
  PERF_CHECK(c, ncclxAllReduce(&loaded, &loaded, 1, ncclxInt32, ncclxMin, c->comm, NULL));
  if (!loaded) {
    if (c->rank == 0)
      fprintf(stderr, "ncclx-perf: --verify: the rules tuner did not start with %s (see the WARN "
              "lines above: plugin not found, or an invalid rule)\n", abs);
    ncclxCommDestroy(rc);
    return NULL;
  }
  return rc;
}

static int perfVerifyRules(PerfCtx* c, const char* path) {
  const PerfOptions* o = c->opt;
  int slower = 0;
  double worst = 0;
  size_t worstSize = 0;
  const char* worstOp = "";
  uint64_t wrong = 0;
  if (c->rank == 0)
    printf("# --verify %s: rules tuner vs default tuner, alternately, median of %ld (us, max over "
           "ranks), nranks %d, load average %s\n", path, o->iters, c->nranks, perfLoadAvg());
  for (int i = 0; i < o->nops; i++) {
    int op = o->ops[i];
    PerfCheck chk;
    if (perfCheckInit(&chk, o->type, perfOps[op].isReduction, o->redop, c->nranks)) exit(1);
    PerfGeom sizes[PERF_MAX_SIZES];
    int nsizes = perfTuneSizes(c, op, sizes, PERF_MAX_SIZES);
    if (c->rank == 0)
      printf("#%-13s %12s  %12s  %12s  %7s\n", "op", "size(B)", "default(us)", "rules(us)", "ratio");
    for (int s = 0; s < nsizes; s++) {
      /* A fresh pair per size: what ran before (other algorithms, other sizes) leaves
       * state in the transports that can make the next calls of one side slower. */
      PerfPairArg arg = {{perfTunerComm(c, NULL), perfTunerComm(c, path)}};
      if (!arg.comms[1]) {
        PERF_CHECK(c, ncclxCommDestroy(arg.comms[0]));
        perfCheckFree(&chk);
        return 1;
      }
      double med[2];
      wrong += perfTimeVariants(c, op, &sizes[s], &chk, 2, perfPairSelect, &arg, med);
      double ratio = med[0] > 0 ? med[1] / med[0] : 1.0;
      int bad = ratio > 1.0 + o->tolerance;
      slower += bad;
      if (ratio > worst) worst = ratio, worstSize = sizes[s].size, worstOp = perfOps[op].name;
      if (c->rank == 0) {
        printf(" %-13s %12zu  %12.2f  %12.2f  %7.3f%s\n", perfOps[op].name, sizes[s].size, med[0],
               med[1], ratio, bad ? "  SLOWER" : "");
        fflush(stdout);
      }
      PERF_CHECK(c, ncclxCommDestroy(arg.comms[0]));
      PERF_CHECK(c, ncclxCommDestroy(arg.comms[1]));
    }
    perfCheckFree(&chk);
  }
  if (c->rank == 0) {
    printf("# verify: worst ratio %.3f (%s, %zu bytes); %d size(s) slower than 1 + %.2f; %s\n",
           worst, worstOp, worstSize, slower, o->tolerance,
           wrong ? "WRONG RESULTS" : "results checked, OK");
    fflush(stdout);
  }
  return wrong ? 3 : slower ? 4 : 0;
}

#endif
