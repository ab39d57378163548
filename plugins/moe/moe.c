/* Mixture-of-experts dispatch and combine over the dynamic exchange engine.
 *
 * Dispatch, on the stream: count the (token, k) pairs per expert, pack their rows into the
 * handle's staging buffer ordered by expert (experts are contiguous per rank, so this is also
 * ordered by destination rank), then one dynamic exchange whose segments are the experts: the
 * headers carry the per-expert counts. Once a rank knows every header it lays its expert
 * input out grouped by expert and the segments land there.
 *
 * Combine is the same exchange backwards, segments (source, expert) from the expert output
 * to the staging buffer where dispatch had packed them; each side checks that the counts
 * match what the dispatch moved. The weighted sum per token then reads its k rows through
 * the pair -> row map kept by dispatch. */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alltoallv_dynamic.h"
#include "moe_module.h"

#define MOE_MAGIC 0x6e63636c786d6f65ull /* "ncclxmoe" */
#define MOE_DROPPED SIZE_MAX

struct ncclxMoe {
  uint64_t magic;
  atomic_int refs; /* the user's handle plus queued operations */
  ncclxComm_t comm;
  ncclxMoeConfig_t cfg;
  size_t rowBytes;
  int nranks, rank;
  int* firstExpert; /* nranks + 1: rank r owns [firstExpert[r], firstExpert[r + 1]) */
  int localFirst, nLocal;
  /* Call-time bookkeeping (the thread that queues). */
  uint64_t dispatchCalls;
  size_t lastCallTokens;
  /* The latest executed dispatch, for its combine. */
  int haveRouting;
  size_t nTokens;
  char* stage;          /* maxTokens * topk rows */
  size_t* pairRow;      /* maxTokens * topk: row of pair (t, k) in stage, or MOE_DROPPED */
  uint64_t* sendSegs;   /* nExperts: rows sent to each expert */
  size_t* dropped;      /* nExperts: pairs over expertCapacity in the latest dispatch */
  size_t* expertStart;  /* nExperts: first row of each expert in stage */
  uint64_t* recvSegs;   /* nranks * nLocal: rows from source s for local expert i */
  uint64_t* recvRow;    /* nranks * nLocal: first row of (s, i) in expertIn */
  char** recvDst;       /* nranks * nLocal */
  const char** sendPtr; /* nExperts: dispatch, where each expert's rows start in stage */
  uint64_t* backSegs;   /* nExperts: combine, rows coming back per expert (checked) */
  char** backDst;       /* nExperts: combine, where they go in stage */
  const char** outPtr;  /* nranks * nLocal: combine, expert output of (s, i) */
  dynPeer* peers;       /* nranks */
  float* accF;          /* hidden: accumulators of combine */
  double* accD;
};

typedef struct {
  struct ncclxMoe* moe;
  int isCombine;
  ncclxStream_t stream;
  /* dispatch */
  const char* tokens;
  size_t nTokens;
  const int32_t* expertIds;
  char* expertIn;
  size_t* expertCounts;
  int laidOut;
  /* combine */
  const char* expertOut;
  const float* weights;
  char* out;
} moeTask;

static uint64_t sumSegsOf(const uint64_t* segs, int n) {
  uint64_t s = 0;
  for (int i = 0; i < n; i++) s += segs[i];
  return s;
}

static int isFloatType(ncclxDataType_t t) {
  return t == ncclxFloat16 || t == ncclxBfloat16 || t == ncclxFloat32 || t == ncclxFloat64;
}

static void moeRelease(struct ncclxMoe* m) {
  if (atomic_fetch_sub(&m->refs, 1) != 1) return;
  moeCore->release(m->comm);
  free(m->firstExpert);
  free(m->stage);
  free(m->pairRow);
  free(m->sendSegs);
  free(m->dropped);
  free(m->expertStart);
  free(m->recvSegs);
  free(m->recvRow);
  free(m->recvDst);
  free(m->peers);
  free(m->sendPtr);
  free(m->backSegs);
  free(m->backDst);
  free(m->outPtr);
  free(m->accF);
  free(m->accD);
  m->magic = 0;
  free(m);
}

static ncclxResult_t checkHandle(struct ncclxMoe* m, const char* fn) {
  if (!m) return moeCore->setError(ncclxInvalidArgument, "%s: moe handle is NULL", fn);
  if (m->magic != MOE_MAGIC)
    return moeCore->setError(ncclxInvalidArgument, "%s: %p is not a live moe handle", fn, (void*)m);
  return ncclxSuccess;
}

/* ---------------- create / destroy ---------------- */

static ncclxResult_t validateConfig(ncclxComm_t comm, const ncclxMoeConfig_t* c) {
  const char* fn = "ncclxMoeCreate";
  if (!c) return moeCore->argError(comm, ncclxInvalidArgument, "%s: config is NULL", fn);
  if (c->size != sizeof(ncclxMoeConfig_t) && c->size != NCCLX_MOE_CONFIG_SIZE_V1)
    return moeCore->argError(comm, ncclxInvalidArgument,
                       "%s: config->size is %zu, expected sizeof(ncclxMoeConfig_t) = %zu (or %zu, before "
                       "expertCapacity)", fn, c->size, sizeof(ncclxMoeConfig_t), (size_t)NCCLX_MOE_CONFIG_SIZE_V1);
  if (c->nExperts < 1)
    return moeCore->argError(comm, ncclxInvalidArgument, "%s: nExperts %d must be >= 1", fn, c->nExperts);
  if (c->topk < 1 || c->topk > c->nExperts * 64)
    return moeCore->argError(comm, ncclxInvalidArgument, "%s: topk %d must be between 1 and 64 * nExperts", fn,
                       c->topk);
  if (c->hidden < 1) return moeCore->argError(comm, ncclxInvalidArgument, "%s: hidden must be >= 1", fn);
  if (!isFloatType(c->datatype))
    return moeCore->argError(
        comm, ncclxInvalidArgument,
        "%s: datatype %d: token rows must be float16, bfloat16, float32 or float64 (combine scales them)", fn,
        (int)c->datatype);
  size_t row = moeCore->typeSize(c->datatype);
  size_t limit = (SIZE_MAX / 4) / row;
  if (c->hidden > limit)
    return moeCore->argError(comm, ncclxInvalidArgument, "%s: hidden %zu is too large", fn, c->hidden);
  limit /= c->hidden;
  if (c->maxTokens > limit / (size_t)c->topk || c->maxRecvTokens > limit)
    return moeCore->argError(comm, ncclxInvalidArgument, "%s: maxTokens %zu / maxRecvTokens %zu are too large", fn,
                       c->maxTokens, c->maxRecvTokens);
  return ncclxSuccess;
}

ncclxResult_t moeCreate(ncclxMoe_t* moe, const ncclxMoeConfig_t* config, ncclxComm_t comm) {
  const char* fn = "ncclxMoeCreate";
  if (!moe) return moeCore->setError(ncclxInvalidArgument, "%s: moe pointer is NULL", fn);
  *moe = NULL;
  NCCLX_CHECK(moeCore->checkCall(comm, NULL, fn));
  NCCLX_CHECK(validateConfig(comm, config));
  ncclxModuleCommInfo_v1_t info;
  moeCore->commInfo(comm, &info);
  struct ncclxMoe* m = calloc(1, sizeof(*m));
  if (!m) return moeCore->argError(comm, ncclxSystemError, "%s: out of memory", fn);
  memcpy(&m->cfg, config, config->size); /* an older, shorter config: the new fields stay 0 */
  m->cfg.size = sizeof(m->cfg);
  m->comm = comm;
  m->nranks = info.nranks;
  m->rank = info.rank;
  m->rowBytes = config->hidden * moeCore->typeSize(config->datatype);
  size_t n = (size_t)m->nranks, E = (size_t)config->nExperts, pairs = config->maxTokens * (size_t)config->topk;
  m->firstExpert = malloc((n + 1) * sizeof(int));
  if (m->firstExpert)
    for (size_t r = 0; r <= n; r++) m->firstExpert[r] = (int)(r * E / n);
  m->localFirst = m->firstExpert ? m->firstExpert[m->rank] : 0;
  m->nLocal = m->firstExpert ? m->firstExpert[m->rank + 1] - m->localFirst : 0;
  size_t nl = (size_t)m->nLocal;
  size_t cap = m->cfg.expertCapacity;
  if (cap > 0 && m->firstExpert && (cap > SIZE_MAX / n / (nl + 1) || n * nl * cap > config->maxRecvTokens)) {
    ncclxResult_t res = moeCore->argError(comm, ncclxInvalidArgument,
                                     "%s: maxRecvTokens %zu cannot hold what expertCapacity %zu lets %zu ranks send to "
                                     "this rank's %zu experts (%zu rows): raise maxRecvTokens or lower the capacity",
                                     fn, config->maxRecvTokens, cap, n, nl, n * nl * cap);
    free(m->firstExpert);
    free(m);
    return res;
  }
  m->stage = malloc(pairs ? pairs * m->rowBytes : 1);
  m->pairRow = malloc(pairs ? pairs * sizeof(size_t) : 1);
  m->sendSegs = calloc(E, sizeof(uint64_t));
  m->dropped = calloc(E, sizeof(size_t));
  m->expertStart = calloc(E, sizeof(size_t));
  m->recvSegs = calloc(n * nl + 1, sizeof(uint64_t));
  m->recvRow = calloc(n * nl + 1, sizeof(uint64_t));
  m->recvDst = calloc(n * nl + 1, sizeof(char*));
  m->peers = calloc(n, sizeof(dynPeer));
  m->sendPtr = calloc(E, sizeof(char*));
  m->backSegs = calloc(E, sizeof(uint64_t));
  m->backDst = calloc(E, sizeof(char*));
  m->outPtr = calloc(n * nl + 1, sizeof(char*));
  m->accF = malloc(config->hidden * sizeof(float));
  m->accD = malloc(config->hidden * sizeof(double));
  atomic_init(&m->refs, 1);
  m->magic = MOE_MAGIC;
  moeCore->retain(comm);
  if (!m->firstExpert || !m->stage || !m->pairRow || !m->sendSegs || !m->dropped || !m->expertStart || !m->recvSegs ||
      !m->recvRow || !m->recvDst || !m->peers || !m->sendPtr || !m->backSegs || !m->backDst || !m->outPtr ||
      !m->accF || !m->accD) {
    moeRelease(m);
    return moeCore->argError(comm, ncclxSystemError, "%s: out of memory (staging of %zu rows of %zu bytes)", fn,
                       pairs, m->rowBytes);
  }
  MOE_INFO(NCCLX_LOG_INIT, "%s: %d experts (local %d..%d), top-%d, hidden %zu %s, staging %zu bytes", fn,
       config->nExperts, m->localFirst, m->localFirst + m->nLocal - 1, config->topk, config->hidden,
       moeCore->typeName(config->datatype), pairs * m->rowBytes);
  *moe = m;
  return ncclxSuccess;
}

ncclxResult_t moeDestroy(ncclxMoe_t moe) {
  NCCLX_CHECK(checkHandle(moe, "ncclxMoeDestroy"));
  moe->magic = MOE_MAGIC ^ 1; /* refuse new calls; queued ones still hold references */
  moeRelease(moe);
  return ncclxSuccess;
}

ncclxResult_t moeLocalExperts(ncclxMoe_t moe, int* firstExpert, int* nLocalExperts) {
  NCCLX_CHECK(checkHandle(moe, "ncclxMoeLocalExperts"));
  if (firstExpert) *firstExpert = moe->localFirst;
  if (nLocalExperts) *nLocalExperts = moe->nLocal;
  return ncclxSuccess;
}

/* ---------------- dispatch ---------------- */

/* Grouped by expert, then by source: every header is needed before anything is placed. */
static ncclxResult_t placeGrouped(dynExchange* x, int peer, int* placed) {
  moeTask* t = x->ctx;
  struct ncclxMoe* m = t->moe;
  (void)peer;
  if (!t->laidOut) {
    int n = m->nranks, nl = m->nLocal;
    for (int s = 0; s < n; s++)
      if (!x->peers[s].hdrKnown) return ncclxSuccess; /* *placed stays 0 */
    uint64_t total = 0;
    for (int s = 0; s < n * nl; s++) total += m->recvSegs[s];
    if (total > m->cfg.maxRecvTokens) {
      size_t len =
          (size_t)snprintf(x->why, sizeof(x->why),
                           "rank %d receives %llu tokens in total, more than its maxRecvTokens %zu (from",
                           m->rank, (unsigned long long)total, m->cfg.maxRecvTokens);
      for (int s = 0; s < n && len < sizeof(x->why) - 40; s++)
        len += (size_t)snprintf(x->why + len, sizeof(x->why) - len, " rank %d: %llu%s", s,
                                (unsigned long long)sumSegsOf(&m->recvSegs[(size_t)s * nl], nl),
                                s + 1 < n ? "," : ")");
      return ncclxInvalidUsage;
    }
    uint64_t row = 0;
    for (int i = 0; i < nl; i++) {
      uint64_t start = row;
      for (int s = 0; s < n; s++) {
        size_t k = (size_t)s * nl + i;
        m->recvRow[k] = row;
        m->recvDst[k] = m->recvSegs[k] ? t->expertIn + row * m->rowBytes : NULL;
        row += m->recvSegs[k];
      }
      t->expertCounts[i] = (size_t)(row - start);
    }
    t->laidOut = 1;
  }
  *placed = 1;
  return ncclxSuccess;
}

static ncclxResult_t dispatchExec(const dynCall* call, void* arg) {
  moeTask* t = arg;
  struct ncclxMoe* m = t->moe;
  int E = m->cfg.nExperts, K = m->cfg.topk, n = m->nranks, nl = m->nLocal;
  size_t pairs = t->nTokens * (size_t)K;
  m->haveRouting = 0;
  /* Route: rows per expert (pairs over expertCapacity dropped, in token order), then each
   * kept pair's row in the staging buffer. pairRow marks dropped pairs on the first pass. */
  memset(m->sendSegs, 0, (size_t)E * sizeof(uint64_t));
  memset(m->dropped, 0, (size_t)E * sizeof(size_t));
  size_t cap = m->cfg.expertCapacity;
  size_t nBad = 0, firstBad = 0;
  int32_t badId = 0;
  for (size_t i = 0; i < pairs; i++) {
    int32_t e = t->expertIds[i];
    m->pairRow[i] = MOE_DROPPED;
    if (e == -1) continue;
    /* A bad id is only seen here, with the peers already exchanging: its pair is left out
     * (as -1) and the exchange completes, so no rank is held up or failed; the refusal is
     * this rank's result alone, below. */
    if (e < -1 || e >= E) {
      if (nBad++ == 0) firstBad = i, badId = e;
      continue;
    }
    if (cap > 0 && m->sendSegs[e] == cap) {
      m->dropped[e]++;
      continue;
    }
    m->sendSegs[e]++;
    m->pairRow[i] = 0; /* kept: its row is assigned below */
  }
  size_t row = 0;
  for (int e = 0; e < E; e++) {
    m->expertStart[e] = row;
    row += (size_t)m->sendSegs[e];
  }
  /* Pack: sendSegs counts up again as the per-expert cursor, keeping token order. */
  memset(m->sendSegs, 0, (size_t)E * sizeof(uint64_t));
  for (size_t i = 0; i < pairs; i++) {
    int32_t e = t->expertIds[i];
    if (m->pairRow[i] == MOE_DROPPED) continue;
    size_t r = m->expertStart[e] + (size_t)(m->sendSegs[e]++);
    m->pairRow[i] = r;
    memcpy(m->stage + r * m->rowBytes, t->tokens + (i / (size_t)K) * m->rowBytes, m->rowBytes);
  }
  for (int e = 0; e < E; e++) m->sendPtr[e] = m->stage + m->expertStart[e] * m->rowBytes;
  for (int d = 0; d < n; d++) {
    int first = m->firstExpert[d];
    m->peers[d] = (dynPeer){.sendPtr = &m->sendPtr[first < E ? first : 0],
                            .sendSegs = &m->sendSegs[first < E ? first : 0],
                            .nSendSeg = m->firstExpert[d + 1] - first,
                            .nRecvSeg = nl,
                            .recvSegs = &m->recvSegs[(size_t)d * nl],
                            .recvDst = &m->recvDst[(size_t)d * nl]};
  }
  t->laidOut = 0;
  dynExchange x = {.call = call,
                   .unitBytes = m->rowBytes,
                   .unitName = "tokens",
                   .capName = "maxRecvTokens",
                   .capacity = DYN_NO_CAPACITY,
                   .scatteredRecv = nl > 1,
                   .peers = m->peers,
                   .place = placeGrouped,
                   .ctx = t};
  NCCLX_CHECK(dynExchangeRun(&x));
  m->nTokens = t->nTokens;
  m->haveRouting = 1; /* also after a refusal: the peers' combine expects this rank */
  if (nBad > 0)
    return moeCore->argError(call->comm, ncclxInvalidArgument,
                        "ncclxMoeDispatch #%llu: expertIds[%zu] (token %zu, k %zu) is %d, not an expert of this "
                        "%d-expert layer (nor -1 for none); %zu such pairs were not sent, the rest were",
                        (unsigned long long)call->seq, firstBad, firstBad / (size_t)K, firstBad % (size_t)K,
                        (int)badId, E, nBad);
  return ncclxSuccess;
}

/* ---------------- combine ---------------- */

/* Inline bf16 conversions (same rounding as reduce.c): the weighted sum is a hot loop, and
 * a call per element costs more than the exchange at decode sizes. */
static inline float bf16Load(uint16_t b) {
  uint32_t u = (uint32_t)b << 16;
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

static inline uint16_t bf16Store(float f) {
  uint32_t x;
  memcpy(&x, &f, sizeof x);
  uint32_t r = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16; /* nearest even */
  return (uint16_t)((x & 0x7fffffffu) > 0x7f800000u ? (x >> 16) | 0x40u : r);
}

/* acc += w * row, for a row of the configured type (not float64). Blocks of 8 with restrict
 * let the compiler vectorize at -O2 (about 4x faster than the plain loop). */
static void accumulateRow(float* restrict acc, const char* restrict row, float w, size_t H,
                          ncclxDataType_t dt) {
  size_t h = 0;
  if (dt == ncclxFloat32) {
    const float* restrict s = (const float*)row;
    for (; h + 8 <= H; h += 8)
      for (int j = 0; j < 8; j++) acc[h + j] += w * s[h + j];
    for (; h < H; h++) acc[h] += w * s[h];
  } else if (dt == ncclxBfloat16) {
    const uint16_t* restrict s = (const uint16_t*)row;
    for (; h + 8 <= H; h += 8)
      for (int j = 0; j < 8; j++) acc[h + j] += w * bf16Load(s[h + j]);
    for (; h < H; h++) acc[h] += w * bf16Load(s[h]);
  } else {
    const uint16_t* s = (const uint16_t*)row;
    for (; h < H; h++) acc[h] += w * moeCore->halfToFloat(s[h]);
  }
}

static void storeRow(char* restrict dst, const float* restrict acc, size_t H, ncclxDataType_t dt) {
  uint16_t* restrict d = (uint16_t*)dst;
  size_t h = 0;
  if (dt == ncclxFloat32) {
    memcpy(dst, acc, H * sizeof(float));
  } else if (dt == ncclxBfloat16) {
    for (; h + 8 <= H; h += 8)
      for (int j = 0; j < 8; j++) d[h + j] = bf16Store(acc[h + j]);
    for (; h < H; h++) d[h] = bf16Store(acc[h]);
  } else {
    for (; h < H; h++) d[h] = moeCore->floatToHalf(acc[h]);
  }
}

static void weightedSum(struct ncclxMoe* m, const float* weights, char* out) {
  size_t H = m->cfg.hidden, K = (size_t)m->cfg.topk;
  ncclxDataType_t dt = m->cfg.datatype;
  for (size_t t = 0; t < m->nTokens; t++) {
    char* dst = out + t * m->rowBytes;
    if (dt == ncclxFloat64) {
      double* acc = m->accD;
      memset(acc, 0, H * sizeof(double));
      for (size_t k = 0; k < K; k++) {
        size_t r = m->pairRow[t * K + k];
        if (r == MOE_DROPPED) continue;
        const double* src = (const double*)(m->stage + r * m->rowBytes);
        double w = weights[t * K + k];
        for (size_t h = 0; h < H; h++) acc[h] += w * src[h];
      }
      memcpy(dst, acc, m->rowBytes);
      continue;
    }
    memset(m->accF, 0, H * sizeof(float));
    for (size_t k = 0; k < K; k++) {
      size_t r = m->pairRow[t * K + k];
      if (r != MOE_DROPPED) accumulateRow(m->accF, m->stage + r * m->rowBytes, weights[t * K + k], H, dt);
    }
    storeRow(dst, m->accF, H, dt);
  }
}

/* Rows coming back from `peer` are the ones dispatch sent it: same counts, same place. */
static ncclxResult_t placeBack(dynExchange* x, int peer, int* placed) {
  moeTask* t = x->ctx;
  struct ncclxMoe* m = t->moe;
  for (int e = m->firstExpert[peer]; e < m->firstExpert[peer + 1]; e++) {
    if (m->backSegs[e] != m->sendSegs[e]) {
      char who[128];
      snprintf(x->why, sizeof(x->why),
               "%s returns %llu rows of expert %d where the dispatch sent it %llu (dispatch and combine of "
               "different calls, or handles on different streams?)",
               moeCore->describeRank(x->call->comm, peer, who, sizeof(who)), (unsigned long long)m->backSegs[e], e,
               (unsigned long long)m->sendSegs[e]);
      return ncclxInvalidUsage;
    }
    m->backDst[e] = m->stage + m->expertStart[e] * m->rowBytes;
  }
  *placed = 1;
  return ncclxSuccess;
}

static ncclxResult_t combineExec(const dynCall* call, void* arg) {
  moeTask* t = arg;
  struct ncclxMoe* m = t->moe;
  if (!m->haveRouting)
    return moeCore->fail(call->comm, ncclxInvalidUsage,
                    "ncclxMoeCombine #%llu: no dispatch completed on this handle before the combine executed "
                    "(queued on another stream?)",
                    (unsigned long long)call->seq);
  int n = m->nranks, nl = m->nLocal, E = m->cfg.nExperts;
  /* Segment (s, i) of the expert output goes back to source s; expert e's rows come back
   * from its owner into the staging rows dispatch packed them from. */
  for (size_t k = 0; k < (size_t)n * (size_t)nl; k++)
    m->outPtr[k] = m->recvSegs[k] ? t->expertOut + m->recvRow[k] * m->rowBytes : NULL;
  /* Both sides know from the dispatch which directions are empty: those carry nothing, not
   * even a header (at decode sizes most pairs of ranks). */
  for (int d = 0; d < n; d++) {
    int first = m->firstExpert[d] < E ? m->firstExpert[d] : 0, nseg = m->firstExpert[d + 1] - m->firstExpert[d];
    m->peers[d] = (dynPeer){.sendPtr = &m->outPtr[(size_t)d * nl],
                            .sendSegs = &m->recvSegs[(size_t)d * nl],
                            .nSendSeg = nl,
                            .nRecvSeg = nseg,
                            .recvSegs = &m->backSegs[first],
                            .recvDst = &m->backDst[first],
                            .noSend = sumSegsOf(&m->recvSegs[(size_t)d * nl], nl) == 0,
                            .noRecv = sumSegsOf(&m->sendSegs[first], nseg) == 0};
  }
  dynExchange x = {.call = call,
                   .unitBytes = m->rowBytes,
                   .unitName = "tokens",
                   .capName = "dispatch counts",
                   .capacity = DYN_NO_CAPACITY,
                   .peers = m->peers,
                   .place = placeBack,
                   .ctx = t};
  NCCLX_CHECK(dynExchangeRun(&x));
  weightedSum(m, t->weights, t->out);
  return ncclxSuccess;
}

/* ---------------- submission ---------------- */

static ncclxResult_t moeRun(void* arg) {
  moeTask* t = arg;
  struct ncclxMoe* m = t->moe;
  /* Counted in tokens and their pairs' rows (the rows actually sent are known only later,
   * after routing; dropped pairs are included here). */
  size_t tokens = t->isCombine ? m->nTokens : t->nTokens;
  dynOpInfo info = {.sendbuff = t->isCombine ? (const void*)t->expertOut : (const void*)t->tokens,
                    .recvbuff = t->isCombine ? (void*)t->out : (void*)t->expertIn,
                    .count = tokens,
                    .bytes = tokens * (size_t)m->cfg.topk * m->rowBytes,
                    .datatype = m->cfg.datatype,
                    .stream = t->stream};
  if (t->isCombine) return dynExecOp(m->comm, "moe_combine", combineExec, t, &info);
  return dynExecOp(m->comm, "moe_dispatch", dispatchExec, t, &info);
}

static void moeTaskRelease(void* arg) {
  moeTask* t = arg;
  moeRelease(t->moe);
  free(t);
}

static ncclxResult_t moeSubmit(moeTask* tmpl, ncclxStream_t stream) {
  moeTask* t = malloc(sizeof(*t));
  if (!t) return moeCore->argError(tmpl->moe->comm, ncclxSystemError, "moe: out of memory queueing an operation");
  *t = *tmpl;
  t->stream = stream;
  atomic_fetch_add(&t->moe->refs, 1);
  return moeCore->enqueue(t->moe->comm, stream, moeRun, moeTaskRelease, t);
}

/* The MoE helpers route, pack and sum rows on the CPU: every buffer must be host memory
 * (device memory would be read by the CPU and crash). names[i] names ptrs[i] in the error. */
static ncclxResult_t moeCheckHost(ncclxComm_t comm, const char* fn, const char* const* names,
                                  const void* const* ptrs, int n) {
  for (int i = 0; i < n; i++)
    if (moeCore->memDevice(ptrs[i]) >= 0)
      return moeCore->argError(comm, ncclxInvalidUsage,
                          "%s: %s is CUDA device memory; the MoE helpers take host buffers "
                          "(ncclxAllToAllvDynamic accepts device buffers)", fn, names[i]);
  return ncclxSuccess;
}

ncclxResult_t moeDispatch(ncclxMoe_t moe, const void* tokens, size_t nTokens, const int32_t* expertIds,
                                   void* expertIn, size_t* expertCounts, ncclxStream_t stream) {
  const char* fn = "ncclxMoeDispatch";
  NCCLX_CHECK(checkHandle(moe, fn));
  ncclxComm_t comm = moe->comm;
  NCCLX_CHECK(moeCore->checkCall(comm, stream, fn));
  NCCLX_CHECK(dynCheckNotGrouped(comm, fn));
  if (nTokens > moe->cfg.maxTokens)
    return moeCore->argError(comm, ncclxInvalidArgument, "%s: nTokens %zu is more than the handle's maxTokens %zu",
                       fn, nTokens, moe->cfg.maxTokens);
  if (nTokens > 0 && (!tokens || !expertIds))
    return moeCore->argError(comm, ncclxInvalidArgument, "%s: %s is NULL with nTokens %zu", fn,
                       !tokens ? "tokens" : "expertIds", nTokens);
  if (moe->cfg.maxRecvTokens > 0 && !expertIn)
    return moeCore->argError(comm, ncclxInvalidArgument, "%s: expertIn is NULL with maxRecvTokens %zu", fn,
                       moe->cfg.maxRecvTokens);
  if (moe->nLocal > 0 && !expertCounts)
    return moeCore->argError(comm, ncclxInvalidArgument, "%s: expertCounts is NULL but rank %d owns %d experts", fn,
                       moe->rank, moe->nLocal);
  const char* const names[] = {"tokens", "expertIds", "expertIn", "expertCounts"};
  const void* const ptrs[] = {tokens, expertIds, expertIn, expertCounts};
  NCCLX_CHECK(moeCheckHost(comm, fn, names, ptrs, 4));
  moeTask t = {.moe = moe,
               .tokens = tokens,
               .nTokens = nTokens,
               .expertIds = expertIds,
               .expertIn = expertIn,
               .expertCounts = expertCounts};
  ncclxResult_t res = moeSubmit(&t, stream);
  /* An expert id out of range is refused after the exchange ran without its pairs (moe.h):
   * the combine reverses that exchange, so the dispatch counts all the same. */
  if (res == ncclxSuccess || res == ncclxInvalidArgument) {
    moe->dispatchCalls++;
    moe->lastCallTokens = nTokens;
  }
  return res;
}

ncclxResult_t moeDroppedCounts(ncclxMoe_t moe, size_t* dropped) {
  const char* fn = "ncclxMoeDroppedCounts";
  NCCLX_CHECK(checkHandle(moe, fn));
  if (!dropped) return moeCore->argError(moe->comm, ncclxInvalidArgument, "%s: dropped is NULL", fn);
  /* The exec lock orders this read after a dispatch still running on a stream's thread. */
  int ref = moeCore->execLock(moe->comm);
  memcpy(dropped, moe->dropped, (size_t)moe->cfg.nExperts * sizeof(size_t));
  moeCore->execUnlock(moe->comm, ref);
  return ncclxSuccess;
}

ncclxResult_t moeCombine(ncclxMoe_t moe, const void* expertOut, const float* weights, void* out,
                                  ncclxStream_t stream) {
  const char* fn = "ncclxMoeCombine";
  NCCLX_CHECK(checkHandle(moe, fn));
  ncclxComm_t comm = moe->comm;
  NCCLX_CHECK(moeCore->checkCall(comm, stream, fn));
  NCCLX_CHECK(dynCheckNotGrouped(comm, fn));
  if (moe->dispatchCalls == 0)
    return moeCore->argError(comm, ncclxInvalidUsage, "%s: no ncclxMoeDispatch was called on this handle", fn);
  if (moe->cfg.maxRecvTokens > 0 && !expertOut)
    return moeCore->argError(comm, ncclxInvalidArgument, "%s: expertOut is NULL with maxRecvTokens %zu", fn,
                       moe->cfg.maxRecvTokens);
  if (moe->lastCallTokens > 0 && (!weights || !out))
    return moeCore->argError(comm, ncclxInvalidArgument, "%s: %s is NULL (the dispatch had %zu tokens)", fn,
                       !weights ? "weights" : "out", moe->lastCallTokens);
  const char* const names[] = {"expertOut", "weights", "out"};
  const void* const ptrs[] = {expertOut, weights, out};
  NCCLX_CHECK(moeCheckHost(comm, fn, names, ptrs, 3));
  moeTask t = {.moe = moe, .isCombine = 1, .expertOut = expertOut, .weights = weights, .out = out};
  return moeSubmit(&t, stream);
}
