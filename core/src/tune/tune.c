/* Algorithm choice: an alpha-beta cost model (tune_model.c) fills the table, a tuner plugin
 * may adjust it, NCCLX_ALGO may force an entry, and anything the call cannot run stays
 * excluded. Also the hooks ncclx-perf --calibrate/--tune use (see tune.h). */
#include "tune/tune.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "coll/coll_hier.h"
#include "coll/coll_ll.h"
#include "util/debug.h"
#include "plugin/plugin_loader.h"
#include "util/reduce.h"
#include "transport/transport.h"
#include "tune/tune_model.h"
#include "exec/xfer.h"

/* ---------------- NCCLX_ALGO override ---------------- */

static pthread_once_t overrideOnce = PTHREAD_ONCE_INIT;
static int overrideAlgo[NCCLX_NUM_COLLS];
static int overrideProto = -1; /* NCCLX_PROTO=simple|ll: that protocol whenever it can run */

static int lookupName(const char* s, const char* (*nameOf)(int), int n) {
  for (int i = 0; i < n; i++) {
    const char* name = nameOf(i);
    if (name && strcasecmp(name, s) == 0) return i;
  }
  return -1;
}

/* NCCLX_ALGO=allreduce:ring,allgather:bruck */
static void parseOverride(void) {
  for (int c = 0; c < NCCLX_NUM_COLLS; c++) overrideAlgo[c] = -1;
  const char* proto = getenv("NCCLX_PROTO");
  if (proto && *proto) {
    overrideProto = lookupName(proto, ncclxProtoName, NCCLX_NUM_PROTOS);
    if (overrideProto < 0) WARN("NCCLX_PROTO: unknown protocol '%s' (simple, ll); ignored", proto);
  }
  const char* env = getenv("NCCLX_ALGO");
  if (!env || !*env) return;
  char buf[512];
  snprintf(buf, sizeof(buf), "%s", env);
  for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
    char* colon = strchr(tok, ':');
    if (!colon) {
      WARN("NCCLX_ALGO: '%s' is not collective:algorithm; ignored", tok);
      continue;
    }
    *colon = '\0';
    int coll = lookupName(tok, ncclxCollName, NCCLX_NUM_COLLS);
    int algo = lookupName(colon + 1, ncclxAlgoName, NCCLX_NUM_ALGOS);
    if (coll < 0 || algo < 0) {
      WARN("NCCLX_ALGO: unknown %s '%s'; ignored", coll < 0 ? "collective" : "algorithm",
           coll < 0 ? tok : colon + 1);
      continue;
    }
    overrideAlgo[coll] = algo;
  }
}

/* ---------------- cost model ---------------- */

size_t tuneCallBytes(const struct ncclxComm* comm, const ncclxCollArgs* a) {
  size_t elem = dataTypeSize(a->datatype);
  switch (a->coll) {
    case NCCLX_COLL_ALLGATHER:
    case NCCLX_COLL_REDUCESCATTER:
    case NCCLX_COLL_ALLTOALL:
      return a->count * elem * (size_t)comm->nranks;
    case NCCLX_COLL_ALLTOALLV: {
      size_t s = 0, r = 0;
      for (int i = 0; i < comm->nranks; i++) s += a->sendcounts[i], r += a->recvcounts[i];
      return (s > r ? s : r) * elem;
    }
    default:
      return a->count * elem;
  }
}

/* ---------------- ncclx-perf hooks ---------------- */

/* Forced algorithm per collective for --tune (-1: none). Read at every call, so one atomic
 * load; it wins over NCCLX_ALGO and the tuner, and bypasses the choice cache. */
static atomic_int toolForced[NCCLX_NUM_COLLS] = {
    ATOMIC_VAR_INIT(-1), ATOMIC_VAR_INIT(-1), ATOMIC_VAR_INIT(-1), ATOMIC_VAR_INIT(-1),
    ATOMIC_VAR_INIT(-1), ATOMIC_VAR_INIT(-1), ATOMIC_VAR_INIT(-1), ATOMIC_VAR_INIT(-1)};
static atomic_int toolForcedAny;

#define TOOL_API __attribute__((visibility("default")))

TOOL_API int ncclxTuneToolAlgoSupported(ncclxComm_t comm, int coll, int algo) {
  if (!comm || commCheckHandle(comm) != ncclxSuccess || coll < 0 || coll >= NCCLX_NUM_COLLS ||
      algo < 0 || algo >= NCCLX_NUM_ALGOS)
    return 0;
  return collAlgoSupportedOn(comm, (ncclxCollType_t)coll, algo);
}

TOOL_API int ncclxTuneToolForceAlgo(int coll, int algo) {
  if (coll < 0 || coll >= NCCLX_NUM_COLLS || algo < -1 || algo >= NCCLX_NUM_ALGOS) return -1;
  atomic_store(&toolForced[coll], algo);
  int any = 0;
  for (int c = 0; c < NCCLX_NUM_COLLS; c++) any |= atomic_load(&toolForced[c]) >= 0;
  atomic_store(&toolForcedAny, any);
  return 0;
}

TOOL_API int ncclxTuneToolCommTopo(ncclxComm_t comm, int* nhosts, int* modelTransport,
                                   int* peerTransport, const char** tunerName) {
  if (!comm || commCheckHandle(comm) != ncclxSuccess) return -1;
  if (nhosts) *nhosts = comm->nhosts;
  if (modelTransport) *modelTransport = tuneModelTransport(comm);
  if (tunerName) *tunerName = comm->tuner ? comm->tuner->name : NULL;
  if (peerTransport)
    for (int p = 0; p < comm->nranks; p++)
      peerTransport[p] = p == comm->rank ? NCCLX_TP_SHM : transportFor(comm, p);
  return 0;
}

TOOL_API void ncclxTuneToolReduce(void* dst, const void* src, size_t count, ncclxDataType_t type) {
  ncclxReduceInPlace(dst, src, count, type, ncclxSum);
}

/* The LL protocol's constants, measured here against the simple protocol in the same runs
 * (2 ranks, allreduce: 8 B 0.29 vs 0.59 us, 512 B 0.42 vs 0.68 us, 4 KiB 1.75 vs 1.4 us)
 * and scaled to the model's shm alpha: a call's fixed cost and the cost of a byte written
 * or read through the board's cache lines. */
#define TUNE_LL_ALPHA_US 0.40
#define TUNE_LL_BETA_US_PER_BYTE 8.0e-5
/* Bulk broadcasts through the board (see modelTableCompute). */
#define TUNE_LL_BULK_SPEEDUP 1.25
#define TUNE_LL_BULK_OWN_CPU_MIN ((size_t)1 << 20)

/* Fills the cost table of one call: NCCLX_TUNER_IGNORE everywhere except the entries that can
 * run it on comm (the simple protocol's algorithms, and (linear, ll) where the LL protocol
 * can), listed in valid[]. */
static void modelTableCompute(const struct ncclxComm* comm, ncclxCollType_t coll,
                              size_t callBytes, float* table, int* valid, int* nvalid) {
  const TuneModel* m = tuneModelGet();
  int tp = tuneModelTransport(comm);
  double bytes = (double)callBytes;
  int ownCpu = commRanksOwnCpus(comm);
  for (int i = 0; i < NCCLX_NUM_ALGOS * NCCLX_NUM_PROTOS; i++) table[i] = NCCLX_TUNER_IGNORE;
  *nvalid = 0;
  for (int a = 0; a < NCCLX_NUM_ALGOS; a++) {
    if (!collAlgoSupportedOn(comm, coll, a)) continue;
    double c;
    if (a == NCCLX_ALGO_HIERARCHICAL)
      /* Intra-host phases over shm, inter-host ones over the network, whatever tp says. */
      c = collHierModelCost(comm, coll, bytes, m->link[NCCLX_TP_SHM].alphaUs,
                            m->link[NCCLX_TP_SHM].betaUsPerByte, m->link[NCCLX_TP_NET].alphaUs,
                            m->link[NCCLX_TP_NET].betaUsPerByte, m->gammaUsPerByte);
    else
      c = tuneModelCost(m, tp, coll, a, comm->nranks, bytes, (double)comm->chunkBytes, !ownCpu);
    if (c < 0) continue;
    table[a * NCCLX_NUM_PROTOS + NCCLX_PROTO_SIMPLE] = (float)c;
    valid[(*nvalid)++] = a * NCCLX_NUM_PROTOS + NCCLX_PROTO_SIMPLE;
  }
  /* LL: one round through the host's board, entered as (linear, ll). */
  if (!collLLRunnable(comm, coll, callBytes)) return;
  int e = NCCLX_ALGO_LINEAR * NCCLX_NUM_PROTOS + NCCLX_PROTO_LL;
  if (collLLLineRound(comm, coll, callBytes)) {
    table[e] = (float)collLLModelCost(comm, coll, callBytes, TUNE_LL_ALPHA_US,
                                      TUNE_LL_BETA_US_PER_BYTE, m->gammaUsPerByte);
    valid[(*nvalid)++] = e;
    return;
  }
  /* Through the bulk area (an all-gather whose blocks outgrow a line region, a broadcast
   * larger than a bank of lines), priced as the best simple entry times the ratio of the
   * copies. All-gather: n S (each block in once, out n - 1 times) against the ring's
   * 2 (n - 1) S. Broadcast: n + 1 (in once, out n - 1 times, the root's own copy) against
   * 2 (n - 1) + 1 through the transport, and the board's copies are large where the
   * transport's are slot-sized: 2 ranks, 1-64 MiB, 1.2-1.35x the transport's pipelined tree
   * (TUNE_LL_BULK_SPEEDUP), 4 ranks on 2 CPUs 1.5-1.8x at 256 KiB-1 MiB, 8 ranks 2x. What counts
   * when ranks share CPUs is the sum of all copies; with a CPU per rank they run in parallel,
   * and the board pays only for a broadcast from TUNE_LL_BULK_OWN_CPU_MIN on (2 ranks, 64 KiB:
   * 9.9 us against 5.8) and never for an all-gather (3-4 GB/s against 8-16): there the entry
   * costs 4x, so only a tuner or NCCLX_PROTO=ll picks it. */
  double n = comm->nranks, best = -1;
  for (int i = 0; i < *nvalid; i++)
    if (best < 0 || table[valid[i]] < best) best = table[valid[i]];
  /* An all-gather's copies are counted against the ring's, whatever is cheapest. */
  int ring = NCCLX_ALGO_RING * NCCLX_NUM_PROTOS + NCCLX_PROTO_SIMPLE;
  if (coll == NCCLX_COLL_ALLGATHER && table[ring] != NCCLX_TUNER_IGNORE) best = table[ring];
  if (best < 0) return;
  double ratio;
  if (coll == NCCLX_COLL_ALLGATHER) {
    ratio = n / (2 * (n - 1)) * (ownCpu ? 4.0 : 1.0);
  } else {
    ratio = (n + 1) / (2 * n - 1) / TUNE_LL_BULK_SPEEDUP;
    /* At 2 ranks where process_vm_readv is fast (comm->cmaFastAll) the transport copies an
     * ordinary buffer once, and an ncclxMemAlloc one as the board would (mapped): the board
     * only loses (an Intel host, ordinary buffers: 1 MiB 55 us against 90, 16 MiB 1480
     * against 1897). More ranks were not measured: there the tree forwards what it gets. */
    int cmaWins = comm->nranks == 2 && comm->cmaFastAll;
    if (ownCpu && (callBytes < TUNE_LL_BULK_OWN_CPU_MIN || cmaWins)) ratio *= 4.0;
  }
  table[e] = (float)(best * ratio);
  valid[(*nvalid)++] = e;
}

/* With a tuner plugin the core cannot cache its final choice (a tuner may answer
 * differently each time), but its own table only depends on the call's shape and the comm's
 * layout. Calls repeat shapes, so a few tables per thread save recomputing the model on
 * every call; the key holds everything the table depends on, so entries never go stale. */
typedef struct {
  int used, coll, nranks, nhosts, perHost, cpus, tp, cmaFast;
  const void* peers; /* the comm's peer table: whether LL can run depends on it */
  uint64_t commHash; /* with peers: a new comm that got a freed one's table address */
  size_t bytes, chunk;
  unsigned modelGen;
  int nvalid;
  int valid[NCCLX_NUM_ALGOS + 1];
  float table[NCCLX_NUM_ALGOS * NCCLX_NUM_PROTOS];
} TableCacheEntry;
static _Thread_local TableCacheEntry tableCache[4];

static void modelTable(const struct ncclxComm* comm, ncclxCollType_t coll, size_t callBytes,
                       float* table, int* valid, int* nvalid) {
  int tp = tuneModelTransport(comm);
  unsigned gen = tuneModelGeneration();
  TableCacheEntry* e = &tableCache[((callBytes * 0x9e3779b97f4a7c15ull) >> 62) ^ ((unsigned)coll & 3u)];
  if (!(e->used && e->coll == (int)coll && e->bytes == callBytes && e->nranks == comm->nranks &&
        e->nhosts == comm->nhosts && e->perHost == comm->ranksPerHostMax &&
        e->cpus == comm->hostCpusMin && e->tp == tp && e->cmaFast == comm->cmaFastAll &&
        e->peers == (const void*)comm->peerInfo && e->commHash == comm->commHash &&
        e->chunk == comm->chunkBytes && e->modelGen == gen)) {
    modelTableCompute(comm, coll, callBytes, e->table, e->valid, &e->nvalid);
    e->used = 1, e->coll = (int)coll, e->bytes = callBytes, e->nranks = comm->nranks;
    e->nhosts = comm->nhosts, e->perHost = comm->ranksPerHostMax, e->cpus = comm->hostCpusMin;
    e->tp = tp, e->cmaFast = comm->cmaFastAll;
    e->peers = comm->peerInfo, e->commHash = comm->commHash;
    e->chunk = comm->chunkBytes, e->modelGen = gen;
  }
  memcpy(table, e->table, sizeof(e->table));
  memcpy(valid, e->valid, (size_t)e->nvalid * sizeof(int));
  *nvalid = e->nvalid;
}

/* The cheapest non-negative entry among valid[]; the first one on a tie. */
static int pickAmong(const float* table, const int* valid, int nvalid, int* algo, int* proto) {
  float best = -1.0f;
  for (int i = 0; i < nvalid; i++) {
    float c = table[valid[i]];
    if (c >= 0.0f && (best < 0.0f || c < best))
      best = c, *algo = valid[i] / NCCLX_NUM_PROTOS, *proto = valid[i] % NCCLX_NUM_PROTOS;
  }
  return best >= 0.0f;
}

/* ---------------- tuner plugin ---------------- */

void tuneCommInit(struct ncclxComm* comm) {
  pthread_once(&overrideOnce, parseOverride);
  tuneModelGet(); /* a bad calibration file is reported at init, not at the first call */
  const ncclxTuner_t* tuner = NULL;
  if (ncclxTunerAcquire(&tuner) != ncclxSuccess || !tuner) return;
  char section[96];
  snprintf(section, sizeof(section), "tuner.%s", tuner->name);
  ncclxPluginEnv_t env;
  ncclxPluginEnvFill(&env, section);
  ncclxTunerCommInfo_v1_t info = {.commHash = comm->commHash, .rank = comm->rank,
                                  .nranks = comm->nranks, .nhosts = comm->nhosts,
                                  .ranksPerHostMax = comm->ranksPerHostMax, .commName = comm->name};
  void* ctx = NULL;
  ncclxResult_t res = tuner->init(&ctx, &info, &env);
  if (res != ncclxSuccess) {
    WARN("tuner plugin '%s' failed to initialize (%s); using the default tuner", tuner->name,
         ncclxGetErrorString(res));
    ncclxTunerRelease();
    return;
  }
  comm->tuner = tuner;
  comm->tunerCtx = ctx;
}

void tuneCommFinalize(struct ncclxComm* comm) {
  if (!comm->tuner) return;
  comm->tuner->finalize(comm->tunerCtx);
  comm->tuner = NULL;
  comm->tunerCtx = NULL;
  ncclxTunerRelease();
}

/* The pipeline chunk of a call: the tuner's (or the comm's) within [4 KiB, transport max]. */
static size_t clampChunk(const struct ncclxComm* comm, size_t chunk) {
  if (chunk < 4096) chunk = 4096;
  return chunk > comm->maxMessageBytes ? comm->maxMessageBytes : chunk;
}

void tuneSelect(struct ncclxComm* comm, ncclxCollArgs* args) {
  pthread_once(&overrideOnce, parseOverride);
  args->chunkBytes = clampChunk(comm, comm->chunkBytes);
  size_t callBytes = tuneCallBytes(comm, args);
  int toolAlgo = atomic_load_explicit(&toolForcedAny, memory_order_relaxed)
                     ? atomic_load(&toolForced[args->coll])
                     : -1;
  if (toolAlgo >= 0 && collAlgoSupportedOn(comm, args->coll, toolAlgo)) {
    args->algo = toolAlgo;
    args->proto = NCCLX_PROTO_SIMPLE;
    return;
  }
  /* Slot 0 of a fresh comm is {coll 0, bytes 0, algo 0}: mark with algo+1 to tell "empty". */
  unsigned slot = (unsigned)((callBytes * 0x9e3779b97f4a7c15ull) >> 60) ^ (unsigned)args->coll;
  slot %= sizeof(comm->tuneCache) / sizeof(comm->tuneCache[0]);
  if (comm->tuneCache[slot].algo > 0 && comm->tuneCache[slot].coll == (int)args->coll &&
      comm->tuneCache[slot].bytes == callBytes && comm->tuneCache[slot].datatype == (int)args->datatype &&
      comm->tuneCache[slot].op == (int)args->op) {
    args->algo = comm->tuneCache[slot].algo - 1;
    args->proto = comm->tuneCache[slot].proto;
    args->chunkBytes = comm->tuneCache[slot].chunkBytes;
    return;
  }
  /* The entries this call can run, and their modelled cost: only these can be picked. */
  float table[NCCLX_NUM_ALGOS * NCCLX_NUM_PROTOS];
  int valid[NCCLX_NUM_ALGOS + 1], nvalid = 0;
  modelTable(comm, args->coll, callBytes, table, valid, &nvalid);
  int algo = -1, proto = NCCLX_PROTO_SIMPLE;
  pickAmong(table, valid, nvalid, &algo, &proto);
  const int defaultAlgo = algo, defaultProto = proto;

  if (comm->tuner) {
    float mine[NCCLX_NUM_ALGOS * NCCLX_NUM_PROTOS];
    memcpy(mine, table, sizeof(mine));
    ncclxTunerQuery_v1_t q = {.coll = args->coll, .bytes = callBytes, .datatype = args->datatype,
                              .op = args->op, .nranks = comm->nranks, .nhosts = comm->nhosts};
    size_t chunk = comm->chunkBytes;
    int channels = 1;
    ncclxResult_t res = comm->tuner->getCollInfo(comm->tunerCtx, &q, mine, &chunk, &channels);
    if (res == ncclxSuccess && chunk != 0) args->chunkBytes = clampChunk(comm, chunk);
    /* Picking among the core's valid entries only: whatever the tuner wrote elsewhere, an
     * entry the core ruled out stays out. */
    int a = -1, p = -1;
    if (res == ncclxSuccess && pickAmong(mine, valid, nvalid, &a, &p)) algo = a, proto = p;
    else if (res != ncclxSuccess)
      TRACE(NCCLX_LOG_TUNING, "tuner '%s' returned %s; default choice kept", comm->tuner->name,
            ncclxGetErrorString(res));
    else
      TRACE(NCCLX_LOG_TUNING, "tuner '%s' left no runnable entry for %s of %zu bytes; default "
            "choice kept", comm->tuner->name, ncclxCollName(args->coll), callBytes);
  }
  if (overrideProto >= 0 && proto != overrideProto) {
    /* The cheapest entry of that protocol, if the call can run on it at all. */
    float only[NCCLX_NUM_ALGOS * NCCLX_NUM_PROTOS];
    for (int i = 0; i < NCCLX_NUM_ALGOS * NCCLX_NUM_PROTOS; i++)
      only[i] = i % NCCLX_NUM_PROTOS == overrideProto ? table[i] : NCCLX_TUNER_IGNORE;
    int a = -1, p = -1;
    if (pickAmong(only, valid, nvalid, &a, &p)) algo = a, proto = p;
  }
  int forced = overrideAlgo[args->coll];
  if (forced >= 0) {
    if (collAlgoSupported(args->coll, forced, comm->nranks)) algo = forced, proto = NCCLX_PROTO_SIMPLE;
    else
      TRACE(NCCLX_LOG_TUNING, "NCCLX_ALGO asks for %s, which cannot run %s on %d ranks; using %s",
            ncclxAlgoName(forced), ncclxCollName(args->coll), comm->nranks, ncclxAlgoName(algo));
  }
  if (algo < 0) algo = defaultAlgo, proto = defaultProto;
  args->algo = algo;
  args->proto = proto;
  comm->tuneCache[slot].coll = (int)args->coll;
  comm->tuneCache[slot].bytes = callBytes;
  comm->tuneCache[slot].datatype = (int)args->datatype;
  comm->tuneCache[slot].op = (int)args->op;
  comm->tuneCache[slot].algo = algo + 1;
  comm->tuneCache[slot].proto = proto;
  comm->tuneCache[slot].chunkBytes = args->chunkBytes;
}
