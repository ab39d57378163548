/* Fault behaviour of a 4-rank communicator whose ranks are forked children of this process
 * (not mpirun, which would tear the job down when a rank dies).
 *
 *   fault_kill kill          rank 2 SIGKILLs itself after allreduce 5; the survivors' next
 *                            allreduce fails (RemoteError; SystemError/InternalError are
 *                            accepted and reported) within [core] timeout_s = 20, and their
 *                            ncclxGetLastError(comm) names "rank 2".
 *   fault_kill abort         rank 1 blocks in an allreduce nobody else joins; a second thread
 *                            calls ncclxCommAbort; the allreduce fails within 2.5 s of it.
 *   fault_kill abort-waiter  rank 1 blocks in an allreduce on a stream (its worker holds the
 *                            communicator's execLock), then calls one on its own thread, which
 *                            waits for that lock; a third thread calls ncclxCommAbort: both
 *                            calls fail, the direct one within 2.5 s. This runs the path where
 *                            a direct call waits for the lock (commExecLock) next to an abort;
 *                            it does not reliably catch a missing reference, since the waiting
 *                            call usually gets the lock before Abort frees anything.
 *   fault_kill timeout       timeout_s = 3, rank 3 stops calling collectives after a first
 *                            allreduce: the others fail in 1.5-12 s with "timeout"/"timed
 *                            out"/"no progress" in the message.
 *   fault_kill timeout-cold  same, but rank 3 never joins any collective (no connection to it
 *                            exists yet).
 *
 *   fault_kill mismatch      rank 1 calls a broadcast where the others call an allreduce of the
 *                            same count: every rank fails within 10 s (timeout_s = 20) and
 *                            every message says the collectives differ.
 *   fault_kill bcast-count   (run with NCCLX_PROTO=ll: a broadcast of many board rounds) after
 *                            a good broadcast, rank 1 asks for 4096 floats more than the others:
 *                            rank 1 fails within 10 s saying the calls differ (at the first
 *                            round, not by timeout); the others either complete with the right
 *                            data (the root and ranks that read every round before rank 1's
 *                            abort notice) or fail within 10 s. Through the simple protocol's
 *                            ring the root cannot see a receiver's larger count: that receiver
 *                            ends with the timeout, as in the timeout scenarios.
 *                            MP_FAULT_BCAST_RANK1 sets rank 1's count instead: with
 *                            MP_FAULT_COUNT=4 (16 bytes: one 16-byte cell of the LL board's
 *                            ring) and 16, 20 or the other way round, rank 1 and the root use
 *                            different cells or one the ring and the other a bank (with 8192
 *                            and 100: the bulk area and a bank of lines), and rank 1 must
 *                            still fail saying the calls differ.
 *                            MP_FAULT_BCAST_AT=509 first moves the ring position to cell 509 with
 *                            one-cell broadcasts, so that the 4-cell call starts over at cell 0.
 *   fault_kill bcast-skip    (NCCLX_PROTO=ll) rank 1 skips an 80-byte broadcast (a bank of the
 *                            board) that the others make, then all make a 16-byte one (the ring):
 *                            rank 1 must fail saying the calls differ, not take the root's next
 *                            call for its own.
 *   fault_kill gather-count  (run with NCCLX_PROTO=ll: an all-gather through the board's bulk
 *                            regions) after a good all-gather, rank 1 gathers
 *                            MP_FAULT_GATHER_EXTRA (default 1024) floats per rank more than the
 *                            others: every rank fails within 10 s, rank 1 saying the calls
 *                            differ (each sees another's signature at the first round). With
 *                            MP_FAULT_COUNT=4000 and an extra 1048 the others' 4000-byte blocks
 *                            go through the board's lines and rank 1's 8 KiB through the bulk
 *                            regions: the two paths must still fail, not wait for each other.
 *   fault_kill bcast-root    (NCCLX_PROTO=ll: a broadcast through the board's bulk area) rank 1
 *                            takes itself for the root where the others name rank 0: both
 *                            would write the same bulk bank. Exactly one of ranks 0 and 1 must
 *                            fail, saying the calls differ; ranks 2 and 3 either fail or end
 *                            with rank 0's data, never a mix; every rank returns within 10 s.
 *
 * Each child checks its own conditions and exits 0 or 1; the parent checks exit statuses
 * and a wall-clock bound. */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "mp_fork.h"
#include "mp_util.h"

#define NRANKS 4
/* Ranks of this run: NRANKS, or MP_FAULT_NRANKS (2..NRANKS) for the scenarios where calls
 * differ (bcast-count, bcast-skip, gather-count), which need only ranks 0 and 1. */
static int g_nranks = NRANKS;
/* 1 MiB of float32 (the simple protocol's pipelines), or MP_FAULT_COUNT elements (16: the
 * LL protocol's shared board, where a dead rank is seen through its pidfd). */
static size_t g_count = 1u << 18;
static size_t g_gatherExtra = 1024; /* gather-count: rank 1's extra floats per rank */
static size_t g_bcastRank1;         /* bcast-count: rank 1's count (default g_count + 4096) */
static size_t g_bcastAt;            /* bcast-count: LL ring cell to reach first (0: none) */

static mpJob g_job;
static double g_timeout; /* seconds, the [core] timeout_s this scenario runs with */

static int failf(int rank, const char* fmt, const char* a) {
  fprintf(stderr, "rank %d: FAIL: ", rank);
  fprintf(stderr, fmt, a);
  fprintf(stderr, "\n");
  return 1;
}

static ncclxComm_t initRank(int rank, ncclxUniqueId id) {
  ncclxComm_t comm = NULL;
  MP_CALL(rank, NULL, ncclxCommInitRank(&comm, g_nranks, id, rank));
  return comm;
}

static void fillInput(float* s, int rank, int it) {
  for (size_t i = 0; i < g_count; i++) s[i] = (float)(rank + it + (int)(i % 3));
}

/* Sum over 4 ranks of rank + it + i%3. */
static size_t countWrong(const float* r, int it) {
  size_t bad = 0;
  for (size_t i = 0; i < g_count; i++) bad += r[i] != (float)(6 + 4 * it + 4 * (int)(i % 3));
  return bad;
}

/* The checks every rank that saw a failure makes; returns the number of problems. */
static int checkFailure(int rank, ncclxComm_t comm, ncclxResult_t res, double elapsed,
                        double maxElapsed, const char* mustMention) {
  int bad = 0;
  const char* msg = ncclxGetLastError(comm);
  printf("rank %d: allreduce failed after %.2f s with %s: \"%s\"\n", rank, elapsed,
         ncclxGetErrorString(res), msg);
  if (res == ncclxSystemError || res == ncclxInternalError)
    printf("rank %d: note: accepted %s (ncclxRemoteError preferred)\n", rank, ncclxGetErrorString(res));
  else if (res != ncclxRemoteError)
    bad += failf(rank, "unexpected result %s", ncclxGetErrorString(res));
  if (elapsed > maxElapsed) {
    char d[64];
    snprintf(d, sizeof d, "%.2f s", elapsed);
    bad += failf(rank, "failure took %s, longer than the bound", d);
  }
  if (mustMention && !mpContainsCI(msg, mustMention)) bad += failf(rank, "message does not mention \"%s\"", mustMention);
  ncclxResult_t async = ncclxSuccess;
  if (ncclxCommGetAsyncError(comm, &async) != ncclxSuccess || async == ncclxSuccess)
    bad += failf(rank, "ncclxCommGetAsyncError does not report the failure (%s)", ncclxGetErrorString(async));
  double t0 = mpNow();
  ncclxResult_t ar = ncclxCommAbort(comm);
  if (ar != ncclxSuccess) bad += failf(rank, "ncclxCommAbort returned %s", ncclxGetErrorString(ar));
  if (mpNow() - t0 > 5.0) bad += failf(rank, "ncclxCommAbort took more than %s", "5 s");
  return bad;
}

/* Every rank must have exited 0; kill stragglers. Returns 0 when all did. */
static int finishScenario(const char* name, double t0) {
  int bad = 0;
  char d[96];
  for (int r = 0; r < g_nranks; r++) {
    int ok = mpExitedZero(&g_job, r);
    printf("parent: rank %d %s (%s)\n", r, mpDescribeStatus(&g_job, r, d, sizeof d), ok ? "ok" : "WRONG");
    bad += !ok;
  }
  mpJobKillRest(&g_job);
  printf("parent: %s scenario took %.1f s\n", name, mpNow() - t0);
  return bad ? 1 : 0;
}

/* ---------------------------------------------------------------- kill */

static int killRank(int rank, int nranks, ncclxUniqueId id, void* arg) {
  (void)nranks, (void)arg;
  ncclxComm_t comm = initRank(rank, id);
  float* s = malloc(g_count * sizeof(float));
  float* r = malloc(g_count * sizeof(float));
  for (int it = 0; it < 40; it++) {
    fillInput(s, rank, it);
    double t0 = mpNow();
    ncclxResult_t res = ncclxAllReduce(s, r, g_count, ncclxFloat32, ncclxSum, comm, NULL);
    double dt = mpNow() - t0;
    if (res == ncclxSuccess) {
      size_t wrong = countWrong(r, it);
      if (wrong) {
        char d[32];
        snprintf(d, sizeof d, "%zu", wrong);
        return failf(rank, "%s wrong elements in a successful allreduce", d);
      }
      if (rank == 2 && it == 5) {
        printf("rank 2: killing myself after allreduce %d\n", it);
        fflush(stdout);
        raise(SIGKILL);
      }
      if (it >= 6) return failf(rank, "allreduce %s succeeded without rank 2", it == 6 ? "6" : ">6");
      continue;
    }
    printf("rank %d: allreduce %d failed\n", rank, it);
    if (rank == 2) return failf(rank, "rank 2 failed %s before it was killed", "");
    if (it < 5) return failf(rank, "allreduce failed %s while every rank was alive", "");
    int bad = checkFailure(rank, comm, res, dt, g_timeout + 10.0, "rank 2");
    free(s);
    free(r);
    return bad ? 1 : 0;
  }
  return failf(rank, "the allreduce never failed %s", "");
}

static int runKill(void) {
  double t0 = mpNow();
  ncclxUniqueId id;
  MP_CALL(-1, NULL, ncclxGetUniqueId(&id));
  for (int r = 0; r < NRANKS; r++) mpJobSpawn(&g_job, r, killRank, id, NULL);
  int all[NRANKS] = {0, 1, 2, 3};
  double bound = g_timeout + 40.0; /* init + 6 allreduces + detection + abort */
  mpJobWait(&g_job, all, NRANKS, t0 + bound);
  int bad = 0;
  char d[96];
  for (int r = 0; r < NRANKS; r++) {
    int ok = r == 2 ? mpKilledBy(&g_job, r, SIGKILL) : mpExitedZero(&g_job, r);
    printf("parent: rank %d %s (%s)\n", r, mpDescribeStatus(&g_job, r, d, sizeof d), ok ? "ok" : "WRONG");
    bad += !ok;
  }
  if (mpJobKillRest(&g_job)) printf("parent: FAIL: ranks still running after %.0f s were killed\n", bound);
  printf("parent: kill scenario took %.1f s\n", mpNow() - t0);
  return bad ? 1 : 0;
}

/* ---------------------------------------------------------------- abort */

typedef struct {
  ncclxComm_t comm;
  double start, end;
  ncclxResult_t res;
} AbortCall;

static void* abortLater(void* p) {
  AbortCall* a = p;
  usleep(1000000);
  a->start = mpNow();
  a->res = ncclxCommAbort(a->comm);
  a->end = mpNow();
  return NULL;
}

/* arg: non-NULL for abort-waiter (the first allreduce runs on a stream, the one timed here
 * waits for the execLock that stream's worker holds). */
static int abortRank(int rank, int nranks, ncclxUniqueId id, void* arg) {
  (void)nranks;
  int waiter = arg != NULL;
  ncclxComm_t comm = initRank(rank, id);
  if (rank != 1) {
    /* Stay in the communicator without calling anything until rank 1 is done. */
    if (mpWaitRelease(&g_job, 60.0) != 0) return failf(rank, "never released %s", "");
    ncclxCommAbort(comm);
    return 0;
  }
  float* s = calloc(g_count, sizeof(float));
  float* r = calloc(g_count, sizeof(float));
  float* r2 = calloc(g_count, sizeof(float));
  ncclxStream_t stream = NULL;
  if (waiter) {
    MP_CALL(rank, NULL, ncclxStreamCreate(&stream));
    MP_CALL(rank, comm, ncclxAllReduce(s, r2, g_count, ncclxFloat32, ncclxSum, comm, stream));
    usleep(300000); /* the stream's worker is inside the allreduce, holding execLock */
  }
  AbortCall a = {comm, 0, 0, ncclxSuccess};
  pthread_t th;
  pthread_create(&th, NULL, abortLater, &a);
  double t0 = mpNow();
  ncclxResult_t res = ncclxAllReduce(s, r, g_count, ncclxFloat32, ncclxSum, comm, NULL);
  double t1 = mpNow();
  pthread_join(th, NULL);
  ncclxResult_t sres = waiter ? ncclxStreamSynchronize(stream) : ncclxInternalError;
  if (waiter) ncclxStreamDestroy(stream);
  /* comm is gone after the abort: only the thread's message is safe to read. */
  printf("rank 1: allreduce returned %s after %.2f s (abort called at %.2f s, returned %s after %.2f s)%s%s: \"%s\"\n",
         ncclxGetErrorString(res), t1 - t0, a.start - t0, ncclxGetErrorString(a.res), a.end - a.start,
         waiter ? ", stream " : "", waiter ? ncclxGetErrorString(sres) : "", ncclxGetLastError(NULL));
  int bad = 0;
  if (res == ncclxSuccess) bad += failf(rank, "allreduce %s succeeded although no other rank joined", "");
  if (t1 < a.start) bad += failf(rank, "allreduce returned %s before ncclxCommAbort was called", "");
  if (t1 - a.start > 2.5) bad += failf(rank, "allreduce returned more than %s after ncclxCommAbort", "2.5 s");
  if (a.res != ncclxSuccess) bad += failf(rank, "ncclxCommAbort returned %s", ncclxGetErrorString(a.res));
  if (a.end - a.start > 2.5) bad += failf(rank, "ncclxCommAbort took more than %s", "2.5 s");
  if (waiter && sres == ncclxSuccess)
    bad += failf(rank, "the stream's allreduce %s succeeded although no other rank joined", "");
  free(s), free(r), free(r2);
  return bad ? 1 : 0;
}

static int runAbort(int waiter) {
  double t0 = mpNow();
  ncclxUniqueId id;
  MP_CALL(-1, NULL, ncclxGetUniqueId(&id));
  static int waiterFlag = 1;
  for (int r = 0; r < NRANKS; r++) mpJobSpawn(&g_job, r, abortRank, id, waiter ? &waiterFlag : NULL);
  int one[1] = {1}, all[NRANKS] = {0, 1, 2, 3};
  mpJobWait(&g_job, one, 1, t0 + 40.0);
  mpJobRelease(&g_job);
  mpJobWait(&g_job, all, NRANKS, mpNow() + 20.0);
  return finishScenario(waiter ? "abort-waiter" : "abort", t0);
}

/* ---------------------------------------------------------------- timeout */

static int timeoutRank(int rank, int nranks, ncclxUniqueId id, void* arg) {
  (void)nranks;
  int warm = *(int*)arg;
  ncclxComm_t comm = initRank(rank, id);
  float* s = malloc(g_count * sizeof(float));
  float* r = malloc(g_count * sizeof(float));
  if (warm) {
    fillInput(s, rank, 0);
    MP_CALL(rank, comm, ncclxAllReduce(s, r, g_count, ncclxFloat32, ncclxSum, comm, NULL));
    if (countWrong(r, 0)) return failf(rank, "warm-up allreduce %s gave wrong data", "");
  }
  if (rank == 3) {
    free(s);
    free(r);
    if (mpWaitRelease(&g_job, 60.0) != 0) return failf(rank, "never released %s", "");
    ncclxCommAbort(comm);
    return 0;
  }
  fillInput(s, rank, 1);
  double t0 = mpNow();
  ncclxResult_t res = ncclxAllReduce(s, r, g_count, ncclxFloat32, ncclxSum, comm, NULL);
  double dt = mpNow() - t0;
  if (res == ncclxSuccess) return failf(rank, "allreduce %s succeeded without rank 3", "");
  const char* msg = ncclxGetLastError(comm);
  int bad = 0;
  if (!mpContainsCI(msg, "timeout") && !mpContainsCI(msg, "timed out") && !mpContainsCI(msg, "no progress"))
    bad += failf(rank, "message does not say %s", "\"timeout\", \"timed out\" or \"no progress\"");
  if (dt < 1.5) bad += failf(rank, "failed before the %s timeout could expire", "3 s");
  bad += checkFailure(rank, comm, res, dt, 12.0, NULL);
  free(s);
  free(r);
  return bad ? 1 : 0;
}

static int runTimeout(int warm) {
  double t0 = mpNow();
  ncclxUniqueId id;
  MP_CALL(-1, NULL, ncclxGetUniqueId(&id));
  for (int r = 0; r < NRANKS; r++) mpJobSpawn(&g_job, r, timeoutRank, id, &warm);
  int active[3] = {0, 1, 2}, all[NRANKS] = {0, 1, 2, 3};
  mpJobWait(&g_job, active, 3, t0 + 45.0);
  mpJobRelease(&g_job);
  mpJobWait(&g_job, all, NRANKS, mpNow() + 20.0);
  return finishScenario("timeout", t0);
}

/* ---------------------------------------------------------------- mismatch */

static int mismatchRank(int rank, int nranks, ncclxUniqueId id, void* arg) {
  (void)nranks, (void)arg;
  ncclxComm_t comm = initRank(rank, id);
  float* s = malloc(g_count * sizeof(float));
  float* r = malloc(g_count * sizeof(float));
  fillInput(s, rank, 0);
  MP_CALL(rank, comm, ncclxAllReduce(s, r, g_count, ncclxFloat32, ncclxSum, comm, NULL));
  if (countWrong(r, 0)) return failf(rank, "allreduce %s gave wrong data", "0");
  double t0 = mpNow();
  ncclxResult_t res = rank == 1 ? ncclxBroadcast(s, r, g_count, ncclxFloat32, 0, comm, NULL)
                                : ncclxAllReduce(s, r, g_count, ncclxFloat32, ncclxSum, comm, NULL);
  double dt = mpNow() - t0;
  const char* msg = ncclxGetLastError(comm);
  printf("rank %d: %s returned %s after %.2f s: \"%s\"\n", rank,
         rank == 1 ? "broadcast" : "allreduce", ncclxGetErrorString(res), dt, msg);
  int bad = 0;
  if (res == ncclxSuccess) bad += failf(rank, "the mismatched call %s", "succeeded");
  if (dt > 10.0) bad += failf(rank, "failing took more than %s", "10 s");
  if (!mpContainsCI(msg, "differ")) bad += failf(rank, "message does not say the calls %s", "differ");
  ncclxCommAbort(comm);
  free(s);
  free(r);
  return bad ? 1 : 0;
}

/* A small broadcast's root is done at once: its abort notice must not reach rank 1 before
 * rank 1 has seen the mismatch, so the other ranks wait until the parent has seen rank 1 exit
 * (runMismatch). Returns 1 if that never happened. */
static int releaseAfterRank1(int rank) {
  if (rank == 1 || mpWaitRelease(&g_job, 30.0) == 0) return 0;
  return failf(rank, "the parent did not release the ranks %s", "within 30 s");
}

/* The broadcast scenarios' verdict: rank 1's call fails within 10 s saying the calls differ;
 * the others' calls succeed with the root's data (i % 241) or fail within 10 s. Then the
 * others wait until rank 1 has exited. Returns the number of failed checks. */
static int judgeRank1Fails(int rank, ncclxResult_t res, double dt, const char* msg,
                           const float* b, size_t count) {
  int bad = 0;
  if (dt > 10.0) bad += failf(rank, "returning took more than %s", "10 s");
  if (rank == 1) {
    if (res == ncclxSuccess) bad += failf(rank, "the mismatched call %s", "succeeded");
    if (!mpContainsCI(msg, "differ")) bad += failf(rank, "message does not say the calls %s", "differ");
  } else if (res == ncclxSuccess) {
    for (size_t i = 0; i < count && !bad; i++)
      if (b[i] != (float)(i % 241)) bad += failf(rank, "a broadcast that succeeded %s", "gave wrong data");
  }
  return bad + releaseAfterRank1(rank);
}

static int bcastCountRank(int rank, int nranks, ncclxUniqueId id, void* arg) {
  (void)nranks, (void)arg;
  ncclxComm_t comm = initRank(rank, id);
  size_t n = g_bcastRank1 > g_count ? g_bcastRank1 : g_count;
  size_t mine = rank == 1 ? g_bcastRank1 : g_count;
  float* b = malloc(n * sizeof(float));
  for (size_t i = 0; i < n; i++) b[i] = rank == 0 ? (float)(i % 251) : -1.0f;
  MP_CALL(rank, comm, ncclxBroadcast(b, b, g_count, ncclxFloat32, 0, comm, NULL));
  for (size_t i = 0; i < g_count; i++)
    if (b[i] != (float)(i % 251)) return failf(rank, "the good broadcast %s", "gave wrong data");
  /* One-cell broadcasts up to ring cell g_bcastAt (the good one took ceil(bytes / 16) cells;
   * core/src/coll_ll.c, llCell). */
  size_t goodCells = (g_count * sizeof(float) + 15) / 16;
  for (size_t k = goodCells; k < g_bcastAt; k++)
    MP_CALL(rank, comm, ncclxBroadcast(b, b, 1, ncclxFloat32, 0, comm, NULL));
  /* Every rank is done with the good broadcasts before anyone can fail and abort. */
  MP_CALL(rank, comm, ncclxBarrier(comm, NULL));
  for (size_t i = 0; i < n; i++) b[i] = rank == 0 ? (float)(i % 241) : -1.0f;
  double t0 = mpNow();
  ncclxResult_t res = ncclxBroadcast(b, b, mine, ncclxFloat32, 0, comm, NULL);
  double dt = mpNow() - t0;
  const char* msg = ncclxGetLastError(comm);
  printf("rank %d: broadcast of %zu returned %s after %.2f s: \"%s\"\n", rank, mine,
         ncclxGetErrorString(res), dt, msg);
  int bad = judgeRank1Fails(rank, res, dt, msg, b, g_count);
  ncclxCommAbort(comm);
  free(b);
  return bad ? 1 : 0;
}

/* Rank 1 skips an 80-byte broadcast the others make (a bank of the LL board), then all make a
 * 16-byte one (the board's ring, where rank 1's position is the root's first cell of it). */
static int bcastSkipRank(int rank, int nranks, ncclxUniqueId id, void* arg) {
  (void)nranks, (void)arg;
  ncclxComm_t comm = initRank(rank, id);
  float b[20];
  for (int i = 0; i < 20; i++) b[i] = rank == 0 ? (float)(i % 241) : -1.0f;
  MP_CALL(rank, comm, ncclxBarrier(comm, NULL));
  ncclxResult_t res = ncclxSuccess;
  double t0 = mpNow();
  if (rank != 1) res = ncclxBroadcast(b, b, 20, ncclxFloat32, 0, comm, NULL);
  if (res == ncclxSuccess) res = ncclxBroadcast(b, b, 4, ncclxFloat32, 0, comm, NULL);
  double dt = mpNow() - t0;
  const char* msg = ncclxGetLastError(comm);
  printf("rank %d: %s returned %s after %.2f s: \"%s\"\n", rank,
         rank == 1 ? "the small broadcast alone" : "both broadcasts", ncclxGetErrorString(res), dt, msg);
  int bad = judgeRank1Fails(rank, res, dt, msg, b, 20);
  ncclxCommAbort(comm);
  return bad ? 1 : 0;
}

static int gatherCountRank(int rank, int nranks, ncclxUniqueId id, void* arg) {
  (void)arg;
  ncclxComm_t comm = initRank(rank, id);
  size_t per = g_count / (size_t)nranks, n = per + g_gatherExtra;
  float* s = malloc(n * sizeof(float));
  float* r = malloc(n * (size_t)nranks * sizeof(float));
  for (size_t i = 0; i < n; i++) s[i] = (float)((size_t)rank * 7 + i % 251);
  MP_CALL(rank, comm, ncclxAllGather(s, r, per, ncclxFloat32, comm, NULL));
  for (int q = 0; q < nranks; q++)
    for (size_t i = 0; i < per; i++)
      if (r[(size_t)q * per + i] != (float)((size_t)q * 7 + i % 251))
        return failf(rank, "the good all-gather %s", "gave wrong data");
  double t0 = mpNow();
  ncclxResult_t res = ncclxAllGather(s, r, rank == 1 ? n : per, ncclxFloat32, comm, NULL);
  double dt = mpNow() - t0;
  const char* msg = ncclxGetLastError(comm);
  printf("rank %d: all-gather of %zu returned %s after %.2f s: \"%s\"\n", rank,
         rank == 1 ? n : per, ncclxGetErrorString(res), dt, msg);
  int bad = 0;
  if (res == ncclxSuccess) bad += failf(rank, "the mismatched call %s", "succeeded");
  if (dt > 10.0) bad += failf(rank, "failing took more than %s", "10 s");
  if (rank == 1 && !mpContainsCI(msg, "differ"))
    bad += failf(rank, "message does not say the calls %s", "differ");
  ncclxCommAbort(comm);
  free(s);
  free(r);
  return bad ? 1 : 0;
}

/* bcast-root: how many ranks have returned from the broadcast (shared by the forked ranks).
 * None aborts before all have: an early abort notice could reach a root before it claims
 * the bank, and it would then fail for that reason instead of seeing the other root. */
static _Atomic int* g_returned;

static int bcastRootRank(int rank, int nranks, ncclxUniqueId id, void* arg) {
  (void)arg;
  ncclxComm_t comm = initRank(rank, id);
  float* b = malloc(g_count * sizeof(float));
  for (size_t i = 0; i < g_count; i++) b[i] = rank <= 1 ? (float)(rank * 1000 + (int)(i % 241)) : -1.0f;
  MP_CALL(rank, comm, ncclxBarrier(comm, NULL));
  int root = rank == 1 ? 1 : 0;
  double t0 = mpNow();
  ncclxResult_t res = ncclxBroadcast(b, b, g_count, ncclxFloat32, root, comm, NULL);
  double dt = mpNow() - t0;
  const char* msg = ncclxGetLastError(comm);
  printf("rank %d: broadcast with root %d returned %s after %.2f s: \"%s\"\n", rank, root,
         ncclxGetErrorString(res), dt, msg);
  int bad = 0;
  if (dt > 10.0) bad += failf(rank, "returning took more than %s", "10 s");
  if (res != ncclxSuccess && rank <= 1 && !mpContainsCI(msg, "differ"))
    bad += failf(rank, "a root's message does not say the calls %s", "differ");
  if (res == ncclxSuccess) /* a root keeps its own data; a reader has rank 0's */
    for (size_t i = 0; i < g_count && !bad; i++)
      if (b[i] != (float)((rank == 1 ? 1000 : 0) + (int)(i % 241)))
        bad += failf(rank, "a broadcast that succeeded %s", "holds wrong data");
  /* The verdict on both roots together goes through the exit status: 0 ok, 1 bad, 3 ok and
   * this root failed. */
  atomic_fetch_add(g_returned, 1);
  for (double w = mpNow(); atomic_load(g_returned) < nranks && mpNow() - w < 30.0;) usleep(1000);
  ncclxCommAbort(comm);
  free(b);
  if (bad) return 1;
  return rank <= 1 && res != ncclxSuccess ? 3 : 0;
}

static int runBcastRoot(void) {
  double t0 = mpNow();
  g_returned = mmap(NULL, sizeof(*g_returned), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (g_returned == MAP_FAILED) return failf(-1, "mmap: %s", strerror(errno));
  atomic_store(g_returned, 0);
  ncclxUniqueId id;
  MP_CALL(-1, NULL, ncclxGetUniqueId(&id));
  for (int r = 0; r < NRANKS; r++) mpJobSpawn(&g_job, r, bcastRootRank, id, NULL);
  int all[NRANKS] = {0, 1, 2, 3};
  mpJobWait(&g_job, all, NRANKS, t0 + 60.0);
  int bad = 0, rootsFailed = 0;
  char d[96];
  for (int r = 0; r < NRANKS; r++) {
    int st = g_job.done[r] && g_job.status[r] != -1 && WIFEXITED(g_job.status[r])
                 ? WEXITSTATUS(g_job.status[r])
                 : -1;
    int ok = st == 0 || (r <= 1 && st == 3);
    rootsFailed += st == 3;
    printf("parent: rank %d %s (%s)\n", r, mpDescribeStatus(&g_job, r, d, sizeof d), ok ? "ok" : "WRONG");
    bad += !ok;
  }
  if (rootsFailed != 1) {
    char n[16];
    snprintf(n, sizeof n, "%d", rootsFailed);
    bad += failf(-1, "%s of the two roots failed; exactly one must", n);
  }
  mpJobKillRest(&g_job);
  munmap(g_returned, sizeof(*g_returned));
  printf("parent: bcast-root scenario took %.1f s\n", mpNow() - t0);
  return bad ? 1 : 0;
}

static int runMismatch(int (*rankFn)(int, int, ncclxUniqueId, void*), const char* name) {
  double t0 = mpNow();
  ncclxUniqueId id;
  MP_CALL(-1, NULL, ncclxGetUniqueId(&id));
  for (int r = 0; r < g_nranks; r++) mpJobSpawn(&g_job, r, rankFn, id, NULL);
  int all[NRANKS] = {0, 1, 2, 3}, rank1[1] = {1};
  mpJobWait(&g_job, rank1, 1, t0 + 60.0); /* bcast-count's other ranks wait for rank 1 */
  mpJobRelease(&g_job);
  mpJobWait(&g_job, all, g_nranks, t0 + 60.0);
  return finishScenario(name, t0);
}

int main(int argc, char** argv) {
  const char* sc = argc > 1 ? argv[1] : "";
  int isTimeout = !strcmp(sc, "timeout") || !strcmp(sc, "timeout-cold");
  if (!isTimeout && strcmp(sc, "kill") && strcmp(sc, "abort") && strcmp(sc, "abort-waiter") &&
      strcmp(sc, "mismatch") && strcmp(sc, "bcast-count") && strcmp(sc, "bcast-skip") &&
      strcmp(sc, "gather-count") && strcmp(sc, "bcast-root")) {
    fprintf(stderr,
            "usage: %s kill|abort|abort-waiter|timeout|timeout-cold|mismatch|bcast-count|bcast-skip|"
            "gather-count|bcast-root\n",
            argv[0]);
    return 2;
  }
  setvbuf(stdout, NULL, _IOLBF, 0);
  /* Before any ncclx call: the configuration is read once per process and children
   * inherit it. */
  if (getenv("MP_FAULT_COUNT")) g_count = (size_t)strtoul(getenv("MP_FAULT_COUNT"), NULL, 10);
  if (getenv("MP_FAULT_GATHER_EXTRA"))
    g_gatherExtra = (size_t)strtoul(getenv("MP_FAULT_GATHER_EXTRA"), NULL, 10);
  g_bcastRank1 = getenv("MP_FAULT_BCAST_RANK1")
                     ? (size_t)strtoul(getenv("MP_FAULT_BCAST_RANK1"), NULL, 10)
                     : g_count + 4096;
  if (getenv("MP_FAULT_BCAST_AT")) g_bcastAt = (size_t)strtoul(getenv("MP_FAULT_BCAST_AT"), NULL, 10);
  if (getenv("MP_FAULT_NRANKS")) {
    g_nranks = atoi(getenv("MP_FAULT_NRANKS"));
    int differ = !strcmp(sc, "bcast-count") || !strcmp(sc, "bcast-skip") || !strcmp(sc, "gather-count");
    if (g_nranks < 2 || g_nranks > NRANKS || (!differ && g_nranks != NRANKS)) {
      fprintf(stderr, "MP_FAULT_NRANKS=%s: 2..%d, and only for bcast-count, bcast-skip and gather-count\n",
              getenv("MP_FAULT_NRANKS"), NRANKS);
      return 2;
    }
  }
  g_timeout = isTimeout ? 3.0 : 20.0;
  setenv("NCCLX_CORE_TIMEOUT_S", isTimeout ? "3" : "20", 1);
  /* SIGPIPE keeps its default action: a write to a dead peer must not kill a survivor. */
  mpJobInit(&g_job, g_nranks);
  printf("fault_kill %s: %d forked ranks, timeout_s=%.0f, %zu floats per allreduce\n", sc, g_nranks,
         g_timeout, g_count);
  int rc;
  if (!strcmp(sc, "kill")) rc = runKill();
  else if (!strcmp(sc, "abort")) rc = runAbort(0);
  else if (!strcmp(sc, "abort-waiter")) rc = runAbort(1);
  else if (!strcmp(sc, "mismatch")) rc = runMismatch(mismatchRank, "mismatch");
  else if (!strcmp(sc, "bcast-count")) rc = runMismatch(bcastCountRank, "bcast-count");
  else if (!strcmp(sc, "bcast-skip")) rc = runMismatch(bcastSkipRank, "bcast-skip");
  else if (!strcmp(sc, "gather-count")) rc = runMismatch(gatherCountRank, "gather-count");
  else if (!strcmp(sc, "bcast-root")) rc = runBcastRoot();
  else rc = runTimeout(!strcmp(sc, "timeout"));
  printf("fault_kill %s: %s\n", sc, rc ? "FAIL" : "PASS");
  return rc;
}
