/* CPU streams: a worker thread per stream runs queued tasks in order. */
#ifndef NCCLX_STREAM_H
#define NCCLX_STREAM_H

#include "ncclx.h"

typedef struct ncclxTask {
  /* Runs on the stream's thread; its result is kept as the stream's error if it is the
   * first failure since the last synchronize. */
  ncclxResult_t (*run)(struct ncclxTask* task);
  /* Frees the task (called after run, or instead of it when the stream is destroyed). */
  void (*release)(struct ncclxTask* task);
  struct ncclxTask* next;
} ncclxTask;

/* Queue a task; takes ownership. */
ncclxResult_t streamEnqueue(ncclxStream_t stream, ncclxTask* task);
/* Validate a user-provided stream handle (NULL is valid: caller's thread). */
ncclxResult_t streamCheckHandle(ncclxStream_t stream);
/* Called with every stream ncclxStreamDestroy takes down, before its queue drains (the GPU
 * path drops a CUDA binding: gpu_stream.c). One hook per process. */
void streamSetDestroyHook(void (*hook)(ncclxStream_t stream));
/* The calling thread's ncclxGroupStart nesting depth: sched/enqueue.c nests it, a stream
 * synchronize inside a group runs no queued work itself. Read on every call: a variable, not
 * a function (TLS descriptors keep it cheap, core/CMakeLists.txt). */
extern _Thread_local int threadGroupDepth;
#endif
