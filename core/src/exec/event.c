/* CPU events. An event record is a "mark" task queued on a stream: the event is complete when
 * the stream reaches it. Waiters hold a reference to the mark they wait for (not to the
 * event), so re-recording or destroying the event never disturbs them, and a mark that is
 * freed without running completes anyway, so no waiter can hang on it. */
#include <pthread.h>
#include <stdlib.h>

#include "exec/stream_internal.h"
#include "util/debug.h"

#define NCCLX_API __attribute__((visibility("default")))

#define EVENT_MAGIC 0x6e63636c78657674ull /* "ncclxevt" */

/* One record of an event. Reference-counted: the event's latest record, its queued marker
 * task and every waiter each hold one. */
struct eventMark {
  pthread_mutex_t lock;
  pthread_cond_t cond;
  int done;
  int refs;
  const struct ncclxStream* recorder; /* the stream the mark is queued on */
};

struct ncclxEvent {
  struct liveHandle live;
  pthread_mutex_t lock;
  struct eventMark* latest; /* NULL: never recorded or recorded on NULL stream: complete */
};

static struct liveHandle* liveEvents;

static struct ncclxEvent* findEvent(ncclxEvent_t event) {
  return (struct ncclxEvent*)registryFind(liveEvents, event, EVENT_MAGIC);
}

static ncclxResult_t badEvent(const char* caller, const void* event) {
  return ncclxSetError(ncclxInvalidArgument,
                       "%s: event %p is not a live ncclx event (destroyed or never created)",
                       caller, event);
}

/* ---- event marks ---- */

static struct eventMark* markCreate(int refs) {
  struct eventMark* m = calloc(1, sizeof(*m));
  if (!m) return NULL;
  if (pthread_mutex_init(&m->lock, NULL) != 0) {
    free(m);
    return NULL;
  }
  if (condInitMonotonic(&m->cond) != 0) {
    pthread_mutex_destroy(&m->lock);
    free(m);
    return NULL;
  }
  m->refs = refs;
  return m;
}

static void markRetain(struct eventMark* m) {
  pthread_mutex_lock(&m->lock);
  m->refs++;
  pthread_mutex_unlock(&m->lock);
}

/* The count is under the mutex (not an atomic) so the last holder's free is ordered after
 * every other holder's use in a way race checkers such as helgrind can see. */
static void markRelease(struct eventMark* m) {
  if (!m) return;
  pthread_mutex_lock(&m->lock);
  int last = --m->refs == 0;
  pthread_mutex_unlock(&m->lock);
  if (!last) return;
  pthread_cond_destroy(&m->cond);
  pthread_mutex_destroy(&m->lock);
  free(m);
}

static void markComplete(struct eventMark* m) {
  pthread_mutex_lock(&m->lock);
  m->done = 1;
  pthread_cond_broadcast(&m->cond);
  pthread_mutex_unlock(&m->lock);
}

static int markIsDone(struct eventMark* m) {
  pthread_mutex_lock(&m->lock);
  int done = m->done;
  pthread_mutex_unlock(&m->lock);
  return done;
}

/* A task of the stream a mark is queued on must not wait for it: it would wait for itself. */
static ncclxResult_t markCheckNotSelf(struct eventMark* m, const char* caller, const void* event) {
  if (m->recorder != runningOn || !runningOn || markIsDone(m)) return ncclxSuccess;
  return ncclxSetError(ncclxInvalidUsage,
                       "%s: event %p is recorded later on the stream running this task "
                       "(it would wait for itself)", caller, event);
}

static void markWait(struct eventMark* m, const char* what, const void* object) {
  struct waitReport w;
  waitReportInit(&w, what, object);
  pthread_mutex_lock(&m->lock);
  while (!m->done) condWaitReporting(&m->cond, &m->lock, &w);
  pthread_mutex_unlock(&m->lock);
}

/* ---- mark tasks ---- */

struct markTask {
  ncclxTask base;
  struct eventMark* mark;
  const void* event; /* for messages only */
};

static ncclxResult_t recordRun(ncclxTask* t) {
  markComplete(((struct markTask*)t)->mark);
  return ncclxSuccess;
}

/* Completes the mark even if the task never ran, so waiters cannot hang on it. */
static void recordRelease(ncclxTask* t) {
  struct markTask* mt = (struct markTask*)t;
  markComplete(mt->mark);
  markRelease(mt->mark);
  free(mt);
}

static ncclxResult_t waitRun(ncclxTask* t) {
  struct markTask* mt = (struct markTask*)t;
  markWait(mt->mark, "stream waiting on event", mt->event);
  return ncclxSuccess;
}

static void waitRelease(ncclxTask* t) {
  struct markTask* mt = (struct markTask*)t;
  markRelease(mt->mark);
  free(mt);
}

static struct markTask* markTaskCreate(struct eventMark* mark, const void* event, int isRecord) {
  struct markTask* mt = calloc(1, sizeof(*mt));
  if (!mt) return NULL;
  mt->base.run = isRecord ? recordRun : waitRun;
  mt->base.release = isRecord ? recordRelease : waitRelease;
  mt->mark = mark;
  mt->event = event;
  return mt;
}

/* ---- public event API ---- */

NCCLX_API ncclxResult_t ncclxEventCreate(ncclxEvent_t* event) {
  if (!event) return ncclxSetError(ncclxInvalidArgument, "ncclxEventCreate: event pointer is NULL");
  *event = NULL;
  struct ncclxEvent* e = calloc(1, sizeof(*e));
  if (!e) return ncclxSetError(ncclxSystemError, "ncclxEventCreate: out of memory");
  if (pthread_mutex_init(&e->lock, NULL) != 0) {
    free(e);
    return ncclxSetError(ncclxSystemError, "ncclxEventCreate: cannot initialize a mutex");
  }
  e->live.magic = EVENT_MAGIC;
  pthread_rwlock_wrlock(&registryLock);
  registryAdd(&liveEvents, &e->live);
  pthread_rwlock_unlock(&registryLock);
  *event = e;
  return ncclxSuccess;
}

/* Replaces the event's latest record; the caller releases the returned old one. */
static struct eventMark* eventSwapLatest(struct ncclxEvent* e, struct eventMark* m) {
  pthread_mutex_lock(&e->lock);
  struct eventMark* old = e->latest;
  e->latest = m;
  pthread_mutex_unlock(&e->lock);
  return old;
}

/* The event's latest record with a reference held, or NULL (complete). Registry lock held. */
static struct eventMark* eventGetLatest(struct ncclxEvent* e) {
  pthread_mutex_lock(&e->lock);
  struct eventMark* m = e->latest;
  if (m) markRetain(m);
  pthread_mutex_unlock(&e->lock);
  return m;
}

NCCLX_API ncclxResult_t ncclxEventRecord(ncclxEvent_t event, ncclxStream_t stream) {
  if (!event) return ncclxSetError(ncclxInvalidArgument, "ncclxEventRecord: event is NULL");
  pthread_rwlock_rdlock(&registryLock);
  ncclxResult_t res = ncclxSuccess;
  struct ncclxEvent* e = findEvent(event);
  struct ncclxStream* s = stream ? findStream(stream) : NULL;
  if (!e) {
    res = badEvent("ncclxEventRecord", event);
  } else if (stream && !s) {
    res = badStream("ncclxEventRecord", stream);
  } else if (!s) { /* the NULL stream has nothing pending: complete at once */
    markRelease(eventSwapLatest(e, NULL));
  } else {
    struct eventMark* m = markCreate(2); /* the event's and the marker task's */
    if (m) m->recorder = s;
    struct markTask* t = m ? markTaskCreate(m, event, 1) : NULL;
    if (!t) {
      if (m) {
        markRelease(m);
        markRelease(m);
      }
      res = ncclxSetError(ncclxSystemError, "ncclxEventRecord: out of memory");
    } else {
      res = pushTask(s, &t->base, "ncclxEventRecord");
      /* On failure the task was released (mark completed): drop ours, keep the old record. */
      if (res == ncclxSuccess) markRelease(eventSwapLatest(e, m));
      else markRelease(m);
    }
  }
  pthread_rwlock_unlock(&registryLock);
  return res;
}

NCCLX_API ncclxResult_t ncclxEventSynchronize(ncclxEvent_t event) {
  if (!event) return ncclxSetError(ncclxInvalidArgument, "ncclxEventSynchronize: event is NULL");
  pthread_rwlock_rdlock(&registryLock);
  struct ncclxEvent* e = findEvent(event);
  struct eventMark* m = e ? eventGetLatest(e) : NULL;
  pthread_rwlock_unlock(&registryLock);
  if (!e) return badEvent("ncclxEventSynchronize", event);
  if (m) {
    ncclxResult_t res = markCheckNotSelf(m, "ncclxEventSynchronize", event);
    if (res != ncclxSuccess) {
      markRelease(m);
      return res;
    }
    markWait(m, "ncclxEventSynchronize: event", event);
    markRelease(m);
  }
  return ncclxSuccess;
}

NCCLX_API ncclxResult_t ncclxStreamWaitEvent(ncclxStream_t stream, ncclxEvent_t event) {
  if (!event) return ncclxSetError(ncclxInvalidArgument, "ncclxStreamWaitEvent: event is NULL");
  pthread_rwlock_rdlock(&registryLock);
  struct ncclxEvent* e = findEvent(event);
  struct ncclxStream* s = stream ? findStream(stream) : NULL;
  if (!e || (stream && !s)) {
    pthread_rwlock_unlock(&registryLock);
    return !e ? badEvent("ncclxStreamWaitEvent", event) : badStream("ncclxStreamWaitEvent", stream);
  }
  struct eventMark* m = eventGetLatest(e);
  ncclxResult_t res = ncclxSuccess;
  if (!m || markIsDone(m)) {
    markRelease(m); /* nothing to wait for */
  } else if (s) {
    struct markTask* t = markTaskCreate(m, event, 0); /* takes our reference */
    if (t) {
      res = pushTask(s, &t->base, "ncclxStreamWaitEvent");
    } else {
      markRelease(m);
      res = ncclxSetError(ncclxSystemError, "ncclxStreamWaitEvent: out of memory");
    }
  } else { /* NULL stream: later work runs on this thread, so wait here, unlocked */
    pthread_rwlock_unlock(&registryLock);
    res = markCheckNotSelf(m, "ncclxStreamWaitEvent", event);
    if (res == ncclxSuccess) markWait(m, "ncclxStreamWaitEvent: event", event);
    markRelease(m);
    return res;
  }
  pthread_rwlock_unlock(&registryLock);
  return res;
}

NCCLX_API ncclxResult_t ncclxEventDestroy(ncclxEvent_t event) {
  if (!event) return ncclxSetError(ncclxInvalidArgument, "ncclxEventDestroy: event is NULL");
  pthread_rwlock_wrlock(&registryLock);
  struct ncclxEvent* e = findEvent(event);
  if (e) registryRemove(&liveEvents, &e->live);
  pthread_rwlock_unlock(&registryLock);
  if (!e) return badEvent("ncclxEventDestroy", event);
  /* A pending record keeps its mark alive; only our reference goes. */
  markRelease(eventSwapLatest(e, NULL));
  e->live.magic = DEAD_MAGIC;
  pthread_mutex_destroy(&e->lock);
  free(e);
  return ncclxSuccess;
}
