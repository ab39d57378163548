/* MoE expert capacity (ncclxMoeConfig_t.expertCapacity): pairs over an expert's capacity are
 * dropped in token order and counted, the call succeeds on every rank, the combine gives the
 * dropped pairs no contribution, and the communicator stays usable; a capacity that
 * maxRecvTokens cannot hold is refused at create.
 *
 *   a2av_capacity NP
 *
 * nExperts = 2 x NP (two per rank), top-2, hidden 4, float32, 64 tokens per rank, capacity 5:
 * every rank sends both pairs of every token to experts 0 and 1 (rank 0's), so 59 pairs per
 * expert and rank are dropped. Token rows encode (rank, token); the experts return their
 * input, so out[t] = (w0 + w1) x row(t) for t < 5 and zeros after.
 *
 * Then out-of-range expert ids, with stream NULL and queued on a stream with the combine
 * behind: the last rank routes pair k = 1 of tokens 0 and 1 to experts nExperts and -7.
 * That rank alone gets ncclxInvalidArgument, the bad pairs are not sent (rank 0's experts
 * hold exactly the good rows, the combine gives those tokens w0 x row only), the other
 * ranks succeed, and the communicator still runs an all-reduce and a clean dispatch. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "a2av_util.h"

#define TOKENS 64
#define HIDDEN 4
#define CAP 5

static float value(int rank, size_t token, size_t j) { return (float)(rank * 1000 + (int)token * 10 + (int)j); }

/* One dispatch + combine where the last rank passes two bad ids; stream NULL or queued. */
static int badIdRound(int rank, int nranks, ncclxComm_t comm, ncclxMoe_t moe, ncclxStream_t stream,
                      const float* tokens, const float* weights, float* expertIn, float* out) {
  int bad = 0, culprit = rank == nranks - 1;
  int32_t ids[TOKENS * 2];
  size_t counts[2] = {0, 0}, dropped[64];
  for (size_t t = 0; t < TOKENS; t++) ids[2 * t] = t < 2 ? (int32_t)t : -1, ids[2 * t + 1] = -1;
  if (culprit) ids[1] = 2 * nranks, ids[3] = -7;
  const char* how = stream ? "queued" : "stream NULL";
  ncclxResult_t rd = ncclxMoeDispatch(moe, tokens, TOKENS, ids, expertIn, counts, stream);
  ncclxResult_t rc = ncclxMoeCombine(moe, expertIn, weights, out, stream);
  ncclxResult_t rs = stream ? ncclxStreamSynchronize(stream) : ncclxSuccess;
  ncclxResult_t got = stream ? rs : rd, want = culprit ? ncclxInvalidArgument : ncclxSuccess;
  if (got != want) bad += a2avFail(rank, "%s: bad-id dispatch returned %d, expected %d", how, (int)got, (int)want);
  if (stream && (rd != ncclxSuccess || rc != ncclxSuccess))
    bad += a2avFail(rank, "%s: queueing returned %d / %d", how, (int)rd, (int)rc);
  if (!stream && rc != ncclxSuccess) bad += a2avFail(rank, "%s: combine after the refusal returned %d", how, (int)rc);
  if (culprit && !strstr(ncclxGetLastError(comm), "expertIds[1]"))
    bad += a2avFail(rank, "%s: the error does not name the bad pair: %s", how, ncclxGetLastError(comm));
  MP_CALL(rank, comm, ncclxMoeDroppedCounts(moe, dropped));
  for (int e = 0; e < 2 * nranks; e++)
    if (dropped[e] != 0) bad += a2avFail(rank, "%s: bad ids counted as dropped[%d] = %zu", how, e, dropped[e]);
  if (rank == 0)
    for (int e = 0; e < 2; e++) {
      /* Expert e holds token e of every rank, by source rank. */
      if (counts[e] != (size_t)nranks) bad += a2avFail(rank, "%s: expert %d got %zu rows", how, e, counts[e]);
      for (int s = 0; s < nranks; s++)
        for (size_t j = 0; j < HIDDEN; j++)
          if (expertIn[((size_t)e * nranks + (size_t)s) * HIDDEN + j] != value(s, (size_t)e, j)) {
            bad += a2avFail(rank, "%s: expert %d row %d is not rank %d token %d", how, e, s, s, e);
            j = HIDDEN;
          }
    }
  for (size_t t = 0; t < TOKENS; t++)
    for (size_t j = 0; j < HIDDEN; j++) {
      float w = t < 2 ? 0.25f * value(rank, t, j) : 0.0f;
      if (out[t * HIDDEN + j] != w) {
        bad += a2avFail(rank, "%s: out[%zu][%zu] = %g, expected %g", how, t, j, out[t * HIDDEN + j], w);
        t = TOKENS;
        break;
      }
    }
  /* Still usable: an all-reduce of the rank numbers. */
  int one = rank, sum = -1;
  MP_CALL(rank, comm, ncclxAllReduce(&one, &sum, 1, ncclxInt32, ncclxSum, comm, NULL));
  if (sum != nranks * (nranks - 1) / 2) bad += a2avFail(rank, "%s: all-reduce after the refusal gave %d", how, sum);
  return bad;
}

static int rankMain(int rank, int nranks, ncclxUniqueId id, void* arg) {
  (void)arg;
  ncclxComm_t comm = a2avInit(rank, nranks, id);
  int bad = 0;
  ncclxMoeConfig_t cfg = {.size = sizeof(cfg), .nExperts = 2 * nranks, .topk = 2, .hidden = HIDDEN,
                          .datatype = ncclxFloat32, .maxTokens = TOKENS, .maxRecvTokens = (size_t)nranks * 2 * CAP - 1,
                          .expertCapacity = CAP};
  ncclxMoe_t moe = NULL;
  if (ncclxMoeCreate(&moe, &cfg, comm) != ncclxInvalidArgument)
    bad += a2avFail(rank, "a capacity maxRecvTokens cannot hold was accepted");
  cfg.maxRecvTokens = (size_t)nranks * 2 * CAP;
  MP_CALL(rank, comm, ncclxMoeCreate(&moe, &cfg, comm));
  float tokens[TOKENS * HIDDEN], weights[TOKENS * 2], out[TOKENS * HIDDEN];
  int32_t ids[TOKENS * 2];
  for (size_t t = 0; t < TOKENS; t++) {
    for (size_t j = 0; j < HIDDEN; j++) tokens[t * HIDDEN + j] = value(rank, t, j);
    ids[2 * t] = 0, ids[2 * t + 1] = 1;
    weights[2 * t] = 0.25f, weights[2 * t + 1] = 0.5f;
  }
  size_t maxRecv = cfg.maxRecvTokens;
  float* expertIn = calloc(maxRecv * HIDDEN + 1, sizeof(float));
  size_t counts[2] = {0, 0}, dropped[64];
  MP_CALL(rank, comm, ncclxMoeDispatch(moe, tokens, TOKENS, ids, expertIn, counts, NULL));
  MP_CALL(rank, comm, ncclxMoeDroppedCounts(moe, dropped));
  for (int e = 0; e < 2 * nranks; e++) {
    size_t want = e < 2 ? TOKENS - CAP : 0;
    if (dropped[e] != want) bad += a2avFail(rank, "dropped[%d] = %zu, expected %zu", e, dropped[e], want);
  }
  if (rank == 0) {
    /* Each expert holds CAP rows from every rank, by source rank, then token: tokens 0..4. */
    for (int e = 0; e < 2; e++) {
      if (counts[e] != (size_t)nranks * CAP) bad += a2avFail(rank, "expert %d got %zu rows", e, counts[e]);
      for (int s = 0; s < nranks && !bad; s++)
        for (size_t t = 0; t < CAP; t++)
          for (size_t j = 0; j < HIDDEN; j++) {
            size_t row = (size_t)e * nranks * CAP + (size_t)s * CAP + t;
            if (expertIn[row * HIDDEN + j] != value(s, t, j))
              bad += a2avFail(rank, "expert %d row %zu is not rank %d token %zu", e, row, s, t);
          }
    }
  }
  /* The experts return their input. */
  MP_CALL(rank, comm, ncclxMoeCombine(moe, expertIn, weights, out, NULL));
  for (size_t t = 0; t < TOKENS && !bad; t++)
    for (size_t j = 0; j < HIDDEN; j++) {
      float want = t < CAP ? 0.75f * value(rank, t, j) : 0.0f;
      if (out[t * HIDDEN + j] != want) {
        bad += a2avFail(rank, "out[%zu][%zu] = %g, expected %g", t, j, out[t * HIDDEN + j], want);
        break;
      }
    }
  /* Usable afterwards: a dispatch within capacity keeps everything. */
  for (size_t t = 0; t < TOKENS; t++) ids[2 * t] = ids[2 * t + 1] = t < 2 ? (int32_t)(t % 2) : -1;
  MP_CALL(rank, comm, ncclxMoeDispatch(moe, tokens, TOKENS, ids, expertIn, counts, NULL));
  MP_CALL(rank, comm, ncclxMoeDroppedCounts(moe, dropped));
  for (int e = 0; e < 2 * nranks; e++)
    if (dropped[e] != 0) bad += a2avFail(rank, "second dispatch: dropped[%d] = %zu", e, dropped[e]);
  MP_CALL(rank, comm, ncclxMoeCombine(moe, expertIn, weights, out, NULL));
  ncclxStream_t stream = NULL;
  MP_CALL(rank, comm, ncclxStreamCreate(&stream));
  bad += badIdRound(rank, nranks, comm, moe, NULL, tokens, weights, expertIn, out);
  bad += badIdRound(rank, nranks, comm, moe, stream, tokens, weights, expertIn, out);
  /* And a clean dispatch after both refusals: every pair arrives. */
  for (size_t t = 0; t < TOKENS; t++) ids[2 * t] = ids[2 * t + 1] = t < 2 ? (int32_t)(t % 2) : -1;
  MP_CALL(rank, comm, ncclxMoeDispatch(moe, tokens, TOKENS, ids, expertIn, counts, stream));
  MP_CALL(rank, comm, ncclxMoeCombine(moe, expertIn, weights, out, stream));
  MP_CALL(rank, comm, ncclxStreamSynchronize(stream));
  if (rank == 0 && (counts[0] != 2 * (size_t)nranks || counts[1] != 2 * (size_t)nranks))
    bad += a2avFail(rank, "clean dispatch after the refusals: %zu / %zu rows", counts[0], counts[1]);
  if (out[0] != 0.75f * value(rank, 0, 0) || out[HIDDEN] != 0.75f * value(rank, 1, 0))
    bad += a2avFail(rank, "clean dispatch after the refusals: out %g %g", out[0], out[HIDDEN]);
  MP_CALL(rank, comm, ncclxStreamDestroy(stream));
  MP_CALL(rank, comm, ncclxMoeDestroy(moe));
  MP_CALL(rank, comm, ncclxCommDestroy(comm));
  free(expertIn);
  return bad ? 1 : 0;
}

int main(int argc, char** argv) {
  int np = argc > 1 ? a2avArgInt(argv[1], "NP") : 2;
  int rc = a2avRunRanks("a2av_capacity", np, rankMain, NULL, 100.0);
  printf("a2av_capacity np %d: %s\n", np, rc ? "FAILED" : "passed");
  return rc;
}
