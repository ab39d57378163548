/* Bootstrap messages: the per-process state, incoming connections read into a queue
 * matched by (source, tag, tag space), and point-to-point send/recv.
 *
 * Each rank keeps one cached outgoing connection per peer it talks to and reads every
 * incoming connection into an unexpected-message queue, so messages can be matched in any
 * order. A per (source, destination) sequence number keeps them ordered even when a
 * connection is replaced. Every header carries the magic and the job secret. */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "bootstrap/bootstrap_internal.h"
#include "util/debug.h"

/* ---------------- root state ---------------- */

static void freeMessages(struct message* m) {
  while (m) {
    struct message* next = m->next;
    free(m);
    m = next;
  }
}

void bsRootFree(struct bootstrapRoot* r) {
  if (!r) return;
  if (r->listenFd >= 0) close(r->listenFd);
  for (int i = 0; i < r->nIn; i++) {
    close(r->in[i].fd);
    free(r->in[i].msg);
  }
  if (r->out)
    for (int i = 0; i < r->nranks; i++)
      if (r->out[i].fd >= 0) close(r->out[i].fd);
  freeMessages(r->queueHead);
  freeMessages(r->holdback);
  for (struct abortNote* a = r->aborts; a;) {
    struct abortNote* next = a->next;
    free(a);
    a = next;
  }
  bsFreeNotes(r, NULL);
  free(r->in);
  free(r->out);
  free(r->addrs);
  free(r->sendSeq);
  free(r->recvSeq);
  pthread_mutex_destroy(&r->lock);
  pthread_mutex_destroy(&r->abortLock);
  free(r);
}

struct bootstrapRoot* bsRootCreate(int rank, int nranks, uint64_t secret, double timeoutSec) {
  struct bootstrapRoot* r = calloc(1, sizeof(*r));
  if (!r) return NULL;
  r->rank = rank;
  r->nranks = nranks;
  r->secret = secret;
  r->timeoutSec = timeoutSec;
  r->listenFd = -1;
  pthread_mutex_init(&r->lock, NULL);
  pthread_mutex_init(&r->abortLock, NULL);
  r->addrs = calloc((size_t)nranks, sizeof(*r->addrs));
  r->out = calloc((size_t)nranks, sizeof(*r->out));
  r->sendSeq = calloc((size_t)nranks, sizeof(*r->sendSeq));
  r->recvSeq = calloc((size_t)nranks, sizeof(*r->recvSeq));
  if (!r->addrs || !r->out || !r->sendSeq || !r->recvSeq) {
    bsRootFree(r);
    return NULL;
  }
  for (int i = 0; i < nranks; i++) {
    r->out[i].fd = -1;
    r->recvSeq[i] = 1;
  }
  return r;
}

/* ---------------- incoming messages ---------------- */

static void recordAbort(struct bootstrapRoot* r, struct message* m) {
  pthread_mutex_lock(&r->abortLock);
  int seen = 0;
  for (struct abortNote* a = r->aborts; a; a = a->next) seen |= a->tagSpace == m->tagSpace;
  if (!seen) {
    struct abortNote* a = malloc(sizeof(*a) + m->size + 1);
    if (a) {
      a->tagSpace = m->tagSpace;
      memcpy(a->text, m->data, m->size);
      a->text[m->size] = '\0';
      a->next = r->aborts;
      r->aborts = a;
    }
  }
  pthread_mutex_unlock(&r->abortLock);
  INFO(NCCLX_LOG_BOOTSTRAP, "bootstrap: abort notice from rank %d: %.*s", m->src, (int)m->size, m->data);
}

/* Copies the abort text for a tag space into msg; returns 1 if there is one. */
int bsFindAbort(struct bootstrapRoot* r, uint64_t tagSpace, char* msg, size_t size) {
  int found = 0;
  pthread_mutex_lock(&r->abortLock);
  for (struct abortNote* a = r->aborts; a && !found; a = a->next) {
    if (a->tagSpace != tagSpace) continue;
    found = 1;
    if (msg && size) snprintf(msg, size, "%s", a->text);
  }
  pthread_mutex_unlock(&r->abortLock);
  return found;
}

static void enqueue(struct bootstrapRoot* r, struct message* m) {
  m->next = NULL;
  if (r->queueTail)
    r->queueTail->next = m;
  else
    r->queueHead = m;
  r->queueTail = m;
}

/* A complete message: abort notices are recorded, data goes to the queue in seq order. */
static void deliver(struct bootstrapRoot* r, struct message* m) {
  r->stats.msgsRecv++;
  r->stats.bytesRecv += sizeof(struct msgHeader) + m->size;
  if (m->kind == MSG_KIND_ABORT) {
    recordAbort(r, m);
    free(m);
    return;
  }
  if (m->kind == MSG_KIND_NOTE) {
    bsRecordNote(r, m); /* takes m */
    return;
  }
  uint64_t* expect = &r->recvSeq[m->src];
  if (m->seq < *expect) {
    WARN("bootstrap: dropped a duplicate message from rank %d (seq %llu, expected %llu)", m->src,
         (unsigned long long)m->seq, (unsigned long long)*expect);
    free(m);
    return;
  }
  if (m->seq > *expect) { /* an earlier one is still on its way on another connection */
    m->next = r->holdback;
    r->holdback = m;
    return;
  }
  enqueue(r, m);
  (*expect)++;
  for (int again = 1; again;) {
    again = 0;
    for (struct message** p = &r->holdback; *p; p = &(*p)->next) {
      struct message* h = *p;
      if (h->src == m->src && h->seq == *expect) {
        *p = h->next;
        enqueue(r, h);
        (*expect)++;
        again = 1;
        break;
      }
    }
  }
}

/* Why an incoming header is refused, or NULL if it is acceptable. */
static const char* checkHeader(const struct bootstrapRoot* r, const struct msgHeader* h) {
  if (h->secret != r->secret) return "wrong job secret";
  if (h->kind != MSG_KIND_DATA && h->kind != MSG_KIND_ABORT && h->kind != MSG_KIND_NOTE) return "unknown message kind";
  if (h->src < 0 || h->src >= r->nranks) return "source rank out of range";
  if (h->kind == MSG_KIND_ABORT && (h->size > MAX_ABORT_TEXT || h->seq != 0)) return "malformed abort notice";
  if (h->kind == MSG_KIND_NOTE && (h->size > MAX_NOTE_BYTES || h->seq != 0)) return "malformed wait note";
  if (h->kind == MSG_KIND_DATA && h->seq == 0) return "data message without a sequence number";
  if (h->size > (uint64_t)SIZE_MAX / 2) return "absurd message size";
  return NULL;
}

/* Read whatever a connection has. Returns 0 to keep it, -1 when it must be closed. */
static int readConn(struct bootstrapRoot* r, struct inConn* c) {
  for (;;) {
    int inHeader = c->hdrGot < sizeof(c->hdr);
    char* dst = inHeader ? (char*)&c->hdr + c->hdrGot : c->msg->data + c->dataGot;
    size_t want = inHeader ? sizeof(c->hdr) - c->hdrGot : c->msg->size - c->dataGot;
    ssize_t n = recv(c->fd, dst, want, MSG_DONTWAIT);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return 0;
    if (n <= 0) {
      int atBoundary = inHeader && c->hdrGot == 0;
      if (!atBoundary) /* the sender went away in the middle of a message */
        WARN("bootstrap: refused a truncated message from %s (%s, %zu of %zu bytes%s%s)", c->name,
             inHeader ? "header" : "payload", inHeader ? c->hdrGot : c->dataGot,
             inHeader ? sizeof(c->hdr) : c->msg->size, n < 0 ? ", " : "", n < 0 ? strerror(errno) : "");
      return -1;
    }
    if (!inHeader) {
      c->dataGot += (size_t)n;
    } else {
      c->hdrGot += (size_t)n;
      if (c->hdrGot >= sizeof(uint32_t) && c->hdr.magic != MSG_MAGIC) {
        WARN("bootstrap: refused connection from %s: not an ncclx bootstrap message (first bytes 0x%08x)", c->name,
             (unsigned)c->hdr.magic);
        return -1;
      }
      if (c->hdrGot < sizeof(c->hdr)) continue;
      const char* why = checkHeader(r, &c->hdr);
      if (why) {
        WARN("bootstrap: refused connection from %s: %s", c->name, why);
        return -1;
      }
      struct message* m = malloc(sizeof(*m) + c->hdr.size);
      if (!m) {
        WARN("bootstrap: dropped connection from %s: no memory for a %llu-byte message", c->name,
             (unsigned long long)c->hdr.size);
        return -1;
      }
      *m = (struct message){NULL, c->hdr.src, c->hdr.kind, c->hdr.tag, c->hdr.tagSpace, c->hdr.seq, c->hdr.size};
      c->msg = m;
      c->dataGot = 0;
    }
    if (c->dataGot == c->msg->size) {
      deliver(r, c->msg);
      c->msg = NULL;
      c->hdrGot = 0;
    }
  }
}

/* With r->lock held: accept new connections and read everything available, without blocking. */
void bsProgressLocked(struct bootstrapRoot* r) {
  struct pollfd stackFds[64];
  int n = r->nIn + 1;
  struct pollfd* pfds = n <= 64 ? stackFds : malloc(sizeof(*pfds) * (size_t)n);
  if (!pfds) return;
  pfds[0] = (struct pollfd){r->listenFd, POLLIN, 0};
  for (int i = 0; i < r->nIn; i++) pfds[i + 1] = (struct pollfd){r->in[i].fd, POLLIN, 0};
  if (poll(pfds, (nfds_t)n, 0) > 0) {
    for (int i = 0; i < r->nIn; i++) {
      if (!pfds[i + 1].revents) continue;
      if (readConn(r, &r->in[i]) != 0) {
        close(r->in[i].fd);
        free(r->in[i].msg);
        r->in[i].fd = -1;
      }
    }
    int kept = 0;
    for (int i = 0; i < r->nIn; i++)
      if (r->in[i].fd >= 0) r->in[kept++] = r->in[i];
    r->nIn = kept;
    if (pfds[0].revents) {
      for (;;) {
        int fd = accept4(r->listenFd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) break;
        if (r->nIn == r->capIn) {
          int cap = r->capIn ? r->capIn * 2 : 16;
          struct inConn* grown = realloc(r->in, sizeof(*grown) * (size_t)cap);
          if (!grown) {
            WARN("bootstrap: out of memory accepting a connection; dropped it");
            close(fd);
            continue;
          }
          r->in = grown;
          r->capIn = cap;
        }
        struct inConn* c = &r->in[r->nIn];
        memset(c, 0, sizeof(*c));
        c->fd = fd;
        bsPeerString(fd, c->name, sizeof(c->name));
        r->stats.connsAccepted++;
        if (readConn(r, c) == 0) {
          r->nIn++;
        } else {
          close(fd);
          free(c->msg);
        }
      }
    }
  }
  if (pfds != stackFds) free(pfds);
}

/* With r->lock held (released while sleeping): wait up to sliceMs for incoming traffic or
 * for extraFd to become ready. Descriptors closed meanwhile only cause an early wakeup. */
void bsSleepLocked(struct bootstrapRoot* r, int extraFd, short extraEvents, int sliceMs) {
  struct pollfd stackFds[64];
  int n = r->nIn + 1 + (extraFd >= 0);
  struct pollfd* pfds = n <= 64 ? stackFds : malloc(sizeof(*pfds) * (size_t)n);
  if (!pfds) {
    pthread_mutex_unlock(&r->lock);
    bsSleepSec(sliceMs * 1e-3);
    pthread_mutex_lock(&r->lock);
    return;
  }
  int k = 0;
  pfds[k++] = (struct pollfd){r->listenFd, POLLIN, 0};
  for (int i = 0; i < r->nIn; i++) pfds[k++] = (struct pollfd){r->in[i].fd, POLLIN, 0};
  if (extraFd >= 0) pfds[k++] = (struct pollfd){extraFd, extraEvents, 0};
  pthread_mutex_unlock(&r->lock);
  poll(pfds, (nfds_t)k, sliceMs);
  if (pfds != stackFds) free(pfds);
  pthread_mutex_lock(&r->lock);
}

/* First queued data message matching (src, tag, tagSpace), removed from the queue. */
struct message* bsTakeMatch(struct bootstrapRoot* r, int src, uint32_t tag, uint64_t tagSpace) {
  struct message* prev = NULL;
  for (struct message* m = r->queueHead; m; prev = m, m = m->next) {
    if (m->src != src || m->tag != tag || m->tagSpace != tagSpace) continue;
    if (prev)
      prev->next = m->next;
    else
      r->queueHead = m->next;
    if (r->queueTail == m) r->queueTail = prev;
    return m;
  }
  return NULL;
}

/* Drop queued messages of a tag space (its view is gone). */
void bsPurgeTagSpace(struct bootstrapRoot* r, uint64_t tagSpace) {
  struct message* prev = NULL;
  for (struct message* m = r->queueHead; m;) {
    struct message* next = m->next;
    if (m->tagSpace == tagSpace) {
      if (prev)
        prev->next = next;
      else
        r->queueHead = next;
      if (r->queueTail == m) r->queueTail = prev;
      free(m);
    } else {
      prev = m;
    }
    m = next;
  }
}

/* ---------------- point-to-point ---------------- */

/* "rank 3 (10.0.0.2:4567)" for a rank of view b. */
const char* bsDescribePeer(const struct bootstrap* b, int peer, char* buf, size_t size) {
  char addr[80];
  snprintf(buf, size, "rank %d (%s)", peer, bsAddrString(&b->root->addrs[b->rootRanks[peer]], addr, sizeof(addr)));
  return buf;
}

static ncclxResult_t checkPeer(const struct bootstrap* b, int peer, const void* data, size_t size, const char* op) {
  if (b == NULL) return ncclxSetError(ncclxInvalidArgument, "bootstrap %s: bootstrap is NULL", op);
  if (peer < 0 || peer >= b->nranks)
    return ncclxSetError(ncclxInvalidArgument, "bootstrap %s: peer %d is not in 0..%d", op, peer, b->nranks - 1);
  if (data == NULL && size > 0)
    return ncclxSetError(ncclxInvalidArgument, "bootstrap %s: NULL buffer for %zu bytes", op, size);
  return ncclxSuccess;
}

/* With r->lock held: close the least recently used idle connections beyond the cache size. */
static void evictLocked(struct bootstrapRoot* r) {
  while (r->nOutOpen > OUT_CACHE_MAX) {
    int oldest = -1;
    for (int i = 0; i < r->nranks; i++)
      if (r->out[i].fd >= 0 && !r->out[i].busy && (oldest < 0 || r->out[i].lastUse < r->out[oldest].lastUse))
        oldest = i;
    if (oldest < 0) return;
    close(r->out[oldest].fd);
    r->out[oldest].fd = -1;
    r->nOutOpen--;
  }
}

/* Write header and payload. While the socket is full, keep reading incoming traffic: the
 * peer may itself be blocked sending to us. Returns 0 or an errno value. */
static int sendWithProgress(struct bootstrapRoot* r, int fd, const struct msgHeader* h, const void* data,
                            size_t size, double deadline, size_t* written) {
  struct iovec iov[2] = {{(void*)h, sizeof(*h)}, {(void*)data, size}};
  int first = 0, count = size ? 2 : 1;
  size_t total = sizeof(*h) + size;
  while (*written < total) {
    struct msghdr mh;
    memset(&mh, 0, sizeof(mh));
    mh.msg_iov = iov + first;
    mh.msg_iovlen = (size_t)(count - first);
    ssize_t n = sendmsg(fd, &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      *written += (size_t)n;
      for (size_t left = (size_t)n; left > 0;) {
        size_t step = left < iov[first].iov_len ? left : iov[first].iov_len;
        iov[first].iov_base = (char*)iov[first].iov_base + step;
        iov[first].iov_len -= step;
        left -= step;
        if (iov[first].iov_len == 0) first++;
      }
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK) return errno;
    if (bsNow() >= deadline) return ETIMEDOUT;
    pthread_mutex_lock(&r->lock);
    bsProgressLocked(r);
    bsSleepLocked(r, fd, POLLOUT, bsSliceUntil(deadline, POLL_SLICE_MS));
    pthread_mutex_unlock(&r->lock);
  }
  return 0;
}

/* Send one message of a kind to a view rank before the deadline: 0 or an errno value. Data
 * messages take the next sequence number to dst; notes go unordered (seq 0). */
static int sendMessage(struct bootstrap* b, int peer, uint32_t kind, uint32_t tag, const void* data, size_t size,
                       double deadline, int* connectFailed) {
  struct bootstrapRoot* r = b->root;
  int dst = b->rootRanks[peer];
  struct outConn* oc = &r->out[dst];
  int ordered = kind == MSG_KIND_DATA;

  /* Own the connection to dst: messages to one peer go out one at a time, in seq order. */
  pthread_mutex_lock(&r->lock);
  while (oc->busy) {
    if (bsNow() >= deadline) {
      pthread_mutex_unlock(&r->lock);
      return EBUSY;
    }
    bsProgressLocked(r);
    bsSleepLocked(r, -1, 0, 1);
  }
  oc->busy = 1;
  uint64_t seq = ordered ? ++r->sendSeq[dst] : 0;
  int fd = oc->fd, fresh = fd < 0;
  pthread_mutex_unlock(&r->lock);

  struct msgHeader h = {MSG_MAGIC, kind, r->secret, b->tagSpace, seq, size, r->rank, tag};
  int e = 0;
  size_t written = 0;
  if (fresh && r->addrs[dst].family == 0)
    e = EDESTADDRREQ; /* only before the address all-gather finished: it failed somewhere */
  else if (fresh)
    fd = bsConnectWithin(&r->addrs[dst], deadline, 0, NULL, &e);
  *connectFailed = fd < 0;
  if (fd >= 0) e = sendWithProgress(r, fd, &h, data, size, deadline, &written);

  pthread_mutex_lock(&r->lock);
  if (e == 0) {
    oc->fd = fd;
    oc->lastUse = ++r->useClock;
    if (fresh) r->nOutOpen++;
    r->stats.msgsSent++;
    r->stats.bytesSent += sizeof(h) + size;
  }
  if (fresh && fd >= 0) r->stats.connsOpened++;
  if (e != 0) {
    if (fd >= 0) close(fd);
    if (!fresh) r->nOutOpen--;
    oc->fd = -1;
    if (ordered && written == 0) r->sendSeq[dst]--; /* the peer never saw this seq: keep the sequence dense */
  }
  oc->busy = 0;
  evictLocked(r);
  pthread_mutex_unlock(&r->lock);
  return e;
}

ncclxResult_t bootstrapSend(struct bootstrap* b, int peer, uint32_t tag, const void* data, size_t size) {
  NCCLX_CHECK(checkPeer(b, peer, data, size, "send"));
  int connectFailed = 0;
  int e = sendMessage(b, peer, MSG_KIND_DATA, tag, data, size, bsDeadlineAfter(b->root->timeoutSec), &connectFailed);
  char who[128];
  if (e == EBUSY)
    return ncclxSetError(ncclxRemoteError, "bootstrap: rank %d timed out behind another send to %s", b->rank,
                         bsDescribePeer(b, peer, who, sizeof(who)));
  if (e != 0)
    return ncclxSetError(ncclxRemoteError, "bootstrap: rank %d could not send %zu bytes (tag %u) to %s: %s%s", b->rank,
                         size, tag, bsDescribePeer(b, peer, who, sizeof(who)), strerror(e),
                         connectFailed ? " (connect failed)" : "");
  return ncclxSuccess;
}

int bootstrapSendNote(struct bootstrap* b, int peer, const void* note, size_t size, double withinSec) {
  if (b == NULL || peer < 0 || peer >= b->nranks || peer == b->rank || size > MAX_NOTE_BYTES) return EINVAL;
  int connectFailed = 0;
  return sendMessage(b, peer, MSG_KIND_NOTE, 0, note, size, bsNow() + withinSec, &connectFailed);
}

ncclxResult_t bootstrapRecv(struct bootstrap* b, int peer, uint32_t tag, void* data, size_t size,
                            volatile int* abortFlag) {
  NCCLX_CHECK(checkPeer(b, peer, data, size, "recv"));
  struct bootstrapRoot* r = b->root;
  int src = b->rootRanks[peer];
  double deadline = bsDeadlineAfter(r->timeoutSec);
  char who[128], notice[1024];

  pthread_mutex_lock(&r->lock);
  for (;;) {
    bsProgressLocked(r);
    struct message* m = bsTakeMatch(r, src, tag, b->tagSpace);
    if (m) {
      pthread_mutex_unlock(&r->lock);
      ncclxResult_t res = ncclxSuccess;
      if (m->size != size)
        res = ncclxSetError(ncclxInternalError,
                            "bootstrap: rank %d expected %zu bytes from %s with tag %u but the message has %zu bytes",
                            b->rank, size, bsDescribePeer(b, peer, who, sizeof(who)), tag, m->size);
      else if (size)
        memcpy(data, m->data, size);
      free(m);
      return res;
    }
    if (bsFindAbort(r, b->tagSpace, notice, sizeof(notice))) {
      pthread_mutex_unlock(&r->lock);
      return ncclxSetError(ncclxRemoteError, "bootstrap: rank %d stopped waiting for tag %u from %s: %s", b->rank, tag,
                           bsDescribePeer(b, peer, who, sizeof(who)), notice);
    }
    if (abortFlag && *abortFlag) {
      pthread_mutex_unlock(&r->lock);
      return ncclxSetError(ncclxInvalidUsage, "bootstrap: rank %d: receive of tag %u from %s aborted", b->rank, tag,
                           bsDescribePeer(b, peer, who, sizeof(who)));
    }
    if (bsNow() >= deadline) {
      pthread_mutex_unlock(&r->lock);
      return ncclxSetError(ncclxRemoteError, "bootstrap: rank %d timed out after %g s waiting for tag %u from %s",
                           b->rank, r->timeoutSec, tag, bsDescribePeer(b, peer, who, sizeof(who)));
    }
    bsSleepLocked(r, -1, 0, bsSliceUntil(deadline, POLL_SLICE_MS));
  }
}

