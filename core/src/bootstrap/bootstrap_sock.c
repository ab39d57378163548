/* Bootstrap plumbing: clocks and deadlines, socket addresses, listeners, connects, and
 * whole-buffer send/recv bounded by a deadline. No bootstrap state lives here. */
#include <arpa/inet.h>
#include <errno.h>
#include <ifaddrs.h>
#include <math.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "bootstrap/bootstrap_internal.h"
#include "util/debug.h"

/* ---------------- small helpers ---------------- */

double bsNow(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

double bsDeadlineAfter(double timeoutSec) {
  return timeoutSec > 0 ? bsNow() + timeoutSec : INFINITY;
}

/* Milliseconds to sleep: at most sliceMs, never past the deadline. */
int bsSliceUntil(double deadline, int sliceMs) {
  double left = deadline - bsNow();
  if (left <= 0) return 0;
  if (left * 1000.0 < sliceMs) return (int)(left * 1000.0) + 1;
  return sliceMs;
}

void bsSleepSec(double s) {
  struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

void bsWireToSockaddr(const struct wireAddr* w, struct sockaddr_storage* ss, socklen_t* len) {
  memset(ss, 0, sizeof(*ss));
  if (w->family == AF_INET6) {
    struct sockaddr_in6* s6 = (struct sockaddr_in6*)ss;
    s6->sin6_family = AF_INET6;
    s6->sin6_port = w->port;
    s6->sin6_scope_id = w->scopeId;
    memcpy(&s6->sin6_addr, w->ip, 16);
    *len = sizeof(*s6);
  } else {
    struct sockaddr_in* s4 = (struct sockaddr_in*)ss;
    s4->sin_family = AF_INET;
    s4->sin_port = w->port;
    memcpy(&s4->sin_addr, w->ip, 4);
    *len = sizeof(*s4);
  }
}

int bsSockaddrToWire(const struct sockaddr* sa, struct wireAddr* w) {
  memset(w, 0, sizeof(*w));
  if (sa->sa_family == AF_INET) {
    const struct sockaddr_in* s4 = (const struct sockaddr_in*)sa;
    w->family = AF_INET;
    w->port = s4->sin_port;
    memcpy(w->ip, &s4->sin_addr, 4);
    return 0;
  }
  if (sa->sa_family == AF_INET6) {
    const struct sockaddr_in6* s6 = (const struct sockaddr_in6*)sa;
    w->family = AF_INET6;
    w->port = s6->sin6_port;
    w->scopeId = s6->sin6_scope_id;
    memcpy(w->ip, &s6->sin6_addr, 16);
    return 0;
  }
  return -1;
}

/* "1.2.3.4:5" or "[::1]:5". */
const char* bsAddrString(const struct wireAddr* w, char* buf, size_t size) {
  char ip[INET6_ADDRSTRLEN] = "?";
  if (w->family != AF_INET && w->family != AF_INET6) {
    snprintf(buf, size, "address not known yet");
    return buf;
  }
  if (w->family == AF_INET6) {
    inet_ntop(AF_INET6, w->ip, ip, sizeof(ip));
    snprintf(buf, size, "[%s]:%u", ip, (unsigned)ntohs(w->port));
  } else {
    inet_ntop(AF_INET, w->ip, ip, sizeof(ip));
    snprintf(buf, size, "%s:%u", ip, (unsigned)ntohs(w->port));
  }
  return buf;
}

const char* bsPeerString(int fd, char* buf, size_t size) {
  struct sockaddr_storage ss;
  socklen_t len = sizeof(ss);
  struct wireAddr w;
  if (getpeername(fd, (struct sockaddr*)&ss, &len) != 0 || bsSockaddrToWire((struct sockaddr*)&ss, &w) != 0)
    snprintf(buf, size, "an unknown address");
  else
    bsAddrString(&w, buf, size);
  return buf;
}

int bsIsLoopback(const struct wireAddr* w) {
  if (w->family == AF_INET) return w->ip[0] == 127;
  static const uint8_t v6loop[16] = {[15] = 1};
  return memcmp(w->ip, v6loop, 16) == 0;
}

/* ---------------- sockets ---------------- */

/* A non-blocking listener on bindAddr (port 0: any free port). Returns fd or -1 (errno set). */
int bsOpenListener(const struct wireAddr* bindAddr, int reuseAddr, struct wireAddr* actual) {
  int fd = socket(bindAddr->family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  int one = 1;
  if (reuseAddr) setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  struct sockaddr_storage ss;
  socklen_t len;
  bsWireToSockaddr(bindAddr, &ss, &len);
  if (bind(fd, (struct sockaddr*)&ss, len) != 0 || listen(fd, LISTEN_BACKLOG) != 0) {
    int e = errno;
    close(fd);
    errno = e;
    return -1;
  }
  if (actual) {
    len = sizeof(ss);
    getsockname(fd, (struct sockaddr*)&ss, &len);
    bsSockaddrToWire((struct sockaddr*)&ss, actual);
  }
  return fd;
}

static int retryableConnectError(int e) {
  return e == ECONNREFUSED || e == ETIMEDOUT || e == EHOSTUNREACH || e == ENETUNREACH ||
         e == ECONNRESET || e == EAGAIN || e == ECONNABORTED;
}

/* Connect (non-blocking socket) before the deadline. retry: keep trying with backoff while
 * the peer is not listening yet. Returns fd, or -1 with *err set. */
int bsConnectWithin(const struct wireAddr* to, double deadline, int retry, int* attempts, int* err) {
  struct sockaddr_storage ss;
  socklen_t len;
  bsWireToSockaddr(to, &ss, &len);
  double backoff = 0.01;
  int tries = 0;
  for (;;) {
    tries++;
    int e = 0;
    int fd = socket(to->family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
      *err = errno;
      return -1;
    }
    if (connect(fd, (struct sockaddr*)&ss, len) != 0) {
      e = errno;
      if (e == EINPROGRESS) {
        e = ETIMEDOUT;
        for (;;) {
          struct pollfd p = {fd, POLLOUT, 0};
          int n = poll(&p, 1, bsSliceUntil(deadline, POLL_SLICE_MS));
          if (n > 0) {
            socklen_t elen = sizeof(e);
            if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &e, &elen) != 0) e = errno;
            break;
          }
          if (bsNow() >= deadline) break;
        }
      }
    }
    if (e == 0) {
      int one = 1;
      setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
      if (attempts) *attempts = tries;
      return fd;
    }
    close(fd);
    double left = deadline - bsNow();
    if (!retry || !retryableConnectError(e) || left <= 0) {
      *err = e;
      if (attempts) *attempts = tries;
      return -1;
    }
    bsSleepSec(backoff < left ? backoff : left);
    /* At most 50 ms: a rank that arrives before its root listens would otherwise sleep up to
     * 0.5 s past the moment the root is ready, straight onto every rank's init time. A
     * refused connect costs microseconds, so retrying 20 times a second is cheap. */
    backoff = backoff * 2 > 0.05 ? 0.05 : backoff * 2;
  }
}

/* Write everything before the deadline. Returns 0, or an errno value. */
int bsSendAll(int fd, const void* data, size_t size, double deadline) {
  const char* p = data;
  while (size > 0) {
    ssize_t n = send(fd, p, size, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      p += n;
      size -= (size_t)n;
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK) return errno;
    if (bsNow() >= deadline) return ETIMEDOUT;
    struct pollfd pfd = {fd, POLLOUT, 0};
    poll(&pfd, 1, bsSliceUntil(deadline, POLL_SLICE_MS));
  }
  return 0;
}

/* Read exactly size bytes before the deadline. Returns 0, an errno value, or -1 on EOF. */
int bsRecvAll(int fd, void* data, size_t size, double deadline) {
  char* p = data;
  while (size > 0) {
    ssize_t n = recv(fd, p, size, MSG_DONTWAIT);
    if (n > 0) {
      p += n;
      size -= (size_t)n;
      continue;
    }
    if (n == 0) return -1;
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) return errno;
    if (bsNow() >= deadline) return ETIMEDOUT;
    struct pollfd pfd = {fd, POLLIN, 0};
    poll(&pfd, 1, bsSliceUntil(deadline, POLL_SLICE_MS));
  }
  return 0;
}

/* First UP, non-loopback IPv4 address of this host, else 127.0.0.1 (port 0). */
void bsPickLocalAddress(struct wireAddr* w) {
  memset(w, 0, sizeof(*w));
  w->family = AF_INET;
  w->ip[0] = 127;
  w->ip[3] = 1;
  struct ifaddrs* list = NULL;
  if (getifaddrs(&list) != 0) return;
  for (struct ifaddrs* ifa = list; ifa; ifa = ifa->ifa_next) {
    if (!ifa->ifa_addr || ifa->ifa_addr->sa_family != AF_INET) continue;
    if (!(ifa->ifa_flags & IFF_UP) || (ifa->ifa_flags & IFF_LOOPBACK)) continue;
    bsSockaddrToWire(ifa->ifa_addr, w);
    w->port = 0;
    INFO(NCCLX_LOG_BOOTSTRAP, "bootstrap: using interface %s for the unique id", ifa->ifa_name);
    break;
  }
  freeifaddrs(list);
}

/* The local address the kernel would use to reach `to` (port 0): where peers can reach us. */
int bsLocalAddressToward(const struct wireAddr* to, struct wireAddr* local) {
  int fd = socket(to->family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  struct sockaddr_storage ss;
  socklen_t len;
  bsWireToSockaddr(to, &ss, &len);
  int rc = connect(fd, (struct sockaddr*)&ss, len);
  if (rc == 0) {
    len = sizeof(ss);
    rc = getsockname(fd, (struct sockaddr*)&ss, &len);
  }
  if (rc == 0) rc = bsSockaddrToWire((struct sockaddr*)&ss, local);
  close(fd);
  if (rc == 0) local->port = 0;
  return rc;
}
