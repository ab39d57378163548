/* Connection setup over control tags.
 *
 *   listen()   picks a listen id and nonce and puts {endpoint address, listen id, nonce, its
 *              pid/host identity} in the handle. The device keeps receives posted on tag
 *              CONNECT|any id, so a message for a closed or unknown listener is refused too.
 *   connect()  adds the listener to the address vector, posts a receive on REPLY|pendingId,
 *              then sends {its endpoint addresses, the nonce, pendingId, identity} to
 *              CONNECT|listenId.
 *   listener   (inside completion processing) checks the magic, finds the listener by its
 *              id and checks the nonce, adds the sender's endpoint 0 to the address vector,
 *              assigns a connection id unique on its endpoint, creates the receive comm and
 *              replies {OK, connId, n, its first n endpoint addresses} (n: the smaller
 *              endpoint count); a wrong nonce or a listener that does not exist gets a
 *              refusal and a WARN.
 *   accept()   hands out the receive comms made that way, one per call.
 *   connect()  returns the send comm once the reply arrived and its own send completed.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ofi_internal.h"

/* A listener's reply: in flight (nobody waits for it) or queued on the device because the
 * provider said FI_EAGAIN. */
typedef struct ofiCtrlSend {
  ofiObj obj;
  ofiOp op;
  fi_addr_t to;
  ofiReplyMsg msg;
  struct ofiCtrlSend* next;
} ofiCtrlSend;

/* Pending connects of all devices (few, short-lived). The list has its own lock; an entry's
 * fields are touched only with its device's lock held. */
static pthread_mutex_t pendingLock = PTHREAD_MUTEX_INITIALIZER;
static ofiPending* pendingList;

static void destroyFree(ofiObj* obj) { free(obj); }

static void destroyListen(ofiObj* obj) {
  ofiListenComm* lc = (ofiListenComm*)obj;
  if (lc->pep) (void)fi_close(&lc->pep->fid);
  free(lc->ready);
  free(lc);
}

static void destroyPending(ofiObj* obj) {
  ofiPending* p = (ofiPending*)obj;
  if (p->cmWaiting) p->obj.dev->cmBusy--;
  ofiMsgEpClose(p->obj.dev, p->ep);
  free(p);
}

/* ------------------------------------------------------------------------------------------
 * Listener side
 * ------------------------------------------------------------------------------------------ */

static void ctrlSendDone(ofiOp* op, size_t len, int err, const char* msg) {
  (void)op, (void)len, (void)err, (void)msg; /* released at once: never called */
}

/* 1 when posted (or failed for good), 0 when the provider wants us to try again later. */
static int replyPost(ofiDevice* d, ofiCtrlSend* cs) {
  size_t len = offsetof(ofiReplyMsg, addr) + (size_t)cs->msg.neps * cs->msg.addrLen;
  ssize_t ret = ofiPostTagged(d, 0, &cs->op, &cs->obj, ctrlSendDone, 1, &cs->msg, len, NULL, cs->to,
                              OFI_CTRL_TAG(OFI_KIND_REPLY, cs->msg.pendingId), 0);
  if (ret == -FI_EAGAIN) return 0;
  if (ret != 0)
    OFI_WARN(d->ctx, "%s: sending a connection reply failed: %s", d->name, fi_strerror((int)-ret));
  ofiObjRelease(&cs->obj); /* frees itself when the send completes */
  return 1;
}

/* An OK reply carries the listener's first neps endpoint addresses. */
static void sendReply(ofiDevice* d, fi_addr_t to, uint32_t pendingId, uint32_t status,
                      uint32_t connId, int neps) {
  ofiCtrlSend* cs = calloc(1, sizeof(*cs));
  if (!cs) return;
  ofiObjInit(&cs->obj, OFI_OBJ_CTRL, d, destroyFree);
  cs->to = to;
  cs->msg.magic = OFI_REPLY_MAGIC;
  cs->msg.status = status;
  cs->msg.connId = connId;
  cs->msg.pendingId = pendingId;
  cs->msg.who = d->ctx->self;
  cs->msg.addrLen = (uint16_t)d->addrLen;
  cs->msg.neps = (uint16_t)neps;
  for (int i = 0; i < neps; i++) memcpy(cs->msg.addr + (size_t)i * d->addrLen, d->addrs[i], d->addrLen);
  if (d->replyQueue == NULL && replyPost(d, cs)) return;
  /* Keep replies in order behind those already waiting; ofiProgress retries them. */
  ofiCtrlSend** tail = &d->replyQueue;
  while (*tail) tail = &(*tail)->next;
  *tail = cs;
}

void ofiRetryReplies(ofiDevice* d) {
  while (d->replyQueue) {
    ofiCtrlSend* cs = d->replyQueue;
    ofiCtrlSend* next = cs->next;
    if (!replyPost(d, cs)) return;
    d->replyQueue = next;
  }
}

static void ctrlRecvDone(ofiOp* op, size_t len, int err, const char* msg);

int ofiPostConnectRecvs(ofiDevice* d) {
  int posted = 0;
  d->connectRecvsNeeded = 0;
  for (int i = 0; i < OFI_CTRL_RECVS; i++) {
    ofiCtrlRecv* rx = &d->connectRecvs[i];
    if (!rx->op.posted) {
      ssize_t ret = ofiPostTagged(d, 0, &rx->op, &d->self, ctrlRecvDone, 0, &rx->msg,
                                  sizeof(rx->msg), NULL, FI_ADDR_UNSPEC,
                                  OFI_CTRL_TAG(OFI_KIND_CONNECT, 0), OFI_CTRL_ID_IGNORE);
      if (ret != 0) {
        d->connectRecvsNeeded = 1; /* the next progress call tries again */
        if (ret != -FI_EAGAIN && !d->connectRecvsWarned)
          OFI_WARN(d->ctx, "%s: posting a connect receive failed: %s (retried on every "
                   "progress call; said once)", d->name, fi_strerror((int)-ret));
        d->connectRecvsWarned |= ret != -FI_EAGAIN;
      }
    }
    posted += rx->op.posted;
  }
  if (!d->connectRecvsNeeded) d->connectRecvsWarned = 0;
  return posted;
}

/* The open listener with this id, or NULL. */
static ofiListenComm* findListener(ofiDevice* d, uint32_t listenId) {
  for (ofiObj* o = d->objs; o; o = o->next)
    if (o->kind == OFI_OBJ_LISTEN && !o->released && ((ofiListenComm*)o)->listenId == listenId)
      return (ofiListenComm*)o;
  return NULL;
}

int ofiListenPushReady(ofiListenComm* lc, ofiComm* c) {
  if (lc->nready == lc->capReady) {
    int cap = lc->capReady ? 2 * lc->capReady : 8;
    ofiComm** n = realloc(lc->ready, (size_t)cap * sizeof(*n));
    if (!n) return -1;
    lc->ready = n;
    lc->capReady = cap;
  }
  lc->ready[lc->nready++] = c;
  return 0;
}

/* tagId: the listener id the message was sent to (its tag); the body must name the same. */
static void handleConnect(ofiDevice* d, const ofiConnectMsg* m, size_t len, uint32_t tagId) {
  ofiCtx* ctx = d->ctx;
  size_t head = offsetof(ofiConnectMsg, addr);
  if (len < head || m->magic != OFI_CONNECT_MAGIC || m->addrLen == 0 || m->addrLen > OFI_MAX_ADDR ||
      m->neps == 0 || m->neps > OFI_MAX_EPS || len < head + (size_t)m->neps * m->addrLen ||
      m->listenId != tagId) {
    OFI_WARN(ctx,
             "%s: refused a connect message of %zu bytes sent to listener %u: not from an "
             "ncclx ofi peer of this version (bad magic, length, endpoint count or listener id)",
             d->name, len, tagId);
    return;
  }
  if (m->addrLen != d->addrLen) {
    OFI_WARN(ctx,
             "%s: refused a connect message for listener %u: its addresses are %u bytes, ours "
             "%zu (another address format: IPv4 and IPv6 peers, or another provider?)",
             d->name, m->listenId, (unsigned)m->addrLen, d->addrLen);
    return;
  }
  char peerName[128];
  ofiFormatAddr(d, m->addr, m->addrLen, peerName, sizeof(peerName));
  fi_addr_t fa[OFI_MAX_EPS];
  if (ofiPeerInsert(d, m->addr, m->addrLen, &fa[0]) != ncclxSuccess) return;
  ofiListenComm* lc = findListener(d, m->listenId);
  if (!lc || m->nonce != lc->nonce) {
    OFI_WARN(ctx, "%s: refused connection from %s (pid %u) on listener %u: %s", d->name, peerName,
             m->who.pid, m->listenId,
             lc ? "wrong nonce (a stranger, or a sender holding a stale handle)"
                : "this process has no such listener (closed, or never ours: a stale handle, "
                  "or one from another job)");
    sendReply(d, fa[0], m->pendingId, lc ? OFI_REPLY_BAD_NONCE : OFI_REPLY_NO_LISTENER, 0, 0);
    return;
  }
  /* Data spreads over the endpoints both sides have. A receive comm sends only to the
   * sender's endpoint 0 (clear-to-send, probes): its other addresses are not needed. */
  int neps = m->neps < d->neps ? m->neps : d->neps;
  for (int i = 1; i < neps; i++) fa[i] = FI_ADDR_NOTAVAIL;
  uint32_t connId = d->nextConnId;
  d->nextConnId = (d->nextConnId + 1) & OFI_CONN_ID_MASK;
  ofiComm* c = ofiCommCreate(d, OFI_OBJ_RECV, fa, neps, connId, m->pendingId, &m->who, peerName);
  if (!c || ofiListenPushReady(lc, c) != 0) {
    OFI_WARN(ctx, "%s: out of memory accepting a connection from %s", d->name, peerName);
    if (c) ofiObjRelease(&c->obj);
    return;
  }
  OFI_TRACE(ctx, "%s: accepted %s (pid %u) on listener %u as connection %u over %d endpoint(s)",
            d->name, peerName, m->who.pid, lc->listenId, connId, neps);
  sendReply(d, fa[0], m->pendingId, OFI_REPLY_OK, connId, neps);
}

static void ctrlRecvDone(ofiOp* op, size_t len, int err, const char* msg) {
  ofiCtrlRecv* rx = (ofiCtrlRecv*)op;
  ofiDevice* d = op->owner->dev;
  if (err && err != FI_ECANCELED) /* nothing of ours cancels it; a provider might */
    OFI_WARN(d->ctx, "%s: receiving a connect message failed: %s", d->name, msg);
  else if (!err)
    handleConnect(d, &rx->msg, len, (uint32_t)op->ctag);
  d->connectRecvsNeeded = 1; /* reposted at the end of this progress call */
}

ncclxResult_t ofiListen(void* vctx, int dev, void* handle, void** listenComm) {
  ofiCtx* ctx = vctx;
  if (!ctx || !handle || !listenComm) return ncclxInternalError;
  *listenComm = NULL;
  if (dev < 0 || dev >= ctx->ndev) {
    OFI_WARN(ctx, "listen: device %d does not exist (%d devices)", dev, ctx->ndev);
    return ncclxInternalError;
  }
  ofiDevice* d = &ctx->devs[dev];
  pthread_mutex_lock(&d->lock);
  ncclxResult_t res = ofiDeviceEnsureOpen(d);
  ofiListenComm* lc = res == ncclxSuccess ? calloc(1, sizeof(*lc)) : NULL;
  if (!lc) {
    pthread_mutex_unlock(&d->lock);
    return res == ncclxSuccess ? ncclxSystemError : res;
  }
  ofiObjInit(&lc->obj, OFI_OBJ_LISTEN, d, destroyListen);
  lc->listenId = d->nextListenId++;
  lc->nonce = ofiRandom64();
  ofiHandle h;
  memset(&h, 0, sizeof(h));
  h.magic = OFI_HANDLE_MAGIC;
  h.listenId = lc->listenId;
  h.pid = ctx->self.pid;
  h.nonce = lc->nonce;
  h.hostHash = ctx->self.hostHash;
  h.startTime = ctx->self.startTime;
  if (d->msgMode) { /* a passive endpoint of its own; its address goes in the handle */
    res = ofiMsgListen(lc, &h);
    if (res != ncclxSuccess) {
      ofiObjRelease(&lc->obj);
      pthread_mutex_unlock(&d->lock);
      return res;
    }
  } else {
    if (ofiPostConnectRecvs(d) == 0) {
      OFI_WARN(ctx, "listen on %s: cannot post any connect receive", d->name);
      ofiObjRelease(&lc->obj);
      pthread_mutex_unlock(&d->lock);
      return ncclxSystemError;
    }
    h.addrLen = (uint16_t)d->addrLen;
    memcpy(h.addr, d->addrs[0], d->addrLen);
  }
  memset(handle, 0, NCCLX_NET_HANDLE_MAXSIZE);
  memcpy(handle, &h, sizeof(h));
  OFI_TRACE(ctx, "listening on %s (%s) as listener %u", d->name, d->addrStr, lc->listenId);
  pthread_mutex_unlock(&d->lock);
  *listenComm = lc;
  return ncclxSuccess;
}

ncclxResult_t ofiAccept(void* listenComm, void** recvComm) {
  ofiListenComm* lc = listenComm;
  if (!recvComm || !lc || lc->obj.kind != OFI_OBJ_LISTEN) return ncclxInternalError;
  *recvComm = NULL;
  ofiDevice* d = lc->obj.dev;
  pthread_mutex_lock(&d->lock);
  if (lc->nready == 0) {
    if (d->msgMode)
      ofiMsgEvents(d); /* connection requests and established connections */
    if (ofiProgress(d) == 0) ofiArmPollFd(d);
  }
  if (lc->nready > 0) {
    *recvComm = lc->ready[0];
    memmove(lc->ready, lc->ready + 1, (size_t)(lc->nready - 1) * sizeof(*lc->ready));
    lc->nready--;
  }
  pthread_mutex_unlock(&d->lock);
  return ncclxSuccess;
}

ncclxResult_t ofiCloseListen(void* listenComm) {
  ofiListenComm* lc = listenComm;
  if (!lc || lc->obj.kind != OFI_OBJ_LISTEN) return ncclxInternalError;
  ofiDevice* d = lc->obj.dev;
  pthread_mutex_lock(&d->lock);
  /* Comms made but never accepted have no operations yet; their senders find out through
   * their own errors or the core's timeout. */
  for (int i = 0; i < lc->nready; i++) ofiObjRelease(&lc->ready[i]->obj);
  lc->nready = 0;
  if (d->msgMode) ofiMsgCloseListen(lc);
  ofiObjRelease(&lc->obj); /* connect messages for it are refused from now on */
  pthread_mutex_unlock(&d->lock);
  return ncclxSuccess;
}

/* ------------------------------------------------------------------------------------------
 * Sender side
 * ------------------------------------------------------------------------------------------ */

static void pendingSendDone(ofiOp* op, size_t len, int err, const char* msg) {
  (void)len;
  ofiPending* p = (ofiPending*)((char*)op - offsetof(ofiPending, sendOp));
  p->sendDone = 1;
  if (err && !p->failErr) {
    p->failErr = err;
    snprintf(p->failMsg, sizeof(p->failMsg), "sending the connect message failed: %s", msg);
  }
}

static void pendingReplyDone(ofiOp* op, size_t len, int err, const char* msg) {
  ofiPending* p = (ofiPending*)((char*)op - offsetof(ofiPending, replyOp));
  p->replyDone = 1;
  p->replyLen = len;
  if (err && !p->failErr) {
    p->failErr = err;
    snprintf(p->failMsg, sizeof(p->failMsg), "receiving the connect reply failed: %s", msg);
  }
}

static void pendingFree(ofiPending* p) {
  ofiCancel(p->obj.dev, &p->replyOp);
  ofiObjRelease(&p->obj); /* freed once its operations complete */
}

/* Take the pending connect for this handle out of the list, preferring the one started for
 * the same *sendComm slot; stale ones (abandoned by their caller) are dropped. Connections
 * to one handle are interchangeable, so any match is correct. */
static ofiPending* pendingTake(ofiDevice* d, const ofiHandle* h, void** owner) {
  uint64_t now = ofiNowNs();
  ofiPending **pick = NULL, **pp = &pendingList, *stale = NULL;
  pthread_mutex_lock(&pendingLock);
  while (*pp) {
    ofiPending* p = *pp;
    if (p->obj.dev == d && now - p->lastTouchNs > OFI_STALE_CONNECT_NS) {
      *pp = p->next;
      p->next = stale;
      stale = p;
      continue;
    }
    if (p->obj.dev == d && memcmp(&p->handle, h, sizeof(*h)) == 0 && (!pick || p->owner == owner))
      pick = pp;
    pp = &p->next;
  }
  ofiPending* found = NULL;
  if (pick) {
    found = *pick;
    *pick = found->next;
    found->owner = owner;
  }
  pthread_mutex_unlock(&pendingLock);
  while (stale) { /* device lock is held by the caller */
    ofiPending* p = stale;
    stale = p->next;
    pendingFree(p);
  }
  return found;
}

static void pendingPut(ofiPending* p) {
  p->lastTouchNs = ofiNowNs();
  pthread_mutex_lock(&pendingLock);
  p->next = pendingList;
  pendingList = p;
  pthread_mutex_unlock(&pendingLock);
}

void ofiPendingForget(ofiCtx* ctx) {
  pthread_mutex_lock(&pendingLock);
  for (ofiPending** pp = &pendingList; *pp;) {
    ofiDevice* d = (*pp)->obj.dev;
    if (d >= ctx->devs && d < ctx->devs + ctx->ndev)
      *pp = (*pp)->next;
    else
      pp = &(*pp)->next;
  }
  pthread_mutex_unlock(&pendingLock);
}

static ncclxResult_t pendingStart(ofiDevice* d, const ofiHandle* h, void** owner,
                                  ofiPending** out) {
  ofiCtx* ctx = d->ctx;
  ofiPending* p = calloc(1, sizeof(*p));
  if (!p) return ncclxSystemError;
  ofiObjInit(&p->obj, OFI_OBJ_PENDING, d, destroyPending);
  p->handle = *h;
  p->owner = owner;
  p->startNs = p->lastCheckNs = ofiNowNs();
  p->pendingId = d->nextPendingId++;
  ofiFormatAddr(d, h->addr, h->addrLen, p->peerName, sizeof(p->peerName));
  if (d->msgMode) {
    ncclxResult_t res = ofiMsgConnectStart(p);
    if (res != ncclxSuccess) {
      ofiObjRelease(&p->obj);
      return res;
    }
    *out = p;
    return ncclxSuccess;
  }
  ncclxResult_t res = ofiPeerInsert(d, h->addr, h->addrLen, &p->peer);
  if (res != ncclxSuccess) {
    ofiObjRelease(&p->obj);
    return res;
  }
  ssize_t ret =
      ofiPostTagged(d, 0, &p->replyOp, &p->obj, pendingReplyDone, 0, &p->reply, sizeof(p->reply), NULL,
                    FI_ADDR_UNSPEC, OFI_CTRL_TAG(OFI_KIND_REPLY, p->pendingId), 0);
  if (ret != 0) {
    OFI_WARN(ctx, "connect to %s: posting the reply receive failed: %s", p->peerName,
             fi_strerror((int)-ret));
    ofiObjRelease(&p->obj);
    return ret == -FI_EAGAIN ? ncclxSuccess : ncclxSystemError; /* EAGAIN: next call retries */
  }
  p->msg.magic = OFI_CONNECT_MAGIC;
  p->msg.addrLen = (uint16_t)d->addrLen;
  p->msg.neps = (uint16_t)d->neps;
  p->msg.listenId = h->listenId;
  p->msg.pendingId = p->pendingId;
  p->msg.nonce = h->nonce;
  p->msg.who = ctx->self;
  for (int i = 0; i < d->neps; i++)
    memcpy(p->msg.addr + (size_t)i * d->addrLen, d->addrs[i], d->addrLen);
  *out = p;
  return ncclxSuccess;
}

static void pendingTrySend(ofiPending* p) {
  ofiDevice* d = p->obj.dev;
  if (p->sendPosted) return;
  size_t len = offsetof(ofiConnectMsg, addr) + (size_t)p->msg.neps * p->msg.addrLen;
  ssize_t ret = ofiPostTagged(d, 0, &p->sendOp, &p->obj, pendingSendDone, 1, &p->msg, len, NULL,
                              p->peer, OFI_CTRL_TAG(OFI_KIND_CONNECT, p->handle.listenId), 0);
  if (ret == 0) {
    p->sendPosted = 1;
  } else if (ret != -FI_EAGAIN && !p->failErr) {
    p->failErr = (int)-ret;
    snprintf(p->failMsg, sizeof(p->failMsg), "sending the connect message failed: %s",
             fi_strerror((int)-ret));
  }
}

/* A listener on this host that no longer exists will never answer. */
static void pendingCheckListener(ofiPending* p, uint64_t now) {
  ofiCtx* ctx = p->obj.dev->ctx;
  uint64_t period = (uint64_t)ctx->livenessMs * 1000000ull;
  if (ctx->livenessMs <= 0 || now - p->lastCheckNs < period) return;
  p->lastCheckNs = now;
  ofiIdentity who = {.hostHash = p->handle.hostHash,
                     .startTime = p->handle.startTime,
                     .pid = p->handle.pid,
                     .reserved = 0};
  if (!ctx->probeOnly && ofiPeerAlive(&ctx->self, &who) == 0 && !p->failErr) {
    p->failErr = FI_ECONNREFUSED;
    snprintf(p->failMsg, sizeof(p->failMsg),
             "the listening process (pid %u on this host) "
             "has exited",
             p->handle.pid);
  }
}

/* RDM: 1 when the listener's reply arrived, is valid, and the connect message's send
 * completed; peers[] are then the listener's endpoints. Sets p->failErr on a bad reply. */
static int rdmReplyReady(ofiPending* p, fi_addr_t* peers) {
  ofiDevice* d = p->obj.dev;
  const size_t replyHead = offsetof(ofiReplyMsg, addr);
  if (p->failErr || !p->replyDone) return 0;
  int refused = p->replyLen >= replyHead && p->reply.magic == OFI_REPLY_MAGIC &&
                (p->reply.status == OFI_REPLY_BAD_NONCE || p->reply.status == OFI_REPLY_NO_LISTENER);
  if (refused) {
    p->failErr = FI_ECONNREFUSED;
    snprintf(p->failMsg, sizeof(p->failMsg), "%s (a stale handle, or one from another job)",
             p->reply.status == OFI_REPLY_BAD_NONCE
                 ? "the listener refused the connection: wrong nonce"
                 : "the process at that address has no such listener (closed, or never ours)");
    return 0;
  }
  if (p->replyLen < replyHead || p->reply.magic != OFI_REPLY_MAGIC ||
      p->reply.status != OFI_REPLY_OK || p->reply.pendingId != p->pendingId ||
      p->reply.neps == 0 || p->reply.neps > d->neps || p->reply.addrLen != d->addrLen ||
      p->replyLen < replyHead + (size_t)p->reply.neps * p->reply.addrLen) {
    p->failErr = FI_EOTHER;
    snprintf(p->failMsg, sizeof(p->failMsg),
             "invalid connect reply (%zu bytes, status %u, %u endpoint(s))", p->replyLen,
             p->reply.status, (unsigned)p->reply.neps);
    return 0;
  }
  if (!p->sendDone) return 0;
  peers[0] = p->peer; /* the handle's address: endpoint 0 */
  for (int i = 1; i < p->reply.neps; i++)
    if (ofiPeerInsert(d, p->reply.addr + (size_t)i * p->reply.addrLen, p->reply.addrLen,
                      &peers[i]) != ncclxSuccess) {
      p->failErr = FI_EOTHER;
      snprintf(p->failMsg, sizeof(p->failMsg),
               "cannot add the listener's endpoint %d to the address vector", i);
      return 0;
    }
  return 1;
}

static ofiComm* rdmSendComm(ofiPending* p, const fi_addr_t* peers) {
  ofiIdentity who = p->reply.who;
  return ofiCommCreate(p->obj.dev, OFI_OBJ_SEND, peers, p->reply.neps, p->reply.connId,
                       p->pendingId, &who, p->peerName);
}

/* Connected mode: 1 once the connection is established with a valid answer (the rejection
 * of a wrong nonce arrives as a failed connect, see ofi_msg.c). */
static int msgReplyReady(ofiPending* p) {
  if (p->failErr || !p->replyDone) return 0;
  if (p->replyLen < sizeof(p->accepted) || p->accepted.magic != OFI_MSG_REPLY_MAGIC ||
      p->accepted.status != OFI_REPLY_OK) {
    p->failErr = FI_EOTHER;
    snprintf(p->failMsg, sizeof(p->failMsg),
             "the listener accepted with invalid connection data (%zu bytes): not an ncclx ofi "
             "listener of this version",
             p->replyLen);
    return 0;
  }
  return 1;
}

/* The send comm takes over the pending connect's endpoint. */
static ofiComm* msgSendComm(ofiPending* p) {
  fi_addr_t none = FI_ADDR_NOTAVAIL;
  ofiIdentity who = p->accepted.who;
  ofiComm* c = ofiCommCreate(p->obj.dev, OFI_OBJ_SEND, &none, 1, p->pendingId, 0, &who, p->peerName);
  if (!c) return NULL;
  c->ep = p->ep;
  c->connected = 1;
  p->ep = NULL;
  return c;
}

ncclxResult_t ofiConnect(void* vctx, int dev, const void* handle, void** sendComm) {
  ofiCtx* ctx = vctx;
  if (!ctx || !handle || !sendComm) return ncclxInternalError;
  *sendComm = NULL;
  ofiHandle h;
  memcpy(&h, handle, sizeof(h));
  if (dev < 0 || dev >= ctx->ndev) {
    OFI_WARN(ctx, "connect: device %d does not exist (%d devices)", dev, ctx->ndev);
    return ncclxInternalError;
  }
  if (h.magic != OFI_HANDLE_MAGIC || h.addrLen == 0 || h.addrLen > OFI_MAX_ADDR) {
    OFI_WARN(ctx, "connect: not a handle of this plugin (magic 0x%x, address of %u bytes)", h.magic,
             (unsigned)h.addrLen);
    return ncclxInternalError;
  }
  ofiDevice* d = &ctx->devs[dev];
  pthread_mutex_lock(&d->lock);
  ncclxResult_t res = ofiDeviceEnsureOpen(d);
  if (res != ncclxSuccess) {
    pthread_mutex_unlock(&d->lock);
    return res;
  }
  ofiPending* p = pendingTake(d, &h, sendComm);
  if (!p) res = pendingStart(d, &h, sendComm, &p);
  if (res != ncclxSuccess || !p) {
    pthread_mutex_unlock(&d->lock);
    return res;
  }
  if (!d->msgMode) pendingTrySend(p);
  if (ofiProgress(d) == 0) ofiArmPollFd(d);
  if (!p->replyDone) pendingCheckListener(p, ofiNowNs());
  fi_addr_t peers[OFI_MAX_EPS];
  int ready = d->msgMode ? msgReplyReady(p) : rdmReplyReady(p, peers);
  if (p->failErr) {
    res = p->failErr == FI_EOTHER ? ncclxRemoteError : ofiErrClass(p->failErr);
    OFI_WARN(ctx, "connect to %s (listener %u, pid %u) failed: %s", p->peerName, h.listenId, h.pid,
             p->failMsg);
    pendingFree(p);
  } else if (ready) {
    ofiComm* c = d->msgMode ? msgSendComm(p) : rdmSendComm(p, peers);
    if (!c) {
      res = ncclxSystemError;
    } else {
      OFI_TRACE(ctx, "connected to %s (listener %u) as connection %u over %d endpoint(s)",
                p->peerName, h.listenId, c->connId, c->neps);
      *sendComm = c;
    }
    pendingFree(p);
  } else {
    pendingPut(p);
  }
  pthread_mutex_unlock(&d->lock);
  return res;
}
