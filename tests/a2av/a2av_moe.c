/* a2av_moe NP: ncclxMoeDispatch -> experts -> ncclxMoeCombine at NP forked ranks.
 *
 * Routing (expert ids, some -1 = dropped, some duplicated within a token) and token values
 * are hashes of rank and token, so every rank knows every rank's routing and checks:
 *  - expertCounts and the exact rows of expertIn (grouped by local expert, then source rank,
 *    token, k), written when the dispatch executed;
 *  - out[t] = sum_k w[t,k] * scale(e[t,k]) * token[t] after the "experts" (a host function on
 *    the stream that multiplies each expert's rows by scale(e) = e % 3 + 1, reading the
 *    expertCounts the dispatch wrote) and the combine; with scale 1 this is the tokens times
 *    the sum of their weights.
 * The router and the weights are host functions on the stream too, queued before the
 * dispatch; two layers are queued back to back on one handle. Values are small integers and
 * quarter weights, exact in bf16 and fp16. Cases cover expert counts that do not divide the
 * rank count, fewer experts than ranks (ranks owning none), ranks with no tokens, and
 * stream NULL. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "a2av_util.h"

typedef struct {
  int nExperts, topk;
  size_t hidden;
  ncclxDataType_t dt;
  int skew;  /* most pairs go to experts 0 and 1 */
  int drops; /* some pairs are -1 */
  int useStream;
  int seed;
} MoeCase;

static size_t tokensOf(const MoeCase* c, int rank) {
  /* Rank 1 has none in some cases. */
  if (rank == 1 && c->seed % 2) return 0;
  return 1 + (size_t)(mpHash((uint64_t)rank, (uint64_t)c->seed, 7, 7) % 40);
}

static int32_t expertOf(const MoeCase* c, int rank, size_t t, int k) {
  uint64_t h = mpHash((uint64_t)rank, t, (uint64_t)k, (uint64_t)c->seed);
  if (c->drops && h % 7 == 0) return -1;
  if (c->skew && h % 5 != 0) return (int32_t)((h >> 8) % 2 % (uint64_t)c->nExperts);
  if (k > 0 && h % 11 == 0) return expertOf(c, rank, t, 0) >= 0 ? expertOf(c, rank, t, 0) : 0; /* duplicate */
  return (int32_t)((h >> 8) % (uint64_t)c->nExperts);
}

static double tokenValue(int rank, size_t t, size_t h) {
  return (double)(((uint64_t)rank * 7 + t * 3 + h) % 13) - 6.0;
}

static float weightOf(int k) { return 0.25f * (float)(k + 1); }

static double scaleOf(int e) { return (double)(e % 3 + 1); }

typedef struct {
  const MoeCase* c;
  int rank, np;
  ncclxMoe_t moe;
  int firstExpert, nLocal;
  size_t nTokens, maxRecv;
  void* tokens;
  int32_t* ids;
  float* weights;
  void* expertIn;
  void* expertOut;
  size_t* expertCounts;
  void* out;
  int bad;
} Layer;

static void hostRoute(void* u) {
  Layer* L = u;
  for (size_t t = 0; t < L->nTokens; t++)
    for (int k = 0; k < L->c->topk; k++)
      L->ids[t * (size_t)L->c->topk + (size_t)k] = expertOf(L->c, L->rank, t, k);
}

static void hostWeights(void* u) {
  Layer* L = u;
  for (size_t t = 0; t < L->nTokens; t++)
    for (int k = 0; k < L->c->topk; k++) L->weights[t * (size_t)L->c->topk + (size_t)k] = weightOf(k);
}

/* The experts: rows of local expert i times scale(first + i), using the counts dispatch wrote. */
static void hostExperts(void* u) {
  Layer* L = u;
  size_t row = 0, H = L->c->hidden;
  for (int i = 0; i < L->nLocal; i++) {
    double s = scaleOf(L->firstExpert + i);
    for (size_t r = 0; r < L->expertCounts[i]; r++, row++)
      for (size_t h = 0; h < H; h++)
        mpSet(L->expertOut, row * H + h, L->c->dt, s * mpGet(L->expertIn, row * H + h, L->c->dt));
  }
}

static void layerInit(Layer* L, const MoeCase* c, int rank, int np, ncclxComm_t comm) {
  memset(L, 0, sizeof(*L));
  L->c = c;
  L->rank = rank;
  L->np = np;
  L->nTokens = tokensOf(c, rank);
  /* Capacity: exactly what can arrive (every rank's pairs could land here in the skewed case). */
  size_t maxRecv = 0;
  for (int s = 0; s < np; s++) maxRecv += tokensOf(c, s) * (size_t)c->topk;
  L->maxRecv = maxRecv;
  ncclxMoeConfig_t cfg = {.size = sizeof(cfg),
                          .nExperts = c->nExperts,
                          .topk = c->topk,
                          .hidden = c->hidden,
                          .datatype = c->dt,
                          .maxTokens = 64,
                          .maxRecvTokens = maxRecv};
  MP_CALL(rank, comm, ncclxMoeCreate(&L->moe, &cfg, comm));
  MP_CALL(rank, comm, ncclxMoeLocalExperts(L->moe, &L->firstExpert, &L->nLocal));
  size_t sz = mpTypeSize(c->dt), H = c->hidden;
  L->tokens = calloc(L->nTokens * H + 1, sz);
  L->ids = calloc(L->nTokens * (size_t)c->topk + 1, sizeof(int32_t));
  L->weights = calloc(L->nTokens * (size_t)c->topk + 1, sizeof(float));
  L->expertIn = calloc(maxRecv * H + 1, sz);
  L->expertOut = calloc(maxRecv * H + 1, sz);
  L->expertCounts = calloc((size_t)L->nLocal + 1, sizeof(size_t));
  L->out = calloc(L->nTokens * H + 1, sz);
  for (size_t t = 0; t < L->nTokens; t++)
    for (size_t h = 0; h < H; h++) mpSet(L->tokens, t * H + h, c->dt, tokenValue(rank, t, h));
  /* Garbage until the router runs: the dispatch must read the ids when it executes. */
  memset(L->ids, 0x7f, L->nTokens * (size_t)c->topk * sizeof(int32_t));
}

static void layerFree(Layer* L) {
  MP_CALL(L->rank, NULL, ncclxMoeDestroy(L->moe));
  free(L->tokens), free(L->ids), free(L->weights), free(L->expertIn), free(L->expertOut);
  free(L->expertCounts), free(L->out);
}

static void layerQueue(Layer* L, ncclxStream_t stream) {
  MP_CALL(L->rank, NULL, ncclxLaunchHostFunc(stream, hostRoute, L));
  MP_CALL(L->rank, NULL,
          ncclxMoeDispatch(L->moe, L->tokens, L->nTokens, L->ids, L->expertIn, L->expertCounts, stream));
  MP_CALL(L->rank, NULL, ncclxLaunchHostFunc(stream, hostExperts, L));
  MP_CALL(L->rank, NULL, ncclxLaunchHostFunc(stream, hostWeights, L));
  MP_CALL(L->rank, NULL, ncclxMoeCombine(L->moe, L->expertOut, L->weights, L->out, stream));
}

static int layerCheck(Layer* L, const char* what) {
  const MoeCase* c = L->c;
  size_t H = c->hidden, row = 0;
  int bad = 0;
  /* expertIn: grouped by local expert, then source, token, k. */
  for (int i = 0; i < L->nLocal && !bad; i++) {
    int e = L->firstExpert + i;
    size_t want = 0;
    for (int s = 0; s < L->np; s++)
      for (size_t t = 0; t < tokensOf(c, s); t++)
        for (int k = 0; k < c->topk; k++) {
          if (expertOf(c, s, t, k) != e) continue;
          want++;
          for (size_t h = 0; h < H && !bad; h++)
            if (mpGet(L->expertIn, row * H + h, c->dt) != tokenValue(s, t, h))
              bad += a2avFail(L->rank, "%s: expertIn row %zu (expert %d) is not token %zu of rank %d (k %d)",
                              what, row, e, t, s, k);
          row++;
        }
    if (L->expertCounts[i] != want)
      bad += a2avFail(L->rank, "%s: expertCounts[%d] (expert %d) = %zu, expected %zu", what, i, e,
                      L->expertCounts[i], want);
  }
  /* out: weighted sum of the scaled tokens. */
  double tol = c->dt == ncclxBfloat16 ? 0.13 : c->dt == ncclxFloat16 ? 0.02 : 1e-5;
  for (size_t t = 0; t < L->nTokens && !bad; t++) {
    double f = 0;
    for (int k = 0; k < c->topk; k++) {
      int32_t e = expertOf(c, L->rank, t, k);
      if (e >= 0) f += weightOf(k) * scaleOf(e);
    }
    for (size_t h = 0; h < H && !bad; h++) {
      double want = f * tokenValue(L->rank, t, h), got = mpGet(L->out, t * H + h, c->dt);
      if (fabs(got - want) > tol * (1 + fabs(want)))
        bad += a2avFail(L->rank, "%s: out[token %zu][%zu] = %g, expected %g", what, t, h, got, want);
    }
  }
  return bad;
}

static int runCase(ncclxComm_t comm, int rank, int np, const MoeCase* c) {
  char what[128];
  snprintf(what, sizeof(what), "moe %d experts top-%d hidden %zu %s%s%s %s", c->nExperts, c->topk, c->hidden,
           mpTypeName(c->dt), c->skew ? " skewed" : "", c->drops ? " drops" : "",
           c->useStream ? "stream" : "NULL");
  ncclxStream_t stream = NULL;
  if (c->useStream) MP_CALL(rank, comm, ncclxStreamCreate(&stream));
  /* Two layers back to back; the second reuses the first's handle. */
  Layer L1, L2;
  layerInit(&L1, c, rank, np, comm);
  L2 = L1;
  L2.tokens = calloc(L1.nTokens * c->hidden + 1, mpTypeSize(c->dt));
  memcpy(L2.tokens, L1.tokens, L1.nTokens * c->hidden * mpTypeSize(c->dt));
  L2.expertIn = calloc(L1.maxRecv * c->hidden + 1, mpTypeSize(c->dt));
  L2.expertOut = calloc(L1.maxRecv * c->hidden + 1, mpTypeSize(c->dt));
  L2.out = calloc(L1.nTokens * c->hidden + 1, mpTypeSize(c->dt));
  L2.ids = calloc(L1.nTokens * (size_t)c->topk + 1, sizeof(int32_t));
  L2.weights = calloc(L1.nTokens * (size_t)c->topk + 1, sizeof(float));
  L2.expertCounts = calloc((size_t)L1.nLocal + 1, sizeof(size_t));
  layerQueue(&L1, stream);
  layerQueue(&L2, stream);
  if (stream) MP_CALL(rank, comm, ncclxStreamSynchronize(stream));
  int bad = layerCheck(&L1, what) + layerCheck(&L2, what);
  free(L2.tokens), free(L2.expertIn), free(L2.expertOut), free(L2.out), free(L2.ids), free(L2.weights);
  free(L2.expertCounts);
  layerFree(&L1);
  if (stream) MP_CALL(rank, comm, ncclxStreamDestroy(stream));
  if (!bad && rank == 0) printf("rank 0: %s ok\n", what);
  return bad;
}

static int rankMain(int rank, int np, ncclxUniqueId id, void* arg) {
  (void)arg;
  ncclxComm_t comm = a2avInit(rank, np, id);
  static const MoeCase cases[] = {
      {.nExperts = 8, .topk = 2, .hidden = 64, .dt = ncclxFloat32, .useStream = 1, .seed = 1},
      {.nExperts = 16, .topk = 2, .hidden = 32, .dt = ncclxBfloat16, .skew = 1, .useStream = 1, .seed = 2},
      {.nExperts = 5, .topk = 3, .hidden = 16, .dt = ncclxFloat64, .drops = 1, .useStream = 1, .seed = 3},
      {.nExperts = 3, .topk = 1, .hidden = 8, .dt = ncclxFloat16, .drops = 1, .useStream = 0, .seed = 4},
      {.nExperts = 8, .topk = 2, .hidden = 4096, .dt = ncclxBfloat16, .useStream = 1, .seed = 6},
      /* 32 KiB rows: hundreds of KiB per peer, several staged chunks each way. */
      {.nExperts = 6, .topk = 2, .hidden = 8192, .dt = ncclxFloat32, .skew = 1, .useStream = 1, .seed = 8},
  };
  int bad = 0;
  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) bad += runCase(comm, rank, np, &cases[i]);
  MP_CALL(rank, comm, ncclxCommDestroy(comm));
  return bad ? 1 : 0;
}

int main(int argc, char** argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s NP\n", argv[0]);
    return 2;
  }
  int np = a2avArgInt(argv[1], "NP");
  if (np < 1 || np > MP_MAX_RANKS) return 2;
  return a2avRunRanks("a2av_moe", np, rankMain, NULL, 100.0);
}
