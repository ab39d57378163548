/* Ranks that disagree on a collective's count or datatype must fail, never complete with the
 * wrong data (net.h, "Signed tags"): rank 1 passes count x 2, count / 2, or float64 for
 * float32, at 64 KiB, 1 MiB and 16 MiB per rank, for every collective with one count.
 *
 *   mp_count_mismatch NP
 *
 * Each case is a fresh job of forked ranks: call 1 agrees (connections up), call 2 is the
 * mismatch, call 3 a barrier. Where every rank receives from a rank whose call differs
 * (all-reduce, all-gather, reduce-scatter, all-to-all), every rank must fail call 2. In a
 * broadcast or a reduce a rank whose data is right may complete call 2 (a root that only
 * sends, a rank that never hears from rank 1): it must fail the barrier after it. In every
 * case some rank's error says the calls or counts differ, and no rank passes call 3. A rank
 * still finishing call 1 when another fails call 2 may fail call 1: by the abort notice that
 * names the difference, or, when a failed rank's closed connection reaches it before the
 * notice (seen under AddressSanitizer), naming that rank; either way with an error.
 * Where rank 1's call takes another path than the others' (ring against linear, the
 * low-latency board against messages: count x 250 from 1000 floats, or another collective),
 * no message of rank 1's call may ever reach a rank that checks it; the ranks' wait notes
 * (waitnote.h) must name the difference well before the timeout (10 s in CTest): a case
 * where every rank fails by the timeout is a failure, and so is one that takes over 5 s.
 * Run over shared memory and over TCP (NCCLX_CORE_SHM=0) by CTest. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mp_fork.h"
#include "mp_util.h"

typedef enum { MIS_DOUBLE, MIS_HALF, MIS_FLOAT64, MIS_KINDS, MIS_X250 = MIS_KINDS, MIS_OTHER_COLL } mismatchKind;
static const char* const kindNames[] = {"count x 2", "count / 2", "float64 for float32", "count x 250",
                                        "another collective"};

typedef enum { C_ALLREDUCE, C_ALLGATHER, C_REDUCESCATTER, C_ALLTOALL, C_BROADCAST, C_REDUCE, C_COLLS } collKind;
static const char* const collNames[] = {"allreduce", "allgather", "reducescatter", "alltoall", "broadcast", "reduce"};

typedef struct {
  collKind coll;
  mismatchKind kind;
  size_t count; /* float32 elements per rank, as every rank but rank 1 passes it */
} Case;

/* Rank 1's call in "another collective". Not a reduce for a broadcast: a broadcast's root only
 * sends and a reduce's non-root only sends, so between root 0 and rank 1 no data meets and
 * both complete, as in NCCL; [core] check_mismatch compares such calls. */
static const collKind otherColl[C_COLLS] = {C_ALLGATHER, C_REDUCESCATTER, C_ALLTOALL, C_BROADCAST, C_ALLREDUCE, C_ALLREDUCE};

static ncclxResult_t runColl(collKind coll, ncclxComm_t comm, void* send, void* recv, size_t count,
                             ncclxDataType_t type) {
  switch (coll) {
    case C_ALLREDUCE: return ncclxAllReduce(send, recv, count, type, ncclxSum, comm, NULL);
    case C_ALLGATHER: return ncclxAllGather(send, recv, count, type, comm, NULL);
    case C_REDUCESCATTER: return ncclxReduceScatter(send, recv, count, type, ncclxSum, comm, NULL);
    case C_ALLTOALL: return ncclxAllToAll(send, recv, count, type, comm, NULL);
    case C_BROADCAST: return ncclxBroadcast(send, recv, count, type, 0, comm, NULL);
    default: return ncclxReduce(send, recv, count, type, ncclxSum, 0, comm, NULL);
  }
}

/* Exit status: 0 every call passed; 10 * call + (1 when its error says what differs, 2 when
 * it is a timeout). */
static int rankMain(int rank, int nranks, ncclxUniqueId id, void* arg) {
  const Case* c = arg;
  ncclxComm_t comm = NULL;
  if (ncclxCommInitRank(&comm, nranks, id, rank) != ncclxSuccess) return 2;
  size_t count = c->count;
  ncclxDataType_t type = ncclxFloat32;
  /* Ordinary malloc'ed buffers, as applications and torch tensors have; room for the
   * largest call (float64 x 2 count x nranks blocks). */
  size_t room = c->count * (c->kind == MIS_X250 ? 250 : 2) * 8 * (size_t)nranks;
  void* send = calloc(1, room);
  void* recv = calloc(1, room);
  if (!send || !recv) return 3;
  int status = 0;
  for (int call = 1; call <= 3 && !status; call++) {
    ncclxResult_t res;
    if (call == 3) {
      res = ncclxBarrier(comm, NULL);
    } else {
      collKind coll = c->coll;
      if (call == 2 && rank == 1) {
        if (c->kind == MIS_DOUBLE) count = c->count * 2;
        if (c->kind == MIS_HALF) count = c->count / 2;
        if (c->kind == MIS_X250) count = c->count * 250;
        if (c->kind == MIS_FLOAT64) type = ncclxFloat64;
        if (c->kind == MIS_OTHER_COLL) coll = otherColl[coll];
      }
      res = runColl(coll, comm, send, recv, count, type);
    }
    if (res != ncclxSuccess) {
      const char* err = ncclxGetLastError(comm);
      int says = mpContainsCI(err, "differ") ? 1 : mpContainsCI(err, "timeout") ? 2 : 0;
      status = 10 * call + says;
      if (call == 2 && says) fprintf(stderr, "rank %d: %s\n", rank, err);
    }
  }
  ncclxCommDestroy(comm);
  free(send);
  free(recv);
  return status;
}

static int g_slow;

/* One job; returns the number of failed expectations. */
static int runCase(int np, const Case* c) {
  ncclxUniqueId id;
  if (ncclxGetUniqueId(&id) != ncclxSuccess) {
    fprintf(stderr, "ncclxGetUniqueId: %s\n", ncclxGetLastError(NULL));
    return 1;
  }
  mpJob job;
  double start = mpNow();
  mpJobInit(&job, np);
  for (int r = 0; r < np; r++) mpJobSpawn(&job, r, rankMain, id, (void*)c);
  int ranks[MP_MAX_RANKS];
  for (int r = 0; r < np; r++) ranks[r] = r;
  int stuck = mpJobWait(&job, ranks, np, mpNow() + 60);
  double took = mpNow() - start;
  /* Another collective on rank 1: not every rank receives from a rank whose call differs. */
  int symmetric = c->coll <= C_ALLTOALL && c->kind != MIS_OTHER_COLL, bad = 0, toldWhy = 0, timedOut = 0;
  char why[64];
  for (int r = 0; r < np; r++) {
    int st = job.done[r] && WIFEXITED(job.status[r]) ? WEXITSTATUS(job.status[r]) : -1;
    int call = st / 10;
    toldWhy |= call == 2 && st % 10 == 1;
    timedOut += st > 0 && st % 10 == 2;
    const char* wrong = NULL;
    if (st < 0) wrong = "did not exit";
    else if (st == 0) wrong = "passed every call (the mismatch went unnoticed)";
    else if (call < 1) wrong = "failed before any call";
    else if (symmetric && call > 2) wrong = "completed the mismatched call";
    if (wrong) {
      fprintf(stderr, "FAIL np %d %s %zu floats, rank 1 %s: rank %d %s (%s)\n", np, collNames[c->coll],
              c->count, kindNames[c->kind], r, wrong, mpDescribeStatus(&job, r, why, sizeof(why)));
      bad++;
    }
  }
  if (!toldWhy) {
    fprintf(stderr, "FAIL np %d %s %zu floats, rank 1 %s: no rank's error says what differs (%d of %d ranks timed out)\n",
            np, collNames[c->coll], c->count, kindNames[c->kind], timedOut, np);
    bad++;
  }
  if (took > 5.0) {
    g_slow++;
    fprintf(stderr, "FAIL np %d %s %zu floats, rank 1 %s: took %.1f s to fail (the timeout is 10 s)\n", np,
            collNames[c->coll], c->count, kindNames[c->kind], took);
    bad++;
  }
  if (stuck) mpJobKillRest(&job);
  return bad;
}

int main(int argc, char** argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s NP\n", argv[0]);
    return 2;
  }
  int np = atoi(argv[1]);
  if (np < 2 || np > MP_MAX_RANKS) {
    fprintf(stderr, "NP must be 2..%d\n", MP_MAX_RANKS);
    return 2;
  }
  /* Per rank: 64 KiB (slot-sized messages), 1 MiB (pipeline chunks), 16 MiB (many chunks,
   * CMA and bulk sizes). */
  static const size_t counts[] = {16384, 262144, 4194304};
  int failures = 0, cases = 0;
  double t0 = mpNow();
  for (int ci = 0; ci < 3; ci++)
    for (int coll = 0; coll < C_COLLS; coll++)
      for (int kind = 0; kind < MIS_KINDS; kind++) {
        Case c = {(collKind)coll, (mismatchKind)kind, counts[ci]};
        failures += runCase(np, &c) > 0;
        cases++;
      }
  /* Paths that differ: 1000 floats on the low-latency board against 250000 in messages; at
   * 1 MiB another collective on rank 1. */
  for (int coll = 0; coll < C_COLLS; coll++) {
    Case crossing[] = {{(collKind)coll, MIS_X250, 1000}, {(collKind)coll, MIS_OTHER_COLL, 262144},
                       {(collKind)coll, MIS_OTHER_COLL, 1000}};
    for (int k = 0; k < 3; k++) {
      failures += runCase(np, &crossing[k]) > 0;
      cases++;
    }
  }
  printf("count_mismatch np %d: %d of %d cases failed (%d too slow), in %.1f s\n", np, failures, cases, g_slow,
         mpNow() - t0);
  return failures ? 1 : 0;
}
