/* listen / connect / accept: non-blocking state machines over the TCP side channel.
 *
 *   sender (connect)                          receiver (accept)
 *   QPs in INIT, CTS receives posted
 *   -- TCP connect to the handle's address -->
 *   -- connection info {nonce, QPNs, PSNs, LID/GID} -->
 *                                             nonce must match the handle it issued,
 *                                             QPs to RTR + RTS with the sender's info
 *   <-- connection info of the receiver --
 *   QPs to RTR + RTS
 *   -- ready word -->                         recvComm handed to the core
 *
 * The receiver's QPs accept writes before the sender can send any, and the sender's CTS
 * receives are posted before the receiver can send a CTS; so no RDMA operation can meet a QP
 * that is not ready. Each side refuses records that do not decode or carry the wrong nonce. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <unistd.h>

#include "ib_internal.h"

#define IB_HANDSHAKE_TIMEOUT_NS (30ull * 1000000000ull)
#define IB_STALE_CONNECT_NS (120ull * 1000000000ull)
#define IB_MAX_INCOMING 256

enum { ST_CONNECTING = 0, ST_WRITE_INFO, ST_READ_INFO, ST_WRITE_READY, ST_READ_READY };

/* A connect in progress, found again by the caller's *sendComm slot and the handle's nonce. */
struct ibPending {
  ibPending* next;
  void** owner;
  uint64_t nonce;
  uint64_t lastTouch;
  int dev;
  int state;
  int fd;
  ibComm* comm;
  uint8_t out[IB_CONNINFO_BYTES], in[IB_CONNINFO_BYTES];
  size_t outLen, off;
  char peer[64];
};

/* A side-channel connection the listener accepted, not yet a recvComm. */
typedef struct {
  int fd;
  int state;
  uint64_t t0;
  size_t off, outLen;
  uint8_t in[IB_CONNINFO_BYTES], out[IB_CONNINFO_BYTES];
  ibComm* comm;
  char peer[64];
} ibIncoming;

typedef struct {
  ibHead head;
  int dev;
  int fd;
  int epfd;
  uint64_t nonce;
  int nqps;
  char addr[64];
  ibIncoming* inc;
  int ninc, cap;
} ibListenComm;

/* ---------- listen ---------- */

ncclxResult_t ibListen(void* vctx, int dev, void* handle, void** listenComm) {
  ibCtx* ctx = vctx;
  if (!ctx || !handle || !listenComm) return ncclxInternalError;
  *listenComm = NULL;
  if (dev < 0 || dev >= ctx->ndev) {
    IB_WARN(ctx, "listen: device %d does not exist (%d devices)", dev, ctx->ndev);
    return ncclxInternalError;
  }
  const ibDevice* d = &ctx->devs[dev];
  ibListenComm* lc = calloc(1, sizeof(*lc));
  if (!lc) return ncclxSystemError;
  ibSockAddr bound;
  memset(&bound, 0, sizeof(bound));
  lc->fd = ibOobListen(&ctx->oobAddr, &bound);
  if (lc->fd < 0) {
    char a[64];
    ibOobFormat(&ctx->oobAddr, a, sizeof(a));
    IB_WARN(ctx, "listen: side channel on %s (%s) failed: %s", a, ctx->oobIf, strerror(errno));
    free(lc);
    return ncclxSystemError;
  }
  lc->head.kind = IB_COMM_LISTEN;
  lc->head.ctx = ctx;
  lc->dev = dev;
  lc->epfd = -1;
  lc->nonce = ibRandom64();
  lc->nqps = ctx->cfg.qpsPerConn;
  ibOobFormat(&bound, lc->addr, sizeof(lc->addr));

  ibListenInfo li;
  memset(&li, 0, sizeof(li));
  li.nonce = lc->nonce;
  ibOobToWire(&bound, &li.family, li.addr, &li.tcpPort);
  li.lid = d->lid;
  memcpy(li.gid, d->gid, 16);
  li.linkLayer = d->linkLayer;
  li.ibPort = d->ibPort;
  li.mtu = d->mtu;
  li.nqps = lc->nqps;
  memset(handle, 0, NCCLX_NET_HANDLE_MAXSIZE);
  if (ibHandleEncode(&li, handle, NCCLX_NET_HANDLE_MAXSIZE) == 0) {
    IB_WARN(ctx, "listen: cannot encode the handle for %s", d->label);
    close(lc->fd);
    free(lc);
    return ncclxInternalError;
  }
  IB_TRACE(ctx, "listening on %s for %s", lc->addr, d->label);
  *listenComm = lc;
  return ncclxSuccess;
}

/* ---------- connect ---------- */

static void pendingFree(ibPending* p) {
  if (p->fd >= 0) close(p->fd);
  ibCommDestroy(p->comm);
  free(p);
}

/* Removes and returns this caller's connect in progress; frees ones abandoned long ago. */
static ibPending* pendingTake(ibCtx* ctx, void** owner, uint64_t nonce) {
  uint64_t now = ibNowNs();
  ibPending *found = NULL, *stale = NULL;
  pthread_mutex_lock(&ctx->lock);
  for (ibPending** pp = &ctx->pending; *pp;) {
    ibPending* p = *pp;
    if (!found && p->owner == owner && p->nonce == nonce) {
      *pp = p->next;
      found = p;
    } else if (now - p->lastTouch > IB_STALE_CONNECT_NS) {
      *pp = p->next;
      p->next = stale;
      stale = p;
    } else {
      pp = &p->next;
    }
  }
  pthread_mutex_unlock(&ctx->lock);
  while (stale) {
    ibPending* p = stale;
    stale = p->next;
    IB_WARN(ctx, "abandoned connect to %s dropped after 120 s without a retry", p->peer);
    pendingFree(p);
  }
  return found;
}

static void pendingPut(ibCtx* ctx, ibPending* p) {
  p->lastTouch = ibNowNs();
  pthread_mutex_lock(&ctx->lock);
  p->next = ctx->pending;
  ctx->pending = p;
  pthread_mutex_unlock(&ctx->lock);
}

void ibPendingFreeAll(ibCtx* ctx) {
  pthread_mutex_lock(&ctx->lock);
  ibPending* p = ctx->pending;
  ctx->pending = NULL;
  pthread_mutex_unlock(&ctx->lock);
  while (p) {
    ibPending* next = p->next;
    pendingFree(p);
    p = next;
  }
}

static ncclxResult_t connectStart(ibCtx* ctx, int dev, const ibListenInfo* li, ibPending* p) {
  const ibDevice* d = &ctx->devs[dev];
  if (li->linkLayer != d->linkLayer) {
    IB_WARN(ctx, "connect to %s: the receiver uses a %s port, %s is %s; both ends need the same "
            "link layer (check [net.ib] hca)", p->peer, ibLinkName(li->linkLayer), d->label,
            ibLinkName(d->linkLayer));
    return ncclxInvalidUsage;
  }
  ncclxResult_t res = ibCommCreate(ctx, dev, 1, li->nqps, &p->comm);
  if (res != ncclxSuccess) return res;
  ibConnInfo mine;
  ibCommLocalInfo(p->comm, IB_KIND_SENDER, li->nonce, &mine);
  p->outLen = ibConnInfoEncode(&mine, p->out, sizeof(p->out));
  if (p->outLen == 0) return ncclxInternalError;
  ibSockAddr to;
  ibOobFromWire(li->family, li->addr, li->tcpPort, &to);
  p->fd = ibOobConnectStart(&to);
  if (p->fd < 0) {
    IB_WARN(ctx, "connect to %s: %s", p->peer, strerror(errno));
    return ncclxSystemError;
  }
  p->state = ST_CONNECTING;
  return ncclxSuccess;
}

/* Advances a connect; *done = 1 when the sendComm is ready. */
static ncclxResult_t connectStep(ibCtx* ctx, ibPending* p, int* done) {
  *done = 0;
  for (;;) {
    int rc;
    switch (p->state) {
      case ST_CONNECTING:
        rc = ibOobConnectCheck(p->fd);
        if (rc == 1) {
          p->state = ST_WRITE_INFO;
          p->off = 0;
          continue;
        }
        break;
      case ST_WRITE_INFO:
        rc = ibOobSend(p->fd, p->out, p->outLen, &p->off);
        if (rc == 1) {
          p->state = ST_READ_INFO;
          p->off = 0;
          continue;
        }
        break;
      case ST_READ_INFO: {
        rc = ibOobRecv(p->fd, p->in, IB_CONNINFO_BYTES, &p->off);
        if (rc != 1) break;
        ibConnInfo theirs;
        const char* why = ibConnInfoDecode(p->in, IB_CONNINFO_BYTES, IB_KIND_RECEIVER, &theirs);
        if (!why && theirs.nonce != p->nonce) why = "wrong nonce";
        if (!why && theirs.nqps != p->comm->nqps) why = "different queue pair count";
        if (why) {
          IB_WARN(ctx, "connect to %s: invalid connection info from the receiver: %s", p->peer, why);
          return ncclxRemoteError;
        }
        ncclxResult_t res = ibCommConnectQps(p->comm, &theirs);
        if (res != ncclxSuccess) return res;
        p->outLen = ibReadyEncode(p->nonce, p->out, sizeof(p->out));
        p->off = 0;
        p->state = ST_WRITE_READY;
        continue;
      }
      case ST_WRITE_READY:
        rc = ibOobSend(p->fd, p->out, p->outLen, &p->off);
        if (rc == 1) {
          *done = 1;
          return ncclxSuccess;
        }
        break;
      default:
        return ncclxInternalError;
    }
    if (rc < 0) {
      int e = errno;
      IB_WARN(ctx, "connect to %s failed during the handshake: %s%s", p->peer, strerror(e),
              e == ECONNRESET ? " (the receiver refused us: stale handle, or it is gone)" : "");
      return ncclxRemoteError;
    }
    return ncclxSuccess; /* would block: the core calls again */
  }
}

ncclxResult_t ibConnect(void* vctx, int dev, const void* handle, void** sendComm) {
  ibCtx* ctx = vctx;
  if (!ctx || !handle || !sendComm) return ncclxInternalError;
  *sendComm = NULL;
  if (dev < 0 || dev >= ctx->ndev) {
    IB_WARN(ctx, "connect: device %d does not exist (%d devices)", dev, ctx->ndev);
    return ncclxInternalError;
  }
  ibListenInfo li;
  const char* why = ibHandleDecode(handle, NCCLX_NET_HANDLE_MAXSIZE, &li);
  if (why) {
    IB_WARN(ctx, "connect: the handle is not a net_ib listen handle: %s", why);
    return ncclxInternalError;
  }
  ibPending* p = pendingTake(ctx, sendComm, li.nonce);
  ncclxResult_t res = ncclxSuccess;
  if (!p) {
    if (!(p = calloc(1, sizeof(*p)))) return ncclxSystemError;
    p->owner = sendComm;
    p->nonce = li.nonce;
    p->dev = dev;
    p->fd = -1;
    ibSockAddr to;
    ibOobFromWire(li.family, li.addr, li.tcpPort, &to);
    ibOobFormat(&to, p->peer, sizeof(p->peer));
    res = connectStart(ctx, dev, &li, p);
  }
  int done = 0;
  if (res == ncclxSuccess) res = connectStep(ctx, p, &done);
  if (res != ncclxSuccess) {
    pendingFree(p);
    return res;
  }
  if (!done) {
    pendingPut(ctx, p);
    return ncclxSuccess;
  }
  ibComm* c = p->comm;
  c->oobFd = p->fd;
  snprintf(c->peer, sizeof(c->peer), "%s", p->peer);
  p->comm = NULL;
  p->fd = -1;
  pendingFree(p);
  IB_TRACE(ctx, "connected to %s over %s with %d QP(s)", c->peer, c->dev->label, c->nqps);
  *sendComm = c;
  return ncclxSuccess;
}

/* ---------- accept ---------- */

static void incomingDrop(ibListenComm* lc, int i, const char* why) {
  ibIncoming* in = &lc->inc[i];
  if (why)
    IB_WARN(lc->head.ctx, "refused connection from %s on %s: %s", in->peer, lc->addr, why);
  if (lc->epfd >= 0) epoll_ctl(lc->epfd, EPOLL_CTL_DEL, in->fd, NULL);
  close(in->fd);
  ibCommDestroy(in->comm);
  lc->inc[i] = lc->inc[--lc->ninc];
}

static void watch(int epfd, int fd) {
  if (epfd < 0) return;
  struct epoll_event ev;
  memset(&ev, 0, sizeof(ev));
  ev.events = EPOLLIN;
  ev.data.fd = fd;
  epoll_ctl(epfd, EPOLL_CTL_ADD, fd, &ev);
}

static ncclxResult_t acceptNew(ibListenComm* lc) {
  ibCtx* ctx = lc->head.ctx;
  for (;;) {
    ibSockAddr peer;
    memset(&peer, 0, sizeof(peer));
    int fd = ibOobAccept(lc->fd, &peer);
    if (fd < 0) {
      if (errno == EAGAIN) return ncclxSuccess;
      IB_WARN(ctx, "accept on %s failed: %s", lc->addr, strerror(errno));
      return ncclxSystemError;
    }
    char name[64];
    ibOobFormat(&peer, name, sizeof(name));
    if (lc->ninc >= IB_MAX_INCOMING) {
      IB_WARN(ctx, "refused connection from %s on %s: %d handshakes already in progress", name,
              lc->addr, lc->ninc);
      close(fd);
      continue;
    }
    if (lc->ninc == lc->cap) {
      int cap = lc->cap ? 2 * lc->cap : 8;
      ibIncoming* v = realloc(lc->inc, (size_t)cap * sizeof(*v));
      if (!v) {
        close(fd);
        return ncclxSystemError;
      }
      lc->inc = v;
      lc->cap = cap;
    }
    ibIncoming* in = &lc->inc[lc->ninc++];
    memset(in, 0, sizeof(*in));
    in->fd = fd;
    in->state = ST_READ_INFO;
    in->t0 = ibNowNs();
    snprintf(in->peer, sizeof(in->peer), "%s", name);
    watch(lc->epfd, fd);
  }
}

/* Sender info arrived: check it, bring the QPs up, prepare our answer. NULL = refused. */
static ncclxResult_t acceptInfo(ibListenComm* lc, ibIncoming* in, const char** refusal) {
  ibCtx* ctx = lc->head.ctx;
  ibConnInfo theirs;
  *refusal = ibConnInfoDecode(in->in, IB_CONNINFO_BYTES, IB_KIND_SENDER, &theirs);
  if (*refusal) return ncclxSuccess;
  if (theirs.nonce != lc->nonce) {
    *refusal = "wrong nonce (a stranger, or a sender holding a stale handle)";
    return ncclxSuccess;
  }
  if (theirs.nqps != lc->nqps) {
    *refusal = "queue pair count differs from the handle";
    return ncclxSuccess;
  }
  if (theirs.linkLayer != ctx->devs[lc->dev].linkLayer) {
    *refusal = "the sender's port has a different link layer";
    return ncclxSuccess;
  }
  ncclxResult_t res = ibCommCreate(ctx, lc->dev, 0, lc->nqps, &in->comm);
  if (res == ncclxSuccess) res = ibCommConnectQps(in->comm, &theirs);
  if (res != ncclxSuccess) return res;
  ibConnInfo mine;
  ibCommLocalInfo(in->comm, IB_KIND_RECEIVER, lc->nonce, &mine);
  in->outLen = ibConnInfoEncode(&mine, in->out, sizeof(in->out));
  return in->outLen ? ncclxSuccess : ncclxInternalError;
}

/* Advances handshake i. *ready = 1 when its recvComm is complete. */
static ncclxResult_t acceptStep(ibListenComm* lc, int i, int* ready, int* dropped) {
  ibIncoming* in = &lc->inc[i];
  *ready = 0;
  *dropped = 0;
  for (;;) {
    int rc;
    if (in->state == ST_READ_INFO) {
      rc = ibOobRecv(in->fd, in->in, IB_CONNINFO_BYTES, &in->off);
      if (rc == 1) {
        const char* refusal = NULL;
        ncclxResult_t res = acceptInfo(lc, in, &refusal);
        if (res != ncclxSuccess || refusal) {
          incomingDrop(lc, i, refusal ? refusal : "could not set up queue pairs");
          *dropped = 1;
          return res;
        }
        in->state = ST_WRITE_INFO;
        in->off = 0;
        continue;
      }
    } else if (in->state == ST_WRITE_INFO) {
      rc = ibOobSend(in->fd, in->out, in->outLen, &in->off);
      if (rc == 1) {
        in->state = ST_READ_READY;
        in->off = 0;
        continue;
      }
    } else {
      rc = ibOobRecv(in->fd, in->in, IB_READY_BYTES, &in->off);
      if (rc == 1) {
        const char* why = ibReadyDecode(in->in, IB_READY_BYTES, lc->nonce);
        if (why) {
          incomingDrop(lc, i, why);
          *dropped = 1;
          return ncclxSuccess;
        }
        *ready = 1;
        return ncclxSuccess;
      }
    }
    if (rc < 0) {
      char why[128];
      snprintf(why, sizeof(why), "side channel failed during the handshake: %s", strerror(errno));
      incomingDrop(lc, i, why);
      *dropped = 1;
    } else if (ibNowNs() - in->t0 > IB_HANDSHAKE_TIMEOUT_NS) {
      incomingDrop(lc, i, "handshake not finished within 30 s");
      *dropped = 1;
    }
    return ncclxSuccess;
  }
}

ncclxResult_t ibAccept(void* listenComm, void** recvComm) {
  ibListenComm* lc = listenComm;
  if (!lc || !recvComm || lc->head.kind != IB_COMM_LISTEN) return ncclxInternalError;
  *recvComm = NULL;
  ncclxResult_t res = acceptNew(lc);
  if (res != ncclxSuccess) return res;
  for (int i = 0; i < lc->ninc;) {
    int ready = 0, dropped = 0;
    res = acceptStep(lc, i, &ready, &dropped);
    if (res != ncclxSuccess) return res;
    if (dropped) continue;
    if (!ready) {
      i++;
      continue;
    }
    ibIncoming* in = &lc->inc[i];
    ibComm* c = in->comm;
    if (lc->epfd >= 0) epoll_ctl(lc->epfd, EPOLL_CTL_DEL, in->fd, NULL);
    c->oobFd = in->fd;
    snprintf(c->peer, sizeof(c->peer), "%s", in->peer);
    lc->inc[i] = lc->inc[--lc->ninc];
    IB_TRACE(lc->head.ctx, "accepted %s on %s with %d QP(s)", c->peer, c->dev->label, c->nqps);
    *recvComm = c;
    return ncclxSuccess;
  }
  return ncclxSuccess;
}

ncclxResult_t ibCloseListen(void* listenComm) {
  ibListenComm* lc = listenComm;
  if (!lc || lc->head.kind != IB_COMM_LISTEN) return ncclxInternalError;
  while (lc->ninc > 0) incomingDrop(lc, lc->ninc - 1, NULL);
  close(lc->fd);
  if (lc->epfd >= 0) close(lc->epfd);
  free(lc->inc);
  lc->head.kind = 0;
  free(lc);
  return ncclxSuccess;
}

/* Readable on a new connection or handshake bytes. */
ncclxResult_t ibListenPollFd(void* listenComm, int* fd) {
  ibListenComm* lc = listenComm;
  if (lc->epfd < 0) {
    if ((lc->epfd = epoll_create1(EPOLL_CLOEXEC)) < 0) return ncclxSystemError;
    watch(lc->epfd, lc->fd);
    for (int i = 0; i < lc->ninc; i++) watch(lc->epfd, lc->inc[i].fd);
  }
  *fd = lc->epfd;
  return ncclxSuccess;
}
