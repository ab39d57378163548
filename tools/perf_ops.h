/* ncclx-perf's calls and checks: the context of one rank, the geometry of a size, one call
 * of an op, its input pattern and its result check. Included by ncclx-perf.c only (through
 * it by perf_calib.h and perf_tune.h). */
#ifndef NCCLX_PERF_OPS_H
#define NCCLX_PERF_OPS_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ncclx.h"
#include "perf_args.h"
#include "perf_data.h"

typedef struct {
  const PerfOptions* opt;
  ncclxComm_t comm;
  int rank, nranks;
  void* sendbuf;
  void* recvbuf;
  double* samples; /* opt->iters per-op times, in us */
} PerfCtx;

/* One row's geometry. count is the argument of the call (per-peer or per-rank for the split
 * ops), size the nccl-tests "size". */
typedef struct {
  size_t count, size, sendElems, recvElems;
} PerfGeom;

/* "ncclx-perf: <call> failed: <result>: <detail>", then abort the communicator so the other
 * ranks fail fast instead of waiting for their timeout. */
static void perfFail(const char* call, ncclxResult_t res, ncclxComm_t comm, int rank) {
  const char* detail = ncclxGetLastError(comm);
  fprintf(stderr, "ncclx-perf: %.*s failed: %s: %s", (int)strcspn(call, "("), call,
          ncclxGetErrorString(res), detail && *detail ? detail : "(no detail)");
  if (rank >= 0) fprintf(stderr, " (rank %d)", rank);
  fprintf(stderr, "\n");
  if (comm) ncclxCommAbort(comm);
  exit(1);
}

#define PERF_CHECK(ctx, call)                                             \
  do {                                                                    \
    ncclxResult_t perfRes_ = (call);                                      \
    if (perfRes_ != ncclxSuccess) perfFail(#call, perfRes_, (ctx)->comm, (ctx)->rank); \
  } while (0)

static double perfNowUs(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e6 + ts.tv_nsec * 1e-3;
}

static PerfGeom perfGeometry(int op, size_t size, size_t typeSize, int nranks) {
  PerfGeom g;
  size_t unit = typeSize * (perfOps[op].perRankSplit ? (size_t)nranks : 1);
  g.count = size / unit;
  g.size = g.count * unit;
  g.sendElems = g.recvElems = g.count;
  if (op == PERF_ALLGATHER) g.recvElems = g.count * (size_t)nranks;
  if (op == PERF_REDUCESCATTER) g.sendElems = g.count * (size_t)nranks;
  if (op == PERF_ALLTOALL) g.sendElems = g.recvElems = g.count * (size_t)nranks;
  return g;
}

/* One call of the op. In place follows NCCL: allgather sends from the rank's slot of the
 * output, reducescatter receives into the rank's slot of the input. */
static void perfIssue(PerfCtx* c, int op, size_t count, int inPlace) {
  const PerfOptions* o = c->opt;
  ncclxDataType_t dt = o->type->type;
  char* recv = c->recvbuf;
  const char* send = inPlace ? recv : (const char*)c->sendbuf;
  char* slot = recv + (size_t)c->rank * count * o->type->size;
  switch (op) {
    case PERF_ALLREDUCE:
      PERF_CHECK(c, ncclxAllReduce(send, recv, count, dt, o->redop, c->comm, NULL));
      break;
    case PERF_BROADCAST:
      PERF_CHECK(c, ncclxBroadcast(send, recv, count, dt, o->root, c->comm, NULL));
      break;
    case PERF_REDUCE:
      PERF_CHECK(c, ncclxReduce(send, recv, count, dt, o->redop, o->root, c->comm, NULL));
      break;
    case PERF_ALLGATHER:
      PERF_CHECK(c, ncclxAllGather(inPlace ? slot : send, recv, count, dt, c->comm, NULL));
      break;
    case PERF_REDUCESCATTER:
      PERF_CHECK(c, ncclxReduceScatter(send, inPlace ? slot : recv, count, dt, o->redop,
                                       c->comm, NULL));
      break;
    case PERF_ALLTOALL:
      PERF_CHECK(c, ncclxAllToAll(send, recv, count, dt, c->comm, NULL));
      break;
    case PERF_SENDRECV: {
      /* Ring exchange: the group lets every rank send and receive without ordering deadlock. */
      int next = (c->rank + 1) % c->nranks, prev = (c->rank + c->nranks - 1) % c->nranks;
      PERF_CHECK(c, ncclxGroupStart());
      PERF_CHECK(c, ncclxSend(send, count, dt, next, c->comm, NULL));
      PERF_CHECK(c, ncclxRecv(recv, count, dt, prev, c->comm, NULL));
      PERF_CHECK(c, ncclxGroupEnd());
      break;
    }
  }
}

/* Fills this rank's input with the pattern; poisons the output first when a check follows,
 * so stale results from an earlier call cannot pass. */
static void perfPrepare(PerfCtx* c, int op, const PerfGeom* g, int inPlace,
                        const PerfCheck* chk, int poison) {
  size_t ts = c->opt->type->size;
  char* input = inPlace ? c->recvbuf : c->sendbuf;
  if (poison) memset(c->recvbuf, 0xFF, g->recvElems * ts);
  if (inPlace && op == PERF_ALLGATHER) input += (size_t)c->rank * g->count * ts;
  perfFill(input, g->sendElems, c->opt->type, &chk->pat, c->rank, 0);
}

static uint64_t perfVerify(PerfCtx* c, int op, const PerfGeom* g, int inPlace,
                           const PerfCheck* chk) {
  size_t ts = c->opt->type->size, n = g->count;
  const char* out = c->recvbuf;
  const char* slot = out + (size_t)c->rank * n * ts;
  uint64_t wrong = 0;
  switch (op) {
    case PERF_ALLREDUCE: return perfWrongReduced(chk, out, n, 0);
    case PERF_BROADCAST: return perfWrongCopied(chk, out, n, c->opt->root, 0);
    case PERF_REDUCE: return c->rank == c->opt->root ? perfWrongReduced(chk, out, n, 0) : 0;
    case PERF_REDUCESCATTER:
      return perfWrongReduced(chk, inPlace ? slot : out, n, (size_t)c->rank * n);
    case PERF_SENDRECV:
      return perfWrongCopied(chk, out, n, (c->rank + c->nranks - 1) % c->nranks, 0);
    case PERF_ALLGATHER:
    case PERF_ALLTOALL:
      /* Block p came from rank p: its own data (allgather) or the block it addressed to us. */
      for (int p = 0; p < c->nranks; p++)
        wrong += perfWrongCopied(chk, out + (size_t)p * n * ts, n, p,
                                 op == PERF_ALLTOALL ? (size_t)c->rank * n : 0);
      return wrong;
  }
  return 0;
}

static int perfCmpDouble(const void* a, const void* b) {
  double x = *(const double*)a, y = *(const double*)b;
  return (x > y) - (x < y);
}

/* Nearest-rank percentile of sorted samples. */
static double perfPercentile(const double* sorted, long n, double q) {
  long idx = (long)ceil(q * (double)n) - 1;
  return sorted[idx < 0 ? 0 : (idx >= n ? n - 1 : idx)];
}

#endif
