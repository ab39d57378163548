/* An expert-parallel mixture-of-experts layer on ncclx (see README.md).
 *
 *   moe_layer -np 4                 fork 4 local ranks
 *   moe_layer -np 4 -t 32 -e 16 -k 2 -d 128 -f 256
 *   NCCLX_COMM_ID=host:port mpirun -np 4 moe_layer    one process per rank from a launcher
 *
 * Each rank holds T tokens of dimension D and the experts it owns (E experts in all, split
 * contiguously over the ranks; expert e is y = relu(x W1[e]) W2[e] with F hidden units). One
 * forward pass is queued on a stream with nothing in between that waits:
 *
 *   router (host function)  logits = x Wg, top-k, softmax over the k -> ids, weights
 *   ncclxMoeDispatch        tokens to the ranks owning their experts, grouped per expert
 *   experts (host function) each local expert on its rows (counts written by the dispatch)
 *   ncclxMoeCombine         expert outputs back to their tokens, weighted sum
 *
 * Then every rank checks its output against the same layer computed locally (all weights
 * are generated from seeds, so any rank can build any expert). Exit status 0 = correct. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ncclx.h"
#include "ncclx/moe.h"

typedef struct {
  int T, E, K, D, F;
} Dims;

#define CHECK(call)                                                                     \
  do {                                                                                  \
    ncclxResult_t r_ = (call);                                                          \
    if (r_ != ncclxSuccess) {                                                           \
      fprintf(stderr, "moe_layer: %s failed: %s: %s\n", #call, ncclxGetErrorString(r_), \
              ncclxGetLastError(NULL));                                                 \
      exit(1);                                                                          \
    }                                                                                   \
  } while (0)

/* Deterministic weights in [-0.5, 0.5): (seed, index) -> value. */
static float param(unsigned seed, size_t i) {
  unsigned long long x = (seed + 1) * 0x9e3779b97f4a7c15ull + i * 0xbf58476d1ce4e5b9ull;
  x ^= x >> 31;
  x *= 0x94d049bb133111ebull;
  x ^= x >> 29;
  return (float)((x >> 40) & 0xffff) / 65536.0f - 0.5f;
}

enum { SEED_GATE = 1000, SEED_W1 = 2000, SEED_W2 = 3000, SEED_X = 4000 };

/* y[n x cols] = x[n x inner] w[inner x cols], with w generated on the fly. */
static void matmulParam(const float* x, size_t n, int inner, int cols, unsigned seed, float* y) {
  for (size_t r = 0; r < n; r++)
    for (int c = 0; c < cols; c++) {
      float s = 0;
      for (int i = 0; i < inner; i++)
        s += x[r * (size_t)inner + (size_t)i] * param(seed, (size_t)i * (size_t)cols + (size_t)c);
      y[r * (size_t)cols + (size_t)c] = s;
    }
}

static void expertForward(const Dims* d, int e, const float* x, size_t n, float* y, float* hidden) {
  matmulParam(x, n, d->D, d->F, SEED_W1 + (unsigned)e, hidden);
  for (size_t i = 0; i < n * (size_t)d->F; i++) hidden[i] = hidden[i] > 0 ? hidden[i] : 0;
  matmulParam(hidden, n, d->F, d->D, SEED_W2 + (unsigned)e, y);
}

/* Top-k of the gate logits, softmax over the chosen k. */
static void route(const Dims* d, const float* x, int32_t* ids, float* weights) {
  float* logits = malloc(sizeof(float) * (size_t)d->E);
  for (int t = 0; t < d->T; t++) {
    matmulParam(x + (size_t)t * (size_t)d->D, 1, d->D, d->E, SEED_GATE, logits);
    float maxv = -INFINITY, sum = 0;
    for (int k = 0; k < d->K; k++) {
      int best = -1;
      for (int e = 0; e < d->E; e++) {
        int taken = 0;
        for (int j = 0; j < k; j++) taken |= ids[t * d->K + j] == e;
        if (!taken && (best < 0 || logits[e] > logits[best])) best = e;
      }
      ids[t * d->K + k] = best;
      weights[t * d->K + k] = logits[best];
      if (logits[best] > maxv) maxv = logits[best];
    }
    for (int k = 0; k < d->K; k++) sum += weights[t * d->K + k] = expf(weights[t * d->K + k] - maxv);
    for (int k = 0; k < d->K; k++) weights[t * d->K + k] /= sum;
  }
  free(logits);
}

typedef struct {
  const Dims* d;
  int firstExpert, nLocal;
  const float* x;
  int32_t* ids;
  float* weights;
  float* expertIn;
  float* expertOut;
  size_t* expertCounts;
  float* scratch;
} Layer;

static void hostRouter(void* u) {
  Layer* L = u;
  route(L->d, L->x, L->ids, L->weights);
}

static void hostExperts(void* u) {
  Layer* L = u;
  size_t row = 0, D = (size_t)L->d->D;
  for (int i = 0; i < L->nLocal; i++) {
    size_t n = L->expertCounts[i];
    if (n)
      expertForward(L->d, L->firstExpert + i, L->expertIn + row * D, n, L->expertOut + row * D, L->scratch);
    row += n;
  }
}

static int runRank(int rank, int nranks, ncclxComm_t comm, const Dims* d) {
  size_t T = (size_t)d->T, D = (size_t)d->D, K = (size_t)d->K;
  /* Worst case: every token of every rank picks this rank's experts. */
  size_t maxRecv = T * K * (size_t)nranks;
  ncclxMoeConfig_t cfg = {.size = sizeof(cfg),
                          .nExperts = d->E,
                          .topk = d->K,
                          .hidden = D,
                          .datatype = ncclxFloat32,
                          .maxTokens = T,
                          .maxRecvTokens = maxRecv};
  ncclxMoe_t moe;
  CHECK(ncclxMoeCreate(&moe, &cfg, comm));
  Layer L = {.d = d};
  CHECK(ncclxMoeLocalExperts(moe, &L.firstExpert, &L.nLocal));
  float* x = malloc(sizeof(float) * T * D);
  for (size_t i = 0; i < T * D; i++) x[i] = param(SEED_X + (unsigned)rank, i);
  L.x = x;
  L.ids = malloc(sizeof(int32_t) * T * K);
  L.weights = malloc(sizeof(float) * T * K);
  L.expertIn = malloc(sizeof(float) * maxRecv * D);
  L.expertOut = malloc(sizeof(float) * maxRecv * D);
  L.expertCounts = calloc((size_t)L.nLocal + 1, sizeof(size_t));
  L.scratch = malloc(sizeof(float) * maxRecv * (size_t)d->F);
  float* out = malloc(sizeof(float) * T * D);

  ncclxStream_t stream;
  CHECK(ncclxStreamCreate(&stream));
  CHECK(ncclxLaunchHostFunc(stream, hostRouter, &L));
  CHECK(ncclxMoeDispatch(moe, x, T, L.ids, L.expertIn, L.expertCounts, stream));
  CHECK(ncclxLaunchHostFunc(stream, hostExperts, &L));
  CHECK(ncclxMoeCombine(moe, L.expertOut, L.weights, out, stream));
  CHECK(ncclxStreamSynchronize(stream)); /* the only wait of the layer */

  /* Reference: the same layer on this rank alone. */
  float* y = malloc(sizeof(float) * D);
  float* h = malloc(sizeof(float) * (size_t)d->F);
  float* ref = calloc(D, sizeof(float));
  double maxErr = 0;
  size_t received = 0;
  for (int i = 0; i < L.nLocal; i++) received += L.expertCounts[i];
  for (size_t t = 0; t < T; t++) {
    memset(ref, 0, sizeof(float) * D);
    for (size_t k = 0; k < K; k++) {
      expertForward(d, L.ids[t * K + k], x + t * D, 1, y, h);
      for (size_t j = 0; j < D; j++) ref[j] += L.weights[t * K + k] * y[j];
    }
    for (size_t j = 0; j < D; j++) {
      double err = fabs((double)out[t * D + j] - (double)ref[j]);
      if (err > maxErr) maxErr = err;
    }
  }
  int ok = maxErr < 1e-3;
  printf("moe_layer: rank %d: experts %d..%d, %zu rows in, max |out - reference| = %.2e: %s\n", rank,
         L.firstExpert, L.firstExpert + L.nLocal - 1, received, maxErr, ok ? "ok" : "WRONG");
  CHECK(ncclxStreamDestroy(stream));
  CHECK(ncclxMoeDestroy(moe));
  free(x), free(L.ids), free(L.weights), free(L.expertIn), free(L.expertOut), free(L.expertCounts);
  free(L.scratch), free(out), free(y), free(h), free(ref);
  return ok ? 0 : 3;
}

static int rankMain(int rank, int nranks, ncclxUniqueId id, const Dims* d) {
  alarm(120); /* an example must not hang a terminal or a test run */
  ncclxComm_t comm;
  CHECK(ncclxCommInitRank(&comm, nranks, id, rank));
  int rc = runRank(rank, nranks, comm, d);
  CHECK(ncclxCommDestroy(comm));
  return rc;
}

int main(int argc, char** argv) {
  Dims d = {.T = 16, .E = 8, .K = 2, .D = 64, .F = 128};
  int np = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    int v = atoi(argv[i + 1]);
    if (!strcmp(argv[i], "-np")) np = v;
    else if (!strcmp(argv[i], "-t")) d.T = v;
    else if (!strcmp(argv[i], "-e")) d.E = v;
    else if (!strcmp(argv[i], "-k")) d.K = v;
    else if (!strcmp(argv[i], "-d")) d.D = v;
    else if (!strcmp(argv[i], "-f")) d.F = v;
    else {
      fprintf(stderr, "usage: %s [-np N] [-t tokens] [-e experts] [-k topk] [-d dim] [-f ffn]\n", argv[0]);
      return 2;
    }
  }
  if (d.T < 1 || d.E < 1 || d.K < 1 || d.K > d.E || d.D < 1 || d.F < 1 || np < 0 || np > 64) {
    fprintf(stderr, "moe_layer: bad sizes\n");
    return 2;
  }
  if (np == 0) { /* launched by mpirun, Slurm, torchrun...: one process per rank */
    ncclxComm_t comm;
    CHECK(ncclxCommInitFromEnv(&comm));
    int rank, nranks;
    CHECK(ncclxCommUserRank(comm, &rank));
    CHECK(ncclxCommCount(comm, &nranks));
    int rc = runRank(rank, nranks, comm, &d);
    CHECK(ncclxCommDestroy(comm));
    return rc;
  }
  ncclxUniqueId id;
  CHECK(ncclxGetUniqueId(&id));
  fflush(stdout);
  for (int r = 0; r < np; r++) {
    pid_t pid = fork();
    if (pid < 0) {
      perror("fork");
      return 1;
    }
    if (pid == 0) exit(rankMain(r, np, id, &d));
  }
  int rc = 0;
  for (int r = 0; r < np; r++) {
    int st;
    if (wait(&st) < 0 || !WIFEXITED(st) || WEXITSTATUS(st) != 0) rc = 1;
  }
  printf("moe_layer: %d ranks: %s\n", np, rc ? "FAILED" : "ok");
  return rc;
}
