/* CPU streams and events: ordering, query, error propagation, cross-stream events,
 * destroy with pending work, handle validation and concurrent enqueue. */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "util/debug.h"
#include "ncclx.h"
#include "exec/stream.h"

static int failures;

#define CHECK(cond)                                                    \
  do {                                                                 \
    if (!(cond)) {                                                     \
      fprintf(stderr, "FAIL %s:%d: %s\n", __FILE__, __LINE__, #cond);  \
      failures++;                                                      \
    }                                                                  \
  } while (0)

#define CHECK_RES(call, expected)                                                        \
  do {                                                                                   \
    ncclxResult_t res_ = (call);                                                         \
    if (res_ != (expected)) {                                                            \
      fprintf(stderr, "FAIL %s:%d: %s returned %d, expected %d (%s)\n", __FILE__, __LINE__, \
              #call, (int)res_, (int)(expected), ncclxThreadLastError());                \
      failures++;                                                                        \
    }                                                                                    \
  } while (0)

static void sleepMs(int ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

/* A gate a host function blocks on until the test opens it (bounded: 10 s). */
struct gate {
  pthread_mutex_t lock;
  pthread_cond_t cond;
  int open;
  int timedOut;
};

static void gateInit(struct gate* g) {
  pthread_mutex_init(&g->lock, NULL);
  pthread_cond_init(&g->cond, NULL);
  g->open = 0;
  g->timedOut = 0;
}

static void gateOpen(struct gate* g) {
  pthread_mutex_lock(&g->lock);
  g->open = 1;
  pthread_cond_broadcast(&g->cond);
  pthread_mutex_unlock(&g->lock);
}

static void gateWaitFn(void* arg) {
  struct gate* g = arg;
  struct timespec deadline;
  clock_gettime(CLOCK_REALTIME, &deadline);
  deadline.tv_sec += 10;
  pthread_mutex_lock(&g->lock);
  while (!g->open && !g->timedOut)
    if (pthread_cond_timedwait(&g->cond, &g->lock, &deadline) == ETIMEDOUT) g->timedOut = 1;
  pthread_mutex_unlock(&g->lock);
}

static void gateDestroy(struct gate* g) {
  CHECK(!g->timedOut);
  pthread_cond_destroy(&g->cond);
  pthread_mutex_destroy(&g->lock);
}

/* ---- ordering ---- */

#define ORDER_N 1000
struct orderLog {
  int seen[ORDER_N];
  int count;
};
struct orderItem {
  struct orderLog* log;
  int id;
};

static void orderFn(void* arg) {
  struct orderItem* it = arg;
  it->log->seen[it->log->count++] = it->id; /* only the stream's worker touches the log */
}

static void testOrdering(void) {
  ncclxStream_t s;
  CHECK_RES(ncclxStreamCreate(&s), ncclxSuccess);
  static struct orderLog log;
  static struct orderItem items[ORDER_N];
  for (int i = 0; i < ORDER_N; i++) {
    items[i].log = &log;
    items[i].id = i;
    CHECK_RES(ncclxLaunchHostFunc(s, orderFn, &items[i]), ncclxSuccess);
  }
  CHECK_RES(ncclxStreamSynchronize(s), ncclxSuccess);
  CHECK(log.count == ORDER_N);
  int inOrder = 1;
  for (int i = 0; i < ORDER_N; i++) inOrder &= log.seen[i] == i;
  CHECK(inOrder);
  CHECK_RES(ncclxStreamDestroy(s), ncclxSuccess);
}

/* ---- query ---- */

static void testQuery(void) {
  ncclxStream_t s;
  CHECK_RES(ncclxStreamCreate(&s), ncclxSuccess);
  CHECK_RES(ncclxStreamQuery(s), ncclxSuccess);
  struct gate g;
  gateInit(&g);
  CHECK_RES(ncclxLaunchHostFunc(s, gateWaitFn, &g), ncclxSuccess);
  CHECK_RES(ncclxStreamQuery(s), ncclxInProgress);
  gateOpen(&g);
  CHECK_RES(ncclxStreamSynchronize(s), ncclxSuccess);
  CHECK_RES(ncclxStreamQuery(s), ncclxSuccess);
  CHECK_RES(ncclxStreamDestroy(s), ncclxSuccess);
  gateDestroy(&g);
}

/* ---- errors ---- */

struct failTask {
  ncclxTask base;
  ncclxResult_t result;
  const char* text;
  atomic_int* released;
};

static ncclxResult_t failRun(ncclxTask* t) {
  struct failTask* ft = (struct failTask*)t;
  if (ft->text) return ncclxSetError(ft->result, "%s", ft->text);
  return ft->result;
}

static void failRelease(ncclxTask* t) {
  struct failTask* ft = (struct failTask*)t;
  atomic_fetch_add(ft->released, 1);
  free(ft);
}

static ncclxTask* newFailTask(ncclxResult_t result, const char* text, atomic_int* released) {
  struct failTask* ft = calloc(1, sizeof(*ft));
  ft->base.run = failRun;
  ft->base.release = failRelease;
  ft->result = result;
  ft->text = text;
  ft->released = released;
  return &ft->base;
}

static void incrementFn(void* arg) { atomic_fetch_add((atomic_int*)arg, 1); }

static void testErrors(void) {
  ncclxStream_t s;
  atomic_int released = 0, ran = 0;
  CHECK_RES(ncclxStreamCreate(&s), ncclxSuccess);
  CHECK_RES(streamEnqueue(s, newFailTask(ncclxRemoteError, "injected failure 42", &released)),
            ncclxSuccess);
  /* A second failure is not the one reported; work after a failure still runs. */
  CHECK_RES(streamEnqueue(s, newFailTask(ncclxSystemError, "second failure", &released)), ncclxSuccess);
  CHECK_RES(ncclxLaunchHostFunc(s, incrementFn, &ran), ncclxSuccess);
  ncclxClearThreadError();
  CHECK_RES(ncclxStreamSynchronize(s), ncclxRemoteError);
  CHECK(strstr(ncclxThreadLastError(), "injected failure 42") != NULL);
  CHECK(atomic_load(&released) == 2);
  CHECK(atomic_load(&ran) == 1);
  /* The error was reported once: the next synchronize is clean. */
  CHECK_RES(ncclxStreamSynchronize(s), ncclxSuccess);

  /* A failure without a message still gets one. */
  CHECK_RES(streamEnqueue(s, newFailTask(ncclxInternalError, NULL, &released)), ncclxSuccess);
  CHECK_RES(ncclxStreamSynchronize(s), ncclxInternalError);
  CHECK(ncclxThreadLastError()[0] != '\0');
  CHECK_RES(ncclxStreamDestroy(s), ncclxSuccess);

  /* NULL stream: the task runs now, on this thread, and its result comes straight back. */
  CHECK_RES(streamEnqueue(NULL, newFailTask(ncclxInvalidUsage, "inline", &released)), ncclxInvalidUsage);
  CHECK_RES(streamEnqueue(NULL, newFailTask(ncclxSuccess, NULL, &released)), ncclxSuccess);
  CHECK(atomic_load(&released) == 5);
}

/* ---- events ---- */

struct sideEffect {
  atomic_int value;
  atomic_int observed;
};

static void slowProduceFn(void* arg) {
  sleepMs(150);
  atomic_store(&((struct sideEffect*)arg)->value, 1);
}

static void observeFn(void* arg) {
  struct sideEffect* se = arg;
  atomic_store(&se->observed, atomic_load(&se->value));
}

static void testEventsAcrossStreams(void) {
  ncclxStream_t a, b;
  ncclxEvent_t ev;
  CHECK_RES(ncclxStreamCreate(&a), ncclxSuccess);
  CHECK_RES(ncclxStreamCreate(&b), ncclxSuccess);
  CHECK_RES(ncclxEventCreate(&ev), ncclxSuccess);
  struct sideEffect se = {0, -1};
  CHECK_RES(ncclxLaunchHostFunc(a, slowProduceFn, &se), ncclxSuccess);
  CHECK_RES(ncclxEventRecord(ev, a), ncclxSuccess);
  CHECK_RES(ncclxStreamWaitEvent(b, ev), ncclxSuccess);
  CHECK_RES(ncclxLaunchHostFunc(b, observeFn, &se), ncclxSuccess);
  CHECK_RES(ncclxStreamSynchronize(b), ncclxSuccess);
  CHECK(atomic_load(&se.observed) == 1);

  /* Waiting on a completed or never-recorded event costs nothing and blocks nothing. */
  ncclxEvent_t fresh;
  CHECK_RES(ncclxEventCreate(&fresh), ncclxSuccess);
  CHECK_RES(ncclxStreamWaitEvent(b, fresh), ncclxSuccess);
  CHECK_RES(ncclxStreamWaitEvent(b, ev), ncclxSuccess);
  CHECK_RES(ncclxStreamSynchronize(b), ncclxSuccess);
  CHECK_RES(ncclxEventDestroy(fresh), ncclxSuccess);

  /* The NULL stream waits right here. */
  atomic_store(&se.value, 0);
  CHECK_RES(ncclxLaunchHostFunc(a, slowProduceFn, &se), ncclxSuccess);
  CHECK_RES(ncclxEventRecord(ev, a), ncclxSuccess);
  CHECK_RES(ncclxStreamWaitEvent(NULL, ev), ncclxSuccess);
  CHECK(atomic_load(&se.value) == 1);

  CHECK_RES(ncclxEventDestroy(ev), ncclxSuccess);
  CHECK_RES(ncclxStreamDestroy(a), ncclxSuccess);
  CHECK_RES(ncclxStreamDestroy(b), ncclxSuccess);
}

static void testEventSynchronize(void) {
  ncclxStream_t a;
  ncclxEvent_t ev;
  CHECK_RES(ncclxStreamCreate(&a), ncclxSuccess);
  CHECK_RES(ncclxEventCreate(&ev), ncclxSuccess);
  CHECK_RES(ncclxEventSynchronize(ev), ncclxSuccess); /* never recorded: complete */

  struct sideEffect se = {0, -1};
  CHECK_RES(ncclxLaunchHostFunc(a, slowProduceFn, &se), ncclxSuccess);
  CHECK_RES(ncclxEventRecord(ev, a), ncclxSuccess);
  CHECK_RES(ncclxEventSynchronize(ev), ncclxSuccess);
  CHECK(atomic_load(&se.value) == 1);

  /* Re-recording: the wait is for the newest record, not the completed old one. */
  atomic_store(&se.value, 0);
  CHECK_RES(ncclxLaunchHostFunc(a, slowProduceFn, &se), ncclxSuccess);
  CHECK_RES(ncclxEventRecord(ev, a), ncclxSuccess);
  CHECK_RES(ncclxEventSynchronize(ev), ncclxSuccess);
  CHECK(atomic_load(&se.value) == 1);

  /* Recorded on the NULL stream: complete at once, even with the old record still pending. */
  struct gate g;
  gateInit(&g);
  CHECK_RES(ncclxLaunchHostFunc(a, gateWaitFn, &g), ncclxSuccess);
  CHECK_RES(ncclxEventRecord(ev, a), ncclxSuccess);
  CHECK_RES(ncclxEventRecord(ev, NULL), ncclxSuccess);
  CHECK_RES(ncclxEventSynchronize(ev), ncclxSuccess);
  CHECK_RES(ncclxStreamQuery(a), ncclxInProgress);
  gateOpen(&g);
  CHECK_RES(ncclxStreamSynchronize(a), ncclxSuccess);
  gateDestroy(&g);

  CHECK_RES(ncclxEventDestroy(ev), ncclxSuccess);
  CHECK_RES(ncclxStreamDestroy(a), ncclxSuccess);
}

/* ---- destroy ---- */

static void slowIncrementFn(void* arg) {
  sleepMs(2);
  atomic_fetch_add((atomic_int*)arg, 1);
}

static void testDestroyPending(void) {
  ncclxStream_t a, b;
  atomic_int count = 0;
  CHECK_RES(ncclxStreamCreate(&a), ncclxSuccess);
  for (int i = 0; i < 50; i++) CHECK_RES(ncclxLaunchHostFunc(a, slowIncrementFn, &count), ncclxSuccess);
  CHECK_RES(ncclxStreamDestroy(a), ncclxSuccess);
  CHECK(atomic_load(&count) == 50);

  /* Stream B waits on an event recorded on A; A is destroyed right away; the event's
   * user handle is destroyed too while its record is pending. B must still finish. */
  ncclxEvent_t ev, ev2;
  struct sideEffect se = {0, -1};
  CHECK_RES(ncclxStreamCreate(&a), ncclxSuccess);
  CHECK_RES(ncclxStreamCreate(&b), ncclxSuccess);
  CHECK_RES(ncclxEventCreate(&ev), ncclxSuccess);
  CHECK_RES(ncclxEventCreate(&ev2), ncclxSuccess);
  CHECK_RES(ncclxLaunchHostFunc(a, slowProduceFn, &se), ncclxSuccess);
  CHECK_RES(ncclxEventRecord(ev, a), ncclxSuccess);
  CHECK_RES(ncclxEventRecord(ev2, a), ncclxSuccess);
  CHECK_RES(ncclxStreamWaitEvent(b, ev), ncclxSuccess);
  CHECK_RES(ncclxLaunchHostFunc(b, observeFn, &se), ncclxSuccess);
  CHECK_RES(ncclxEventDestroy(ev), ncclxSuccess);
  CHECK_RES(ncclxStreamDestroy(a), ncclxSuccess);
  CHECK_RES(ncclxEventSynchronize(ev2), ncclxSuccess); /* its stream is gone: complete */
  CHECK_RES(ncclxStreamSynchronize(b), ncclxSuccess);
  CHECK(atomic_load(&se.observed) == 1);
  CHECK_RES(ncclxEventDestroy(ev2), ncclxSuccess);
  CHECK_RES(ncclxStreamDestroy(b), ncclxSuccess);
}

/* ---- calls from inside a stream's own task ---- */

struct selfCall {
  ncclxStream_t stream;
  ncclxEvent_t event;
  struct gate* gate;
  ncclxResult_t syncRes, destroyRes, eventSyncRes, waitRes;
};

/* Each of these would wait for itself: refused, not a hang. */
static void selfCallFn(void* arg) {
  struct selfCall* sc = arg;
  gateWaitFn(sc->gate); /* until the event is recorded behind this task */
  sc->syncRes = ncclxStreamSynchronize(sc->stream);
  sc->destroyRes = ncclxStreamDestroy(sc->stream);
  sc->eventSyncRes = ncclxEventSynchronize(sc->event);
  sc->waitRes = ncclxStreamWaitEvent(NULL, sc->event);
}

static void testSelfCalls(void) {
  struct gate g;
  gateInit(&g);
  struct selfCall sc = {NULL, NULL, &g, ncclxSuccess, ncclxSuccess, ncclxSuccess, ncclxSuccess};
  CHECK_RES(ncclxStreamCreate(&sc.stream), ncclxSuccess);
  CHECK_RES(ncclxEventCreate(&sc.event), ncclxSuccess);
  CHECK_RES(ncclxLaunchHostFunc(sc.stream, selfCallFn, &sc), ncclxSuccess);
  CHECK_RES(ncclxEventRecord(sc.event, sc.stream), ncclxSuccess);
  gateOpen(&g);
  CHECK_RES(ncclxStreamSynchronize(sc.stream), ncclxSuccess);
  CHECK(sc.syncRes == ncclxInvalidUsage);
  CHECK(sc.destroyRes == ncclxInvalidUsage);
  CHECK(sc.eventSyncRes == ncclxInvalidUsage);
  CHECK(sc.waitRes == ncclxInvalidUsage);
  CHECK_RES(ncclxEventSynchronize(sc.event), ncclxSuccess);
  CHECK_RES(ncclxEventDestroy(sc.event), ncclxSuccess);
  CHECK_RES(ncclxStreamDestroy(sc.stream), ncclxSuccess);
  gateDestroy(&g);
}

/* ---- handle validation ---- */

static void testBadHandles(void) {
  atomic_int ran = 0, released = 0;
  CHECK_RES(ncclxStreamCreate(NULL), ncclxInvalidArgument);
  CHECK_RES(ncclxEventCreate(NULL), ncclxInvalidArgument);
  CHECK_RES(ncclxStreamDestroy(NULL), ncclxInvalidArgument);
  CHECK(strstr(ncclxThreadLastError(), "ncclxStreamDestroy") != NULL);
  CHECK_RES(ncclxStreamSynchronize(NULL), ncclxSuccess);
  CHECK_RES(ncclxStreamQuery(NULL), ncclxSuccess);
  CHECK_RES(streamCheckHandle(NULL), ncclxSuccess);
  CHECK_RES(ncclxLaunchHostFunc(NULL, incrementFn, &ran), ncclxSuccess);
  CHECK(atomic_load(&ran) == 1); /* ran immediately on this thread */
  CHECK_RES(ncclxEventRecord(NULL, NULL), ncclxInvalidArgument);
  CHECK_RES(ncclxEventSynchronize(NULL), ncclxInvalidArgument);
  CHECK_RES(ncclxEventDestroy(NULL), ncclxInvalidArgument);
  CHECK_RES(ncclxStreamWaitEvent(NULL, NULL), ncclxInvalidArgument);
  CHECK_RES(streamEnqueue(NULL, NULL), ncclxInvalidArgument);

  ncclxStream_t s, dead;
  ncclxEvent_t ev, deadEv;
  CHECK_RES(ncclxStreamCreate(&s), ncclxSuccess);
  CHECK_RES(ncclxStreamCreate(&dead), ncclxSuccess);
  CHECK_RES(ncclxStreamDestroy(dead), ncclxSuccess);
  CHECK_RES(ncclxEventCreate(&ev), ncclxSuccess);
  CHECK_RES(ncclxEventCreate(&deadEv), ncclxSuccess);
  CHECK_RES(ncclxEventDestroy(deadEv), ncclxSuccess);
  CHECK_RES(ncclxLaunchHostFunc(s, NULL, NULL), ncclxInvalidArgument);

  /* Garbage: memory that was never a handle, including one of the other kind. */
  static char garbage[256];
  memset(garbage, 0x5a, sizeof(garbage));
  ncclxStream_t bogusStreams[] = {dead, (ncclxStream_t)garbage, (ncclxStream_t)(void*)ev};
  for (size_t i = 0; i < sizeof(bogusStreams) / sizeof(bogusStreams[0]); i++) {
    ncclxStream_t b = bogusStreams[i];
    ncclxClearThreadError();
    CHECK_RES(ncclxStreamSynchronize(b), ncclxInvalidArgument);
    CHECK(strstr(ncclxThreadLastError(), "not a live ncclx stream") != NULL);
    CHECK_RES(ncclxStreamQuery(b), ncclxInvalidArgument);
    CHECK_RES(ncclxStreamDestroy(b), ncclxInvalidArgument);
    CHECK_RES(ncclxLaunchHostFunc(b, incrementFn, &ran), ncclxInvalidArgument);
    CHECK_RES(streamCheckHandle(b), ncclxInvalidArgument);
    CHECK_RES(streamEnqueue(b, newFailTask(ncclxSuccess, NULL, &released)), ncclxInvalidArgument);
    CHECK_RES(ncclxEventRecord(ev, b), ncclxInvalidArgument);
    CHECK_RES(ncclxStreamWaitEvent(b, ev), ncclxInvalidArgument);
  }
  CHECK(atomic_load(&released) == 3); /* rejected tasks are released, not leaked */
  CHECK(atomic_load(&ran) == 1);

  ncclxEvent_t bogusEvents[] = {deadEv, (ncclxEvent_t)garbage, (ncclxEvent_t)(void*)s};
  for (size_t i = 0; i < sizeof(bogusEvents) / sizeof(bogusEvents[0]); i++) {
    ncclxEvent_t b = bogusEvents[i];
    ncclxClearThreadError();
    CHECK_RES(ncclxEventRecord(b, s), ncclxInvalidArgument);
    CHECK(strstr(ncclxThreadLastError(), "not a live ncclx event") != NULL);
    CHECK_RES(ncclxEventRecord(b, NULL), ncclxInvalidArgument);
    CHECK_RES(ncclxEventSynchronize(b), ncclxInvalidArgument);
    CHECK_RES(ncclxStreamWaitEvent(s, b), ncclxInvalidArgument);
    CHECK_RES(ncclxStreamWaitEvent(NULL, b), ncclxInvalidArgument);
    CHECK_RES(ncclxEventDestroy(b), ncclxInvalidArgument);
  }
  CHECK_RES(ncclxStreamSynchronize(s), ncclxSuccess); /* nothing bad reached the stream */
  CHECK_RES(ncclxEventDestroy(ev), ncclxSuccess);
  CHECK_RES(ncclxStreamDestroy(s), ncclxSuccess);
}

/* ---- concurrent enqueue ---- */

#define PRODUCERS 4
#define PER_PRODUCER 2500
struct producer {
  ncclxStream_t stream;
  int id;
  int next;       /* next sequence number expected by the worker */
  int outOfOrder; /* sequence numbers that arrived out of this producer's order */
  int seq[PER_PRODUCER];
  ncclxResult_t res;
};
struct producerItem {
  struct producer* p;
  int seq;
};

static void producerFn(void* arg) {
  struct producerItem* it = arg;
  if (it->seq != it->p->next) it->p->outOfOrder++;
  it->p->next = it->seq + 1;
}

static struct producerItem producerItems[PRODUCERS][PER_PRODUCER];

static void* producerThread(void* arg) {
  struct producer* p = arg;
  p->res = ncclxSuccess;
  for (int i = 0; i < PER_PRODUCER && p->res == ncclxSuccess; i++) {
    producerItems[p->id][i].p = p;
    producerItems[p->id][i].seq = i;
    p->res = ncclxLaunchHostFunc(p->stream, producerFn, &producerItems[p->id][i]);
  }
  return NULL;
}

static void testConcurrentEnqueue(void) {
  ncclxStream_t s;
  CHECK_RES(ncclxStreamCreate(&s), ncclxSuccess);
  static struct producer producers[PRODUCERS];
  pthread_t threads[PRODUCERS];
  for (int i = 0; i < PRODUCERS; i++) {
    producers[i].stream = s;
    producers[i].id = i;
    CHECK(pthread_create(&threads[i], NULL, producerThread, &producers[i]) == 0);
  }
  for (int i = 0; i < PRODUCERS; i++) pthread_join(threads[i], NULL);
  CHECK_RES(ncclxStreamSynchronize(s), ncclxSuccess);
  for (int i = 0; i < PRODUCERS; i++) {
    CHECK(producers[i].res == ncclxSuccess);
    CHECK(producers[i].next == PER_PRODUCER); /* every one of its tasks ran */
    CHECK(producers[i].outOfOrder == 0);      /* and in the order it queued them */
  }
  CHECK_RES(ncclxStreamQuery(s), ncclxSuccess);
  CHECK_RES(ncclxStreamDestroy(s), ncclxSuccess);
}

int main(void) {
  struct {
    const char* name;
    void (*fn)(void);
  } tests[] = {
      {"ordering", testOrdering},
      {"query", testQuery},
      {"errors", testErrors},
      {"events across streams", testEventsAcrossStreams},
      {"event synchronize", testEventSynchronize},
      {"destroy with pending work", testDestroyPending},
      {"calls from a stream's own task", testSelfCalls},
      {"bad handles", testBadHandles},
      {"concurrent enqueue", testConcurrentEnqueue},
  };
  for (size_t i = 0; i < sizeof(tests) / sizeof(tests[0]); i++) {
    int before = failures;
    tests[i].fn();
    printf("%s: %s\n", tests[i].name, failures == before ? "ok" : "FAILED");
  }
  return failures ? 1 : 0;
}
