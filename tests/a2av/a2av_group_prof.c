/* a2av_group_prof NP: profiler events of the dynamic calls, and their refusal inside a group.
 *
 * Linked with the internal archive: each rank installs a recording profiler on its
 * communicator (the plugin table a loaded plugin would have) and checks that
 *   - ncclxAllToAllvDynamic (stream NULL and on a stream, counts produced by a host function),
 *     ncclxAllToAllvDynamicCompact and ncclxMoeDispatch / ncclxMoeCombine each report one
 *     COLL event, named "alltoallv_dynamic", "alltoallv_dynamic_compact", "moe_dispatch",
 *     "moe_combine", with increasing sequence numbers, the bytes this rank sends, the stream
 *     and a stop for every start;
 *   - between ncclxGroupStart and ncclxGroupEnd every dynamic call fails with
 *     ncclxInvalidUsage naming the group, queues nothing, and the communicator stays usable
 *     (a collective grouped with it and a dynamic call after the group both succeed). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "sched/enqueue.h" /* enqueueGroupDepth */
#include "comm/comm.h"
#include "ncclx/moe.h"
#include "ncclx/profiler.h"
#include "prof/prof.h"

#define MAXEV 64

typedef struct {
  char func[40];
  uint64_t seq;
  size_t bytes;
  void* stream;
  int stopped, failed;
} Event;

static Event events[MAXEV];
static int nevents;

static ncclxResult_t recStart(void* ctx, void** eHandle, const ncclxProfilerEventDescr_v1_t* d) {
  (void)ctx;
  *eHandle = NULL;
  if (d->type != NCCLX_PROFILE_COLL || nevents == MAXEV) return ncclxSuccess;
  Event* e = &events[nevents++];
  snprintf(e->func, sizeof(e->func), "%s", d->coll.func ? d->coll.func : "(null)");
  e->seq = d->coll.seq;
  e->bytes = d->coll.bytes;
  e->stream = d->coll.stream;
  *eHandle = e;
  return ncclxSuccess;
}
static ncclxResult_t recStop(void* h) {
  ((Event*)h)->stopped++;
  return ncclxSuccess;
}
static ncclxResult_t recState(void* h, ncclxProfilerState_t state, const ncclxProfilerStateArgs_v1_t* args) {
  (void)args;
  if (state == NCCLX_PROFILE_STATE_FAILED) ((Event*)h)->failed++;
  return ncclxSuccess;
}
static ncclxResult_t recFinalize(void* ctx) {
  (void)ctx;
  return ncclxSuccess;
}
static const ncclxProfiler_t recorder = {.name = "a2av-recorder",
                                         .abiVersion = NCCLX_PROFILER_ABI_VERSION,
                                         .startEvent = recStart,
                                         .stopEvent = recStop,
                                         .recordEventState = recState,
                                         .finalize = recFinalize};

static int bad;
#define EXPECT(rank, cond, ...)                         \
  do {                                                  \
    if (!(cond)) {                                      \
      fprintf(stderr, "rank %d: FAIL: ", rank);         \
      fprintf(stderr, __VA_ARGS__);                     \
      fprintf(stderr, "\n");                            \
      bad++;                                            \
    }                                                   \
  } while (0)
#define CHECK(rank, call) EXPECT(rank, (call) == ncclxSuccess, "%s: %s", #call, ncclxGetLastError(NULL))

typedef struct {
  int rank, np;
  size_t* sendcounts;
} Producer;

/* Runs on the stream: the counts exist only from here on. */
static void produceCounts(void* u) {
  Producer* p = u;
  for (int d = 0; d < p->np; d++) p->sendcounts[d] = (size_t)((p->rank + d) % 3);
}

static const Event* expectEvent(int rank, int i, const char* func, void* stream) {
  if (i >= nevents) {
    EXPECT(rank, 0, "event %d (%s) missing: %d recorded", i, func, nevents);
    return NULL;
  }
  const Event* e = &events[i];
  EXPECT(rank, !strcmp(e->func, func), "event %d is '%s', expected '%s'", i, e->func, func);
  EXPECT(rank, e->stopped == 1, "event %d (%s) stopped %d times", i, func, e->stopped);
  EXPECT(rank, e->failed == 0, "event %d (%s) reported a failure", i, func);
  EXPECT(rank, e->stream == stream, "event %d (%s): stream %p, expected %p", i, func, e->stream, stream);
  EXPECT(rank, i == 0 || e->seq > events[i - 1].seq, "event %d (%s): seq %llu not after %llu", i, func,
         (unsigned long long)e->seq, (unsigned long long)events[i - 1].seq);
  return e;
}

static void groupRefusal(int rank, int np, ncclxComm_t comm, ncclxMoe_t moe, ncclxStream_t stream) {
  size_t sendcounts[16], recvcounts[16], recvcountsB[16], rdispls[16];
  float send[32], recv[32], recvB[32], token[4] = {1, 2, 3, 4}, out[4], w[2] = {0.5f, 0.5f};
  float in[16 * 16 * 4];
  size_t ecounts[16];
  int32_t ids[2] = {0, np > 1 ? 1 : 0};
  for (int d = 0; d < np; d++) sendcounts[d] = 1, send[d] = (float)(rank * 100 + d);
  float sum = (float)rank, total = 0;
  CHECK(rank, ncclxGroupStart());
  /* A grouped collective: it runs at ncclxGroupEnd whatever happens to the dynamic calls. */
  CHECK(rank, ncclxAllReduce(&sum, &total, 1, ncclxFloat32, ncclxSum, comm, NULL));
  int inGroup = enqueueGroupDepth() > 0;
  ncclxResult_t r1 = ncclxAllToAllvDynamic(send, sendcounts, recv, 2, recvcounts, ncclxFloat32, comm, stream);
  const char* msg = ncclxGetLastError(NULL);
  ncclxResult_t r2 = ncclxAllToAllvDynamicCompact(send, sendcounts, recvB, 32, recvcountsB, rdispls,
                                                  ncclxFloat32, comm, stream);
  ncclxResult_t r3 = ncclxMoeDispatch(moe, token, 1, ids, in, ecounts, stream);
  ncclxResult_t r4 = ncclxMoeCombine(moe, in, w, out, stream);
  int eventsBeforeEnd = nevents;
  CHECK(rank, ncclxGroupEnd());
  /* The refusal is the contract (ncclx/moe.h): the group must be seen. */
  EXPECT(rank, inGroup, "inside ncclxGroupStart the core saw no group (enqueueGroupDepth() was 0)");
  EXPECT(rank, r1 == ncclxInvalidUsage && r2 == ncclxInvalidUsage && r3 == ncclxInvalidUsage,
         "grouped dynamic calls returned %d %d %d, expected ncclxInvalidUsage (%d)", r1, r2, r3, ncclxInvalidUsage);
  /* The combine is refused for the group too (or for having no dispatch: both usage). */
  EXPECT(rank, r4 == ncclxInvalidUsage, "grouped combine returned %d", r4);
  EXPECT(rank, strstr(msg, "ncclxGroupStart") != NULL, "message does not name the group: %s", msg);
  EXPECT(rank, eventsBeforeEnd == 0, "refused calls reported %d profiler events", eventsBeforeEnd);
  EXPECT(rank, total == (float)(np * (np - 1) / 2), "grouped all-reduce gave %g", (double)total);
  /* Still usable: a dynamic call after the group. */
  CHECK(rank, ncclxAllToAllvDynamic(send, sendcounts, recv, 2, recvcounts, ncclxFloat32, comm, NULL));
  for (int s = 0; s < np; s++)
    EXPECT(rank, recvcounts[s] == 1 && recv[2 * s] == (float)(s * 100 + rank), "after the group: block from %d wrong",
           s);
}

static int rankMain(int rank, int np, ncclxUniqueId id) {
  alarm(60); /* never hang a test run */
  ncclxComm_t comm;
  if (ncclxCommInitRank(&comm, np, id, rank) != ncclxSuccess) {
    fprintf(stderr, "rank %d: init failed: %s\n", rank, ncclxGetLastError(NULL));
    return 1;
  }
  ncclxStream_t stream;
  CHECK(rank, ncclxStreamCreate(&stream));
  ncclxMoeConfig_t cfg = {.size = sizeof(cfg), .nExperts = 2 * np, .topk = 2, .hidden = 4,
                          .datatype = ncclxFloat32, .maxTokens = 4, .maxRecvTokens = 16 * (size_t)np};
  ncclxMoe_t moe;
  CHECK(rank, ncclxMoeCreate(&moe, &cfg, comm));

  /* Group first: refused calls must leave no trace in the profiler. */
  struct ncclxComm* c = comm;
  c->profiler = &recorder;
  c->profilerCtx = NULL;
  __atomic_store_n(&ncclxProfilerMask, NCCLX_PROFILE_COLL, __ATOMIC_RELAXED);
  groupRefusal(rank, np, comm, moe, stream);
  memset(events, 0, sizeof(events));
  nevents = 0;

  size_t sendcounts[16], recvcounts[16], rdispls[16];
  float send[64], recv[256];
  for (int i = 0; i < 64; i++) send[i] = (float)i;
  Producer prod = {.rank = rank, .np = np, .sendcounts = sendcounts};
  size_t sent = 0;
  for (int d = 0; d < np; d++) sent += (size_t)((rank + d) % 3);
  for (int d = 0; d < np; d++) sendcounts[d] = (size_t)((rank + d) % 3);
  CHECK(rank, ncclxAllToAllvDynamic(send, sendcounts, recv, 4, recvcounts, ncclxFloat32, comm, NULL));
  memset(sendcounts, 0xff, sizeof(sendcounts)); /* garbage until the host function runs */
  CHECK(rank, ncclxLaunchHostFunc(stream, produceCounts, &prod));
  CHECK(rank, ncclxAllToAllvDynamic(send, sendcounts, recv, 4, recvcounts, ncclxFloat32, comm, stream));
  CHECK(rank, ncclxAllToAllvDynamicCompact(send, sendcounts, recv, 256, recvcounts, rdispls, ncclxFloat32, comm,
                                           stream));
  CHECK(rank, ncclxStreamSynchronize(stream));
  float tokens[16], in[16 * 16 * 4], out[16], w[8];
  int32_t ids[8];
  size_t ecounts[2];
  for (int i = 0; i < 16; i++) tokens[i] = (float)i;
  for (int i = 0; i < 8; i++) ids[i] = (i + rank) % (2 * np), w[i] = 0.5f;
  CHECK(rank, ncclxMoeDispatch(moe, tokens, 4, ids, in, ecounts, stream));
  CHECK(rank, ncclxMoeCombine(moe, in, w, out, stream));
  CHECK(rank, ncclxStreamSynchronize(stream));

  const Event* e = expectEvent(rank, 0, "alltoallv_dynamic", NULL);
  if (e) EXPECT(rank, e->bytes == sent * sizeof(float), "alltoallv_dynamic bytes %zu, expected %zu", e->bytes,
                sent * sizeof(float));
  e = expectEvent(rank, 1, "alltoallv_dynamic", stream);
  if (e) EXPECT(rank, e->bytes == sent * sizeof(float), "queued alltoallv_dynamic bytes %zu (counts read at "
                "execution), expected %zu", e->bytes, sent * sizeof(float));
  expectEvent(rank, 2, "alltoallv_dynamic_compact", stream);
  e = expectEvent(rank, 3, "moe_dispatch", stream);
  if (e) EXPECT(rank, e->bytes == 4 * 2 * 4 * sizeof(float), "moe_dispatch bytes %zu", e->bytes);
  expectEvent(rank, 4, "moe_combine", stream);
  EXPECT(rank, nevents == 5, "%d events recorded, expected 5", nevents);

  c->profiler = NULL; /* not a loaded plugin: nothing to release */
  CHECK(rank, ncclxMoeDestroy(moe));
  CHECK(rank, ncclxStreamDestroy(stream));
  CHECK(rank, ncclxCommDestroy(comm));
  return bad ? 1 : 0;
}

int main(int argc, char** argv) {
  int np = argc > 1 ? atoi(argv[1]) : 0;
  if (np < 1 || np > 16) {
    fprintf(stderr, "usage: %s NP (1..16)\n", argv[0]);
    return 2;
  }
  ncclxUniqueId id;
  if (ncclxGetUniqueId(&id) != ncclxSuccess) return 1;
  fflush(stdout);
  for (int r = 0; r < np; r++)
    if (fork() == 0) exit(rankMain(r, np, id));
  int failed = 0;
  for (int r = 0; r < np; r++) {
    int st;
    if (wait(&st) < 0 || !WIFEXITED(st) || WEXITSTATUS(st) != 0) failed++;
  }
  printf("a2av_group_prof: %d ranks: %s\n", np, failed ? "FAILED" : "ok");
  return failed ? 1 : 0;
}
