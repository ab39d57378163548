/* Correctness of every collective, datatype and reduction on one communicator of any size,
 * launched with run_mp.sh (one process per rank, ncclxCommInitFromEnv).
 *
 *   coll_check [--reduced]
 *
 * Each rank computes what it must receive from a formula f(rank, index, seed), independently
 * of the library, and checks every element plus guard bytes around every buffer. Values are
 * small integers chosen so that sum/prod/max/min are exact in all ten datatypes at 8 ranks
 * (int8 sums stay below 128, bf16 integers below 256); avg is exact for integers (truncating)
 * and compared with a type-sized tolerance for floats. --reduced trims the datatype x op
 * matrix (used at 6+ ranks on small machines); the full matrix runs at 2 and 3 ranks. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

extern char** environ;

#include "mp_util.h"

#define MAX_PRINT 5 /* mismatches printed per case; all are counted */

static struct {
  int rank, nranks;
  ncclxComm_t comm;
  int reduced;
  uint64_t caseNo; /* advances identically on every rank: the seed of each case */
  long failures;   /* mismatches and failed checks seen by this rank */
  long cases;
  double libTime; /* seconds spent inside library calls, printed per section */
} g;

#define CALL(expr)                          \
  do {                                      \
    double t_ = mpNow();                    \
    MP_CALL(g.rank, g.comm, expr);          \
    g.libTime += mpNow() - t_;              \
  } while (0)

typedef struct {
  const char* coll;
  ncclxDataType_t type;
  int op; /* -1: not a reduction */
  size_t count;
  int inplace, root; /* root -1: none */
  size_t sendOff, recvOff;
  int printed;
  long bad;
} Case;

static Case newCase(const char* coll, ncclxDataType_t t, int op, size_t count, int inplace,
                    int root, size_t sendOff, size_t recvOff) {
  Case c = {coll, t, op, count, inplace, root, sendOff, recvOff, 0, 0};
  g.caseNo++;
  g.cases++;
  return c;
}

static void mismatch(Case* c, const char* what, size_t idx, const char* got, const char* exp) {
  c->bad++;
  g.failures++;
  if (c->printed++ >= MAX_PRINT) return;
  fprintf(stderr,
          "rank %d: MISMATCH %s dtype=%s op=%s count=%zu inplace=%d root=%d sendOff=%zu "
          "recvOff=%zu: %s index %zu: got %s expected %s\n",
          g.rank, c->coll, mpTypeName(c->type), c->op < 0 ? "-" : mpOpName((ncclxRedOp_t)c->op),
          c->count, c->inplace, c->root, c->sendOff, c->recvOff, what, idx, got, exp);
}

static void finishCase(Case* c) {
  if (c->bad > MAX_PRINT)
    fprintf(stderr, "rank %d: ... %ld mismatches in total for %s dtype=%s count=%zu\n", g.rank,
            c->bad, c->coll, mpTypeName(c->type), c->count);
}

static void checkGuards(Case* c, const char* what, const mpBuf* b) {
  size_t damage = mpBufGuardDamage(b);
  if (damage) {
    char got[64];
    snprintf(got, sizeof got, "%zu damaged bytes", damage);
    mismatch(c, what, 0, got, "guard bytes untouched");
  }
}

/* ---------------------------------------------------------------- reductions */

/* Input of element i on rank r. Prod uses factors 2 and 3 on one rank each (and random
 * signs for signed types), so every product has magnitude <= 6. The others use -7..7
 * (signed) or 0..14 (unsigned), plus a high part in the wide integer types and float64 that
 * catches a type handled with the wrong width. */
static double redInput(int r, size_t i, uint64_t seed, ncclxDataType_t t, ncclxRedOp_t op,
                       int nranks) {
  uint64_t h = mpHash(seed, (uint64_t)r, i, 1);
  if (op == ncclxProd) {
    size_t k = (i + (size_t)r) % (size_t)nranks;
    double v = k == 0 ? 2.0 : k == 1 ? 3.0 : 1.0;
    if (mpIsSigned(t) && (h & 3u) == 0) v = -v;
    return v;
  }
  double v = mpIsSigned(t) ? (double)(int)(h % 15u) - 7.0 : (double)(h % 15u);
  uint64_t hi = (h >> 8) % 4u;
  if (t == ncclxInt32 || t == ncclxUint32) v += (double)hi * 1048576.0;            /* 2^20 */
  if (t == ncclxInt64 || t == ncclxUint64 || t == ncclxFloat64) v += (double)hi * 1099511627776.0; /* 2^40 */
  return v;
}

static double redReduce(const double* v, int nranks, ncclxDataType_t t, ncclxRedOp_t op) {
  double acc = v[0];
  for (int r = 1; r < nranks; r++) {
    switch (op) {
      case ncclxSum: case ncclxAvg: acc += v[r]; break;
      case ncclxProd: acc *= v[r]; break;
      case ncclxMax: acc = v[r] > acc ? v[r] : acc; break;
      case ncclxMin: acc = v[r] < acc ? v[r] : acc; break;
      default: break;
    }
  }
  if (op == ncclxAvg) {
    if (mpIsFloat(t)) return acc / nranks;
    return (double)((int64_t)acc / nranks); /* C division truncates toward zero */
  }
  return acc;
}

static int redMatches(double got, double exp, ncclxDataType_t t, ncclxRedOp_t op) {
  if (op != ncclxAvg || !mpIsFloat(t)) return got == exp;
  double eps = t == ncclxBfloat16 ? 8e-3 : t == ncclxFloat16 ? 2e-3 : t == ncclxFloat32 ? 1e-6 : 1e-12;
  return fabs(got - exp) <= eps * fmax(1.0, fabs(exp));
}

/* The inputs and the reduced result of one (seed, type, op) family, shared by the cases that
 * use it (allreduce, reduce at each root, reducescatter, in and out of place): computing the
 * reference costs nranks evaluations per element, checking then is a memcmp. Element i's
 * values do not depend on the vector length, so a longer cached vector serves shorter cases. */
typedef struct {
  uint64_t seed;
  ncclxDataType_t t;
  ncclxRedOp_t op;
  size_t len;
  double* exp;             /* reduced value of each element */
  unsigned char* expBytes; /* exp encoded in t */
  unsigned char* mine;     /* this rank's input encoded in t */
} RedVectors;
static RedVectors rv;

static const RedVectors* redVectors(uint64_t seed, ncclxDataType_t t, ncclxRedOp_t op, size_t len) {
  if (rv.exp && rv.seed == seed && rv.t == t && rv.op == op && rv.len >= len) return &rv;
  free(rv.exp);
  free(rv.expBytes);
  free(rv.mine);
  size_t es = mpTypeSize(t);
  rv.seed = seed, rv.t = t, rv.op = op, rv.len = len;
  rv.exp = malloc((len ? len : 1) * sizeof(double));
  rv.expBytes = malloc((len ? len : 1) * es);
  rv.mine = malloc((len ? len : 1) * es);
  double v[64];
  for (size_t i = 0; i < len; i++) {
    for (int r = 0; r < g.nranks; r++) v[r] = redInput(r, i, seed, t, op, g.nranks);
    rv.exp[i] = redReduce(v, g.nranks, t, op);
    mpSet(rv.expBytes, i, t, rv.exp[i]);
    mpSet(rv.mine, i, t, v[g.rank]);
  }
  return &rv;
}

/* Elements [first, first+n) of the reduced vector, stored at buf[0..n). */
static void checkRed(Case* c, const char* what, const void* buf, size_t n, size_t first,
                     const RedVectors* vec) {
  ncclxRedOp_t op = (ncclxRedOp_t)c->op;
  size_t es = mpTypeSize(c->type);
  if (!n || memcmp(buf, vec->expBytes + first * es, n * es) == 0) return;
  for (size_t i = 0; i < n; i++) { /* slow path: value compare (+0 == -0, avg tolerance) */
    double got = mpGet(buf, i, c->type), exp = vec->exp[first + i];
    if (!redMatches(got, exp, c->type, op)) {
      char gs[40], xs[40];
      snprintf(gs, sizeof gs, "%.17g", got);
      snprintf(xs, sizeof xs, "%.17g", exp);
      mismatch(c, what, first + i, gs, xs);
    }
  }
}

/* An out-of-place send buffer must come back unchanged, bit for bit. */
static void checkSendIntact(Case* c, const void* buf, size_t n, const RedVectors* vec) {
  size_t es = mpTypeSize(c->type);
  if (!n || memcmp(buf, vec->mine, n * es) == 0) return;
  for (size_t i = 0; i < n; i++) {
    if (memcmp((const unsigned char*)buf + i * es, vec->mine + i * es, es) == 0) continue;
    char gs[40], xs[40];
    snprintf(gs, sizeof gs, "%.17g", mpGet(buf, i, c->type));
    snprintf(xs, sizeof xs, "%.17g", mpGet(vec->mine, i, c->type));
    mismatch(c, "sendbuff modified", i, gs, xs);
  }
}

static void runAllReduce(uint64_t seed, ncclxDataType_t t, ncclxRedOp_t op, size_t count,
                         int inplace, size_t sendOff, size_t recvOff) {
  if (inplace) sendOff = recvOff; /* the one buffer gets the receive offset */
  Case c = newCase("allreduce", t, op, count, inplace, -1, sendOff, recvOff);
  const RedVectors* vec = redVectors(seed, t, op, count);
  size_t es = mpTypeSize(t);
  mpBuf sb, rb;
  mpBufAlloc(&sb, count * es, sendOff);
  memcpy(sb.ptr, vec->mine, count * es);
  if (!inplace) mpBufAlloc(&rb, count * es, recvOff);
  void* recv = inplace ? sb.ptr : rb.ptr;
  CALL(ncclxAllReduce(sb.ptr, recv, count, t, op, g.comm, NULL));
  checkRed(&c, "recvbuff", recv, count, 0, vec);
  checkGuards(&c, "sendbuff guard", &sb);
  if (!inplace) {
    checkGuards(&c, "recvbuff guard", &rb);
    checkSendIntact(&c, sb.ptr, count, vec);
    mpBufFree(&rb);
  }
  mpBufFree(&sb);
  finishCase(&c);
}

static void runReduce(uint64_t seed, ncclxDataType_t t, ncclxRedOp_t op, size_t count,
                      int inplace, int root, size_t sendOff, size_t recvOff) {
  if (inplace) sendOff = recvOff; /* the one buffer gets the receive offset */
  Case c = newCase("reduce", t, op, count, inplace, root, sendOff, recvOff);
  const RedVectors* vec = redVectors(seed, t, op, count);
  size_t es = mpTypeSize(t);
  mpBuf sb, rb;
  mpBufAlloc(&sb, count * es, sendOff);
  memcpy(sb.ptr, vec->mine, count * es);
  if (!inplace) mpBufAlloc(&rb, count * es, recvOff);
  void* recv = inplace ? sb.ptr : rb.ptr;
  CALL(ncclxReduce(sb.ptr, recv, count, t, op, root, g.comm, NULL));
  if (g.rank == root) checkRed(&c, "recvbuff (root)", recv, count, 0, vec);
  checkGuards(&c, "sendbuff guard", &sb);
  if (!inplace) {
    checkGuards(&c, "recvbuff guard", &rb);
    checkSendIntact(&c, sb.ptr, count, vec);
    mpBufFree(&rb);
  }
  mpBufFree(&sb);
  finishCase(&c);
}

static void runReduceScatter(uint64_t seed, ncclxDataType_t t, ncclxRedOp_t op, size_t recvcount,
                             int inplace, size_t sendOff, size_t recvOff) {
  if (inplace) sendOff = recvOff; /* the one buffer gets the receive offset */
  Case c = newCase("reducescatter", t, op, recvcount, inplace, -1, sendOff,
                   recvOff);
  size_t es = mpTypeSize(t), total = recvcount * (size_t)g.nranks;
  size_t mine = (size_t)g.rank * recvcount;
  const RedVectors* vec = redVectors(seed, t, op, total);
  mpBuf sb, rb;
  mpBufAlloc(&sb, total * es, sendOff);
  memcpy(sb.ptr, vec->mine, total * es);
  if (!inplace) mpBufAlloc(&rb, recvcount * es, recvOff);
  void* recv = inplace ? (void*)(sb.ptr + mine * es) : rb.ptr;
  CALL(ncclxReduceScatter(sb.ptr, recv, recvcount, t, op, g.comm, NULL));
  checkRed(&c, "recvbuff", recv, recvcount, mine, vec);
  checkGuards(&c, "sendbuff guard", &sb);
  if (!inplace) {
    checkGuards(&c, "recvbuff guard", &rb);
    checkSendIntact(&c, sb.ptr, total, vec);
    mpBufFree(&rb);
  }
  mpBufFree(&sb);
  finishCase(&c);
}

/* ---------------------------------------------------------------- data movement */

/* Bytes that rank `src` contributes for `tag` (a destination, a direction...). */
static void fillPattern(unsigned char* dst, size_t bytes, uint64_t seed, uint64_t src, uint64_t tag) {
  for (size_t k = 0; k < bytes; k += 8) {
    uint64_t h = mpHash(seed, src, tag, k / 8);
    size_t n = bytes - k < 8 ? bytes - k : 8;
    memcpy(dst + k, &h, n);
  }
}

static void hexElem(char* out, size_t outSize, const unsigned char* p, size_t es) {
  size_t o = 0;
  o += (size_t)snprintf(out + o, outSize - o, "0x");
  for (size_t b = 0; b < es && o < outSize; b++) o += (size_t)snprintf(out + o, outSize - o, "%02x", p[es - 1 - b]);
}

/* `elems` elements at got must equal the pattern of (src, tag); `first` is the index shown. */
static void checkPattern(Case* c, const char* what, const unsigned char* got, size_t elems,
                         size_t first, uint64_t seed, uint64_t src, uint64_t tag) {
  size_t es = mpTypeSize(c->type), bytes = elems * es;
  if (!bytes) return;
  unsigned char* exp = malloc(bytes);
  fillPattern(exp, bytes, seed, src, tag);
  if (memcmp(got, exp, bytes) != 0) {
    for (size_t e = 0; e < elems; e++) {
      if (memcmp(got + e * es, exp + e * es, es) == 0) continue;
      char gs[40], xs[40];
      hexElem(gs, sizeof gs, got + e * es, es);
      hexElem(xs, sizeof xs, exp + e * es, es);
      mismatch(c, what, first + e, gs, xs);
    }
  }
  free(exp);
}

/* Bytes that must still hold the sentinel. */
static void checkSentinel(Case* c, const char* what, const unsigned char* p, size_t bytes,
                          size_t firstElem) {
  size_t es = mpTypeSize(c->type);
  for (size_t k = 0; k < bytes; k++) {
    if (p[k] == MP_SENTINEL) continue;
    char gs[16];
    snprintf(gs, sizeof gs, "0x%02x", p[k]);
    mismatch(c, what, firstElem + k / es, gs, "untouched (0xa5)");
    k = (k / es + 1) * es - 1; /* one report per element */
  }
}

static void runBroadcast(ncclxDataType_t t, size_t count, int inplace, int root, size_t sendOff,
                         size_t recvOff) {
  if (inplace) sendOff = recvOff;
  Case c = newCase("broadcast", t, -1, count, inplace, root, sendOff, recvOff);
  uint64_t seed = g.caseNo;
  size_t bytes = count * mpTypeSize(t);
  mpBuf sb, rb;
  mpBufAlloc(&sb, bytes, sendOff);
  /* Non-roots put their own data in sendbuff: it must never travel. */
  if (g.rank == root || !inplace) fillPattern(sb.ptr, bytes, seed, (uint64_t)g.rank, 0);
  if (!inplace) mpBufAlloc(&rb, bytes, recvOff);
  unsigned char* recv = inplace ? sb.ptr : rb.ptr;
  CALL(ncclxBroadcast(sb.ptr, recv, count, t, root, g.comm, NULL));
  checkPattern(&c, "recvbuff", recv, count, 0, seed, (uint64_t)root, 0);
  checkGuards(&c, "sendbuff guard", &sb);
  if (!inplace) {
    checkGuards(&c, "recvbuff guard", &rb);
    checkPattern(&c, "sendbuff modified", sb.ptr, count, 0, seed, (uint64_t)g.rank, 0);
    mpBufFree(&rb);
  }
  mpBufFree(&sb);
  finishCase(&c);
}

static void runAllGather(ncclxDataType_t t, size_t sendcount, int inplace, size_t sendOff,
                         size_t recvOff) {
  Case c = newCase("allgather", t, -1, sendcount, inplace, -1, inplace ? recvOff : sendOff, recvOff);
  uint64_t seed = g.caseNo;
  size_t blk = sendcount * mpTypeSize(t);
  mpBuf sb, rb;
  mpBufAlloc(&rb, blk * (size_t)g.nranks, recvOff);
  unsigned char* send;
  if (inplace) {
    send = rb.ptr + (size_t)g.rank * blk;
  } else {
    mpBufAlloc(&sb, blk, sendOff);
    send = sb.ptr;
  }
  fillPattern(send, blk, seed, (uint64_t)g.rank, 0);
  CALL(ncclxAllGather(send, rb.ptr, sendcount, t, g.comm, NULL));
  for (int p = 0; p < g.nranks; p++)
    checkPattern(&c, "recvbuff", rb.ptr + (size_t)p * blk, sendcount, (size_t)p * sendcount, seed,
                 (uint64_t)p, 0);
  checkGuards(&c, "recvbuff guard", &rb);
  if (!inplace) {
    checkGuards(&c, "sendbuff guard", &sb);
    checkPattern(&c, "sendbuff modified", sb.ptr, sendcount, 0, seed, (uint64_t)g.rank, 0);
    mpBufFree(&sb);
  }
  mpBufFree(&rb);
  finishCase(&c);
}

static void runAllToAll(ncclxDataType_t t, size_t count, int inplace, size_t sendOff, size_t recvOff) {
  if (inplace) sendOff = recvOff; /* the one buffer gets the receive offset */
  Case c = newCase("alltoall", t, -1, count, inplace, -1, sendOff, recvOff);
  uint64_t seed = g.caseNo;
  size_t blk = count * mpTypeSize(t), n = (size_t)g.nranks;
  mpBuf sb, rb;
  mpBufAlloc(&sb, blk * n, sendOff);
  if (!inplace) mpBufAlloc(&rb, blk * n, recvOff);
  unsigned char* recv = inplace ? sb.ptr : rb.ptr;
  for (size_t p = 0; p < n; p++) fillPattern(sb.ptr + p * blk, blk, seed, (uint64_t)g.rank, 1000 + p);
  CALL(ncclxAllToAll(sb.ptr, recv, count, t, g.comm, NULL));
  for (size_t p = 0; p < n; p++) {
    checkPattern(&c, "recvbuff", recv + p * blk, count, p * count, seed, p, 1000 + (uint64_t)g.rank);
    if (!inplace)
      checkPattern(&c, "sendbuff modified", sb.ptr + p * blk, count, p * count, seed,
                   (uint64_t)g.rank, 1000 + p);
  }
  checkGuards(&c, "sendbuff guard", &sb);
  mpBufFree(&sb);
  if (!inplace) {
    checkGuards(&c, "recvbuff guard", &rb);
    mpBufFree(&rb);
  }
  finishCase(&c);
}

/* Elements rank s sends to rank d: same formula on every rank; about a quarter are zero. */
static size_t a2avCount(uint64_t seed, int s, int d, size_t maxc) {
  uint64_t h = mpHash(seed, (uint64_t)s, (uint64_t)d, 77);
  if (maxc == 0 || (h & 3u) == 0) return 0;
  return (size_t)((h >> 8) % (maxc + 1));
}

/* Displacements with 0..2 element gaps, send blocks laid out in reverse peer order, so the
 * library must really use the displacements. Returns the total elements spanned. */
static size_t a2avLayout(uint64_t seed, int me, int isSend, size_t maxc, size_t* counts,
                         size_t* displs) {
  size_t cursor = 0, n = (size_t)g.nranks;
  for (size_t k = 0; k < n; k++) {
    int p = isSend ? (int)(n - 1 - k) : (int)k;
    counts[p] = isSend ? a2avCount(seed, me, p, maxc) : a2avCount(seed, p, me, maxc);
    cursor += mpHash(seed, (uint64_t)me, (uint64_t)p, isSend ? 78 : 79) % 3u;
    displs[p] = cursor;
    cursor += counts[p];
  }
  return cursor;
}

static void runAllToAllv(ncclxDataType_t t, size_t maxc, size_t off) {
  Case c = newCase("alltoallv", t, -1, maxc, 0, -1, off, off);
  uint64_t seed = g.caseNo;
  size_t es = mpTypeSize(t), n = (size_t)g.nranks;
  size_t *sc = calloc(n, sizeof *sc), *sd = calloc(n, sizeof *sd);
  size_t *rc = calloc(n, sizeof *rc), *rd = calloc(n, sizeof *rd);
  size_t stotal = a2avLayout(seed, g.rank, 1, maxc, sc, sd);
  size_t rtotal = a2avLayout(seed, g.rank, 0, maxc, rc, rd);
  mpBuf sb, rb;
  mpBufAlloc(&sb, stotal * es, off);
  mpBufAlloc(&rb, rtotal * es, off);
  for (size_t p = 0; p < n; p++)
    fillPattern(sb.ptr + sd[p] * es, sc[p] * es, seed, (uint64_t)g.rank, 2000 + p);
  CALL(ncclxAllToAllv(sb.ptr, sc, sd, rb.ptr, rc, rd, t, g.comm, NULL));
  /* Every received block, and the gaps between blocks untouched. */
  unsigned char* covered = calloc(rtotal ? rtotal : 1, 1);
  for (size_t p = 0; p < n; p++) {
    checkPattern(&c, "recvbuff block", rb.ptr + rd[p] * es, rc[p], rd[p], seed, p,
                 2000 + (uint64_t)g.rank);
    memset(covered + rd[p], 1, rc[p]);
  }
  for (size_t e = 0; e < rtotal; e++)
    if (!covered[e]) checkSentinel(&c, "recvbuff gap", rb.ptr + e * es, es, e);
  for (size_t p = 0; p < n; p++)
    checkPattern(&c, "sendbuff modified", sb.ptr + sd[p] * es, sc[p], sd[p], seed,
                 (uint64_t)g.rank, 2000 + p);
  checkGuards(&c, "sendbuff guard", &sb);
  checkGuards(&c, "recvbuff guard", &rb);
  free(covered);
  mpBufFree(&sb);
  mpBufFree(&rb);
  free(sc); free(sd); free(rc); free(rd);
  finishCase(&c);
}

/* Every rank sends one message to each ring neighbour and receives one from each, all in
 * one group. At 2 ranks both neighbours are the same peer (order of matching matters), at
 * 1 rank both are self. */
static void runSendRecvRing(ncclxDataType_t t, size_t count, size_t sendOff, size_t recvOff) {
  Case c = newCase("sendrecv-ring", t, -1, count, 0, -1, sendOff, recvOff);
  uint64_t seed = g.caseNo;
  size_t bytes = count * mpTypeSize(t);
  int right = (g.rank + 1) % g.nranks, left = (g.rank + g.nranks - 1) % g.nranks;
  mpBuf toR, toL, fromL, fromR;
  mpBufAlloc(&toR, bytes, sendOff);
  mpBufAlloc(&toL, bytes, sendOff);
  mpBufAlloc(&fromL, bytes, recvOff);
  mpBufAlloc(&fromR, bytes, recvOff);
  fillPattern(toR.ptr, bytes, seed, (uint64_t)g.rank, 0);
  fillPattern(toL.ptr, bytes, seed, (uint64_t)g.rank, 1);
  CALL(ncclxGroupStart());
  CALL(ncclxSend(toR.ptr, count, t, right, g.comm, NULL));
  CALL(ncclxSend(toL.ptr, count, t, left, g.comm, NULL));
  CALL(ncclxRecv(fromL.ptr, count, t, left, g.comm, NULL));
  CALL(ncclxRecv(fromR.ptr, count, t, right, g.comm, NULL));
  CALL(ncclxGroupEnd());
  checkPattern(&c, "recv from left", fromL.ptr, count, 0, seed, (uint64_t)left, 0);
  checkPattern(&c, "recv from right", fromR.ptr, count, 0, seed, (uint64_t)right, 1);
  checkPattern(&c, "send buffer modified", toR.ptr, count, 0, seed, (uint64_t)g.rank, 0);
  mpBuf* all[] = {&toR, &toL, &fromL, &fromR};
  for (int i = 0; i < 4; i++) {
    checkGuards(&c, "buffer guard", all[i]);
    mpBufFree(all[i]);
  }
  finishCase(&c);
}

/* A blocking (ungrouped) send from rank 0 to the last rank. */
static void runSendRecvPlain(ncclxDataType_t t, size_t count) {
  Case c = newCase("send/recv-ungrouped", t, -1, count, 0, -1, 0, 0);
  uint64_t seed = g.caseNo;
  int last = g.nranks - 1;
  if (g.nranks < 2 || (g.rank != 0 && g.rank != last)) return;
  size_t bytes = count * mpTypeSize(t);
  mpBuf b;
  mpBufAlloc(&b, bytes, 0);
  if (g.rank == 0) {
    fillPattern(b.ptr, bytes, seed, 0, 5);
    CALL(ncclxSend(b.ptr, count, t, last, g.comm, NULL));
  } else {
    CALL(ncclxRecv(b.ptr, count, t, 0, g.comm, NULL));
    checkPattern(&c, "recvbuff", b.ptr, count, 0, seed, 0, 5);
  }
  checkGuards(&c, "buffer guard", &b);
  mpBufFree(&b);
  finishCase(&c);
}

/* Rank 0 arrives late; nobody may leave the barrier before it arrives. */
static void runBarrier(void) {
  Case c = newCase("barrier", ncclxInt8, -1, 0, 0, -1, 0, 0);
  const double delay = 0.4;
  CALL(ncclxBarrier(g.comm, NULL));
  double t0 = mpNow();
  if (g.rank == 0) usleep((useconds_t)(delay * 1e6));
  CALL(ncclxBarrier(g.comm, NULL));
  double waited = mpNow() - t0;
  /* Others may have left the first barrier up to a scheduling slice after rank 0. */
  if (g.nranks > 1 && waited < delay * 0.4) {
    char gs[40];
    snprintf(gs, sizeof gs, "left after %.3f s", waited);
    mismatch(&c, "barrier released before rank 0 arrived", 0, gs, ">= 0.16 s");
  }
  for (int i = 0; i < 20; i++) CALL(ncclxBarrier(g.comm, NULL));
  finishCase(&c);
}

/* ---------------------------------------------------------------- the matrix */

static const ncclxDataType_t kAllTypes[ncclxNumTypes] = {
    ncclxInt8,    ncclxUint8,  ncclxInt32,   ncclxUint32,  ncclxInt64,
    ncclxUint64,  ncclxFloat16, ncclxFloat32, ncclxFloat64, ncclxBfloat16};
#define NCOUNTS 5

/* Reduced matrix: every datatype with sum and with one rotating op, float32 with all ops. */
static int pairEnabled(ncclxDataType_t t, ncclxRedOp_t op) {
  if (!g.reduced) return 1;
  return t == ncclxFloat32 || op == ncclxSum || (int)op == ((int)t + 1) % ncclxNumOps;
}
static int largeEnabled(ncclxDataType_t t, ncclxRedOp_t op) {
  if (!g.reduced) return 1;
  return (t == ncclxFloat32 && op == ncclxSum) || (t == ncclxBfloat16 && op == ncclxAvg) ||
         (t == ncclxInt64 && op == ncclxMax) || (t == ncclxInt8 && op == ncclxSum);
}
/* Movement collectives only see element sizes: the reduced matrix keeps one type per size. */
static int moveTypeEnabled(ncclxDataType_t t) {
  return !g.reduced || t == ncclxInt8 || t == ncclxFloat16 || t == ncclxFloat32 || t == ncclxFloat64;
}

static void counts(size_t out[NCOUNTS], int perRank) {
  size_t large = (size_t)(1 << 18) + 3;
  if (perRank) large = (large / (size_t)g.nranks) | 1u;
  size_t c[NCOUNTS] = {0, 1, 7, 1031, large};
  memcpy(out, c, sizeof c);
}

static void section(const char* name, double* t0) {
  double now = mpNow();
  if (g.rank == 0) {
    printf("  %-28s %6.2f s, %6.2f s in ncclx (cases so far %ld)\n", name, now - *t0, g.libTime,
           g.cases);
    fflush(stdout);
  }
  *t0 = now;
  g.libTime = 0;
}

static void reducingMatrix(void) {
  size_t cnt[NCOUNTS], per[NCOUNTS];
  counts(cnt, 0);
  counts(per, 1);
  int roots[2] = {0, g.nranks - 1}, nroots = g.nranks > 1 ? 2 : 1;
  for (int ti = 0; ti < ncclxNumTypes; ti++) {
    for (int op = 0; op < ncclxNumOps; op++) {
      ncclxDataType_t t = kAllTypes[ti];
      if (!pairEnabled(t, (ncclxRedOp_t)op)) continue;
      size_t es = mpTypeSize(t);
      for (int ci = 0; ci < NCOUNTS; ci++) {
        if (ci == NCOUNTS - 1 && !largeEnabled(t, (ncclxRedOp_t)op)) continue;
        uint64_t seed = mpHash((uint64_t)ti, (uint64_t)op, (uint64_t)ci, 0x5eed);
        size_t rsTotal = per[ci] * (size_t)g.nranks;
        redVectors(seed, t, (ncclxRedOp_t)op, cnt[ci] > rsTotal ? cnt[ci] : rsTotal);
        for (int inplace = 0; inplace < 2; inplace++) {
          runAllReduce(seed, t, (ncclxRedOp_t)op, cnt[ci], inplace, 0, es);
          for (int r = 0; r < nroots; r++)
            runReduce(seed, t, (ncclxRedOp_t)op, cnt[ci], inplace, roots[r], 0, es);
          runReduceScatter(seed, t, (ncclxRedOp_t)op, per[ci], inplace, 0, es);
        }
      }
    }
  }
}

static void movementMatrix(void) {
  size_t cnt[NCOUNTS], per[NCOUNTS];
  counts(cnt, 0);
  counts(per, 1);
  int roots[2] = {0, g.nranks - 1}, nroots = g.nranks > 1 ? 2 : 1;
  double t0 = mpNow();
  for (int ti = 0; ti < ncclxNumTypes; ti++) {
    ncclxDataType_t t = kAllTypes[ti];
    if (!moveTypeEnabled(t)) continue;
    size_t es = mpTypeSize(t);
    for (int ci = 0; ci < NCOUNTS; ci++) {
      for (int inplace = 0; inplace < 2; inplace++) {
        for (int r = 0; r < nroots; r++) runBroadcast(t, cnt[ci], inplace, roots[r], 0, es);
        runAllGather(t, per[ci], inplace, 0, es);
        runAllToAll(t, per[ci], inplace, 0, es);
      }
      runSendRecvRing(t, cnt[ci], 0, es);
    }
  }
  section("bcast/allgather/a2a/p2p", &t0);
  size_t maxcs[4] = {0, 7, 1031, 20000};
  for (int ti = 0; ti < ncclxNumTypes; ti++) {
    if (!moveTypeEnabled(kAllTypes[ti])) continue;
    for (int m = 0; m < 4; m++) runAllToAllv(kAllTypes[ti], maxcs[m], mpTypeSize(kAllTypes[ti]));
  }
  runSendRecvPlain(ncclxFloat32, 1031);
  runSendRecvPlain(ncclxInt8, (1 << 18) + 3);
  section("alltoallv/send-recv", &t0);
}

/* Small broadcasts back to back, as a training loop's scalars go: every size from 0 to 80
 * bytes (the LL protocol's ring cells hold 16 bytes, a call takes up to 4, larger ones use the
 * banks), roots in turn, in place and not, an all-reduce now and then; 1200 calls go round the
 * ring (512 cells) more than twice; then one root far ahead of the others. */
static void smallBroadcastRun(void) {
  uint64_t seed = mpHash(0x5b, 0xca57, 0, 0x5eed);
  for (int i = 0; i < 1200; i++) {
    runBroadcast(ncclxInt8, (size_t)(i % 81), (i / 81) & 1, i % g.nranks, 0, 0);
    if (i % 97 == 96) runAllReduce(seed, ncclxInt32, ncclxSum, 3, 0, 0, 0);
  }
  /* On the LL protocol a broadcast of up to a bank of lines (nranks x ceil(ll_max_bytes / 48)
   * x 48 bytes) is one round through the lines, a larger one goes through the bulk area in
   * rounds of a whole bulk bank (nranks regions of min(256 KiB, 1 MiB / nranks) rounded down
   * to 4 KiB: core/src/coll_ll.c). Both sides of the line boundary, and several bulk rounds
   * with a short and a long last one. */
  const char* llMax = getenv("NCCLX_CORE_LL_MAX_BYTES"); /* bytes, or with a K suffix */
  char* unit = NULL;
  size_t max = llMax ? (size_t)strtoul(llMax, &unit, 10) : 4096;
  if (llMax && (*unit == 'K' || *unit == 'k')) max <<= 10;
  if (max > 16384) max = 16384; /* the library's ceiling */
  size_t lineBank = (size_t)g.nranks * ((max + 47) / 48) * 48;
  size_t region = ((size_t)1 << 20) / (size_t)g.nranks;
  if (region > ((size_t)256 << 10)) region = (size_t)256 << 10;
  size_t bulkBank = (size_t)g.nranks * (region & ~(size_t)4095);
  size_t large[5] = {lineBank, lineBank + 1, 2 * bulkBank + 1, 2 * bulkBank + 4097, 3 * bulkBank};
  for (int i = 0; i < 5; i++) runBroadcast(ncclxInt8, large[i], i & 1, g.nranks - 1, 0, 0);
  /* One root running ahead while the others start 20 ms late: it must stop before it
   * overwrites what they have not read (with no such wait it would finish all 600 first). */
  if (g.rank != 0) usleep(20000);
  for (int i = 0; i < 600; i++) runBroadcast(ncclxInt8, (size_t)(i % 65), 0, 0, 0, 0);
}

/* A root whose recvbuff partly overlaps its sendbuff (recv = send + shift, shift may be
 * negative): the broadcast must still carry what sendbuff held when the call was made, to
 * every rank. A positive shift writes ahead of what is still to be sent (a negative one
 * only behind it, which a copy per round gets away with). 4 MiB goes through the LL board's bulk area (in rounds, on the tuner's choice
 * or forced), 256 KiB through the simple protocol's tree at 2 ranks. */
static void runBroadcastShifted(size_t bytes, long shift, int root) {
  /* Offsets from the buffer's start, so a failure shows the shift. */
  Case c = newCase("broadcast (shifted recvbuff)", ncclxInt8, -1, bytes, 0, root,
                   shift < 0 ? (size_t)-shift : 0, shift > 0 ? (size_t)shift : 0);
  uint64_t seed = g.caseNo;
  size_t span = bytes + (size_t)labs(shift);
  mpBuf b;
  mpBufAlloc(&b, span, 0);
  unsigned char* send = b.ptr + (shift < 0 ? (size_t)-shift : 0);
  unsigned char* recv = send + shift;
  if (g.rank == root) fillPattern(send, bytes, seed, (uint64_t)root, 0);
  CALL(ncclxBroadcast(send, recv, bytes, ncclxInt8, root, g.comm, NULL));
  checkPattern(&c, "recvbuff", recv, bytes, 0, seed, (uint64_t)root, 0);
  checkGuards(&c, "buffer guard", &b);
  mpBufFree(&b);
  finishCase(&c);
}

static void shiftedBroadcasts(void) {
  size_t sizes[2] = {(size_t)4 << 20, (size_t)256 << 10};
  long shifts[2] = {4096, -12289};
  for (int si = 0; si < 2; si++)
    for (int k = 0; k < 2; k++) runBroadcastShifted(sizes[si], shifts[k], (si + k) % g.nranks);
}

/* Byte offset 1: misaligned for fp16, harmless for 8-bit types; the library must not rely
 * on natural alignment. */
static void misalignedCases(void) {
  const ncclxDataType_t types[3] = {ncclxInt8, ncclxUint8, ncclxFloat16};
  size_t sizes[2] = {7, 1031};
  for (int ti = 0; ti < 3; ti++) {
    for (int si = 0; si < 2; si++) {
      size_t n = sizes[si];
      uint64_t seed = mpHash((uint64_t)ti, (uint64_t)si, 0xb17e, 0x5eed);
      for (int op = 0; op < ncclxNumOps; op++) runAllReduce(seed, types[ti], (ncclxRedOp_t)op, n, 0, 1, 0);
      runAllReduce(seed, types[ti], ncclxSum, n, 1, 1, 1);
      runReduce(seed, types[ti], ncclxMax, n, 0, g.nranks - 1, 1, 0);
      runReduceScatter(seed, types[ti], ncclxSum, n, 0, 1, 0);
      runReduceScatter(seed, types[ti], ncclxMin, n, 1, 1, 1);
      runBroadcast(types[ti], n, 0, 0, 1, 0);
      runAllGather(types[ti], n, 0, 1, 0);
      runAllGather(types[ti], n, 1, 1, 1);
      runAllToAll(types[ti], n, 0, 1, 0);
      runAllToAll(types[ti], n, 1, 1, 1);
      runAllToAllv(types[ti], n, 1);
      runSendRecvRing(types[ti], n, 1, 0);
    }
  }
  /* NULL buffers are fine when there is nothing to move. */
  Case c = newCase("allreduce-null-count0", ncclxFloat32, ncclxSum, 0, 0, -1, 0, 0);
  CALL(ncclxAllReduce(NULL, NULL, 0, ncclxFloat32, ncclxSum, g.comm, NULL));
  finishCase(&c);
}

/* ---------------------------------------------------------------- several communicators */

static int subRankOf(const int* members, int m, int worldRank) {
  for (int j = 0; j < m; j++)
    if (members[j] == worldRank) return j;
  return -1;
}

static void check1(Case* c, const char* what, size_t idx, double got, double exp) {
  if (got == exp) return;
  char gs[40], es[40];
  snprintf(gs, sizeof gs, "%.17g", got);
  snprintf(es, sizeof es, "%.17g", exp);
  mismatch(c, what, idx, gs, es);
}

/* Split by parity with descending keys; collectives on both communicators interleaved,
 * first blocking, then concurrently on two streams. */
static void splitParity(void) {
  Case c = newCase("split-parity", ncclxFloat32, ncclxSum, 1031, 0, -1, 0, 0);
  ncclxConfig_t cfg = NCCLX_CONFIG_INITIALIZER;
  cfg.commName = "mp-parity";
  ncclxComm_t sub = NULL;
  CALL(ncclxCommSplit(g.comm, g.rank % 2, -g.rank, &sub, &cfg));
  int members[64], m = 0;
  for (int r = g.nranks - 1; r >= 0; r--)
    if (r % 2 == g.rank % 2) members[m++] = r; /* key -rank: descending world rank */
  int subCount = -1, subRank = -1;
  CALL(ncclxCommCount(sub, &subCount));
  CALL(ncclxCommUserRank(sub, &subRank));
  check1(&c, "sub comm size", 0, subCount, m);
  check1(&c, "sub comm rank", 0, subRank, subRankOf(members, m, g.rank));

  const size_t n = 1031;
  float* wsend = malloc(n * sizeof(float));
  float* wrecv = malloc(n * sizeof(float));
  int32_t* ssend = malloc(n * sizeof(int32_t));
  int32_t* srecv = malloc(n * sizeof(int32_t));
  for (int round = 0; round < 3; round++) {
    for (size_t i = 0; i < n; i++) {
      wsend[i] = (float)((g.rank + 1) * (int)(i % 7 + 1) + round);
      ssend[i] = (g.rank + 1) * 1000 + (int32_t)(i % 3) + round;
    }
    CALL(ncclxAllReduce(wsend, wrecv, n, ncclxFloat32, ncclxSum, g.comm, NULL));
    CALL(ncclxAllReduce(ssend, srecv, n, ncclxInt32, ncclxSum, sub, NULL));
    double wn = g.nranks * (g.nranks + 1) / 2.0;
    for (size_t i = 0; i < n; i++) {
      double sexp = 0;
      for (int j = 0; j < m; j++) sexp += (members[j] + 1) * 1000 + (double)(i % 3) + round;
      check1(&c, "world allreduce", i, wrecv[i], wn * (double)(i % 7 + 1) + round * g.nranks);
      check1(&c, "sub allreduce", i, srecv[i], sexp);
    }
  }
  /* Ordering of the sub communicator: gather world ranks. */
  int32_t me = g.rank, gathered[64];
  CALL(ncclxAllGather(&me, gathered, 1, ncclxInt32, sub, NULL));
  for (int j = 0; j < m; j++) check1(&c, "sub allgather of world rank", (size_t)j, gathered[j], members[j]);

  /* Both communicators busy at the same time, each on its own stream. */
  ncclxStream_t sw, ss;
  CALL(ncclxStreamCreate(&sw));
  CALL(ncclxStreamCreate(&ss));
  enum { K = 4 };
  float* wout[K];
  int32_t* sout[K];
  for (int k = 0; k < K; k++) {
    wout[k] = malloc(n * sizeof(float));
    sout[k] = malloc(n * sizeof(int32_t));
    CALL(ncclxAllReduce(wsend, wout[k], n, ncclxFloat32, ncclxSum, g.comm, sw));
    CALL(ncclxAllReduce(ssend, sout[k], n, ncclxInt32, ncclxSum, sub, ss));
  }
  CALL(ncclxStreamSynchronize(ss));
  CALL(ncclxStreamSynchronize(sw));
  for (int k = 0; k < K; k++) {
    for (size_t i = 0; i < n; i++) {
      check1(&c, "world allreduce (stream)", i, wout[k][i], wrecv[i]);
      check1(&c, "sub allreduce (stream)", i, sout[k][i], srecv[i]);
    }
    free(wout[k]);
    free(sout[k]);
  }
  CALL(ncclxStreamDestroy(sw));
  CALL(ncclxStreamDestroy(ss));
  CALL(ncclxCommFinalize(sub));
  CALL(ncclxCommDestroy(sub));
  free(wsend); free(wrecv); free(ssend); free(srecv);
  finishCase(&c);
}

/* The last rank opts out of the split. */
static void splitNoColor(void) {
  Case c = newCase("split-nocolor", ncclxInt64, ncclxSum, 77, 0, -1, 0, 0);
  int out = g.rank == g.nranks - 1;
  ncclxComm_t sub = (ncclxComm_t)&c; /* must be overwritten */
  CALL(ncclxCommSplit(g.comm, out ? NCCLX_SPLIT_NOCOLOR : 0, g.rank, &sub, NULL));
  if (out) {
    if (sub != NULL) mismatch(&c, "newcomm of a NOCOLOR rank", 0, "non-NULL", "NULL");
    finishCase(&c);
    return;
  }
  int cnt = -1, rk = -1;
  CALL(ncclxCommCount(sub, &cnt));
  CALL(ncclxCommUserRank(sub, &rk));
  check1(&c, "comm size", 0, cnt, g.nranks - 1);
  check1(&c, "comm rank", 0, rk, g.rank);
  int64_t v[77], r[77];
  for (int i = 0; i < 77; i++) v[i] = (int64_t)(g.rank + 1) << 33 | i;
  CALL(ncclxAllReduce(v, r, 77, ncclxInt64, ncclxSum, sub, NULL));
  double tri = (g.nranks - 1) * g.nranks / 2.0;
  for (int i = 0; i < 77; i++)
    check1(&c, "allreduce", (size_t)i, (double)r[i], tri * 8589934592.0 + (double)i * (g.nranks - 1));
  CALL(ncclxCommDestroy(sub));
  finishCase(&c);
}

/* Host functions produce the input right before each collective and consume the output
 * right after, all in stream order; the main thread only waits. */
typedef struct {
  float *send, *recv;
  size_t n;
  int iter, produced, consumed, bad, waitedOk;
} StreamState;

static void produce(void* p) {
  StreamState* s = p;
  for (size_t i = 0; i < s->n; i++) s->send[i] = (float)((g.rank + 1) * (s->iter + 1) + (int)(i % 5));
  memset(s->recv, 0xff, s->n * sizeof(float));
  s->produced++;
}

static void consume(void* p) {
  StreamState* s = p;
  double tri = g.nranks * (g.nranks + 1) / 2.0;
  for (size_t i = 0; i < s->n; i++) {
    double exp = tri * (s->iter + 1) + (double)(i % 5) * g.nranks;
    if (s->recv[i] != exp) {
      if (s->bad++ < MAX_PRINT)
        fprintf(stderr, "rank %d: MISMATCH stream allreduce iter %d index %zu: got %.9g expected %.9g\n",
                g.rank, s->iter, i, s->recv[i], exp);
    }
  }
  s->consumed++;
  s->iter++;
}

static void afterEvent(void* p) {
  StreamState* s = p;
  s->waitedOk = s->consumed == 10;
}

static void streamPipeline(void) {
  Case c = newCase("stream+hostfunc", ncclxFloat32, ncclxSum, 4099, 0, -1, 0, 0);
  StreamState s = {0};
  s.n = 4099;
  s.send = malloc(s.n * sizeof(float));
  s.recv = malloc(s.n * sizeof(float));
  ncclxStream_t st, st2;
  ncclxEvent_t ev;
  CALL(ncclxStreamCreate(&st));
  CALL(ncclxStreamCreate(&st2));
  CALL(ncclxEventCreate(&ev));
  for (int k = 0; k < 10; k++) {
    CALL(ncclxLaunchHostFunc(st, produce, &s));
    CALL(ncclxAllReduce(s.send, s.recv, s.n, ncclxFloat32, ncclxSum, g.comm, st));
    CALL(ncclxLaunchHostFunc(st, consume, &s));
  }
  CALL(ncclxEventRecord(ev, st));
  CALL(ncclxStreamWaitEvent(st2, ev)); /* st2's host function must run after all of st */
  CALL(ncclxLaunchHostFunc(st2, afterEvent, &s));
  CALL(ncclxStreamSynchronize(st2));
  CALL(ncclxEventSynchronize(ev));
  CALL(ncclxStreamSynchronize(st));
  ncclxResult_t q = ncclxStreamQuery(st);
  check1(&c, "ncclxStreamQuery after synchronize", 0, q, ncclxSuccess);
  check1(&c, "host functions run (produce)", 0, s.produced, 10);
  check1(&c, "host functions run (consume)", 0, s.consumed, 10);
  check1(&c, "stream 2 waited for the event", 0, s.waitedOk, 1);
  if (s.bad) {
    g.failures += s.bad;
    c.bad += s.bad;
  }
  /* A collective on one stream right after a barrier on another: order through an event. */
  CALL(ncclxBarrier(g.comm, st));
  CALL(ncclxEventRecord(ev, st));
  CALL(ncclxStreamWaitEvent(st2, ev));
  float one = 1.0f, total = 0.0f;
  CALL(ncclxAllReduce(&one, &total, 1, ncclxFloat32, ncclxSum, g.comm, st2));
  CALL(ncclxStreamSynchronize(st2));
  check1(&c, "allreduce after cross-stream event", 0, total, g.nranks);
  CALL(ncclxEventDestroy(ev));
  CALL(ncclxStreamDestroy(st));
  CALL(ncclxStreamDestroy(st2));
  free(s.send);
  free(s.recv);
  finishCase(&c);
}

int main(int argc, char** argv) {
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--reduced")) {
      g.reduced = 1;
    } else {
      fprintf(stderr, "usage: %s [--reduced]\n", argv[0]);
      return 2;
    }
  }
  setvbuf(stdout, NULL, _IOLBF, 0);
  int envRank = mpEnvInt("OMPI_COMM_WORLD_RANK"), envSize = mpEnvInt("OMPI_COMM_WORLD_SIZE");
  g.rank = envRank;
  double t0 = mpNow();
  CALL(ncclxCommInitFromEnv(&g.comm));
  CALL(ncclxCommUserRank(g.comm, &g.rank));
  CALL(ncclxCommCount(g.comm, &g.nranks));
  if ((envRank >= 0 && g.rank != envRank) || (envSize >= 0 && g.nranks != envSize)) {
    fprintf(stderr, "rank %d: communicator says rank %d of %d, launcher says %d of %d\n", g.rank,
            g.rank, g.nranks, envRank, envSize);
    return 1;
  }
  if (g.nranks > 64) {
    fprintf(stderr, "coll_check supports at most 64 ranks\n");
    return 2;
  }
  if (g.rank == 0) {
    printf("coll_check: %d ranks, %s matrix, init %.2f s\n", g.nranks, g.reduced ? "reduced" : "full",
           mpNow() - t0);
    for (char** e = environ; *e; e++) /* the settings this run covers */
      if (!strncmp(*e, "NCCLX_", 6)) printf("  %s\n", *e);
  }

  double ts = mpNow();
  reducingMatrix();
  section("allreduce/reduce/redscat", &ts);
  movementMatrix(); /* reports its own sections */
  ts = mpNow();
  misalignedCases();
  section("byte-misaligned buffers", &ts);
  smallBroadcastRun();
  section("small broadcasts in a row", &ts);
  shiftedBroadcasts();
  section("partly overlapping broadcasts", &ts);
  runBarrier();
  splitParity();
  splitNoColor();
  streamPipeline();
  section("barrier/split/streams", &ts);

  /* Everyone learns the total, so rank 0's summary covers all ranks. */
  int64_t mine = g.failures, total = 0;
  CALL(ncclxAllReduce(&mine, &total, 1, ncclxInt64, ncclxSum, g.comm, NULL));
  CALL(ncclxCommFinalize(g.comm));
  CALL(ncclxCommDestroy(g.comm));
  if (g.rank == 0)
    printf("coll_check: %d ranks, %ld cases per rank, %lld failures in total, %.1f s: %s\n",
           g.nranks, g.cases, (long long)total, mpNow() - t0, total ? "FAIL" : "PASS");
  return g.failures ? 1 : 0;
}
