/* Small helpers of the socket network: time, randomness, addresses, socket options, epoll. */
#include "transport/socket/net_socket_internal.h"

uint64_t sockNowNs(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

uint64_t sockRandom64(void) {
  uint64_t v;
  if (getrandom(&v, sizeof(v), GRND_NONBLOCK) == (ssize_t)sizeof(v)) return v;
  /* No entropy yet (early boot): mix time, pid and a counter; uniqueness is what matters. */
  static atomic_uint_fast64_t counter;
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  v = (uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 30) ^ ((uint64_t)getpid() << 48) ^
      atomic_fetch_add(&counter, 0x9e3779b97f4a7c15ull);
  v ^= v >> 31;
  v *= 0xbf58476d1ce4e5b9ull;
  v ^= v >> 29;
  return v;
}

socklen_t sockAddrLen(const sockAddr* a) {
  return a->sa.sa_family == AF_INET6 ? (socklen_t)sizeof(a->in6) : (socklen_t)sizeof(a->in4);
}

void sockAddrFormat(const sockAddr* a, char* buf, size_t len) {
  char host[INET6_ADDRSTRLEN] = "?";
  if (a->sa.sa_family == AF_INET) {
    inet_ntop(AF_INET, &a->in4.sin_addr, host, sizeof(host));
    snprintf(buf, len, "%s:%u", host, (unsigned)ntohs(a->in4.sin_port));
  } else if (a->sa.sa_family == AF_INET6) {
    inet_ntop(AF_INET6, &a->in6.sin6_addr, host, sizeof(host));
    snprintf(buf, len, "[%s]:%u", host, (unsigned)ntohs(a->in6.sin6_port));
  } else {
    snprintf(buf, len, "(address family %d)", (int)a->sa.sa_family);
  }
}

/* Errors that mean the other side is gone rather than something wrong here. */
int sockErrnoIsRemote(int e) {
  return e == EPIPE || e == ECONNRESET || e == ECONNABORTED || e == ETIMEDOUT ||
         e == EHOSTUNREACH || e == ENETUNREACH || e == ENOTCONN || e == EHOSTDOWN;
}

void sockSetNoDelay(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

/* Large buffers keep a fast link full. The FORCE options pass net.core.[rw]mem_max when we
 * have CAP_NET_ADMIN; init already checked the plain ones are not capped below the request. */
void sockSetBuffers(const sockCtx* ctx, int fd) {
  if (ctx->bufBytes == 0) return;
  int v = (int)ctx->bufBytes;
  if (setsockopt(fd, SOL_SOCKET, SO_SNDBUFFORCE, &v, sizeof(v)) != 0)
    setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &v, sizeof(v));
  if (setsockopt(fd, SOL_SOCKET, SO_RCVBUFFORCE, &v, sizeof(v)) != 0)
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &v, sizeof(v));
}

int sockCommKind(const void* comm) {
  return comm ? (int)((const sockCommHead*)comm)->kind : 0;
}

void sockPollDel(int epfd, int fd) {
  if (epfd >= 0) epoll_ctl(epfd, EPOLL_CTL_DEL, fd, NULL);
}

void sockPollAdd(int epfd, int fd) {
  if (epfd < 0) return;
  struct epoll_event ev;
  memset(&ev, 0, sizeof(ev));
  ev.events = EPOLLIN;
  ev.data.fd = fd;
  epoll_ctl(epfd, EPOLL_CTL_ADD, fd, &ev);
}
