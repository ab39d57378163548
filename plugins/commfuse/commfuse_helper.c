/* CommFuse progress helpers: pooled threads that run one job at a time, handed over and
 * collected with a condition-variable handshake. */
#include "commfuse_helper.h"
#include "commfuse_internal.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <time.h>


struct fuseHelper {
  pthread_mutex_t lock;
  pthread_cond_t wake; /* helper waits here for a job */
  pthread_cond_t done; /* caller waits here for the job's end */
  fuseJobFn fn;        /* the posted job, NULL once the helper took it */
  void* arg;
  int running;         /* posted and not yet finished */
  int busy;            /* posted and not yet waited for (caller's view) */
  ncclxResult_t res;
  char err[1024];
  struct fuseHelper* nextIdle;
};

static pthread_mutex_t poolLock = PTHREAD_MUTEX_INITIALIZER;
static struct fuseHelper* poolIdle;
static pthread_once_t poolOnce = PTHREAD_ONCE_INIT;

/* The threads do not survive fork: a child starts with an empty pool. The old helper
 * records stay allocated (a few hundred bytes each) because their locks may be held. */
static void poolAtForkChild(void) {
  pthread_mutex_init(&poolLock, NULL);
  poolIdle = NULL;
}

static void poolInit(void) { pthread_atfork(NULL, NULL, poolAtForkChild); }

static void* helperMain(void* arg) {
  struct fuseHelper* h = arg;
  /* The emulated link sleeps per step; the default 50 us timer slack would lengthen
   * every such sleep by up to that much. */
  (void)prctl(PR_SET_TIMERSLACK, 1UL, 0, 0, 0);
  pthread_mutex_lock(&h->lock);
  for (;;) {
    while (!h->fn) pthread_cond_wait(&h->wake, &h->lock);
    fuseJobFn fn = h->fn;
    void* jobArg = h->arg;
    h->fn = NULL;
    pthread_mutex_unlock(&h->lock);
    fuseCore->clearError();
    ncclxResult_t res = fn(jobArg);
    pthread_mutex_lock(&h->lock);
    h->res = res;
    snprintf(h->err, sizeof(h->err), "%s", res == ncclxSuccess ? "" : fuseCore->lastError());
    h->running = 0;
    pthread_cond_signal(&h->done);
  }
  return NULL;
}

static ncclxResult_t helperCreate(struct fuseHelper** out) {
  struct fuseHelper* h = calloc(1, sizeof(*h));
  if (!h) return fuseCore->setError(ncclxSystemError, "CommFuse: out of memory for a progress thread");
  pthread_mutex_init(&h->lock, NULL);
  pthread_cond_init(&h->wake, NULL);
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&h->done, &ca);
  pthread_condattr_destroy(&ca);
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
  pthread_t t;
  int rc = pthread_create(&t, &attr, helperMain, h);
  pthread_attr_destroy(&attr);
  if (rc != 0) {
    pthread_cond_destroy(&h->done);
    pthread_cond_destroy(&h->wake);
    pthread_mutex_destroy(&h->lock);
    free(h);
    return fuseCore->setError(ncclxSystemError, "CommFuse: cannot start a progress thread: %s",
                         strerror(rc));
  }
  *out = h;
  return ncclxSuccess;
}

ncclxResult_t fuseHelperAcquire(struct fuseHelper** out) {
  pthread_once(&poolOnce, poolInit);
  pthread_mutex_lock(&poolLock);
  struct fuseHelper* h = poolIdle;
  if (h) poolIdle = h->nextIdle;
  pthread_mutex_unlock(&poolLock);
  if (h) {
    *out = h;
    return ncclxSuccess;
  }
  return helperCreate(out);
}

void fuseHelperRelease(struct fuseHelper* h) {
  if (!h) return;
  pthread_mutex_lock(&poolLock);
  h->nextIdle = poolIdle;
  poolIdle = h;
  pthread_mutex_unlock(&poolLock);
}

void fuseHelperStart(struct fuseHelper* h, fuseJobFn fn, void* arg) {
  pthread_mutex_lock(&h->lock);
  h->fn = fn;
  h->arg = arg;
  h->running = 1;
  h->busy = 1;
  h->res = ncclxSuccess;
  h->err[0] = '\0';
  pthread_cond_signal(&h->wake);
  pthread_mutex_unlock(&h->lock);
}

int fuseHelperBusy(const struct fuseHelper* h) { return h && h->busy; }

ncclxResult_t fuseHelperWait(struct fuseHelper* h, double boundSec, char* err, size_t errSize) {
  if (!h->busy) return ncclxSuccess;
  struct timespec deadline;
  clock_gettime(CLOCK_MONOTONIC, &deadline);
  if (boundSec > 0) {
    deadline.tv_sec += (time_t)boundSec;
    deadline.tv_nsec += (long)((boundSec - (double)(time_t)boundSec) * 1e9);
    if (deadline.tv_nsec >= 1000000000L) deadline.tv_sec++, deadline.tv_nsec -= 1000000000L;
  }
  pthread_mutex_lock(&h->lock);
  while (h->running) {
    if (boundSec <= 0) {
      pthread_cond_wait(&h->done, &h->lock);
    } else if (pthread_cond_timedwait(&h->done, &h->lock, &deadline) == ETIMEDOUT && h->running) {
      pthread_mutex_unlock(&h->lock);
      return ncclxInProgress;
    }
  }
  ncclxResult_t res = h->res;
  if (res != ncclxSuccess && err && errSize) snprintf(err, errSize, "%s", h->err);
  h->busy = 0;
  pthread_mutex_unlock(&h->lock);
  return res;
}
