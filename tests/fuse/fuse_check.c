/* CommFuse correctness with forked ranks: every schedule x datatype x (reduction op) x count
 * against the unfused collective plus the same callbacks, bit for bit (inputs are small
 * integers, exact in every datatype, so any summation order gives the same bits).
 *
 *   fuse_check NP [--reduced | --sizes | --large]
 *
 * Checked per call: recvbuff equals ncclxAllGather / ncclxReduceScatter / ncclxAllToAll of
 * the same data;
 * every element is consumed or produced exactly once; callbacks come in the documented
 * order (own block first for all-gather, last for reduce-scatter); consume's pointer is
 * recvbuff at (srcRank, offset); nothing is written outside recvbuff. Also: in-place
 * all-gather, a stream, the emulated link, and argument errors that leave the
 * communicator usable. --reduced (for 6+ ranks) trims the datatype and op lists; --sizes runs
 * only the sweep across the transports' size boundaries, --large only 64 MiB blocks. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mp_fork.h"
#include "mp_util.h"
#include "ncclx/fuse.h"

typedef struct {
  int rank, nranks;
  ncclxDataType_t type;
  size_t ts, count;
  ncclxRedOp_t op;
  ncclxFuseSchedule_t sched;
  int slices; /* slices SLICED (pieces RING_P2P) really uses */
  int a2a;    /* the all-to-all is running: produce and consume both count */
  unsigned char* recv;
  unsigned char* seen; /* AG, A2A: what consume saw, at its place */
  int* hits;           /* per element of all blocks: callback coverage */
  int* consumeHits;    /* A2A: the same for consume */
  int calls, consumeCalls;
  int orderErrors, ptrErrors, rangeErrors;
} Ctx;

static int g_failures;

static void fail(const Ctx* c, const char* what, const char* detail) {
  if (g_failures++ < 20)
    fprintf(stderr, "rank %d: FAIL %s: %s %s count %zu schedule %s(%d) unit %zu op %s: %s\n", c->rank,
            what, c->a2a ? "alltoall" : c->seen ? "allgather" : "reducescatter", mpTypeName(c->type), c->count,
            ncclxFuseAlgoName(c->sched.algo), c->sched.slices, c->sched.unit,
            c->seen ? "-" : mpOpName(c->op), detail);
}

/* Small integers, exact in every datatype for up to 8 ranks and every op. */
static double inputValue(int rank, int block, size_t idx, ncclxDataType_t t, ncclxRedOp_t op) {
  uint64_t h = mpHash((uint64_t)rank, (uint64_t)block, idx, (uint64_t)t);
  if (op == ncclxProd) {
    static const double signedVals[] = {-1, 1, 2, 1}, unsignedVals[] = {1, 2, 1, 1};
    return mpIsSigned(t) ? signedVals[h % 4] : unsignedVals[h % 4];
  }
  return mpIsSigned(t) ? (double)((int)(h % 9) - 4) : (double)(h % 9);
}

/* The block the c-th callback must be for (ag: a consume; else a produce). SLICED goes
 * slice by slice over the blocks, RING_P2P(p) block by block over its pieces. */
static int expectedBlock(const Ctx* c, int ag, int call) {
  int n = c->nranks, r = c->rank;
  int t = c->sched.algo == ncclxFuseRingP2P && !c->a2a ? call / c->slices : call % n;
  if (ag) return (r - t + n) % n;
  if (c->a2a) return (r + t) % n;
  if (c->sched.algo == ncclxFuseDirectP2P) return (r + t + 1) % n;
  return (r - t - 1 + n) % n;
}

static int consumeCb(void* user, int src, size_t off, const void* data, size_t count) {
  Ctx* c = user;
  if (src < 0 || src >= c->nranks || off > c->count || count > c->count - off) {
    c->rangeErrors++;
    return 0;
  }
  int* calls = c->a2a ? &c->consumeCalls : &c->calls;
  if (c->sched.algo != ncclxFuseAuto && src != expectedBlock(c, 1, *calls)) c->orderErrors++;
  (*calls)++;
  size_t at = ((size_t)src * c->count + off) * c->ts;
  if ((const unsigned char*)data != c->recv + at) c->ptrErrors++;
  memcpy(c->seen + at, data, count * c->ts);
  int* hits = c->a2a ? c->consumeHits : c->hits;
  for (size_t i = 0; i < count; i++) hits[(size_t)src * c->count + off + i]++;
  return 0;
}

static int produceCb(void* user, int dst, size_t off, void* out, size_t count) {
  Ctx* c = user;
  if (dst < 0 || dst >= c->nranks || off > c->count || count > c->count - off) {
    c->rangeErrors++;
    return 0;
  }
  if (c->sched.algo != ncclxFuseAuto && dst != expectedBlock(c, 0, c->calls)) c->orderErrors++;
  c->calls++;
  for (size_t i = 0; i < count; i++) {
    mpSet(out, i, c->type, inputValue(c->rank, dst, off + i, c->type, c->op));
    c->hits[(size_t)dst * c->count + off + i]++;
  }
  return 0;
}

static void checkCoverage(const Ctx* c, const int* hits, size_t blocks) {
  for (size_t i = 0; i < blocks * c->count; i++)
    if (hits[i] != 1) {
      char msg[128];
      snprintf(msg, sizeof(msg), "element %zu of block %zu was passed to the callback %d times",
               i % c->count, i / c->count, hits[i]);
      fail(c, "coverage", msg);
      return;
    }
}

static void checkCounters(const Ctx* c) {
  char msg[160];
  int expectCalls = c->nranks * c->slices;
  int consumeExpect = c->a2a ? expectCalls : 0;
  if (c->orderErrors || c->ptrErrors || c->rangeErrors || c->calls != expectCalls ||
      c->consumeCalls != consumeExpect) {
    snprintf(msg, sizeof(msg), "%d + %d calls (expected %d + %d), %d out of order, %d wrong pointers, %d out of range",
             c->calls, c->consumeCalls, expectCalls, consumeExpect, c->orderErrors, c->ptrErrors, c->rangeErrors);
    fail(c, "callbacks", msg);
  }
}

/* Callbacks per block: the library says (RING_P2P's automatic count included); the
 * all-to-all's RING_P2P moves whole blocks. Cross-check the explicit counts by hand. */
static int slicesUsed(const ncclxFuseSchedule_t* s, size_t count, ncclxDataType_t type, int nranks, int a2a) {
  if (s->algo != ncclxFuseSliced && (s->algo != ncclxFuseRingP2P || a2a)) return 1;
  int p = ncclxFuseSchedulePieces(*s, count, type, nranks);
  size_t units = count / (s->unit ? s->unit : 1);
  int byHand = units < (size_t)s->slices ? (units ? (int)units : 1) : s->slices;
  if (s->slices > 0 && p != byHand) {
    fprintf(stderr, "FAIL ncclxFuseSchedulePieces says %d pieces, expected %d\n", p, byHand);
    g_failures++;
  }
  return p;
}

/* AUTO: the order of the callbacks is the chosen schedule's, which the library says after
 * the call (ncclxFuseLastSchedule): count the calls against that one. */
static void resolveAuto(ncclxComm_t comm, Ctx* c, int a2a) {
  if (c->sched.algo != ncclxFuseAuto) return;
  ncclxFuseSchedule_t ran;
  if (ncclxFuseLastSchedule(comm, &ran) != ncclxSuccess || ran.algo == ncclxFuseAuto || ran.algo >= ncclxFuseNumAlgos) {
    fail(c, "auto", "ncclxFuseLastSchedule did not name the schedule AUTO ran");
    return;
  }
  ran.unit = c->sched.unit;
  c->slices = slicesUsed(&ran, c->count, c->type, c->nranks, a2a);
}

static void runAllGather(ncclxComm_t comm, Ctx* c, ncclxStream_t stream, int inPlace) {
  int n = c->nranks;
  size_t blk = c->count * c->ts, total = (size_t)n * blk;
  unsigned char* send = malloc(blk ? blk : 1);
  unsigned char* ref = malloc(total ? total : 1);
  mpBuf recv;
  mpBufAlloc(&recv, total, 3);
  mpBufFillSentinel(&recv);
  c->recv = recv.ptr;
  c->seen = calloc(1, total ? total : 1);
  c->hits = calloc((size_t)n * c->count + 1, sizeof(int));
  c->calls = c->consumeCalls = c->orderErrors = c->ptrErrors = c->rangeErrors = 0;
  c->slices = slicesUsed(&c->sched, c->count, c->type, c->nranks, 0);
  for (size_t i = 0; i < c->count; i++) mpSet(send, i, c->type, inputValue(c->rank, c->rank, i, c->type, ncclxSum));
  MP_CALL(c->rank, comm, ncclxAllGather(send, ref, c->count, c->type, comm, NULL));
  const void* src = send;
  if (inPlace) {
    memcpy(recv.ptr + (size_t)c->rank * blk, send, blk);
    src = recv.ptr + (size_t)c->rank * blk;
  }
  MP_CALL(c->rank, comm, ncclxAllGatherCompute(src, recv.ptr, c->count, c->type, consumeCb, c, c->sched, comm, stream));
  if (stream) MP_CALL(c->rank, comm, ncclxStreamSynchronize(stream));
  resolveAuto(comm, c, 0);
  if (memcmp(recv.ptr, ref, total) != 0) fail(c, "result", "recvbuff differs from ncclxAllGather");
  if (memcmp(c->seen, ref, total) != 0) fail(c, "consumed data", "what consume saw differs from ncclxAllGather");
  if (mpBufGuardDamage(&recv)) fail(c, "guards", "bytes outside recvbuff were written");
  checkCoverage(c, c->hits, (size_t)n);
  checkCounters(c);
  free(send);
  free(ref);
  free(c->seen);
  free(c->hits);
  mpBufFree(&recv);
  c->seen = NULL;
}

static void runReduceScatter(ncclxComm_t comm, Ctx* c, ncclxStream_t stream) {
  int n = c->nranks;
  size_t blk = c->count * c->ts;
  unsigned char* send = malloc((size_t)n * blk + 1);
  unsigned char* ref = malloc(blk + 1);
  mpBuf recv;
  mpBufAlloc(&recv, blk, 5);
  mpBufFillSentinel(&recv);
  c->recv = recv.ptr;
  c->seen = NULL;
  c->hits = calloc((size_t)n * c->count + 1, sizeof(int));
  c->calls = c->consumeCalls = c->orderErrors = c->ptrErrors = c->rangeErrors = 0;
  c->slices = slicesUsed(&c->sched, c->count, c->type, c->nranks, 0);
  for (int b = 0; b < n; b++)
    for (size_t i = 0; i < c->count; i++)
      mpSet(send, (size_t)b * c->count + i, c->type, inputValue(c->rank, b, i, c->type, c->op));
  MP_CALL(c->rank, comm, ncclxReduceScatter(send, ref, c->count, c->type, c->op, comm, NULL));
  MP_CALL(c->rank, comm, ncclxComputeReduceScatter(produceCb, c, recv.ptr, c->count, c->type, c->op, c->sched, comm, stream));
  if (stream) MP_CALL(c->rank, comm, ncclxStreamSynchronize(stream));
  resolveAuto(comm, c, 0);
  if (memcmp(recv.ptr, ref, blk) != 0) {
    char msg[160];
    size_t i = 0;
    while (i < c->count && !memcmp(recv.ptr + i * c->ts, ref + i * c->ts, c->ts)) i++;
    snprintf(msg, sizeof(msg), "recvbuff[%zu] = %g, ncclxReduceScatter gives %g", i,
             mpGet(recv.ptr, i, c->type), mpGet(ref, i, c->type));
    fail(c, "result", msg);
  }
  if (mpBufGuardDamage(&recv)) fail(c, "guards", "bytes outside recvbuff were written");
  checkCoverage(c, c->hits, (size_t)n);
  checkCounters(c);
  free(send);
  free(ref);
  free(c->hits);
  mpBufFree(&recv);
}

static void runAllToAll(ncclxComm_t comm, Ctx* c, ncclxStream_t stream) {
  int n = c->nranks;
  size_t blk = c->count * c->ts, total = (size_t)n * blk;
  unsigned char* send = malloc(total + 1);
  unsigned char* ref = malloc(total + 1);
  mpBuf recv;
  mpBufAlloc(&recv, total, 7);
  mpBufFillSentinel(&recv);
  c->a2a = 1;
  c->recv = recv.ptr;
  c->seen = calloc(1, total + 1);
  c->hits = calloc((size_t)n * c->count + 1, sizeof(int));
  c->consumeHits = calloc((size_t)n * c->count + 1, sizeof(int));
  c->calls = c->consumeCalls = c->orderErrors = c->ptrErrors = c->rangeErrors = 0;
  c->slices = slicesUsed(&c->sched, c->count, c->type, c->nranks, 1);
  c->op = ncclxSum; /* inputValue's plain range */
  for (int b = 0; b < n; b++)
    for (size_t i = 0; i < c->count; i++)
      mpSet(send, (size_t)b * c->count + i, c->type, inputValue(c->rank, b, i, c->type, ncclxSum));
  MP_CALL(c->rank, comm, ncclxAllToAll(send, ref, c->count, c->type, comm, NULL));
  MP_CALL(c->rank, comm, ncclxAllToAllCompute(produceCb, consumeCb, c, recv.ptr, c->count, c->type, c->sched, comm, stream));
  if (stream) MP_CALL(c->rank, comm, ncclxStreamSynchronize(stream));
  resolveAuto(comm, c, 1);
  if (memcmp(recv.ptr, ref, total) != 0) fail(c, "result", "recvbuff differs from ncclxAllToAll");
  if (memcmp(c->seen, ref, total) != 0) fail(c, "consumed data", "what consume saw differs from ncclxAllToAll");
  if (mpBufGuardDamage(&recv)) fail(c, "guards", "bytes outside recvbuff were written");
  checkCoverage(c, c->hits, (size_t)n);
  checkCoverage(c, c->consumeHits, (size_t)n);
  checkCounters(c);
  free(send);
  free(ref);
  free(c->seen);
  free(c->hits);
  free(c->consumeHits);
  mpBufFree(&recv);
  c->seen = NULL;
  c->consumeHits = NULL;
  c->a2a = 0;
}

/* Bad arguments fail with ncclxInvalidArgument and leave the communicator usable. */
static void checkBadArgs(ncclxComm_t comm, Ctx* c) {
  char buf[64] = {0};
  struct {
    const char* what;
    ncclxResult_t res;
  } cases[7];
  ncclxFuseSchedule_t badAlgo = NCCLX_FUSE_RING_P2P, badSlices = NCCLX_FUSE_SLICED(0),
                      badUnit = NCCLX_FUSE_RING_P2P;
  badAlgo.algo = (ncclxFuseAlgo_t)42;
  badUnit.unit = 3;
  cases[0].what = "NULL consume";
  cases[0].res = ncclxAllGatherCompute(buf, buf, 1, ncclxInt8, NULL, NULL, NCCLX_FUSE_RING_P2P, comm, NULL);
  cases[1].what = "schedule algorithm 42";
  cases[1].res = ncclxAllGatherCompute(buf, buf, 1, ncclxInt8, consumeCb, c, badAlgo, comm, NULL);
  cases[2].what = "SLICED(0)";
  cases[2].res = ncclxComputeReduceScatter(produceCb, c, buf, 1, ncclxInt8, ncclxSum, badSlices, comm, NULL);
  cases[3].what = "count 4 with unit 3";
  cases[3].res = ncclxComputeReduceScatter(produceCb, c, buf, 4, ncclxInt8, ncclxSum, badUnit, comm, NULL);
  cases[4].what = "reduction op 99";
  cases[4].res = ncclxComputeReduceScatter(produceCb, c, buf, 1, ncclxInt8, (ncclxRedOp_t)99, NCCLX_FUSE_RING_P2P, comm, NULL);
  cases[5].what = "RING_P2P with -1 pieces";
  cases[5].res = ncclxAllGatherCompute(buf, buf, 1, ncclxInt8, consumeCb, c, NCCLX_FUSE_RING_P2P_PIECES(-1), comm, NULL);
  cases[6].what = "NULL produce (all-to-all)";
  cases[6].res = ncclxAllToAllCompute(NULL, consumeCb, c, buf, 1, ncclxInt8, NCCLX_FUSE_RING_P2P, comm, NULL);
  for (int i = 0; i < 7; i++)
    if (cases[i].res != ncclxInvalidArgument) fail(c, "bad arguments", cases[i].what);
  MP_CALL(c->rank, comm, ncclxBarrier(comm, NULL));
}

typedef struct {
  int reduced;
  int sizes; /* --sizes: the boundary sweep only */
  int large; /* --large: 64 MiB blocks, default schedules only */
} Args;

/* Every schedule with blocks, pieces and slices on both sides of the transports' size
 * boundaries: the shared-memory slot (64 KiB), the pipeline chunk (512 KiB) and its four
 * messages in flight per transfer (2 MiB: one transfer's messages no longer all post at its
 * start, so a later transfer to the same peer must wait its turn), the ring and CMA chunk
 * (1 MiB), the CMA budget of one test() (4 MiB), and SLICED/RING_P2P pieces across 2 MiB.
 * Float32 with small integers: exact, so any order of summation gives the same bits. The
 * small-count loop above never crossed any of these (the default schedule hung at 3+ ranks
 * from 2 MiB blocks). */
static void runSizeSweep(ncclxComm_t comm, Ctx* c) {
  static const size_t counts[] = {16383, 16385, 131073, 262145, 524287, 524289, 786432, 1048577, 2097154};
  ncclxFuseSchedule_t scheds[] = {NCCLX_FUSE_SEQUENTIAL,       NCCLX_FUSE_SLICED(2),
                                  NCCLX_FUSE_SLICED(3),        NCCLX_FUSE_RING_P2P,
                                  NCCLX_FUSE_RING_P2P_PIECES(2), NCCLX_FUSE_RING_P2P_PIECES(3),
                                  NCCLX_FUSE_DIRECT_P2P,       NCCLX_FUSE_AUTO};
  c->type = ncclxFloat32;
  c->ts = 4;
  c->op = ncclxSum;
  for (size_t ci = 0; ci < sizeof(counts) / sizeof(counts[0]); ci++)
    for (size_t si = 0; si < sizeof(scheds) / sizeof(scheds[0]); si++) {
      c->count = counts[ci];
      c->sched = scheds[si];
      runAllGather(comm, c, NULL, (int)(ci + si) % 2);
      runReduceScatter(comm, c, NULL);
      runAllToAll(comm, c, NULL);
    }
}

/* What a tensor-parallel layer passes: 64 MiB blocks under the schedules a caller gets
 * without choosing (RING_P2P's automatic pieces) and the all-to-all's default. */
static void runLarge(ncclxComm_t comm, Ctx* c) {
  c->type = ncclxFloat32;
  c->ts = 4;
  c->op = ncclxSum;
  c->count = (size_t)16 << 20;
  c->sched = NCCLX_FUSE_RING_P2P;
  runAllGather(comm, c, NULL, 0);
  runReduceScatter(comm, c, NULL);
  c->sched = NCCLX_FUSE_AUTO;
  runAllGather(comm, c, NULL, 0);
  runReduceScatter(comm, c, NULL);
  if (c->nranks <= 3) runAllToAll(comm, c, NULL); /* n x 64 MiB per buffer: memory */
}

static int rankMain(int rank, int nranks, ncclxUniqueId id, void* arg) {
  const Args* a = arg;
  ncclxComm_t comm = NULL;
  MP_CALL(rank, NULL, ncclxCommInitRank(&comm, nranks, id, rank));
  ncclxStream_t stream = NULL;
  MP_CALL(rank, comm, ncclxStreamCreate(&stream));
  Ctx c = {.rank = rank, .nranks = nranks};
  if (a->sizes || a->large) {
    if (a->sizes) runSizeSweep(comm, &c);
    else runLarge(comm, &c);
    MP_CALL(rank, comm, ncclxStreamDestroy(stream));
    MP_CALL(rank, comm, ncclxCommDestroy(comm));
    return g_failures ? 1 : 0;
  }

  static const ncclxDataType_t allTypes[] = {ncclxInt8, ncclxUint8, ncclxInt32, ncclxUint32, ncclxInt64,
                                             ncclxUint64, ncclxFloat16, ncclxFloat32, ncclxFloat64, ncclxBfloat16};
  static const ncclxDataType_t fewTypes[] = {ncclxInt8, ncclxFloat16, ncclxFloat32, ncclxFloat64, ncclxBfloat16};
  static const ncclxRedOp_t allOps[] = {ncclxSum, ncclxProd, ncclxMax, ncclxMin, ncclxAvg};
  static const ncclxRedOp_t fewOps[] = {ncclxSum, ncclxAvg};
  const ncclxDataType_t* types = a->reduced ? fewTypes : allTypes;
  int ntypes = a->reduced ? 5 : 10;
  const ncclxRedOp_t* ops = a->reduced ? fewOps : allOps;
  int nops = a->reduced ? 2 : 5;
  static const size_t counts[] = {1, 37, 1000};
  ncclxFuseSchedule_t scheds[] = {NCCLX_FUSE_SEQUENTIAL, NCCLX_FUSE_SLICED(1), NCCLX_FUSE_SLICED(2),
                                  NCCLX_FUSE_SLICED(3), NCCLX_FUSE_RING_P2P, NCCLX_FUSE_RING_P2P_PIECES(3),
                                  NCCLX_FUSE_DIRECT_P2P, NCCLX_FUSE_AUTO};
  int nscheds = (int)(sizeof(scheds) / sizeof(scheds[0]));

  for (int ti = 0; ti < ntypes; ti++)
    for (int ci = 0; ci < 3; ci++)
      for (int si = 0; si < nscheds; si++) {
        c.type = types[ti];
        c.ts = mpTypeSize(c.type);
        c.count = counts[ci];
        c.sched = scheds[si];
        c.sched.unit = c.count % 8 == 0 ? 8 : 1; /* row-like slicing where it divides */
        runAllGather(comm, &c, NULL, 0);
        /* The all-to-all only moves bytes: every element size at one count is enough. */
        if (ci == 1 || c.type == ncclxFloat32) runAllToAll(comm, &c, NULL);
        for (int oi = 0; oi < nops; oi++) {
          c.op = ops[oi];
          runReduceScatter(comm, &c, NULL);
        }
      }

  /* Blocks larger than a pipeline chunk, every schedule; in place; on a stream; emulated link. */
  c.type = ncclxFloat32;
  c.ts = 4;
  c.count = 200000; /* 800 KB per block: several chunks and messages per step */
  c.op = ncclxSum;
  for (int si = 0; si < nscheds; si++) {
    c.sched = scheds[si];
    c.sched.unit = 0;
    runAllGather(comm, &c, NULL, si % 2);
    runReduceScatter(comm, &c, NULL);
    runAllToAll(comm, &c, NULL);
  }
  c.count = 999;
  c.sched = NCCLX_FUSE_RING_P2P;
  runAllGather(comm, &c, stream, 1);
  c.sched = NCCLX_FUSE_SLICED(4);
  runReduceScatter(comm, &c, stream);
  c.sched = NCCLX_FUSE_RING_P2P_PIECES(4);
  runReduceScatter(comm, &c, stream);
  runAllToAll(comm, &c, stream);
  c.sched = NCCLX_FUSE_RING_P2P;
  c.sched.linkBytesPerSec = 1e9;
  runAllGather(comm, &c, NULL, 0);
  c.sched.algo = ncclxFuseDirectP2P;
  runReduceScatter(comm, &c, NULL);
  c.sched = NCCLX_FUSE_RING_P2P_PIECES(5);
  c.sched.linkBytesPerSec = 1e9;
  runReduceScatter(comm, &c, NULL);
  runAllToAll(comm, &c, NULL);
  c.sched = NCCLX_FUSE_SLICED(3); /* flows with the link's stamps */
  c.sched.linkBytesPerSec = 1e9;
  runAllGather(comm, &c, NULL, 1);
  runReduceScatter(comm, &c, NULL);
  c.sched = NCCLX_FUSE_SEQUENTIAL; /* steps with the link's stamps */
  c.sched.linkBytesPerSec = 1e9;
  runAllGather(comm, &c, NULL, 0);
  runReduceScatter(comm, &c, NULL);

  /* count 0: no callbacks, success. */
  c.count = 0;
  c.sched = NCCLX_FUSE_RING_P2P;
  c.calls = 0;
  MP_CALL(rank, comm, ncclxAllGatherCompute(NULL, NULL, 0, ncclxFloat32, consumeCb, &c, c.sched, comm, NULL));
  MP_CALL(rank, comm, ncclxComputeReduceScatter(produceCb, &c, NULL, 0, ncclxFloat32, ncclxSum, c.sched, comm, NULL));
  MP_CALL(rank, comm, ncclxAllToAllCompute(produceCb, consumeCb, &c, NULL, 0, ncclxFloat32, c.sched, comm, NULL));
  if (c.calls != 0) fail(&c, "count 0", "a callback was called");

  checkBadArgs(comm, &c);
  MP_CALL(rank, comm, ncclxStreamDestroy(stream));
  MP_CALL(rank, comm, ncclxCommDestroy(comm));
  return g_failures ? 1 : 0;
}

int main(int argc, char** argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s NP [--reduced | --sizes | --large]\n", argv[0]);
    return 2;
  }
  int np = atoi(argv[1]);
  const char* mode = argc > 2 ? argv[2] : "";
  Args a = {.reduced = strcmp(mode, "--reduced") == 0, .sizes = strcmp(mode, "--sizes") == 0,
            .large = strcmp(mode, "--large") == 0};
  if (*mode && !a.reduced && !a.sizes && !a.large) {
    fprintf(stderr, "fuse_check: unknown option %s\n", mode);
    return 2;
  }
  ncclxUniqueId id;
  if (ncclxGetUniqueId(&id) != ncclxSuccess) {
    fprintf(stderr, "ncclxGetUniqueId: %s\n", ncclxGetLastError(NULL));
    return 1;
  }
  mpJob job;
  mpJobInit(&job, np);
  double start = mpNow();
  for (int r = 0; r < np; r++) mpJobSpawn(&job, r, rankMain, id, &a);
  int ranks[MP_MAX_RANKS];
  for (int r = 0; r < np; r++) ranks[r] = r;
  double limit = a.sizes || a.large ? 290 : 140; /* CTest's TIMEOUT is 10 s more */
  int stuck = mpJobWait(&job, ranks, np, start + limit);
  int bad = 0;
  char why[64];
  for (int r = 0; r < np; r++)
    if (!mpExitedZero(&job, r)) {
      fprintf(stderr, "fuse_check: rank %d: %s\n", r, mpDescribeStatus(&job, r, why, sizeof(why)));
      bad++;
    }
  if (stuck) mpJobKillRest(&job);
  printf("fuse_check np %d%s%s: %s in %.1f s\n", np, *mode ? " " : "", mode, bad ? "FAILED" : "passed",
         mpNow() - start);
  return bad ? 1 : 0;
}
