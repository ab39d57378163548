/*
 * The built-in TCP socket network, plugin name "socket".
 *
 * Self-contained on purpose: it uses only libc, the public ncclx headers and env->log, so the
 * same file builds into the core (symbol ncclxNetSocket) or, with
 * -DNCCLX_NET_SOCKET_STANDALONE, into libncclx-net-socket.so (symbol ncclxNetPlugin_v1).
 *
 * Wire protocol (little-endian):
 * - A connection is `nsocks` TCP sockets. Each starts with a hello {magic, socket index,
 *   nsocks, nonce, connection id}; the listener keeps a socket only when magic and nonce match
 *   the handle it issued, and groups sockets by connection id until all nsocks arrived.
 * - Message number `seq` has a 16-byte header {size, tag, check} on socket seq % nsocks (the
 *   "lead"), so a stream of small messages spreads over all sockets. Messages above
 *   SOCK_STRIPE_MIN are cut into nsocks page-aligned parts, part j on socket (lead + j) %
 *   nsocks; smaller ones travel whole after the header. Every socket is thus an ordered
 *   stream that both sides can walk independently once the header of a message is known.
 * - The check word (a constant xor seq) catches a stream that got out of step.
 *
 * Data moves with sendmsg/readv straight between user buffers and the kernel; the receiver
 * reads [rest of current segment][64 KiB staging] in one readv, so small messages cost one
 * syscall and large ones are not copied twice.
 */
#include <arpa/inet.h>
#include <endian.h>
#include <errno.h>
#include <ifaddrs.h>
#include <limits.h>
#include <net/if.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/epoll.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "ncclx/net.h"
#ifndef NCCLX_NET_SOCKET_STANDALONE
#include "plugin_loader.h" /* only for the declaration of ncclxNetSocket */
#endif

#ifdef NCCLX_NET_SOCKET_STANDALONE
#define SOCK_PLUGIN_SYMBOL ncclxNetPlugin_v1
#define SOCK_EXPORT __attribute__((visibility("default")))
#else
#define SOCK_PLUGIN_SYMBOL ncclxNetSocket
#define SOCK_EXPORT
#endif

#define SOCK_MAX_SOCKS 16
#define SOCK_DEFAULT_SOCKS 2
#define SOCK_DEFAULT_BUF_BYTES ((size_t)4 << 20)
#define SOCK_QUEUE NCCLX_NET_MAX_REQUESTS
#define SOCK_STRIPE_MIN ((size_t)256 << 10)
#define SOCK_STRIPE_ALIGN ((size_t)4096)
#define SOCK_STAGE_BYTES ((size_t)64 << 10)
#define SOCK_MAX_IOV 64
#define SOCK_MAX_MESSAGE ((size_t)1 << 30)
#define SOCK_HELLO_TIMEOUT_NS (10ull * 1000000000ull)
#define SOCK_GROUP_TIMEOUT_NS (30ull * 1000000000ull)
#define SOCK_STALE_CONNECT_NS (120ull * 1000000000ull)
#define SOCK_MAX_UNIDENTIFIED 256
#define SOCK_ADDR_STR 64

#define SOCK_HANDLE_MAGIC 0x4b53584eu /* "NXSK" */
#define SOCK_HELLO_MAGIC 0x4853584eu  /* "NXSH" */
#define SOCK_HDR_CHECK 0x6d73676eu
#define SOCK_KIND_LISTEN 0x4c4b534eu
#define SOCK_KIND_SEND 0x534b534eu
#define SOCK_KIND_RECV 0x524b534eu
#define SOCK_REQ_MAGIC 0x514b534eu

#define SOCK_LOG(ctx, level, ...) (ctx)->log((level), NCCLX_LOG_NET, __FILE__, __LINE__, __VA_ARGS__)
#define SOCK_WARN(ctx, ...) SOCK_LOG(ctx, NCCLX_LOG_WARN, "NET/Socket: " __VA_ARGS__)
#define SOCK_INFO(ctx, ...) SOCK_LOG(ctx, NCCLX_LOG_INFO, "NET/Socket: " __VA_ARGS__)

/* ------------------------------------------------------------------------------------------
 * Types
 * ------------------------------------------------------------------------------------------ */

typedef union {
  struct sockaddr sa;
  struct sockaddr_in in4;
  struct sockaddr_in6 in6;
} sockAddr;

/* What listen() hands out and connect() consumes (same byte layout on both hosts). */
typedef struct {
  uint32_t magic;
  uint16_t nsocks;
  uint16_t reserved;
  uint64_t nonce;
  sockAddr addr;
} sockHandle;
_Static_assert(sizeof(sockHandle) <= NCCLX_NET_HANDLE_MAXSIZE, "socket handle too large");

typedef struct {
  uint32_t magic;
  uint16_t index;
  uint16_t nsocks;
  uint64_t nonce;
  uint64_t connId;
} sockHello;
_Static_assert(sizeof(sockHello) == 24, "hello must have no padding");

typedef struct {
  uint64_t size;
  uint32_t tag;
  uint32_t check;
} sockWireHdr;
_Static_assert(sizeof(sockWireHdr) == 16, "header must have no padding");
#define SOCK_HDR_BYTES sizeof(sockWireHdr)

typedef struct sockPendingConnect sockPendingConnect;

typedef struct {
  ncclxLogger_t log;
  char ifname[IF_NAMESIZE + 1];
  char* pciPath;
  sockAddr addr; /* interface address, port 0 */
  int nsocks;
  size_t bufBytes; /* 0: leave socket buffers to kernel autotuning */
  int speedMbps;
  float latencyUs;
  uint64_t guid;
  pthread_mutex_t lock; /* guards `pending` */
  sockPendingConnect* pending;
} sockCtx;

/* First member of every comm, so a void* comm can be checked and traced back to its ctx. */
typedef struct {
  uint32_t kind;
  sockCtx* ctx;
} sockCommHead;

enum { SOCK_REQ_FREE = 0, SOCK_REQ_POSTED, SOCK_REQ_COMPLETE };

struct sockComm;
typedef struct {
  uint32_t magic;
  int state;
  struct sockComm* comm;
  uint64_t seq;
  char* data;
  size_t size;    /* send: message bytes; receive: capacity */
  size_t msgSize; /* bytes of the message (receive: valid once hdrKnown) */
  int hdrKnown;
  int socksLeft;  /* sockets whose part of this message is not done yet */
  sockWireHdr hdr;
} sockReq;

/* A send or receive connection. Per socket, cur/off are the message (seq) it is working on
 * and the bytes of that message's part already moved. */
typedef struct sockComm {
  sockCommHead head;
  int nsocks;
  int fds[SOCK_MAX_SOCKS];
  uint64_t cur[SOCK_MAX_SOCKS];
  size_t off[SOCK_MAX_SOCKS];
  char* stage[SOCK_MAX_SOCKS];
  size_t stageBeg[SOCK_MAX_SOCKS], stageEnd[SOCK_MAX_SOCKS];
  int epfd;
  unsigned epMask; /* send: sockets currently registered for EPOLLOUT */
  uint64_t first, next; /* oldest unreleased and next message numbers */
  ncclxResult_t err;
  char peer[SOCK_ADDR_STR];
  sockReq reqs[SOCK_QUEUE];
} sockComm;

/* A socket accepted by the listener that has not proven itself yet. */
typedef struct {
  int fd;
  uint64_t t0;
  size_t got;
  sockHello hello;
  char peer[SOCK_ADDR_STR];
} sockIncoming;

/* Sockets of one connection id that passed the hello check. */
typedef struct {
  uint64_t connId;
  uint64_t t0;
  int count;
  int fds[SOCK_MAX_SOCKS];
  char peer[SOCK_ADDR_STR];
} sockGroup;

typedef struct {
  sockCommHead head;
  int fd;
  int epfd;
  int nsocks;
  uint64_t nonce;
  char addr[SOCK_ADDR_STR];
  sockIncoming* inc;
  int ninc, capInc;
  sockGroup* groups;
  int ngroups, capGroups;
} sockListenComm;

struct sockPendingConnect {
  sockPendingConnect* next;
  sockHandle handle;
  void** owner; /* the caller's *sendComm slot: identifies this connect across calls */
  uint64_t lastTouch;
  uint64_t connId;
  int nsocks;
  int fds[SOCK_MAX_SOCKS];
  int step[SOCK_MAX_SOCKS]; /* 0 connecting, 1 writing hello, 2 done */
  size_t helloOff[SOCK_MAX_SOCKS];
  sockHello hello[SOCK_MAX_SOCKS];
  char peer[SOCK_ADDR_STR];
};

/* ------------------------------------------------------------------------------------------
 * Small helpers
 * ------------------------------------------------------------------------------------------ */

static uint64_t nowNs(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static uint64_t random64(void) {
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

static socklen_t addrLen(const sockAddr* a) {
  return a->sa.sa_family == AF_INET6 ? (socklen_t)sizeof(a->in6) : (socklen_t)sizeof(a->in4);
}

static void addrFormat(const sockAddr* a, char* buf, size_t len) {
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
static int errnoIsRemote(int e) {
  return e == EPIPE || e == ECONNRESET || e == ECONNABORTED || e == ETIMEDOUT ||
         e == EHOSTUNREACH || e == ENETUNREACH || e == ENOTCONN || e == EHOSTDOWN;
}

static void setNoDelay(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

/* Large buffers keep a fast link full. The FORCE options pass net.core.[rw]mem_max when we
 * have CAP_NET_ADMIN; init already checked the plain ones are not capped below the request. */
static void setBuffers(const sockCtx* ctx, int fd) {
  if (ctx->bufBytes == 0) return;
  int v = (int)ctx->bufBytes;
  if (setsockopt(fd, SOL_SOCKET, SO_SNDBUFFORCE, &v, sizeof(v)) != 0)
    setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &v, sizeof(v));
  if (setsockopt(fd, SOL_SOCKET, SO_RCVBUFFORCE, &v, sizeof(v)) != 0)
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &v, sizeof(v));
}

static int commKind(const void* comm) {
  return comm ? (int)((const sockCommHead*)comm)->kind : 0;
}

/* ------------------------------------------------------------------------------------------
 * Configuration and interface choice
 * ------------------------------------------------------------------------------------------ */

static const char* const sockKnownKeys[] = {"ifname", "nsocks", "buffer_bytes"};

/* Where a key's value came from, for error messages. */
static const char* configWhere(const ncclxPluginEnv_t* env, const char* key, const char* value) {
  for (int i = 0;; i++) {
    const char *k = NULL, *v = NULL, *w = NULL;
    if (!env->config->entry || !env->config->entry(env->section, i, &k, &v, &w)) break;
    if (k && strcasecmp(k, key) == 0)
      return (v && value && strcmp(v, value) == 0 && w) ? w : "environment override";
  }
  return "environment";
}

static void warnUnknownKeys(const ncclxPluginEnv_t* env) {
  if (!env->config->entry) return;
  for (int i = 0;; i++) {
    const char *k = NULL, *v = NULL, *w = NULL;
    if (!env->config->entry(env->section, i, &k, &v, &w)) break;
    if (!k) continue;
    int known = 0;
    for (size_t j = 0; j < sizeof(sockKnownKeys) / sizeof(sockKnownKeys[0]); j++)
      if (strcasecmp(k, sockKnownKeys[j]) == 0) known = 1;
    if (!known)
      env->log(NCCLX_LOG_WARN, NCCLX_LOG_NET | NCCLX_LOG_ENV, __FILE__, __LINE__,
               "NET/Socket: ignoring unknown key '%s' (%s); known keys: ifname, nsocks, "
               "buffer_bytes", k, w ? w : "?");
  }
}

static int parseLong(const char* s, long* out) {
  char* end = NULL;
  errno = 0;
  long v = strtol(s, &end, 10);
  if (errno != 0 || end == s) return -1;
  while (*end == ' ' || *end == '\t') end++;
  if (*end != '\0') return -1;
  *out = v;
  return 0;
}

/* "4194304", "4M", "512KiB", "1G": binary multiples. */
static int parseBytes(const char* s, size_t* out) {
  char* end = NULL;
  errno = 0;
  while (*s == ' ' || *s == '\t') s++;
  if (*s == '-') return -1;
  unsigned long long v = strtoull(s, &end, 10);
  if (errno != 0 || end == s) return -1;
  while (*end == ' ') end++;
  unsigned shift = 0;
  switch (*end) {
    case 'k': case 'K': shift = 10; end++; break;
    case 'm': case 'M': shift = 20; end++; break;
    case 'g': case 'G': shift = 30; end++; break;
    default: break;
  }
  if (shift && (*end == 'i' || *end == 'I')) end++;
  if (*end == 'b' || *end == 'B') end++;
  if (*end != '\0') return -1;
  if (shift && v > (ULLONG_MAX >> shift)) return -1;
  *out = (size_t)(v << shift);
  return 0;
}

static int isLinkLocal6(const struct sockaddr_in6* a) {
  return a->sin6_addr.s6_addr[0] == 0xfe && (a->sin6_addr.s6_addr[1] & 0xc0) == 0x80;
}

/* ifname set: that interface's IPv4 address, else its best IPv6 one. Unset: the first UP
 * non-loopback IPv4 interface, else loopback. */
static ncclxResult_t pickInterface(const ncclxPluginEnv_t* env, const char* want, sockCtx* ctx) {
  struct ifaddrs* list = NULL;
  if (getifaddrs(&list) != 0) {
    env->log(NCCLX_LOG_WARN, NCCLX_LOG_NET, __FILE__, __LINE__,
             "NET/Socket: getifaddrs failed: %s", strerror(errno));
    return ncclxSystemError;
  }
  const struct ifaddrs *best = NULL, *best6 = NULL, *loop = NULL;
  char names[256] = "";
  for (const struct ifaddrs* it = list; it; it = it->ifa_next) {
    if (!it->ifa_addr || !it->ifa_name) continue;
    int fam = it->ifa_addr->sa_family;
    if (fam != AF_INET && fam != AF_INET6) continue;
    if (!strstr(names, it->ifa_name) && strlen(names) + strlen(it->ifa_name) + 3 < sizeof(names)) {
      if (names[0]) strcat(names, ", ");
      strcat(names, it->ifa_name);
    }
    if (want) {
      if (strcmp(it->ifa_name, want) != 0) continue;
      if (fam == AF_INET && !best) best = it;
      if (fam == AF_INET6 &&
          (!best6 || (isLinkLocal6((const struct sockaddr_in6*)(const void*)best6->ifa_addr) &&
                      !isLinkLocal6((const struct sockaddr_in6*)(const void*)it->ifa_addr))))
        best6 = it;
    } else if (fam == AF_INET && (it->ifa_flags & IFF_UP)) {
      if (it->ifa_flags & IFF_LOOPBACK) {
        if (!loop) loop = it;
      } else if (!best) {
        best = it;
      }
    }
  }
  const struct ifaddrs* pick = best ? best : (want ? best6 : loop);
  ncclxResult_t res = ncclxSuccess;
  if (!pick) {
    if (want) {
      env->log(NCCLX_LOG_WARN, NCCLX_LOG_NET | NCCLX_LOG_ENV, __FILE__, __LINE__,
               "NET/Socket: ifname = '%s' (%s): no such interface with an IP address "
               "(interfaces with addresses: %s)", want, configWhere(env, "ifname", want), names);
      res = ncclxInvalidUsage;
    } else {
      env->log(NCCLX_LOG_WARN, NCCLX_LOG_NET, __FILE__, __LINE__,
               "NET/Socket: no UP IPv4 interface found (not even loopback); set ifname");
      res = ncclxSystemError;
    }
  } else {
    if (!(pick->ifa_flags & IFF_UP))
      env->log(NCCLX_LOG_WARN, NCCLX_LOG_NET, __FILE__, __LINE__,
               "NET/Socket: interface %s is down; connections will fail until it is up",
               pick->ifa_name);
    snprintf(ctx->ifname, sizeof(ctx->ifname), "%s", pick->ifa_name);
    memset(&ctx->addr, 0, sizeof(ctx->addr));
    memcpy(&ctx->addr, pick->ifa_addr,
           pick->ifa_addr->sa_family == AF_INET6 ? sizeof(struct sockaddr_in6)
                                                 : sizeof(struct sockaddr_in));
    if (ctx->addr.sa.sa_family == AF_INET) ctx->addr.in4.sin_port = 0;
    else ctx->addr.in6.sin6_port = 0;
    ctx->latencyUs = (pick->ifa_flags & IFF_LOOPBACK) ? 10.0f : 50.0f;
  }
  freeifaddrs(list);
  return res;
}

static int readSpeedMbps(const char* ifname) {
  char path[128];
  snprintf(path, sizeof(path), "/sys/class/net/%s/speed", ifname);
  FILE* f = fopen(path, "r");
  int v = 0;
  if (f) {
    if (fscanf(f, "%d", &v) != 1) v = 0;
    fclose(f);
  }
  return v > 0 ? v : 10000; /* virtual and loopback devices report nothing useful */
}

static char* readPciPath(const char* ifname) {
  char path[128], real[PATH_MAX];
  snprintf(path, sizeof(path), "/sys/class/net/%s/device", ifname);
  if (!realpath(path, real)) return NULL;
  return strdup(real);
}

static long readProcLong(const char* path) {
  FILE* f = fopen(path, "r");
  long v = -1;
  if (f) {
    if (fscanf(f, "%ld", &v) != 1) v = -1;
    fclose(f);
  }
  return v;
}

/* Setting SO_*BUF turns kernel autotuning off, and without CAP_NET_ADMIN the kernel caps it
 * at net.core.*mem_max (often 208 KiB): then autotuning is the faster choice. */
static void checkBufferLimit(sockCtx* ctx) {
  if (ctx->bufBytes == 0) return;
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return;
  int v = (int)ctx->bufBytes;
  int canForce = setsockopt(fd, SOL_SOCKET, SO_RCVBUFFORCE, &v, sizeof(v)) == 0;
  close(fd);
  if (canForce) return;
  long rmax = readProcLong("/proc/sys/net/core/rmem_max");
  long wmax = readProcLong("/proc/sys/net/core/wmem_max");
  if ((rmax >= 0 && (size_t)rmax < ctx->bufBytes) || (wmax >= 0 && (size_t)wmax < ctx->bufBytes)) {
    SOCK_INFO(ctx, "buffer_bytes %zu exceeds net.core.rmem_max/wmem_max (%ld/%ld) and "
              "CAP_NET_ADMIN is missing; leaving socket buffers to kernel autotuning",
              ctx->bufBytes, rmax, wmax);
    ctx->bufBytes = 0;
  }
}

/* ------------------------------------------------------------------------------------------
 * init / devices / properties / finalize
 * ------------------------------------------------------------------------------------------ */

static void pendingFree(sockPendingConnect* p) {
  for (int i = 0; i < p->nsocks; i++)
    if (p->fds[i] >= 0) close(p->fds[i]);
  free(p);
}

static ncclxResult_t sockInit(void** ctxOut, const ncclxPluginEnv_t* env) {
  if (!ctxOut || !env || !env->log || !env->config || !env->config->get) return ncclxInternalError;
  *ctxOut = NULL;
  warnUnknownKeys(env);

  /* An empty value ("nsocks =") means the default, as for ifname. */
  long nsocks = SOCK_DEFAULT_SOCKS;
  const char* v = env->config->get(env->section, "nsocks");
  if (v && *v && (parseLong(v, &nsocks) != 0 || nsocks < 1 || nsocks > SOCK_MAX_SOCKS)) {
    env->log(NCCLX_LOG_WARN, NCCLX_LOG_NET | NCCLX_LOG_ENV, __FILE__, __LINE__,
             "NET/Socket: nsocks = '%s' (%s): expected an integer from 1 to %d", v,
             configWhere(env, "nsocks", v), SOCK_MAX_SOCKS);
    return ncclxInvalidUsage;
  }
  size_t bufBytes = SOCK_DEFAULT_BUF_BYTES;
  v = env->config->get(env->section, "buffer_bytes");
  if (v && *v && (parseBytes(v, &bufBytes) != 0 || (bufBytes != 0 && bufBytes < 4096) ||
            bufBytes > ((size_t)1 << 30))) {
    env->log(NCCLX_LOG_WARN, NCCLX_LOG_NET | NCCLX_LOG_ENV, __FILE__, __LINE__,
             "NET/Socket: buffer_bytes = '%s' (%s): expected 0 (kernel autotuning) or a size "
             "from 4K to 1G, e.g. 4194304 or 4M", v, configWhere(env, "buffer_bytes", v));
    return ncclxInvalidUsage;
  }

  sockCtx* ctx = calloc(1, sizeof(*ctx));
  if (!ctx) return ncclxSystemError;
  ctx->log = env->log;
  ctx->nsocks = (int)nsocks;
  ctx->bufBytes = bufBytes;
  const char* ifname = env->config->get(env->section, "ifname");
  if (ifname && !*ifname) ifname = NULL;
  ncclxResult_t res = pickInterface(env, ifname, ctx);
  if (res != ncclxSuccess) {
    free(ctx);
    return res;
  }
  ctx->speedMbps = readSpeedMbps(ctx->ifname);
  ctx->pciPath = readPciPath(ctx->ifname);
  ctx->guid = (uint64_t)if_nametoindex(ctx->ifname) | ((uint64_t)SOCK_HANDLE_MAGIC << 32);
  checkBufferLimit(ctx);
  pthread_mutex_init(&ctx->lock, NULL);

  char addr[SOCK_ADDR_STR];
  addrFormat(&ctx->addr, addr, sizeof(addr));
  SOCK_INFO(ctx, "using %s (%s, %d Mb/s), %d socket%s per connection, socket buffers %zu bytes%s",
            ctx->ifname, addr, ctx->speedMbps, ctx->nsocks, ctx->nsocks == 1 ? "" : "s",
            ctx->bufBytes, ctx->bufBytes ? "" : " (autotuned)");
  *ctxOut = ctx;
  return ncclxSuccess;
}

static ncclxResult_t sockDevices(void* ctx, int* ndev) {
  if (!ctx || !ndev) return ncclxInternalError;
  *ndev = 1;
  return ncclxSuccess;
}

static ncclxResult_t sockGetProperties(void* vctx, int dev, ncclxNetProperties_v1_t* props) {
  sockCtx* ctx = vctx;
  if (!ctx || !props) return ncclxInternalError;
  if (dev != 0) {
    SOCK_WARN(ctx, "getProperties: device %d does not exist (1 device)", dev);
    return ncclxInternalError;
  }
  memset(props, 0, sizeof(*props));
  props->name = ctx->ifname;
  props->pciPath = ctx->pciPath;
  props->guid = ctx->guid;
  props->ptrSupport = NCCLX_PTR_HOST;
  props->regIsGlobal = 1;
  props->speedMbps = ctx->speedMbps;
  props->port = 1;
  props->latencyUs = ctx->latencyUs;
  props->maxComms = 65536;
  props->maxRecvs = 1;
  props->maxMessageBytes = SOCK_MAX_MESSAGE;
  props->forceFlush = 0;
  return ncclxSuccess;
}

static ncclxResult_t sockFinalize(void* vctx) {
  sockCtx* ctx = vctx;
  if (!ctx) return ncclxInternalError;
  pthread_mutex_lock(&ctx->lock);
  while (ctx->pending) {
    sockPendingConnect* p = ctx->pending;
    ctx->pending = p->next;
    pendingFree(p);
  }
  pthread_mutex_unlock(&ctx->lock);
  pthread_mutex_destroy(&ctx->lock);
  free(ctx->pciPath);
  free(ctx);
  return ncclxSuccess;
}

/* ------------------------------------------------------------------------------------------
 * Comm life cycle
 * ------------------------------------------------------------------------------------------ */

static sockComm* commCreate(sockCtx* ctx, uint32_t kind, int nsocks, const int* fds,
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
  return commFail(c, errnoIsRemote(e) ? ncclxRemoteError : ncclxSystemError, "%s failed: %s", op,
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

/* ------------------------------------------------------------------------------------------
 * listen / connect / accept
 * ------------------------------------------------------------------------------------------ */

static ncclxResult_t sockListen(void* vctx, int dev, void* handle, void** listenComm) {
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
  setBuffers(ctx, fd); /* accepted sockets inherit them, and the window scale with them */
  sockAddr a = ctx->addr;
  char where[SOCK_ADDR_STR];
  addrFormat(&a, where, sizeof(where));
  socklen_t al = sizeof(a);
  if (bind(fd, &a.sa, addrLen(&a)) != 0 || listen(fd, SOMAXCONN) != 0 ||
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
  lc->nonce = random64();
  addrFormat(&a, lc->addr, sizeof(lc->addr));

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
    setNoDelay(fd);
    setBuffers(ctx, fd);
    if (connect(fd, &p->handle.addr.sa, addrLen(&p->handle.addr)) == 0) {
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
        return errnoIsRemote(errno) ? ncclxRemoteError : ncclxSystemError;
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
  uint64_t now = nowNs();
  sockPendingConnect **pick = NULL, **pp = &ctx->pending;
  pthread_mutex_lock(&ctx->lock);
  while (*pp) {
    sockPendingConnect* p = *pp;
    if (now - p->lastTouch > SOCK_STALE_CONNECT_NS) { /* abandoned by its caller */
      *pp = p->next;
      pendingFree(p);
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
  p->lastTouch = nowNs();
  pthread_mutex_lock(&ctx->lock);
  p->next = ctx->pending;
  ctx->pending = p;
  pthread_mutex_unlock(&ctx->lock);
}

static ncclxResult_t sockConnect(void* vctx, int dev, const void* handle, void** sendComm) {
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
    p->connId = random64();
    for (int i = 0; i < SOCK_MAX_SOCKS; i++) p->fds[i] = -1;
    addrFormat(&h.addr, p->peer, sizeof(p->peer));
    res = connectStart(ctx, p);
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
  sockComm* c = commCreate(ctx, SOCK_KIND_SEND, p->nsocks, p->fds, p->peer);
  if (!c) {
    pendingFree(p);
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

static void pollDel(int epfd, int fd) {
  if (epfd >= 0) epoll_ctl(epfd, EPOLL_CTL_DEL, fd, NULL);
}

static void pollAdd(int epfd, int fd) {
  if (epfd < 0) return;
  struct epoll_event ev;
  memset(&ev, 0, sizeof(ev));
  ev.events = EPOLLIN;
  ev.data.fd = fd;
  epoll_ctl(epfd, EPOLL_CTL_ADD, fd, &ev);
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
    addrFormat(&a, peer, sizeof(peer));
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
    setNoDelay(fd);
    sockIncoming* in = &lc->inc[lc->ninc++];
    memset(in, 0, sizeof(*in));
    in->fd = fd;
    in->t0 = nowNs();
    snprintf(in->peer, sizeof(in->peer), "%s", peer);
    pollAdd(lc->epfd, fd);
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
    g->t0 = nowNs();
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
  pollDel(lc->epfd, in->fd); /* its data is for the recvComm, not for accept */
  lc->inc[i] = lc->inc[--lc->ninc];
  return ncclxSuccess;
}

/* Read hellos without blocking; refuse anything that is not one of ours. */
static ncclxResult_t readHellos(sockListenComm* lc) {
  uint64_t now = nowNs();
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

static ncclxResult_t sockAccept(void* listenComm, void** recvComm) {
  sockListenComm* lc = listenComm;
  if (!recvComm || commKind(lc) != SOCK_KIND_LISTEN) return ncclxInternalError;
  *recvComm = NULL;
  sockCtx* ctx = lc->head.ctx;
  ncclxResult_t res = acceptNew(lc);
  if (res == ncclxSuccess) res = readHellos(lc);
  if (res != ncclxSuccess) return res;

  uint64_t now = nowNs();
  for (int k = 0; k < lc->ngroups;) {
    sockGroup* g = &lc->groups[k];
    if (g->count == lc->nsocks) {
      sockComm* c = commCreate(ctx, SOCK_KIND_RECV, lc->nsocks, g->fds, g->peer);
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

static ncclxResult_t sockCloseListen(void* listenComm) {
  sockListenComm* lc = listenComm;
  if (commKind(lc) != SOCK_KIND_LISTEN) return ncclxInternalError;
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

/* ------------------------------------------------------------------------------------------
 * Registration, data path, close
 * ------------------------------------------------------------------------------------------ */

static char sockMrToken; /* host memory needs no registration: every handle is this one */

static ncclxResult_t sockRegMr(void* comm, void* data, size_t size, int type, void** mhandle) {
  int kind = commKind(comm);
  if (!mhandle || (kind != SOCK_KIND_SEND && kind != SOCK_KIND_RECV)) return ncclxInternalError;
  *mhandle = NULL;
  if (type != NCCLX_PTR_HOST) {
    SOCK_WARN(((sockCommHead*)comm)->ctx, "regMr: pointer type %d of %p (%zu bytes) is not "
              "supported: the socket network only moves host memory", type, data, size);
    return ncclxInvalidArgument;
  }
  *mhandle = &sockMrToken;
  return ncclxSuccess;
}

static ncclxResult_t sockDeregMr(void* comm, void* mhandle) {
  int kind = commKind(comm);
  if (kind != SOCK_KIND_SEND && kind != SOCK_KIND_RECV) return ncclxInternalError;
  return (mhandle == NULL || mhandle == &sockMrToken) ? ncclxSuccess : ncclxInternalError;
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

static ncclxResult_t sockIsend(void* sendComm, void* data, size_t size, int tag, void* mhandle,
                               void* phandle, void** request) {
  (void)mhandle;
  (void)phandle;
  sockComm* c = sendComm;
  if (!request || commKind(c) != SOCK_KIND_SEND) return ncclxInternalError;
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
  commProgress(c); /* start writing now: lower latency, and the error shows up in test() */
  *request = r;
  return ncclxSuccess;
}

static ncclxResult_t sockIrecv(void* recvComm, int n, void** data, size_t* sizes, int* tags,
                               void** mhandles, void** phandles, void** request) {
  (void)tags; /* one buffer per receive: the tag has nothing to select */
  (void)mhandles;
  (void)phandles;
  sockComm* c = recvComm;
  if (!request || commKind(c) != SOCK_KIND_RECV) return ncclxInternalError;
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

static ncclxResult_t sockTest(void* request, int* done, size_t* sizes) {
  sockReq* r = request;
  if (!done) return ncclxInternalError;
  *done = 0;
  if (!r || r->magic != SOCK_REQ_MAGIC || r->state == SOCK_REQ_FREE) return ncclxInternalError;
  sockComm* c = r->comm;
  if (r->state != SOCK_REQ_COMPLETE || !earlierDone(c, r)) commProgress(c);
  if (r->state == SOCK_REQ_COMPLETE && earlierDone(c, r)) {
    *done = 1;
    if (sizes) sizes[0] = r->msgSize;
    reqRelease(c, r);
    return ncclxSuccess;
  }
  if (c->err != ncclxSuccess) {
    ncclxResult_t err = c->err;
    reqRelease(c, r);
    return err;
  }
  return ncclxSuccess;
}

static ncclxResult_t sockClose(void* comm, uint32_t kind) {
  if (commKind(comm) != (int)kind) return ncclxInternalError;
  commDestroy(comm);
  return ncclxSuccess;
}

static ncclxResult_t sockCloseSend(void* sendComm) { return sockClose(sendComm, SOCK_KIND_SEND); }

static ncclxResult_t sockCloseRecv(void* recvComm) { return sockClose(recvComm, SOCK_KIND_RECV); }

/* recvComm: readable when any of its sockets has data (the socket itself when there is one).
 * sendComm: readable when a socket with unsent data has room again.
 * listenComm: readable on a new connection or hello bytes. */
static ncclxResult_t sockGetPollFd(void* comm, int* fd) {
  int kind = commKind(comm);
  if (!fd) return ncclxInternalError;
  *fd = -1;
  if (kind == SOCK_KIND_LISTEN) {
    sockListenComm* lc = comm;
    if (lc->epfd < 0) {
      if ((lc->epfd = epoll_create1(EPOLL_CLOEXEC)) < 0) return ncclxSystemError;
      pollAdd(lc->epfd, lc->fd);
      for (int i = 0; i < lc->ninc; i++) pollAdd(lc->epfd, lc->inc[i].fd);
    }
    *fd = lc->epfd;
    return ncclxSuccess;
  }
  if (kind != SOCK_KIND_SEND && kind != SOCK_KIND_RECV) return ncclxInternalError;
  sockComm* c = comm;
  if (kind == SOCK_KIND_RECV && c->nsocks == 1) {
    *fd = c->fds[0];
    return ncclxSuccess;
  }
  if (c->epfd < 0) {
    if ((c->epfd = epoll_create1(EPOLL_CLOEXEC)) < 0) return ncclxSystemError;
    if (kind == SOCK_KIND_RECV) {
      for (int s = 0; s < c->nsocks; s++) pollAdd(c->epfd, c->fds[s]);
    } else {
      commProgress(c); /* registers the sockets that are blocked right now */
    }
  }
  *fd = c->epfd;
  return ncclxSuccess;
}

SOCK_EXPORT const ncclxNet_v1_t SOCK_PLUGIN_SYMBOL = {
    .name = "socket",
    .abiVersion = NCCLX_NET_ABI_VERSION,
    .init = sockInit,
    .devices = sockDevices,
    .getProperties = sockGetProperties,
    .listen = sockListen,
    .connect = sockConnect,
    .accept = sockAccept,
    .regMr = sockRegMr,
    .deregMr = sockDeregMr,
    .isend = sockIsend,
    .irecv = sockIrecv,
    .iflush = NULL,
    .test = sockTest,
    .closeSend = sockCloseSend,
    .closeRecv = sockCloseRecv,
    .closeListen = sockCloseListen,
    .finalize = sockFinalize,
    .getPollFd = sockGetPollFd,
};
