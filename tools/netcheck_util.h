/* ncclx-net-check: clocks, data patterns, bounded pipe I/O between the test processes and
 * the result records they send to the parent. */
#ifndef NCCLX_NETCHECK_UTIL_H
#define NCCLX_NETCHECK_UTIL_H

#include <errno.h>
#include <poll.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static inline double ncNow(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Byte i of the message with this salt: depends on both, so a message landing in the wrong
 * receive, or shifted, is caught. */
static inline uint8_t ncPatByte(uint64_t salt, size_t i) {
  uint64_t x = ((uint64_t)i + 1) * 0x9e3779b97f4a7c15ull ^ (salt + 1) * 0xbf58476d1ce4e5b9ull;
  x ^= x >> 29;
  return (uint8_t)(x ^ (x >> 8) ^ (x >> 40));
}

static inline void ncPatFill(uint8_t* buf, size_t n, uint64_t salt) {
  for (size_t i = 0; i < n; i++) buf[i] = ncPatByte(salt, i);
}

/* Offset of the first wrong byte, or (size_t)-1 when all n are right. */
static inline size_t ncPatCheck(const uint8_t* buf, size_t n, uint64_t salt) {
  for (size_t i = 0; i < n; i++)
    if (buf[i] != ncPatByte(salt, i)) return i;
  return (size_t)-1;
}

/* Write all of buf; 0 or -1. */
static inline int ncWriteAll(int fd, const void* buf, size_t n) {
  const char* p = buf;
  while (n > 0) {
    ssize_t w = write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return -1;
    p += w;
    n -= (size_t)w;
  }
  return 0;
}

/* Read exactly n bytes within `seconds`; 0 ok, -1 EOF or error, -2 timeout. */
static inline int ncReadAll(int fd, void* buf, size_t n, double seconds) {
  char* p = buf;
  double deadline = ncNow() + seconds;
  while (n > 0) {
    double left = deadline - ncNow();
    if (left <= 0) return -2;
    struct pollfd pfd = {.fd = fd, .events = POLLIN, .revents = 0};
    int pr = poll(&pfd, 1, (int)(left * 1000) + 1);
    if (pr < 0 && errno == EINTR) continue;
    if (pr < 0) return -1;
    if (pr == 0) continue;
    ssize_t r = read(fd, p, n);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return -1;
    p += r;
    n -= (size_t)r;
  }
  return 0;
}

/* 1 when fd has reached EOF (the process at the other end is gone), else 0. */
static inline int ncPeerGone(int fd) {
  struct pollfd pfd = {.fd = fd, .events = POLLIN, .revents = 0};
  if (poll(&pfd, 1, 0) <= 0) return 0;
  if (pfd.revents & (POLLHUP | POLLERR)) return 1;
  char c;
  return recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT) == 0;
}

/* ---- result records: child -> parent, one write each (< PIPE_BUF, so never torn) ---- */

enum { NC_PASS = 0, NC_FAIL = 1, NC_SKIP = 2, NC_KILLME = 3 };

typedef struct {
  int check;
  int role;
  int status;
  double seconds; /* how long the check took in this process */
  char msg[500];
} ncRecord;

static int ncResultFd = -1;
static int ncRoleId = 0;
static double ncCheckStart; /* set when a check begins */

static inline void ncReport(int check, int status, const char* fmt, ...)
    __attribute__((format(printf, 3, 4)));
static inline void ncReport(int check, int status, const char* fmt, ...) {
  ncRecord r;
  memset(&r, 0, sizeof(r));
  r.check = check;
  r.role = ncRoleId;
  r.status = status;
  r.seconds = ncCheckStart > 0 ? ncNow() - ncCheckStart : 0;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(r.msg, sizeof(r.msg), fmt, ap);
  va_end(ap);
  if (ncResultFd >= 0) (void)ncWriteAll(ncResultFd, &r, sizeof(r));
}

#endif /* NCCLX_NETCHECK_UTIL_H */
