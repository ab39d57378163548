/* A minimal feature module: the CommFuse family (ncclx/fuse.h) done the simplest way, every
 * schedule run as SEQUENTIAL (communicate, then compute). Load it in place of the built-in
 * module with
 *
 *   [modules]
 *   commfuse = /path/to/libncclx-module-template.so      (or NCCLX_MODULES_COMMFUSE=...)
 *
 * It shows what a module gets from the core (ncclx/module.h): checks and errors, the
 * operation envelope (opBegin/opEnd), point-to-point steps, streams, scratch memory and
 * reductions. It links nothing but libc: libncclx hands it everything through `core`. */
#include <stdlib.h>
#include <string.h>

#include "ncclx/module.h"

static const ncclxModuleCore_v1_t* core;

#define CHECK(call)                           \
  do {                                        \
    ncclxResult_t r_ = (call);                \
    if (r_ != ncclxSuccess) return r_;        \
  } while (0)

typedef enum { AG, RS, A2A } kind;

typedef struct {
  kind k;
  ncclxComm_t comm;
  ncclxModuleCommInfo_v1_t info;
  const void* sendbuff;
  char* recvbuff;
  size_t count, bytes; /* elements and bytes per block */
  ncclxDataType_t type;
  ncclxRedOp_t op;
  ncclxFuseConsumeFn consume;
  ncclxFuseProduceFn produce;
  void* user;
  ncclxStream_t stream;
} call;

static const char* const names[] = {"allgather-compute", "compute-reducescatter", "alltoall-compute"};

static ncclxResult_t callbackFailed(const call* c, int rc) {
  return core->fail(c->comm, ncclxInvalidUsage, "%s: a callback returned %d", names[c->k], rc);
}

/* One step: send to one peer and receive from another (either may be -1). */
static ncclxResult_t exchange(const call* c, int to, void* out, int from, void* in) {
  ncclxModuleXfer_v1_t x[2];
  int n = 0;
  if (to >= 0) x[n++] = (ncclxModuleXfer_v1_t){.peer = to, .isSend = 1, .buf = out, .bytes = c->bytes};
  if (from >= 0) x[n++] = (ncclxModuleXfer_v1_t){.peer = from, .isSend = 0, .buf = in, .bytes = c->bytes};
  return core->stepRun(c->comm, x, n);
}

static char* block(const call* c, char* base, int b) { return base + (size_t)b * c->bytes; }

/* Ring all-gather, then consume every block in the order r, r-1, ..., r+1. */
static ncclxResult_t allGather(const call* c) {
  int n = c->info.nranks, r = c->info.rank;
  if (c->sendbuff != block(c, c->recvbuff, r)) memmove(block(c, c->recvbuff, r), c->sendbuff, c->bytes);
  for (int s = 0; s < n - 1; s++)
    CHECK(exchange(c, (r + 1) % n, block(c, c->recvbuff, (r - s + n) % n), (r - 1 + n) % n,
                   block(c, c->recvbuff, (r - s - 1 + n) % n)));
  for (int t = 0; t < n; t++) {
    int b = (r - t + n) % n, rc = c->consume(c->user, b, 0, block(c, c->recvbuff, b), c->count);
    if (rc) return callbackFailed(c, rc);
  }
  return ncclxSuccess;
}

/* Produce every block (order r-1, ..., r), then a ring reduce-scatter: the partial of block b
 * starts at rank b+1 and gains one contribution per step until it reaches rank b. */
static ncclxResult_t reduceScatter(const call* c) {
  int n = c->info.nranks, r = c->info.rank;
  char* mine;
  CHECK(core->scratch(c->comm, (size_t)(n + 2) * c->bytes, (void**)&mine));
  char* part[2] = {block(c, mine, n), block(c, mine, n + 1)};
  for (int t = 1; t <= n; t++) {
    int b = (r - t + n) % n, rc = c->produce(c->user, b, 0, block(c, mine, b), c->count);
    if (rc) return callbackFailed(c, rc);
  }
  if (n == 1) memcpy(c->recvbuff, mine, c->bytes);
  for (int s = 0; s < n - 1; s++) {
    int sb = (r - s - 1 + n) % n, rb = (r - s - 2 + 2 * n) % n;
    CHECK(exchange(c, (r + 1) % n, s == 0 ? block(c, mine, sb) : part[(s - 1) % 2], (r - 1 + n) % n, part[s % 2]));
    char* out = s == n - 2 ? c->recvbuff : part[s % 2];
    core->reduce(out, block(c, mine, rb), part[s % 2], c->count, c->type, c->op);
  }
  if (c->op == ncclxAvg) core->avgFinish(c->recvbuff, c->count, c->type, n);
  return ncclxSuccess;
}

/* Produce every block, exchange pairwise, consume in the order r, r-1, ..., r+1. */
static ncclxResult_t allToAll(const call* c) {
  int n = c->info.nranks, r = c->info.rank;
  char* staged;
  CHECK(core->scratch(c->comm, (size_t)n * c->bytes, (void**)&staged));
  for (int t = 1; t <= n; t++) {
    int b = (r + t) % n;
    int rc = c->produce(c->user, b, 0, b == r ? block(c, c->recvbuff, r) : block(c, staged, b), c->count);
    if (rc) return callbackFailed(c, rc);
  }
  for (int t = 1; t < n; t++)
    CHECK(exchange(c, (r + t) % n, block(c, staged, (r + t) % n), (r - t + n) % n,
                   block(c, c->recvbuff, (r - t + n) % n)));
  for (int t = 0; t < n && c->consume; t++) {
    int b = (r - t + n) % n, rc = c->consume(c->user, b, 0, block(c, c->recvbuff, b), c->count);
    if (rc) return callbackFailed(c, rc);
  }
  return ncclxSuccess;
}

static ncclxResult_t run(void* arg) {
  call* c = arg;
  static const ncclxCollType_t colls[] = {NCCLX_COLL_ALLGATHER, NCCLX_COLL_REDUCESCATTER, NCCLX_COLL_ALLTOALL};
  ncclxModuleOp_v1_t op = {.name = names[c->k], .path = "template sequential", .callKind = (int)c->k,
                           .bytesPerRank = c->bytes, .profColl = colls[c->k], .profAlgo = NCCLX_ALGO_RING,
                           .sendbuff = c->sendbuff, .recvbuff = c->recvbuff, .count = c->count,
                           .datatype = c->type, .op = c->op, .stream = c->stream};
  ncclxModuleOpCtx_v1_t ctx;
  CHECK(core->opBegin(c->comm, &op, &ctx));
  ncclxResult_t res = c->count == 0 ? ncclxSuccess : c->k == AG ? allGather(c) : c->k == RS ? reduceScatter(c) : allToAll(c);
  core->opEnd(c->comm, &ctx, res);
  return res;
}

/* Check the arguments, then run now (no stream) or queue a copy on the stream. */
static ncclxResult_t submit(call c, const char* fn, int haveCallback) {
  CHECK(core->checkCall(c.comm, c.stream, fn));
  core->commInfo(c.comm, &c.info);
  size_t size = core->typeSize(c.type);
  if (!size) return core->argError(c.comm, ncclxInvalidArgument, "%s: invalid datatype %d", fn, (int)c.type);
  if (!haveCallback) return core->argError(c.comm, ncclxInvalidArgument, "%s: the callback is NULL", fn);
  if (c.count && !c.recvbuff) return core->argError(c.comm, ncclxInvalidArgument, "%s: recvbuff is NULL", fn);
  c.bytes = c.count * size;
  if (!c.stream) return run(&c);
  call* queued = malloc(sizeof(*queued));
  if (!queued) return core->setError(ncclxSystemError, "%s: out of memory", fn);
  *queued = c;
  return core->enqueue(c.comm, c.stream, run, free, queued);
}

static ncclxResult_t allGatherCompute(const void* sendbuff, void* recvbuff, size_t count, ncclxDataType_t type,
                                      ncclxFuseConsumeFn consume, void* user, ncclxFuseSchedule_t schedule,
                                      ncclxComm_t comm, ncclxStream_t stream) {
  (void)schedule; /* every schedule runs sequentially here */
  call c = {.k = AG, .comm = comm, .sendbuff = sendbuff, .recvbuff = recvbuff, .count = count, .type = type,
            .op = ncclxSum, .consume = consume, .user = user, .stream = stream};
  if (count && !sendbuff) return core->argError(comm, ncclxInvalidArgument, "ncclxAllGatherCompute: sendbuff is NULL");
  return submit(c, "ncclxAllGatherCompute", consume != NULL);
}

static ncclxResult_t computeReduceScatter(ncclxFuseProduceFn produce, void* user, void* recvbuff, size_t count,
                                          ncclxDataType_t type, ncclxRedOp_t op, ncclxFuseSchedule_t schedule,
                                          ncclxComm_t comm, ncclxStream_t stream) {
  (void)schedule;
  call c = {.k = RS, .comm = comm, .recvbuff = recvbuff, .count = count, .type = type, .op = op,
            .produce = produce, .user = user, .stream = stream};
  if ((unsigned)op >= ncclxNumOps)
    return core->argError(comm, ncclxInvalidArgument, "ncclxComputeReduceScatter: invalid op %d", (int)op);
  return submit(c, "ncclxComputeReduceScatter", produce != NULL);
}

static ncclxResult_t allToAllCompute(ncclxFuseProduceFn produce, ncclxFuseConsumeFn consume, void* user,
                                     void* recvbuff, size_t count, ncclxDataType_t type, ncclxFuseSchedule_t schedule,
                                     ncclxComm_t comm, ncclxStream_t stream) {
  (void)schedule;
  call c = {.k = A2A, .comm = comm, .recvbuff = recvbuff, .count = count, .type = type, .op = ncclxSum,
            .produce = produce, .consume = consume, .user = user, .stream = stream};
  return submit(c, "ncclxAllToAllCompute", produce != NULL);
}

static ncclxResult_t lastSchedule(ncclxComm_t comm, ncclxFuseSchedule_t* schedule) {
  CHECK(core->checkCall(comm, NULL, "ncclxFuseLastSchedule"));
  if (!schedule) return core->argError(comm, ncclxInvalidArgument, "ncclxFuseLastSchedule: schedule is NULL");
  *schedule = NCCLX_FUSE_SEQUENTIAL; /* the only one this module runs */
  return ncclxSuccess;
}

static int schedulePieces(ncclxFuseSchedule_t schedule, size_t count, ncclxDataType_t type, int nranks) {
  (void)schedule, (void)count, (void)type, (void)nranks;
  return 1;
}

static const ncclxModuleFuse_v1_t calls = {allGatherCompute, computeReduceScatter, allToAllCompute, lastSchedule,
                                           schedulePieces};

static ncclxResult_t init(const ncclxModuleCore_v1_t* c, int slot) {
  (void)slot; /* no per-communicator state */
  if (c->abiVersion != NCCLX_MODULE_ABI_VERSION || c->size < sizeof(*c)) return ncclxInvalidUsage;
  core = c;
  core->log(NCCLX_LOG_INFO, NCCLX_LOG_INIT, __FILE__, __LINE__, "module template: loaded (every schedule sequential)");
  return ncclxSuccess;
}

static const void* family(const char* name) { return strcmp(name, NCCLX_MODULE_FAMILY_FUSE) == 0 ? &calls : NULL; }

__attribute__((visibility("default"))) const ncclxModule_v1_t ncclxModule_v1 = {
    .name = "template", .abiVersion = NCCLX_MODULE_ABI_VERSION, .init = init, .family = family};
