/* Send and receive comms: posting tagged messages, completing requests, noticing dead
 * peers, closing. Message k of a connection carries tag DATA|connId|k and its receive is
 * posted with exactly that tag, so it can land nowhere else. With several endpoints per
 * connection, message k travels between the two sides' endpoints k % neps (the receive is
 * posted there too); control, clear-to-send and probe messages use endpoint 0.
 *
 * Clear-to-send mode (d->clearToSend): a receive is posted, then announced to the sender
 * with its capacity on DATA|CTS|ctsId|k; the sender sends message k only after that
 * announcement, or sends a zero-byte refusal (DATA|REFUSE|connId|k) when the message does
 * not fit. The provider then never holds unexpected data messages nor sees a receive
 * smaller than its message (both break libfabric 1.17's shm provider), at the cost of one
 * small message per transfer, usually hidden because receives are posted ahead. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ofi_internal.h"
#include "ncclx/profiler.h"

static void destroyComm(ofiObj* obj) {
  ofiComm* c = (ofiComm*)obj;
  if (c->cmWaiting) c->obj.dev->cmBusy--;
  ofiMsgEpClose(c->obj.dev, c->ep);
  free(c);
}

ofiComm* ofiCommCreate(ofiDevice* d, uint32_t kind, const fi_addr_t* peers, int neps,
                       uint32_t connId, uint32_t ctsId, const ofiIdentity* peerId,
                       const char* peerName) {
  ofiComm* c = calloc(1, sizeof(*c));
  if (!c) return NULL;
  ofiObjInit(&c->obj, kind, d, destroyComm);
  c->peer = peers[0];
  c->neps = neps;
  for (int i = 0; i < neps; i++) c->dataPeer[i] = peers[i];
  c->connId = connId;
  c->ctsId = ctsId;
  c->peerId = *peerId;
  snprintf(c->peerName, sizeof(c->peerName), "%s", peerName);
  c->lastActivityNs = c->lastCheckNs = ofiNowNs();
  for (int i = 0; i < NCCLX_NET_MAX_REQUESTS; i++) c->reqs[i].comm = c;
  return c;
}

static int isComm(const void* comm, uint32_t kind) {
  return comm && ((const ofiObj*)comm)->kind == kind;
}

/* Cancel every operation of c that libfabric still holds (receives complete with
 * FI_ECANCELED; sends usually cannot be cancelled and complete on their own). */
static void commCancel(ofiComm* c) {
  ofiDevice* d = c->obj.dev;
  for (int i = 0; i < NCCLX_NET_MAX_REQUESTS; i++) {
    ofiCancel(d, &c->reqs[i].cop);
    ofiCancel(d, &c->reqs[i].op);
  }
  ofiCancel(d, &c->probe);
}

/* The first failure of a comm is sticky: later calls on it return the same error. */
static ncclxResult_t commFail(ofiComm* c, ncclxResult_t res, const char* fmt, ...)
    __attribute__((format(printf, 3, 4)));
static ncclxResult_t commFail(ofiComm* c, ncclxResult_t res, const char* fmt, ...) {
  if (c->err != ncclxSuccess) return c->err;
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof(msg), fmt, ap);
  va_end(ap);
  OFI_WARN(c->obj.dev->ctx, "%s %s (pid %u, connection %u on %s): %s",
           c->obj.kind == OFI_OBJ_SEND ? "send to" : "receive from", c->peerName, c->peerId.pid,
           c->connId, c->obj.dev->name, msg);
  c->err = res;
  commCancel(c);
  return res;
}

/* ------------------------------------------------------------------------------------------
 * Requests
 * ------------------------------------------------------------------------------------------ */

static ofiReq* reqOfCts(ofiOp* op) { return (ofiReq*)(void*)((char*)op - offsetof(ofiReq, cop)); }

static int reqBusy(const ofiReq* r) { return r->op.posted || r->cop.posted || r->deferred; }

static void deferredRemove(ofiDevice* d, ofiReq* r) {
  for (ofiReq** pp = &d->deferred; *pp; pp = &(*pp)->nextDeferred)
    if (*pp == r) {
      *pp = r->nextDeferred;
      break;
    }
  r->deferred = 0;
}

/* NET profiler events: one per request, from its post to its completion (the core's
 * callback drops them, at the cost of a call, while NET events are off). */
#define OFI_PROF_ID ((int64_t)0x4f4649) /* "OFI": the plugin id of these NET events */

static void profStart(ofiReq* r, void* phandle) {
  ncclxProfilerCallback_t prof = r->comm->obj.dev->ctx->profiler;
  r->profEvent = NULL;
  if (prof && prof(&r->profEvent, NCCLX_PROFILER_NET_START, phandle, OFI_PROF_ID, NULL) != ncclxSuccess)
    r->profEvent = NULL;
}

static void profStop(ofiReq* r) {
  if (!r->profEvent) return;
  r->comm->obj.dev->ctx->profiler(&r->profEvent, NCCLX_PROFILER_NET_STOP, NULL, OFI_PROF_ID, NULL);
  r->profEvent = NULL;
}

/* The request leaves POSTED for good (done, failed or given up by its caller). */
static void reqSettle(ofiReq* r, int state) {
  ofiComm* c = r->comm;
  profStop(r);
  if (r->state == OFI_REQ_POSTED) c->inflight--;
  if (r->deferred) deferredRemove(c->obj.dev, r);
  r->state = state;
  if (state == OFI_REQ_ABANDONED && !reqBusy(r)) state = r->state = OFI_REQ_FREE;
  if (state == OFI_REQ_FREE) r->magic = 0;
}

static void reqFail(ofiReq* r, ncclxResult_t res, const char* why) {
  ofiComm* c = r->comm;
  int send = c->obj.kind == OFI_OBJ_SEND;
  r->err = commFail(c, res, "%s of %zu bytes failed: %s", send ? "send" : "receive", r->size, why);
  reqSettle(r, OFI_REQ_FAILED);
}

/* An operation of r completed while r is no longer wanted: free the slot when idle. */
static int reqOrphaned(ofiReq* r) {
  if (r->state == OFI_REQ_POSTED && !r->comm->obj.released) return 0;
  if (r->state == OFI_REQ_ABANDONED && !reqBusy(r)) {
    r->state = OFI_REQ_FREE;
    r->magic = 0;
  }
  return 1;
}

static void msgDone(ofiOp* op, size_t len, int err, const char* msg);
static void ctsDone(ofiOp* op, size_t len, int err, const char* msg);

/* Post the message (or refusal) of r, or the receiver's announcement; on FI_EAGAIN, r
 * waits on the device's deferred list. Returns the libfabric result. */
static ssize_t postPart(ofiReq* r, int what) {
  ofiComm* c = r->comm;
  ofiDevice* d = c->obj.dev;
  int send = c->obj.kind == OFI_OBJ_SEND;
  int ep = (int)(r->seq % (uint32_t)c->neps);
  ssize_t ret;
  if (c->ep) { /* connected mode: in order, no tags, no clear-to-send */
    void* buf = r->size ? r->buf : (void*)c->probeBuf;
    ret = ofiPostMsg(d, c->ep, &r->op, &c->obj, msgDone, send, buf, r->size, r->mhandle);
  } else if (what == OFI_POST_CTS) {
    ret = ofiPostTagged(d, 0, &r->cop, &c->obj, ctsDone, 1, &r->cts, sizeof(r->cts), NULL, c->peer,
                        OFI_DATA_TAG(c->ctsId, r->seq) | OFI_TAG_CTS, 0);
  } else if (send && r->refused) {
    ret = ofiPostTagged(d, ep, &r->op, &c->obj, msgDone, 1, c->probeBuf, 0, NULL, c->dataPeer[ep],
                        OFI_DATA_TAG(c->connId, r->seq) | OFI_TAG_REFUSE, 0);
  } else {
    void* buf = r->size ? r->buf : (void*)c->probeBuf; /* some providers dislike NULL */
    /* A receive also matches the refusal of its message (the REFUSE bit is ignored). */
    ret = ofiPostTagged(d, ep, &r->op, &c->obj, msgDone, send, buf, r->size, r->mhandle,
                        send ? c->dataPeer[ep] : FI_ADDR_UNSPEC, OFI_DATA_TAG(c->connId, r->seq),
                        send ? 0 : OFI_TAG_REFUSE);
  }
  if (ret == 0 && what == OFI_POST_MSG) c->posted[ep]++;
  if (ret == 0 && r->deferred == what) deferredRemove(d, r);
  return ret;
}

/* postPart for work started from a completion: FI_EAGAIN defers, other errors fail r. */
static void postOrDefer(ofiReq* r, int what) {
  ofiDevice* d = r->comm->obj.dev;
  ssize_t ret = postPart(r, what);
  if (ret == -FI_EAGAIN) {
    if (!r->deferred) {
      r->deferred = what;
      r->nextDeferred = NULL;
      ofiReq** tail = &d->deferred;
      while (*tail) tail = &(*tail)->nextDeferred;
      *tail = r;
    }
    return;
  }
  if (r->deferred) deferredRemove(d, r);
  if (ret != 0) {
    char why[128];
    snprintf(why, sizeof(why), "posting its %s: %s",
             what == OFI_POST_CTS ? "announcement" : "message", fi_strerror((int)-ret));
    reqFail(r, ofiErrClass((int)-ret), why);
  }
}

void ofiRetryDeferred(ofiDevice* d) {
  while (d->deferred) {
    ofiReq* r = d->deferred;
    if (r->state != OFI_REQ_POSTED || r->comm->obj.released) {
      deferredRemove(d, r);
      (void)reqOrphaned(r);
      continue;
    }
    postOrDefer(r, r->deferred);
    if (r->deferred) return; /* still FI_EAGAIN: keep the order, try next time */
  }
}

static void msgDone(ofiOp* op, size_t len, int err, const char* msg) {
  ofiReq* r = (ofiReq*)op;
  ofiComm* c = r->comm;
  c->lastActivityNs = ofiNowNs();
  if (reqOrphaned(r)) return;
  int recv = c->obj.kind == OFI_OBJ_RECV;
  if (err == FI_ECANCELED && c->ep && c->err == ncclxSuccess && !c->closing) {
    /* Not ours (we cancel after a failure or in close): the provider ended the connection. */
    reqFail(r, ncclxRemoteError, "the connection was closed by the peer or lost");
  } else if (err == FI_ECANCELED) {
    r->err = c->err != ncclxSuccess ? c->err : ncclxRemoteError;
    reqSettle(r, OFI_REQ_FAILED);
  } else if (err) {
    reqFail(r, ofiErrClass(err), msg);
  } else if (recv && (op->ctag & OFI_TAG_REFUSE)) {
    reqFail(r, ncclxRemoteError,
            "the sender's message is larger than this receive (the sender "
            "sent more than was expected)");
  } else if (!recv && r->refused) {
    char why[160];
    snprintf(why, sizeof(why), "the receiver posted only %llu bytes for it (refused)",
             (unsigned long long)r->cts);
    reqFail(r, ncclxRemoteError, why);
  } else {
    r->got = recv ? len : r->size;
    /* Receive done, but its announcement may still be in flight: the slot waits for it. */
    reqSettle(r, OFI_REQ_DONE);
  }
}

/* Sender: the receive of message seq is posted with r->cts bytes. Receiver: its
 * announcement went out. */
static void ctsDone(ofiOp* op, size_t len, int err, const char* msg) {
  ofiReq* r = reqOfCts(op);
  ofiComm* c = r->comm;
  c->lastActivityNs = ofiNowNs();
  if (reqOrphaned(r)) return;
  char why[448];
  if (err == FI_ECANCELED) {
    r->err = c->err != ncclxSuccess ? c->err : ncclxRemoteError;
    reqSettle(r, OFI_REQ_FAILED);
  } else if (err) {
    snprintf(why, sizeof(why), "its clear-to-send message: %s", msg);
    reqFail(r, ofiErrClass(err), why);
  } else if (c->obj.kind == OFI_OBJ_SEND) {
    if (len != sizeof(r->cts)) {
      snprintf(why, sizeof(why), "a clear-to-send message of %zu bytes (not an ncclx ofi peer?)",
               len);
      reqFail(r, ncclxRemoteError, why);
      return;
    }
    r->refused = r->size > r->cts;
    postOrDefer(r, OFI_POST_MSG);
  }
}

static void probeDone(ofiOp* op, size_t len, int err, const char* msg) {
  (void)len;
  ofiComm* c = (ofiComm*)(void*)((char*)op - offsetof(ofiComm, probe));
  if (err && err != FI_ECANCELED && !c->obj.released)
    commFail(c, ncclxRemoteError, "the peer does not answer (probe failed: %s)", msg);
}

/* A comm waiting without progress asks whether its peer still exists: on this host by its
 * pid, elsewhere with a probe message whose send fails when the peer's endpoint is gone. */
static void checkPeer(ofiComm* c) {
  ofiCtx* ctx = c->obj.dev->ctx;
  if (c->inflight == 0) return;
  uint64_t now = ofiNowNs(), period = (uint64_t)ctx->livenessMs * 1000000ull;
  int due = ctx->livenessMs > 0 && now - c->lastActivityNs >= period && now - c->lastCheckNs >= period;
  /* Connected mode: a connection that ended may show only as an event (a receive posted
   * after it is never completed), so a waiting comm looks at the events, liveness or not. */
  if (c->ep && !c->peerClosed && now - c->lastActivityNs >= OFI_MSG_IDLE_EVENTS_NS &&
      now - c->lastEventCheckNs >= OFI_MSG_IDLE_EVENTS_NS) {
    c->lastEventCheckNs = now;
    ofiMsgEvents(c->obj.dev);
  }
  if (c->peerClosed) {
    commFail(c, ncclxRemoteError, "the connection ended: %s", fi_strerror(c->peerClosed));
    return;
  }
  if (!due) return;
  c->lastCheckNs = now;
  int alive = ctx->probeOnly ? -1 : ofiPeerAlive(&ctx->self, &c->peerId);
  if (alive == 0) {
    commFail(c, ncclxRemoteError, "the peer process (pid %u on this host) has exited",
             c->peerId.pid);
    return;
  }
  if (alive > 0 || c->probe.posted || c->ep) return; /* no probes on a connection's stream */
  ofiDevice* d = c->obj.dev;
  ssize_t ret = ofiPostTagged(d, 0, &c->probe, &c->obj, probeDone, 1, c->probeBuf, 1, NULL, c->peer,
                              OFI_TAG_KIND(OFI_KIND_PROBE) | c->connId, 0);
  if (ret != 0 && ret != -FI_EAGAIN)
    commFail(c, ofiErrClass((int)-ret), "probing the peer failed: %s", fi_strerror((int)-ret));
}

/* ------------------------------------------------------------------------------------------
 * Posting
 * ------------------------------------------------------------------------------------------ */

static ofiReq* reqAlloc(ofiComm* c) {
  for (int i = 0; i < NCCLX_NET_MAX_REQUESTS; i++)
    if (c->reqs[i].state == OFI_REQ_FREE && !reqBusy(&c->reqs[i])) return &c->reqs[i];
  return NULL;
}

/* *request stays NULL when the provider or the request table is full (the core retries). */
static ncclxResult_t reqPost(ofiComm* c, void* data, size_t size, void* mhandle, void* phandle,
                             void** request) {
  ofiDevice* d = c->obj.dev;
  int send = c->obj.kind == OFI_OBJ_SEND;
  if (c->err != ncclxSuccess) return c->err;
  if (c->peerClosed)
    return commFail(c, ncclxRemoteError, "the connection ended: %s", fi_strerror(c->peerClosed));
  ofiReq* r = reqAlloc(c);
  if (!r) return ncclxSuccess;
  r->buf = data;
  r->mhandle = mhandle;
  r->size = size;
  r->got = 0;
  r->seq = c->seq;
  r->err = ncclxSuccess;
  r->refused = 0;
  r->cts = size;
  r->deferred = 0;
  /* The first operation decides whether the request exists: FI_EAGAIN -> *request NULL.
   * Clear-to-send senders first wait for the announcement; everyone else posts the message. */
  ssize_t ret;
  for (int tries = 0;; tries++) {
    if (d->clearToSend && send)
      ret = ofiPostTagged(d, 0, &r->cop, &c->obj, ctsDone, 0, &r->cts, sizeof(r->cts), NULL,
                          FI_ADDR_UNSPEC, OFI_DATA_TAG(c->ctsId, r->seq) | OFI_TAG_CTS, 0);
    else
      ret = postPart(r, OFI_POST_MSG);
    if (ret != -FI_EAGAIN || tries > 0) break;
    ofiProgress(d); /* frees provider resources; may fail c */
    if (c->err != ncclxSuccess) return c->err;
  }
  if (ret == -FI_EAGAIN) return ncclxSuccess;
  if (ret != 0)
    return commFail(c, ofiErrClass((int)-ret), "posting a %s of %zu bytes failed: %s",
                    send ? "send" : "receive", size, fi_strerror((int)-ret));
  r->magic = OFI_REQ_MAGIC;
  r->state = OFI_REQ_POSTED;
  profStart(r, phandle);
  c->seq++;
  if (c->inflight++ == 0) c->lastActivityNs = ofiNowNs();
  if (d->clearToSend && !send) postOrDefer(r, OFI_POST_CTS); /* the receive is posted: announce */
  *request = r;
  ofiProgress(d); /* manual-progress providers move data only when called */
  return ncclxSuccess;
}

ncclxResult_t ofiIsend(void* sendComm, void* data, size_t size, int tag, void* mhandle,
                       void* phandle, void** request) {
  (void)tag; /* one buffer per receive: the tag has nothing to select */
  ofiComm* c = sendComm;
  if (!request || !isComm(c, OFI_OBJ_SEND)) return ncclxInternalError;
  *request = NULL;
  ofiDevice* d = c->obj.dev;
  if ((size > 0 && !data) || size > d->maxMsg) {
    OFI_WARN(d->ctx, "isend to %s: %s (%zu bytes, at most %zu)", c->peerName,
             data ? "message too large" : "NULL buffer", size, d->maxMsg);
    return ncclxInternalError;
  }
  pthread_mutex_lock(&d->lock);
  ncclxResult_t res = reqPost(c, data, size, mhandle, phandle, request);
  pthread_mutex_unlock(&d->lock);
  return res;
}

ncclxResult_t ofiIrecv(void* recvComm, int n, void** data, size_t* sizes, int* tags,
                       void** mhandles, void** phandles, void** request) {
  (void)tags;
  ofiComm* c = recvComm;
  if (!request || !isComm(c, OFI_OBJ_RECV)) return ncclxInternalError;
  *request = NULL;
  ofiDevice* d = c->obj.dev;
  if (n != 1 || !data || !sizes) {
    OFI_WARN(d->ctx, "irecv from %s: %d buffers requested, maxRecvs is 1", c->peerName, n);
    return ncclxInternalError;
  }
  if ((sizes[0] > 0 && !data[0]) || sizes[0] > d->maxMsg) {
    OFI_WARN(d->ctx, "irecv from %s: %s (%zu bytes, at most %zu)", c->peerName,
             data[0] ? "receive too large" : "NULL buffer", sizes[0], d->maxMsg);
    return ncclxInternalError;
  }
  pthread_mutex_lock(&d->lock);
  ncclxResult_t res = reqPost(c, data[0], sizes[0], mhandles ? mhandles[0] : NULL, phandles ? phandles[0] : NULL,
                              request);
  pthread_mutex_unlock(&d->lock);
  return res;
}

/* ------------------------------------------------------------------------------------------
 * Test
 * ------------------------------------------------------------------------------------------ */

ncclxResult_t ofiTest(void* request, int* done, size_t* sizes) {
  ofiReq* r = request;
  if (!done) return ncclxInternalError;
  *done = 0;
  if (!r || r->magic != OFI_REQ_MAGIC || r->state == OFI_REQ_FREE || r->state == OFI_REQ_ABANDONED)
    return ncclxInternalError;
  ofiComm* c = r->comm;
  ofiDevice* d = c->obj.dev;
  ncclxResult_t res = ncclxSuccess;
  pthread_mutex_lock(&d->lock);
  int n = r->state == OFI_REQ_POSTED ? ofiProgress(d) : 1;
  if (r->state == OFI_REQ_POSTED) checkPeer(c);
  if (r->state == OFI_REQ_DONE) {
    *done = 1;
    if (sizes) sizes[0] = r->got;
    reqSettle(r, OFI_REQ_ABANDONED); /* FREE once no operation of it is left */
  } else if (r->state == OFI_REQ_FAILED) {
    res = r->err != ncclxSuccess ? r->err : ncclxRemoteError;
    reqSettle(r, OFI_REQ_ABANDONED);
  } else if (c->err != ncclxSuccess) {
    /* Failed comm, operation still held by libfabric: the caller is done with it; the slot
     * is reused once libfabric lets go. */
    res = c->err;
    reqSettle(r, OFI_REQ_ABANDONED);
  } else if (n == 0) {
    ofiArmPollFd(d);
  }
  pthread_mutex_unlock(&d->lock);
  return res;
}

/* ------------------------------------------------------------------------------------------
 * Close and poll fd
 * ------------------------------------------------------------------------------------------ */

void ofiCommClose(ofiComm* c) {
  ofiDevice* d = c->obj.dev;
  char per[OFI_MAX_EPS * 21 + 1] = "";
  for (int i = 0, o = 0; i < c->neps; i++)
    o += snprintf(per + o, sizeof(per) - (size_t)o, "%s%llu", i ? "," : "",
                  (unsigned long long)c->posted[i]);
  OFI_TRACE(d->ctx, "closing connection %u %s %s: messages per endpoint %s", c->connId,
            c->obj.kind == OFI_OBJ_SEND ? "to" : "from", c->peerName, per);
  for (int i = 0; i < NCCLX_NET_MAX_REQUESTS; i++) profStop(&c->reqs[i]); /* never settled */
  for (int i = 0; i < NCCLX_NET_MAX_REQUESTS; i++)
    if (c->reqs[i].deferred) deferredRemove(d, &c->reqs[i]);
  if (c->obj.liveOps > 0) {
    c->closing = 1;
    commCancel(c);
    uint64_t t0 = ofiNowNs();
    while (c->obj.liveOps > 0 && ofiNowNs() - t0 < OFI_CLOSE_WAIT_NS) {
      if (ofiProgress(d) > 0) continue;
      pthread_mutex_unlock(&d->lock);
      usleep(200);
      pthread_mutex_lock(&d->lock);
    }
    if (c->obj.liveOps > 0)
      OFI_INFO(d->ctx,
               "closing the connection %s %s with %d operation(s) still in flight; its "
               "memory is freed when they complete or at finalize",
               c->obj.kind == OFI_OBJ_SEND ? "to" : "from", c->peerName, c->obj.liveOps);
  }
  ofiObjRelease(&c->obj);
}

static ncclxResult_t closeKind(void* comm, uint32_t kind) {
  if (!isComm(comm, kind)) return ncclxInternalError;
  ofiComm* c = comm;
  ofiDevice* d = c->obj.dev;
  pthread_mutex_lock(&d->lock);
  ofiCommClose(c);
  pthread_mutex_unlock(&d->lock);
  return ncclxSuccess;
}

ncclxResult_t ofiCloseSend(void* sendComm) { return closeKind(sendComm, OFI_OBJ_SEND); }

ncclxResult_t ofiCloseRecv(void* recvComm) { return closeKind(recvComm, OFI_OBJ_RECV); }

/* All comms of a device share its completion queue, hence its wait fd: it wakes the caller
 * when any of them may have progress. */
ncclxResult_t ofiGetPollFd(void* comm, int* fd) {
  if (!fd) return ncclxInternalError;
  *fd = -1;
  const ofiObj* o = comm;
  if (!o || (o->kind != OFI_OBJ_SEND && o->kind != OFI_OBJ_RECV && o->kind != OFI_OBJ_LISTEN))
    return ncclxInternalError;
  ofiDevice* d = o->dev;
  pthread_mutex_lock(&d->lock);
  if (d->cqFd >= 0) {
    d->pollFdWanted = 1;
    *fd = d->cqFd;
  }
  pthread_mutex_unlock(&d->lock);
  return ncclxSuccess;
}
