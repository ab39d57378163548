/* ncclxStreamSynchronize runs queued work on the synchronizing thread when no task is
 * running (core/src/stream.c): the dynamic MoE path relies on it to avoid a hand-off to the
 * stream's worker and back. Checks, in one process:
 *   - tasks still run exactly once and in queue order, whichever thread runs them, with
 *     several threads synchronizing while another one queues;
 *   - with the process on one CPU, most tasks queued just before a synchronize run on the
 *     synchronizing thread (the worker, SCHED_BATCH, does not preempt it);
 *   - a task run that way still counts as "on the stream": synchronizing or destroying its
 *     own stream, or waiting for an event recorded later on it, is refused, not a hang;
 *   - a failing task's error is reported by that synchronize, once;
 *   - work queued by a task behind the synchronize's ticket is left to the worker and runs.
 * Linked with the internal archive (streamEnqueue for a failing task). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "util/debug.h"
#include "ncclx.h"
#include "exec/stream.h"

static int failures;
#define CHECK(cond)                                                  \
  do {                                                               \
    if (!(cond)) {                                                   \
      fprintf(stderr, "FAIL %s:%d: %s\n", __FILE__, __LINE__, #cond); \
      failures++;                                                    \
    }                                                                \
  } while (0)
#define CHECK_RES(call, want)                                                                  \
  do {                                                                                         \
    ncclxResult_t r_ = (call);                                                                 \
    if (r_ != (want)) {                                                                        \
      fprintf(stderr, "FAIL %s:%d: %s returned %d, expected %d (%s)\n", __FILE__, __LINE__, #call, \
              (int)r_, (int)(want), ncclxThreadLastError());                                   \
      failures++;                                                                              \
    }                                                                                          \
  } while (0)

static double nowSec(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---- order and exactly-once with concurrent synchronizers ---- */

#define ORDER_TASKS 20000
#define SYNCERS 3
static int seen[ORDER_TASKS];
static atomic_int nextExpected;
static atomic_int outOfOrder;
static atomic_int producerDone;

static void orderFn(void* arg) {
  int id = (int)(size_t)arg;
  /* One task at a time: a plain read-modify-write would be a race if two ran at once. */
  if (atomic_load(&nextExpected) != id) atomic_fetch_add(&outOfOrder, 1);
  atomic_store(&nextExpected, id + 1);
  seen[id]++;
}

static void* syncer(void* arg) {
  ncclxStream_t s = arg;
  while (!atomic_load(&producerDone)) {
    if (ncclxStreamSynchronize(s) != ncclxSuccess) failures++;
    sched_yield();
  }
  return NULL;
}

static void testOrderConcurrent(void) {
  ncclxStream_t s;
  CHECK_RES(ncclxStreamCreate(&s), ncclxSuccess);
  pthread_t th[SYNCERS];
  for (int i = 0; i < SYNCERS; i++) CHECK(pthread_create(&th[i], NULL, syncer, s) == 0);
  for (int i = 0; i < ORDER_TASKS; i++) {
    CHECK_RES(ncclxLaunchHostFunc(s, orderFn, (void*)(size_t)i), ncclxSuccess);
    if (i % 7 == 0) CHECK_RES(ncclxStreamSynchronize(s), ncclxSuccess);
  }
  atomic_store(&producerDone, 1);
  for (int i = 0; i < SYNCERS; i++) pthread_join(th[i], NULL);
  CHECK_RES(ncclxStreamSynchronize(s), ncclxSuccess);
  int once = 1;
  for (int i = 0; i < ORDER_TASKS; i++) once &= seen[i] == 1;
  CHECK(once);
  CHECK(atomic_load(&outOfOrder) == 0);
  CHECK(atomic_load(&nextExpected) == ORDER_TASKS);
  CHECK_RES(ncclxStreamDestroy(s), ncclxSuccess);
}

/* ---- who runs queued work ---- */

struct whoRan {
  pthread_t caller;
  int onCaller, total;
};

static void whoFn(void* arg) {
  struct whoRan* w = arg;
  w->total++;
  w->onCaller += pthread_equal(pthread_self(), w->caller) != 0;
}

static void testRunsOnSynchronizer(void) {
  ncclxStream_t s;
  CHECK_RES(ncclxStreamCreate(&s), ncclxSuccess);
  struct whoRan w = {.caller = pthread_self()};
  for (int i = 0; i < 400; i++) {
    for (int k = 0; k < 4; k++) CHECK_RES(ncclxLaunchHostFunc(s, whoFn, &w), ncclxSuccess);
    CHECK_RES(ncclxStreamSynchronize(s), ncclxSuccess);
  }
  CHECK(w.total == 1600);
  printf("one CPU: %d of %d tasks ran on the synchronizing thread\n", w.onCaller, w.total);
  /* Not all: a timer tick may let the worker in first. Most, or the hand-off is back;
   * unless this system refuses SCHED_BATCH (the worker then preempts the caller). */
  struct sched_param keep, batch = {0};
  int policy;
  pthread_getschedparam(pthread_self(), &policy, &keep);
  int batchOk = pthread_setschedparam(pthread_self(), SCHED_BATCH, &batch) == 0;
  pthread_setschedparam(pthread_self(), policy, &keep);
  if (batchOk) CHECK(w.onCaller >= w.total / 4);
  else printf("SCHED_BATCH refused here: not checking who ran them\n");
  CHECK_RES(ncclxStreamDestroy(s), ncclxSuccess);
}

/* ---- self-waits refused from a task, whichever thread runs it ---- */

struct selfCall {
  ncclxStream_t stream;
  ncclxEvent_t event;
  ncclxResult_t syncRes, destroyRes, eventSyncRes, otherSyncRes;
  ncclxStream_t other;
  atomic_int otherRan;
};

static void otherFn(void* arg) { atomic_fetch_add(&((struct selfCall*)arg)->otherRan, 1); }

static void selfCallFn(void* arg) {
  struct selfCall* sc = arg;
  sc->syncRes = ncclxStreamSynchronize(sc->stream);
  sc->destroyRes = ncclxStreamDestroy(sc->stream);
  sc->eventSyncRes = ncclxEventSynchronize(sc->event);
  /* Another stream may be synchronized (and its work run here) from a task. */
  if (ncclxLaunchHostFunc(sc->other, otherFn, sc) == ncclxSuccess) sc->otherSyncRes = ncclxStreamSynchronize(sc->other);
}

static void testSelfCalls(void) {
  for (int round = 0; round < 10; round++) {
    struct selfCall sc = {.syncRes = ncclxSuccess};
    CHECK_RES(ncclxStreamCreate(&sc.stream), ncclxSuccess);
    CHECK_RES(ncclxStreamCreate(&sc.other), ncclxSuccess);
    CHECK_RES(ncclxEventCreate(&sc.event), ncclxSuccess);
    CHECK_RES(ncclxLaunchHostFunc(sc.stream, selfCallFn, &sc), ncclxSuccess);
    CHECK_RES(ncclxEventRecord(sc.event, sc.stream), ncclxSuccess);
    CHECK_RES(ncclxStreamSynchronize(sc.stream), ncclxSuccess);
    CHECK(sc.syncRes == ncclxInvalidUsage);
    CHECK(sc.destroyRes == ncclxInvalidUsage);
    CHECK(sc.eventSyncRes == ncclxInvalidUsage);
    CHECK(sc.otherSyncRes == ncclxSuccess);
    CHECK(atomic_load(&sc.otherRan) == 1);
    CHECK_RES(ncclxEventSynchronize(sc.event), ncclxSuccess);
    CHECK_RES(ncclxEventDestroy(sc.event), ncclxSuccess);
    CHECK_RES(ncclxStreamDestroy(sc.other), ncclxSuccess);
    CHECK_RES(ncclxStreamDestroy(sc.stream), ncclxSuccess);
    if (failures) return;
  }
}

/* ---- errors ---- */

static ncclxResult_t failRun(ncclxTask* t) {
  (void)t;
  return ncclxSetError(ncclxInternalError, "inline-test: task %d failed on purpose", 7);
}
static void freeTask(ncclxTask* t) { free(t); }
static void countFn(void* arg) { atomic_fetch_add((atomic_int*)arg, 1); }

static void testErrors(void) {
  ncclxStream_t s;
  CHECK_RES(ncclxStreamCreate(&s), ncclxSuccess);
  for (int round = 0; round < 5; round++) {
    ncclxTask* t = calloc(1, sizeof(*t));
    t->run = failRun;
    t->release = freeTask;
    CHECK_RES(streamEnqueue(s, t), ncclxSuccess);
    atomic_int ran = 0; /* later tasks still run after a failure */
    CHECK_RES(ncclxLaunchHostFunc(s, countFn, &ran), ncclxSuccess);
    CHECK_RES(ncclxStreamSynchronize(s), ncclxInternalError);
    CHECK(atomic_load(&ran) == 1);
    CHECK(strstr(ncclxThreadLastError(), "failed on purpose") != NULL);
    CHECK_RES(ncclxStreamSynchronize(s), ncclxSuccess); /* reported once */
  }
  CHECK_RES(ncclxStreamDestroy(s), ncclxSuccess);
}

/* ---- work queued by a task behind the ticket ---- */

struct chain {
  ncclxStream_t s;
  atomic_int second;
};

static void secondFn(void* arg) { atomic_store(&((struct chain*)arg)->second, 1); }
static void firstFn(void* arg) {
  struct chain* c = arg;
  if (ncclxLaunchHostFunc(c->s, secondFn, c) != ncclxSuccess) failures++;
}

static void testQueuedBehindTicket(void) {
  ncclxStream_t s;
  CHECK_RES(ncclxStreamCreate(&s), ncclxSuccess);
  for (int round = 0; round < 50; round++) {
    struct chain c = {.s = s};
    CHECK_RES(ncclxLaunchHostFunc(s, firstFn, &c), ncclxSuccess);
    CHECK_RES(ncclxStreamSynchronize(s), ncclxSuccess);
    /* The second task is not covered by that synchronize: the worker must run it. */
    double deadline = nowSec() + 10;
    while (!atomic_load(&c.second) && nowSec() < deadline) {
      struct timespec nap = {0, 100000};
      nanosleep(&nap, NULL);
    }
    CHECK(atomic_load(&c.second) == 1);
    if (failures) break;
  }
  CHECK_RES(ncclxStreamDestroy(s), ncclxSuccess);
}

int main(void) {
  testOrderConcurrent();
  testSelfCalls();
  testQueuedBehindTicket();
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(sched_getcpu() >= 0 ? sched_getcpu() : 0, &one);
  if (sched_setaffinity(0, sizeof(one), &one) == 0) testRunsOnSynchronizer();
  else printf("skipped the one-CPU check: sched_setaffinity failed\n");
  testErrors();
  if (failures) fprintf(stderr, "%d check(s) failed\n", failures);
  else printf("stream inline synchronize: all checks passed\n");
  return failures ? 1 : 0;
}
