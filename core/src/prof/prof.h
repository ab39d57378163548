/* Profiler event sites. With no plugin each site is one predictable branch.
 * A transport that only reports NET events defines PROF_NET_ONLY before including this (it
 * gets the mask and profNetEvent without the communicator types). */
#ifndef NCCLX_PROF_H
#define NCCLX_PROF_H

#include "ncclx/profiler.h"

/* Shared by all communicators; the plugin may store to it at any time (read atomically). */
extern int ncclxProfilerMask;

/* Network plugin events (env->profiler of every plugin, and the built-in socket network). A
 * START is routed to the profiler of the communicator whose operation the calling thread is
 * running (set by profNetScope), as a NET event under parentHandle (the STEP handle the core
 * passed as phandle) or, when that is NULL, under the running operation. STOP and UPDATE
 * may come from any thread. Events from a thread running no operation, or with NET off in
 * the mask, are dropped (*eHandle = NULL). */
ncclxResult_t profNetEvent(void** eHandle, int type, void* parentHandle, int64_t pluginId, void* extData);

#ifndef PROF_NET_ONLY
#include "comm/comm.h"

void profCommInit(struct ncclxComm* comm);
void profCommFinalize(struct ncclxComm* comm);

static inline int profEnabled(const struct ncclxComm* comm, int type) {
  return __builtin_expect(comm->profiler != NULL, 0) &&
         (__atomic_load_n(&ncclxProfilerMask, __ATOMIC_RELAXED) & type);
}
/* Returns the event handle or NULL. profStart: any descriptor (a module's own operations). */
void* profStart(struct ncclxComm* comm, const ncclxProfilerEventDescr_v1_t* d);
/* A collective's COLL event, as its caller (which knows the collective) describes it. */
typedef struct {
  int coll;  /* ncclxCollType_t */
  const void* sendbuff;
  void* recvbuff;
  size_t count;
  size_t bytes; /* this rank's bytes of the call (tuneCallBytes) */
  int root;
  ncclxDataType_t datatype;
  ncclxRedOp_t op;
  int algo, proto;
} profColl;
void* profCollStart(struct ncclxComm* comm, const profColl* c, uint64_t seq, void* stream);
void* profP2pStart(struct ncclxComm* comm, int isSend, void* buff, size_t count,
                   ncclxDataType_t type, int peer, uint64_t seq);
static inline void profStop(struct ncclxComm* comm, void* handle) {
  if (handle && comm->profiler) comm->profiler->stopEvent(handle);
}

extern _Thread_local struct ncclxComm* profNetComm;
/* Around an operation's transfers: returns the previous scope, to restore afterwards. */
static inline struct ncclxComm* profNetScope(struct ncclxComm* comm) {
  struct ncclxComm* prev = profNetComm;
  profNetComm = comm;
  return prev;
}
void profFailed(struct ncclxComm* comm, void* handle, ncclxResult_t res, const char* message);
#endif
#endif
