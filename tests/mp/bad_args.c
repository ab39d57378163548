/* Bad input is refused with ncclxInvalidArgument or ncclxInvalidUsage and a message that
 * names what was wrong; nothing crashes or hangs, and the communicator stays usable.
 * Then a send/recv size mismatch between two ranks fails on the receiver (RemoteError or
 * InvalidUsage) within the timeout. Run with 2 ranks (run_mp.sh 2 bad_args).
 *
 * Every bad call here is rejected by local validation on every rank alike, so no rank is
 * left waiting in a collective the other refused. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "mp_util.h"

static int g_rank = -1, g_nranks;
static long g_failures, g_checks;

#define BADT ((ncclxDataType_t)42)
#define BADOP ((ncclxRedOp_t)42)

static void fail(const char* fmt, const char* what, const char* detail) {
  fprintf(stderr, "rank %d: FAIL %s: ", g_rank, what);
  fprintf(stderr, fmt, detail);
  fprintf(stderr, "\n");
  g_failures++;
}

/* res must be an argument/usage error; the message (of comm, or of the thread when comm is
 * NULL) must be non-empty and contain one of the '|'-separated keywords. */
static void expectBad(const char* what, ncclxResult_t res, ncclxComm_t comm, const char* keywords) {
  g_checks++;
  const char* msg = ncclxGetLastError(comm);
  if (res != ncclxInvalidArgument && res != ncclxInvalidUsage) {
    char d[160];
    snprintf(d, sizeof d, "%d (%s)", (int)res, ncclxGetErrorString(res));
    fail("returned %s, expected ncclxInvalidArgument or ncclxInvalidUsage", what, d);
    return;
  }
  if (!msg || !*msg) {
    fail("%sempty ncclxGetLastError message", what, "");
    return;
  }
  int found = 0;
  char kw[128];
  snprintf(kw, sizeof kw, "%s", keywords);
  for (char* save = NULL, *k = strtok_r(kw, "|", &save); k; k = strtok_r(NULL, "|", &save))
    found |= mpContainsCI(msg, k);
  if (!found) {
    char d[1200];
    snprintf(d, sizeof d, "\"%s\" (expected a mention of %s)", msg, keywords);
    fail("message does not say what was wrong: %s", what, d);
    return;
  }
  if (g_rank == 0) printf("  ok  %-44s -> %-20s \"%s\"\n", what, ncclxGetErrorString(res), msg);
}

static void expectTrue(const char* what, int cond) {
  g_checks++;
  if (!cond) fail("%scheck failed", what, "");
}

static void libraryLevel(void) {
  int v = 0;
  expectBad("ncclxGetVersion(NULL)", ncclxGetVersion(NULL), NULL, "null|version");
  expectTrue("ncclxGetVersion value", ncclxGetVersion(&v) == ncclxSuccess && v == NCCLX_VERSION_CODE);
  for (int r = 0; r < ncclxNumResults; r++) {
    const char* s = ncclxGetErrorString((ncclxResult_t)r);
    char what[64];
    snprintf(what, sizeof what, "ncclxGetErrorString(%d) non-empty", r);
    expectTrue(what, s && *s);
    for (int q = 0; q < r; q++) {
      snprintf(what, sizeof what, "ncclxGetErrorString(%d) != (%d)", r, q);
      expectTrue(what, s && strcmp(s, ncclxGetErrorString((ncclxResult_t)q)) != 0);
    }
  }
  const char* unk = ncclxGetErrorString((ncclxResult_t)99);
  expectTrue("ncclxGetErrorString(99) non-empty", unk && *unk);
  expectTrue("ncclxTypeSize(42) == 0", ncclxTypeSize(BADT) == 0);
  for (int t = 0; t < ncclxNumTypes; t++) {
    char what[64];
    snprintf(what, sizeof what, "ncclxTypeSize(%s)", mpTypeName((ncclxDataType_t)t));
    expectTrue(what, ncclxTypeSize((ncclxDataType_t)t) == mpTypeSize((ncclxDataType_t)t));
    expectTrue("ncclxTypeName non-empty", ncclxTypeName((ncclxDataType_t)t)[0] != 0);
  }
  expectTrue("ncclxTypeName(42) non-NULL", ncclxTypeName(BADT) != NULL);
  expectTrue("ncclxOpName(42) non-NULL", ncclxOpName(BADOP) != NULL);
  expectBad("ncclxGetUniqueId(NULL)", ncclxGetUniqueId(NULL), NULL, "null|id");
  expectBad("ncclxMemAlloc(NULL, 64)", ncclxMemAlloc(NULL, 64), NULL, "null|ptr|pointer");
  expectBad("ncclxStreamCreate(NULL)", ncclxStreamCreate(NULL), NULL, "null|stream");
  expectBad("ncclxEventCreate(NULL)", ncclxEventCreate(NULL), NULL, "null|event");
  expectBad("ncclxGroupEnd without ncclxGroupStart", ncclxGroupEnd(), NULL, "group");
}

static void initArgs(void) {
  ncclxUniqueId id;
  memset(&id, 0, sizeof id);
  /* NCCLX_COMM_ID is set by the launcher: this names the job's address, opens nothing. */
  if (ncclxGetUniqueId(&id) != ncclxSuccess) fail("%sncclxGetUniqueId failed", "initArgs", "");
  ncclxComm_t c = NULL;
  expectBad("ncclxCommInitRank nranks 0", ncclxCommInitRank(&c, 0, id, 0), NULL, "nranks|rank|size");
  expectBad("ncclxCommInitRank nranks -3", ncclxCommInitRank(&c, -3, id, 0), NULL, "nranks|rank|size");
  expectBad("ncclxCommInitRank rank == nranks", ncclxCommInitRank(&c, 2, id, 2), NULL, "rank");
  expectBad("ncclxCommInitRank rank -1", ncclxCommInitRank(&c, 2, id, -1), NULL, "rank");
  expectBad("ncclxCommInitRank comm NULL", ncclxCommInitRank(NULL, 2, id, 1), NULL, "null|comm");
  ncclxConfig_t cfg = NCCLX_CONFIG_INITIALIZER;
  cfg.magic = 0;
  expectBad("ncclxCommInitRankConfig bad magic", ncclxCommInitRankConfig(&c, 2, id, 1, &cfg), NULL,
            "config|magic");
  ncclxConfig_t cfg2 = NCCLX_CONFIG_INITIALIZER;
  cfg2.size = 3;
  expectBad("ncclxCommInitRankConfig bad size", ncclxCommInitRankConfig(&c, 2, id, 1, &cfg2), NULL,
            "config|size");
}

static void commArgs(ncclxComm_t comm) {
  int n;
  ncclxResult_t e;
  ncclxComm_t nc = NULL;
  expectBad("ncclxCommCount(NULL comm)", ncclxCommCount(NULL, &n), NULL, "comm|null");
  expectBad("ncclxCommCount(count NULL)", ncclxCommCount(comm, NULL), comm, "null|count");
  expectBad("ncclxCommUserRank(NULL comm)", ncclxCommUserRank(NULL, &n), NULL, "comm|null");
  expectBad("ncclxCommUserRank(rank NULL)", ncclxCommUserRank(comm, NULL), comm, "null|rank");
  expectBad("ncclxCommGetAsyncError(NULL comm)", ncclxCommGetAsyncError(NULL, &e), NULL, "comm|null");
  expectBad("ncclxCommGetAsyncError(result NULL)", ncclxCommGetAsyncError(comm, NULL), comm, "null|error");
  expectBad("ncclxCommSplit(NULL comm)", ncclxCommSplit(NULL, 0, 0, &nc, NULL), NULL, "comm|null");
  expectBad("ncclxCommSplit(newcomm NULL)", ncclxCommSplit(comm, 0, 0, NULL, NULL), comm, "null|newcomm|comm");
  expectBad("ncclxCommSplit(color -7)", ncclxCommSplit(comm, -7, 0, &nc, NULL), comm, "color");
  ncclxConfig_t cfg = NCCLX_CONFIG_INITIALIZER;
  cfg.magic = 1;
  expectBad("ncclxCommSplit(bad config magic)", ncclxCommSplit(comm, 0, 0, &nc, &cfg), comm,
            "config|magic");
  char buf[64];
  void* h = NULL;
  expectBad("ncclxCommRegister(buff NULL)", ncclxCommRegister(comm, NULL, 64, &h), comm, "null|buf");
  expectBad("ncclxCommRegister(handle NULL)", ncclxCommRegister(comm, buf, 64, NULL), comm, "null|handle");
  /* Destroy(NULL) and Abort(NULL) are no-ops in NCCL; only Finalize is checked. */
  expectBad("ncclxCommFinalize(NULL)", ncclxCommFinalize(NULL), NULL, "comm|null");
}

static void collArgs(ncclxComm_t comm) {
  enum { N = 8 };
  float sb[N * 2] = {0}, rb[N * 2];
  size_t cnt[2] = {1, 1}, dsp[2] = {0, 1};
  const size_t huge = SIZE_MAX / 2 + 1; /* count * nranks * size overflows size_t */
  int n = g_nranks;

  expectBad("AllReduce sendbuff NULL", ncclxAllReduce(NULL, rb, N, ncclxFloat32, ncclxSum, comm, NULL), comm, "null|buf");
  expectBad("AllReduce recvbuff NULL", ncclxAllReduce(sb, NULL, N, ncclxFloat32, ncclxSum, comm, NULL), comm, "null|buf");
  expectBad("AllReduce dtype 42", ncclxAllReduce(sb, rb, N, BADT, ncclxSum, comm, NULL), comm, "type");
  expectBad("AllReduce comm NULL", ncclxAllReduce(sb, rb, N, ncclxFloat32, ncclxSum, NULL, NULL), NULL, "comm|null");
  expectBad("AllReduce dtype -1", ncclxAllReduce(sb, rb, N, (ncclxDataType_t)-1, ncclxSum, comm, NULL), comm, "type");
  expectBad("AllReduce op 42", ncclxAllReduce(sb, rb, N, ncclxFloat32, BADOP, comm, NULL), comm, "op|reduction");
  expectBad("AllReduce dtype ncclxNumTypes", ncclxAllReduce(sb, rb, N, ncclxNumTypes, ncclxSum, comm, NULL), comm, "type");
  expectBad("AllReduce count overflow", ncclxAllReduce(sb, rb, huge, ncclxFloat32, ncclxSum, comm, NULL), comm, "count|overflow|large|size");
  expectBad("AllReduce op ncclxNumOps", ncclxAllReduce(sb, rb, N, ncclxFloat32, ncclxNumOps, comm, NULL), comm, "op|reduction");

  expectBad("Broadcast recvbuff NULL", ncclxBroadcast(sb, NULL, N, ncclxFloat32, 0, comm, NULL), comm, "null|buf");
  expectBad("Broadcast root -1", ncclxBroadcast(sb, rb, N, ncclxFloat32, -1, comm, NULL), comm, "root");
  expectBad("Broadcast dtype 42", ncclxBroadcast(sb, rb, N, BADT, 0, comm, NULL), comm, "type");
  expectBad("Broadcast root nranks", ncclxBroadcast(sb, rb, N, ncclxFloat32, n, comm, NULL), comm, "root");
  /* 2^61 floats: 2^63 bytes, one past SIZE_MAX / 2 without overflowing size_t. */
  expectBad("Broadcast count at the limit", ncclxBroadcast(sb, rb, SIZE_MAX / 8 + 1, ncclxFloat32, 0, comm, NULL),
            comm, "count|overflow|large|size");

  expectBad("Reduce sendbuff NULL", ncclxReduce(NULL, rb, N, ncclxFloat32, ncclxSum, 0, comm, NULL), comm, "null|buf");
  expectBad("Reduce root nranks", ncclxReduce(sb, rb, N, ncclxFloat32, ncclxSum, n, comm, NULL), comm, "root");
  expectBad("Reduce op 42", ncclxReduce(sb, rb, N, ncclxFloat32, BADOP, 0, comm, NULL), comm, "op|reduction");
  expectBad("Reduce root -5", ncclxReduce(sb, rb, N, ncclxFloat32, ncclxSum, -5, comm, NULL), comm, "root");
  expectBad("Reduce dtype 42", ncclxReduce(sb, rb, N, BADT, ncclxSum, 0, comm, NULL), comm, "type");

  expectBad("AllGather sendbuff NULL", ncclxAllGather(NULL, rb, N, ncclxFloat32, comm, NULL), comm, "null|buf");
  expectBad("AllGather dtype 42", ncclxAllGather(sb, rb, N, BADT, comm, NULL), comm, "type");
  expectBad("AllGather recvbuff NULL", ncclxAllGather(sb, NULL, N, ncclxFloat32, comm, NULL), comm, "null|buf");
  expectBad("AllGather count overflow", ncclxAllGather(sb, rb, huge, ncclxFloat32, comm, NULL), comm, "count|overflow|large|size");

  expectBad("ReduceScatter sendbuff NULL", ncclxReduceScatter(NULL, rb, N, ncclxFloat32, ncclxSum, comm, NULL), comm, "null|buf");
  expectBad("ReduceScatter op 42", ncclxReduceScatter(sb, rb, N, ncclxFloat32, BADOP, comm, NULL), comm, "op|reduction");
  expectBad("ReduceScatter recvbuff NULL", ncclxReduceScatter(sb, NULL, N, ncclxFloat32, ncclxSum, comm, NULL), comm, "null|buf");
  expectBad("ReduceScatter dtype 42", ncclxReduceScatter(sb, rb, N, BADT, ncclxSum, comm, NULL), comm, "type");
  expectBad("ReduceScatter count overflow", ncclxReduceScatter(sb, rb, huge, ncclxFloat32, ncclxSum, comm, NULL), comm, "count|overflow|large|size");

  expectBad("AllToAll sendbuff NULL", ncclxAllToAll(NULL, rb, 1, ncclxFloat32, comm, NULL), comm, "null|buf");
  expectBad("AllToAll dtype 42", ncclxAllToAll(sb, rb, 1, BADT, comm, NULL), comm, "type");
  expectBad("AllToAll recvbuff NULL", ncclxAllToAll(sb, NULL, 1, ncclxFloat32, comm, NULL), comm, "null|buf");
  expectBad("AllToAll count overflow", ncclxAllToAll(sb, rb, huge, ncclxFloat32, comm, NULL), comm, "count|overflow|large|size");

  expectBad("AllToAllv sendcounts NULL", ncclxAllToAllv(sb, NULL, dsp, rb, cnt, dsp, ncclxFloat32, comm, NULL), comm, "count|null");
  expectBad("AllToAllv dtype 42", ncclxAllToAllv(sb, cnt, dsp, rb, cnt, dsp, BADT, comm, NULL), comm, "type");
  expectBad("AllToAllv sdispls NULL", ncclxAllToAllv(sb, cnt, NULL, rb, cnt, dsp, ncclxFloat32, comm, NULL), comm, "displ|null");
  expectBad("AllToAllv recvcounts NULL", ncclxAllToAllv(sb, cnt, dsp, rb, NULL, dsp, ncclxFloat32, comm, NULL), comm, "count|null");
  expectBad("AllToAllv rdispls NULL", ncclxAllToAllv(sb, cnt, dsp, rb, cnt, NULL, ncclxFloat32, comm, NULL), comm, "displ|null");
  expectBad("AllToAllv sendbuff NULL, counts > 0", ncclxAllToAllv(NULL, cnt, dsp, rb, cnt, dsp, ncclxFloat32, comm, NULL), comm, "null|buf");
  expectBad("AllToAllv recvbuff NULL, counts > 0", ncclxAllToAllv(sb, cnt, dsp, NULL, cnt, dsp, ncclxFloat32, comm, NULL), comm, "null|buf");
  /* A count plus its displacement that wraps around size_t (to 0 here) is still too large. */
  size_t wrapDsp[2] = {0, SIZE_MAX - 1}, wrapCnt[2] = {1, 2};
  expectBad("AllToAllv count + displacement wraps", ncclxAllToAllv(sb, wrapCnt, wrapDsp, rb, cnt, dsp, ncclxFloat32, comm, NULL),
            comm, "count|overflow|large|size");

  expectBad("Send buff NULL", ncclxSend(NULL, N, ncclxFloat32, 0, comm, NULL), comm, "null|buf");
  expectBad("Send peer -1", ncclxSend(sb, N, ncclxFloat32, -1, comm, NULL), comm, "peer");
  expectBad("Send dtype 42", ncclxSend(sb, N, BADT, 0, comm, NULL), comm, "type");
  expectBad("Send peer nranks", ncclxSend(sb, N, ncclxFloat32, n, comm, NULL), comm, "peer");
  expectBad("Send comm NULL", ncclxSend(sb, N, ncclxFloat32, 0, NULL, NULL), NULL, "comm|null");
  expectBad("Recv buff NULL", ncclxRecv(NULL, N, ncclxFloat32, 0, comm, NULL), comm, "null|buf");
  expectBad("Recv peer nranks", ncclxRecv(rb, N, ncclxFloat32, n, comm, NULL), comm, "peer");
  expectBad("Recv dtype 42", ncclxRecv(rb, N, BADT, 0, comm, NULL), comm, "type");
  expectBad("Recv peer -2", ncclxRecv(rb, N, ncclxFloat32, -2, comm, NULL), comm, "peer");
  expectBad("Barrier comm NULL", ncclxBarrier(NULL, NULL), NULL, "comm|null");

  /* A bad call inside a group is refused at the call; the group still ends (whatever it
   * reports) and the communicator keeps working (checked by the caller). */
  if (ncclxGroupStart() != ncclxSuccess) fail("%sncclxGroupStart failed", "group", "");
  expectBad("Send peer nranks inside a group", ncclxSend(sb, N, ncclxFloat32, n, comm, NULL), comm, "peer");
  ncclxResult_t ge = ncclxGroupEnd();
  if (g_rank == 0) printf("  note: ncclxGroupEnd after a refused call returned %s\n", ncclxGetErrorString(ge));

  ncclxStream_t st;
  if (ncclxStreamCreate(&st) == ncclxSuccess) {
    expectBad("LaunchHostFunc fn NULL", ncclxLaunchHostFunc(st, NULL, NULL), NULL, "null|fn|func");
    expectBad("AllReduce on a stream, dtype 42", ncclxAllReduce(sb, rb, N, BADT, ncclxSum, comm, st), comm, "type");
    expectTrue("StreamSynchronize after refused enqueue", ncclxStreamSynchronize(st) == ncclxSuccess);
    expectTrue("StreamDestroy", ncclxStreamDestroy(st) == ncclxSuccess);
  } else {
    fail("%sncclxStreamCreate failed", "streams", "");
  }
}

/* The communicator must be unharmed by all of the above. */
static void stillWorks(ncclxComm_t comm) {
  ncclxResult_t async = ncclxInternalError;
  expectTrue("GetAsyncError succeeds", ncclxCommGetAsyncError(comm, &async) == ncclxSuccess);
  expectTrue("no async error after refused calls", async == ncclxSuccess);
  enum { N = 1000 };
  int32_t in[N], out[N];
  for (int i = 0; i < N; i++) in[i] = (g_rank + 1) * i;
  ncclxResult_t res = ncclxAllReduce(in, out, N, ncclxInt32, ncclxSum, comm, NULL);
  expectTrue("AllReduce after refused calls succeeds", res == ncclxSuccess);
  if (res != ncclxSuccess) {
    fprintf(stderr, "rank %d: %s\n", g_rank, ncclxGetLastError(comm));
    return;
  }
  int bad = 0;
  for (int i = 0; i < N; i++) bad += out[i] != g_nranks * (g_nranks + 1) / 2 * i;
  expectTrue("AllReduce after refused calls is correct", bad == 0);
}

/* ncclxGetLastError(comm) says what the last call got wrong, also when that call failed
 * before touching the communicator (a split's bad color after a collective's bad op). */
static void lastErrorIsNewest(ncclxComm_t comm) {
  float x = 0;
  ncclxComm_t nc = NULL;
  expectBad("ncclxAllReduce(op 42) first", ncclxAllReduce(&x, &x, 1, ncclxFloat32, BADOP, comm, NULL), comm, "op");
  expectBad("then ncclxCommSplit(color -7)", ncclxCommSplit(comm, -7, 0, &nc, NULL), comm, "color");
}

/* Overlaps that are not the in-place form, and an all-to-all-v whose self counts differ, are
 * argument errors: refused on every rank alike, the communicator usable after them. */
static void overlapAndSelfCounts(ncclxComm_t comm) {
  float* b = calloc(64, sizeof(float));
  expectBad("ncclxAllGather(recv + 1, recv)", ncclxAllGather(b + 1, b, 4, ncclxFloat32, comm, NULL), comm,
            "in-place");
  expectBad("ncclxReduceScatter(send, send + 1)",
            ncclxReduceScatter(b, b + 1, 4, ncclxFloat32, ncclxSum, comm, NULL), comm, "in-place");
  expectBad("ncclxAllReduce(buf, buf + 1)", ncclxAllReduce(b, b + 1, 4, ncclxFloat32, ncclxSum, comm, NULL), comm,
            "in-place");
  size_t sc[2] = {1, 1}, rc[2] = {1, 1}, d[2] = {0, 8};
  rc[g_rank] = 2;
  expectBad("ncclxAllToAllv(self counts 1 and 2)", ncclxAllToAllv(b, sc, d, b + 16, rc, d, ncclxFloat32, comm, NULL),
            comm, "itself");
  free(b);
}

/* ncclxMemFree takes only what ncclxMemAlloc returned, once. */
static void memFreeForeign(void) {
  char* own = malloc(64);
  memset(own, 7, 64);
  expectBad("ncclxMemFree(a malloc'ed buffer)", ncclxMemFree(own), NULL, "ncclxMemAlloc");
  own[63] = 8; /* still ours: not freed behind our back (ASan would say) */
  free(own);
  void* p = NULL;
  MP_CALL(g_rank, NULL, ncclxMemAlloc(&p, 100));
  MP_CALL(g_rank, NULL, ncclxMemFree(p));
  expectBad("ncclxMemFree twice", ncclxMemFree(p), NULL, "ncclxMemAlloc|freed");
  expectTrue("ncclxMemFree(NULL) is a no-op", ncclxMemFree(NULL) == ncclxSuccess);
}

/* After ncclxCommFinalize only destroy or abort: calls and a second finalize are refused. */
static void afterFinalize(ncclxComm_t comm) {
  ncclxComm_t sub = NULL;
  MP_CALL(g_rank, comm, ncclxCommSplit(comm, 0, g_rank, &sub, NULL));
  float x = 1, y = 0;
  MP_CALL(g_rank, sub, ncclxAllReduce(&x, &y, 1, ncclxFloat32, ncclxSum, sub, NULL));
  MP_CALL(g_rank, sub, ncclxCommFinalize(sub));
  expectBad("ncclxAllReduce after finalize", ncclxAllReduce(&x, &y, 1, ncclxFloat32, ncclxSum, sub, NULL), sub,
            "finalized");
  expectBad("ncclxCommFinalize twice", ncclxCommFinalize(sub), sub, "finalized");
  MP_CALL(g_rank, NULL, ncclxCommDestroy(sub));
}

/* Rank 0 sends 100 floats, rank 1 posts a receive of 50. */
static void sizeMismatch(ncclxComm_t comm) {
  float buf[100];
  for (int i = 0; i < 100; i++) buf[i] = (float)i;
  double t0 = mpNow();
  ncclxResult_t res = ncclxSuccess;
  if (g_rank == 0) {
    res = ncclxSend(buf, 100, ncclxFloat32, 1, comm, NULL);
    /* Stay alive a moment so the receiver sees the oversized message, not our exit. */
    usleep(2000000);
  }
  if (g_rank == 1) res = ncclxRecv(buf, 50, ncclxFloat32, 0, comm, NULL);
  double dt = mpNow() - t0;
  const char* msg = ncclxGetLastError(comm);
  printf("rank %d: size mismatch: %s after %.2f s: \"%s\"\n", g_rank, ncclxGetErrorString(res), dt, msg);
  double limit = 15.0; /* NCCLX_CORE_TIMEOUT_S=10 from the test registration, plus slack */
  if (dt > limit) fail("%s", "size mismatch: call did not return within the timeout", "");
  if (g_rank == 1) {
    g_checks++;
    if (res != ncclxRemoteError && res != ncclxInvalidUsage) {
      char d[128];
      snprintf(d, sizeof d, "%s", ncclxGetErrorString(res));
      fail("receiver got \"%s\", expected ncclxRemoteError or ncclxInvalidUsage", "size mismatch", d);
    } else if (!*msg) {
      fail("%sempty error message", "size mismatch", "");
    }
  }
  /* The communicator may be failed now: abort it rather than finalize. */
  ncclxResult_t ar = ncclxCommAbort(comm);
  if (ar != ncclxSuccess) fail("ncclxCommAbort returned %s", "size mismatch", ncclxGetErrorString(ar));
}

int main(void) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  ncclxComm_t comm = NULL;
  g_rank = mpEnvInt("OMPI_COMM_WORLD_RANK");
  libraryLevel();
  initArgs();
  MP_CALL(g_rank, NULL, ncclxCommInitFromEnv(&comm));
  MP_CALL(g_rank, comm, ncclxCommUserRank(comm, &g_rank));
  MP_CALL(g_rank, comm, ncclxCommCount(comm, &g_nranks));
  if (g_nranks != 2) {
    fprintf(stderr, "bad_args needs exactly 2 ranks (got %d)\n", g_nranks);
    return 2;
  }
  commArgs(comm);
  collArgs(comm);
  stillWorks(comm);
  lastErrorIsNewest(comm);
  overlapAndSelfCounts(comm);
  stillWorks(comm);
  memFreeForeign();
  afterFinalize(comm);
  stillWorks(comm);
  sizeMismatch(comm);
  printf("rank %d: bad_args: %ld checks, %ld failures: %s\n", g_rank, g_checks, g_failures,
         g_failures ? "FAIL" : "PASS");
  return g_failures ? 1 : 0;
}
