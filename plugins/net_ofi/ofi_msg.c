/* Connected mode (FI_EP_MSG): a passive endpoint per listen comm, a connected endpoint per
 * send or receive comm, and the device's event queue that reports connection requests,
 * established connections, shutdowns and failures.
 *
 *   listen()   opens a passive endpoint; its address goes in the handle with a nonce.
 *   connect()  opens an endpoint and calls fi_connect with {magic, listen id, nonce, its
 *              identity} as connection data; done when FI_CONNECTED brings the listener's
 *              {magic, OK, identity}.
 *   listener   on FI_CONNREQ checks the connection data: a wrong nonce is rejected (the
 *              sender sees a refused connect carrying status BAD_NONCE), anything else that
 *              is not an ncclx request is rejected with a warning; a good one gets an
 *              endpoint, fi_accept, and a receive comm that accept() hands out once
 *              FI_CONNECTED arrives for it.
 *   data       plain fi_send/fi_recv (ofi_data.c): the connection delivers messages in
 *              order and TCP's flow control holds a sender that runs ahead, so neither tags
 *              nor clear-to-send messages are needed.
 * With manual progress the provider moves connection handshakes only while its queues are
 * read, so the event queue is read by accept() and connect() and, while either waits, by
 * every progress call (d->cmBusy). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ofi_internal.h"

#define OFI_MSG_CM_DATA 256 /* room for connection data in an event (tcp allows 256) */
#define OFI_MSG_EVENTS 16   /* events handled per call */

void ofiMsgEpClose(ofiDevice* d, struct fid_ep* ep) {
  if (!ep) return;
  int ret = fi_close(&ep->fid);
  if (ret != 0) OFI_INFO(d->ctx, "%s: closing a connection's endpoint failed: %s", d->name, fi_strerror(-ret));
}

/* An endpoint bound to the device's completion and event queues. Returns 0 or -FI_E*. */
static int epOpen(ofiDevice* d, struct fi_info* info, struct fid_ep** out) {
  struct fid_ep* ep = NULL;
  int ret = fi_endpoint(d->domain, info, &ep, NULL);
  if (ret == 0) ret = fi_ep_bind(ep, &d->eq->fid, 0);
  if (ret == 0) ret = fi_ep_bind(ep, &d->cq->fid, FI_TRANSMIT | FI_RECV);
  if (ret == 0) ret = fi_enable(ep);
  if (ret != 0 && ep) {
    (void)fi_close(&ep->fid);
    ep = NULL;
  }
  *out = ep;
  return ret;
}

static void countCm(ofiDevice* d, int* flag, int on) {
  if (*flag == on) return;
  *flag = on;
  d->cmBusy += on ? 1 : -1;
}

/* ------------------------------------------------------------------------------------------
 * Listener
 * ------------------------------------------------------------------------------------------ */

ncclxResult_t ofiMsgListen(ofiListenComm* lc, ofiHandle* h) {
  ofiDevice* d = lc->obj.dev;
  const char* what = "fi_passive_ep";
  int ret = fi_passive_ep(d->fabric, d->info, &lc->pep, NULL);
  if (ret == 0) what = "binding the event queue", ret = fi_pep_bind(lc->pep, &d->eq->fid, 0);
  if (ret == 0) what = "fi_listen", ret = fi_listen(lc->pep);
  size_t len = sizeof(h->addr);
  if (ret == 0) what = "fi_getname", ret = fi_getname(&lc->pep->fid, h->addr, &len);
  if (ret != 0) {
    OFI_WARN(d->ctx, "listen on %s: %s failed: %s", d->name, what, fi_strerror(-ret));
    return ncclxSystemError;
  }
  size_t cm = 0, optlen = sizeof(cm);
  if (fi_getopt(&lc->pep->fid, FI_OPT_ENDPOINT, FI_OPT_CM_DATA_SIZE, &cm, &optlen) == 0 &&
      (cm < sizeof(ofiMsgConnData) || cm < sizeof(ofiMsgReplyData))) {
    OFI_WARN(d->ctx, "listen on %s: the provider carries %zu bytes of connection data, we need %zu",
             d->name, cm, sizeof(ofiMsgConnData));
    return ncclxSystemError;
  }
  h->addrLen = (uint16_t)len;
  char name[128];
  ofiFormatAddr(d, h->addr, len, name, sizeof(name));
  OFI_TRACE(d->ctx, "listener %u on %s at %s (connected endpoints)", lc->listenId, d->name, name);
  return ncclxSuccess;
}

/* A closed listener's passive endpoint stays open (its listening socket too) until the
 * device closes: libfabric 1.17's tcp provider leaves its queued connection requests in the
 * event queue, and a connection it accepted but has not read yet keeps a pointer to the
 * passive endpoint that the next event-queue read would follow. Requests for it are
 * rejected (onClosedPep). */
static void keepClosedPep(ofiDevice* d, struct fid_pep* pep) {
  if (d->nclosedPeps == d->capClosedPeps) {
    int cap = d->capClosedPeps ? 2 * d->capClosedPeps : 8;
    struct fid_pep** n = realloc(d->closedPeps, (size_t)cap * sizeof(*n));
    if (!n) { /* out of memory: close it and take the chance */
      (void)fi_close(&pep->fid);
      return;
    }
    d->closedPeps = n;
    d->capClosedPeps = cap;
  }
  d->closedPeps[d->nclosedPeps++] = pep;
}

void ofiMsgClosePeps(ofiDevice* d) {
  for (int i = 0; i < d->nclosedPeps; i++) (void)fi_close(&d->closedPeps[i]->fid);
  free(d->closedPeps);
  d->closedPeps = NULL;
  d->nclosedPeps = d->capClosedPeps = 0;
}

/* A connection request for a listener that was closed: the sender is refused at once. */
static void onClosedPep(ofiDevice* d, const struct fid* fid, struct fi_info* info) {
  for (int i = 0; i < d->nclosedPeps; i++)
    if (&d->closedPeps[i]->fid == fid) {
      ofiMsgReplyData r = {.magic = OFI_MSG_REPLY_MAGIC, .status = OFI_REPLY_FAILED, .who = d->ctx->self};
      (void)fi_reject(d->closedPeps[i], info->handle, &r, sizeof(r));
      OFI_INFO(d->ctx, "%s: rejected a connection request for a closed listener", d->name);
      return;
    }
}

void ofiMsgCloseListen(ofiListenComm* lc) {
  ofiDevice* d = lc->obj.dev;
  /* Connections accepted but not established yet: nobody will take them. */
  for (ofiObj *o = d->objs, *next; o; o = next) {
    next = o->next;
    ofiComm* c = (ofiComm*)o;
    if (o->kind == OFI_OBJ_RECV && !o->released && c->acceptedBy == lc) {
      countCm(d, &c->cmWaiting, 0);
      c->acceptedBy = NULL;
      ofiObjRelease(o);
    }
  }
  if (lc->pep) keepClosedPep(d, lc->pep);
  lc->pep = NULL;
}

static void reject(ofiListenComm* lc, struct fi_info* info, uint32_t status) {
  ofiMsgReplyData r = {.magic = OFI_MSG_REPLY_MAGIC, .status = status, .who = lc->obj.dev->ctx->self};
  int ret = fi_reject(lc->pep, info->handle, &r, sizeof(r));
  if (ret != 0)
    OFI_INFO(lc->obj.dev->ctx, "%s: rejecting a connection request failed: %s", lc->obj.dev->name,
             fi_strerror(-ret));
}

static void onConnReq(ofiListenComm* lc, struct fi_info* info, const void* data, size_t len) {
  ofiDevice* d = lc->obj.dev;
  ofiCtx* ctx = d->ctx;
  char peerName[128] = "?";
  if (info->dest_addr) ofiFormatAddr(d, info->dest_addr, info->dest_addrlen, peerName, sizeof(peerName));
  ofiMsgConnData m;
  memset(&m, 0, sizeof(m));
  memcpy(&m, data, len < sizeof(m) ? len : sizeof(m));
  if (len != sizeof(m) || m.magic != OFI_MSG_CONNECT_MAGIC) {
    OFI_WARN(ctx,
             "%s: refused a connection request from %s on listener %u: %zu bytes of connection "
             "data, not from an ncclx ofi peer of this version",
             d->name, peerName, lc->listenId, len);
    reject(lc, info, OFI_REPLY_FAILED);
    return;
  }
  if (m.nonce != lc->nonce || m.listenId != lc->listenId) {
    OFI_WARN(ctx,
             "%s: refused connection from %s (pid %u) on listener %u: wrong nonce (a "
             "stranger, or a sender holding a stale handle)",
             d->name, peerName, m.who.pid, lc->listenId);
    reject(lc, info, OFI_REPLY_BAD_NONCE);
    return;
  }
  struct fid_ep* ep = NULL;
  int ret = epOpen(d, info, &ep);
  fi_addr_t none = FI_ADDR_NOTAVAIL;
  uint32_t connId = d->nextConnId;
  d->nextConnId = (d->nextConnId + 1) & OFI_CONN_ID_MASK;
  ofiComm* c = ret == 0 ? ofiCommCreate(d, OFI_OBJ_RECV, &none, 1, connId, 0, &m.who, peerName) : NULL;
  if (!c) {
    OFI_WARN(ctx, "%s: cannot accept a connection from %s: %s", d->name, peerName,
             ret ? fi_strerror(-ret) : "out of memory");
    ofiMsgEpClose(d, ep);
    reject(lc, info, OFI_REPLY_FAILED);
    return;
  }
  c->ep = ep;
  c->acceptedBy = lc;
  countCm(d, &c->cmWaiting, 1);
  ofiMsgReplyData r = {.magic = OFI_MSG_REPLY_MAGIC, .status = OFI_REPLY_OK, .who = ctx->self};
  ret = fi_accept(ep, &r, sizeof(r));
  if (ret != 0) {
    OFI_WARN(ctx, "%s: accepting a connection from %s failed: %s", d->name, peerName, fi_strerror(-ret));
    countCm(d, &c->cmWaiting, 0);
    c->acceptedBy = NULL;
    ofiObjRelease(&c->obj);
    reject(lc, info, OFI_REPLY_FAILED); /* frees the request, which the endpoint did not take */
    return;
  }
  OFI_TRACE(ctx, "%s: accepting %s (pid %u) on listener %u as connection %u", d->name, peerName,
            m.who.pid, lc->listenId, connId);
}

/* ------------------------------------------------------------------------------------------
 * Sender
 * ------------------------------------------------------------------------------------------ */

ncclxResult_t ofiMsgConnectStart(ofiPending* p) {
  ofiDevice* d = p->obj.dev;
  int ret = epOpen(d, d->info, &p->ep);
  ofiMsgConnData m = {.magic = OFI_MSG_CONNECT_MAGIC,
                      .listenId = p->handle.listenId,
                      .nonce = p->handle.nonce,
                      .who = d->ctx->self};
  if (ret == 0) ret = fi_connect(p->ep, p->handle.addr, &m, sizeof(m));
  if (ret != 0) {
    OFI_WARN(d->ctx, "connect to %s: %s", p->peerName, fi_strerror(-ret));
    return ofiErrClass(-ret);
  }
  countCm(d, &p->cmWaiting, 1);
  return ncclxSuccess;
}

/* ------------------------------------------------------------------------------------------
 * Events
 * ------------------------------------------------------------------------------------------ */

/* The object an event is about, by its endpoint; NULL when it is gone (closing an endpoint
 * removes its queued events, and passive endpoints stay open until the device closes, so a
 * fid seen here is never a stale one). */
static ofiObj* ownerOf(ofiDevice* d, const struct fid* fid) {
  for (ofiObj* o = d->objs; o; o = o->next) {
    const struct fid* own = NULL;
    if (o->kind == OFI_OBJ_LISTEN && ((ofiListenComm*)o)->pep) own = &((ofiListenComm*)o)->pep->fid;
    if ((o->kind == OFI_OBJ_SEND || o->kind == OFI_OBJ_RECV) && ((ofiComm*)o)->ep)
      own = &((ofiComm*)o)->ep->fid;
    if (o->kind == OFI_OBJ_PENDING && ((ofiPending*)o)->ep) own = &((ofiPending*)o)->ep->fid;
    if (own && own == fid) return o;
  }
  return NULL;
}

static void onConnected(ofiDevice* d, ofiObj* o, const void* data, size_t len) {
  if (o->kind == OFI_OBJ_PENDING) {
    ofiPending* p = (ofiPending*)o;
    countCm(d, &p->cmWaiting, 0);
    memcpy(&p->accepted, data, len < sizeof(p->accepted) ? len : sizeof(p->accepted));
    p->replyLen = len;
    p->replyDone = p->sendDone = 1;
  } else if (o->kind == OFI_OBJ_RECV) {
    ofiComm* c = (ofiComm*)o;
    countCm(d, &c->cmWaiting, 0);
    c->connected = 1;
    ofiListenComm* lc = c->acceptedBy;
    c->acceptedBy = NULL;
    if (o->released) return;
    if (!lc || ofiListenPushReady(lc, c) != 0) ofiObjRelease(o);
    else OFI_TRACE(d->ctx, "%s: connection %u from %s established", d->name, c->connId, c->peerName);
  }
}

/* The peer closed or lost the connection. Requests still posted fail in ofi_data.c. */
static void onShutdown(ofiDevice* d, ofiObj* o, int err) {
  if (o->kind == OFI_OBJ_SEND || o->kind == OFI_OBJ_RECV) {
    ofiComm* c = (ofiComm*)o;
    if (!c->connected) { /* an accepted connection that never got established */
      countCm(d, &c->cmWaiting, 0);
      c->acceptedBy = NULL;
      if (!o->released) ofiObjRelease(o);
      return;
    }
    if (!c->peerClosed) c->peerClosed = err ? err : FI_ECONNRESET;
  } else if (o->kind == OFI_OBJ_PENDING) {
    ofiPending* p = (ofiPending*)o;
    countCm(d, &p->cmWaiting, 0);
    if (!p->failErr) {
      p->failErr = err ? err : FI_ECONNRESET;
      snprintf(p->failMsg, sizeof(p->failMsg), "the connection was closed before it was established");
    }
  }
}

/* A failed connect: refused (the listener's answer may say why), unreachable, reset. */
static void onError(ofiDevice* d, const struct fi_eq_err_entry* e) {
  ofiObj* o = e->fid ? ownerOf(d, e->fid) : NULL;
  if (!o) {
    OFI_INFO(d->ctx, "%s: connection event error without a connection: %s", d->name, fi_strerror(e->err));
    return;
  }
  if (o->kind != OFI_OBJ_PENDING) {
    onShutdown(d, o, e->err ? e->err : FI_EOTHER);
    return;
  }
  ofiPending* p = (ofiPending*)o;
  countCm(d, &p->cmWaiting, 0);
  if (p->failErr) return;
  ofiMsgReplyData r;
  memset(&r, 0, sizeof(r));
  if (e->err_data && e->err_data_size >= sizeof(r)) memcpy(&r, e->err_data, sizeof(r));
  p->failErr = e->err ? e->err : FI_EOTHER;
  if (r.magic == OFI_MSG_REPLY_MAGIC && r.status == OFI_REPLY_BAD_NONCE)
    snprintf(p->failMsg, sizeof(p->failMsg),
             "the listener refused the connection: wrong nonce (a stale handle, or one from "
             "another job)");
  else if (r.magic == OFI_MSG_REPLY_MAGIC && r.status == OFI_REPLY_FAILED)
    snprintf(p->failMsg, sizeof(p->failMsg),
             "the listener refused the connection: it was closed, or could not accept it");
  else if (r.magic == OFI_MSG_REPLY_MAGIC)
    snprintf(p->failMsg, sizeof(p->failMsg), "the listener refused the connection (status %u)",
             r.status);
  else
    snprintf(p->failMsg, sizeof(p->failMsg), "%s", fi_strerror(p->failErr));
}

void ofiMsgEvents(ofiDevice* d) {
  d->lastEventsNs = ofiNowNs();
  union {
    struct fi_eq_cm_entry cm;
    uint8_t raw[sizeof(struct fi_eq_cm_entry) + OFI_MSG_CM_DATA];
  } ev;
  for (int i = 0; i < OFI_MSG_EVENTS; i++) {
    uint32_t event = 0;
    ssize_t n = fi_eq_read(d->eq, &event, &ev, sizeof(ev), 0);
    if (n == -FI_EAGAIN) return;
    if (n == -FI_EAVAIL) {
      struct fi_eq_err_entry e;
      memset(&e, 0, sizeof(e));
      if (fi_eq_readerr(d->eq, &e, 0) < 0) return;
      onError(d, &e);
      continue;
    }
    if (n < 0) {
      OFI_WARN(d->ctx, "%s: reading connection events failed: %s", d->name, fi_strerror((int)-n));
      return;
    }
    size_t len = (size_t)n > sizeof(ev.cm) ? (size_t)n - sizeof(ev.cm) : 0;
    ofiObj* o = ownerOf(d, ev.cm.fid);
    if (event == FI_CONNREQ) {
      if (o && o->kind == OFI_OBJ_LISTEN && !o->released)
        onConnReq((ofiListenComm*)o, ev.cm.info, ev.cm.data, len);
      else
        onClosedPep(d, ev.cm.fid, ev.cm.info);
      fi_freeinfo(ev.cm.info);
    } else if (o && event == FI_CONNECTED) {
      onConnected(d, o, ev.cm.data, len);
    } else if (o && event == FI_SHUTDOWN) {
      onShutdown(d, o, 0);
    }
  }
}
