/* Profiler event sites. With no plugin each site is one predictable branch. */
#ifndef NCCLX_PROF_H
#define NCCLX_PROF_H

#include "coll.h"
#include "ncclx/profiler.h"

/* Shared by all communicators; the plugin may store to it at any time (read atomically). */
extern int ncclxProfilerMask;

void profCommInit(struct ncclxComm* comm);
void profCommFinalize(struct ncclxComm* comm);

static inline int profEnabled(const struct ncclxComm* comm, int type) {
  return __builtin_expect(comm->profiler != NULL, 0) &&
         (__atomic_load_n(&ncclxProfilerMask, __ATOMIC_RELAXED) & type);
}
/* Returns the event handle or NULL. */
void* profCollStart(struct ncclxComm* comm, const ncclxCollArgs* args, uint64_t seq, void* stream);
void* profP2pStart(struct ncclxComm* comm, int isSend, void* buff, size_t count,
                   ncclxDataType_t type, int peer, uint64_t seq);
void profStop(struct ncclxComm* comm, void* handle);
void profFailed(struct ncclxComm* comm, void* handle, ncclxResult_t res, const char* message);
#endif
