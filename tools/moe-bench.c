/* moe-bench: one decode-like MoE step, the dynamic path against the host-synchronized one,
 * in the same run (public API only).
 *
 *   moe-bench -np 4                          fork 4 local ranks, the default sweep
 *   moe-bench -np 8 -e 16 -r skewed -t 1,8,32 -l 4
 *   NCCLX_COMM_ID=host:port mpirun -np 4 moe-bench
 *
 * A step: the router (a host function on a stream, standing in for the router kernel) picks
 * top-k experts per token; the tokens go to the ranks owning those experts; the experts run
 * (a copy of their rows, the same in both paths); the outputs come back and are summed with
 * the router weights. The two paths:
 *
 *   dynamic  router, ncclxMoeDispatch, experts, ncclxMoeCombine all queued on the stream,
 *            then one ncclxStreamSynchronize at the end of the step.
 *   sync     router on the stream, ncclxStreamSynchronize (the bubble: the host reads the
 *            routing only after it), pack on the host, ncclxAllToAll of the per-expert counts,
 *            displacements on the host, ncclxAllToAllv of the rows, regroup them by expert (a
 *            copy; skipped when a rank owns one expert), experts, the reverse copy,
 *            ncclxAllToAllv back, weighted sum; every call on stream NULL (the calling thread:
 *            ncclx's lowest-latency mode, the best host-synchronized path on a CPU).
 *   syncst   the same synchronization as a GPU program does it: router and pack on the
 *            stream, ncclxStreamSynchronize, the count ncclxAllToAll and the displacements on
 *            the host, then the data path queued on the stream (ncclxAllToAllv, regroup,
 *            experts, ncclxAllToAllv back, weighted sum) behind which the next layer's
 *            router and pack queue before the next synchronize.
 *            All paths hand the experts the same layout (rows grouped by expert).
 *
 * A step runs -l MoE layers one after the other (each layer's output is the next one's input),
 * as a decode step runs every layer of the model: the dynamic path queues them all and waits
 * once, the synchronized paths wait in every layer. Iterations alternate dynamic, sync,
 * syncst, dynamic, ... after a barrier each; the latency of a step is the max over ranks, and
 * the table shows medians and best/dyn, the faster synchronized path over the dynamic one
 * (> 1: the dynamic path is faster; 1.67 is "40% lower latency"). The routing changes every
 * step and every layer. The outputs are compared (#wrong: elements of either synchronized
 * path that differ from the dynamic one by more than 1%). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ncclx.h"
#include "ncclx/moe.h"
#include "perf_launch.h"

#define MAX_LIST 32

typedef struct {
  int nprocs;
  double timeoutSec;
  int hidden, topk, iters, warmup, layers;
  int dynOnCaller; /* -c: the dynamic path on stream NULL (no stream at all) */
  int experts[4], nexperts;
  int skew[2], nskew; /* 0 uniform, 1 skewed */
  int tokens[MAX_LIST], ntokens;
} BenchOpts;

typedef struct {
  const BenchOpts* o;
  ncclxUniqueId id;
} ForkArgs;

/* ---------------- helpers ---------------- */

static double nowUs(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e6 + ts.tv_nsec * 1e-3;
}

static uint64_t mix(uint64_t a, uint64_t b, uint64_t c) {
  uint64_t x = a * 0x9e3779b97f4a7c15ull ^ b * 0xc2b2ae3d27d4eb4full ^ c * 0x165667b19e3779f9ull;
  x ^= x >> 31;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 29;
  return x;
}

static float bf16ToFloat(uint16_t b) {
  uint32_t u = (uint32_t)b << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

static uint16_t floatToBf16(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16); /* nearest even; inputs are finite */
}

/* The host path's weighted sum, written as fast as the library's (blocks of 8 vectorize). */
static void accumulateBf16(float* restrict acc, const uint16_t* restrict s, float w, size_t H) {
  size_t h = 0;
  for (; h + 8 <= H; h += 8)
    for (int j = 0; j < 8; j++) acc[h + j] += w * bf16ToFloat(s[h + j]);
  for (; h < H; h++) acc[h] += w * bf16ToFloat(s[h]);
}

static void storeBf16(uint16_t* restrict d, const float* restrict acc, size_t H) {
  size_t h = 0;
  for (; h + 8 <= H; h += 8)
    for (int j = 0; j < 8; j++) d[h + j] = floatToBf16(acc[h + j]);
  for (; h < H; h++) d[h] = floatToBf16(acc[h]);
}

static void die(const char* call, ncclxResult_t res, int rank) {
  fprintf(stderr, "moe-bench: rank %d: %s failed: %s: %s\n", rank, call, ncclxGetErrorString(res),
          ncclxGetLastError(NULL));
  exit(1);
}
#define CK(rank, call)                              \
  do {                                              \
    ncclxResult_t r_ = (call);                      \
    if (r_ != ncclxSuccess) die(#call, r_, (rank)); \
  } while (0)

/* The 1-minute load average, or -1: printed with every table (figures on a shared machine
 * mean little without it). */
static double loadAverage(void) {
  double l = -1;
  FILE* f = fopen("/proc/loadavg", "r");
  if (f) {
    if (fscanf(f, "%lf", &l) != 1) l = -1;
    fclose(f);
  }
  return l;
}

static int cmpDouble(const void* a, const void* b) {
  double x = *(const double*)a, y = *(const double*)b;
  return x < y ? -1 : x > y;
}

static double median(double* v, int n) {
  qsort(v, (size_t)n, sizeof(double), cmpDouble);
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* ---------------- one rank's state ---------------- */

struct Rank;
typedef struct LayerCtx LayerCtx;

typedef struct Rank {
  int rank, nranks;
  ncclxComm_t comm;
  ncclxStream_t stream;
  int E, K, H, T, skew, iter, layers;
  int firstExpert, nLocal, maxLocal;
  int* ownerFirst; /* nranks + 1 */
  size_t maxRecv, rowBytes;
  uint16_t* tokens;
  int32_t* ids;
  float* weights;
  uint16_t* expertIn;
  uint16_t* expertOut;
  size_t* expertCounts;
  uint16_t* actDyn[2]; /* layer outputs, ping-pong */
  uint16_t* actSync[2];
  uint16_t* actSyncSt[2];
  size_t localRows; /* syncst: rows this rank's experts received */
  /* host-synchronized path */
  uint16_t* srcMajor; /* rows as alltoallv delivers them: by source, then expert */
  uint16_t* stage;
  size_t* pairRow;
  uint64_t *expCount, *expStart, *cntSend, *cntRecv;
  size_t *sendcounts, *sdispls, *recvcounts, *rdispls;
  float* acc;
  LayerCtx* ctx;   /* layers entries */
  LayerCtx* ctxSt; /* syncst: layers entries */
} Rank;

struct LayerCtx {
  struct Rank* r;
  int layer;
};

static const uint16_t* layerInput(const Rank* r, uint16_t* const* act, int layer);

/* Top-k distinct experts; skewed: most picks land on experts 0 and 1 (both on rank 0). */
static void hostRouter(void* u) {
  LayerCtx* c = u;
  Rank* r = c->r;
  uint64_t seed = (uint64_t)r->iter * 64u + (uint64_t)c->layer;
  for (int t = 0; t < r->T; t++) {
    for (int k = 0; k < r->K; k++) {
      int e;
      for (int tries = 0;; tries++) {
        uint64_t h = mix((uint64_t)r->rank * 1000003u + (uint64_t)t, (uint64_t)k + 17u * (uint64_t)tries, seed);
        e = r->skew && h % 10 < 7 ? (int)((h >> 8) % 2) : (int)((h >> 8) % (uint64_t)r->E);
        int dup = 0;
        for (int j = 0; j < k; j++) dup |= r->ids[t * r->K + j] == e;
        if (!dup || tries > 64) break;
      }
      r->ids[t * r->K + k] = e;
      r->weights[t * r->K + k] = k == 0 ? 0.75f : 0.25f / (float)(r->K - 1);
    }
  }
}

/* The experts: a copy of their rows (the same work in both paths). */
static void hostExperts(void* u) {
  Rank* r = ((LayerCtx*)u)->r;
  size_t rows = 0;
  for (int i = 0; i < r->nLocal; i++) rows += r->expertCounts[i];
  memcpy(r->expertOut, r->expertIn, rows * r->rowBytes);
}

static const uint16_t* layerInput(const Rank* r, uint16_t* const* act, int layer) {
  return layer == 0 ? r->tokens : act[(layer - 1) % 2];
}

/* ---------------- the two paths ---------------- */

/* With -c, stream NULL: every call runs at once on this thread. Not a way to use the
 * dynamic path (nothing is queued), but it shows what its exchanges cost without any
 * stream hand-off, against the same synchronized paths. */
static void stepDynamic(Rank* r, ncclxMoe_t moe, int onCaller) {
  ncclxStream_t st = onCaller ? NULL : r->stream;
  for (int l = 0; l < r->layers; l++) {
    CK(r->rank, ncclxLaunchHostFunc(st, hostRouter, &r->ctx[l]));
    CK(r->rank, ncclxMoeDispatch(moe, layerInput(r, r->actDyn, l), (size_t)r->T, r->ids, r->expertIn,
                                 r->expertCounts, st));
    CK(r->rank, ncclxLaunchHostFunc(st, hostExperts, &r->ctx[l]));
    CK(r->rank, ncclxMoeCombine(moe, r->expertOut, r->weights, r->actDyn[l % 2], st));
  }
  CK(r->rank, ncclxStreamSynchronize(st));
}

/* Source-major (as alltoallv delivers) <-> expert-major (as the experts want): forward moves
 * srcMajor into expertIn, backward expertOut into srcMajor. */
static void regroupRows(Rank* r, int forward) {
  size_t H = (size_t)r->H, row = 0;
  for (int j = 0; j < r->nLocal; j++)
    for (int s = 0; s < r->nranks; s++) {
      size_t at = r->rdispls[s] / H; /* this source's block */
      for (int jj = 0; jj < j; jj++) at += (size_t)r->cntRecv[(size_t)s * (size_t)r->maxLocal + (size_t)jj];
      size_t cnt = (size_t)r->cntRecv[(size_t)s * (size_t)r->maxLocal + (size_t)j];
      if (forward) memcpy(r->expertIn + row * H, r->srcMajor + at * H, cnt * r->rowBytes);
      else memcpy(r->srcMajor + at * H, r->expertOut + row * H, cnt * r->rowBytes);
      row += cnt;
    }
}

/* Pack rows by expert (= by destination rank) into stage; the count exchange's send side. */
static void packRows(Rank* r, const uint16_t* in) {
  int n = r->nranks, E = r->E, K = r->K;
  size_t H = (size_t)r->H, pairs = (size_t)r->T * (size_t)K;
  memset(r->expCount, 0, sizeof(uint64_t) * (size_t)E);
  for (size_t i = 0; i < pairs; i++) r->expCount[r->ids[i]]++;
  uint64_t row = 0;
  for (int e = 0; e < E; e++) r->expStart[e] = row, row += r->expCount[e];
  memset(r->expCount, 0, sizeof(uint64_t) * (size_t)E);
  for (size_t i = 0; i < pairs; i++) {
    int e = r->ids[i];
    size_t at = (size_t)(r->expStart[e] + r->expCount[e]++);
    r->pairRow[i] = at;
    memcpy(r->stage + at * H, in + (i / (size_t)K) * H, r->rowBytes);
  }
  /* To rank d, the counts of d's experts (padded to maxLocal). */
  for (int d = 0; d < n; d++)
    for (int j = 0; j < r->maxLocal; j++) {
      int e = r->ownerFirst[d] + j;
      r->cntSend[(size_t)d * (size_t)r->maxLocal + (size_t)j] = e < r->ownerFirst[d + 1] ? r->expCount[e] : 0;
    }
}

/* After the count exchange: all-to-all-v counts and displacements (elements), source-major
 * on the receiving side; returns the rows this rank's experts receive. */
static size_t displacements(Rank* r) {
  int n = r->nranks;
  size_t H = (size_t)r->H, sent = 0, recvd = 0, localRows = 0;
  for (int d = 0; d < n; d++) {
    uint64_t rows = 0, in = 0;
    for (int e = r->ownerFirst[d]; e < r->ownerFirst[d + 1]; e++) rows += r->expCount[e];
    for (int j = 0; j < r->nLocal; j++) in += r->cntRecv[(size_t)d * (size_t)r->maxLocal + (size_t)j];
    r->sendcounts[d] = (size_t)rows * H;
    r->sdispls[d] = sent;
    sent += r->sendcounts[d];
    r->recvcounts[d] = (size_t)in * H;
    r->rdispls[d] = recvd;
    recvd += r->recvcounts[d];
    localRows += (size_t)in;
  }
  return localRows;
}

/* out[t] = sum_k weights * (row of pair (t, k) in stage). */
static void weightedSum(Rank* r, uint16_t* out) {
  size_t H = (size_t)r->H, K = (size_t)r->K;
  for (int t = 0; t < r->T; t++) {
    memset(r->acc, 0, sizeof(float) * H);
    for (size_t k = 0; k < K; k++)
      accumulateBf16(r->acc, r->stage + r->pairRow[(size_t)t * K + k] * H, r->weights[(size_t)t * K + k], H);
    storeBf16(out + (size_t)t * H, r->acc, H);
  }
}

static void layerSync(Rank* r, int layer) {
  CK(r->rank, ncclxLaunchHostFunc(r->stream, hostRouter, &r->ctx[layer]));
  CK(r->rank, ncclxStreamSynchronize(r->stream));
  packRows(r, layerInput(r, r->actSync, layer));
  CK(r->rank, ncclxAllToAll(r->cntSend, r->cntRecv, (size_t)r->maxLocal, ncclxUint64, r->comm, NULL));
  size_t localRows = displacements(r);
  /* With one local expert, source order is expert order: no regrouping. */
  int regroup = r->nLocal > 1;
  uint16_t* land = regroup ? r->srcMajor : r->expertIn;
  CK(r->rank, ncclxAllToAllv(r->stage, r->sendcounts, r->sdispls, land, r->recvcounts, r->rdispls,
                             ncclxBfloat16, r->comm, NULL));
  if (regroup) regroupRows(r, 1);
  memcpy(r->expertOut, r->expertIn, localRows * r->rowBytes); /* the experts */
  if (regroup) regroupRows(r, 0);
  CK(r->rank, ncclxAllToAllv(regroup ? r->srcMajor : r->expertOut, r->recvcounts, r->rdispls, r->stage,
                             r->sendcounts, r->sdispls, ncclxBfloat16, r->comm, NULL));
  weightedSum(r, r->actSync[layer % 2]);
}

static void stepSync(Rank* r) {
  for (int l = 0; l < r->layers; l++) layerSync(r, l);
}

/* syncst: the device-side pieces, as stream host functions. */
static void hostRouterPack(void* u) {
  LayerCtx* c = u;
  hostRouter(u);
  packRows(c->r, layerInput(c->r, c->r->actSyncSt, c->layer));
}
static void hostRegroupForward(void* u) { regroupRows(((LayerCtx*)u)->r, 1); }
static void hostRegroupBackward(void* u) { regroupRows(((LayerCtx*)u)->r, 0); }
static void hostExpertsSt(void* u) {
  Rank* r = ((LayerCtx*)u)->r;
  memcpy(r->expertOut, r->expertIn, r->localRows * r->rowBytes);
}
static void hostWeightedSum(void* u) {
  LayerCtx* c = u;
  weightedSum(c->r, c->r->actSyncSt[c->layer % 2]);
}

/* The synchronization a GPU program needs: the host waits for the router, exchanges the
 * counts and computes displacements, and queues the data path; the next layer's router
 * queues behind it and the next synchronize waits for all of it. */
static void stepSyncStream(Rank* r) {
  CK(r->rank, ncclxLaunchHostFunc(r->stream, hostRouterPack, &r->ctxSt[0]));
  for (int l = 0; l < r->layers; l++) {
    LayerCtx* c = &r->ctxSt[l];
    CK(r->rank, ncclxStreamSynchronize(r->stream));
    CK(r->rank, ncclxAllToAll(r->cntSend, r->cntRecv, (size_t)r->maxLocal, ncclxUint64, r->comm, NULL));
    r->localRows = displacements(r);
    int regroup = r->nLocal > 1;
    CK(r->rank, ncclxAllToAllv(r->stage, r->sendcounts, r->sdispls, regroup ? r->srcMajor : r->expertIn,
                               r->recvcounts, r->rdispls, ncclxBfloat16, r->comm, r->stream));
    if (regroup) CK(r->rank, ncclxLaunchHostFunc(r->stream, hostRegroupForward, c));
    CK(r->rank, ncclxLaunchHostFunc(r->stream, hostExpertsSt, c));
    if (regroup) CK(r->rank, ncclxLaunchHostFunc(r->stream, hostRegroupBackward, c));
    CK(r->rank, ncclxAllToAllv(regroup ? r->srcMajor : r->expertOut, r->recvcounts, r->rdispls, r->stage,
                               r->sendcounts, r->sdispls, ncclxBfloat16, r->comm, r->stream));
    CK(r->rank, ncclxLaunchHostFunc(r->stream, hostWeightedSum, c));
    if (l + 1 < r->layers) CK(r->rank, ncclxLaunchHostFunc(r->stream, hostRouterPack, &r->ctxSt[l + 1]));
  }
  CK(r->rank, ncclxStreamSynchronize(r->stream));
}

/* ---------------- the sweep ---------------- */

static void rankSetup(Rank* r, const BenchOpts* o, int E) {
  int n = r->nranks, Tmax = 0;
  for (int i = 0; i < o->ntokens; i++) Tmax = o->tokens[i] > Tmax ? o->tokens[i] : Tmax;
  r->E = E;
  r->K = o->topk;
  r->H = o->hidden;
  r->rowBytes = (size_t)o->hidden * 2;
  r->maxRecv = (size_t)Tmax * (size_t)o->topk * (size_t)n;
  r->ownerFirst = malloc(sizeof(int) * (size_t)(n + 1));
  for (int d = 0; d <= n; d++) r->ownerFirst[d] = (int)((size_t)d * (size_t)E / (size_t)n);
  r->maxLocal = 0;
  for (int d = 0; d < n; d++)
    if (r->ownerFirst[d + 1] - r->ownerFirst[d] > r->maxLocal)
      r->maxLocal = r->ownerFirst[d + 1] - r->ownerFirst[d];
  if (r->maxLocal == 0) r->maxLocal = 1;
  size_t pairs = (size_t)Tmax * (size_t)o->topk, H = (size_t)o->hidden;
  r->tokens = malloc(r->rowBytes * (size_t)Tmax);
  for (size_t i = 0; i < (size_t)Tmax * H; i++)
    r->tokens[i] = floatToBf16((float)(mix((uint64_t)r->rank, i, 5) % 64) / 8.0f - 4.0f);
  r->ids = malloc(sizeof(int32_t) * pairs);
  r->weights = malloc(sizeof(float) * pairs);
  r->expertIn = malloc(r->rowBytes * r->maxRecv);
  r->expertOut = malloc(r->rowBytes * r->maxRecv);
  r->expertCounts = calloc((size_t)E + 1, sizeof(size_t));
  for (int i = 0; i < 2; i++) {
    r->actDyn[i] = malloc(r->rowBytes * (size_t)Tmax);
    r->actSync[i] = malloc(r->rowBytes * (size_t)Tmax);
    r->actSyncSt[i] = malloc(r->rowBytes * (size_t)Tmax);
  }
  r->layers = o->layers;
  r->ctx = malloc(sizeof(LayerCtx) * (size_t)o->layers);
  r->ctxSt = malloc(sizeof(LayerCtx) * (size_t)o->layers);
  for (int l = 0; l < o->layers; l++) r->ctx[l] = r->ctxSt[l] = (LayerCtx){.r = r, .layer = l};
  r->srcMajor = malloc(r->rowBytes * r->maxRecv);
  r->stage = malloc(r->rowBytes * pairs);
  r->pairRow = malloc(sizeof(size_t) * pairs);
  r->expCount = malloc(sizeof(uint64_t) * (size_t)E);
  r->expStart = malloc(sizeof(uint64_t) * (size_t)E);
  r->cntSend = calloc((size_t)n * (size_t)r->maxLocal, sizeof(uint64_t));
  r->cntRecv = calloc((size_t)n * (size_t)r->maxLocal, sizeof(uint64_t));
  r->sendcounts = malloc(sizeof(size_t) * (size_t)n);
  r->sdispls = malloc(sizeof(size_t) * (size_t)n);
  r->recvcounts = malloc(sizeof(size_t) * (size_t)n);
  r->rdispls = malloc(sizeof(size_t) * (size_t)n);
  r->acc = malloc(sizeof(float) * H);
  if (!r->tokens || !r->expertIn || !r->expertOut || !r->stage || !r->acc || !r->srcMajor) {
    fprintf(stderr, "moe-bench: rank %d: out of memory\n", r->rank);
    exit(1);
  }
}

static void rankTeardown(Rank* r) {
  free(r->ownerFirst), free(r->tokens), free(r->ids), free(r->weights), free(r->expertIn), free(r->expertOut);
  free(r->expertCounts), free(r->srcMajor), free(r->stage), free(r->pairRow), free(r->ctx), free(r->ctxSt);
  for (int i = 0; i < 2; i++) free(r->actDyn[i]), free(r->actSync[i]), free(r->actSyncSt[i]);
  free(r->expCount), free(r->expStart), free(r->cntSend), free(r->cntRecv), free(r->sendcounts);
  free(r->sdispls), free(r->recvcounts), free(r->rdispls), free(r->acc);
}

static uint64_t countWrong(const Rank* r) {
  uint64_t bad = 0;
  size_t n = (size_t)r->T * (size_t)r->H;
  int last = (r->layers - 1) % 2;
  for (size_t i = 0; i < n; i++) {
    float a = bf16ToFloat(r->actDyn[last][i]);
    float b = bf16ToFloat(r->actSync[last][i]), c = bf16ToFloat(r->actSyncSt[last][i]);
    bad += fabsf(a - b) > 0.01f * (1.0f + fabsf(b));
    bad += fabsf(a - c) > 0.01f * (1.0f + fabsf(c));
  }
  return bad;
}

static int benchRank(const BenchOpts* o, ncclxComm_t comm) {
  Rank r;
  memset(&r, 0, sizeof(r));
  r.comm = comm;
  CK(-1, ncclxCommUserRank(comm, &r.rank));
  CK(r.rank, ncclxCommCount(comm, &r.nranks));
  CK(r.rank, ncclxStreamCreate(&r.stream));
  if (r.rank == 0) setvbuf(stdout, NULL, _IOLBF, 0);
  int steps = o->warmup + o->iters;
  double* tDyn = malloc(sizeof(double) * (size_t)steps);
  double* tSync = malloc(sizeof(double) * (size_t)steps);
  double* tSyncSt = malloc(sizeof(double) * (size_t)steps);
  uint64_t totalWrong = 0;
  for (int ei = 0; ei < o->nexperts; ei++) {
    rankSetup(&r, o, o->experts[ei]);
    ncclxMoeConfig_t cfg = {.size = sizeof(cfg),
                            .nExperts = r.E,
                            .topk = r.K,
                            .hidden = (size_t)r.H,
                            .datatype = ncclxBfloat16,
                            .maxTokens = r.maxRecv / (size_t)r.K / (size_t)r.nranks,
                            .maxRecvTokens = r.maxRecv};
    ncclxMoe_t moe;
    CK(r.rank, ncclxMoeCreate(&moe, &cfg, comm));
    CK(r.rank, ncclxMoeLocalExperts(moe, &r.firstExpert, &r.nLocal));
    for (int si = 0; si < o->nskew; si++) {
      r.skew = o->skew[si];
      if (r.rank == 0) {
        printf(
            "# moe-bench: %d ranks, hidden %d bfloat16, top-%d of %d experts, %s routing, %d MoE layer%s per "
            "step, %d iters + %d warmup, median of the per-step max over ranks, load average %.2f%s\n",
            r.nranks, r.H, r.K, r.E, r.skew ? "skewed (70% of picks on experts 0-1)" : "uniform", o->layers,
            o->layers > 1 ? "s" : "", o->iters, o->warmup, loadAverage(),
            o->dynOnCaller ? ", dynamic path on stream NULL (-c)" : "");
        printf("# %8s %12s %12s %12s %8s %8s %9s %7s\n", "tokens", "dynamic(us)", "sync(us)", "syncst(us)",
               "sync/dyn", "best/dyn", "latency", "#wrong");
      }
      for (int ti = 0; ti < o->ntokens; ti++) {
        r.T = o->tokens[ti];
        uint64_t wrong = 0;
        for (int it = 0; it < steps; it++) {
          r.iter = it + 1000 * ti;
          CK(r.rank, ncclxBarrier(comm, NULL));
          double t0 = nowUs();
          stepDynamic(&r, moe, o->dynOnCaller);
          double t1 = nowUs();
          CK(r.rank, ncclxBarrier(comm, NULL));
          double t2 = nowUs();
          stepSync(&r);
          double t3 = nowUs();
          CK(r.rank, ncclxBarrier(comm, NULL));
          double t4 = nowUs();
          stepSyncStream(&r);
          double t5 = nowUs();
          tDyn[it] = t1 - t0;
          tSync[it] = t3 - t2;
          tSyncSt[it] = t5 - t4;
          if (it == 0 || it == steps - 1) wrong += countWrong(&r);
        }
        CK(r.rank, ncclxAllReduce(tDyn, tDyn, (size_t)steps, ncclxFloat64, ncclxMax, comm, NULL));
        CK(r.rank, ncclxAllReduce(tSync, tSync, (size_t)steps, ncclxFloat64, ncclxMax, comm, NULL));
        CK(r.rank, ncclxAllReduce(tSyncSt, tSyncSt, (size_t)steps, ncclxFloat64, ncclxMax, comm, NULL));
        CK(r.rank, ncclxAllReduce(&wrong, &wrong, 1, ncclxUint64, ncclxSum, comm, NULL));
        totalWrong += wrong;
        if (r.rank == 0) {
          double d = median(tDyn + o->warmup, o->iters), s = median(tSync + o->warmup, o->iters);
          double st = median(tSyncSt + o->warmup, o->iters), best = s < st ? s : st;
          printf("  %8d %12.1f %12.1f %12.1f %7.2fx %7.2fx %8.1f%% %7llu\n", r.T, d, s, st, s / d, best / d,
                 100.0 * (d - best) / best, (unsigned long long)wrong);
        }
      }
    }
    CK(r.rank, ncclxMoeDestroy(moe));
    rankTeardown(&r);
  }
  free(tDyn);
  free(tSync);
  free(tSyncSt);
  CK(r.rank, ncclxStreamDestroy(r.stream));
  CK(r.rank, ncclxCommDestroy(comm));
  return totalWrong ? 3 : 0;
}

static int forkedRank(int rank, int nranks, void* arg) {
  ForkArgs* a = arg;
  ncclxComm_t comm;
  CK(rank, ncclxCommInitRank(&comm, nranks, a->id, rank));
  return benchRank(a->o, comm);
}

/* ---------------- command line ---------------- */

static void usage(FILE* f) {
  fprintf(f,
          "usage: moe-bench [-np N] [-t LIST] [-e LIST] [-r uniform|skewed|both] [-k TOPK] [-H HIDDEN]\n"
          "                 [-l LAYERS] [-c] [-n ITERS] [-w WARMUP] [-T SEC]\n"
          "  -np N     fork N local ranks (default: ranks from the launcher, NCCLX_COMM_ID)\n"
          "  -t LIST   tokens per rank, comma separated (default 1,2,4,8,16,32,64,128,256)\n"
          "  -e LIST   experts in the layer (default 8,16)\n"
          "  -r MODE   routing (default both)\n"
          "  -k TOPK   experts per token (default 2)      -H HIDDEN  row elements, bf16 (default 4096)\n"
          "  -l LAYERS MoE layers per step (default 1)\n"
          "  -c        dynamic path on stream NULL, the calling thread (its cost without a stream)\n"
          "  -n ITERS  timed steps per size (default 20)  -w WARMUP  untimed steps (default 3)\n"
          "  -T SEC    with -np: bound on the whole run (default 900)\n");
}

static int parseList(const char* s, int* out, int max) {
  int n = 0;
  while (*s && n < max) {
    char* end;
    long v = strtol(s, &end, 10);
    if (end == s || v < 1 || v > 1 << 20) return -1;
    out[n++] = (int)v;
    s = *end == ',' ? end + 1 : end;
    if (*end && *end != ',') return -1;
  }
  return n;
}

static int parseArgs(int argc, char** argv, BenchOpts* o) {
  *o = (BenchOpts){.timeoutSec = 900,
                   .hidden = 4096,
                   .topk = 2,
                   .iters = 20,
                   .warmup = 3,
                   .layers = 1,
                   .experts = {8, 16},
                   .nexperts = 2,
                   .skew = {0, 1},
                   .nskew = 2,
                   .tokens = {1, 2, 4, 8, 16, 32, 64, 128, 256},
                   .ntokens = 9};
  for (int i = 1; i < argc; i++) {
    const char* a = argv[i];
    if (!strcmp(a, "-h") || !strcmp(a, "--help")) return 1;
    if (!strcmp(a, "-c")) {
      o->dynOnCaller = 1;
      continue;
    }
    if (i + 1 >= argc) return -1;
    const char* v = argv[++i];
    if (!strcmp(a, "-np")) o->nprocs = atoi(v);
    else if (!strcmp(a, "-t")) o->ntokens = parseList(v, o->tokens, MAX_LIST);
    else if (!strcmp(a, "-e")) o->nexperts = parseList(v, o->experts, 4);
    else if (!strcmp(a, "-k")) o->topk = atoi(v);
    else if (!strcmp(a, "-H")) o->hidden = atoi(v);
    else if (!strcmp(a, "-n")) o->iters = atoi(v);
    else if (!strcmp(a, "-w")) o->warmup = atoi(v);
    else if (!strcmp(a, "-l")) o->layers = atoi(v);
    else if (!strcmp(a, "-T")) o->timeoutSec = atof(v);
    else if (!strcmp(a, "-r")) {
      if (!strcmp(v, "uniform")) o->skew[0] = 0, o->nskew = 1;
      else if (!strcmp(v, "skewed")) o->skew[0] = 1, o->nskew = 1;
      else if (strcmp(v, "both")) return -1;
    } else {
      return -1;
    }
  }
  if (o->ntokens < 1 || o->nexperts < 1 || o->topk < 1 || o->hidden < 1 || o->iters < 1 || o->warmup < 0 ||
      o->layers < 1 || o->layers > 64 || o->nprocs < 0 || o->nprocs > 1024)
    return -1;
  for (int i = 0; i < o->nexperts; i++)
    if (o->topk > o->experts[i]) return -1;
  return 0;
}

int main(int argc, char** argv) {
  BenchOpts o;
  int parsed = parseArgs(argc, argv, &o);
  if (parsed != 0) {
    usage(parsed > 0 ? stdout : stderr);
    return parsed > 0 ? 0 : 2;
  }
  if (o.nprocs > 0) {
    ForkArgs a = {.o = &o};
    CK(-1, ncclxGetUniqueId(&a.id));
    return perfLaunch(o.nprocs, o.timeoutSec, forkedRank, &a);
  }
  ncclxComm_t comm;
  CK(-1, ncclxCommInitFromEnv(&comm));
  return benchRank(&o, comm);
}
