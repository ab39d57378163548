/* a2av_dynamic NP [--reduced]: ncclxAllToAllvDynamic and ncclxAllToAllvDynamicCompact at NP
 * forked ranks.
 *
 * Every rank can compute what every rank sends (counts and values are hashes of sender,
 * receiver and iteration), so each receiver checks its blocks, its counts, that nothing was
 * written outside the blocks (sentinels in the slot tails and guard bytes around buffers)
 * and, for the compact layout, the displacements. Cases:
 *   random      random counts with ~1/3 zeros, several datatypes and maxRecvCount values
 *               (1, 37, 1000 and one above the pipeline chunk), stream NULL
 *   full        every count == maxRecvCount exactly
 *   skew        all-to-one: every rank sends maxRecvCount (1.2 MB) to rank 0, nothing else
 *   compact     random counts, maxRecvTotal exactly the total received and with room to spare
 *   stream      4 calls queued back to back on a stream, each between a host function that
 *               produces its sendcounts (into the SAME array for all 4 calls, which holds
 *               garbage when the calls are made) and one that consumes its recvcounts
 *   reference   the compact result equals ncclxAllToAllv's with the counts known up front */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "a2av_util.h"

#define MAXR MP_MAX_RANKS
enum { MODE_RANDOM, MODE_FULL, MODE_SKEW };

static int g_reduced;

typedef struct {
  ncclxDataType_t dt;
  int mode, iter;
  size_t maxRecv; /* counts are at most this; the maxRecvCount argument */
  int compact;
  size_t slack; /* compact: maxRecvTotal - what arrives */
} Case;

typedef struct {
  int rank, np;
  Case c;
  size_t sendcounts[MAXR], recvcounts[MAXR], rdispls[MAXR];
  size_t recvCap; /* elements of recv: maxRecvCount * np, or maxRecvTotal */
  mpBuf send, recv;
  int bad;
} Call;

static size_t countFor(const Case* c, int s, int d) {
  uint64_t h = mpHash((uint64_t)s, (uint64_t)d, (uint64_t)c->iter, 0xa2a);
  if (c->mode == MODE_FULL) return c->maxRecv;
  if (c->mode == MODE_SKEW) return d == 0 ? c->maxRecv : 0;
  return h % 3 == 0 ? 0 : (size_t)((h >> 8) % (c->maxRecv + 1));
}

static double valueFor(int s, int d, size_t j, int iter) {
  return (double)(((uint64_t)s * 31 + (uint64_t)d * 7 + (uint64_t)j * 3 + (uint64_t)iter * 11) % 97);
}

static size_t incomingTotal(const Case* c, int rank, int np) {
  size_t t = 0;
  for (int s = 0; s < np; s++) t += countFor(c, s, rank);
  return t;
}

/* Fill sendcounts and the send data as rank `rank` (the producer of a stream case calls this
 * when it executes). */
static void produce(Call* k) {
  size_t off = 0;
  for (int d = 0; d < k->np; d++) {
    k->sendcounts[d] = countFor(&k->c, k->rank, d);
    for (size_t j = 0; j < k->sendcounts[d]; j++)
      mpSet(k->send.ptr, off + j, k->c.dt, valueFor(k->rank, d, j, k->c.iter));
    off += k->sendcounts[d];
  }
}

static void callInit(Call* k, int rank, int np, const Case* c) {
  memset(k, 0, sizeof(*k));
  k->rank = rank;
  k->np = np;
  k->c = *c;
  size_t sz = mpTypeSize(c->dt), maxSend = 0;
  for (int d = 0; d < np; d++) maxSend += countFor(c, rank, d);
  if (c->compact) {
    k->recvCap = incomingTotal(c, rank, np) + c->slack;
  } else {
    k->recvCap = c->maxRecv * (size_t)np;
  }
  mpBufAlloc(&k->send, maxSend * sz, 8);
  mpBufAlloc(&k->recv, k->recvCap * sz, 24);
  for (int p = 0; p < MAXR; p++) k->recvcounts[p] = k->rdispls[p] = (size_t)-1;
}

static void callFree(Call* k) {
  mpBufFree(&k->send);
  mpBufFree(&k->recv);
}

static int isSentinel(const unsigned char* p, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (p[i] != MP_SENTINEL) return 0;
  return 1;
}

static const char* caseName(const Case* c, char* buf, size_t size) {
  static const char* modes[] = {"random", "full", "skew"};
  snprintf(buf, size, "%s %s iter %d counts <= %zu", c->compact ? "compact" : "dynamic", modes[c->mode],
           c->iter, c->maxRecv);
  return buf;
}

/* What rank k->rank must have received. Returns the number of problems (reported). */
static int callCheck(Call* k) {
  int bad = 0;
  char name[128];
  caseName(&k->c, name, sizeof(name));
  size_t sz = mpTypeSize(k->c.dt), at = 0;
  for (int s = 0; s < k->np; s++) {
    size_t want = countFor(&k->c, s, k->rank);
    if (k->recvcounts[s] != want) {
      bad += a2avFail(k->rank, "%s %s: recvcounts[%d] = %zu, expected %zu", name, mpTypeName(k->c.dt), s,
                      k->recvcounts[s], want);
      continue;
    }
    size_t base = k->c.compact ? at : (size_t)s * k->c.maxRecv;
    if (k->c.compact && k->rdispls[s] != at)
      bad += a2avFail(k->rank, "%s: rdispls[%d] = %zu, expected %zu", name, s, k->rdispls[s], at);
    size_t wrong = 0, first = 0;
    for (size_t j = 0; j < want; j++)
      if (mpGet(k->recv.ptr, base + j, k->c.dt) != valueFor(s, k->rank, j, k->c.iter) && !wrong++) first = j;
    if (wrong)
      bad += a2avFail(k->rank, "%s %s: %zu of %zu elements from rank %d wrong (first at %zu: %g, expected %g)",
                      name, mpTypeName(k->c.dt), wrong, want, s, first,
                      mpGet(k->recv.ptr, base + first, k->c.dt), valueFor(s, k->rank, first, k->c.iter));
    /* The rest of a peer's slot must be untouched. */
    if (!k->c.compact && !isSentinel(k->recv.ptr + (base + want) * sz, (k->c.maxRecv - want) * sz))
      bad += a2avFail(k->rank, "%s: bytes written past the %zu elements from rank %d", name, want, s);
    at += want;
  }
  if (k->c.compact && !isSentinel(k->recv.ptr + at * sz, (k->recvCap - at) * sz))
    bad += a2avFail(k->rank, "%s: bytes written past the %zu received elements", name, at);
  if (mpBufGuardDamage(&k->recv) || mpBufGuardDamage(&k->send))
    bad += a2avFail(k->rank, "%s: guard bytes around the buffers were overwritten", name);
  return bad;
}

static ncclxResult_t callIssue(Call* k, ncclxComm_t comm, ncclxStream_t stream) {
  if (k->c.compact)
    return ncclxAllToAllvDynamicCompact(k->send.ptr, k->sendcounts, k->recv.ptr, k->recvCap, k->recvcounts,
                                        k->rdispls, k->c.dt, comm, stream);
  return ncclxAllToAllvDynamic(k->send.ptr, k->sendcounts, k->recv.ptr, k->c.maxRecv, k->recvcounts, k->c.dt,
                               comm, stream);
}

/* One call on stream NULL. */
static int runCase(ncclxComm_t comm, int rank, int np, const Case* c) {
  Call k;
  callInit(&k, rank, np, c);
  produce(&k);
  MP_CALL(rank, comm, callIssue(&k, comm, NULL));
  int bad = callCheck(&k);
  callFree(&k);
  return bad;
}

static int testNullStream(ncclxComm_t comm, int rank, int np) {
  static const ncclxDataType_t fullTypes[] = {ncclxInt8,     ncclxInt32,   ncclxFloat16,
                                              ncclxBfloat16, ncclxFloat64, ncclxUint64};
  static const ncclxDataType_t fewTypes[] = {ncclxInt32, ncclxBfloat16};
  const ncclxDataType_t* types = g_reduced ? fewTypes : fullTypes;
  int ntypes = g_reduced ? 2 : 6;
  static const size_t maxRecvs[] = {1, 37, 1000};
  int bad = 0, iter = 0;
  for (int t = 0; t < ntypes; t++)
    for (int m = 0; m < 3; m++) {
      Case c = {.dt = types[t], .mode = MODE_RANDOM, .iter = iter++, .maxRecv = maxRecvs[m]};
      bad += runCase(comm, rank, np, &c);
      c.compact = 1;
      c.slack = (size_t)(m * 5);
      bad += runCase(comm, rank, np, &c);
    }
  /* Above the 512 KiB pipeline chunk: several data messages per block. */
  Case big = {.dt = ncclxInt32, .mode = MODE_RANDOM, .iter = iter++, .maxRecv = 200000};
  bad += runCase(comm, rank, np, &big);
  Case full = {.dt = ncclxFloat32, .mode = MODE_FULL, .iter = iter++, .maxRecv = 513};
  bad += runCase(comm, rank, np, &full);
  full.compact = 1;
  bad += runCase(comm, rank, np, &full);
  Case skew = {.dt = ncclxInt32, .mode = MODE_SKEW, .iter = iter++, .maxRecv = 300000};
  bad += runCase(comm, rank, np, &skew);
  if (!bad && rank == 0) printf("rank 0: stream NULL cases ok\n");
  return bad;
}

/* ---------------- stream: host functions produce and consume the counts ---------------- */

#define INFLIGHT 4

typedef struct {
  Call* call;
  size_t* sharedSendcounts; /* the array every queued call was given */
  size_t* sharedRecvcounts;
  int consumed;
} StreamSlot;

static void hostProduce(void* u) {
  StreamSlot* s = u;
  produce(s->call);
  memcpy(s->sharedSendcounts, s->call->sendcounts, sizeof(s->call->sendcounts));
}

static void hostConsume(void* u) {
  StreamSlot* s = u;
  memcpy(s->call->recvcounts, s->sharedRecvcounts, sizeof(s->call->recvcounts));
  for (int p = 0; p < MAXR; p++) s->sharedRecvcounts[p] = (size_t)-1; /* the next call must write them again */
  s->call->bad += callCheck(s->call);
  s->consumed = 1;
}

static int testStream(ncclxComm_t comm, int rank, int np, int compact) {
  ncclxStream_t stream;
  MP_CALL(rank, comm, ncclxStreamCreate(&stream));
  Call calls[INFLIGHT];
  StreamSlot slots[INFLIGHT];
  size_t sharedSend[MAXR], sharedRecv[MAXR], sharedDispl[MAXR];
  /* Garbage when the calls are made: only the producers' values may be used. */
  for (int p = 0; p < MAXR; p++) sharedSend[p] = sharedRecv[p] = sharedDispl[p] = (size_t)1 << 60;
  for (int i = 0; i < INFLIGHT; i++) {
    Case c = {.dt = i % 2 ? ncclxBfloat16 : ncclxInt64,
              .mode = MODE_RANDOM,
              .iter = 100 + i + 10 * compact,
              .maxRecv = 50 + 40 * (size_t)i,
              .compact = compact,
              .slack = 3};
    callInit(&calls[i], rank, np, &c); /* buffers sized for the counts the producer writes */
    slots[i] = (StreamSlot){.call = &calls[i], .sharedSendcounts = sharedSend, .sharedRecvcounts = sharedRecv};
  }
  for (int i = 0; i < INFLIGHT; i++) {
    Call* k = &calls[i];
    MP_CALL(rank, comm, ncclxLaunchHostFunc(stream, hostProduce, &slots[i]));
    if (compact)
      MP_CALL(rank, comm,
              ncclxAllToAllvDynamicCompact(k->send.ptr, sharedSend, k->recv.ptr, k->recvCap, sharedRecv,
                                           k->rdispls, k->c.dt, comm, stream));
    else
      MP_CALL(rank, comm,
              ncclxAllToAllvDynamic(k->send.ptr, sharedSend, k->recv.ptr, k->c.maxRecv, sharedRecv, k->c.dt,
                                    comm, stream));
    MP_CALL(rank, comm, ncclxLaunchHostFunc(stream, hostConsume, &slots[i]));
  }
  MP_CALL(rank, comm, ncclxStreamSynchronize(stream));
  int bad = 0;
  for (int i = 0; i < INFLIGHT; i++) {
    if (!slots[i].consumed) bad += a2avFail(rank, "stream call %d: the consumer host function never ran", i);
    bad += calls[i].bad;
    callFree(&calls[i]);
  }
  MP_CALL(rank, comm, ncclxStreamDestroy(stream));
  if (!bad && rank == 0)
    printf("rank 0: %d %s calls in flight on a stream ok\n", INFLIGHT, compact ? "compact" : "dynamic");
  return bad;
}

/* ---------------- reference: ncclxAllToAllv with known counts ---------------- */

static int testReference(ncclxComm_t comm, int rank, int np) {
  Case c = {.dt = ncclxFloat32, .mode = MODE_RANDOM, .iter = 200, .maxRecv = 777, .compact = 1};
  Call k;
  callInit(&k, rank, np, &c);
  produce(&k);
  MP_CALL(rank, comm, callIssue(&k, comm, NULL));
  size_t sdispls[MAXR], rcounts[MAXR], rdispls[MAXR], s = 0, r = 0;
  for (int p = 0; p < np; p++) {
    sdispls[p] = s;
    s += k.sendcounts[p];
    rcounts[p] = countFor(&c, p, rank);
    rdispls[p] = r;
    r += rcounts[p];
  }
  float* ref = calloc(r + 1, sizeof(float));
  MP_CALL(rank, comm,
          ncclxAllToAllv(k.send.ptr, k.sendcounts, sdispls, ref, rcounts, rdispls, ncclxFloat32, comm, NULL));
  int bad = callCheck(&k);
  if (memcmp(ref, k.recv.ptr, r * sizeof(float)) != 0)
    bad += a2avFail(rank, "compact dynamic result differs from ncclxAllToAllv's (%zu elements)", r);
  free(ref);
  callFree(&k);
  if (!bad && rank == 0) printf("rank 0: matches ncclxAllToAllv\n");
  return bad;
}

static int rankMain(int rank, int np, ncclxUniqueId id, void* arg) {
  (void)arg;
  ncclxComm_t comm = a2avInit(rank, np, id);
  int bad = testNullStream(comm, rank, np);
  bad += testStream(comm, rank, np, 0);
  bad += testStream(comm, rank, np, 1);
  bad += testReference(comm, rank, np);
  MP_CALL(rank, comm, ncclxCommDestroy(comm));
  return bad ? 1 : 0;
}

int main(int argc, char** argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s NP [--reduced]\n", argv[0]);
    return 2;
  }
  int np = a2avArgInt(argv[1], "NP");
  g_reduced = argc > 2 && strcmp(argv[2], "--reduced") == 0;
  if (np < 1 || np > MAXR) {
    fprintf(stderr, "NP must be 1..%d\n", MAXR);
    return 2;
  }
  return a2avRunRanks("a2av_dynamic", np, rankMain, NULL, 100.0);
}
