/* Socket network connections: listen, non-blocking connect and accept, and the hello that
 * proves a socket belongs to a handle this listener issued. */
#include "transport/socket/net_socket_internal.h"

void sockPendingFree(sockPendingConnect* p) {
  for (int i = 0; i < p->nsocks; i++)
    if (p->fds[i] >= 0) close(p->fds[i]);
  free(p);
}

ncclxResult_t sockListen(void* vctx, int dev, void* handle, void** listenComm) {
  sockCtx* ctx = vctx;
  if (!ctx || !handle || !listenComm) return ncclxInternalError;
  *listenComm = NULL;
  if (dev != 0) {
    SOCK_WARN(ctx, "listen: device %d does not exist (1 device)", dev);
    return ncclxInternalError;
  }
  int fd = socket(ctx->addr.sa.sa_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    SOCK_WARN(ctx, "listen: socket() failed: %s", strerror(errno));
    return ncclxSystemError;
  }
  sockSetBuffers(ctx, fd); /* accepted sockets inherit them, and the window scale with them */
  sockAddr a = ctx->addr;
  char where[SOCK_ADDR_STR];
  sockAddrFormat(&a, where, sizeof(where));
  socklen_t al = sizeof(a);
  if (bind(fd, &a.sa, sockAddrLen(&a)) != 0 || listen(fd, SOMAXCONN) != 0 ||
      getsockname(fd, &a.sa, &al) != 0) {
    SOCK_WARN(ctx, "listen on %s (%s) failed: %s", where, ctx->ifname, strerror(errno));
    close(fd);
    return ncclxSystemError;
  }
  sockListenComm* lc = calloc(1, sizeof(*lc));
  if (!lc) {
    close(fd);
    return ncclxSystemError;
  }
  lc->head.kind = SOCK_KIND_LISTEN;
  lc->head.ctx = ctx;
  lc->fd = fd;
  lc->epfd = -1;
  lc->nsocks = ctx->nsocks;
  lc->nonce = sockRandom64();
  sockAddrFormat(&a, lc->addr, sizeof(lc->addr));

  sockHandle h;
  memset(&h, 0, sizeof(h));
  h.magic = SOCK_HANDLE_MAGIC;
  h.nsocks = (uint16_t)lc->nsocks;
  h.nonce = lc->nonce;
  h.addr = a;
  memset(handle, 0, NCCLX_NET_HANDLE_MAXSIZE);
  memcpy(handle, &h, sizeof(h));
  SOCK_LOG(ctx, NCCLX_LOG_TRACE, "NET/Socket: listening on %s", lc->addr);
  *listenComm = lc;
  return ncclxSuccess;
}

/* Start the TCP connects of a new pending connect. */
static ncclxResult_t connectStart(sockCtx* ctx, sockPendingConnect* p) {
  for (int i = 0; i < p->nsocks; i++) {
    int fd = socket(p->handle.addr.sa.sa_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
      SOCK_WARN(ctx, "connect to %s: socket() failed: %s", p->peer, strerror(errno));
      return ncclxSystemError;
    }
    p->fds[i] = fd;
    sockSetNoDelay(fd);
    sockSetBuffers(ctx, fd);
    if (connect(fd, &p->handle.addr.sa, sockAddrLen(&p->handle.addr)) == 0) {
      p->step[i] = 1;
    } else if (errno == EINPROGRESS || errno == EINTR) {
      p->step[i] = 0;
    } else {
      SOCK_WARN(ctx, "connect to %s failed: %s%s", p->peer, strerror(errno),
                errno == ECONNREFUSED ? " (is the receiving process still listening?)" : "");
      return ncclxSystemError;
    }
    sockHello* hl = &p->hello[i];
    hl->magic = htole32(SOCK_HELLO_MAGIC);
    hl->index = htole16((uint16_t)i);
    hl->nsocks = htole16((uint16_t)p->nsocks);
    hl->nonce = htole64(p->handle.nonce);
    hl->connId = htole64(p->connId);
  }
  return ncclxSuccess;
}

/* Advance every socket of p as far as it goes without waiting. *done = 1 when all sockets
 * are connected and have sent their hello. */
static ncclxResult_t connectStep(sockCtx* ctx, sockPendingConnect* p, int* done) {
  struct pollfd pfd[SOCK_MAX_SOCKS];
  int np = 0, idx[SOCK_MAX_SOCKS];
  for (int i = 0; i < p->nsocks; i++)
    if (p->step[i] == 0) {
      pfd[np].fd = p->fds[i];
      pfd[np].events = POLLOUT;
      pfd[np].revents = 0;
      idx[np++] = i;
    }
  if (np > 0 && poll(pfd, (nfds_t)np, 0) < 0 && errno != EINTR) {
    SOCK_WARN(ctx, "connect to %s: poll failed: %s", p->peer, strerror(errno));
    return ncclxSystemError;
  }
  for (int k = 0; k < np; k++) {
    if (!pfd[k].revents) continue;
    int err = 0;
    socklen_t el = sizeof(err);
    if (getsockopt(pfd[k].fd, SOL_SOCKET, SO_ERROR, &err, &el) != 0) err = errno;
    if (err == 0) {
      p->step[idx[k]] = 1;
    } else if (err != EINPROGRESS && err != EALREADY) {
      SOCK_WARN(ctx, "connect to %s failed: %s%s", p->peer, strerror(err),
                err == ECONNREFUSED ? " (is the receiving process still listening?)" : "");
      return ncclxSystemError;
    }
  }
  *done = 1;
  for (int i = 0; i < p->nsocks; i++) {
    while (p->step[i] == 1) {
      ssize_t n = send(p->fds[i], (char*)&p->hello[i] + p->helloOff[i],
                       sizeof(sockHello) - p->helloOff[i], MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n < 0) {
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) break;
        SOCK_WARN(ctx, "connect to %s: sending the hello failed: %s", p->peer, strerror(errno));
        return sockErrnoIsRemote(errno) ? ncclxRemoteError : ncclxSystemError;
      }
      p->helloOff[i] += (size_t)n;
      if (p->helloOff[i] == sizeof(sockHello)) p->step[i] = 2;
    }
    if (p->step[i] != 2) *done = 0;
  }
  return ncclxSuccess;
}

/* A connect in progress is found again by its handle, preferring the one started for the
 * same *sendComm slot. Connections to one handle are interchangeable, so a caller that
 * moves its slot, or two threads connecting to the same listener, still each get a
 * distinct, finished connection. The entry is off the list while a caller works on it. */
static sockPendingConnect* pendingTake(sockCtx* ctx, const sockHandle* h, void** owner) {
  uint64_t now = sockNowNs();
  sockPendingConnect **pick = NULL, **pp = &ctx->pending;
  pthread_mutex_lock(&ctx->lock);
  while (*pp) {
    sockPendingConnect* p = *pp;
    if (now - p->lastTouch > SOCK_STALE_CONNECT_NS) { /* abandoned by its caller */
      *pp = p->next;
      sockPendingFree(p);
      continue;
    }
    if (memcmp(&p->handle, h, sizeof(*h)) == 0 && (!pick || p->owner == owner)) pick = pp;
    pp = &p->next;
  }
  sockPendingConnect* found = NULL;
  if (pick) {
    found = *pick;
    *pick = found->next;
    found->owner = owner;
  }
  pthread_mutex_unlock(&ctx->lock);
  return found;
}

static void pendingPut(sockCtx* ctx, sockPendingConnect* p) {
  p->lastTouch = sockNowNs();
  pthread_mutex_lock(&ctx->lock);
  p->next = ctx->pending;
  ctx->pending = p;
  pthread_mutex_unlock(&ctx->lock);
}

ncclxResult_t sockConnect(void* vctx, int dev, const void* handle, void** sendComm) {
  sockCtx* ctx = vctx;
  if (!ctx || !handle || !sendComm) return ncclxInternalError;
  *sendComm = NULL;
  sockHandle h;
  memcpy(&h, handle, sizeof(h));
  int fam = h.addr.sa.sa_family;
  if (dev != 0 || h.magic != SOCK_HANDLE_MAGIC || h.nsocks < 1 || h.nsocks > SOCK_MAX_SOCKS ||
      (fam != AF_INET && fam != AF_INET6)) {
    SOCK_WARN(ctx, "connect: invalid device %d or handle (magic 0x%x, %u sockets, family %d)",
              dev, h.magic, (unsigned)h.nsocks, fam);
    return ncclxInternalError;
  }
  sockPendingConnect* p = pendingTake(ctx, &h, sendComm);
  ncclxResult_t res = ncclxSuccess;
  if (!p) {
    p = calloc(1, sizeof(*p));
    if (!p) return ncclxSystemError;
    p->handle = h;
    p->owner = sendComm;
    p->nsocks = h.nsocks;
    p->connId = sockRandom64();
    for (int i = 0; i < SOCK_MAX_SOCKS; i++) p->fds[i] = -1;
    sockAddrFormat(&h.addr, p->peer, sizeof(p->peer));
    res = connectStart(ctx, p);
  }
  int done = 0;
  if (res == ncclxSuccess) res = connectStep(ctx, p, &done);
  if (res != ncclxSuccess) {
    sockPendingFree(p);
    return res;
  }
  if (!done) {
    pendingPut(ctx, p);
    return ncclxSuccess;
  }
  sockComm* c = sockCommCreate(ctx, SOCK_KIND_SEND, p->nsocks, p->fds, p->peer);
  if (!c) {
    sockPendingFree(p);
    return ncclxSystemError;
  }
  SOCK_LOG(ctx, NCCLX_LOG_TRACE, "NET/Socket: connected to %s with %d sockets", p->peer, p->nsocks);
  free(p); /* its fds now belong to c */
  *sendComm = c;
  return ncclxSuccess;
}

static void listenRefuse(sockListenComm* lc, int i, const char* why) {
  sockIncoming* in = &lc->inc[i];
  SOCK_WARN(lc->head.ctx, "refused connection from %s on %s: %s", in->peer, lc->addr, why);
  close(in->fd);
  lc->inc[i] = lc->inc[--lc->ninc];
}

static ncclxResult_t acceptNew(sockListenComm* lc) {
  sockCtx* ctx = lc->head.ctx;
  for (;;) {
    sockAddr a;
    socklen_t al = sizeof(a);
    memset(&a, 0, sizeof(a));
    int fd = accept4(lc->fd, &a.sa, &al, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK) return ncclxSuccess;
      if (errno == EINTR || errno == ECONNABORTED || errno == EPROTO) continue;
      SOCK_WARN(ctx, "accept on %s failed: %s", lc->addr, strerror(errno));
      return ncclxSystemError;
    }
    char peer[SOCK_ADDR_STR];
    sockAddrFormat(&a, peer, sizeof(peer));
    if (lc->ninc >= SOCK_MAX_UNIDENTIFIED) {
      SOCK_WARN(ctx, "refused connection from %s on %s: %d connections already wait for their "
                "hello", peer, lc->addr, lc->ninc);
      close(fd);
      continue;
    }
    if (lc->ninc == lc->capInc) {
      int cap = lc->capInc ? 2 * lc->capInc : 8;
      sockIncoming* n = realloc(lc->inc, (size_t)cap * sizeof(*n));
      if (!n) {
        close(fd);
        return ncclxSystemError;
      }
      lc->inc = n;
      lc->capInc = cap;
    }
    sockSetNoDelay(fd);
    sockIncoming* in = &lc->inc[lc->ninc++];
    memset(in, 0, sizeof(*in));
    in->fd = fd;
    in->t0 = sockNowNs();
    snprintf(in->peer, sizeof(in->peer), "%s", peer);
    sockPollAdd(lc->epfd, fd);
  }
}

/* A socket whose hello is valid joins the group of its connection id. */
static ncclxResult_t groupJoin(sockListenComm* lc, int i) {
  sockIncoming* in = &lc->inc[i];
  uint64_t connId = le64toh(in->hello.connId);
  int index = le16toh(in->hello.index);
  sockGroup* g = NULL;
  for (int k = 0; k < lc->ngroups; k++)
    if (lc->groups[k].connId == connId) g = &lc->groups[k];
  if (!g) {
    if (lc->ngroups == lc->capGroups) {
      int cap = lc->capGroups ? 2 * lc->capGroups : 4;
      sockGroup* n = realloc(lc->groups, (size_t)cap * sizeof(*n));
      if (!n) return ncclxSystemError;
      lc->groups = n;
      lc->capGroups = cap;
    }
    g = &lc->groups[lc->ngroups++];
    memset(g, 0, sizeof(*g));
    g->connId = connId;
    g->t0 = sockNowNs();
    for (int k = 0; k < SOCK_MAX_SOCKS; k++) g->fds[k] = -1;
    snprintf(g->peer, sizeof(g->peer), "%s", in->peer);
  }
  if (g->fds[index] >= 0) {
    char why[64];
    snprintf(why, sizeof(why), "duplicate socket index %d", index);
    listenRefuse(lc, i, why);
    return ncclxSuccess;
  }
  g->fds[index] = in->fd;
  g->count++;
  sockPollDel(lc->epfd, in->fd); /* its data is for the recvComm, not for accept */
  lc->inc[i] = lc->inc[--lc->ninc];
  return ncclxSuccess;
}

/* Read hellos without blocking; refuse anything that is not one of ours. */
static ncclxResult_t readHellos(sockListenComm* lc) {
  uint64_t now = sockNowNs();
  for (int i = 0; i < lc->ninc;) {
    sockIncoming* in = &lc->inc[i];
    ssize_t n = recv(in->fd, (char*)&in->hello + in->got, sizeof(sockHello) - in->got, MSG_DONTWAIT);
    if (n < 0 && errno == EINTR) continue;
    if (n == 0) {
      listenRefuse(lc, i, "closed before sending a hello");
      continue;
    }
    if (n < 0) {
      if (errno != EAGAIN && errno != EWOULDBLOCK) {
        listenRefuse(lc, i, strerror(errno));
      } else if (now - in->t0 > SOCK_HELLO_TIMEOUT_NS) {
        listenRefuse(lc, i, "no hello within 10 s");
      } else {
        i++;
      }
      continue;
    }
    in->got += (size_t)n;
    if (in->got >= sizeof(uint32_t) && le32toh(in->hello.magic) != SOCK_HELLO_MAGIC) {
      listenRefuse(lc, i, "bad magic");
      continue;
    }
    if (in->got < sizeof(sockHello)) continue; /* read the rest now, or on a later call */
    unsigned ns = le16toh(in->hello.nsocks), index = le16toh(in->hello.index);
    char why[96];
    if (le64toh(in->hello.nonce) != lc->nonce) {
      listenRefuse(lc, i, "wrong nonce (a stranger, or a sender holding a stale handle)");
    } else if (ns != (unsigned)lc->nsocks || index >= ns) {
      snprintf(why, sizeof(why), "bad socket index %u of %u (expected %d sockets)", index, ns,
               lc->nsocks);
      listenRefuse(lc, i, why);
    } else {
      ncclxResult_t res = groupJoin(lc, i);
      if (res != ncclxSuccess) return res;
    }
  }
  return ncclxSuccess;
}

static void groupDrop(sockListenComm* lc, int k) {
  for (int s = 0; s < SOCK_MAX_SOCKS; s++)
    if (lc->groups[k].fds[s] >= 0) close(lc->groups[k].fds[s]);
  lc->groups[k] = lc->groups[--lc->ngroups];
}

ncclxResult_t sockAccept(void* listenComm, void** recvComm) {
  sockListenComm* lc = listenComm;
  if (!recvComm || sockCommKind(lc) != SOCK_KIND_LISTEN) return ncclxInternalError;
  *recvComm = NULL;
  sockCtx* ctx = lc->head.ctx;
  ncclxResult_t res = acceptNew(lc);
  if (res == ncclxSuccess) res = readHellos(lc);
  if (res != ncclxSuccess) return res;

  uint64_t now = sockNowNs();
  for (int k = 0; k < lc->ngroups;) {
    sockGroup* g = &lc->groups[k];
    if (g->count == lc->nsocks) {
      sockComm* c = sockCommCreate(ctx, SOCK_KIND_RECV, lc->nsocks, g->fds, g->peer);
      if (!c) return ncclxSystemError;
      SOCK_LOG(ctx, NCCLX_LOG_TRACE, "NET/Socket: accepted %s on %s with %d sockets", g->peer,
               lc->addr, lc->nsocks);
      lc->groups[k] = lc->groups[--lc->ngroups];
      *recvComm = c;
      return ncclxSuccess;
    }
    if (now - g->t0 > SOCK_GROUP_TIMEOUT_NS) {
      SOCK_WARN(ctx, "dropped connection from %s on %s: only %d of %d sockets arrived within "
                "30 s", g->peer, lc->addr, g->count, lc->nsocks);
      groupDrop(lc, k);
      continue;
    }
    k++;
  }
  return ncclxSuccess;
}

ncclxResult_t sockCloseListen(void* listenComm) {
  sockListenComm* lc = listenComm;
  if (sockCommKind(lc) != SOCK_KIND_LISTEN) return ncclxInternalError;
  for (int i = 0; i < lc->ninc; i++) close(lc->inc[i].fd);
  while (lc->ngroups > 0) groupDrop(lc, lc->ngroups - 1);
  close(lc->fd);
  if (lc->epfd >= 0) close(lc->epfd);
  free(lc->inc);
  free(lc->groups);
  lc->head.kind = 0;
  free(lc);
  return ncclxSuccess;
}

/* getPollFd for a listenComm: the listening socket and the sockets still owing a hello. */
ncclxResult_t sockListenPollFd(sockListenComm* lc, int* fd) {
  if (lc->epfd < 0) {
    if ((lc->epfd = epoll_create1(EPOLL_CLOEXEC)) < 0) return ncclxSystemError;
    sockPollAdd(lc->epfd, lc->fd);
    for (int i = 0; i < lc->ninc; i++) sockPollAdd(lc->epfd, lc->inc[i].fd);
  }
  *fd = lc->epfd;
  return ncclxSuccess;
}
