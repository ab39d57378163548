/* ncclx-perf command line: nccl-tests flags plus -z, -I, -a, -np and -T.
 * Included by ncclx-perf.c only. */
#ifndef NCCLX_PERF_ARGS_H
#define NCCLX_PERF_ARGS_H

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ncclx.h"
#include "perf_data.h"

enum {
  PERF_ALLREDUCE,
  PERF_BROADCAST,
  PERF_REDUCE,
  PERF_ALLGATHER,
  PERF_REDUCESCATTER,
  PERF_ALLTOALL,
  PERF_SENDRECV,
  PERF_NUM_OPS
};

typedef struct {
  const char* name;
  int perRankSplit; /* the printed size is count * typesize * nranks */
  int isReduction;  /* uses -o */
  int hasRoot;      /* uses -r */
  int inPlace;      /* has an in-place form */
} PerfOpInfo;

static const PerfOpInfo perfOps[PERF_NUM_OPS] = {
    [PERF_ALLREDUCE] = {"allreduce", 0, 1, 0, 1},
    [PERF_BROADCAST] = {"broadcast", 0, 0, 1, 1},
    [PERF_REDUCE] = {"reduce", 0, 1, 1, 1},
    [PERF_ALLGATHER] = {"allgather", 1, 0, 0, 1},
    [PERF_REDUCESCATTER] = {"reducescatter", 1, 1, 0, 1},
    [PERF_ALLTOALL] = {"alltoall", 1, 0, 0, 0},
    [PERF_SENDRECV] = {"sendrecv", 0, 0, 0, 0},
};

/* nccl-tests bus bandwidth factors (see reference/cpu-anchors.md section 3). */
static double perfBusFactor(int op, int nranks) {
  double n = nranks;
  switch (op) {
    case PERF_ALLREDUCE: return 2.0 * (n - 1) / n;
    case PERF_ALLGATHER:
    case PERF_REDUCESCATTER:
    case PERF_ALLTOALL: return (n - 1) / n;
    default: return 1.0;
  }
}

static const char* const perfRedOpNames[] = {"sum", "prod", "max", "min", "avg"};

typedef struct {
  int ops[PERF_NUM_OPS];
  int nops;
  size_t minBytes, maxBytes, factor;
  long iters, warmup;
  int check, barrier, percentiles, inPlace;
  int plainBuffers; /* -M malloc: ordinary memory instead of ncclxMemAlloc's */
  const PerfType* type;
  ncclxRedOp_t redop;
  int root;
  int nprocs;        /* -np: 0 = ranks come from the environment */
  double timeoutSec; /* -T: bound on the whole -np run */
  int mode;          /* PERF_MODE_* */
  int verify;        /* --verify: compare a rules file with the default tuner */
  const char* outPath;    /* -o FILE with --calibrate and --tune */
  const char* verifyPath; /* --verify FILE, or the --tune output with --tune --verify */
  double tolerance;       /* --tol: rules/default above 1 + tol is "slower" */
  unsigned given;         /* PERF_GIVEN_* bits: flags the user set, mode defaults fill the rest */
} PerfOptions;

enum { PERF_MODE_BENCH, PERF_MODE_CALIBRATE, PERF_MODE_TUNE, PERF_MODE_VERIFY };
enum { PERF_GIVEN_B = 1, PERF_GIVEN_E = 2, PERF_GIVEN_F = 4, PERF_GIVEN_N = 8, PERF_GIVEN_W = 16 };

static void perfUsage(FILE* f) {
  fprintf(f,
          "usage: ncclx-perf <op> [flags]\n"
          "  op: allreduce broadcast reduce allgather reducescatter alltoall sendrecv | all\n"
          "  -b SIZE   smallest size in bytes (default 8); K, M, G suffixes (x1024)\n"
          "  -e SIZE   largest size in bytes (default 64M)\n"
          "  -f N      size multiplier between rows (default 2)\n"
          "  -n N      timed iterations per size (default 20)\n"
          "  -w N      warmup iterations per size (default 5)\n"
          "  -c 0|1    check results at every size (default 1)\n"
          "  -d TYPE   float double half bfloat16 int8 uint8 int32 uint32 int64 uint64\n"
          "  -o OP     sum prod max min avg (default sum)\n"
          "  -r RANK   root of broadcast and reduce (default 0)\n"
          "  -z 0|1    1 = barrier before each op, time the op alone (OSU style)\n"
          "  -I        also print per-iteration p50 and p99 (max over ranks)\n"
          "  -a        also run and print the in-place form\n"
          "  -M KIND   buffers: memalloc (ncclxMemAlloc, default: same-host peers copy out of\n"
          "            them once) or malloc (ordinary memory, as an application's own)\n"
          "  -np N     fork N local ranks (rendezvous: ncclxGetUniqueId, or NCCLX_COMM_ID)\n"
          "  -T SEC    with -np: kill the ranks if the run takes longer (default 600)\n"
          "  -h        this help\n"
          "Model and tuning (docs/tuning.md):\n"
          "  --calibrate [-o FILE]  measure alpha/beta per transport (send/recv ping-pong) and\n"
          "            gamma (reduction); write the cost model file for [tuner] model\n"
          "            (default ncclx-model.conf; sizes -b 8 -e 4M -f 4, -n 30)\n"
          "  --tune [op] [-o FILE]  time every algorithm of every collective (or of op) at each\n"
          "            size, median of -n; write rules for [tuner] plugin = rules (default\n"
          "            ncclx-tuner.rules; sizes -b 8 -e 1M -f 4, -n 10, -w 2)\n"
          "  --verify FILE  time the rules in FILE against the default tuner, alternately, and\n"
          "            print the ratio per size (--tune --verify: verify what --tune wrote)\n"
          "  --tol X   noise level (default 0.10): --verify calls a ratio above 1+X slower;\n"
          "            --tune writes a rule only where the winner beats the default by > X/2\n"
          "  In these modes -o names the output file; reductions use sum.\n"
          "Without -np, rank and size come from the launcher (mpirun, srun, torchrun) and\n"
          "NCCLX_COMM_ID=host:port must name the rendezvous address.\n"
          "Exit status: 0 ok, 1 an ncclx call or a rank failed, 2 bad arguments,\n"
          "3 wrong results, 4 (--verify) the rules were slower than 1+tol at some size.\n");
}

/* Bytes with an optional K/M/G suffix (powers of 1024), at most 2^40. */
static int perfParseSize(const char* s, size_t* out) {
  char* end;
  if (*s < '0' || *s > '9') return -1;
  errno = 0;
  unsigned long long v = strtoull(s, &end, 10);
  if (errno) return -1;
  unsigned long long mult = 1;
  switch (*end) {
    case 'k': case 'K': mult = 1ull << 10; end++; break;
    case 'm': case 'M': mult = 1ull << 20; end++; break;
    case 'g': case 'G': mult = 1ull << 30; end++; break;
    default: break;
  }
  if (*end == 'B' || *end == 'b') end++;
  if (*end != '\0' || v > (1ull << 40) / mult) return -1;
  *out = (size_t)(v * mult);
  return 0;
}

static int perfParseLong(const char* s, long lo, long hi, long* out) {
  char* end;
  errno = 0;
  long v = strtol(s, &end, 10);
  if (errno || end == s || *end != '\0' || v < lo || v > hi) return -1;
  *out = v;
  return 0;
}

static int perfParseOp(const char* name, PerfOptions* o) {
  if (strcmp(name, "all") == 0) {
    for (int i = 0; i < PERF_NUM_OPS; i++) o->ops[i] = i;
    o->nops = PERF_NUM_OPS;
    return 0;
  }
  for (int i = 0; i < PERF_NUM_OPS; i++)
    if (strcmp(name, perfOps[i].name) == 0) {
      o->ops[0] = i;
      o->nops = 1;
      return 0;
    }
  return -1;
}

/* --calibrate, --tune and --verify: their own size range, iterations and ops unless given.
 * The ops are the collectives (sendrecv is not one), for --tune and --verify. */
static void perfModeDefaults(PerfOptions* o) {
  int tune = o->mode != PERF_MODE_CALIBRATE;
  if (!(o->given & PERF_GIVEN_B)) o->minBytes = 8;
  if (!(o->given & PERF_GIVEN_E)) o->maxBytes = tune ? 1u << 20 : 4u << 20;
  if (!(o->given & PERF_GIVEN_F)) o->factor = 4;
  if (!(o->given & PERF_GIVEN_N)) o->iters = tune ? 10 : 30;
  if (!(o->given & PERF_GIVEN_W)) o->warmup = tune ? 2 : 5;
  o->redop = ncclxSum;
  o->inPlace = 0;
  if (!tune) {
    o->nops = PERF_NUM_OPS; /* unused: --calibrate measures send/recv and the reduction */
    for (int i = 0; i < PERF_NUM_OPS; i++) o->ops[i] = i;
    return;
  }
  if (o->nops == 0 || o->nops == PERF_NUM_OPS) {
    o->nops = 0;
    for (int i = 0; i < PERF_NUM_OPS; i++)
      if (i != PERF_SENDRECV) o->ops[o->nops++] = i;
  }
}

#define PERF_ARG_ERR(...)          \
  do {                             \
    fprintf(stderr, "ncclx-perf: "); \
    fprintf(stderr, __VA_ARGS__);  \
    fprintf(stderr, "\n");         \
    return -1;                     \
  } while (0)

/* 0: run; 1: help was asked for; -1: bad arguments (message already printed). */
static int perfParseArgs(int argc, char** argv, PerfOptions* o) {
  *o = (PerfOptions){.minBytes = 8, .maxBytes = 64u << 20, .factor = 2, .iters = 20,
                     .warmup = 5, .check = 1, .type = &perfTypes[0], .redop = ncclxSum,
                     .timeoutSec = 600, .tolerance = 0.10};
  /* The mode decides what -o and --verify take, wherever they appear. */
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--calibrate") == 0) o->mode = PERF_MODE_CALIBRATE;
    if (strcmp(argv[i], "--tune") == 0 && o->mode != PERF_MODE_CALIBRATE) o->mode = PERF_MODE_TUNE;
  }
  for (int i = 1; i < argc; i++) {
    const char* a = argv[i];
    if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) return 1;
    if (strcmp(a, "--calibrate") == 0 || strcmp(a, "--tune") == 0) continue;
    if (strcmp(a, "--verify") == 0) {
      o->verify = 1;
      if (o->mode == PERF_MODE_TUNE) continue;
      if (o->mode == PERF_MODE_CALIBRATE) PERF_ARG_ERR("--verify goes with --tune, not --calibrate");
      if (i + 1 >= argc) PERF_ARG_ERR("--verify needs a rules file");
      o->verifyPath = argv[++i];
      o->mode = PERF_MODE_VERIFY;
      continue;
    }
    if (strcmp(a, "--tol") == 0) {
      char* end;
      if (i + 1 >= argc) PERF_ARG_ERR("--tol needs a value");
      o->tolerance = strtod(argv[++i], &end);
      if (end == argv[i] || *end != '\0' || !(o->tolerance >= 0) || o->tolerance > 10)
        PERF_ARG_ERR("--tol: bad tolerance '%s' (0..10, e.g. 0.1 for 10%%)", argv[i]);
      continue;
    }
    if (o->mode != PERF_MODE_BENCH && strcmp(a, "-o") == 0) {
      if (i + 1 >= argc) PERF_ARG_ERR("-o needs an output file");
      o->outPath = argv[++i];
      continue;
    }
    if (strncmp(a, "--", 2) == 0) PERF_ARG_ERR("unknown flag '%s'", a);
    if (a[0] != '-') {
      if (o->nops) PERF_ARG_ERR("more than one op given ('%s')", a);
      if (perfParseOp(a, o)) PERF_ARG_ERR("unknown op '%s'", a);
      continue;
    }
    if (strcmp(a, "-I") == 0) { o->percentiles = 1; continue; }
    if (strcmp(a, "-a") == 0) { o->inPlace = 1; continue; }
    char flag;
    const char* val;
    if (strncmp(a, "-np", 3) == 0) flag = 'N'; /* before -n: "-np" is not "-n p" */
    else if (strlen(a) >= 2 && strchr("befnwcdorzTM", a[1])) flag = a[1];
    else PERF_ARG_ERR("unknown flag '%s'", a);
    size_t nameLen = flag == 'N' ? 3 : 2;
    if (a[nameLen] != '\0') val = a + nameLen; /* -b8 as well as -b 8 */
    else if (i + 1 < argc) val = argv[++i];
    else PERF_ARG_ERR("flag '%s' needs a value", a);
    long v = 0;
    switch (flag) {
      case 'b': o->given |= PERF_GIVEN_B; break;
      case 'e': o->given |= PERF_GIVEN_E; break;
      case 'f': o->given |= PERF_GIVEN_F; break;
      case 'n': o->given |= PERF_GIVEN_N; break;
      case 'w': o->given |= PERF_GIVEN_W; break;
      default: break;
    }
    switch (flag) {
      case 'b':
        if (perfParseSize(val, &o->minBytes) || o->minBytes == 0)
          PERF_ARG_ERR("-b: bad size '%s' (bytes >= 1, K/M/G suffix, at most 1T)", val);
        break;
      case 'e':
        if (perfParseSize(val, &o->maxBytes) || o->maxBytes == 0)
          PERF_ARG_ERR("-e: bad size '%s' (bytes >= 1, K/M/G suffix, at most 1T)", val);
        break;
      case 'f':
        if (perfParseLong(val, 2, 1 << 20, &v))
          PERF_ARG_ERR("-f: bad factor '%s' (integer >= 2)", val);
        o->factor = (size_t)v;
        break;
      case 'n':
        if (perfParseLong(val, 1, 10000000, &o->iters))
          PERF_ARG_ERR("-n: bad iteration count '%s' (1..10000000)", val);
        break;
      case 'w':
        if (perfParseLong(val, 0, 10000000, &o->warmup))
          PERF_ARG_ERR("-w: bad warmup count '%s' (0..10000000)", val);
        break;
      case 'c':
      case 'z':
        if (perfParseLong(val, 0, 1, &v))
          PERF_ARG_ERR("-%c: expected 0 or 1, got '%s'", flag, val);
        *(flag == 'c' ? &o->check : &o->barrier) = (int)v;
        break;
      case 'd':
        if (!(o->type = perfTypeByName(val)))
          PERF_ARG_ERR("-d: unknown datatype '%s' (float double half bfloat16 int8 uint8 "
                       "int32 uint32 int64 uint64)", val);
        break;
      case 'o': {
        int found = -1;
        for (int k = 0; k < ncclxNumOps; k++)
          if (strcmp(val, perfRedOpNames[k]) == 0) found = k;
        if (found < 0) PERF_ARG_ERR("-o: unknown reduction '%s' (sum prod max min avg)", val);
        o->redop = (ncclxRedOp_t)found;
        break;
      }
      case 'M':
        if (strcmp(val, "memalloc") != 0 && strcmp(val, "malloc") != 0)
          PERF_ARG_ERR("-M: unknown buffer kind '%s' (memalloc, malloc)", val);
        o->plainBuffers = strcmp(val, "malloc") == 0;
        break;
      case 'r':
        if (perfParseLong(val, 0, 1 << 30, &v)) PERF_ARG_ERR("-r: bad root '%s'", val);
        o->root = (int)v;
        break;
      case 'N':
        if (perfParseLong(val, 1, 1024, &v))
          PERF_ARG_ERR("-np: bad rank count '%s' (1..1024)", val);
        o->nprocs = (int)v;
        break;
      case 'T': {
        char* end;
        o->timeoutSec = strtod(val, &end);
        if (end == val || *end != '\0' || !(o->timeoutSec > 0) || o->timeoutSec > 1e7)
          PERF_ARG_ERR("-T: bad timeout '%s' (seconds > 0)", val);
        break;
      }
    }
  }
  if (o->mode == PERF_MODE_CALIBRATE && o->nops) PERF_ARG_ERR("--calibrate takes no op");
  if (o->mode >= PERF_MODE_TUNE && o->nops == 1 && o->ops[0] == PERF_SENDRECV)
    PERF_ARG_ERR("sendrecv has no algorithms to tune; give a collective or none (all)");
  if (o->mode != PERF_MODE_BENCH) perfModeDefaults(o);
  if (o->mode == PERF_MODE_TUNE && o->verify && !o->outPath) o->outPath = "ncclx-tuner.rules";
  if (o->mode == PERF_MODE_TUNE && o->verify) o->verifyPath = o->outPath;
  if (!o->nops) PERF_ARG_ERR("no op given");
  if (o->minBytes > o->maxBytes)
    PERF_ARG_ERR("-b %zu is larger than -e %zu", o->minBytes, o->maxBytes);
  return 0;
}
#undef PERF_ARG_ERR

#endif
