/* The data path: registration, isend/irecv, completion handling, test, close, poll fds.
 * The protocol (CTS records, one write-with-immediate per QP and message) is described in
 * ib_proto.h; the bookkeeping rules live in ib_slots.c and ib_proto.c. */
#include <endian.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/epoll.h>
#include <unistd.h>

#include "ib_internal.h"
#include "ncclx/profiler.h"

#define IB_POLL_BATCH 16
#define IB_PEER_CHECK_NS 1000000ull    /* look at the side channel at most every 1 ms when idle */
#define IB_PEER_GRACE_NS 1000000000ull /* completions still on their way when the peer closed */

static char ibEmptyMr; /* the mhandle of a zero-byte registration */

static const char* commDir(const ibComm* c) {
  return c->head.kind == IB_COMM_SEND ? "send to" : "receive from";
}

static ncclxResult_t commFailV(ibComm* c, ncclxResult_t res, int stopQps, const char* fmt,
                               va_list ap) {
  if (c->err != ncclxSuccess) return c->err;
  char msg[384];
  vsnprintf(msg, sizeof(msg), fmt, ap);
  IB_WARN(c->head.ctx, "%s %s over %s: %s", commDir(c), c->peer[0] ? c->peer : "(connecting)",
          c->dev->label, msg);
  c->err = res;
  /* Stop the hardware too: nothing may land in buffers the core now considers failed. */
  for (int j = 0; stopQps && j < c->nqps; j++) {
    struct ibv_qp_attr at;
    memset(&at, 0, sizeof(at));
    at.qp_state = IBV_QPS_ERR;
    if (c->qps[j]) ibv_modify_qp(c->qps[j], &at, IBV_QP_STATE);
  }
  return res;
}

ncclxResult_t ibCommFail(ibComm* c, ncclxResult_t res, const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  ncclxResult_t r = commFailV(c, res, 1, fmt, ap);
  va_end(ap);
  return r;
}

/* For errors the peer must still hear about: the QPs keep running, or moving them to the
 * error state would flush the notification we just posted. */
static ncclxResult_t commFailNotifying(ibComm* c, ncclxResult_t res, const char* fmt, ...)
    __attribute__((format(printf, 3, 4)));
static ncclxResult_t commFailNotifying(ibComm* c, ncclxResult_t res, const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  ncclxResult_t r = commFailV(c, res, 0, fmt, ap);
  va_end(ap);
  return r;
}

ncclxResult_t ibPostCtsRecv(ibComm* c, uint64_t seq) {
  int slot = ibRingSlot(seq);
  struct ibv_sge sge;
  sge.addr = (uintptr_t)(c->ctl + (size_t)slot * IB_CTS_BYTES);
  sge.length = IB_CTS_BYTES;
  sge.lkey = c->ctlMr->lkey;
  struct ibv_recv_wr wr, *bad = NULL;
  memset(&wr, 0, sizeof(wr));
  wr.wr_id = ibWrId(IB_WR_CTS_RECV, 0, slot, seq);
  wr.sg_list = &sge;
  wr.num_sge = 1;
  int rc = ibv_post_recv(c->qps[0], &wr, &bad);
  if (rc != 0) return ibCommFail(c, ncclxSystemError, "ibv_post_recv (CTS) failed: %s", strerror(rc));
  return ncclxSuccess;
}

/* ---------- completions ---------- */

static ncclxResult_t wcFailed(ibComm* c, const struct ibv_wc* wc, int kind) {
  if (c->err != ncclxSuccess) return c->err; /* flushes that follow the first error */
  ncclxResult_t res = ncclxSystemError;
  const char* hint = "";
  switch (wc->status) {
    case IBV_WC_RETRY_EXC_ERR:
    case IBV_WC_RNR_RETRY_EXC_ERR:
      hint = " (no answer from the peer within timeout * retry_cnt: it is gone or unreachable)";
      res = ncclxRemoteError;
      break;
    case IBV_WC_REM_ACCESS_ERR:
    case IBV_WC_REM_INV_REQ_ERR:
    case IBV_WC_REM_OP_ERR:
    case IBV_WC_REM_ABORT_ERR:
    case IBV_WC_REM_INV_RD_REQ_ERR:
      res = ncclxRemoteError;
      break;
    default:
      break;
  }
  static const char* const kinds[] = {"?", "data write", "data receive", "CTS send", "CTS receive"};
  return ibCommFail(c, res, "%s completion failed on QP %u: %s (vendor error 0x%x)%s",
                    kinds[kind >= 1 && kind <= 4 ? kind : 0], wc->qp_num,
                    ibv_wc_status_str(wc->status), wc->vendor_err, hint);
}

static ncclxResult_t handleWc(ibComm* c, const struct ibv_wc* wc) {
  int kind, qp, slot;
  uint32_t seqLow;
  uint64_t seq = 0;
  ibWrIdDecode(wc->wr_id, &kind, &qp, &slot, &seqLow);
  if (wc->status != IBV_WC_SUCCESS) return wcFailed(c, wc, kind);
  switch (kind) {
    case IB_WR_DATA_SEND:
      if (!ibRingMatch(&c->ring, slot, seqLow, &seq))
        return ibCommFail(c, ncclxInternalError, "write completion for no posted send");
      ibReqSendPart(&c->ring.r[slot]);
      return ncclxSuccess;
    case IB_WR_DATA_RECV: {
      if (wc->opcode != IBV_WC_RECV_RDMA_WITH_IMM || !(wc->wc_flags & IBV_WC_WITH_IMM))
        return ibCommFail(c, ncclxRemoteError, "the peer sent a message where a write with "
                          "immediate was expected (not an ncclx net_ib peer?)");
      if (!ibRingMatch(&c->ring, slot, seqLow, &seq))
        return ibCommFail(c, ncclxInternalError, "data for no posted receive");
      int done = 0;
      const char* why = ibReqRecvPart(&c->ring.r[slot], be32toh(wc->imm_data), &done);
      if (why) return ibCommFail(c, ncclxRemoteError, "message %llu: %s", (unsigned long long)seq, why);
      return ncclxSuccess;
    }
    case IB_WR_CTS_SEND:
      c->ctsInFlight--;
      return ncclxSuccess;
    case IB_WR_CTS_RECV:
      if (seqLow != (uint32_t)c->ctsArrived)
        return ibCommFail(c, ncclxInternalError, "CTS receive completed out of order");
      if (wc->byte_len != IB_CTS_BYTES)
        return ibCommFail(c, ncclxRemoteError, "CTS record of %u bytes (expected %d)", wc->byte_len,
                          IB_CTS_BYTES);
      c->ctsArrived++;
      return ncclxSuccess;
    default:
      return ibCommFail(c, ncclxInternalError, "completion with unknown work request id 0x%llx",
                        (unsigned long long)wc->wr_id);
  }
}

static int pollCq(ibComm* c) {
  int total = 0;
  for (int round = 0; round < 4; round++) {
    struct ibv_wc wc[IB_POLL_BATCH];
    int n = ibv_poll_cq(c->cq, IB_POLL_BATCH, wc);
    if (n < 0) {
      ibCommFail(c, ncclxSystemError, "ibv_poll_cq failed");
      return total;
    }
    for (int i = 0; i < n; i++) handleWc(c, &wc[i]);
    total += n;
    if (n < IB_POLL_BATCH) break;
  }
  return total;
}

/* The side channel carries nothing after the handshake: EOF means the peer closed. */
static void peerCheck(ibComm* c) {
  uint64_t now = ibNowNs();
  if (c->oobFd >= 0 && !c->peerGoneNs && now - c->lastPeerCheckNs > IB_PEER_CHECK_NS) {
    c->lastPeerCheckNs = now;
    int st = ibOobPeerState(c->oobFd);
    if (st == 2) {
      ibCommFail(c, ncclxRemoteError, "unexpected bytes on the side channel");
      return;
    }
    if (st == 1) {
      c->peerGoneNs = now;
      if (c->epfd >= 0) epoll_ctl(c->epfd, EPOLL_CTL_DEL, c->oobFd, NULL);
    }
  }
  if (c->peerGoneNs && now - c->peerGoneNs > IB_PEER_GRACE_NS &&
      (ibRingOutstanding(&c->ring) > 0 || c->waitingCts))
    ibCommFail(c, ncclxRemoteError, "the peer closed the connection (process exited or comm "
               "closed) with transfers pending");
}

static ncclxResult_t progress(ibComm* c) {
  struct ibv_cq* cq;
  void* cqCtx;
  unsigned events = 0;
  while (ibv_get_cq_event(c->chan, &cq, &cqCtx) == 0) events++;
  if (events) {
    ibv_ack_cq_events(c->cq, events);
    c->armed = 0;
  }
  int n = pollCq(c);
  /* Only when the core sleeps on our fd: re-arm, then poll once more so a completion that
   * came in between is not left waiting for an event that will never be sent. */
  if (c->epfd >= 0 && !c->armed && c->err == ncclxSuccess) {
    int rc = ibv_req_notify_cq(c->cq, 0);
    if (rc != 0) return ibCommFail(c, ncclxSystemError, "ibv_req_notify_cq failed: %s", strerror(rc));
    c->armed = 1;
    n += pollCq(c);
  }
  if (n == 0) peerCheck(c);
  return c->err;
}

/* ---------- registration ---------- */

static ibComm* dataComm(void* comm) {
  ibHead* h = comm;
  return (h && (h->kind == IB_COMM_SEND || h->kind == IB_COMM_RECV)) ? (ibComm*)comm : NULL;
}

ncclxResult_t ibRegMr(void* comm, void* data, size_t size, int type, void** mhandle) {
  ibComm* c = dataComm(comm);
  if (!c || !mhandle) return ncclxInternalError;
  *mhandle = NULL;
  ibCtx* ctx = c->head.ctx;
  if (type != NCCLX_PTR_HOST) {
    IB_WARN(ctx, "regMr: pointer type %d of %p (%zu bytes) is not supported: net_ib moves host "
            "memory only", type, data, size);
    return ncclxInvalidArgument;
  }
  if (size == 0) {
    *mhandle = &ibEmptyMr;
    return ncclxSuccess;
  }
  if (!data) {
    IB_WARN(ctx, "regMr: NULL buffer for %zu bytes", size);
    return ncclxInvalidArgument;
  }
  int access = c->head.kind == IB_COMM_RECV ? IB_MR_REMOTE_WRITE : IB_MR_LOCAL;
  ibMrEntry* e = NULL;
  ncclxResult_t res = ibMrAcquire(c->dev, ctx, data, size, access, &e);
  if (res == ncclxSuccess) *mhandle = e;
  return res;
}

ncclxResult_t ibDeregMr(void* comm, void* mhandle) {
  ibComm* c = dataComm(comm);
  if (!c) return ncclxInternalError;
  if (mhandle == NULL || mhandle == &ibEmptyMr) return ncclxSuccess;
  ibDevice* d = c->dev;
  pthread_mutex_lock(&d->mrLock);
  int owned = ibMrCacheOwns(&d->mr, mhandle);
  if (owned) ibMrCacheRelease(&d->mr, mhandle);
  pthread_mutex_unlock(&d->mrLock);
  if (!owned) {
    IB_WARN(c->head.ctx, "deregMr: %p is not a live registration of %s", mhandle, d->label);
    return ncclxInternalError;
  }
  return ncclxSuccess;
}

/* The key for a transfer: from the caller's mhandle, or a registration taken for it. */
static ncclxResult_t transferMr(ibComm* c, void* data, size_t size, void* mhandle, int access,
                                ibMrEntry** own, const ibMrEntry** use) {
  *own = NULL;
  *use = NULL;
  if (size == 0) return ncclxSuccess;
  if (mhandle && mhandle != &ibEmptyMr) {
    ibDevice* d = c->dev;
    pthread_mutex_lock(&d->mrLock);
    int ok = ibMrCacheOwns(&d->mr, mhandle) && ibMrEntryCovers(mhandle, data, size) &&
             (((const ibMrEntry*)mhandle)->access & access) == access;
    pthread_mutex_unlock(&d->mrLock);
    if (!ok) {
      IB_WARN(c->head.ctx, "%s %s: mhandle %p does not cover %p + %zu bytes with %s access",
              commDir(c), c->peer, mhandle, data, size, access ? "remote-write" : "local");
      return ncclxInternalError;
    }
    *use = mhandle;
    return ncclxSuccess;
  }
  ncclxResult_t res = ibMrAcquire(c->dev, c->head.ctx, data, size, access, own);
  *use = *own;
  return res;
}

/* ---------- requests ---------- */

static ibRequest* requestStart(ibComm* c, uint64_t seq, ibMrEntry* own, void* phandle,
                               size_t bytes) {
  int slot = ibRingSlot(seq);
  ibRequest* r = &c->reqs[slot];
  memset(r, 0, sizeof(*r));
  r->magic = IB_REQ_MAGIC;
  r->comm = c;
  r->slot = slot;
  r->seq = seq;
  r->mr = own;
  ibCtx* ctx = c->head.ctx;
  if (phandle && ctx->profiler) {
    r->prof.version = 1;
    r->prof.isSend = c->head.kind == IB_COMM_SEND;
    r->prof.dev = c->devIndex;
    r->prof.qpn = c->qps[0]->qp_num;
    r->prof.nqps = c->nqps;
    r->prof.seq = seq;
    r->prof.bytes = bytes;
    if (ctx->profiler(&r->eHandle, NCCLX_PROFILER_NET_START, phandle, NCCLX_IB_PROFILER_ID,
                      &r->prof) != ncclxSuccess)
      r->eHandle = NULL;
  }
  return r;
}

/* Returns what the slot holds to the pools; the request is never passed again. */
static void requestFinish(ibComm* c, ibRequest* r) {
  ibCtx* ctx = c->head.ctx;
  if (r->eHandle) ctx->profiler(&r->eHandle, NCCLX_PROFILER_NET_STOP, NULL, NCCLX_IB_PROFILER_ID, NULL);
  r->eHandle = NULL;
  if (r->mr) ibMrRelease(c->dev, r->mr);
  r->mr = NULL;
  r->magic = 0;
  ibRingRelease(&c->ring, &c->ring.r[r->slot]);
}

ncclxResult_t ibIsend(void* sendComm, void* data, size_t size, int tag, void* mhandle,
                      void* phandle, void** request) {
  (void)tag; /* one buffer per receive: the tag has nothing to select */
  ibComm* c = sendComm;
  if (!c || !request || c->head.kind != IB_COMM_SEND) return ncclxInternalError;
  *request = NULL;
  ibCtx* ctx = c->head.ctx;
  if (c->err != ncclxSuccess) return c->err;
  if (size > IB_MAX_MESSAGE || (size > 0 && !data)) {
    IB_WARN(ctx, "isend to %s: %s (%zu bytes at %p)", c->peer,
            size > IB_MAX_MESSAGE ? "larger than maxMessageBytes" : "NULL buffer", size, data);
    return ncclxInternalError;
  }
  if (!ibRingCanPost(&c->ring)) return ncclxSuccess; /* full: the core retries */
  ncclxResult_t res = progress(c);
  if (res != ncclxSuccess) return res;
  uint64_t seq = c->ring.next;
  if (c->ctsArrived <= seq) { /* the receiver has not posted this receive yet */
    c->waitingCts = 1;
    return ncclxSuccess;
  }
  c->waitingCts = 0;
  int slot = ibRingSlot(seq);
  ibCts cts;
  const char* why = ibCtsDecode(c->ctl + (size_t)slot * IB_CTS_BYTES, seq, &cts);
  if (why) return ibCommFail(c, ncclxRemoteError, "message %llu: %s", (unsigned long long)seq, why);
  int tooLarge = size > cts.size;
  ibMrEntry* own = NULL;
  const ibMrEntry* use = NULL;
  if (!tooLarge) {
    res = transferMr(c, data, size, mhandle, IB_MR_LOCAL, &own, &use);
    if (res != ncclxSuccess) return res;
  }
  ibRingPost(&c->ring, size, c->nqps);
  ibRequest* r = requestStart(c, seq, own, phandle, size);

  /* One write with immediate per QP; a too-large message sends only the error flag. */
  uint32_t imm = htobe32(ibImmEncode(size, tooLarge));
  for (int j = 0; j < c->nqps; j++) {
    size_t off = 0, len = 0;
    if (!tooLarge) ibStripe(size, c->nqps, (int)(seq % (uint64_t)c->nqps), j, &off, &len);
    struct ibv_sge sge;
    sge.addr = (uintptr_t)data + off;
    sge.length = (uint32_t)len;
    sge.lkey = use ? ibMrLkey(use) : 0;
    struct ibv_send_wr wr, *bad = NULL;
    memset(&wr, 0, sizeof(wr));
    wr.wr_id = ibWrId(IB_WR_DATA_SEND, j, slot, seq);
    wr.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.imm_data = imm;
    wr.wr.rdma.remote_addr = cts.addr + off;
    wr.wr.rdma.rkey = cts.rkey;
    if (len > 0) {
      wr.sg_list = &sge;
      wr.num_sge = 1;
    }
    int rc = ibv_post_send(c->qps[j], &wr, &bad);
    if (rc != 0) return ibCommFail(c, ncclxSystemError, "ibv_post_send failed: %s", strerror(rc));
  }
  /* This CTS buffer is read: it can receive the record of message seq + IB_QUEUE. */
  res = ibPostCtsRecv(c, seq + IB_QUEUE);
  if (res != ncclxSuccess) return res;
  if (tooLarge)
    return commFailNotifying(c, ncclxRemoteError, "message %llu has %zu bytes but the receive the peer "
                      "posted holds only %llu", (unsigned long long)seq, size,
                      (unsigned long long)cts.size);
  *request = r;
  return ncclxSuccess;
}

ncclxResult_t ibIrecv(void* recvComm, int n, void** data, size_t* sizes, int* tags,
                      void** mhandles, void** phandles, void** request) {
  (void)tags;
  ibComm* c = recvComm;
  if (!c || !request || c->head.kind != IB_COMM_RECV) return ncclxInternalError;
  *request = NULL;
  ibCtx* ctx = c->head.ctx;
  if (n != 1 || !data || !sizes) {
    IB_WARN(ctx, "irecv from %s: %d buffers requested, maxRecvs is 1", c->peer, n);
    return ncclxInternalError;
  }
  void* buf = data[0];
  size_t size = sizes[0];
  if (size > 0 && !buf) {
    IB_WARN(ctx, "irecv from %s: NULL buffer for %zu bytes", c->peer, size);
    return ncclxInternalError;
  }
  if (c->err != ncclxSuccess) return c->err;
  if (size > IB_MAX_MESSAGE) size = IB_MAX_MESSAGE; /* no send can be larger */
  if (!ibRingCanPost(&c->ring)) return ncclxSuccess;
  if (c->ctsInFlight >= IB_QUEUE) {
    ncclxResult_t res = progress(c);
    if (res != ncclxSuccess) return res;
    if (c->ctsInFlight >= IB_QUEUE) return ncclxSuccess;
  }
  ibMrEntry* own = NULL;
  const ibMrEntry* use = NULL;
  ncclxResult_t res = transferMr(c, buf, size, mhandles ? mhandles[0] : NULL, IB_MR_REMOTE_WRITE,
                                 &own, &use);
  if (res != ncclxSuccess) return res;
  uint64_t seq = c->ring.next;
  int slot = ibRingSlot(seq);
  ibRingPost(&c->ring, size, c->nqps);
  ibRequest* r = requestStart(c, seq, own, phandles ? phandles[0] : NULL, size);

  /* Receives first, then the CTS: the sender can never write before they are posted. */
  for (int j = 0; j < c->nqps; j++) {
    struct ibv_recv_wr wr, *bad = NULL;
    memset(&wr, 0, sizeof(wr));
    wr.wr_id = ibWrId(IB_WR_DATA_RECV, j, slot, seq);
    int rc = ibv_post_recv(c->qps[j], &wr, &bad);
    if (rc != 0) return ibCommFail(c, ncclxSystemError, "ibv_post_recv failed: %s", strerror(rc));
  }
  ibCts cts;
  cts.seq = seq;
  cts.addr = (uintptr_t)buf;
  cts.size = size;
  cts.rkey = use ? ibMrRkey(use) : 0;
  uint8_t* rec = c->ctl + (size_t)slot * IB_CTS_BYTES;
  ibCtsEncode(&cts, rec);
  struct ibv_sge sge;
  sge.addr = (uintptr_t)rec;
  sge.length = IB_CTS_BYTES;
  sge.lkey = c->ctlMr->lkey;
  struct ibv_send_wr wr, *bad = NULL;
  memset(&wr, 0, sizeof(wr));
  wr.wr_id = ibWrId(IB_WR_CTS_SEND, 0, slot, seq);
  wr.opcode = IBV_WR_SEND;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  int rc = ibv_post_send(c->qps[0], &wr, &bad);
  if (rc != 0) return ibCommFail(c, ncclxSystemError, "ibv_post_send (CTS) failed: %s", strerror(rc));
  c->ctsInFlight++;
  *request = r;
  return ncclxSuccess;
}

ncclxResult_t ibTest(void* request, int* done, size_t* sizes) {
  ibRequest* r = request;
  if (!done) return ncclxInternalError;
  *done = 0;
  if (!r || r->magic != IB_REQ_MAGIC) return ncclxInternalError;
  ibComm* c = r->comm;
  ibReqState* st = &c->ring.r[r->slot];
  if (st->state == IB_REQ_FREE || st->seq != r->seq) return ncclxInternalError;
  if (st->state == IB_REQ_POSTED) progress(c);
  if (st->state == IB_REQ_DONE) {
    *done = 1;
    if (sizes) sizes[0] = c->head.kind == IB_COMM_SEND ? st->size : st->msgSize;
    requestFinish(c, r);
    return ncclxSuccess;
  }
  if (st->state == IB_REQ_FAILED || c->err != ncclxSuccess) {
    ncclxResult_t res = c->err != ncclxSuccess ? c->err : ncclxRemoteError;
    requestFinish(c, r);
    return res;
  }
  return ncclxSuccess;
}

/* ---------- close and poll ---------- */

static ncclxResult_t closeComm(void* comm, uint32_t kind) {
  ibComm* c = comm;
  if (!c || c->head.kind != kind) return ncclxInternalError;
  /* QPs go first: after that no hardware touches the buffers we release below. */
  for (int j = 0; j < c->nqps; j++) {
    if (c->qps[j]) ibv_destroy_qp(c->qps[j]);
    c->qps[j] = NULL;
  }
  for (int s = 0; s < IB_QUEUE; s++) {
    ibRequest* r = &c->reqs[s];
    if (r->magic == IB_REQ_MAGIC) requestFinish(c, r);
  }
  ibCommDestroy(c);
  return ncclxSuccess;
}

ncclxResult_t ibCloseSend(void* sendComm) { return closeComm(sendComm, IB_COMM_SEND); }
ncclxResult_t ibCloseRecv(void* recvComm) { return closeComm(recvComm, IB_COMM_RECV); }

/* Readable when a completion may be waiting (completion channel) or the peer closed. */
ncclxResult_t ibGetPollFd(void* comm, int* fd) {
  if (!fd || !comm) return ncclxInternalError;
  *fd = -1;
  ibHead* h = comm;
  if (h->kind == IB_COMM_LISTEN) return ibListenPollFd(comm, fd);
  ibComm* c = dataComm(comm);
  if (!c) return ncclxInternalError;
  if (c->epfd < 0) {
    if ((c->epfd = epoll_create1(EPOLL_CLOEXEC)) < 0) return ncclxSystemError;
    struct epoll_event ev;
    memset(&ev, 0, sizeof(ev));
    ev.events = EPOLLIN;
    ev.data.fd = c->chan->fd;
    epoll_ctl(c->epfd, EPOLL_CTL_ADD, c->chan->fd, &ev);
    if (c->oobFd >= 0 && !c->peerGoneNs) {
      ev.events = EPOLLIN | EPOLLRDHUP;
      ev.data.fd = c->oobFd;
      epoll_ctl(c->epfd, EPOLL_CTL_ADD, c->oobFd, &ev);
    }
    progress(c); /* arms the completion notification */
  }
  *fd = c->epfd;
  return ncclxSuccess;
}
