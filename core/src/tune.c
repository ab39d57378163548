/* Algorithm choice: an alpha-beta cost model fills the table, a tuner plugin may adjust
 * it, NCCLX_ALGO may force an entry, and anything the call cannot run stays excluded. */
#include "tune.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "debug.h"
#include "plugin_loader.h"

/* Model constants for the built-in transports (microseconds, microseconds per byte).
 * Rough, measured on the development machines over loopback TCP; the tuning issue makes
 * them measurable per cluster. */
static const double kAlphaUs = 12.0;         /* per message step */
static const double kBetaUsPerByte = 1.0 / 2500.0; /* wire, ~2.5 GB/s */
static const double kGammaUsPerByte = 1.0 / 6000.0; /* reduction, ~6 GB/s */

/* ---------------- NCCLX_ALGO override ---------------- */

static pthread_once_t overrideOnce = PTHREAD_ONCE_INIT;
static int overrideAlgo[NCCLX_NUM_COLLS];

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
  size_t elem = ncclxTypeSize(a->datatype);
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

static double log2ceil(int p) {
  int l = 0;
  while ((1 << l) < p) l++;
  return (double)l;
}

/* Estimated microseconds of algo for this call; < 0 when it does not apply. */
static double modelCost(ncclxCollType_t coll, int algo, int p, double S, double chunk) {
  double a = kAlphaUs, b = kBetaUsPerByte, g = kGammaUsPerByte;
  double L = log2ceil(p), frac = (double)(p - 1) / p;
  int pow2 = (p & (p - 1)) == 0;
  double fold = pow2 ? 0 : 2 * (a + S * b); /* non-power-of-two pre/post step */
  double pipeline = ceil(S / chunk) * a * 0.25;
  if (p == 1) return algo == NCCLX_ALGO_RING || coll == NCCLX_COLL_BARRIER ? 0.0 : 1.0;
  switch (coll) {
    case NCCLX_COLL_ALLREDUCE:
      if (algo == NCCLX_ALGO_RING) return 2 * (p - 1) * a + 2 * frac * S * b + frac * S * g + pipeline;
      if (algo == NCCLX_ALGO_RECURSIVE_DOUBLING) return L * (a + S * (b + g)) + fold;
      if (algo == NCCLX_ALGO_RABENSEIFNER) return 2 * L * a + 2 * frac * S * b + frac * S * g + fold;
      if (algo == NCCLX_ALGO_TREE) return 2 * L * (a + S * b) + L * S * g;
      break;
    case NCCLX_COLL_BROADCAST:
      if (algo == NCCLX_ALGO_TREE) return L * (a + S * b);
      if (algo == NCCLX_ALGO_RING) return (p - 1) * a + S * b + pipeline;
      break;
    case NCCLX_COLL_REDUCE:
      if (algo == NCCLX_ALGO_TREE) return L * (a + S * (b + g));
      break;
    case NCCLX_COLL_ALLGATHER:
      if (algo == NCCLX_ALGO_RING) return (p - 1) * a + frac * S * b;
      if (algo == NCCLX_ALGO_RECURSIVE_DOUBLING) return L * a + frac * S * b;
      if (algo == NCCLX_ALGO_BRUCK) return L * a + frac * S * b + 0.3 * S * b;
      break;
    case NCCLX_COLL_REDUCESCATTER:
      if (algo == NCCLX_ALGO_RING) return (p - 1) * a + frac * S * (b + g);
      if (algo == NCCLX_ALGO_PAIRWISE) return 0.5 * (p - 1) * a + frac * S * (b + g) * 1.2;
      break;
    case NCCLX_COLL_ALLTOALL:
    case NCCLX_COLL_ALLTOALLV:
      if (algo == NCCLX_ALGO_PAIRWISE) return (p - 1) * a + frac * S * b;
      if (algo == NCCLX_ALGO_LINEAR) return 0.5 * (p - 1) * a + frac * S * b * 1.1;
      if (algo == NCCLX_ALGO_BRUCK && coll == NCCLX_COLL_ALLTOALL) return L * a + 0.5 * L * S * b + S * b * 0.3;
      break;
    case NCCLX_COLL_BARRIER:
      return L * a;
    default:
      break;
  }
  return -1.0;
}

static int pickCheapest(const float* table, int* algo, int* proto) {
  float best = -1.0f;
  for (int a = 0; a < NCCLX_NUM_ALGOS; a++)
    for (int p = 0; p < NCCLX_NUM_PROTOS; p++) {
      float c = table[a * NCCLX_NUM_PROTOS + p];
      if (c >= 0.0f && (best < 0.0f || c < best)) best = c, *algo = a, *proto = p;
    }
  return best >= 0.0f;
}

/* ---------------- tuner plugin ---------------- */

void tuneCommInit(struct ncclxComm* comm) {
  pthread_once(&overrideOnce, parseOverride);
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

void tuneSelect(struct ncclxComm* comm, ncclxCollArgs* args) {
  pthread_once(&overrideOnce, parseOverride);
  args->chunkBytes = comm->chunkBytes;
  size_t callBytes = tuneCallBytes(comm, args);
  /* Slot 0 of a fresh comm is {coll 0, bytes 0, algo 0}: mark with algo+1 to tell "empty". */
  unsigned slot = (unsigned)((callBytes * 0x9e3779b97f4a7c15ull) >> 60) ^ (unsigned)args->coll;
  slot %= sizeof(comm->tuneCache) / sizeof(comm->tuneCache[0]);
  if (!comm->tuner && comm->tuneCache[slot].algo > 0 && comm->tuneCache[slot].coll == (int)args->coll &&
      comm->tuneCache[slot].bytes == callBytes) {
    args->algo = comm->tuneCache[slot].algo - 1;
    args->proto = comm->tuneCache[slot].proto;
    return;
  }
  float table[NCCLX_NUM_ALGOS * NCCLX_NUM_PROTOS];
  double bytes = (double)callBytes;
  for (int a = 0; a < NCCLX_NUM_ALGOS; a++)
    for (int p = 0; p < NCCLX_NUM_PROTOS; p++) {
      double c = -1.0;
      if (p == NCCLX_PROTO_SIMPLE && collAlgoSupported(args->coll, a, comm->nranks))
        c = modelCost(args->coll, a, comm->nranks, bytes, (double)comm->chunkBytes);
      table[a * NCCLX_NUM_PROTOS + p] = c < 0 ? NCCLX_TUNER_IGNORE : (float)c;
    }
  int algo = -1, proto = NCCLX_PROTO_SIMPLE;
  pickCheapest(table, &algo, &proto);
  const int defaultAlgo = algo, defaultProto = proto;

  if (comm->tuner) {
    float mine[NCCLX_NUM_ALGOS * NCCLX_NUM_PROTOS];
    memcpy(mine, table, sizeof(mine));
    ncclxTunerQuery_v1_t q = {.coll = args->coll, .bytes = (size_t)bytes, .datatype = args->datatype,
                              .op = args->op, .nranks = comm->nranks, .nhosts = comm->nhosts};
    size_t chunk = comm->chunkBytes;
    int channels = 1;
    ncclxResult_t res = comm->tuner->getCollInfo(comm->tunerCtx, &q, mine, &chunk, &channels);
    if (res == ncclxSuccess && chunk != 0) args->chunkBytes = chunk;
    /* An entry the core ruled out stays out whatever the tuner wrote. */
    for (int i = 0; i < NCCLX_NUM_ALGOS * NCCLX_NUM_PROTOS; i++)
      if (table[i] < 0) mine[i] = NCCLX_TUNER_IGNORE;
    int a = -1, p = -1;
    if (res == ncclxSuccess && pickCheapest(mine, &a, &p)) algo = a, proto = p;
    else if (res != ncclxSuccess)
      TRACE(NCCLX_LOG_TUNING, "tuner '%s' returned %s; default choice kept", comm->tuner->name,
            ncclxGetErrorString(res));
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
  if (args->chunkBytes < 4096) args->chunkBytes = 4096;
  if (args->chunkBytes > comm->maxMessageBytes) args->chunkBytes = comm->maxMessageBytes;
  if (!comm->tuner) {
    comm->tuneCache[slot].coll = (int)args->coll;
    comm->tuneCache[slot].bytes = callBytes;
    comm->tuneCache[slot].algo = algo + 1;
    comm->tuneCache[slot].proto = proto;
  }
}
