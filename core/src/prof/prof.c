/* Profiler plugin hookup and the core's event sites. */
#include "prof/prof.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "util/debug.h"
#include "plugin/plugin_loader.h"
#include "util/names.h"

int ncclxProfilerMask;
_Thread_local struct ncclxComm* profNetComm;

/* The loaded profiler while any communicator uses it, for net events that stop on a thread
 * with no operation in scope (all communicators share the one loaded plugin). */
static const ncclxProfiler_t* netProfiler;
static int netProfilerUsers;

void profCommInit(struct ncclxComm* comm) {
  const ncclxProfiler_t* prof = NULL;
  if (ncclxProfilerAcquire(&prof) != ncclxSuccess || !prof) return;
  ncclxPluginSetNetProfiler(profNetEvent);
  char section[96];
  snprintf(section, sizeof(section), "profiler.%s", prof->name);
  ncclxPluginEnv_t env;
  ncclxPluginEnvFill(&env, section);
  ncclxProfilerCommInfo_v1_t info = {.commHash = comm->commHash, .commName = comm->name,
                                     .rank = comm->rank, .nranks = comm->nranks,
                                     .nhosts = comm->nhosts, .hostname = bootstrapHostname(),
                                     .pid = (int)getpid()};
  void* ctx = NULL;
  ncclxResult_t res = prof->init(&ctx, &info, &ncclxProfilerMask, &env);
  if (res != ncclxSuccess) {
    WARN("profiler plugin '%s' failed to initialize (%s); continuing without a profiler",
         prof->name, ncclxGetErrorString(res));
    ncclxProfilerRelease();
    return;
  }
  comm->profiler = prof;
  comm->profilerCtx = ctx;
  __atomic_store_n(&netProfiler, prof, __ATOMIC_RELEASE);
  __atomic_add_fetch(&netProfilerUsers, 1, __ATOMIC_ACQ_REL);
  INFO(NCCLX_LOG_PROFILE, "profiler '%s' active, mask 0x%x", prof->name,
       (unsigned)__atomic_load_n(&ncclxProfilerMask, __ATOMIC_RELAXED));
}

void profCommFinalize(struct ncclxComm* comm) {
  if (!comm->profiler) return;
  if (__atomic_sub_fetch(&netProfilerUsers, 1, __ATOMIC_ACQ_REL) == 0)
    __atomic_store_n(&netProfiler, NULL, __ATOMIC_RELEASE);
  comm->profiler->finalize(comm->profilerCtx);
  comm->profiler = NULL;
  comm->profilerCtx = NULL;
  ncclxProfilerRelease();
}

void* profStart(struct ncclxComm* comm, const ncclxProfilerEventDescr_v1_t* d) {
  void* handle = NULL;
  if (comm->profiler->startEvent(comm->profilerCtx, &handle, d) != ncclxSuccess) return NULL;
  return handle;
}

/* Names by enum value, fetched once per process (the lookups are exported functions, a call
 * each): the descriptor is built for every collective, a few nanoseconds count. Racing fills
 * store the same pointer. */
#define PROF_MEMO 16
static const char* collNames[PROF_MEMO], *typeNames[PROF_MEMO], *opNames[PROF_MEMO];
static const char* algoNames[PROF_MEMO], *protoNames[PROF_MEMO];

static inline const char* memoName(const char** table, int v, const char* (*lookup)(int)) {
  if ((unsigned)v >= PROF_MEMO) return lookup(v);
  const char* n = __atomic_load_n(&table[v], __ATOMIC_RELAXED);
  if (__builtin_expect(n == NULL, 0)) __atomic_store_n(&table[v], n = lookup(v), __ATOMIC_RELAXED);
  return n;
}
static const char* typeName(int v) { return ncclxTypeName((ncclxDataType_t)v); }
static const char* opName(int v) { return ncclxOpName((ncclxRedOp_t)v); }

void* profCollStart(struct ncclxComm* comm, const profColl* a, uint64_t seq, void* stream) {
  /* Field by field, not `= {...}`: zeroing the whole descriptor first compiles to a
   * `rep stos` that costs more than everything else here. Every field is set. */
  ncclxProfilerEventDescr_v1_t d;
  d.type = NCCLX_PROFILE_COLL;
  d.parent = NULL;
  d.rank = comm->rank;
  d.coll.seq = seq;
  d.coll.func = memoName(collNames, (int)a->coll, ncclxCollName);
  d.coll.sendbuff = a->sendbuff;
  d.coll.recvbuff = a->recvbuff;
  d.coll.count = a->count;
  d.coll.bytes = a->bytes;
  d.coll.root = a->root;
  d.coll.datatype = memoName(typeNames, (int)a->datatype, typeName);
  d.coll.op = memoName(opNames, (int)a->op, opName);
  d.coll.algo = memoName(algoNames, a->algo, ncclxAlgoName);
  d.coll.proto = memoName(protoNames, a->proto, ncclxProtoName);
  d.coll.stream = stream;
  return profStart(comm, &d);
}

void* profP2pStart(struct ncclxComm* comm, int isSend, void* buff, size_t count,
                   ncclxDataType_t type, int peer, uint64_t seq) {
  ncclxProfilerEventDescr_v1_t d; /* every field set, as in profCollStart */
  d.type = NCCLX_PROFILE_P2P;
  d.parent = NULL;
  d.rank = comm->rank;
  d.p2p.seq = seq;
  d.p2p.func = isSend ? "Send" : "Recv";
  d.p2p.buff = buff;
  d.p2p.count = count;
  d.p2p.bytes = count * dataTypeSize(type);
  d.p2p.datatype = memoName(typeNames, (int)type, typeName);
  d.p2p.peer = peer;
  return profStart(comm, &d);
}

void profFailed(struct ncclxComm* comm, void* handle, ncclxResult_t res, const char* message) {
  if (!handle || !comm->profiler) return;
  ncclxProfilerStateArgs_v1_t args = {.result = res, .message = message};
  comm->profiler->recordEventState(handle, NCCLX_PROFILE_STATE_FAILED, &args);
}

ncclxResult_t profNetEvent(void** eHandle, int type, void* parentHandle, int64_t pluginId, void* extData) {
  if (eHandle == NULL) return ncclxInvalidArgument;
  if (type == NCCLX_PROFILER_NET_START) {
    *eHandle = NULL;
    /* The mask first: a plain load, where the thread-local is a call in a shared library. */
    if (!(__atomic_load_n(&ncclxProfilerMask, __ATOMIC_RELAXED) & NCCLX_PROFILE_NET)) return ncclxSuccess;
    struct ncclxComm* comm = profNetComm;
    if (comm == NULL || !profEnabled(comm, NCCLX_PROFILE_NET)) return ncclxSuccess;
    ncclxProfilerEventDescr_v1_t d;
    memset(&d, 0, sizeof(d));
    d.type = NCCLX_PROFILE_NET;
    d.parent = parentHandle ? parentHandle : comm->curProfEvent;
    d.rank = comm->rank;
    d.net.pluginId = pluginId;
    d.net.data = extData;
    if (comm->profiler->startEvent(comm->profilerCtx, eHandle, &d) != ncclxSuccess) *eHandle = NULL;
    return ncclxSuccess;
  }
  if (type != NCCLX_PROFILER_NET_STOP && type != NCCLX_PROFILER_NET_UPDATE) return ncclxInvalidArgument;
  if (*eHandle == NULL) return ncclxSuccess; /* dropped at START */
  const ncclxProfiler_t* prof = __atomic_load_n(&netProfiler, __ATOMIC_ACQUIRE);
  if (prof == NULL) return ncclxSuccess;
  if (type == NCCLX_PROFILER_NET_STOP) {
    prof->stopEvent(*eHandle);
    *eHandle = NULL;
  } else {
    ncclxProfilerStateArgs_v1_t args = {.netData = extData};
    prof->recordEventState(*eHandle, NCCLX_PROFILE_STATE_PROGRESS, &args);
  }
  return ncclxSuccess;
}
