/* CPU streams (events: event.c).
 *
 * A stream is a FIFO of ncclxTask run in order, one at a time, by its worker thread, which
 * sleeps on a condition variable when the queue is empty. A thread in ncclxStreamSynchronize
 * does not just wait: while no task is running it takes the next one itself, so work queued
 * just before a synchronize runs on the synchronizing thread with no hand-off to the worker
 * and back (two thread wake-ups, tens of microseconds on a busy host). Tasks still run one at
 * a time in queue order, whichever thread runs them; "runs on this stream" is a thread-local
 * mark (runningOn), not a thread identity.
 *
 * Handles are validated against a registry of live objects rather than only by reading a
 * magic field: a destroyed handle points at freed memory, which must not be read. The
 * registry lock (read side) is held while a handle is in use, so a concurrent destroy
 * cannot free it under us. Lock order: registry -> stream or event -> mark.
 */
#include "exec/stream_internal.h"

#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "util/debug.h"

#define NCCLX_API __attribute__((visibility("default")))

#define STREAM_MAGIC 0x6e63636c78737472ull /* "ncclxstr" */
#define ERROR_TEXT_MAX 1024
/* How long a synchronize polls (yielding) for the worker's current task to end before it
 * sleeps; when it ends in time the synchronize runs the rest of the queue itself. */
#define TAKEOVER_SPIN_US 30.0

struct ncclxStream {
  struct liveHandle live;
  pthread_t thread;
  pthread_mutex_t lock;
  pthread_cond_t workCond; /* worker: a task arrived, or stop */
  pthread_cond_t doneCond; /* synchronize/destroy: a task finished, or a waiter left */
  ncclxTask *head, *tail;
  uint64_t enqueued, completed; /* tickets: synchronize waits for the ones queued before it */
  int workerAsleep;
  int running;  /* a task is running, on the worker or on a synchronizing thread */
  int takeover; /* synchronizers waiting to run the rest: the worker leaves it to them */
  int doneWaiters;
  uint64_t wakeAt; /* smallest ticket a synchronizer waits for: wake it then, not per task */
  int stopping;
  ncclxResult_t error; /* first failure since the last synchronize */
  char errorText[ERROR_TEXT_MAX];
};

pthread_rwlock_t registryLock = PTHREAD_RWLOCK_INITIALIZER;
static struct liveHandle* liveStreams;

/* The stream whose task this thread is running (the worker's own, or the one a synchronize
 * is running inline), NULL when none: what "called from a task on this stream" means. */
_Thread_local const struct ncclxStream* runningOn;

static pthread_once_t condAttrOnce = PTHREAD_ONCE_INIT;
static pthread_condattr_t monotonicCondAttr;

static void condAttrInit(void) {
  pthread_condattr_init(&monotonicCondAttr);
  pthread_condattr_setclock(&monotonicCondAttr, CLOCK_MONOTONIC);
}

/* Condition variables here use the monotonic clock so wall-clock jumps do not disturb the
 * periodic "still waiting" reports. */
int condInitMonotonic(pthread_cond_t* cond) {
  pthread_once(&condAttrOnce, condAttrInit);
  return pthread_cond_init(cond, &monotonicCondAttr);
}

/* ---- registry (callers hold registryLock) ---- */

void registryAdd(struct liveHandle** list, struct liveHandle* h) {
  h->next = *list;
  *list = h;
}

int registryRemove(struct liveHandle** list, const struct liveHandle* h) {
  for (struct liveHandle** p = list; *p; p = &(*p)->next) {
    if (*p == h) {
      *p = h->next;
      return 1;
    }
  }
  return 0;
}

/* Compares pointers first so a garbage handle is never dereferenced. */
struct liveHandle* registryFind(struct liveHandle* list, const void* handle,
                                       uint64_t magic) {
  for (struct liveHandle* h = list; h; h = h->next)
    if ((const void*)h == handle) return h->magic == magic ? h : NULL;
  return NULL;
}

struct ncclxStream* findStream(ncclxStream_t stream) {
  return (struct ncclxStream*)registryFind(liveStreams, stream, STREAM_MAGIC);
}

ncclxResult_t badStream(const char* caller, const void* stream) {
  return ncclxSetError(ncclxInvalidArgument,
                       "%s: stream %p is not a live ncclx stream (destroyed or never created)",
                       caller, stream);
}

/* ---- waiting ---- */

static double monoUs(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec * 1e-3;
}

void waitReportInit(struct waitReport* w, const char* what, const void* object) {
  clock_gettime(CLOCK_MONOTONIC, &w->start);
  w->what = what;
  w->object = object;
}

/* One bounded step of an unbounded wait: the caller loops on its own predicate. */
void condWaitReporting(pthread_cond_t* cond, pthread_mutex_t* lock, struct waitReport* w) {
  struct timespec deadline;
  clock_gettime(CLOCK_MONOTONIC, &deadline);
  deadline.tv_sec += WAIT_REPORT_SEC;
  if (pthread_cond_timedwait(cond, lock, &deadline) == ETIMEDOUT) {
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    WARN("%s %p: still waiting after %ld s (a queued operation has not finished)", w->what,
         w->object, (long)(now.tv_sec - w->start.tv_sec));
  }
}

/* ---- host functions ---- */

struct hostFnTask {
  ncclxTask base;
  ncclxHostFn_t fn;
  void* userData;
};

static ncclxResult_t hostFnRun(ncclxTask* t) {
  struct hostFnTask* ht = (struct hostFnTask*)t;
  ht->fn(ht->userData);
  return ncclxSuccess;
}

static void hostFnRelease(ncclxTask* t) { free(t); }

/* ---- running tasks ---- */

/* Error policy: after a task fails, later tasks still run. Event markers and host functions
 * must run or waiters on other streams would hang, and a failed communicator's sticky error
 * already makes its later collective tasks fail fast. Only the first error is kept; it is
 * reported (and cleared) by the next synchronize. */

/* Takes the head task (s->lock held, a task queued, none running). */
static ncclxTask* takeTask(struct ncclxStream* s) {
  ncclxTask* task = s->head;
  s->head = task->next;
  if (!s->head) s->tail = NULL;
  s->running = 1;
  return task;
}

/* Runs a task taken by takeTask, with s->lock released around it; returns with it held.
 * Whichever thread runs it counts as running on s for the self-wait checks. */
static void runTask(struct ncclxStream* s, ncclxTask* task) {
  char failText[ERROR_TEXT_MAX];
  pthread_mutex_unlock(&s->lock);
  const struct ncclxStream* outer = runningOn; /* a task may synchronize another stream */
  runningOn = s;
  ncclxClearThreadError(); /* so a failure's text is its own, not a stale one */
  ncclxResult_t res = task->run(task);
  if (res != ncclxSuccess) {
    const char* text = ncclxThreadLastError();
    if (text[0]) snprintf(failText, sizeof(failText), "%s", text);
    else snprintf(failText, sizeof(failText), "a queued stream operation failed (result %d)", (int)res);
  }
  /* Released before it counts as complete: after synchronize, its resources are gone. */
  if (task->release) task->release(task);
  runningOn = outer;

  pthread_mutex_lock(&s->lock);
  if (res != ncclxSuccess && s->error == ncclxSuccess) {
    s->error = res;
    snprintf(s->errorText, sizeof(s->errorText), "%s", failText);
  }
  s->running = 0;
  s->completed++;
  if (s->doneWaiters && s->completed >= s->wakeAt) {
    s->wakeAt = UINT64_MAX; /* waiters still short of their ticket register it again */
    pthread_cond_broadcast(&s->doneCond);
  }
}

static void* streamWorker(void* arg) {
  struct ncclxStream* s = arg;
  /* SCHED_BATCH: woken by an enqueue, the worker does not preempt the enqueuing thread (on
   * a busy CPU it runs at the next scheduling point, or a synchronize runs the task first).
   * Preempting it costs a few context switches per enqueue, about 10 us measured, for work
   * that thread is usually about to wait for. Best effort: without it nothing changes. */
  struct sched_param batch = {0};
  (void)pthread_setschedparam(pthread_self(), SCHED_BATCH, &batch);
  pthread_mutex_lock(&s->lock);
  for (;;) {
    /* A synchronizing thread may be running the head task: wait for the queue, not just it. */
    while ((!s->head || s->running || s->takeover) && !(s->stopping && !s->head)) {
      s->workerAsleep = 1;
      pthread_cond_wait(&s->workCond, &s->lock);
      s->workerAsleep = 0;
    }
    if (!s->head) break; /* stopping, and everything queued has run */
    runTask(s, takeTask(s));
  }
  pthread_mutex_unlock(&s->lock);
  return NULL;
}

/* Caller holds registryLock (read), so s stays alive. Takes ownership of task. */
ncclxResult_t pushTask(struct ncclxStream* s, ncclxTask* task, const char* caller) {
  pthread_mutex_lock(&s->lock);
  if (s->stopping) {
    pthread_mutex_unlock(&s->lock);
    if (task->release) task->release(task);
    return ncclxSetError(ncclxInvalidUsage, "%s: stream %p is being destroyed", caller, (void*)s);
  }
  task->next = NULL;
  if (s->tail) s->tail->next = task;
  else s->head = task;
  s->tail = task;
  s->enqueued++;
  /* A task running now is followed by the next one by the thread running it, or handed to
   * the worker when a synchronize stops at its ticket (see waitCompleted). */
  if (s->workerAsleep && !s->running && !s->takeover) pthread_cond_signal(&s->workCond);
  pthread_mutex_unlock(&s->lock);
  return ncclxSuccess;
}

/* Takes ownership of task in every case: on error it is released without running. */
static ncclxResult_t enqueueChecked(ncclxStream_t stream, ncclxTask* task, const char* caller) {
  if (!task || !task->run) {
    if (task && task->release) task->release(task);
    return ncclxSetError(ncclxInvalidArgument, "%s: %s", caller,
                         task ? "task has no run function" : "task is NULL");
  }
  if (!stream) { /* the caller's thread is the "stream": run it now */
    ncclxResult_t res = task->run(task);
    if (task->release) task->release(task);
    return res;
  }
  pthread_rwlock_rdlock(&registryLock);
  struct ncclxStream* s = findStream(stream);
  if (!s) {
    pthread_rwlock_unlock(&registryLock);
    if (task->release) task->release(task);
    return badStream(caller, stream);
  }
  ncclxResult_t res = pushTask(s, task, caller);
  pthread_rwlock_unlock(&registryLock);
  return res;
}

ncclxResult_t streamEnqueue(ncclxStream_t stream, ncclxTask* task) {
  return enqueueChecked(stream, task, "streamEnqueue");
}

ncclxResult_t streamCheckHandle(ncclxStream_t stream) {
  if (!stream) return ncclxSuccess;
  pthread_rwlock_rdlock(&registryLock);
  int ok = findStream(stream) != NULL;
  pthread_rwlock_unlock(&registryLock);
  return ok ? ncclxSuccess : badStream("stream check", stream);
}

_Thread_local int threadGroupDepth;
static void (*destroyHook)(ncclxStream_t stream);

void streamSetDestroyHook(void (*hook)(ncclxStream_t stream)) {
  __atomic_store_n(&destroyHook, hook, __ATOMIC_RELEASE);
}

/* ---- public stream API ---- */

/* The worker blocks asynchronous signals: they belong to the application's own threads.
 * Faults raised by a task (SIGSEGV, ...) stay deliverable so crash handlers still run. */
static int startWorker(struct ncclxStream* s) {
  static const int faults[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGTRAP, SIGABRT, SIGSYS};
  sigset_t blocked, old;
  sigfillset(&blocked);
  for (size_t i = 0; i < sizeof(faults) / sizeof(faults[0]); i++) sigdelset(&blocked, faults[i]);
  pthread_sigmask(SIG_SETMASK, &blocked, &old);
  int err = pthread_create(&s->thread, NULL, streamWorker, s);
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  return err;
}

NCCLX_API ncclxResult_t ncclxStreamCreate(ncclxStream_t* stream) {
  if (!stream) return ncclxSetError(ncclxInvalidArgument, "ncclxStreamCreate: stream pointer is NULL");
  *stream = NULL;
  struct ncclxStream* s = calloc(1, sizeof(*s));
  if (!s) return ncclxSetError(ncclxSystemError, "ncclxStreamCreate: out of memory");
  int err;
  const char* what = "initialize its mutex";
  if ((err = pthread_mutex_init(&s->lock, NULL)) != 0) goto failMutex;
  what = "initialize its condition variables";
  if ((err = condInitMonotonic(&s->workCond)) != 0) goto failWork;
  if ((err = condInitMonotonic(&s->doneCond)) != 0) goto failDone;
  s->wakeAt = UINT64_MAX;
  s->live.magic = STREAM_MAGIC;
  what = "start its worker thread";
  if ((err = startWorker(s)) != 0) goto failThread;

  pthread_rwlock_wrlock(&registryLock);
  registryAdd(&liveStreams, &s->live);
  pthread_rwlock_unlock(&registryLock);
  *stream = s;
  return ncclxSuccess;

failThread:
  pthread_cond_destroy(&s->doneCond);
failDone:
  pthread_cond_destroy(&s->workCond);
failWork:
  pthread_mutex_destroy(&s->lock);
failMutex:
  free(s);
  return ncclxSetError(ncclxSystemError, "ncclxStreamCreate: cannot %s: %s", what, strerror(err));
}

/* Waits (s->lock held) until every task with a ticket <= `ticket` has finished. With
 * runInline, runs queued tasks itself whenever none is running (ticket order: the queue
 * holds the unfinished tickets in order), so a queue the worker has not reached yet costs
 * no hand-off; then leaves anything queued after the ticket to the worker. */
static void waitCompleted(struct ncclxStream* s, uint64_t ticket, const char* what, int runInline) {
  struct waitReport w;
  waitReportInit(&w, what, s);
  s->doneWaiters++; /* also keeps s alive while s->lock is released to run a task */
  int spinning = 0;
  double spinUntil = 0;
  while (s->completed < ticket) {
    if (runInline && s->head && !s->running) {
      runTask(s, takeTask(s));
      continue;
    }
    if (runInline && s->running && (!spinning || monoUs() < spinUntil)) {
      if (!spinning) spinning = 1, s->takeover++, spinUntil = monoUs() + TAKEOVER_SPIN_US;
      pthread_mutex_unlock(&s->lock);
      sched_yield();
      pthread_mutex_lock(&s->lock);
      continue;
    }
    if (spinning) { /* the running task is long: leave the queue to the worker again */
      spinning = 0;
      runInline = 0;
      if (--s->takeover == 0 && s->head && !s->running && s->workerAsleep) pthread_cond_signal(&s->workCond);
    }
    if (ticket < s->wakeAt) s->wakeAt = ticket;
    condWaitReporting(&s->doneCond, &s->lock, &w);
  }
  if (spinning) s->takeover--;
  /* Work queued after the ticket, or a destroy that found the worker waiting behind us. */
  if (s->workerAsleep && !s->takeover && ((s->head && !s->running) || s->stopping))
    pthread_cond_signal(&s->workCond);
  s->doneWaiters--;
  if (s->stopping && s->doneWaiters == 0) pthread_cond_broadcast(&s->doneCond);
}

NCCLX_API ncclxResult_t ncclxStreamDestroy(ncclxStream_t stream) {
  if (!stream) return ncclxSetError(ncclxInvalidArgument, "ncclxStreamDestroy: stream is NULL");
  pthread_rwlock_wrlock(&registryLock);
  struct ncclxStream* s = findStream(stream);
  if (s && runningOn == s) {
    pthread_rwlock_unlock(&registryLock);
    return ncclxSetError(ncclxInvalidUsage,
                         "ncclxStreamDestroy: called from a task running on stream %p itself", stream);
  }
  if (s) registryRemove(&liveStreams, &s->live);
  pthread_rwlock_unlock(&registryLock);
  if (!s) return badStream("ncclxStreamDestroy", stream);
  void (*hook)(ncclxStream_t) = __atomic_load_n(&destroyHook, __ATOMIC_ACQUIRE);
  if (hook) hook(stream); /* the CUDA binding of a stream from ncclxStreamFromCuda goes */

  /* Unregistered: no new work can arrive. Let queued work finish, then stop the worker. */
  pthread_mutex_lock(&s->lock);
  s->stopping = 1;
  if (s->workerAsleep) pthread_cond_signal(&s->workCond);
  waitCompleted(s, s->enqueued, "ncclxStreamDestroy: stream", 0);
  pthread_mutex_unlock(&s->lock);
  pthread_join(s->thread, NULL);

  /* A thread still inside ncclxStreamSynchronize must leave before the memory goes. */
  pthread_mutex_lock(&s->lock);
  while (s->doneWaiters > 0) pthread_cond_wait(&s->doneCond, &s->lock);
  pthread_mutex_unlock(&s->lock);
  if (s->error != ncclxSuccess)
    WARN("ncclxStreamDestroy: stream %p had an unreported error: %s", stream, s->errorText);

  s->live.magic = DEAD_MAGIC;
  pthread_cond_destroy(&s->doneCond);
  pthread_cond_destroy(&s->workCond);
  pthread_mutex_destroy(&s->lock);
  free(s);
  return ncclxSuccess;
}

NCCLX_API ncclxResult_t ncclxStreamSynchronize(ncclxStream_t stream) {
  if (!stream) return ncclxSuccess; /* work on the NULL stream ran synchronously */
  pthread_rwlock_rdlock(&registryLock);
  struct ncclxStream* s = findStream(stream);
  if (!s) {
    pthread_rwlock_unlock(&registryLock);
    return badStream("ncclxStreamSynchronize", stream);
  }
  if (runningOn == s) {
    pthread_rwlock_unlock(&registryLock);
    return ncclxSetError(ncclxInvalidUsage,
                         "ncclxStreamSynchronize: called from a task running on stream %p itself "
                         "(it would wait for itself)", stream);
  }
  pthread_mutex_lock(&s->lock);
  /* Holding s->lock, s outlives the registry lock: destroy waits for doneWaiters. */
  pthread_rwlock_unlock(&registryLock);
  /* Not inside a group: a host function run here would have its ncclx calls grouped. */
  waitCompleted(s, s->enqueued, "ncclxStreamSynchronize: stream", threadGroupDepth == 0);
  ncclxResult_t res = s->error;
  char text[ERROR_TEXT_MAX];
  if (res != ncclxSuccess) {
    memcpy(text, s->errorText, sizeof(text));
    s->error = ncclxSuccess;
    s->errorText[0] = '\0';
  }
  pthread_mutex_unlock(&s->lock);
  if (res != ncclxSuccess) return ncclxSetError(res, "%s", text);
  return ncclxSuccess;
}

NCCLX_API ncclxResult_t ncclxStreamQuery(ncclxStream_t stream) {
  if (!stream) return ncclxSuccess;
  pthread_rwlock_rdlock(&registryLock);
  struct ncclxStream* s = findStream(stream);
  if (!s) {
    pthread_rwlock_unlock(&registryLock);
    return badStream("ncclxStreamQuery", stream);
  }
  pthread_mutex_lock(&s->lock);
  int idle = s->completed == s->enqueued;
  pthread_mutex_unlock(&s->lock);
  pthread_rwlock_unlock(&registryLock);
  return idle ? ncclxSuccess : ncclxInProgress;
}

NCCLX_API ncclxResult_t ncclxLaunchHostFunc(ncclxStream_t stream, ncclxHostFn_t fn, void* userData) {
  if (!fn) return ncclxSetError(ncclxInvalidArgument, "ncclxLaunchHostFunc: fn is NULL");
  if (!stream) {
    fn(userData);
    return ncclxSuccess;
  }
  struct hostFnTask* t = calloc(1, sizeof(*t));
  if (!t) return ncclxSetError(ncclxSystemError, "ncclxLaunchHostFunc: out of memory");
  t->base.run = hostFnRun;
  t->base.release = hostFnRelease;
  t->fn = fn;
  t->userData = userData;
  return enqueueChecked(stream, &t->base, "ncclxLaunchHostFunc");
}

