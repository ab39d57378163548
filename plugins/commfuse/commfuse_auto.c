/* CommFuse's automatic schedule (NCCLX_FUSE_AUTO): the library picks SEQUENTIAL, SLICED(k),
 * RING_P2P(p) or DIRECT_P2P per call shape from two times per block:
 *
 *   T  moving one block to a ring neighbour: the tuner's cost model (alpha + bytes x beta of
 *      the link the call's steps use, calibrated by ncclx-perf --calibrate);
 *   C  computing one block: the callbacks' own time on earlier calls of the same shape, the
 *      least of the calls since the last agreement (a rank preempted on a shared CPU only
 *      ever looks slower), measured on every rank, the slowest rank's (ranks must pick the
 *      same schedule).
 *
 * The first call of a shape has no measurement: it guesses C = T (compute and communication
 * alike, where overlap pays most). After it the ranks exchange their times over the
 * bootstrap (an all-gather of two doubles: compute and whole-call time) and the model ranks
 * the schedules. With [core] fuse_auto_explore (default on) the model's two best and
 * SEQUENTIAL then run FUSE_AUTO_TRIAL_CALLS calls each, the ranks compare the slowest rank's
 * call times after each, and the fastest is kept; off, the model's first is kept. Every
 * FUSE_AUTO_AGREE_EVERY calls the ranks compare compute times again and explore anew when
 * it moved by FUSE_AUTO_DRIFT. Every step depends only on call counts and agreed values, so
 * every rank runs the same schedule on every call without any other exchange.
 *
 * Estimated times of one call on n ranks (a is the link's alpha, the cost of one more
 * message; Tq = a + (T - a) / q is a piece of 1/q of a block):
 *   SEQUENTIAL   (n-1) T + n C
 *   SLICED(k)    (n-1) Tk + (k-1) max((n-1) Tk, n C / k) + n C / k
 *   RING_P2P(p)  max(n C, C + (n-1) p Tp) + min(Tp, C / p)
 *   DIRECT_P2P   RING_P2P(1) plus (n-1) a: a helper thread posts each step
 * An overlapping schedule is taken only when it beats SEQUENTIAL by 10% (what the model
 * leaves out, flows and smaller GEMMs, costs about that). The all-to-all has one
 * overlapping schedule worth choosing: RING_P2P. A tuner plugin with
 * the optional ncclxTunerFuse_v1 entry may pin the choice (tuner.h). */
#include <stdlib.h>
#include <string.h>

#include "commfuse_internal.h"

#define FUSE_AUTO_SHAPES 16      /* call shapes remembered per communicator */
#define FUSE_AUTO_AGREE_EVERY 8 /* calls between agreements once a shape has settled: layers of
                                  * one transfer shape may compute different amounts */
#define TAG_FUSE_AUTO 1 /* oobAllGather tag of the agreement */
#define FUSE_AUTO_OVERLAP_GAIN 0.90 /* an overlapping schedule must beat SEQUENTIAL by 10% */
#define FUSE_AUTO_CANDIDATES 3      /* schedules measured per shape: the model's two best, SEQUENTIAL */
#define FUSE_AUTO_TRIAL_CALLS 2     /* calls each candidate runs before the ranks compare times */
#define FUSE_AUTO_DRIFT 0.25        /* compute this much off the explored value: measure again */

enum { PHASE_GUESS, PHASE_EXPLORE, PHASE_SETTLED };

struct fuseAutoShape {
  int kind;
  size_t count, typeSize, unit;
  uint64_t calls;
  int phase;             /* PHASE_* */
  uint64_t nextAgree;    /* the call count after which the ranks exchange their times */
  double localComputeUs; /* this rank's least callback time per call since the last agreement */
  double localCallUs;    /* this rank's least time of a whole call, likewise */
  double exploredComputeUs; /* the agreed compute time the settled choice was measured at */
  ncclxFuseSchedule_t cand[FUSE_AUTO_CANDIDATES];
  double candUs[FUSE_AUTO_CANDIDATES];
  int ncand, cur;
  ncclxFuseSchedule_t chosen;
  uint64_t lastUse;
};

struct fuseAutoTable {
  struct fuseAutoShape shapes[FUSE_AUTO_SHAPES];
  int n;
  uint64_t clock;
};

static struct fuseAutoShape* findShape(const fuseOp* f) {
  struct fuseCommState* cs = fuseCommState(f->comm);
  if (!cs) return NULL;
  if (!cs->autoTable && !(cs->autoTable = calloc(1, sizeof(*cs->autoTable)))) return NULL;
  struct fuseAutoTable* t = cs->autoTable;
  t->clock++;
  struct fuseAutoShape* oldest = &t->shapes[0];
  for (int i = 0; i < t->n; i++) {
    struct fuseAutoShape* s = &t->shapes[i];
    if (s->kind == (int)f->kind && s->count == f->count && s->typeSize == f->typeSize && s->unit == f->sched.unit) {
      s->lastUse = t->clock;
      return s;
    }
    if (s->lastUse < oldest->lastUse) oldest = s;
  }
  /* Every rank makes the same calls, so every rank evicts the same shape. */
  struct fuseAutoShape* s = t->n < FUSE_AUTO_SHAPES ? &t->shapes[t->n++] : oldest;
  *s = (struct fuseAutoShape){.kind = (int)f->kind, .count = f->count, .typeSize = f->typeSize,
                              .unit = f->sched.unit, .nextAgree = 1, .localComputeUs = -1, .localCallUs = -1,
                              .lastUse = t->clock};
  return s;
}

/* [core] fuse_auto_explore (default on): measure the model's best candidates on the first
 * calls of each shape and keep the fastest; off, the model alone decides. */
static int exploreOn(void) {
  static int cached = -1;
  int v = __atomic_load_n(&cached, __ATOMIC_RELAXED);
  if (v < 0) {
    /* The core validated the value when it loaded the file: a boolean. */
    const char* s = fuseCore->configGet("core", "fuse_auto_explore");
    v = !s || !(s[0] == '0' || s[0] == 'f' || s[0] == 'F' || s[0] == 'n' || s[0] == 'N' ||
                ((s[0] == 'o' || s[0] == 'O') && (s[1] == 'f' || s[1] == 'F')));
    __atomic_store_n(&cached, v, __ATOMIC_RELAXED);
  }
  return v;
}

static double nonNegative(double x) { return x > 0 ? x : 0; }
static double maxd(double a, double b) { return a > b ? a : b; }
static double mind(double a, double b) { return a < b ? a : b; }

/* Estimated microseconds of one call under schedule (algo, k); see the file comment. */
double fuseAutoEstimate(int algo, int k, int n, double blockUs, double alphaUs, double computeUs) {
  double T = blockUs, C = computeUs / n, a = alphaUs;
  double Tk = a + nonNegative(T - a) / k;
  switch (algo) {
    case ncclxFuseSequential: return (n - 1) * T + n * C;
    case ncclxFuseSliced: return (n - 1) * Tk + (k - 1) * maxd((n - 1) * Tk, n * C / k) + n * C / k;
    case ncclxFuseRingP2P: return maxd(n * C, C + (n - 1) * k * Tk) + mind(Tk, C / k);
    case ncclxFuseDirectP2P: return maxd(n * C, C + (n - 1) * T) + mind(T, C) + (n - 1) * a;
    default: return -1;
  }
}

/* Moving one block to a ring neighbour, by the cost model (or the emulated link, if slower);
 * *alphaUs gets the link's per-message cost. */
static double blockTransferUs(const fuseOp* f, double* alphaUs) {
  double alpha, beta;
  fuseCore->linkCost(f->comm, &alpha, &beta);
  double bytes = (double)f->count * (double)f->typeSize;
  double us = alpha + bytes * beta;
  if (f->sched.linkBytesPerSec > 0) us = maxd(us, bytes / f->sched.linkBytesPerSec * 1e6);
  if (alphaUs) *alphaUs = alpha;
  return us;
}

/* The model's ranking: out[0] its choice (an overlapping schedule only when it beats
 * SEQUENTIAL by FUSE_AUTO_OVERLAP_GAIN), then the runner-up, then SEQUENTIAL if not listed.
 * Returns how many (1..FUSE_AUTO_CANDIDATES). */
static int rank(const fuseOp* f, double computeUs, ncclxFuseSchedule_t* out) {
  int n = f->info.nranks;
  ncclxFuseSchedule_t base = NCCLX_FUSE_RING_P2P_PIECES(1);
  base.unit = f->sched.unit;
  base.linkBytesPerSec = f->sched.linkBytesPerSec;
  out[0] = base;
  if (f->kind == FUSE_A2A || n < 2) return 1;
  double alphaUs;
  double blockUs = blockTransferUs(f, &alphaUs);
  size_t units = f->count / f->sched.unit;
  static const struct { int algo, k; } cands[] = {
      {ncclxFuseSequential, 1}, {ncclxFuseSliced, 2}, {ncclxFuseSliced, 4}, {ncclxFuseRingP2P, 1},
      {ncclxFuseRingP2P, 2},    {ncclxFuseRingP2P, 4}, {ncclxFuseDirectP2P, 1}};
  enum { NC = sizeof(cands) / sizeof(cands[0]) };
  double us[NC];
  int order[NC], m = 0;
  for (int i = 0; i < NC; i++) {
    if ((size_t)cands[i].k > units) continue;
    us[i] = fuseAutoEstimate(cands[i].algo, cands[i].k, n, blockUs, alphaUs, computeUs);
    int j = m++; /* insertion sort, ties keep the earlier (fewer pieces, fewer messages) */
    while (j > 0 && us[order[j - 1]] > us[i] * 1.001) order[j] = order[j - 1], j--;
    order[j] = i;
  }
  if (m == 0) { /* an empty block (no unit fits): nothing to overlap */
    out[0].algo = ncclxFuseSequential;
    out[0].slices = 1;
    return 1;
  }
  /* Overlap costs what the model leaves out (flows, smaller GEMMs): it must win clearly. */
  if (order[0] != 0 && us[order[0]] > FUSE_AUTO_OVERLAP_GAIN * us[0]) {
    for (int j = 0; j < m; j++)
      if (order[j] == 0) {
        memmove(&order[1], &order[0], sizeof(int) * (size_t)j);
        order[0] = 0;
        break;
      }
  }
  int nout = 0, haveSeq = 0;
  for (int j = 0; j < m && nout < FUSE_AUTO_CANDIDATES - 1; j++) {
    out[nout] = base;
    out[nout].algo = (ncclxFuseAlgo_t)cands[order[j]].algo;
    out[nout].slices = cands[order[j]].k;
    haveSeq |= order[j] == 0;
    nout++;
  }
  if (!haveSeq) {
    out[nout] = base;
    out[nout].algo = ncclxFuseSequential;
    out[nout].slices = 1;
    nout++;
  }
  return nout;
}

static ncclxFuseSchedule_t pick(const fuseOp* f, double computeUs) {
  ncclxFuseSchedule_t c[FUSE_AUTO_CANDIDATES];
  (void)rank(f, computeUs, c);
  return c[0];
}

/* A tuner plugin's pin, if it has the optional fuse entry and answers for this shape. */
static int pinnedByTuner(const fuseOp* f, ncclxFuseSchedule_t* out) {
  void* tunerCtx = NULL;
  const ncclxTunerFuse_v1_t* fuse = fuseCore->tunerFuse(f->comm, &tunerCtx);
  if (!fuse || !fuse->getFuseSchedule) return 0;
  ncclxTunerFuseQuery_v1_t q = {.kind = (int)f->kind, .bytes = f->count * f->typeSize, .nranks = f->info.nranks,
                                .nhosts = f->info.nhosts};
  int algo = -1, pieces = 0;
  if (fuse->getFuseSchedule(tunerCtx, &q, &algo, &pieces) != ncclxSuccess || algo < 0 ||
      algo >= ncclxFuseAuto)
    return 0;
  out->algo = (ncclxFuseAlgo_t)algo;
  out->slices = algo == ncclxFuseSliced || algo == ncclxFuseRingP2P ? (pieces > 0 ? pieces : 1) : 1;
  return 1;
}

void fuseAutoResolve(fuseOp* f) {
  f->autoShape = NULL;
  if (f->sched.algo != ncclxFuseAuto) return;
  struct fuseAutoShape* s = findShape(f);
  ncclxFuseSchedule_t chosen;
  if (s && s->calls > 0) {
    chosen = s->chosen;
  } else {
    /* First call of the shape: no measurement; guess compute = communication. */
    chosen = pick(f, f->info.nranks * blockTransferUs(f, NULL));
  }
  ncclxFuseSchedule_t pinned = chosen;
  if (pinnedByTuner(f, &pinned)) chosen = pinned;
  chosen.unit = f->sched.unit;
  chosen.linkBytesPerSec = f->sched.linkBytesPerSec;
  if (s && s->calls == 0) s->chosen = chosen;
  f->sched = chosen;
  f->autoShape = s;
  f->computeSec = 0;
  f->autoStart = fuseNow();
}

/* Start measuring the model's candidates for the agreed compute time. */
static void explore(fuseOp* f, struct fuseAutoShape* s, double computeUs) {
  s->ncand = exploreOn() ? rank(f, computeUs, s->cand) : 1;
  if (!exploreOn()) s->cand[0] = pick(f, computeUs);
  s->cur = 0;
  s->chosen = s->cand[0];
  s->exploredComputeUs = computeUs;
  s->phase = s->ncand > 1 ? PHASE_EXPLORE : PHASE_SETTLED;
}

/* The agreed times (slowest rank's) are in: move on. Same inputs on every rank, same steps. */
static void advance(fuseOp* f, struct fuseAutoShape* s, double computeUs, double callUs) {
  ncclxFuseSchedule_t before = s->chosen;
  if (s->phase == PHASE_GUESS) {
    explore(f, s, computeUs);
  } else if (s->phase == PHASE_EXPLORE) {
    s->candUs[s->cur++] = callUs;
    if (s->cur < s->ncand) {
      s->chosen = s->cand[s->cur];
    } else {
      int best = 0;
      for (int i = 1; i < s->ncand; i++)
        if (s->candUs[i] < s->candUs[best]) best = i;
      s->chosen = s->cand[best];
      s->phase = PHASE_SETTLED;
    }
  } else if (computeUs > (1 + FUSE_AUTO_DRIFT) * s->exploredComputeUs + 1 ||
             computeUs < (1 - FUSE_AUTO_DRIFT) * s->exploredComputeUs - 1) {
    explore(f, s, computeUs); /* the compute changed (another layer of the same shape) */
  }
  s->nextAgree = s->calls + (s->phase == PHASE_EXPLORE ? FUSE_AUTO_TRIAL_CALLS : FUSE_AUTO_AGREE_EVERY);
  if (s->chosen.algo != before.algo || s->chosen.slices != before.slices)
    FUSE_INFO(NCCLX_LOG_TUNING, "%s: count %zu: compute %.1f us, call %.1f us (slowest rank): %s %s(%d)", f->name,
         f->count, computeUs, callUs, s->phase == PHASE_EXPLORE ? "trying" : "settled on",
         fuseAlgoName(s->chosen.algo), s->chosen.slices);
}

ncclxResult_t fuseAutoRecord(fuseOp* f, ncclxResult_t res) {
  struct fuseAutoShape* s = f->autoShape;
  if (!s || res != ncclxSuccess) return res;
  double computeUs = f->computeSec * 1e6, callUs = (fuseNow() - f->autoStart) * 1e6;
  s->localComputeUs = s->localComputeUs < 0 ? computeUs : mind(s->localComputeUs, computeUs);
  s->localCallUs = s->localCallUs < 0 ? callUs : mind(s->localCallUs, callUs);
  if (++s->calls < s->nextAgree) return res;
  int n = f->info.nranks, r = f->info.rank;
  double* all = malloc(2 * sizeof(double) * (size_t)n);
  if (!all) return fuseCore->fail(f->comm, ncclxSystemError, "%s #%llu: out of memory choosing a schedule", f->name,
                            (unsigned long long)f->seq);
  all[2 * r] = s->localComputeUs;
  all[2 * r + 1] = s->localCallUs;
  res = fuseCore->oobAllGather(f->comm, all, 2 * sizeof(double), TAG_FUSE_AUTO);
  if (res == ncclxSuccess) {
    double compute = 0, call = 0;
    for (int i = 0; i < n; i++) compute = maxd(compute, all[2 * i]), call = maxd(call, all[2 * i + 1]);
    s->localComputeUs = s->localCallUs = -1; /* the next agreement looks at the calls from here on */
    advance(f, s, compute, call);
  }
  free(all);
  return res;
}
