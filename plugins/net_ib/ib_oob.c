/* TCP side channel and OS helpers (see ib_oob.h). */
#include "ib_oob.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/tcp.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

uint64_t ibNowNs(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

uint64_t ibRandom64(void) {
  uint64_t v;
  if (getrandom(&v, sizeof(v), GRND_NONBLOCK) == (ssize_t)sizeof(v)) return v;
  /* No entropy yet: time, pid and a counter still make nonces unique per process. */
  static atomic_uint_fast64_t counter;
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  v = (uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 30) ^ ((uint64_t)getpid() << 48) ^
      atomic_fetch_add(&counter, 0x9e3779b97f4a7c15ull);
  v ^= v >> 31;
  v *= 0xbf58476d1ce4e5b9ull;
  return v ^ (v >> 29);
}

static socklen_t addrLen(const ibSockAddr* a) {
  return a->sa.sa_family == AF_INET6 ? (socklen_t)sizeof(a->in6) : (socklen_t)sizeof(a->in4);
}

void ibOobFormat(const ibSockAddr* a, char* buf, size_t len) {
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

static int linkLocal6(const struct sockaddr_in6* a) {
  return a->sin6_addr.s6_addr[0] == 0xfe && (a->sin6_addr.s6_addr[1] & 0xc0) == 0x80;
}

int ibOobPickAddr(const char* ifname, ibSockAddr* out, char* ifOut, size_t ifLen, char* why,
                  size_t whyLen) {
  struct ifaddrs* list = NULL;
  if (getifaddrs(&list) != 0) {
    snprintf(why, whyLen, "getifaddrs failed: %s", strerror(errno));
    return -1;
  }
  int want = ifname && *ifname;
  const struct ifaddrs *v4 = NULL, *v6 = NULL, *loop = NULL;
  for (const struct ifaddrs* it = list; it; it = it->ifa_next) {
    if (!it->ifa_addr || !it->ifa_name) continue;
    int fam = it->ifa_addr->sa_family;
    if (fam != AF_INET && fam != AF_INET6) continue;
    if (want) {
      if (strcmp(it->ifa_name, ifname) != 0) continue;
      if (fam == AF_INET && !v4) v4 = it;
      if (fam == AF_INET6 && !v6 && !linkLocal6((const struct sockaddr_in6*)(const void*)it->ifa_addr))
        v6 = it;
    } else if (fam == AF_INET && (it->ifa_flags & IFF_UP)) {
      if (it->ifa_flags & IFF_LOOPBACK) {
        if (!loop) loop = it;
      } else if (!v4) {
        v4 = it;
      }
    }
  }
  const struct ifaddrs* pick = v4 ? v4 : want ? v6 : loop;
  int rc = -1;
  if (!pick) {
    if (want)
      snprintf(why, whyLen, "interface '%s' has no IPv4 or global IPv6 address", ifname);
    else
      snprintf(why, whyLen, "no UP interface with an IPv4 address (not even loopback)");
  } else {
    memset(out, 0, sizeof(*out));
    memcpy(out, pick->ifa_addr, pick->ifa_addr->sa_family == AF_INET6 ? sizeof(struct sockaddr_in6)
                                                                      : sizeof(struct sockaddr_in));
    if (ifOut) snprintf(ifOut, ifLen, "%s", pick->ifa_name);
    rc = 0;
  }
  freeifaddrs(list);
  return rc;
}

static void tune(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

int ibOobListen(const ibSockAddr* local, ibSockAddr* bound) {
  int fd = socket(local->sa.sa_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  ibSockAddr a = *local;
  if (a.sa.sa_family == AF_INET) a.in4.sin_port = 0;
  else a.in6.sin6_port = 0;
  socklen_t len = addrLen(&a);
  if (bind(fd, &a.sa, len) != 0 || listen(fd, 256) != 0 || getsockname(fd, &bound->sa, &len) != 0) {
    int e = errno;
    close(fd);
    errno = e;
    return -1;
  }
  return fd;
}

int ibOobConnectStart(const ibSockAddr* remote) {
  int fd = socket(remote->sa.sa_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  tune(fd);
  if (connect(fd, &remote->sa, addrLen(remote)) != 0 && errno != EINPROGRESS) {
    int e = errno;
    close(fd);
    errno = e;
    return -1;
  }
  return fd;
}

int ibOobConnectCheck(int fd) {
  struct sockaddr_storage peer;
  socklen_t len = sizeof(peer);
  if (getpeername(fd, (struct sockaddr*)&peer, &len) == 0) return 1;
  if (errno != ENOTCONN) return -1;
  int err = 0;
  len = sizeof(err);
  if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0) return -1;
  if (err != 0 && err != EINPROGRESS && err != EALREADY) {
    errno = err;
    return -1;
  }
  return 0;
}

int ibOobAccept(int listenFd, ibSockAddr* peer) {
  for (;;) {
    socklen_t len = sizeof(*peer);
    int fd = accept4(listenFd, &peer->sa, &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd >= 0) {
      tune(fd);
      return fd;
    }
    if (errno == EINTR || errno == ECONNABORTED) continue;
    if (errno == EWOULDBLOCK) errno = EAGAIN;
    return -1;
  }
}

int ibOobSend(int fd, const void* buf, size_t len, size_t* off) {
  while (*off < len) {
    ssize_t n = send(fd, (const char*)buf + *off, len - *off, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n > 0) {
      *off += (size_t)n;
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return 0;
    if (n == 0) errno = ECONNRESET;
    return -1;
  }
  return 1;
}

int ibOobRecv(int fd, void* buf, size_t len, size_t* off) {
  while (*off < len) {
    ssize_t n = recv(fd, (char*)buf + *off, len - *off, MSG_DONTWAIT);
    if (n > 0) {
      *off += (size_t)n;
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return 0;
    if (n == 0) errno = ECONNRESET;
    return -1;
  }
  return 1;
}

int ibOobPeerState(int fd) {
  char b;
  ssize_t n = recv(fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
  if (n > 0) return 2;
  if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return 0;
  return 1;
}

void ibOobToWire(const ibSockAddr* a, int* family, uint8_t addr[16], uint16_t* port) {
  memset(addr, 0, 16);
  if (a->sa.sa_family == AF_INET6) {
    *family = 6;
    memcpy(addr, &a->in6.sin6_addr, 16);
    *port = ntohs(a->in6.sin6_port);
  } else {
    *family = 4;
    memcpy(addr, &a->in4.sin_addr, 4);
    *port = ntohs(a->in4.sin_port);
  }
}

int ibOobFromWire(int family, const uint8_t addr[16], uint16_t port, ibSockAddr* out) {
  memset(out, 0, sizeof(*out));
  if (port == 0) return -1;
  if (family == 4) {
    out->in4.sin_family = AF_INET;
    memcpy(&out->in4.sin_addr, addr, 4);
    out->in4.sin_port = htons(port);
    return 0;
  }
  if (family == 6) {
    out->in6.sin6_family = AF_INET6;
    memcpy(&out->in6.sin6_addr, addr, 16);
    out->in6.sin6_port = htons(port);
    return 0;
  }
  return -1;
}
