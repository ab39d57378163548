/* mpi-coll-bench: the ncclx-perf measurement, made with MPI collectives, so that the two
 * tables can be compared row by row (tools/compare-mpi does that).
 *
 *   mpirun -np 4 mpi-coll-bench allreduce -b 8 -e 16M
 *
 * float32 and sum only. Sizes, timing, columns and busbw factors follow ncclx-perf (and so
 * nccl-tests): time = max over ranks of the per-rank mean, algbw = size / time, busbw =
 * algbw * the op's factor, #wrong = wrong result elements summed over ranks. Rank 0 prints. */
#ifndef _GNU_SOURCE
#define _POSIX_C_SOURCE 200809L /* clock_gettime, sigaction */
#endif
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <mpi.h>

enum { OP_ALLREDUCE, OP_BROADCAST, OP_REDUCE, OP_ALLGATHER, OP_REDUCESCATTER, OP_ALLTOALL, NUM_OPS };

typedef struct {
  const char* name;  /* ncclx-perf's name for the op */
  int perRankSplit;  /* the printed size is count * 4 * nranks */
  int isReduction;
  int hasRoot;
} OpInfo;

static const OpInfo ops[NUM_OPS] = {
    [OP_ALLREDUCE] = {"allreduce", 0, 1, 0},   [OP_BROADCAST] = {"broadcast", 0, 0, 1},
    [OP_REDUCE] = {"reduce", 0, 1, 1},         [OP_ALLGATHER] = {"allgather", 1, 0, 0},
    [OP_REDUCESCATTER] = {"reducescatter", 1, 1, 0}, [OP_ALLTOALL] = {"alltoall", 1, 0, 0},
};

#define ELEM_SIZE sizeof(float)
#define PERIOD 101 /* data patterns repeat every PERIOD elements */

typedef struct {
  int opList[NUM_OPS];
  int nops;
  size_t minBytes, maxBytes, factor;
  long iters, warmup;
  int check, barrier, percentiles, root;
  double timeoutSec;
} Options;

typedef struct {
  const Options* opt;
  int rank, nranks;
  float* sendbuf;
  float* recvbuf;
  double* samples;      /* per-op times of the timed loop, in us */
  double sumTable[PERIOD]; /* expected sum at index j, by j % PERIOD */
} Bench;

/* ---- command line (the ncclx-perf flags that apply to float sum) ---- */

static void usage(FILE* f) {
  fprintf(f,
          "usage: mpirun [...] mpi-coll-bench <op> [flags]\n"
          "  op: allreduce broadcast reduce allgather reducescatter alltoall | all\n"
          "  -b SIZE   smallest size in bytes (default 8); K, M, G suffixes (x1024)\n"
          "  -e SIZE   largest size in bytes (default 64M)\n"
          "  -f N      size multiplier between rows (default 2)\n"
          "  -n N      timed iterations per size (default 20)\n"
          "  -w N      warmup iterations per size (default 5)\n"
          "  -c 0|1    check results at every size (default 1)\n"
          "  -z 0|1    1 = barrier before each op, time the op alone (OSU style)\n"
          "  -r RANK   root of broadcast and reduce (default 0)\n"
          "  -I        also print per-iteration p50 and p99 (max over ranks)\n"
          "  -d float, -o sum   accepted for symmetry with ncclx-perf; nothing else is\n"
          "  -T SEC    abort the whole job if this process runs longer (default 600)\n"
          "  -h        this help\n"
          "Sizes, timing and columns are those of ncclx-perf. Exit status: 0 ok,\n"
          "2 bad arguments, 3 wrong results (MPI errors abort the job).\n");
}

static int parseSize(const char* s, size_t* out) {
  char* end;
  if (*s < '0' || *s > '9') return -1;
  errno = 0;
  unsigned long long v = strtoull(s, &end, 10);
  if (errno) return -1;
  unsigned long long mult = 1;
  if (*end == 'k' || *end == 'K') mult = 1ull << 10;
  else if (*end == 'm' || *end == 'M') mult = 1ull << 20;
  else if (*end == 'g' || *end == 'G') mult = 1ull << 30;
  if (mult > 1) end++;
  if (*end == 'B' || *end == 'b') end++;
  if (*end != '\0' || v == 0 || v > (1ull << 40) / mult) return -1;
  *out = (size_t)(v * mult);
  return 0;
}

static int parseLong(const char* s, long lo, long hi, long* out) {
  char* end;
  errno = 0;
  long v = strtol(s, &end, 10);
  if (errno || end == s || *end != '\0' || v < lo || v > hi) return -1;
  *out = v;
  return 0;
}

/* Every rank parses, only rank 0 complains. */
#define ARG_ERR(...)                                   \
  do {                                                 \
    if (rank == 0) {                                   \
      fprintf(stderr, "mpi-coll-bench: " __VA_ARGS__); \
      fprintf(stderr, "\n");                           \
    }                                                  \
    return -1;                                         \
  } while (0)

/* 0: run; 1: help; -1: bad arguments (rank 0 printed why). */
static int parseArgs(int argc, char** argv, int rank, Options* o) {
  *o = (Options){.minBytes = 8, .maxBytes = 64u << 20, .factor = 2, .iters = 20, .warmup = 5,
                 .check = 1, .timeoutSec = 600};
  for (int i = 1; i < argc; i++) {
    const char* a = argv[i];
    if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) return 1;
    if (a[0] != '-') {
      if (o->nops) ARG_ERR("more than one op given ('%s')", a);
      if (strcmp(a, "all") == 0) {
        for (int k = 0; k < NUM_OPS; k++) o->opList[k] = k;
        o->nops = NUM_OPS;
        continue;
      }
      for (int k = 0; k < NUM_OPS; k++)
        if (strcmp(a, ops[k].name) == 0) o->opList[o->nops++] = k;
      if (!o->nops) ARG_ERR("unknown op '%s'", a);
      continue;
    }
    if (strcmp(a, "-I") == 0) {
      o->percentiles = 1;
      continue;
    }
    if (strlen(a) < 2 || !strchr("befnwczrdoT", a[1]))
      ARG_ERR("unknown or unsupported flag '%s'", a);
    char flag = a[1];
    const char* val;
    if (a[2] != '\0') val = a + 2; /* -b8 as well as -b 8 */
    else if (i + 1 < argc) val = argv[++i];
    else ARG_ERR("flag '%s' needs a value", a);
    long v = 0;
    switch (flag) {
      case 'b':
        if (parseSize(val, &o->minBytes)) ARG_ERR("-b: bad size '%s' (bytes >= 1, K/M/G suffix)", val);
        break;
      case 'e':
        if (parseSize(val, &o->maxBytes)) ARG_ERR("-e: bad size '%s' (bytes >= 1, K/M/G suffix)", val);
        break;
      case 'f':
        if (parseLong(val, 2, 1 << 20, &v)) ARG_ERR("-f: bad factor '%s' (integer >= 2)", val);
        o->factor = (size_t)v;
        break;
      case 'n':
        if (parseLong(val, 1, 10000000, &o->iters))
          ARG_ERR("-n: bad iteration count '%s' (1..10000000)", val);
        break;
      case 'w':
        if (parseLong(val, 0, 10000000, &o->warmup))
          ARG_ERR("-w: bad warmup count '%s' (0..10000000)", val);
        break;
      case 'c':
      case 'z':
        if (parseLong(val, 0, 1, &v)) ARG_ERR("-%c: expected 0 or 1, got '%s'", flag, val);
        *(flag == 'c' ? &o->check : &o->barrier) = (int)v;
        break;
      case 'r':
        if (parseLong(val, 0, 1 << 30, &v)) ARG_ERR("-r: bad root '%s'", val);
        o->root = (int)v;
        break;
      case 'd':
        if (strcmp(val, "float") != 0 && strcmp(val, "float32") != 0)
          ARG_ERR("-d %s: only float is implemented", val);
        break;
      case 'o':
        if (strcmp(val, "sum") != 0) ARG_ERR("-o %s: only sum is implemented", val);
        break;
      case 'T': {
        char* end;
        o->timeoutSec = strtod(val, &end);
        if (end == val || *end != '\0' || !(o->timeoutSec >= 1) || o->timeoutSec > 1e7)
          ARG_ERR("-T: bad timeout '%s' (seconds >= 1)", val);
        break;
      }
    }
  }
  if (!o->nops) ARG_ERR("no op given");
  if (o->minBytes > o->maxBytes) ARG_ERR("-b %zu is larger than -e %zu", o->minBytes, o->maxBytes);
  if (o->maxBytes / ELEM_SIZE > INT32_MAX)
    ARG_ERR("-e %zu: MPI counts are int, so at most %zu bytes", o->maxBytes,
            (size_t)INT32_MAX * ELEM_SIZE);
  return 0;
}
#undef ARG_ERR

/* ---- data patterns: small integers, so every float sum is exact in any order ---- */

/* Reductions: (rank + j) % PERIOD, summed over ranks at most 100 * nranks < 2^24. Copies:
 * values that differ between ranks and positions, so a block from the wrong source or
 * offset shows up. */
static float patternValue(int reduction, int rank, size_t j) {
  size_t r = (size_t)rank % PERIOD, m = j % PERIOD;
  return reduction ? (float)((r + m) % PERIOD) : (float)((r * 37 + m * 13) % PERIOD);
}

static void fill(float* buf, size_t count, int reduction, int rank, size_t base) {
  for (size_t i = 0; i < count; i++) buf[i] = patternValue(reduction, rank, base + i);
}

/* buf[i] should be the sum over ranks at index base + i. NaN (the poison) never matches. */
static uint64_t wrongSummed(const Bench* b, const float* buf, size_t count, size_t base) {
  uint64_t wrong = 0;
  for (size_t i = 0; i < count; i++)
    if (!((double)buf[i] == b->sumTable[(base + i) % PERIOD])) wrong++;
  return wrong;
}

/* buf[i] should be rank src's copy value at index base + i. */
static uint64_t wrongCopied(const float* buf, size_t count, int src, size_t base) {
  uint64_t wrong = 0;
  for (size_t i = 0; i < count; i++)
    if (!(buf[i] == patternValue(0, src, base + i))) wrong++;
  return wrong;
}

/* ---- one op ---- */

static double nowUs(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e6 + ts.tv_nsec * 1e-3;
}

/* count is the argument of the call: per rank for the split ops, like ncclx-perf. MPI_Bcast
 * works in one buffer: the root's recvbuf holds the data, the others receive into theirs. */
static void issue(const Bench* b, int op, size_t count) {
  int n = (int)count; /* fits: checked by the caller */
  float* s = b->sendbuf;
  float* r = b->recvbuf;
  switch (op) {
    case OP_ALLREDUCE: MPI_Allreduce(s, r, n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD); break;
    case OP_BROADCAST: MPI_Bcast(r, n, MPI_FLOAT, b->opt->root, MPI_COMM_WORLD); break;
    case OP_REDUCE: MPI_Reduce(s, r, n, MPI_FLOAT, MPI_SUM, b->opt->root, MPI_COMM_WORLD); break;
    case OP_ALLGATHER: MPI_Allgather(s, n, MPI_FLOAT, r, n, MPI_FLOAT, MPI_COMM_WORLD); break;
    case OP_REDUCESCATTER:
      MPI_Reduce_scatter_block(s, r, n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
      break;
    case OP_ALLTOALL: MPI_Alltoall(s, n, MPI_FLOAT, r, n, MPI_FLOAT, MPI_COMM_WORLD); break;
  }
}

/* Elements each rank sends (and so fills) and receives (and so poisons). */
static void bufferElems(int op, size_t count, int nranks, size_t* sendElems, size_t* recvElems) {
  *sendElems = *recvElems = count;
  if (op == OP_ALLGATHER) *recvElems = count * (size_t)nranks;
  if (op == OP_REDUCESCATTER) *sendElems = count * (size_t)nranks;
  if (op == OP_ALLTOALL) *sendElems = *recvElems = count * (size_t)nranks;
}

/* Fills this rank's input; with poison, NaN-fills the output first so that a result left
 * over from an earlier call cannot pass the check. */
static void prepare(const Bench* b, int op, size_t count, int poison) {
  size_t sendElems, recvElems;
  bufferElems(op, count, b->nranks, &sendElems, &recvElems);
  if (poison) memset(b->recvbuf, 0xFF, recvElems * ELEM_SIZE);
  if (op == OP_BROADCAST) {
    if (b->rank == b->opt->root) fill(b->recvbuf, count, 0, b->rank, 0);
    return;
  }
  fill(b->sendbuf, sendElems, ops[op].isReduction, b->rank, 0);
}

static uint64_t verify(const Bench* b, int op, size_t count) {
  const float* out = b->recvbuf;
  uint64_t wrong = 0;
  switch (op) {
    case OP_ALLREDUCE: return wrongSummed(b, out, count, 0);
    case OP_REDUCE: return b->rank == b->opt->root ? wrongSummed(b, out, count, 0) : 0;
    case OP_REDUCESCATTER: return wrongSummed(b, out, count, (size_t)b->rank * count);
    case OP_BROADCAST: return wrongCopied(out, count, b->opt->root, 0);
    case OP_ALLGATHER:
    case OP_ALLTOALL:
      /* Block p came from rank p: its whole input (allgather) or the block it addressed to
       * us (alltoall). */
      for (int p = 0; p < b->nranks; p++)
        wrong += wrongCopied(out + (size_t)p * count, count, p,
                             op == OP_ALLTOALL ? (size_t)b->rank * count : 0);
      return wrong;
  }
  return 0;
}

static int cmpDouble(const void* a, const void* b) {
  double x = *(const double*)a, y = *(const double*)b;
  return (x > y) - (x < y);
}

/* Nearest-rank percentile of sorted samples. */
static double percentile(const double* sorted, long n, double q) {
  long idx = (long)ceil(q * (double)n) - 1;
  return sorted[idx < 0 ? 0 : (idx >= n ? n - 1 : idx)];
}

/* This rank's mean, p50, p99 (us) and #wrong at one size. */
static void measure(Bench* b, int op, size_t count, double stats[3], uint64_t* wrong) {
  const Options* o = b->opt;
  prepare(b, op, count, 0);
  for (long k = 0; k < o->warmup; k++) {
    if (o->barrier) MPI_Barrier(MPI_COMM_WORLD);
    issue(b, op, count);
  }
  /* Line the ranks up so the first timed op does not absorb their skew. */
  MPI_Barrier(MPI_COMM_WORLD);
  double prev = nowUs(), sum = 0;
  for (long k = 0; k < o->iters; k++) {
    if (o->barrier) {
      MPI_Barrier(MPI_COMM_WORLD);
      prev = nowUs();
    }
    issue(b, op, count);
    double now = nowUs();
    b->samples[k] = now - prev; /* back to back, these add up to the whole loop */
    sum += b->samples[k];
    prev = now;
  }
  stats[0] = sum / o->iters;
  stats[1] = stats[2] = 0;
  if (o->percentiles) {
    qsort(b->samples, (size_t)o->iters, sizeof(double), cmpDouble);
    stats[1] = percentile(b->samples, o->iters, 0.50);
    stats[2] = percentile(b->samples, o->iters, 0.99);
  }
  *wrong = 0;
  if (o->check) {
    prepare(b, op, count, 1);
    issue(b, op, count);
    *wrong = verify(b, op, count);
  }
}

static double busFactor(int op, int nranks) {
  double n = nranks;
  if (op == OP_ALLREDUCE) return 2.0 * (n - 1) / n;
  if (op == OP_ALLGATHER || op == OP_REDUCESCATTER || op == OP_ALLTOALL) return (n - 1) / n;
  return 1.0;
}

static void printHeader(const Bench* b, int op, const char* library) {
  const Options* o = b->opt;
  printf("# mpi-coll-bench %s: nranks %d, dtype float, op %s, iters %ld, warmup %ld, check %d",
         ops[op].name, b->nranks, ops[op].isReduction ? "sum" : "none", o->iters, o->warmup,
         o->check);
  if (ops[op].hasRoot) printf(", root %d", o->root);
  printf(", barrier %d, sizes %zu..%zu x%zu\n", o->barrier, o->minBytes, o->maxBytes, o->factor);
  printf("# library: %s\n", library);
  printf("#%50s  out-of-place\n", "");
  printf("#%11s  %12s  %8s  %6s  %5s  %9s", "size(B)", "count(elems)", "type", "redop", "root",
         "time(us)");
  if (o->percentiles) printf("  %9s  %9s", "p50(us)", "p99(us)");
  printf("  %11s  %11s  %7s\n", "algbw(GB/s)", "busbw(GB/s)", "#wrong");
  fflush(stdout);
}

/* Runs every size of one op; returns the total #wrong over sizes and ranks. */
static uint64_t runOp(Bench* b, int op, const char* library) {
  const Options* o = b->opt;
  size_t unit = ELEM_SIZE * (ops[op].perRankSplit ? (size_t)b->nranks : 1);
  uint64_t wrongTotal = 0;
  double busSum = 0;
  int rows = 0;
  size_t lastCount = 0;
  if (b->rank == 0) printHeader(b, op, library);
  for (size_t size = o->minBytes;; size *= o->factor) {
    size_t count = size / unit;
    if (count > 0 && count != lastCount) {
      lastCount = count;
      double stats[3];
      uint64_t wrong;
      measure(b, op, count, stats, &wrong);
      MPI_Allreduce(MPI_IN_PLACE, stats, 3, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
      MPI_Allreduce(MPI_IN_PLACE, &wrong, 1, MPI_UINT64_T, MPI_SUM, MPI_COMM_WORLD);
      wrongTotal += wrong;
      if (b->rank == 0) {
        size_t bytes = count * unit;
        double algbw = stats[0] > 0 ? (double)bytes / stats[0] / 1e3 : 0; /* B/us = MB/s */
        double busbw = algbw * busFactor(op, b->nranks);
        printf("%12zu  %12zu  %8s  %6s  %5d  %9.3f", bytes, bytes / ELEM_SIZE, "float",
               ops[op].isReduction ? "sum" : "none", ops[op].hasRoot ? o->root : -1, stats[0]);
        if (o->percentiles) printf("  %9.3f  %9.3f", stats[1], stats[2]);
        printf("  %11.3f  %11.3f", algbw, busbw);
        if (o->check) printf("  %7llu\n", (unsigned long long)wrong);
        else printf("  %7s\n", "N/A");
        fflush(stdout);
        busSum += busbw;
        rows++;
      }
    }
    if (size > o->maxBytes / o->factor) break; /* the next size would pass -e (or overflow) */
  }
  if (b->rank == 0) {
    if (rows == 0)
      printf("# no size in %zu..%zu bytes gives %s a whole float element per call (%d ranks)\n",
             o->minBytes, o->maxBytes, ops[op].name, b->nranks);
    printf("# Out of bounds values : %llu %s\n", (unsigned long long)wrongTotal,
           wrongTotal ? "FAILED" : "OK");
    printf("# Avg bus bandwidth : %.4f\n", rows ? busSum / rows : 0.0);
    fflush(stdout);
  }
  return wrongTotal;
}

/* A rank stuck in a collective (a peer wedged, not dead) would wait forever: the alarm
 * ends this process, and mpirun then takes the whole job down. */
static void onAlarm(int sig) {
  static const char msg[] = "mpi-coll-bench: -T timeout reached, aborting\n";
  (void)sig;
  ssize_t ignored = write(STDERR_FILENO, msg, sizeof msg - 1);
  (void)ignored;
  _exit(124);
}

static void armTimeout(double seconds) {
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = onAlarm;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGALRM, &sa, NULL);
  alarm((unsigned)ceil(seconds));
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  Bench b;
  memset(&b, 0, sizeof b);
  MPI_Comm_rank(MPI_COMM_WORLD, &b.rank);
  MPI_Comm_size(MPI_COMM_WORLD, &b.nranks);
  Options opt;
  int parsed = parseArgs(argc, argv, b.rank, &opt);
  if (parsed == 0 && opt.root >= b.nranks) {
    for (int i = 0; i < opt.nops; i++)
      if (ops[opt.opList[i]].hasRoot) parsed = -1;
    if (parsed < 0 && b.rank == 0)
      fprintf(stderr, "mpi-coll-bench: -r %d: root must be below the rank count %d\n", opt.root,
              b.nranks);
  }
  if (parsed != 0) {
    if (b.rank == 0) usage(parsed > 0 ? stdout : stderr);
    MPI_Finalize();
    return parsed > 0 ? 0 : 2;
  }
  armTimeout(opt.timeoutSec);
  b.opt = &opt;
  for (size_t m = 0; m < PERIOD; m++) {
    double s = 0;
    for (int r = 0; r < b.nranks; r++) s += patternValue(1, r, m);
    b.sumTable[m] = s;
  }
  /* Every op's input and output fit in -e bytes (the size counts the larger of the two). */
  size_t bytes = (opt.maxBytes < 4096 ? 4096 : opt.maxBytes + 4095) / 4096 * 4096;
  b.sendbuf = aligned_alloc(4096, bytes);
  b.recvbuf = aligned_alloc(4096, bytes);
  b.samples = malloc((size_t)opt.iters * sizeof(double));
  if (!b.sendbuf || !b.recvbuf || !b.samples) {
    fprintf(stderr, "mpi-coll-bench: out of memory for 2 x %zu bytes (rank %d)\n", bytes, b.rank);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  char library[MPI_MAX_LIBRARY_VERSION_STRING];
  int len = 0;
  MPI_Get_library_version(library, &len);
  library[strcspn(library, "\n")] = '\0'; /* first line: name and version */
  if (b.rank == 0) setvbuf(stdout, NULL, _IOLBF, 0);
  uint64_t wrong = 0;
  for (int i = 0; i < opt.nops; i++) {
    if (i > 0 && b.rank == 0) printf("\n");
    wrong += runOp(&b, opt.opList[i], library);
  }
  free(b.samples);
  free(b.sendbuf);
  free(b.recvbuf);
  MPI_Finalize();
  return wrong ? 3 : 0;
}
