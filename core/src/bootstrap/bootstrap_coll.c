/* Bootstrap collectives over point-to-point messages (Bruck all-gather, dissemination
 * barrier) and abort notices, which go to every rank of a view on fresh connections. */
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

/* ---------------- collectives over point-to-point ---------------- */

/* Bruck all-gather: in round k (distance d = 2^k) send the d blocks we hold to rank-d and
 * receive the next d from rank+d; blocks are kept relative to our rank and rotated at the end. */
ncclxResult_t bootstrapAllGather(struct bootstrap* b, void* all, size_t size, uint32_t tag) {
  if (b == NULL || (all == NULL && size > 0))
    return ncclxSetError(ncclxInvalidArgument, "bootstrap allgather: NULL %s", b ? "buffer" : "bootstrap");
  int n = b->nranks, me = b->rank;
  if (n == 1 || size == 0) return ncclxSuccess;
  if (size > SIZE_MAX / (size_t)n)
    return ncclxSetError(ncclxInvalidArgument, "bootstrap allgather: %zu bytes x %d ranks overflows", size, n);
  char* tmp = malloc(size * (size_t)n);
  if (!tmp) return ncclxSetError(ncclxSystemError, "bootstrap allgather: out of memory for %zu bytes", size * n);
  memcpy(tmp, (char*)all + (size_t)me * size, size);
  ncclxResult_t res = ncclxSuccess;
  int rounds = 0;
  for (long dist = 1; dist < n && res == ncclxSuccess; dist <<= 1, rounds++) {
    size_t blocks = (size_t)(dist < n - dist ? dist : n - dist);
    int to = (int)((me - dist + n) % n), from = (int)((me + dist) % n);
    res = bootstrapSend(b, to, tag, tmp, blocks * size);
    if (res == ncclxSuccess) res = bootstrapRecv(b, from, tag, tmp + (size_t)dist * size, blocks * size, NULL);
  }
  if (res == ncclxSuccess) {
    for (int i = 0; i < n; i++) memcpy((char*)all + (size_t)((me + i) % n) * size, tmp + (size_t)i * size, size);
    INFO(NCCLX_LOG_BOOTSTRAP, "bootstrap: allgather of %zu bytes x %d ranks (view 0x%llx, tag %u) in %d round%s", size,
         n, (unsigned long long)b->tagSpace, tag, rounds, rounds == 1 ? "" : "s");
  }
  free(tmp);
  return res;
}

/* Dissemination barrier: in round k signal rank+2^k and wait for rank-2^k. */
ncclxResult_t bootstrapBarrier(struct bootstrap* b, uint32_t tag) {
  if (b == NULL) return ncclxSetError(ncclxInvalidArgument, "bootstrap barrier: bootstrap is NULL");
  int n = b->nranks, me = b->rank;
  char token = 0;
  for (long dist = 1; dist < n; dist <<= 1) {
    NCCLX_CHECK(bootstrapSend(b, (int)((me + dist) % n), tag, &token, 1));
    NCCLX_CHECK(bootstrapRecv(b, (int)((me - dist + n) % n), tag, &token, 1, NULL));
  }
  TRACE(NCCLX_LOG_BOOTSTRAP, "bootstrap: barrier of %d ranks (view 0x%llx) done", n, (unsigned long long)b->tagSpace);
  return ncclxSuccess;
}


/* ---------------- abort notices ---------------- */

/* Deliver buf to a batch of peers on fresh connections (the cached ones may be stuck in
 * another thread's send). Returns how many got the whole notice before the deadline. */
static int sendAbortBatch(const struct bootstrap* b, int first, int count, const char* buf, size_t total,
                          double deadline) {
  struct pollfd pfds[ABORT_BATCH];
  size_t off[ABORT_BATCH];
  int active = 0, delivered = 0;
  for (int i = 0; i < count; i++) {
    pfds[i] = (struct pollfd){-1, POLLOUT, 0};
    off[i] = 0;
    if (first + i == b->rank) continue;
    const struct wireAddr* to = &b->root->addrs[b->rootRanks[first + i]];
    if (to->family == 0) continue; /* never learned: nothing to tell it with */
    int fd = socket(to->family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    struct sockaddr_storage ss;
    socklen_t len;
    bsWireToSockaddr(to, &ss, &len);
    if (connect(fd, (struct sockaddr*)&ss, len) != 0 && errno != EINPROGRESS) {
      close(fd);
      continue;
    }
    pfds[i].fd = fd;
    active++;
  }
  while (active > 0 && bsNow() < deadline) {
    if (poll(pfds, (nfds_t)count, bsSliceUntil(deadline, POLL_SLICE_MS)) <= 0) continue;
    for (int i = 0; i < count; i++) {
      if (pfds[i].fd < 0 || !pfds[i].revents) continue;
      ssize_t n = send(pfds[i].fd, buf + off[i], total - off[i], MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n > 0) off[i] += (size_t)n;
      if (off[i] == total || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
        delivered += off[i] == total;
        close(pfds[i].fd);
        pfds[i].fd = -1;
        active--;
      }
    }
  }
  for (int i = 0; i < count; i++)
    if (pfds[i].fd >= 0) close(pfds[i].fd);
  return delivered;
}

void bootstrapBroadcastAbort(struct bootstrap* b, const char* message) {
  if (b == NULL) return;
  struct bootstrapRoot* r = b->root;
  const char* text = message ? message : "";
  size_t len = strnlen(text, MAX_ABORT_TEXT);
  struct msgHeader h = {MSG_MAGIC, MSG_KIND_ABORT, r->secret, b->tagSpace, 0, len, r->rank, 0};
  char* buf = malloc(sizeof(h) + len);
  if (!buf) return;
  memcpy(buf, &h, sizeof(h));
  memcpy(buf + sizeof(h), text, len);
  double deadline = bsNow() + ABORT_BUDGET_SEC;
  int delivered = 0;
  for (int first = 0; first < b->nranks; first += ABORT_BATCH) {
    int count = b->nranks - first < ABORT_BATCH ? b->nranks - first : ABORT_BATCH;
    delivered += sendAbortBatch(b, first, count, buf, sizeof(h) + len, deadline);
  }
  free(buf);
  if (delivered < b->nranks - 1)
    WARN("bootstrap: abort notice reached %d of %d other ranks within %g s", delivered, b->nranks - 1,
         ABORT_BUDGET_SEC);
  else
    INFO(NCCLX_LOG_BOOTSTRAP, "bootstrap: abort notice sent to all %d other ranks (view 0x%llx)", delivered,
         (unsigned long long)b->tagSpace);
}

int bootstrapPollAbort(struct bootstrap* b, char* msg, size_t msgSize) {
  if (b == NULL) return 0;
  struct bootstrapRoot* r = b->root;
  /* If another thread holds the lock it is progressing the same connections for us. */
  if (pthread_mutex_trylock(&r->lock) == 0) {
    bsProgressLocked(r);
    pthread_mutex_unlock(&r->lock);
  }
  return bsFindAbort(r, b->tagSpace, msg, msgSize);
}

int bootstrapPollFd(const struct bootstrap* b) { return b ? b->root->listenFd : -1; }

