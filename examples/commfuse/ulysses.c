/* Ulysses-style sequence-parallel attention with CommFuse and OpenBLAS.
 *
 *   ulysses [-np N] [-s TOKENS_PER_RANK] [-d MODEL_DIM] [-H HEADS] [-dh HEAD_DIM] [-n ITERS]
 *
 * Rank r holds s tokens of the sequence (X_r, s x d); the projection weights are replicated.
 * Attention needs every token of a head, so Ulysses re-lays the activations out twice:
 *
 *   all-to-all 1 (sequence -> heads), ncclxAllToAllCompute:
 *     produce(d):  X_r . Wqkv_d, the q, k, v of our tokens for the H/N heads of rank d
 *     consume(j):  for each of our heads h, S_h += K_j,h^T . V_j,h  (the attention state,
 *                  accumulated per received block of tokens while the next one moves)
 *   all-to-all 2 (heads -> sequence), ncclxAllToAllCompute:
 *     produce(d):  O = Q_d,h . S_h for the tokens of rank d and our heads
 *     consume(j):  Y_r += O_j . Wo_j, the output projection rows of rank j's heads
 *
 * The attention is linear (no softmax): out_i = sum_j (q_i . k_j) v_j = q_i . (K^T V), so it
 * can be taken block by block. fp64 with inputs in {-1, 0, 1}: every partial sum is an
 * integer far below 2^53, so any summation order gives the same bits, and each schedule's Y
 * must equal, bit for bit, both a reference computed without communication and the unfused
 * path (produce everything, ncclxAllToAll, consume everything). Prints the slowest rank's
 * median time per schedule. */
#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "launch.h"
#include "ncclx/fuse.h"

typedef struct {
  int np, s, d, heads, dh, iters;
} Shape;

typedef struct {
  const Shape* sh;
  int rank, hloc;      /* heads per rank */
  int qkvw, ow;        /* row widths of the two all-to-all blocks: 3*hloc*dh, hloc*dh */
  const double* x;     /* s x d, our tokens */
  double** wqkv;       /* per destination rank: d x qkvw, columns [q | k | v] of its heads */
  const double* wo;    /* (heads*dh) x d, rows in head order */
  double* qkv;         /* recvbuff of all-to-all 1: np blocks of s x qkvw */
  double* state;       /* hloc blocks of dh x dh: S_h = K_h^T V_h */
  double* y;           /* s x d, our output */
} Layer;

/* Deterministic small integers in {-1, 0, 1}: what tensor `which` holds at (a, i). */
static double value(int which, int a, size_t i) {
  unsigned long long h = (unsigned long long)(which * 1000003 + a) * 0x9e3779b97f4a7c15ull ^ (i * 0xc2b2ae3d27d4eb4full);
  h ^= h >> 29;
  return (double)((int)(h % 3) - 1);
}

/* Wq, Wk, Wv (d x heads*dh, which = 1..3), Wo (heads*dh x d, which = 4), X_r (which = 0). */
static double wAt(const Shape* s, int which, int row, int col) {
  return value(which, 0, (size_t)row * (size_t)(which == 4 ? s->d : s->heads * s->dh) + (size_t)col);
}

/* ---------------- all-to-all 1: sequence -> heads ---------------- */

static int produceQkv(void* user, int dst, size_t off, void* out, size_t count) {
  Layer* L = user;
  int rows = (int)(count / (size_t)L->qkvw), row0 = (int)(off / (size_t)L->qkvw);
  cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, L->qkvw, L->sh->d, 1.0,
              L->x + (size_t)row0 * (size_t)L->sh->d, L->sh->d, L->wqkv[dst], L->qkvw, 0.0, out, L->qkvw);
  return 0;
}

static int consumeKv(void* user, int src, size_t off, const void* data, size_t count) {
  Layer* L = user;
  (void)src, (void)off;
  int rows = (int)(count / (size_t)L->qkvw), hd = L->hloc * L->sh->dh, dh = L->sh->dh;
  const double* blk = data;
  for (int h = 0; h < L->hloc; h++)
    cblas_dgemm(CblasRowMajor, CblasTrans, CblasNoTrans, dh, dh, rows, 1.0, blk + hd + h * dh, L->qkvw,
                blk + 2 * hd + h * dh, L->qkvw, 1.0, L->state + (size_t)h * dh * dh, dh);
  return 0;
}

/* ---------------- all-to-all 2: heads -> sequence ---------------- */

static int produceOut(void* user, int dst, size_t off, void* out, size_t count) {
  Layer* L = user;
  int rows = (int)(count / (size_t)L->ow), row0 = (int)(off / (size_t)L->ow), dh = L->sh->dh;
  const double* q = L->qkv + ((size_t)dst * (size_t)L->sh->s + (size_t)row0) * (size_t)L->qkvw;
  for (int h = 0; h < L->hloc; h++)
    cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, dh, dh, 1.0, q + h * dh, L->qkvw,
                L->state + (size_t)h * dh * dh, dh, 0.0, (double*)out + h * dh, L->ow);
  return 0;
}

static int consumeProject(void* user, int src, size_t off, const void* data, size_t count) {
  Layer* L = user;
  int rows = (int)(count / (size_t)L->ow), row0 = (int)(off / (size_t)L->ow), d = L->sh->d;
  cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, d, L->ow, 1.0, data, L->ow,
              L->wo + (size_t)src * (size_t)L->ow * (size_t)d, d, 1.0, L->y + (size_t)row0 * (size_t)d, d);
  return 0;
}

/* ---------------- references ---------------- */

/* Y_r from every rank's tokens and all heads, no communication. */
static void reference(const Shape* s, int rank, double* y) {
  size_t S = (size_t)s->np * (size_t)s->s, hw = (size_t)s->heads * (size_t)s->dh;
  double* xall = malloc(sizeof(double) * S * (size_t)s->d);
  double* w[5];
  for (int i = 1; i <= 3; i++) w[i] = malloc(sizeof(double) * (size_t)s->d * hw);
  w[4] = malloc(sizeof(double) * hw * (size_t)s->d);
  double* q = malloc(sizeof(double) * S * hw);
  double* k = malloc(sizeof(double) * S * hw);
  double* v = malloc(sizeof(double) * S * hw);
  double* st = malloc(sizeof(double) * (size_t)s->dh * (size_t)s->dh);
  double* o = malloc(sizeof(double) * (size_t)s->s * hw);
  for (int j = 0; j < s->np; j++)
    for (size_t i = 0; i < (size_t)s->s * (size_t)s->d; i++) xall[(size_t)j * s->s * s->d + i] = value(0, j, i);
  for (int i = 1; i <= 4; i++)
    for (int a = 0; a < (i == 4 ? (int)hw : s->d); a++)
      for (int b = 0; b < (i == 4 ? s->d : (int)hw); b++)
        w[i][(size_t)a * (i == 4 ? (size_t)s->d : hw) + (size_t)b] = wAt(s, i, a, b);
  cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)S, (int)hw, s->d, 1.0, xall, s->d, w[1], (int)hw, 0.0, q, (int)hw);
  cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)S, (int)hw, s->d, 1.0, xall, s->d, w[2], (int)hw, 0.0, k, (int)hw);
  cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)S, (int)hw, s->d, 1.0, xall, s->d, w[3], (int)hw, 0.0, v, (int)hw);
  for (int h = 0; h < s->heads; h++) {
    int dh = s->dh;
    cblas_dgemm(CblasRowMajor, CblasTrans, CblasNoTrans, dh, dh, (int)S, 1.0, k + h * dh, (int)hw, v + h * dh,
                (int)hw, 0.0, st, dh);
    cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, s->s, dh, dh, 1.0,
                q + (size_t)rank * s->s * hw + (size_t)h * dh, (int)hw, st, dh, 0.0, o + h * dh, (int)hw);
  }
  cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, s->s, s->d, (int)hw, 1.0, o, (int)hw, w[4], s->d, 0.0, y, s->d);
  free(xall), free(q), free(k), free(v), free(st), free(o);
  for (int i = 1; i <= 4; i++) free(w[i]);
}

/* The unfused layer: produce every block, ncclxAllToAll, consume every block (same order). */
static void unfused(Layer* L, ncclxComm_t comm, double* send1, double* recv2, double* send2) {
  int n = L->sh->np, r = L->rank;
  size_t c1 = (size_t)L->sh->s * (size_t)L->qkvw, c2 = (size_t)L->sh->s * (size_t)L->ow;
  for (int t = 0; t < n; t++) produceQkv(L, (r + t) % n, 0, send1 + (size_t)((r + t) % n) * c1, c1);
  EX_CHECK(comm, ncclxAllToAll(send1, L->qkv, c1, ncclxFloat64, comm, NULL));
  for (int t = 0; t < n; t++) consumeKv(L, (r - t + n) % n, 0, L->qkv + (size_t)((r - t + n) % n) * c1, c1);
  for (int t = 0; t < n; t++) produceOut(L, (r + t) % n, 0, send2 + (size_t)((r + t) % n) * c2, c2);
  EX_CHECK(comm, ncclxAllToAll(send2, recv2, c2, ncclxFloat64, comm, NULL));
  for (int t = 0; t < n; t++) consumeProject(L, (r - t + n) % n, 0, recv2 + (size_t)((r - t + n) % n) * c2, c2);
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
  Layer L = {.sh = s, .rank = rank, .hloc = s->heads / nranks};
  L.qkvw = 3 * L.hloc * s->dh;
  L.ow = L.hloc * s->dh;
  size_t sd = (size_t)s->s * (size_t)s->d, c1 = (size_t)s->s * (size_t)L.qkvw, c2 = (size_t)s->s * (size_t)L.ow;
  double* x = malloc(sizeof(double) * sd);
  for (size_t i = 0; i < sd; i++) x[i] = value(0, rank, i);
  L.x = x;
  L.wqkv = malloc(sizeof(double*) * (size_t)nranks);
  for (int j = 0; j < nranks; j++) { /* columns of rank j's heads, packed [q | k | v] */
    L.wqkv[j] = malloc(sizeof(double) * (size_t)s->d * (size_t)L.qkvw);
    for (int row = 0; row < s->d; row++)
      for (int part = 0; part < 3; part++)
        for (int c = 0; c < L.ow; c++)
          L.wqkv[j][(size_t)row * L.qkvw + (size_t)part * L.ow + c] = wAt(s, 1 + part, row, j * L.ow + c);
  }
  size_t hw = (size_t)s->heads * (size_t)s->dh;
  double* wo = malloc(sizeof(double) * hw * (size_t)s->d);
  for (size_t a = 0; a < hw; a++)
    for (int b = 0; b < s->d; b++) wo[a * (size_t)s->d + b] = wAt(s, 4, (int)a, b);
  L.wo = wo;
  L.qkv = malloc(sizeof(double) * c1 * (size_t)nranks);
  L.state = malloc(sizeof(double) * (size_t)L.hloc * (size_t)s->dh * (size_t)s->dh);
  L.y = malloc(sizeof(double) * sd);
  double* recv2 = malloc(sizeof(double) * c2 * (size_t)nranks);
  double* send1 = malloc(sizeof(double) * c1 * (size_t)nranks);
  double* send2 = malloc(sizeof(double) * c2 * (size_t)nranks);
  double* ref = malloc(sizeof(double) * sd);
  reference(s, rank, ref);

  ncclxFuseSchedule_t scheds[] = {NCCLX_FUSE_SEQUENTIAL, NCCLX_FUSE_SLICED(2), NCCLX_FUSE_SLICED(4),
                                  NCCLX_FUSE_RING_P2P};
  int nsched = (int)(sizeof(scheds) / sizeof(scheds[0])), bad = 0;
  double* t = malloc(sizeof(double) * (size_t)s->iters);
  if (rank == 0)
    printf("ulysses: %d ranks, %d tokens per rank, model dim %d, %d heads of %d (%d per rank), fp64\n", nranks,
           s->s, s->d, s->heads, s->dh, L.hloc);
  for (int si = -1; si < nsched; si++) { /* -1: the unfused path */
    ncclxFuseSchedule_t sc1 = si < 0 ? NCCLX_FUSE_SEQUENTIAL : scheds[si], sc2 = sc1;
    sc1.unit = (size_t)L.qkvw; /* slices at whole tokens */
    sc2.unit = (size_t)L.ow;
    for (int it = 0; it < s->iters; it++) {
      memset(L.state, 0, sizeof(double) * (size_t)L.hloc * (size_t)s->dh * (size_t)s->dh);
      memset(L.y, 0, sizeof(double) * sd);
      EX_CHECK(comm, ncclxBarrier(comm, NULL));
      double t0 = exNow();
      if (si < 0) {
        unfused(&L, comm, send1, recv2, send2);
      } else {
        EX_CHECK(comm, ncclxAllToAllCompute(produceQkv, consumeKv, &L, L.qkv, c1, ncclxFloat64, sc1, comm, NULL));
        EX_CHECK(comm, ncclxAllToAllCompute(produceOut, consumeProject, &L, recv2, c2, ncclxFloat64, sc2, comm, NULL));
      }
      double dt = exNow() - t0;
      EX_CHECK(comm, ncclxAllReduce(&dt, &t[it], 1, ncclxFloat64, ncclxMax, comm, NULL));
    }
    int wrong = memcmp(L.y, ref, sizeof(double) * sd) != 0, anyWrong = 0;
    EX_CHECK(comm, ncclxAllReduce(&wrong, &anyWrong, 1, ncclxInt32, ncclxMax, comm, NULL));
    bad |= anyWrong;
    qsort(t, (size_t)s->iters, sizeof(double), cmpDouble);
    if (rank == 0) {
      char name[48];
      if (si < 0) snprintf(name, sizeof(name), "unfused (ncclxAllToAll)");
      else snprintf(name, sizeof(name), "%s(%d)", ncclxFuseAlgoName(sc1.algo), sc1.slices);
      printf("  %-24s %8.3f ms   output %s\n", name, t[s->iters / 2] * 1e3,
             anyWrong ? "WRONG" : "bit-identical to the reference");
    }
  }
  EX_CHECK(comm, ncclxCommDestroy(comm));
  for (int j = 0; j < nranks; j++) free(L.wqkv[j]);
  free(L.wqkv), free(x), free(wo), free(L.qkv), free(L.state), free(L.y), free(recv2), free(send1), free(send2);
  free(ref), free(t);
  return bad;
}

int main(int argc, char** argv) {
  Shape s = {.np = 2, .s = 128, .d = 128, .heads = 8, .dh = 32, .iters = 5};
  for (int i = 1; i + 1 < argc; i += 2) {
    int v = atoi(argv[i + 1]);
    if (!strcmp(argv[i], "-np")) s.np = v;
    else if (!strcmp(argv[i], "-s")) s.s = v;
    else if (!strcmp(argv[i], "-d")) s.d = v;
    else if (!strcmp(argv[i], "-H")) s.heads = v;
    else if (!strcmp(argv[i], "-dh")) s.dh = v;
    else if (!strcmp(argv[i], "-n")) s.iters = v;
    else argc = 0;
  }
  if (argc == 0 || (argc % 2) == 0 || s.np < 1 || s.s < 1 || s.d < 1 || s.dh < 1 || s.iters < 1 ||
      s.heads < s.np || s.heads % s.np) {
    fprintf(stderr, "usage: ulysses [-np N] [-s TOKENS_PER_RANK] [-d MODEL_DIM] [-H HEADS, a multiple of N] "
                    "[-dh HEAD_DIM] [-n ITERS]\n");
    return 2;
  }
  int rc = exLaunch(s.np, 300, rankMain, &s);
  if (rc) fprintf(stderr, "ulysses: FAILED\n");
  return rc;
}
