/* CommFuse flows: ring and pairwise steps progressed by the computing thread between its
 * pieces of work (see commfuse_flow.h). */
#include "commfuse_flow.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "commfuse_trace.h"

double fuseNow(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void fuseSleepUntil(double t) {
  struct timespec ts;
  ts.tv_sec = (time_t)t;
  ts.tv_nsec = (long)((t - (double)ts.tv_sec) * 1e9);
  if (ts.tv_nsec >= 1000000000L) ts.tv_sec++, ts.tv_nsec -= 1000000000L;
  while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR) {
  }
}

double fuseLinkStamp(fuseOp* f, int peer, size_t bytes) {
  double start = fuseNow();
  if (f->linkEnd && f->linkEnd[peer] > start) start = f->linkEnd[peer];
  double end = start + (double)bytes / f->sched.linkBytesPerSec;
  if (f->linkEnd) f->linkEnd[peer] = end;
  return end;
}

void fuseFlowStep0(fuseFlowStep* s) {
  memset(s, 0, sizeof(*s));
  s->send.peer = s->recv.peer = -1;
  s->sendAfterRecv = s->recvAfterSend = -1;
}

ncclxResult_t fuseFlowInit(fuseFlow* w, fuseOp* f, int nsteps) {
  memset(w, 0, sizeof(*w));
  w->f = f;
  w->n = nsteps;
  w->steps = calloc((size_t)(nsteps > 0 ? nsteps : 1), sizeof(*w->steps));
  if (!w->steps)
    return fuseCore->fail(f->comm, ncclxSystemError, "%s #%llu: out of memory for %d steps", f->name,
                    (unsigned long long)f->seq, nsteps);
  for (int k = 0; k < nsteps; k++) fuseFlowStep0(&w->steps[k]);
  return ncclxSuccess;
}

static int emulated(const fuseFlow* w) { return w->f->sched.linkBytesPerSec > 0; }

static ncclxResult_t postHalf(fuseFlow* w, fuseHalf* h, int isSend) {
  fuseOp* f = w->f;
  int nx = 0;
  memset(h->x, 0, sizeof(h->x));
  if (emulated(w)) {
    if (isSend) h->stamp = fuseLinkStamp(f, h->peer, h->bytes);
    h->x[nx++] = (fuseXfer){.peer = h->peer, .isSend = isSend, .buf = &h->stamp, .bytes = sizeof(h->stamp)};
  }
  h->x[nx++] = (fuseXfer){.peer = h->peer, .isSend = isSend, .buf = h->buf, .bytes = h->bytes};
  h->state = 1;
  return fuseCore->stepStart(f->comm, h->x, nx, &h->run);
}

/* A half whose transfers are done: complete once its link time has passed. */
static ncclxResult_t completeHalf(fuseFlow* w, int k, int isSend) {
  fuseFlowStep* s = &w->steps[k];
  fuseHalf* h = isSend ? &s->send : &s->recv;
  ncclxResult_t res = fuseCore->stepEnd(h->run, ncclxSuccess);
  h->run = NULL;
  h->state = 2;
  NCCLX_CHECK(res);
  if (isSend) {
    w->sendsDone++;
  } else {
    if (s->redDst)
      fuseCore->reduce(s->redDst, s->redA, h->buf, s->redElems, w->f->type, w->f->op);
    w->recvsOut--;
    w->recvsDone++;
  }
  FUSE_TRACE(isSend ? "f.sent" : "f.recvd", k, 0);
  return ncclxSuccess;
}

static int halfDone(const fuseFlow* w, int k, int isSend) {
  if (k < 0) return 1;
  const fuseHalf* h = isSend ? &w->steps[k].send : &w->steps[k].recv;
  return h->peer < 0 || h->state == 2;
}

static ncclxResult_t postReady(fuseFlow* w) {
  while (w->nextRecv < w->n) {
    fuseFlowStep* s = &w->steps[w->nextRecv];
    if (s->recv.peer >= 0) {
      if (s->recv.held || w->recvsOut >= FLOW_RECV_WINDOW || !halfDone(w, s->recvAfterSend, 1)) break;
      w->recvsOut++;
      FUSE_TRACE("f.postrecv", w->nextRecv, 0);
      NCCLX_CHECK(postHalf(w, &s->recv, 0));
    }
    w->nextRecv++;
  }
  while (w->nextSend < w->n) {
    fuseFlowStep* s = &w->steps[w->nextSend];
    if (s->send.peer >= 0) {
      if (s->send.held || !halfDone(w, s->sendAfterRecv, 0)) break;
      FUSE_TRACE("f.postsend", w->nextSend, 0);
      NCCLX_CHECK(postHalf(w, &s->send, 1));
    }
    w->nextSend++;
  }
  return ncclxSuccess;
}

/* Test every half in flight; *progress: something completed or moved; *wakeAt: the
 * earliest link time a finished transfer still waits for (0: none). */
static ncclxResult_t testAll(fuseFlow* w, int* progress, double* wakeAt) {
  double now = 0;
  *wakeAt = 0;
  for (int k = 0; k < w->n; k++) {
    if (k >= w->nextSend && k >= w->nextRecv) break;
    for (int isSend = 0; isSend < 2; isSend++) {
      fuseHalf* h = isSend ? &w->steps[k].send : &w->steps[k].recv;
      if (h->state != 1) continue;
      int moved = 0;
      if (fuseCore->stepPending(h->run)) NCCLX_CHECK(fuseCore->stepTest(h->run, &moved));
      *progress |= moved;
      if (fuseCore->stepPending(h->run)) continue;
      if (emulated(w)) {
        if (now == 0) now = fuseNow();
        if (now < h->stamp) {
          if (*wakeAt == 0 || h->stamp < *wakeAt) *wakeAt = h->stamp;
          continue;
        }
      }
      NCCLX_CHECK(completeHalf(w, k, isSend));
      *progress = 1;
    }
  }
  return ncclxSuccess;
}

/* Connect every peer of the flow at once, as one step would: lazy connects
 * need both directions of a pair in progress together, and a flow posts halves apart. */
static ncclxResult_t connectAll(fuseFlow* w) {
  int* peers = malloc(sizeof(int) * (size_t)(2 * w->n + 2));
  if (!peers) return fuseCore->fail(w->f->comm, ncclxSystemError, "%s: out of memory", w->f->name);
  int ns = 0, nr = 0;
  for (int k = 0; k < w->n; k++) {
    int sp = w->steps[k].send.peer, rp = w->steps[k].recv.peer, seen = 0;
    for (int i = 0; i < ns; i++) seen |= peers[i] == sp;
    if (sp >= 0 && !seen) peers[ns++] = sp;
    seen = 0;
    for (int i = 0; i < nr; i++) seen |= peers[w->n + 1 + i] == rp;
    if (rp >= 0 && !seen) peers[w->n + 1 + nr++] = rp;
  }
  ncclxResult_t res = fuseCore->connect(w->f->comm, peers, ns, peers + w->n + 1, nr);
  free(peers);
  return res;
}

ncclxResult_t fuseFlowStart(fuseFlow* w) {
  NCCLX_CHECK(connectAll(w));
  return postReady(w);
}

ncclxResult_t fuseFlowPump(fuseFlow* w) {
  int progress = 0;
  double wakeAt;
  NCCLX_CHECK(testAll(w, &progress, &wakeAt));
  return postReady(w);
}

void fuseFlowRelease(fuseFlow* w, int step, int isSend) {
  if (step < 0 || step >= w->n) return;
  if (isSend) w->steps[step].send.held = 0;
  else w->steps[step].recv.held = 0;
}

int fuseFlowDone(const fuseFlow* w, int step, int isSend) { return halfDone(w, step, isSend); }

static int targetDone(const fuseFlow* w, int step, int isSend) {
  if (step < 0) {
    for (int k = 0; k < w->n; k++)
      if (!halfDone(w, k, 0) || !halfDone(w, k, 1)) return 0;
    return 1;
  }
  return halfDone(w, step, isSend);
}

/* The run a waiter idles on: the target's, else the first in flight. */
static ncclxModuleStep_t* idleRun(fuseFlow* w, int step, int isSend) {
  if (step >= 0) {
    fuseHalf* h = isSend ? &w->steps[step].send : &w->steps[step].recv;
    if (h->state == 1 && fuseCore->stepPending(h->run)) return h->run;
  }
  for (int k = 0; k < w->n; k++)
    for (int s = 0; s < 2; s++) {
      fuseHalf* h = s ? &w->steps[k].send : &w->steps[k].recv;
      if (h->state == 1 && fuseCore->stepPending(h->run)) return h->run;
    }
  return NULL;
}

ncclxResult_t fuseFlowWait(fuseFlow* w, int step, int isSend) {
  FUSE_TRACE("f.wait", step, isSend);
  for (;;) {
    int progress = 0;
    double wakeAt;
    NCCLX_CHECK(testAll(w, &progress, &wakeAt));
    NCCLX_CHECK(postReady(w));
    if (targetDone(w, step, isSend)) break;
    if (progress) continue;
    ncclxModuleStep_t* run = idleRun(w, step, isSend);
    if (run) {
      NCCLX_CHECK(fuseCore->stepIdle(run));
    } else if (wakeAt > 0) {
      fuseSleepUntil(wakeAt); /* only the emulated link's time is left: no CPU */
    } else {
      /* Nothing in flight and nothing to post: a dependency the caller must release. */
      return fuseCore->setError(ncclxInternalError, "%s #%llu: step %d waits for a half that was never released",
                           w->f->name, (unsigned long long)w->f->seq, step);
    }
    if (fuseCore->aborted(w->f->comm)) {
      ncclxResult_t res = fuseCore->checkHealth(w->f->comm);
      return res != ncclxSuccess ? res : fuseCore->setError(ncclxInvalidUsage, "%s #%llu: aborted", w->f->name,
                                                       (unsigned long long)w->f->seq);
    }
  }
  FUSE_TRACE("f.waited", step, isSend);
  return ncclxSuccess;
}

ncclxResult_t fuseFlowEnd(fuseFlow* w, ncclxResult_t res) {
  if (res == ncclxSuccess && w->steps) res = fuseFlowWait(w, -1, -1);
  for (int k = 0; w->steps && k < w->n; k++)
    for (int s = 0; s < 2; s++) {
      fuseHalf* h = s ? &w->steps[k].send : &w->steps[k].recv;
      if (h->state == 1) {
        ncclxResult_t r = fuseCore->stepEnd(h->run, res); /* after an error: keep ours */
        h->run = NULL;
        if (res == ncclxSuccess) res = r;
        h->state = 2;
      }
    }
  free(w->steps);
  w->steps = NULL;
  return res;
}
