/* a2av_overflow SCENARIO: a rank sends more than its receiver can hold, with 3 forked ranks.
 *
 *   dynamic        rank 1 sends 100 elements to rank 0, whose maxRecvCount is 64 (queued on a
 *                  stream: the error surfaces at ncclxStreamSynchronize)
 *   dynamic-large  rank 1 sends 2M int32 (8 MiB, many pipeline chunks) to rank 0, whose
 *                  maxRecvCount is 1000
 *   compact        ranks 1 and 2 send 100 each to rank 0, whose maxRecvTotal is 150
 *   moe            every token goes to expert 0 (rank 0), whose maxRecvTokens is 4
 *
 * Expected: rank 0 fails with ncclxInvalidUsage and its message names the sender and both
 * counts; nothing is written outside its receive buffer (guard bytes). Rank 1, the sender,
 * fails with an error: in the same call for the dynamic cases (it reads rank 0's advertised
 * capacity), else in that call or its next operation (a barrier). Rank 2 fails in the call or
 * the next barrier (or in the warm-up barrier, when it is still finishing that one). Every
 * failure within 15 s: no timeout is involved, the abort notice carries it. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "a2av_util.h"

#define NRANKS 3
#define BOUND_SEC 15.0

typedef enum { SC_DYNAMIC, SC_DYNAMIC_LARGE, SC_COMPACT, SC_MOE } Scenario;
static Scenario g_sc;

typedef struct {
  ncclxResult_t callRes, nextRes;
  double callSec, nextSec;
} Outcome;

static ncclxResult_t runCall(int rank, ncclxComm_t comm, mpBuf* recv) {
  size_t sendcounts[NRANKS] = {0}, recvcounts[NRANKS], rdispls[NRANKS];
  size_t maxRecv = g_sc == SC_DYNAMIC_LARGE ? 1000 : 64;
  if (g_sc == SC_DYNAMIC || g_sc == SC_DYNAMIC_LARGE) {
    for (int p = 0; p < NRANKS; p++) sendcounts[p] = 10;
    if (rank == 1) sendcounts[0] = g_sc == SC_DYNAMIC ? 100 : (size_t)2 << 20;
    size_t total = 0;
    for (int p = 0; p < NRANKS; p++) total += sendcounts[p];
    int32_t* send = calloc(total, sizeof(int32_t));
    mpBufAlloc(recv, maxRecv * NRANKS * sizeof(int32_t), 0);
    ncclxStream_t stream = NULL;
    if (g_sc == SC_DYNAMIC) MP_CALL(rank, comm, ncclxStreamCreate(&stream));
    ncclxResult_t res =
        ncclxAllToAllvDynamic(send, sendcounts, recv->ptr, maxRecv, recvcounts, ncclxInt32, comm, stream);
    if (stream) {
      if (res == ncclxSuccess) res = ncclxStreamSynchronize(stream);
      ncclxStreamDestroy(stream);
    }
    free(send);
    return res;
  }
  if (g_sc == SC_COMPACT) {
    if (rank != 0) sendcounts[0] = 100;
    int32_t* send = calloc(100, sizeof(int32_t));
    mpBufAlloc(recv, 150 * sizeof(int32_t), 0);
    ncclxResult_t res = ncclxAllToAllvDynamicCompact(send, sendcounts, recv->ptr, 150, recvcounts, rdispls,
                                                     ncclxInt32, comm, NULL);
    free(send);
    return res;
  }
  /* moe: 3 tokens per rank, top-2, all to expert 0: rank 0 gets 18 rows > 4. */
  ncclxMoeConfig_t cfg = {.size = sizeof(cfg),
                          .nExperts = 6,
                          .topk = 2,
                          .hidden = 16,
                          .datatype = ncclxFloat32,
                          .maxTokens = 3,
                          .maxRecvTokens = rank == 0 ? 4 : 64};
  ncclxMoe_t moe;
  MP_CALL(rank, comm, ncclxMoeCreate(&moe, &cfg, comm));
  float tokens[3 * 16] = {0};
  int32_t ids[6] = {0, 0, 0, 0, 0, 0};
  size_t counts[2];
  mpBufAlloc(recv, cfg.maxRecvTokens * 16 * sizeof(float), 0);
  ncclxResult_t res = ncclxMoeDispatch(moe, tokens, 3, ids, recv->ptr, counts, NULL);
  ncclxMoeDestroy(moe);
  return res;
}

static int rankMain(int rank, int nranks, ncclxUniqueId id, void* arg) {
  (void)nranks, (void)arg;
  ncclxComm_t comm = a2avInit(rank, NRANKS, id);
  /* Warm up the connections so the failure is not confused with connection setup. Rank 2
   * may still be finishing this barrier when rank 0 fails (its notice then fails the
   * barrier): that counts as rank 2 failing at its next operation. */
  ncclxResult_t warm = ncclxBarrier(comm, NULL);
  if (warm != ncclxSuccess && rank != 2) MP_CALL(rank, comm, warm);
  mpBuf recv = {0};
  Outcome o = {ncclxSuccess, ncclxSuccess, 0, 0};
  double t0 = mpNow();
  o.callRes = warm != ncclxSuccess ? warm : runCall(rank, comm, &recv);
  o.callSec = mpNow() - t0;
  char callMsg[1024];
  snprintf(callMsg, sizeof(callMsg), "%s", ncclxGetLastError(comm));
  if (o.callRes == ncclxSuccess) {
    t0 = mpNow();
    o.nextRes = ncclxBarrier(comm, NULL);
    o.nextSec = mpNow() - t0;
  }
  printf("rank %d: call %s after %.2f s%s%s\n", rank, ncclxGetErrorString(o.callRes), o.callSec,
         o.callRes == ncclxSuccess ? ", next barrier " : "",
         o.callRes == ncclxSuccess ? ncclxGetErrorString(o.nextRes) : "");
  printf("rank %d: message: %s\n", rank, ncclxGetLastError(comm));
  int bad = 0;
  if (recv.base && mpBufGuardDamage(&recv)) bad += a2avFail(rank, "bytes written outside the receive buffer");
  if (rank == 0) {
    if (o.callRes != ncclxInvalidUsage)
      bad += a2avFail(rank, "expected ncclxInvalidUsage, got %s", ncclxGetErrorString(o.callRes));
    const char* need[3][3] = {{"rank 1", "100", "64"}, {"rank 1", "2097152", "1000"}, {"rank 2", "100", "150"}};
    if (g_sc == SC_MOE) {
      if (!mpContainsCI(callMsg, "18 tokens") || !mpContainsCI(callMsg, "maxRecvTokens 4"))
        bad += a2avFail(rank, "message does not name the total (18 tokens) and maxRecvTokens 4: %s", callMsg);
    } else {
      int i = g_sc == SC_DYNAMIC ? 0 : g_sc == SC_DYNAMIC_LARGE ? 1 : 2;
      for (int j = 0; j < 3; j++)
        if (!mpContainsCI(callMsg, need[i][j]))
          bad += a2avFail(rank, "message does not mention \"%s\": %s", need[i][j], callMsg);
    }
  } else {
    int failedInCall = o.callRes != ncclxSuccess;
    if (!failedInCall && o.nextRes == ncclxSuccess)
      bad += a2avFail(rank, "neither the call nor the next barrier failed");
    if (rank == 1 && (g_sc == SC_DYNAMIC || g_sc == SC_DYNAMIC_LARGE) && !failedInCall)
      bad += a2avFail(rank, "the sender's own call succeeded (it should read the receiver's capacity)");
  }
  if (o.callSec > BOUND_SEC || o.nextSec > BOUND_SEC)
    bad += a2avFail(rank, "failure took longer than %.0f s", BOUND_SEC);
  ncclxCommAbort(comm);
  if (recv.base) mpBufFree(&recv);
  return bad ? 1 : 0;
}

int main(int argc, char** argv) {
  const char* names[] = {"dynamic", "dynamic-large", "compact", "moe"};
  int found = 0;
  for (int i = 0; i < 4 && argc > 1; i++)
    if (strcmp(argv[1], names[i]) == 0) g_sc = (Scenario)i, found = 1;
  if (!found) {
    fprintf(stderr, "usage: %s dynamic|dynamic-large|compact|moe\n", argv[0]);
    return 2;
  }
  return a2avRunRanks(argv[1], NRANKS, rankMain, NULL, 60.0);
}
