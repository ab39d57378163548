/* Tensor-parallel (sequence-parallel) MLP block with CommFuse and OpenBLAS.
 *
 *   tp_linear [-np N] [-m ROWS_PER_RANK] [-k HIDDEN] [-f FFN] [-n ITERS]
 *
 * Rank r holds m rows of the activations X (its share of the sequence) and column shard r
 * of W1 (k x f/N) and row shard r of W2 (f/N x k). The forward pass is
 *
 *   H_r = allgather(X) . W1_r          ncclxAllGatherCompute: one GEMM per arriving block
 *   H_r = relu(H_r)
 *   O_r = reducescatter_rows(H_r . W2_r)  ncclxComputeReduceScatter: one GEMM per block
 *
 * so the gather and the reduction hide behind the GEMMs. Every schedule runs; inputs are
 * small integers (exact in fp32), so each must give O bit for bit equal to the reference
 * computed without communication. Prints the slowest rank's median time per schedule. */
#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "launch.h"
#include "ncclx/fuse.h"

typedef struct {
  int np, m, k, f, iters;
} Shape;

typedef struct {
  const Shape* s;
  int floc;
  const float* w1; /* k x floc */
  const float* w2; /* floc x k */
  float* h;        /* (np*m) x floc */
} Layer;

/* Deterministic small integers in {-1, 0, 1}: what tensor `which` holds at (a, i). */
static float value(int which, int a, size_t i) {
  unsigned long long h = (unsigned long long)(which * 1000003 + a) * 0x9e3779b97f4a7c15ull ^ (i * 0xc2b2ae3d27d4eb4full);
  h ^= h >> 29;
  return (float)((int)(h % 3) - 1);
}

static void fill(float* p, size_t n, int which, int a) {
  for (size_t i = 0; i < n; i++) p[i] = value(which, a, i);
}

/* H rows of block src (slice [off, off+count) of X_src) = X_src rows . W1_r */
static int gemmUp(void* user, int src, size_t off, const void* data, size_t count) {
  Layer* L = user;
  int k = L->s->k, rows = (int)(count / (size_t)k);
  size_t row0 = (size_t)src * (size_t)L->s->m + off / (size_t)k;
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, L->floc, k, 1.0f, data, k, L->w1,
              L->floc, 0.0f, L->h + row0 * (size_t)L->floc, L->floc);
  return 0;
}

/* This rank's partial of output block dst (rows [off/k, ...) of it) = H rows . W2_r */
static int gemmDown(void* user, int dst, size_t off, void* out, size_t count) {
  Layer* L = user;
  int k = L->s->k, rows = (int)(count / (size_t)k);
  size_t row0 = (size_t)dst * (size_t)L->s->m + off / (size_t)k;
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, k, L->floc, 1.0f,
              L->h + row0 * (size_t)L->floc, L->floc, L->w2, k, 0.0f, out, k);
  return 0;
}

static void relu(float* p, size_t n) {
  for (size_t i = 0; i < n; i++) p[i] = p[i] > 0 ? p[i] : 0;
}

/* O for this rank's rows, computed from every rank's inputs with no communication. */
static void reference(const Shape* s, int rank, float* out) {
  int floc = s->f / s->np;
  size_t mk = (size_t)s->m * (size_t)s->k;
  float* x = malloc(sizeof(float) * mk);
  float* w1 = malloc(sizeof(float) * (size_t)s->k * (size_t)floc);
  float* w2 = malloc(sizeof(float) * (size_t)floc * (size_t)s->k);
  float* h = malloc(sizeof(float) * (size_t)s->m * (size_t)floc);
  fill(x, mk, 0, rank);
  memset(out, 0, sizeof(float) * mk);
  for (int j = 0; j < s->np; j++) { /* shard j of the MLP, applied to our rows */
    fill(w1, (size_t)s->k * (size_t)floc, 1, j);
    fill(w2, (size_t)floc * (size_t)s->k, 2, j);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, s->m, floc, s->k, 1.0f, x, s->k, w1, floc, 0.0f, h, floc);
    relu(h, (size_t)s->m * (size_t)floc);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, s->m, s->k, floc, 1.0f, h, floc, w2, s->k, 1.0f, out, s->k);
  }
  free(x), free(w1), free(w2), free(h);
}

static int cmpDouble(const void* a, const void* b) {
  double x = *(const double*)a, y = *(const double*)b;
  return x < y ? -1 : x > y;
}

static int rankMain(int rank, int nranks, ncclxUniqueId id, void* arg) {
  const Shape* s = arg;
  openblas_set_num_threads(1); /* one core per rank: the ranks share the machine */
  ncclxComm_t comm;
  EX_CHECK(NULL, ncclxCommInitRank(&comm, nranks, id, rank));
  Layer L = {.s = s, .floc = s->f / nranks};
  size_t mk = (size_t)s->m * (size_t)s->k;
  float* x = malloc(sizeof(float) * mk);
  float* xall = malloc(sizeof(float) * mk * (size_t)nranks);
  float* w1 = malloc(sizeof(float) * (size_t)s->k * (size_t)L.floc);
  float* w2 = malloc(sizeof(float) * (size_t)L.floc * (size_t)s->k);
  float* o = malloc(sizeof(float) * mk);
  float* ref = malloc(sizeof(float) * mk);
  L.h = malloc(sizeof(float) * (size_t)nranks * (size_t)s->m * (size_t)L.floc);
  fill(x, mk, 0, rank);
  fill(w1, (size_t)s->k * (size_t)L.floc, 1, rank);
  fill(w2, (size_t)L.floc * (size_t)s->k, 2, rank);
  L.w1 = w1, L.w2 = w2;
  reference(s, rank, ref);

  ncclxFuseSchedule_t scheds[] = {NCCLX_FUSE_SEQUENTIAL, NCCLX_FUSE_SLICED(2), NCCLX_FUSE_SLICED(4),
                                  NCCLX_FUSE_RING_P2P, NCCLX_FUSE_RING_P2P_PIECES(4),
                                  NCCLX_FUSE_DIRECT_P2P};
  int nsched = (int)(sizeof(scheds) / sizeof(scheds[0])), bad = 0;
  double* t = malloc(sizeof(double) * (size_t)s->iters);
  if (rank == 0)
    printf("tp_linear: %d ranks, X %dx%d per rank, W1 %dx%d, W2 %dx%d (shards of f=%d)\n", nranks, s->m,
           s->k, s->k, L.floc, L.floc, s->k, s->f);
  for (int si = 0; si < nsched; si++) {
    ncclxFuseSchedule_t sc = scheds[si];
    sc.unit = (size_t)s->k; /* slice at whole rows */
    for (int it = 0; it < s->iters; it++) {
      EX_CHECK(comm, ncclxBarrier(comm, NULL));
      double t0 = exNow();
      EX_CHECK(comm, ncclxAllGatherCompute(x, xall, mk, ncclxFloat32, gemmUp, &L, sc, comm, NULL));
      relu(L.h, (size_t)nranks * (size_t)s->m * (size_t)L.floc);
      EX_CHECK(comm, ncclxComputeReduceScatter(gemmDown, &L, o, mk, ncclxFloat32, ncclxSum, sc, comm, NULL));
      double dt = exNow() - t0;
      EX_CHECK(comm, ncclxAllReduce(&dt, &t[it], 1, ncclxFloat64, ncclxMax, comm, NULL));
    }
    int wrong = memcmp(o, ref, sizeof(float) * mk) != 0, anyWrong = 0;
    EX_CHECK(comm, ncclxAllReduce(&wrong, &anyWrong, 1, ncclxInt32, ncclxMax, comm, NULL));
    bad |= anyWrong;
    qsort(t, (size_t)s->iters, sizeof(double), cmpDouble);
    if (rank == 0)
      printf("  %-10s(%d)  %8.3f ms   output %s\n", ncclxFuseAlgoName(sc.algo), sc.slices,
             t[s->iters / 2] * 1e3, anyWrong ? "WRONG" : "bit-identical to the reference");
  }
  EX_CHECK(comm, ncclxCommDestroy(comm));
  free(x), free(xall), free(w1), free(w2), free(o), free(ref), free(L.h), free(t);
  return bad;
}

int main(int argc, char** argv) {
  Shape s = {.np = 2, .m = 256, .k = 512, .f = 1024, .iters = 5};
  for (int i = 1; i + 1 < argc; i += 2) {
    int v = atoi(argv[i + 1]);
    if (!strcmp(argv[i], "-np")) s.np = v;
    else if (!strcmp(argv[i], "-m")) s.m = v;
    else if (!strcmp(argv[i], "-k")) s.k = v;
    else if (!strcmp(argv[i], "-f")) s.f = v;
    else if (!strcmp(argv[i], "-n")) s.iters = v;
    else argc = 0;
  }
  if (argc == 0 || (argc % 2) == 0 || s.np < 1 || s.m < 1 || s.k < 1 || s.iters < 1 || s.f < s.np ||
      s.f % s.np) {
    fprintf(stderr, "usage: tp_linear [-np N] [-m ROWS] [-k HIDDEN] [-f FFN, a multiple of N] [-n ITERS]\n");
    return 2;
  }
  int rc = exLaunch(s.np, 300, rankMain, &s);
  if (rc) fprintf(stderr, "tp_linear: FAILED\n");
  return rc;
}
