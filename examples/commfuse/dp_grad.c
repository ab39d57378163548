/* Data-parallel training step with sharded weights (ZeRO style), CommFuse and OpenBLAS.
 *
 *   dp_grad [-np N] [-b BATCH] [-k IN] [-n OUT] [-s STEPS]
 *
 * One linear layer Y = X . W, W of k x n, its rows sharded: rank r owns rows
 * [r*k/N, (r+1)*k/N). Each rank has its own batch (X_r, dY_r). One training step:
 *
 *   backward   dW = sum_r X_r^T . dY_r, reduce-scattered by row shard
 *              ncclxComputeReduceScatter: the weight-gradient GEMM of one shard per step,
 *              while the previous shard's partial sum travels;
 *   update     W_shard -= lr * dW_shard                           (local)
 *   forward    Y = X . W with W gathered again
 *              ncclxAllGatherCompute: Y += X[:, rows of shard j] . W_j as shard j arrives.
 *
 * Values are small integers and lr a power of two, so results are exact: every schedule
 * must match the reference computed without communication, bit for bit. */
#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "launch.h"
#include "ncclx/fuse.h"

#define LR 0.125f

typedef struct {
  int np, batch, k, n, steps;
} Shape;

typedef struct {
  const Shape* s;
  int kloc;        /* rows per shard */
  const float* x;  /* batch x k */
  const float* dy; /* batch x n */
  float* y;        /* batch x n */
} Step;

static float value(int which, int a, size_t i) {
  unsigned long long h = (unsigned long long)(which * 1000003 + a) * 0x9e3779b97f4a7c15ull ^ (i * 0xc2b2ae3d27d4eb4full);
  h ^= h >> 29;
  return (float)((int)(h % 3) - 1);
}

static void fill(float* p, size_t n, int which, int a) {
  for (size_t i = 0; i < n; i++) p[i] = value(which, a, i);
}

/* dW rows of shard dst (from row off/n of it) = X[:, those rows]^T . dY */
static int weightGrad(void* user, int dst, size_t off, void* out, size_t count) {
  Step* st = user;
  int n = st->s->n, rows = (int)(count / (size_t)n);
  size_t row0 = (size_t)dst * (size_t)st->kloc + off / (size_t)n;
  cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, rows, n, st->s->batch, 1.0f, st->x + row0,
              st->s->k, st->dy, n, 0.0f, out, n);
  return 0;
}

/* Y += X[:, rows of shard src] . W rows, as they arrive (own shard first). */
static int forwardPart(void* user, int src, size_t off, const void* data, size_t count) {
  Step* st = user;
  int n = st->s->n, rows = (int)(count / (size_t)n);
  size_t row0 = (size_t)src * (size_t)st->kloc + off / (size_t)n;
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, st->s->batch, n, rows, 1.0f, st->x + row0,
              st->s->k, data, n, 1.0f, st->y, n);
  return 0;
}

static int cmpDouble(const void* a, const void* b) {
  double x = *(const double*)a, y = *(const double*)b;
  return x < y ? -1 : x > y;
}

static int rankMain(int rank, int nranks, ncclxUniqueId id, void* arg) {
  const Shape* s = arg;
  openblas_set_num_threads(1);
  ncclxComm_t comm;
  EX_CHECK(NULL, ncclxCommInitRank(&comm, nranks, id, rank));
  int kloc = s->k / nranks;
  size_t bk = (size_t)s->batch * (size_t)s->k, bn = (size_t)s->batch * (size_t)s->n;
  size_t shard = (size_t)kloc * (size_t)s->n, kn = (size_t)s->k * (size_t)s->n;
  float* x = malloc(sizeof(float) * bk);
  float* dy = malloc(sizeof(float) * bn);
  float* y = malloc(sizeof(float) * bn);
  float* w0 = malloc(sizeof(float) * shard); /* initial shard */
  float* w = malloc(sizeof(float) * shard);
  float* grad = malloc(sizeof(float) * shard);
  float* wall = malloc(sizeof(float) * kn);
  Step st = {.s = s, .kloc = kloc, .x = x, .dy = dy, .y = y};
  fill(x, bk, 0, rank);
  fill(dy, bn, 1, rank);

  /* Reference, no communication: the whole W after `steps` updates (every rank's gradient
   * is the same each step, since the data does not change), then Y = X_r . W. */
  float* wref = malloc(sizeof(float) * kn);
  float* gsum = calloc(kn, sizeof(float));
  float* xj = malloc(sizeof(float) * bk);
  float* dyj = malloc(sizeof(float) * bn);
  float* yref = malloc(sizeof(float) * bn);
  for (int j = 0; j < nranks; j++) {
    fill(wref + (size_t)j * shard, shard, 2, j);
    fill(xj, bk, 0, j);
    fill(dyj, bn, 1, j);
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, s->k, s->n, s->batch, 1.0f, xj, s->k, dyj, s->n,
                1.0f, gsum, s->n);
  }
  for (int step = 0; step < s->steps; step++)
    for (size_t i = 0; i < kn; i++) wref[i] -= LR * gsum[i];
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, s->batch, s->n, s->k, 1.0f, x, s->k, wref, s->n,
              0.0f, yref, s->n);
  fill(w0, shard, 2, rank);

  ncclxFuseSchedule_t scheds[] = {NCCLX_FUSE_SEQUENTIAL, NCCLX_FUSE_SLICED(2), NCCLX_FUSE_SLICED(4),
                                  NCCLX_FUSE_RING_P2P, NCCLX_FUSE_RING_P2P_PIECES(4),
                                  NCCLX_FUSE_DIRECT_P2P};
  int nsched = (int)(sizeof(scheds) / sizeof(scheds[0])), bad = 0;
  double* t = malloc(sizeof(double) * (size_t)s->steps);
  if (rank == 0)
    printf("dp_grad: %d ranks, batch %d per rank, W %dx%d in row shards of %d, %d steps\n", nranks,
           s->batch, s->k, s->n, kloc, s->steps);
  for (int si = 0; si < nsched; si++) {
    ncclxFuseSchedule_t sc = scheds[si];
    sc.unit = (size_t)s->n; /* slice at whole rows of W */
    memcpy(w, w0, sizeof(float) * shard);
    for (int step = 0; step < s->steps; step++) {
      EX_CHECK(comm, ncclxBarrier(comm, NULL));
      double t0 = exNow();
      EX_CHECK(comm, ncclxComputeReduceScatter(weightGrad, &st, grad, shard, ncclxFloat32, ncclxSum, sc, comm, NULL));
      for (size_t i = 0; i < shard; i++) w[i] -= LR * grad[i];
      memset(y, 0, sizeof(float) * bn);
      EX_CHECK(comm, ncclxAllGatherCompute(w, wall, shard, ncclxFloat32, forwardPart, &st, sc, comm, NULL));
      double dt = exNow() - t0;
      EX_CHECK(comm, ncclxAllReduce(&dt, &t[step], 1, ncclxFloat64, ncclxMax, comm, NULL));
    }
    int wrong = memcmp(y, yref, sizeof(float) * bn) != 0 ||
                memcmp(w, wref + (size_t)rank * shard, sizeof(float) * shard) != 0;
    int anyWrong = 0;
    EX_CHECK(comm, ncclxAllReduce(&wrong, &anyWrong, 1, ncclxInt32, ncclxMax, comm, NULL));
    bad |= anyWrong;
    qsort(t, (size_t)s->steps, sizeof(double), cmpDouble);
    if (rank == 0)
      printf("  %-10s(%d)  %8.3f ms per step   weights and outputs %s\n", ncclxFuseAlgoName(sc.algo),
             sc.slices, t[s->steps / 2] * 1e3, anyWrong ? "WRONG" : "bit-identical to the reference");
  }
  EX_CHECK(comm, ncclxCommDestroy(comm));
  free(x), free(dy), free(y), free(w0), free(w), free(grad), free(wall), free(wref), free(gsum);
  free(xj), free(dyj), free(yref), free(t);
  return bad;
}

int main(int argc, char** argv) {
  Shape s = {.np = 2, .batch = 128, .k = 1024, .n = 512, .steps = 5};
  for (int i = 1; i + 1 < argc; i += 2) {
    int v = atoi(argv[i + 1]);
    if (!strcmp(argv[i], "-np")) s.np = v;
    else if (!strcmp(argv[i], "-b")) s.batch = v;
    else if (!strcmp(argv[i], "-k")) s.k = v;
    else if (!strcmp(argv[i], "-n")) s.n = v;
    else if (!strcmp(argv[i], "-s")) s.steps = v;
    else argc = 0;
  }
  if (argc == 0 || (argc % 2) == 0 || s.np < 1 || s.batch < 1 || s.n < 1 || s.steps < 1 ||
      s.k < s.np || s.k % s.np) {
    fprintf(stderr, "usage: dp_grad [-np N] [-b BATCH] [-k IN, a multiple of N] [-n OUT] [-s STEPS]\n");
    return 2;
  }
  int rc = exLaunch(s.np, 300, rankMain, &s);
  if (rc) fprintf(stderr, "dp_grad: FAILED\n");
  return rc;
}
