/* fuse-bench: CommFuse schedules against each other on the same transport.
 *
 *   fuse-bench [-np 2,4] [-b 256K,2M] [-r 0.25,0.5,1,2] [-n 11] [-op ag|rs|both]
 *              [-link BYTES_PER_SEC] [-T timeout_s]
 *
 * For each rank count (forked local ranks), operation and block size (bytes per rank), the
 * compute callback burns a configurable number of multiply-add passes over its block
 * (deterministic; values stay the small integers they start as, so every schedule's output
 * must be bit-identical to SEQUENTIAL's, and is checked). Its cost is calibrated so that
 * M / G takes each requested ratio, where
 *   M       = SEQUENTIAL with callbacks that do nothing: the ring collective alone;
 *   G       = G_chunked: the callbacks of all blocks, no communication, all ranks at once.
 * Every iteration runs G, M and each schedule in turn (alternating, so load from others on
 * the machine hits them alike); a time is the slowest rank's; the table shows medians:
 *   T_seq, T_slice (best k of 2, 4, 8, with k), T_ring, T_direct, and the exposed
 *   communication E = (T - G) / M of each (SEQUENTIAL ~1, SLICED ~1/k, CommFuse ~0 when
 *   M <= G).
 * -link emulates a link of that many bytes/s whose transfers cost no CPU (every step
 * sleeps until its bytes could have crossed it); without it the shared-memory copies
 * compete with the compute for the cores. Exit status: 0 ok, 1 failure, 2 bad arguments,
 * 3 wrong results. */
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
static const int sliceKs[NUM_K] = {2, 4, 8};

/* What one iteration measures, in this order. */
enum { M_G, M_M, M_SEQ, M_SL0, M_RING = M_SL0 + NUM_K, M_DIRECT, M_NUM };

typedef struct {
  int np[MAX_LIST], nnp;
  size_t bytes[MAX_LIST];
  int nbytes;
  double ratio[MAX_LIST];
  int nratio;
  int iters;
  int ag, rs;
  double linkBps, timeoutSec;
} Options;

typedef struct {
  int rank, n;
  ncclxComm_t comm;
  int ag;
  size_t count; /* elements per block */
  int passes;
  float* in;       /* AG: own block; RS: n blocks of inputs */
  float* gathered; /* AG: recvbuff */
  float* out;      /* AG: n blocks computed; RS: the reduced block */
  float* ref;      /* SEQUENTIAL's out, for the bitwise check */
  float* scratch;  /* RS compute-only target: one block */
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

/* ---------------- the compute ---------------- */

/* volatile: the compiler must not see that a pass is y*1+0 and drop it. */
static volatile float burnMul = 1.0f, burnAdd = 0.0f;

static void burn(float* dst, const float* src, size_t count, int passes) {
  const float a = burnMul, c = burnAdd;
  enum { TILE = 1024 }; /* stays in L1 across the passes */
  for (size_t t0 = 0; t0 < count; t0 += TILE) {
    size_t tn = count - t0 < TILE ? count - t0 : TILE;
    float* d = dst + t0;
    memcpy(d, src + t0, tn * sizeof(float));
    for (int p = 0; p < passes; p++)
      for (size_t i = 0; i < tn; i++) d[i] = d[i] * a + c;
  }
}

static int consumeBurn(void* user, int src, size_t off, const void* data, size_t count) {
  Bench* b = user;
  burn(b->out + (size_t)src * b->count + off, data, count, b->passes);
  return 0;
}

static int produceBurn(void* user, int dst, size_t off, void* out, size_t count) {
  Bench* b = user;
  burn(out, b->in + (size_t)dst * b->count + off, count, b->passes);
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

static ncclxFuseSchedule_t scheduleOf(int m, double linkBps) {
  ncclxFuseSchedule_t s = NCCLX_FUSE_SEQUENTIAL;
  if (m >= M_SL0 && m < M_SL0 + NUM_K) s = NCCLX_FUSE_SLICED(sliceKs[m - M_SL0]);
  if (m == M_RING) s = NCCLX_FUSE_RING_P2P;
  if (m == M_DIRECT) s = NCCLX_FUSE_DIRECT_P2P;
  s.linkBytesPerSec = linkBps;
  return s;
}

static ncclxResult_t runOp(Bench* b, ncclxFuseSchedule_t s, int noCompute) {
  if (b->ag)
    return ncclxAllGatherCompute(b->in, b->gathered, b->count, ncclxFloat32,
                                 noCompute ? consumeNothing : consumeBurn, b, s, b->comm, NULL);
  return ncclxComputeReduceScatter(noCompute ? produceNothing : produceBurn, b, b->out, b->count,
                                   ncclxFloat32, ncclxSum, s, b->comm, NULL);
}

/* The callbacks of every block with no communication: what the compute costs when cut
 * into one partition per rank. */
static void computeOnly(Bench* b) {
  for (int t = 0; t < b->n; t++) {
    int blk = (b->rank - t + b->n) % b->n;
    if (b->ag) consumeBurn(b, blk, 0, b->gathered + (size_t)blk * b->count, b->count);
    else produceBurn(b, blk, 0, b->scratch, b->count);
  }
}

/* Time of measurement m, the slowest rank's. */
static double measure(Bench* b, int m, double linkBps) {
  check(b, ncclxBarrier(b->comm, NULL), "ncclxBarrier");
  double t0 = nowSec();
  if (m == M_G) computeOnly(b);
  else check(b, runOp(b, scheduleOf(m, linkBps), m == M_M), "fused call");
  double t = nowSec() - t0, tmax = 0;
  check(b, ncclxAllReduce(&t, &tmax, 1, ncclxFloat64, ncclxMax, b->comm, NULL), "ncclxAllReduce");
  return tmax;
}

static size_t outElems(const Bench* b) { return b->ag ? (size_t)b->n * b->count : b->count; }

/* Every schedule's output must be SEQUENTIAL's, bit for bit. */
static int outputMatches(Bench* b, int m) {
  if (m == M_G || m == M_M) return 1;
  if (m == M_SEQ) {
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

/* One table row from per-measurement times (medians, or minima: the machine's quiet
 * moments when others load it). */
static void printRow(const Bench* b, const char* opName, const char* stat, const double* v) {
  int bestK = 0;
  for (int k = 1; k < NUM_K; k++)
    if (v[M_SL0 + k] < v[M_SL0 + bestK]) bestK = k;
  double G = v[M_G], M = v[M_M], tSlice = v[M_SL0 + bestK];
  printf("%2d %-21s %-6s %6zuK %5.2f %7.3f %7.3f %7.3f %7.3f(k=%d) %7.3f %7.3f %6.2f %6.2f %6.2f %6.2f %6.2fx %6.2fx\n",
         b->n, opName, stat, b->count * sizeof(float) / 1024, M / G, M * 1e3, G * 1e3, v[M_SEQ] * 1e3,
         tSlice * 1e3, sliceKs[bestK], v[M_RING] * 1e3, v[M_DIRECT] * 1e3, (v[M_SEQ] - G) / M,
         (tSlice - G) / M, (v[M_RING] - G) / M, (v[M_DIRECT] - G) / M, v[M_SEQ] / v[M_RING],
         tSlice / v[M_RING]);
  fflush(stdout);
}

/* ---------------- one (np, op, size) ---------------- */

static void fillInputs(Bench* b) {
  size_t nin = b->ag ? b->count : (size_t)b->n * b->count;
  for (size_t i = 0; i < nin; i++) b->in[i] = (float)((int)((i * 7 + (size_t)b->rank * 3) % 9) - 4);
  memset(b->out, 0, outElems(b) * sizeof(float));
}

/* Seconds per element per pass of the compute, measured on every rank at once. */
static double calibrate(Bench* b) {
  const int passes = 32;
  b->passes = passes;
  double best = 1e30;
  for (int i = 0; i < 3; i++) {
    double t = measure(b, M_G, 0);
    if (t < best) best = t;
  }
  return best / ((double)b->n * (double)b->count * passes);
}

static int benchCase(Bench* b, const Options* o) {
  const char* opName = b->ag ? "allgather+consume" : "produce+reducescatter";
  fillInputs(b);
  /* Warm up every schedule (connections, staging), then estimate M alone. */
  b->passes = 1;
  for (int m = M_SEQ; m < M_NUM; m++) (void)measure(b, m, o->linkBps);
  double perElemPass = calibrate(b);
  double mEst[7];
  for (int i = 0; i < 7; i++) mEst[i] = measure(b, M_M, o->linkBps);
  double M0 = median(mEst, 7);
  int bad = 0;
  for (int ri = 0; ri < o->nratio; ri++) {
    double gTarget = M0 / o->ratio[ri];
    double p = gTarget / (perElemPass * (double)b->n * (double)b->count);
    b->passes = p < 1 ? 1 : (int)(p + 0.5);
    double* samples = malloc(sizeof(double) * (size_t)M_NUM * (size_t)o->iters);
    for (int it = 0; it < o->iters; it++)
      for (int m = 0; m < M_NUM; m++) {
        samples[m * o->iters + it] = measure(b, m, o->linkBps);
        if (!outputMatches(b, m)) {
          if (b->rank == 0 || !bad)
            fprintf(stderr, "fuse-bench: rank %d: %s output of %s differs from SEQUENTIAL's\n",
                    b->rank, opName, m == M_RING ? "RING_P2P" : m == M_DIRECT ? "DIRECT_P2P" : "SLICED");
          bad = 1;
        }
      }
    double med[M_NUM], best[M_NUM];
    for (int m = 0; m < M_NUM; m++) {
      med[m] = median(samples + m * o->iters, o->iters); /* sorts: [0] is the minimum */
      best[m] = samples[m * o->iters];
    }
    free(samples);
    if (b->rank == 0) {
      printRow(b, opName, "median", med);
      printRow(b, opName, "min", best);
    }
  }
  return bad;
}

/* ---------------- ranks ---------------- */

typedef struct {
  const Options* o;
  ncclxUniqueId id;
  int n;
} Job;

static int rankMain(int rank, const Job* job) {
  const Options* o = job->o;
  Bench b = {.rank = rank, .n = job->n};
  check(&b, ncclxCommInitRank(&b.comm, job->n, job->id, rank), "ncclxCommInitRank");
  int bad = 0;
  for (int op = 0; op < 2; op++) {
    if ((op == 0 && !o->ag) || (op == 1 && !o->rs)) continue;
    for (int bi = 0; bi < o->nbytes; bi++) {
      b.ag = op == 0;
      b.count = o->bytes[bi] / sizeof(float);
      size_t nc = (size_t)b.n * b.count;
      b.in = malloc(sizeof(float) * (b.ag ? b.count : nc));
      b.gathered = malloc(sizeof(float) * nc);
      b.out = malloc(sizeof(float) * nc);
      b.ref = malloc(sizeof(float) * nc);
      b.scratch = malloc(sizeof(float) * b.count);
      if (!b.in || !b.gathered || !b.out || !b.ref || !b.scratch) {
        fprintf(stderr, "fuse-bench: rank %d: out of memory\n", rank);
        return 1;
      }
      bad |= benchCase(&b, o);
      free(b.in), free(b.gathered), free(b.out), free(b.ref), free(b.scratch);
    }
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

static size_t parseSize(const char* s, int* ok) {
  char* end;
  double v = strtod(s, &end);
  if (end == s || v <= 0) *ok = 0;
  switch (*end) {
    case 'K': case 'k': v *= 1024, end++; break;
    case 'M': case 'm': v *= 1024 * 1024, end++; break;
    case 'G': case 'g': v *= 1024.0 * 1024 * 1024, end++; break;
    default: break;
  }
  if (*end) *ok = 0;
  return (size_t)v;
}

/* Comma-separated list into doubles (sizes with K/M/G suffixes when isSize). */
static int parseList(const char* arg, double* out, int isSize) {
  char buf[256];
  snprintf(buf, sizeof(buf), "%s", arg);
  int n = 0, ok = 1;
  for (char* tok = strtok(buf, ","); tok && n < MAX_LIST; tok = strtok(NULL, ",")) {
    if (isSize) {
      out[n++] = (double)parseSize(tok, &ok);
    } else {
      char* end;
      out[n++] = strtod(tok, &end);
      if (end == tok || *end || out[n - 1] <= 0) ok = 0;
    }
  }
  return ok ? n : 0;
}

static void usage(void) {
  fprintf(stderr,
          "usage: fuse-bench [-np 2,4] [-b 256K,2M] [-r 0.25,0.5,1,2] [-n ITERS] [-op ag|rs|both]\n"
          "                  [-link BYTES_PER_SEC] [-T TIMEOUT_S]\n");
  exit(2);
}

int main(int argc, char** argv) {
  Options o = {.nnp = 2, .np = {2, 4}, .nbytes = 2, .bytes = {256 * 1024, 2 * 1024 * 1024},
               .nratio = 4, .ratio = {0.25, 0.5, 1, 2}, .iters = 11, .ag = 1, .rs = 1,
               .timeoutSec = 1800};
  double tmp[MAX_LIST];
  for (int i = 1; i < argc; i++) {
    const char* a = argv[i];
    const char* v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!v) usage();
    int n;
    if (!strcmp(a, "-np")) {
      if (!(n = parseList(v, tmp, 0))) usage();
      for (o.nnp = 0; o.nnp < n; o.nnp++) {
        o.np[o.nnp] = (int)tmp[o.nnp];
        if (o.np[o.nnp] < 1 || o.np[o.nnp] > 64) usage();
      }
    } else if (!strcmp(a, "-b")) {
      if (!(n = parseList(v, tmp, 1))) usage();
      for (o.nbytes = 0; o.nbytes < n; o.nbytes++) {
        o.bytes[o.nbytes] = (size_t)tmp[o.nbytes] / sizeof(float) * sizeof(float);
        if (!o.bytes[o.nbytes]) usage();
      }
    } else if (!strcmp(a, "-r")) {
      if (!(o.nratio = parseList(v, o.ratio, 0))) usage();
    } else if (!strcmp(a, "-n")) {
      o.iters = atoi(v);
      if (o.iters < 1) usage();
    } else if (!strcmp(a, "-op")) {
      o.ag = !strcmp(v, "ag") || !strcmp(v, "both");
      o.rs = !strcmp(v, "rs") || !strcmp(v, "both");
      if (!o.ag && !o.rs) usage();
    } else if (!strcmp(a, "-link")) {
      o.linkBps = (double)parseSize(v, &(int){1});
    } else if (!strcmp(a, "-T")) {
      o.timeoutSec = atof(v);
      if (o.timeoutSec <= 0) usage();
    } else {
      usage();
    }
    i++;
  }
  if (!getenv("NCCLX_NET_SOCKET_IFNAME")) setenv("NCCLX_NET_SOCKET_IFNAME", "lo", 1);
  long cores = sysconf(_SC_NPROCESSORS_ONLN);
  printf("# fuse-bench: %ld cores, link %s, %d iterations per point, times in ms (median and min rows); "
         "E = (T - G) / M; speedups are T_seq/T_ring and T_slice/T_ring\n",
         cores, o.linkBps > 0 ? "emulated" : "shared memory (copies use the cores)", o.iters);
  if (o.linkBps > 0) printf("# emulated link: %.0f MB/s per direction, transfers sleep\n", o.linkBps / 1e6);
  printf("#np op                    stat     block   M/G   M(ms)   G(ms)   T_seq   T_slice(k)    T_ring T_direct  E_seq E_slice E_ring E_direct seq/ring slice/ring\n");
  int result = 0;
  for (int i = 0; i < o.nnp; i++) {
    int r = launch(&o, o.np[i]);
    if (r && !result) result = r;
  }
  return result;
}
