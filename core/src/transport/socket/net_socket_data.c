/* Socket network data path: comm life cycle, message layout over the sockets, send and
 * receive progress, isend / irecv / test and close. */
#include "transport/socket/net_socket_internal.h"

/* ------------------------------------------------------------------------------------------
 * NET profiler events (built into the core only: the standalone build has no profiler)
 * ------------------------------------------------------------------------------------------ */

#ifndef NCCLX_NET_SOCKET_STANDALONE
#define PROF_NET_ONLY /* this file has its own commFail */
#include "prof/prof.h"

#define SOCK_PROF_ID ((int64_t)0x534f434b) /* "SOCK": the plugin id of these NET events */
#define SOCK_PROF_SLOTS 1024               /* open events, process-wide */
#define SOCK_PROF_PROBES 8

/* A request slot has no room for an event handle (its layout is shared with the standalone
 * build), so open events live in a small table keyed by request address; nothing touches it
 * while NET events are off. A full neighbourhood ends the new event at once. */
typedef struct {
  const sockReq* req;
  void* event;
} sockProfOpen;
static sockProfOpen profOpen[SOCK_PROF_SLOTS];
static pthread_mutex_t profLock = PTHREAD_MUTEX_INITIALIZER;
static int profOpenCount; /* test() and close() skip the table while it is 0 */

static unsigned profSlot(const sockReq* r) {
  return (unsigned)((((uintptr_t)r >> 4) * 0x9e3779b97f4a7c15ull) >> 54) % SOCK_PROF_SLOTS;
}

/* NET START for an accepted request, under phandle (the core's STEP event, or NULL for the
 * running operation). One load and a branch while NET events are off. */
static void profReqStart(const sockReq* r, void* phandle) {
  if (__builtin_expect(!(__atomic_load_n(&ncclxProfilerMask, __ATOMIC_RELAXED) & NCCLX_PROFILE_NET), 1)) return;
  void* ev = NULL;
  profNetEvent(&ev, NCCLX_PROFILER_NET_START, phandle, SOCK_PROF_ID, NULL);
  if (!ev) return;
  int stored = 0;
  unsigned h = profSlot(r);
  pthread_mutex_lock(&profLock);
  for (int i = 0; i < SOCK_PROF_PROBES && !stored; i++) {
    sockProfOpen* o = &profOpen[(h + (unsigned)i) % SOCK_PROF_SLOTS];
    if (o->req) continue;
    o->req = r, o->event = ev, stored = 1;
    __atomic_add_fetch(&profOpenCount, 1, __ATOMIC_RELAXED);
  }
  pthread_mutex_unlock(&profLock);
  if (!stored) profNetEvent(&ev, NCCLX_PROFILER_NET_STOP, NULL, SOCK_PROF_ID, NULL);
}

/* NET STOP for a request that completed, failed or was dropped, if it has an event. */
static void profReqStop(const sockReq* r) {
  if (__builtin_expect(__atomic_load_n(&profOpenCount, __ATOMIC_RELAXED) == 0, 1)) return;
  void* ev = NULL;
  unsigned h = profSlot(r);
  pthread_mutex_lock(&profLock);
  for (int i = 0; i < SOCK_PROF_PROBES && !ev; i++) {
    sockProfOpen* o = &profOpen[(h + (unsigned)i) % SOCK_PROF_SLOTS];
    if (o->req != r) continue;
    ev = o->event;
    o->req = NULL, o->event = NULL;
    __atomic_sub_fetch(&profOpenCount, 1, __ATOMIC_RELAXED);
  }
  pthread_mutex_unlock(&profLock);
  if (ev) profNetEvent(&ev, NCCLX_PROFILER_NET_STOP, NULL, SOCK_PROF_ID, NULL);
}
#else
static void profReqStart(const sockReq* r, void* phandle) { (void)r, (void)phandle; }
static void profReqStop(const sockReq* r) { (void)r; }
#endif

/* ------------------------------------------------------------------------------------------
 * Comm life cycle
 * ------------------------------------------------------------------------------------------ */

sockComm* sockCommCreate(sockCtx* ctx, uint32_t kind, int nsocks, const int* fds,
                            const char* peer) {
  sockComm* c = calloc(1, sizeof(*c));
  if (!c) return NULL;
  c->head.kind = kind;
  c->head.ctx = ctx;
  c->nsocks = nsocks;
  c->epfd = -1;
  for (int i = 0; i < nsocks; i++) c->fds[i] = fds[i];
  snprintf(c->peer, sizeof(c->peer), "%s", peer);
  return c;
}

static void commDestroy(sockComm* c) {
  for (int i = 0; i < SOCK_QUEUE; i++) profReqStop(&c->reqs[i]); /* requests never tested to the end */
  for (int i = 0; i < c->nsocks; i++) {
    if (c->fds[i] >= 0) close(c->fds[i]);
    free(c->stage[i]);
  }
  if (c->epfd >= 0) close(c->epfd);
  c->head.kind = 0;
  free(c);
}

static ncclxResult_t commFail(sockComm* c, ncclxResult_t res, const char* fmt, ...)
    __attribute__((format(printf, 3, 4)));
static ncclxResult_t commFail(sockComm* c, ncclxResult_t res, const char* fmt, ...) {
  if (c->err == ncclxSuccess) {
    char msg[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    SOCK_WARN(c->head.ctx, "%s %s: %s", c->head.kind == SOCK_KIND_SEND ? "send to" : "receive from",
              c->peer, msg);
    c->err = res;
  }
  return c->err;
}

static ncclxResult_t failErrno(sockComm* c, const char* op, int e) {
  return commFail(c, sockErrnoIsRemote(e) ? ncclxRemoteError : ncclxSystemError, "%s failed: %s", op,
                  strerror(e));
}

/* ------------------------------------------------------------------------------------------
 * Message layout over the sockets
 * ------------------------------------------------------------------------------------------ */

static sockReq* slotOf(sockComm* c, uint64_t seq) { return &c->reqs[seq % SOCK_QUEUE]; }

static int leadOf(const sockComm* c, uint64_t seq) { return (int)(seq % (uint64_t)c->nsocks); }

/* Payload bytes [*begin, *begin + *len) of r that socket s carries. Needs r->msgSize. */
static void payloadPart(const sockComm* c, const sockReq* r, int s, size_t* begin, size_t* len) {
  int n = c->nsocks, lead = leadOf(c, r->seq);
  *begin = 0;
  *len = 0;
  if (n == 1 || r->msgSize <= SOCK_STRIPE_MIN) {
    if (s == lead) *len = r->msgSize;
    return;
  }
  size_t chunk = (r->msgSize + (size_t)n - 1) / (size_t)n;
  chunk = (chunk + SOCK_STRIPE_ALIGN - 1) / SOCK_STRIPE_ALIGN * SOCK_STRIPE_ALIGN;
  size_t b = (size_t)((s - lead + n) % n) * chunk;
  if (b >= r->msgSize) return;
  *begin = b;
  *len = r->msgSize - b < chunk ? r->msgSize - b : chunk;
}

static size_t hdrPart(const sockComm* c, const sockReq* r, int s) {
  return s == leadOf(c, r->seq) ? SOCK_HDR_BYTES : 0;
}

static size_t partBytes(const sockComm* c, const sockReq* r, int s) {
  size_t b, l;
  payloadPart(c, r, s, &b, &l);
  return hdrPart(c, r, s) + l;
}

static int socksWithParts(const sockComm* c, const sockReq* r) {
  int k = 0;
  for (int s = 0; s < c->nsocks; s++) k += partBytes(c, r, s) > 0;
  return k;
}

/* A socket that skipped released messages (no part in them) must not look at their slots,
 * which may already hold newer messages. */
static void clampCursor(sockComm* c, int s) {
  if (c->cur[s] < c->first) {
    c->cur[s] = c->first;
    c->off[s] = 0;
  }
}

/* ------------------------------------------------------------------------------------------
 * Send progress
 * ------------------------------------------------------------------------------------------ */

/* iovecs for the rest (from byte o) of r's part on socket s. */
static int sendIov(const sockComm* c, sockReq* r, int s, size_t o, struct iovec* iov, size_t* bytes) {
  int n = 0;
  size_t h = hdrPart(c, r, s), b, l;
  *bytes = 0;
  if (o < h) {
    iov[n].iov_base = (char*)&r->hdr + o;
    iov[n].iov_len = h - o;
    *bytes += h - o;
    n++;
    o = h;
  }
  payloadPart(c, r, s, &b, &l);
  if (o - h < l) {
    iov[n].iov_base = r->data + b + (o - h);
    iov[n].iov_len = l - (o - h);
    *bytes += l - (o - h);
    n++;
  }
  return n;
}

static void sendAdvance(sockComm* c, int s, size_t n) {
  while (c->cur[s] < c->next) {
    sockReq* r = slotOf(c, c->cur[s]);
    size_t p = partBytes(c, r, s);
    size_t take = p - c->off[s] < n ? p - c->off[s] : n;
    c->off[s] += take;
    n -= take;
    if (c->off[s] < p) break;
    if (p > 0 && --r->socksLeft == 0) r->state = SOCK_REQ_COMPLETE;
    c->cur[s]++;
    c->off[s] = 0;
  }
}

/* Write as much as the kernel takes on socket s, batching queued messages in one sendmsg.
 * *blocked = 1 when data is left because the socket buffer is full. */
static ncclxResult_t sendSock(sockComm* c, int s, int* blocked) {
  *blocked = 0;
  clampCursor(c, s);
  for (;;) {
    struct iovec iov[SOCK_MAX_IOV];
    int niov = 0;
    size_t total = 0, o = c->off[s];
    for (uint64_t q = c->cur[s]; q < c->next && niov + 2 <= SOCK_MAX_IOV; q++, o = 0) {
      size_t bytes;
      niov += sendIov(c, slotOf(c, q), s, o, iov + niov, &bytes);
      total += bytes;
    }
    if (total == 0) {
      sendAdvance(c, s, 0); /* step over messages with no part here */
      return ncclxSuccess;
    }
    struct msghdr msg;
    memset(&msg, 0, sizeof(msg));
    msg.msg_iov = iov;
    msg.msg_iovlen = (size_t)niov;
    ssize_t n = sendmsg(c->fds[s], &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        *blocked = 1;
        return ncclxSuccess;
      }
      return failErrno(c, "send", errno);
    }
    sendAdvance(c, s, (size_t)n);
    if ((size_t)n < total) {
      *blocked = 1;
      return ncclxSuccess;
    }
  }
}

/* getPollFd for a sendComm: a socket is in the epoll set only while it has data the kernel
 * would not take, so an idle or finished comm never wakes the caller. */
static void sendPollSync(sockComm* c, int s, int blocked) {
  if (c->epfd < 0 || blocked == (int)((c->epMask >> s) & 1u)) return;
  struct epoll_event ev;
  memset(&ev, 0, sizeof(ev));
  ev.events = EPOLLOUT;
  ev.data.u32 = (uint32_t)s;
  if (epoll_ctl(c->epfd, blocked ? EPOLL_CTL_ADD : EPOLL_CTL_DEL, c->fds[s], &ev) == 0)
    c->epMask ^= 1u << s;
}

/* ------------------------------------------------------------------------------------------
 * Receive progress
 * ------------------------------------------------------------------------------------------ */

static ncclxResult_t parseHeader(sockComm* c, sockReq* r) {
  uint64_t size = le64toh(r->hdr.size);
  uint32_t check = le32toh(r->hdr.check);
  if (check != (SOCK_HDR_CHECK ^ (uint32_t)r->seq))
    return commFail(c, ncclxRemoteError, "bad header for message %llu (stream out of step, or "
                    "not an ncclx peer)", (unsigned long long)r->seq);
  int tag = (int)le32toh(r->hdr.tag);
  if ((r->tag & NCCLX_NET_TAG_SIGNED) && tag != r->tag) {
    if (r->tagOut) *r->tagOut = tag;
    return commFail(c, ncclxInvalidUsage, "message %llu is signed %#x where this receive "
                    "expects %#x (the ranks' calls differ)", (unsigned long long)r->seq,
                    (unsigned)tag, (unsigned)r->tag);
  }
  if (size > r->size)
    return commFail(c, ncclxRemoteError, "message %llu has %llu bytes but the posted receive "
                    "holds only %zu", (unsigned long long)r->seq, (unsigned long long)size, r->size);
  r->msgSize = (size_t)size;
  r->hdrKnown = 1;
  r->socksLeft = socksWithParts(c, r);
  return ncclxSuccess;
}

/* Read socket s into the messages it is due to fill. *hdrParsed = 1 when a header arrived
 * (other sockets waiting on it may now continue). */
static ncclxResult_t recvSock(sockComm* c, int s, int* hdrParsed) {
  int drained = 0;
  clampCursor(c, s);
  for (;;) {
    if (c->cur[s] >= c->next) return ncclxSuccess;
    sockReq* r = slotOf(c, c->cur[s]);
    int lead = s == leadOf(c, r->seq);
    char* dest;
    size_t want;
    if (!r->hdrKnown) {
      if (!lead) return ncclxSuccess; /* its part is unknown until the header is in */
      dest = (char*)&r->hdr + c->off[s];
      want = SOCK_HDR_BYTES - c->off[s];
    } else {
      size_t h = lead ? SOCK_HDR_BYTES : 0, b, l;
      payloadPart(c, r, s, &b, &l);
      if (c->off[s] == h + l) {
        if (h + l > 0 && --r->socksLeft == 0) r->state = SOCK_REQ_COMPLETE;
        c->cur[s]++;
        c->off[s] = 0;
        continue;
      }
      dest = r->data + b + (c->off[s] - h);
      want = h + l - c->off[s];
    }
    size_t got;
    if (c->stageEnd[s] > c->stageBeg[s]) {
      got = c->stageEnd[s] - c->stageBeg[s];
      if (got > want) got = want;
      memcpy(dest, c->stage[s] + c->stageBeg[s], got);
      c->stageBeg[s] += got;
    } else {
      if (drained) return ncclxSuccess;
      if (!c->stage[s] && !(c->stage[s] = malloc(SOCK_STAGE_BYTES)))
        return commFail(c, ncclxSystemError, "out of memory for a %zu-byte staging buffer",
                        SOCK_STAGE_BYTES);
      struct iovec iov[2] = {{dest, want}, {c->stage[s], SOCK_STAGE_BYTES}};
      ssize_t n = readv(c->fds[s], iov, 2);
      if (n < 0) {
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) return ncclxSuccess;
        return failErrno(c, "receive", errno);
      }
      if (n == 0)
        return commFail(c, ncclxRemoteError, "connection closed by the peer in the middle of "
                        "message %llu", (unsigned long long)r->seq);
      got = (size_t)n < want ? (size_t)n : want;
      c->stageBeg[s] = 0;
      c->stageEnd[s] = (size_t)n - got;
      if ((size_t)n < want + SOCK_STAGE_BYTES) drained = 1; /* next readv would be EAGAIN */
    }
    c->off[s] += got;
    if (!r->hdrKnown && c->off[s] == SOCK_HDR_BYTES) {
      ncclxResult_t res = parseHeader(c, r);
      if (res != ncclxSuccess) return res;
      *hdrParsed = 1;
    }
  }
}

static void commProgress(sockComm* c) {
  if (c->err != ncclxSuccess) return;
  if (c->head.kind == SOCK_KIND_SEND) {
    for (int s = 0; s < c->nsocks; s++) {
      int blocked = 0;
      if (sendSock(c, s, &blocked) != ncclxSuccess) return;
      sendPollSync(c, s, blocked);
    }
    return;
  }
  /* A header read on one socket can unblock the others: go round again, a bounded number of
   * times (each round either parses a header or stops). */
  for (int round = 0; round <= c->nsocks; round++) {
    int hdrParsed = 0;
    for (int s = 0; s < c->nsocks; s++)
      if (recvSock(c, s, &hdrParsed) != ncclxSuccess) return;
    if (!hdrParsed) break;
  }
}

static sockReq* reqPost(sockComm* c, void* data, size_t size) {
  sockReq* r = slotOf(c, c->next);
  memset(r, 0, sizeof(*r));
  r->magic = SOCK_REQ_MAGIC;
  r->state = SOCK_REQ_POSTED;
  r->comm = c;
  r->seq = c->next++;
  r->data = data;
  r->size = size;
  return r;
}

ncclxResult_t sockIsend(void* sendComm, void* data, size_t size, int tag, void* mhandle,
                               void* phandle, void** request) {
  (void)mhandle;
  sockComm* c = sendComm;
  if (!request || sockCommKind(c) != SOCK_KIND_SEND) return ncclxInternalError;
  *request = NULL;
  if (c->err != ncclxSuccess) return c->err;
  if (size > 0 && !data) {
    SOCK_WARN(c->head.ctx, "isend to %s: NULL buffer for %zu bytes", c->peer, size);
    return ncclxInternalError;
  }
  if (c->next - c->first >= SOCK_QUEUE) return ncclxSuccess; /* full: the core retries */
  sockReq* r = reqPost(c, data, size);
  r->msgSize = size;
  r->hdrKnown = 1;
  r->hdr.size = htole64((uint64_t)size);
  r->hdr.tag = htole32((uint32_t)tag);
  r->hdr.check = htole32(SOCK_HDR_CHECK ^ (uint32_t)r->seq);
  r->socksLeft = socksWithParts(c, r);
  profReqStart(r, phandle);
  commProgress(c); /* start writing now: lower latency, and the error shows up in test() */
  *request = r;
  return ncclxSuccess;
}

ncclxResult_t sockIrecv(void* recvComm, int n, void** data, size_t* sizes, int* tags,
                               void** mhandles, void** phandles, void** request) {
  (void)mhandles;
  sockComm* c = recvComm;
  if (!request || sockCommKind(c) != SOCK_KIND_RECV) return ncclxInternalError;
  *request = NULL;
  if (n != 1 || !data || !sizes) {
    SOCK_WARN(c->head.ctx, "irecv from %s: %d buffers requested, maxRecvs is 1", c->peer, n);
    return ncclxInternalError;
  }
  if (sizes[0] > 0 && !data[0]) {
    SOCK_WARN(c->head.ctx, "irecv from %s: NULL buffer for %zu bytes", c->peer, sizes[0]);
    return ncclxInternalError;
  }
  if (c->err != ncclxSuccess) return c->err;
  if (c->next - c->first >= SOCK_QUEUE) return ncclxSuccess;
  sockReq* r = reqPost(c, data[0], sizes[0]);
  r->tag = tags ? tags[0] : 0; /* one buffer per receive: the tag selects nothing, but a */
  r->tagOut = tags;            /* signed one is checked where the message lands */
  profReqStart(r, phandles ? phandles[0] : NULL);
  commProgress(c); /* the data may be waiting already */
  *request = r;
  return ncclxSuccess;
}

static void reqRelease(sockComm* c, sockReq* r) {
  r->state = SOCK_REQ_FREE;
  r->magic = 0;
  while (c->first < c->next && slotOf(c, c->first)->state == SOCK_REQ_FREE) c->first++;
}

/* Requests complete in the order they were posted. */
static int earlierDone(sockComm* c, const sockReq* r) {
  for (uint64_t q = c->first; q < r->seq; q++)
    if (slotOf(c, q)->state == SOCK_REQ_POSTED) return 0;
  return 1;
}

ncclxResult_t sockTest(void* request, int* done, size_t* sizes) {
  sockReq* r = request;
  if (!done) return ncclxInternalError;
  *done = 0;
  if (!r || r->magic != SOCK_REQ_MAGIC || r->state == SOCK_REQ_FREE) return ncclxInternalError;
  sockComm* c = r->comm;
  if (r->state != SOCK_REQ_COMPLETE || !earlierDone(c, r)) commProgress(c);
  if (r->state == SOCK_REQ_COMPLETE && earlierDone(c, r)) {
    *done = 1;
    if (sizes) sizes[0] = r->msgSize;
    profReqStop(r);
    reqRelease(c, r);
    return ncclxSuccess;
  }
  if (c->err != ncclxSuccess) {
    ncclxResult_t err = c->err;
    profReqStop(r);
    reqRelease(c, r);
    return err;
  }
  return ncclxSuccess;
}

static ncclxResult_t sockClose(void* comm, uint32_t kind) {
  if (sockCommKind(comm) != (int)kind) return ncclxInternalError;
  commDestroy(comm);
  return ncclxSuccess;
}

ncclxResult_t sockCloseSend(void* sendComm) { return sockClose(sendComm, SOCK_KIND_SEND); }

ncclxResult_t sockCloseRecv(void* recvComm) { return sockClose(recvComm, SOCK_KIND_RECV); }

/* getPollFd for a send or receive comm (see sockGetPollFd in net_socket.c). */
ncclxResult_t sockCommPollFd(sockComm* c, int* fd) {
  if (c->head.kind == SOCK_KIND_RECV && c->nsocks == 1) {
    *fd = c->fds[0];
    return ncclxSuccess;
  }
  if (c->epfd < 0) {
    if ((c->epfd = epoll_create1(EPOLL_CLOEXEC)) < 0) return ncclxSystemError;
    if (c->head.kind == SOCK_KIND_RECV) {
      for (int s = 0; s < c->nsocks; s++) sockPollAdd(c->epfd, c->fds[s]);
    } else {
      commProgress(c); /* registers the sockets that are blocked right now */
    }
  }
  *fd = c->epfd;
  return ncclxSuccess;
}
