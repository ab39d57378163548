/* fuse-bench: CommFuse schedules against each other on the same transport, with GEMMs.
 *
 *   fuse-bench [-np 2,4] [-m 256] [-w 1024] [-r 0.25,0.5,1,2,4 | -f F1,F2,...] [-n 15]
 *              [-op ag|rs|both] [-link BYTES_PER_SEC] [-blas auto|builtin] [-T timeout_s]
 *
 * Every rank communicates blocks of m x w fp32 (w = the row; slices and pieces are whole
 * rows) and computes one GEMM per block:
 *   ag  all-gather + GEMM:      C_j (m x f) = A_j (m x w) . B (w x f), per gathered block j;
 *   rs  GEMM + reduce-scatter:  P_d (m x w) = A_d (m x f) . B (f x w), per destination d.
 * f is chosen per requested ratio so that M / G takes it (the table shows the measured
 * ratio and the shape), or given with -f to repeat the same shapes elsewhere. Inputs are small integers, exact in fp32, so every schedule's
 * output must equal SEQUENTIAL's bit for bit: checked on every run (exit status 3 if not).
 *
 * Measured in turn, every iteration (alternating, so load from others hits all alike; the
 * order is shuffled each iteration), each time the slowest rank's after a barrier:
 *   G(p)      G_chunked: the block GEMMs on the calling thread, no communication, each
 *             block cut into p = 1, 2, 4, 8 pieces: the same partitions, the same thread
 *             and the same callbacks as the schedules (G = G(1): one GEMM per block);
 *   M         the ring collective alone (SEQUENTIAL with callbacks that do nothing);
 *   T_seq, T_slice(k) for k = 2, 4, 8, T_ring(p) for p = 1, 2, 4, 8 pieces, T_direct,
 *   T_ringD: RING_P2P with the library's default pieces (NCCLX_FUSE_RING_P2P);
 *   T_auto: NCCLX_FUSE_AUTO, the library's choice, and auto/best = T_auto / the fastest fixed
 *   schedule of the row (the target: at most 1.10).
 * The table gives medians (and a row of minima): the best k and the best p, and
 * E = (T - G(p)) / M, the fraction of the communication left exposed, each schedule's T
 * against G with its own partitions (SLICED(k): G(k); SEQUENTIAL, DIRECT_P2P: G(1)), so
 * that E counts communication only; what smaller GEMMs cost shows in T itself.
 *
 * -link emulates a link of that many bytes/s whose transfers cost no CPU (a NIC or NVLink
 * with DMA): a transfer is complete no earlier than bytes/rate after it was posted (after
 * the previous transfer on the same link), and the wait is a sleep. The real
 * shared-memory copy still runs (CPU work), so M is at least the link time. Without -link
 * the shared-memory copies are all there is, on the same cores as the GEMMs.
 * GEMM: OpenBLAS's cblas_sgemm when libopenblas.so.0 can be loaded (one thread), else a
 * plain built-in kernel. Exit status: 0 ok, 1 failure, 2 bad arguments, 3 wrong results. */
#include <dlfcn.h>
#include <sched.h>
#include <stdint.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "ncclx.h"
#include "ncclx/fuse.h"

#define MAX_LIST 16
#define NUM_K 3
#define NUM_P 4
static const int sliceKs[NUM_K] = {2, 4, 8};
static const int ringPs[NUM_P] = {1, 2, 4, 8};

/* What one iteration measures, in this order: G with 1, 2, 4, 8 pieces per block (the
 * partitions of RING_P2P(p) and SLICED(k)), M, then the schedules. */
enum { M_G0, M_M = M_G0 + NUM_P, M_SEQ, M_SL0, M_RING0 = M_SL0 + NUM_K, M_DIRECT = M_RING0 + NUM_P, M_RINGD, M_AUTO, M_NUM };
#define M_G M_G0

/* The G measurement with the same partitions as pieces (or slices) per block. */
static int gOf(int pieces) {
  for (int i = 0; i < NUM_P; i++)
    if (ringPs[i] == pieces) return M_G0 + i;
  return M_G0;
}

typedef struct {
  int np[MAX_LIST], nnp;
  int m, w;
  double ratio[MAX_LIST];
  int nratio;
  int fs[MAX_LIST], nf; /* explicit GEMM free dimensions (-f), instead of ratios */
  int iters;
  int ag, rs;
  int builtinBlas;
  double linkBps, timeoutSec;
} Options;

/* ---------------- GEMM ---------------- */

/* cblas_sgemm's signature with the enums as ints (RowMajor 101, NoTrans 111). */
typedef void (*sgemmFn)(int, int, int, int, int, int, float, const float*, int, const float*, int,
                        float, float*, int);
static sgemmFn blasSgemm;
static const char* gemmName = "built-in";

static void loadBlas(int builtinOnly) {
  if (builtinOnly) return;
  setenv("OPENBLAS_NUM_THREADS", "1", 1); /* one core per rank; before the library starts */
  void* h = dlopen("libopenblas.so.0", RTLD_NOW | RTLD_LOCAL);
  if (!h) return;
  blasSgemm = (sgemmFn)(uintptr_t)dlsym(h, "cblas_sgemm");
  void (*setThreads)(int) = (void (*)(int))(uintptr_t)dlsym(h, "openblas_set_num_threads");
  if (setThreads) setThreads(1);
  if (blasSgemm) gemmName = "OpenBLAS";
}

/* C (rows x n) = A (rows x k, lda) . B (k x n, ldb), row-major. */
static void gemm(int rows, int n, int k, const float* a, int lda, const float* b, int ldb, float* c, int ldc) {
  if (blasSgemm) {
    blasSgemm(101, 111, 111, rows, n, k, 1.0f, a, lda, b, ldb, 0.0f, c, ldc);
    return;
  }
  for (int i = 0; i < rows; i++) {
    float* ci = c + (size_t)i * (size_t)ldc;
    memset(ci, 0, sizeof(float) * (size_t)n);
    for (int p = 0; p < k; p++) {
      float aip = a[(size_t)i * (size_t)lda + (size_t)p];
      const float* bp = b + (size_t)p * (size_t)ldb;
      for (int j = 0; j < n; j++) ci[j] += aip * bp[j];
    }
  }
}

/* ---------------- one rank's benchmark state ---------------- */

typedef struct {
  int rank, n;
  ncclxComm_t comm;
  int ag;
  int m, w, f;  /* block m x w; f = the GEMM's other dimension */
  size_t count; /* elements per block: m * w */
  float* a;     /* AG: own block (m x w); RS: n blocks of m x f */
  float* b;     /* AG: w x f; RS: f x w */
  float* gathered; /* AG: recvbuff */
  float* out;   /* AG: C, n*m x f; RS: the reduced block, m x w */
  float* ref;   /* SEQUENTIAL's out, for the bitwise check */
  float* scratch; /* RS compute-only target: one block */
} Bench;

static double nowSec(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void check(Bench* b, ncclxResult_t res, const char* what) {
  if (res == ncclxSuccess) return;
  fprintf(stderr, "fuse-bench: rank %d: %s failed: %s\n", b ? b->rank : -1, what,
          ncclxGetLastError(b ? b->comm : NULL));
  exit(1);
}

/* Rows [off/w, +count/w) of gathered block src: C rows = A_src rows . B */
static int consumeGemm(void* user, int src, size_t off, const void* data, size_t count) {
  Bench* b = user;
  int rows = (int)(count / (size_t)b->w), row0 = (int)(off / (size_t)b->w);
  gemm(rows, b->f, b->w, data, b->w, b->b, b->f, b->out + ((size_t)src * b->m + (size_t)row0) * (size_t)b->f, b->f);
  return 0;
}

/* Rows [off/w, ...) of our partial for block dst: A_dst rows . B */
static int produceGemm(void* user, int dst, size_t off, void* out, size_t count) {
  Bench* b = user;
  int rows = (int)(count / (size_t)b->w), row0 = (int)(off / (size_t)b->w);
  gemm(rows, b->w, b->f, b->a + ((size_t)dst * b->m + (size_t)row0) * (size_t)b->f, b->f, b->b, b->w, out, b->w);
  return 0;
}

static int consumeNothing(void* user, int src, size_t off, const void* data, size_t count) {
  (void)user, (void)src, (void)off, (void)data, (void)count;
  return 0;
}

/* Leaves the staging as the last real run wrote it (finite values: no slow paths). */
static int produceNothing(void* user, int dst, size_t off, void* out, size_t count) {
  (void)user, (void)dst, (void)off, (void)out, (void)count;
  return 0;
}

/* ---------------- one measurement ---------------- */

static ncclxFuseSchedule_t scheduleOf(const Bench* b, int m, double linkBps) {
  ncclxFuseSchedule_t s = NCCLX_FUSE_SEQUENTIAL;
  if (m >= M_SL0 && m < M_SL0 + NUM_K) s = NCCLX_FUSE_SLICED(sliceKs[m - M_SL0]);
  if (m >= M_RING0 && m < M_RING0 + NUM_P) s = NCCLX_FUSE_RING_P2P_PIECES(ringPs[m - M_RING0]);
  if (m == M_DIRECT) s = NCCLX_FUSE_DIRECT_P2P;
  if (m == M_RINGD) s = NCCLX_FUSE_RING_P2P; /* the library's default pieces */
  if (m == M_AUTO) s = NCCLX_FUSE_AUTO;      /* the library's choice of schedule */
  s.unit = (size_t)b->w;
  s.linkBytesPerSec = linkBps;
  return s;
}

static ncclxResult_t runOp(Bench* b, ncclxFuseSchedule_t s, int noCompute) {
  if (b->ag)
    return ncclxAllGatherCompute(b->a, b->gathered, b->count, ncclxFloat32,
                                 noCompute ? consumeNothing : consumeGemm, b, s, b->comm, NULL);
  return ncclxComputeReduceScatter(noCompute ? produceNothing : produceGemm, b, b->out, b->count,
                                   ncclxFloat32, ncclxSum, s, b->comm, NULL);
}

/* G_chunked: the callbacks of every block, cut into `pieces` the way the library cuts
 * (whole rows, the first m % pieces pieces one row longer), in the order RING_P2P calls
 * them, on this thread, with no communication. */
static void computeOnly(Bench* b, int pieces) {
  int base = b->m / pieces, extra = b->m % pieces;
  for (int t = 0; t < b->n; t++)
    for (int q = 0, row = 0; q < pieces; q++) {
      int rows = base + (q < extra);
      size_t off = (size_t)row * (size_t)b->w, len = (size_t)rows * (size_t)b->w;
      row += rows;
      if (rows == 0) continue;
      if (b->ag) {
        int blk = (b->rank - t + b->n) % b->n;
        consumeGemm(b, blk, off, b->gathered + (size_t)blk * b->count + off, len);
      } else {
        produceGemm(b, (b->rank - t - 1 + b->n) % b->n, off, b->scratch + off, len);
      }
    }
}

/* Time of measurement m, the slowest rank's. */
static double measure(Bench* b, int m, double linkBps) {
  check(b, ncclxBarrier(b->comm, NULL), "ncclxBarrier");
  double t0 = nowSec();
  if (m >= M_G0 && m < M_G0 + NUM_P) computeOnly(b, ringPs[m - M_G0]);
  else check(b, runOp(b, scheduleOf(b, m, linkBps), m == M_M), "fused call");
  double t = nowSec() - t0, tmax = 0;
  check(b, ncclxAllReduce(&t, &tmax, 1, ncclxFloat64, ncclxMax, b->comm, NULL), "ncclxAllReduce");
  return tmax;
}

static size_t outElems(const Bench* b) { return b->ag ? (size_t)b->n * b->m * (size_t)b->f : b->count; }

static const char* measureName(int m) {
  static char name[32];
  if (m == M_SEQ) return "SEQUENTIAL";
  if (m == M_DIRECT) return "DIRECT_P2P";
  if (m == M_RINGD) return "RING_P2P(default)";
  if (m == M_AUTO) return "AUTO";
  if (m >= M_SL0 && m < M_SL0 + NUM_K) snprintf(name, sizeof(name), "SLICED(%d)", sliceKs[m - M_SL0]);
  else snprintf(name, sizeof(name), "RING_P2P(%d)", ringPs[m - M_RING0]);
  return name;
}

/* Every schedule's output must be SEQUENTIAL's, bit for bit (the reference is taken from
 * SEQUENTIAL's warm-up run; later SEQUENTIAL runs are checked against it too). */
static int outputMatches(Bench* b, int m, int setRef) {
  if (m < M_SEQ) return 1;
  if (setRef) {
    memcpy(b->ref, b->out, outElems(b) * sizeof(float));
    return 1;
  }
  return memcmp(b->ref, b->out, outElems(b) * sizeof(float)) == 0;
}

static int cmpDouble(const void* a, const void* b) {
  double x = *(const double*)a, y = *(const double*)b;
  return x < y ? -1 : x > y;
}

static double median(double* v, int n) {
  qsort(v, (size_t)n, sizeof(*v), cmpDouble);
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static int argBest(const double* v, int first, int n) {
  int best = first;
  for (int i = first + 1; i < first + n; i++)
    if (v[i] < v[best]) best = i;
  return best;
}

/* One table row (medians, or minima: the machine's quiet moments when others load it). */
static void printRow(const Bench* b, const char* stat, const double* v) {
  int bk = argBest(v, M_SL0, NUM_K), bp = argBest(v, M_RING0, NUM_P);
  int k = sliceKs[bk - M_SL0], p = ringPs[bp - M_RING0];
  double G = v[M_G], M = v[M_M], ts = v[bk], tr = v[bp], gs = v[gOf(k)], gr = v[gOf(p)];
  /* AUTO against the best fixed schedule of this row (every SLICED(k), RING_P2P(p), DIRECT_P2P,
   * SEQUENTIAL): 1.00 = as fast, 1.10 = 10% slower. */
  double bestFixed = v[M_SEQ];
  for (int m = M_SEQ; m < M_AUTO; m++)
    if (v[m] < bestFixed) bestFixed = v[m];
  printf("%2d %-2s %-6s %4d %5d %5d %6.2f %8.3f %8.3f %8.3f %8.3f %2d %8.3f %8.3f %2d %8.3f %8.3f %8.3f"
         " %6.2f %6.2f %6.2f %6.2f %6.2f %6.2f %6.2f %8.3f %9.2f\n",
         b->n, b->ag ? "ag" : "rs", stat, b->m, b->w, b->f, M / G, M * 1e3, G * 1e3, v[M_SEQ] * 1e3, ts * 1e3, k,
         gs * 1e3, tr * 1e3, p, gr * 1e3, v[M_RINGD] * 1e3, v[M_DIRECT] * 1e3, (v[M_SEQ] - G) / M, (ts - gs) / M,
         (tr - gr) / M, (v[M_DIRECT] - G) / M, v[M_SEQ] / tr, ts / tr, v[M_SEQ] / v[M_DIRECT], v[M_AUTO] * 1e3,
         v[M_AUTO] / bestFixed);
  fflush(stdout);
}

/* ---------------- one (np, op, ratio) ---------------- */

static float small(size_t i, int salt) { return (float)((int)((i * 7 + (size_t)salt * 3) % 5) - 2); }

/* (Re)allocate and fill the GEMM operands for f. */
static void setShape(Bench* b, int f) {
  free(b->a), free(b->b), free(b->out), free(b->ref);
  b->f = f;
  size_t nm = (size_t)b->n * (size_t)b->m;
  size_t na = b->ag ? b->count : nm * (size_t)f, nb = (size_t)b->w * (size_t)f, no = b->ag ? nm * (size_t)f : b->count;
  b->a = malloc(sizeof(float) * na);
  b->b = malloc(sizeof(float) * nb);
  b->out = calloc(no, sizeof(float));
  b->ref = malloc(sizeof(float) * no);
  if (!b->a || !b->b || !b->out || !b->ref) {
    fprintf(stderr, "fuse-bench: rank %d: out of memory\n", b->rank);
    exit(1);
  }
  for (size_t i = 0; i < na; i++) b->a[i] = small(i, b->rank);
  for (size_t i = 0; i < nb; i++) b->b[i] = small(i, 7);
  /* Gathered blocks as SEQUENTIAL would leave them, so G reads the same values. */
  for (size_t i = 0; b->ag && i < nm * (size_t)b->w; i++) b->gathered[i] = small(i % b->count, (int)(i / b->count));
}

/* order = a permutation of 0..n-1 that depends only on seed (Fisher-Yates, LCG). */
static void shuffle(int* order, int n, unsigned seed) {
  unsigned x = seed * 2654435761u + 12345u;
  for (int i = 0; i < n; i++) order[i] = i;
  for (int i = n - 1; i > 0; i--) {
    x = x * 1103515245u + 12345u;
    int j = (int)((x >> 8) % (unsigned)(i + 1)), t = order[i];
    order[i] = order[j];
    order[j] = t;
  }
}

static double bestOf(Bench* b, int m, int times, double linkBps) {
  double best = 1e30;
  for (int i = 0; i < times; i++) {
    double t = measure(b, m, linkBps);
    if (t < best) best = t;
  }
  return best;
}

/* The f that makes G = M / ratio: a first guess from the GEMM rate at f = 64, then one
 * correction. Every rank gets the same times (the slowest rank's), so the same f. */
static int chooseF(Bench* b, double M, double ratio) {
  setShape(b, 64);
  double g64 = bestOf(b, M_G, 3, 0);
  double f = 64 * (M / ratio) / g64;
  int fi = f < 4 ? 4 : f > 65536 ? 65536 : ((int)f + 3) / 4 * 4;
  setShape(b, fi);
  double g = bestOf(b, M_G, 3, 0);
  f = fi * (M / ratio) / g;
  fi = f < 4 ? 4 : f > 65536 ? 65536 : ((int)f + 3) / 4 * 4;
  return fi;
}

static int benchCase(Bench* b, const Options* o) {
  int bad = 0;
  setShape(b, 64);
  for (int m = M_SEQ; m < M_NUM; m++) (void)measure(b, m, o->linkBps); /* connections, staging */
  double mEst[7];
  for (int i = 0; i < 7; i++) mEst[i] = measure(b, M_M, o->linkBps);
  double M0 = median(mEst, 7);
  int points = o->nf ? o->nf : o->nratio;
  for (int ri = 0; ri < points; ri++) {
    setShape(b, o->nf ? o->fs[ri] : chooseF(b, M0, o->ratio[ri]));
    for (int m = M_SEQ; m < M_NUM; m++) { /* warm up */
      (void)measure(b, m, o->linkBps);
      if (m == M_SEQ) (void)outputMatches(b, m, 1);
    }
    double* samples = malloc(sizeof(double) * (size_t)M_NUM * (size_t)o->iters);
    for (int it = 0; it < o->iters; it++) {
      /* A new order every iteration (the same on every rank: a fixed pseudo-random
       * sequence), so what a run leaves behind (caches, the transport's sleeping or armed
       * state, the ranks' skew) does not always bill the same schedule: in a fixed or
       * rotated order, RING_P2P measured right after DIRECT_P2P came out 10-20% slower
       * than the very same schedule measured elsewhere. */
      int order[M_NUM];
      shuffle(order, M_NUM, (unsigned)it);
      for (int i = 0; i < M_NUM; i++) {
        int m = order[i];
        samples[m * o->iters + it] = measure(b, m, o->linkBps);
        int ok = outputMatches(b, m, 0), allOk = 0;
        check(b, ncclxAllReduce(&ok, &allOk, 1, ncclxInt32, ncclxMin, b->comm, NULL), "ncclxAllReduce");
        if (!ok) fprintf(stderr, "fuse-bench: rank %d: %s %s output differs from SEQUENTIAL's\n", b->rank,
                         b->ag ? "ag" : "rs", measureName(m));
        if (!allOk) bad = 1;
      }
    }
    double med[M_NUM], best[M_NUM];
    for (int m = 0; m < M_NUM; m++) {
      med[m] = median(samples + m * o->iters, o->iters); /* sorts: [0] is the minimum */
      best[m] = samples[m * o->iters];
    }
    free(samples);
    if (b->rank == 0) {
      printRow(b, "median", med);
      printRow(b, "min", best);
    }
  }
  if (b->rank == 0 && !bad)
    printf("# np %d %s: every schedule's output bit-identical to SEQUENTIAL's\n", b->n, b->ag ? "ag" : "rs");
  return bad;
}

/* ---------------- ranks ---------------- */

/* One CPU per rank when they fit (NCCLX_FUSE_BENCH_BIND=0: leave it to the scheduler).
 * Unpinned, two ranks on two CPUs sometimes share one CPU for many milliseconds after
 * their threads' wakeups (seen here as the schedule measured right after DIRECT_P2P, whose
 * helper threads had just run, taking 0.3 ms longer than the very same schedule measured
 * elsewhere in the iteration). A rank's helper threads inherit its CPU: one core per rank,
 * as the design assumes. */
static void bindRank(int r, int n) {
  const char* env = getenv("NCCLX_FUSE_BENCH_BIND");
  if (env && strcmp(env, "0") == 0) return;
  cpu_set_t allowed, mine;
  if (sched_getaffinity(0, sizeof(allowed), &allowed) != 0 || n > CPU_COUNT(&allowed)) return;
  for (int cpu = 0, seen = 0; cpu < CPU_SETSIZE; cpu++) {
    if (!CPU_ISSET(cpu, &allowed) || seen++ != r) continue;
    CPU_ZERO(&mine);
    CPU_SET(cpu, &mine);
    (void)sched_setaffinity(0, sizeof(mine), &mine); /* best effort */
    return;
  }
}

typedef struct {
  const Options* o;
  ncclxUniqueId id;
  int n;
} Job;

static int rankMain(int rank, const Job* job) {
  const Options* o = job->o;
  Bench b = {.rank = rank, .n = job->n, .m = o->m, .w = o->w};
  check(&b, ncclxCommInitRank(&b.comm, job->n, job->id, rank), "ncclxCommInitRank");
  int bad = 0;
  for (int op = 0; op < 2; op++) {
    if ((op == 0 && !o->ag) || (op == 1 && !o->rs)) continue;
    b.ag = op == 0;
    b.count = (size_t)b.m * (size_t)b.w;
    b.gathered = malloc(sizeof(float) * (size_t)b.n * b.count);
    b.scratch = malloc(sizeof(float) * b.count);
    if (!b.gathered || !b.scratch) {
      fprintf(stderr, "fuse-bench: rank %d: out of memory\n", rank);
      return 1;
    }
    bad |= benchCase(&b, o);
    free(b.a), free(b.b), free(b.out), free(b.ref), free(b.gathered), free(b.scratch);
    b.a = b.b = b.out = b.ref = NULL;
  }
  check(&b, ncclxCommDestroy(b.comm), "ncclxCommDestroy");
  return bad ? 3 : 0;
}

/* Fork n ranks; returns 0 when all exit 0, else the first bad status. Bounded. */
static int launch(const Options* o, int n) {
  Job job = {.o = o, .n = n};
  check(NULL, ncclxGetUniqueId(&job.id), "ncclxGetUniqueId");
  pid_t pids[64];
  fflush(stdout);
  fflush(stderr);
  for (int r = 0; r < n; r++) {
    pids[r] = fork();
    if (pids[r] < 0) {
      perror("fuse-bench: fork");
      for (int q = 0; q < r; q++) kill(pids[q], SIGKILL);
      return 1;
    }
    if (pids[r] == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL); /* never outlive the launcher */
      bindRank(r, n);
      exit(rankMain(r, &job));
    }
  }
  int result = 0, left = n;
  double deadline = nowSec() + o->timeoutSec;
  while (left > 0) {
    int status;
    pid_t pid = waitpid(-1, &status, WNOHANG);
    if (pid > 0) {
      left--;
      int code = WIFEXITED(status) ? WEXITSTATUS(status) : 1;
      if (code && !result) {
        result = code;
        fprintf(stderr, "fuse-bench: a rank (pid %d) ended with %s %d\n", (int)pid,
                WIFEXITED(status) ? "status" : "signal",
                WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
      }
      continue;
    }
    if (nowSec() > deadline) {
      fprintf(stderr, "fuse-bench: timed out after %.0f s (raise with -T); killing the ranks\n", o->timeoutSec);
      for (int r = 0; r < n; r++) kill(pids[r], SIGKILL);
      while (waitpid(-1, NULL, 0) > 0) {
      }
      return 1;
    }
    usleep(20000);
  }
  return result;
}

/* ---------------- arguments ---------------- */

static double parseSize(const char* s, int* ok) {
  char* end;
  double v = strtod(s, &end);
  if (end == s || v <= 0) *ok = 0;
  switch (*end) {
    case 'K': case 'k': v *= 1e3, end++; break;
    case 'M': case 'm': v *= 1e6, end++; break;
    case 'G': case 'g': v *= 1e9, end++; break;
    default: break;
  }
  if (*end) *ok = 0;
  return v;
}

/* Comma-separated list of positive numbers. */
static int parseList(const char* arg, double* out) {
  char buf[256];
  snprintf(buf, sizeof(buf), "%s", arg);
  int n = 0, ok = 1;
  for (char* tok = strtok(buf, ","); tok && n < MAX_LIST; tok = strtok(NULL, ",")) {
    char* end;
    out[n++] = strtod(tok, &end);
    if (end == tok || *end || out[n - 1] <= 0) ok = 0;
  }
  return ok ? n : 0;
}

static void usage(void) {
  fprintf(stderr,
          "usage: fuse-bench [-np 2,4] [-m ROWS] [-w ROW_ELEMS] [-r 0.25,0.5,1,2,4 | -f F1,F2,...] [-n ITERS]\n"
          "                  [-op ag|rs|both]\n"
          "                  [-link BYTES_PER_SEC (K/M/G = 1e3/1e6/1e9)] [-blas auto|builtin] [-T TIMEOUT_S]\n");
  exit(2);
}

int main(int argc, char** argv) {
  Options o = {.nnp = 2, .np = {2, 4}, .m = 256, .w = 1024, .nratio = 5, .ratio = {0.25, 0.5, 1, 2, 4},
               .iters = 15, .ag = 1, .rs = 1, .timeoutSec = 3600};
  double tmp[MAX_LIST];
  for (int i = 1; i < argc; i++) {
    const char* a = argv[i];
    const char* v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!v) usage();
    int n, ok = 1;
    if (!strcmp(a, "-np")) {
      if (!(n = parseList(v, tmp))) usage();
      for (o.nnp = 0; o.nnp < n; o.nnp++) {
        o.np[o.nnp] = (int)tmp[o.nnp];
        if (o.np[o.nnp] < 1 || o.np[o.nnp] > 64) usage();
      }
    } else if (!strcmp(a, "-m")) {
      if ((o.m = atoi(v)) < 1) usage();
    } else if (!strcmp(a, "-w")) {
      if ((o.w = atoi(v)) < 1) usage();
    } else if (!strcmp(a, "-r")) {
      if (!(o.nratio = parseList(v, o.ratio))) usage();
    } else if (!strcmp(a, "-f")) {
      if (!(n = parseList(v, tmp))) usage();
      for (o.nf = 0; o.nf < n; o.nf++)
        if ((o.fs[o.nf] = (int)tmp[o.nf]) < 1) usage();
    } else if (!strcmp(a, "-n")) {
      if ((o.iters = atoi(v)) < 1) usage();
    } else if (!strcmp(a, "-op")) {
      o.ag = !strcmp(v, "ag") || !strcmp(v, "both");
      o.rs = !strcmp(v, "rs") || !strcmp(v, "both");
      if (!o.ag && !o.rs) usage();
    } else if (!strcmp(a, "-link")) {
      o.linkBps = parseSize(v, &ok);
      if (!ok) usage();
    } else if (!strcmp(a, "-blas")) {
      if (strcmp(v, "auto") && strcmp(v, "builtin")) usage();
      o.builtinBlas = !strcmp(v, "builtin");
    } else if (!strcmp(a, "-T")) {
      if ((o.timeoutSec = atof(v)) <= 0) usage();
    } else {
      usage();
    }
    i++;
  }
  if (!getenv("NCCLX_NET_SOCKET_IFNAME")) setenv("NCCLX_NET_SOCKET_IFNAME", "lo", 1);
  loadBlas(o.builtinBlas);
  long cores = sysconf(_SC_NPROCESSORS_ONLN);
  double load[3] = {0};
  FILE* la = fopen("/proc/loadavg", "r");
  if (la) {
    if (fscanf(la, "%lf %lf %lf", &load[0], &load[1], &load[2]) != 3) load[0] = -1;
    fclose(la);
  }
  printf("# fuse-bench: %ld cores, load average %.2f at start, GEMM %s (1 thread), %s, %d iterations per point\n",
         cores, load[0], gemmName,
         o.linkBps > 0 ? "emulated link" : "shared memory (copies use the cores)", o.iters);
  if (o.linkBps > 0) printf("# link: %.0f MB/s per direction, transfers sleep (no CPU)\n", o.linkBps / 1e6);
  printf("# block m x w fp32 per rank; ag: C_j(m x f) = A_j(m x w) . B(w x f); rs: P_d(m x w) = A_d(m x f) . B(f x w)\n");
  printf("# times in ms; G = G_chunked (N block GEMMs, same thread, no communication); M = collective alone;\n");
  ncclxFuseSchedule_t def = NCCLX_FUSE_RING_P2P;
  def.unit = (size_t)o.w;
  printf("# slice = best SLICED(k), k = %d..%d; ring = best RING_P2P(p), p = %d..%d; ringD = RING_P2P with the\n"
         "# library's default pieces (NCCLX_FUSE_RING_P2P: p =",
         sliceKs[0], sliceKs[NUM_K - 1], ringPs[0], ringPs[NUM_P - 1]);
  for (int i = 0; i < o.nnp; i++)
    printf(" %d at %d ranks%s", ncclxFuseSchedulePieces(def, (size_t)o.m * (size_t)o.w, ncclxFloat32, o.np[i]), o.np[i],
           i + 1 < o.nnp ? "," : ")\n");
  printf("# G_k, G_p = G with the same pieces per block; E = (T - G with the schedule's pieces) / M\n");
  printf("#np op stat      m     w     f    M/G        M        G    T_seq  T_slice  k      G_k   T_ring  p      G_p"
         "  T_ringD T_direct  E_seq E_slice E_ring E_direct seq/ring slice/ring seq/direct   T_auto auto/best\n");
  int result = 0;
  for (int i = 0; i < o.nnp; i++) {
    int r = launch(&o, o.np[i]);
    if (r && !result) result = r;
  }
  double end[3] = {0};
  la = fopen("/proc/loadavg", "r");
  if (la) {
    if (fscanf(la, "%lf %lf %lf", &end[0], &end[1], &end[2]) != 3) end[0] = -1;
    fclose(la);
  }
  printf("# load average at the end %.2f %.2f %.2f\n", end[0], end[1], end[2]);
  return result;
}
