/* What stream.c shares with event.c: the registry of live handles, the stream a thread is
 * running a task of, waits that report when they last, and queueing onto a stream. Lock
 * order: registry -> stream or event -> mark. */
#ifndef NCCLX_STREAM_INTERNAL_H
#define NCCLX_STREAM_INTERNAL_H

#include <pthread.h>
#include <stdint.h>
#include <time.h>

#include "exec/stream.h"

#define DEAD_MAGIC 0xdeadbeefdeadbeefull
/* Waits have no timeout (user work may legitimately be long), but a long one says so. */
#define WAIT_REPORT_SEC 60

/* Common head of registered objects. */
struct liveHandle {
  uint64_t magic;
  struct liveHandle* next;
};

/* Handles are checked against the registry, under registryLock (read while one is in use,
 * write to add or remove one): a destroyed handle is never dereferenced. */
extern pthread_rwlock_t registryLock;
void registryAdd(struct liveHandle** list, struct liveHandle* h);
int registryRemove(struct liveHandle** list, const struct liveHandle* h);
struct liveHandle* registryFind(struct liveHandle* list, const void* handle, uint64_t magic);
struct ncclxStream* findStream(ncclxStream_t stream);
ncclxResult_t badStream(const char* caller, const void* stream);

/* The stream whose task this thread is running, NULL when none. */
extern _Thread_local const struct ncclxStream* runningOn;

/* Condition variables on the monotonic clock, and one bounded step of an unbounded wait
 * (the caller loops on its own predicate; every WAIT_REPORT_SEC it logs that it waits). */
int condInitMonotonic(pthread_cond_t* cond);
struct waitReport {
  struct timespec start;
  const char* what;
  const void* object;
};
void waitReportInit(struct waitReport* w, const char* what, const void* object);
void condWaitReporting(pthread_cond_t* cond, pthread_mutex_t* lock, struct waitReport* w);

/* Queue task on a live stream (registryLock held for reading); takes ownership of task. */
ncclxResult_t pushTask(struct ncclxStream* s, ncclxTask* task, const char* caller);

#endif
