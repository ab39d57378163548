/* Bootstrap: rendezvous at the unique id's root address, then authenticated out-of-band
 * messages between ranks over TCP (contract in bootstrap.h).
 *
 * Shape of the implementation:
 *  - ids: a private layout inside ncclxUniqueId (magic, secret, root address);
 *  - rendezvous: rank 0 collects {rank, listener address} from every rank on the root
 *    address, then hands the full address table back (a fan-in through the root);
 *  - messages: each rank keeps one cached outgoing connection per peer and reads every
 *    incoming connection into an unexpected-message queue, so messages can be matched by
 *    (source, tag, tag space) in any order. A per (source, destination) sequence number
 *    keeps them ordered even when a connection is replaced;
 *  - views: a child communicator shares the root state, with its own rank map and a tag
 *    space that is stamped into every header.
 *
 * Locking: root->lock guards connections, queues and counters. It is only held for
 * non-blocking work; waiters sleep in poll() on a snapshot of the descriptors with the lock
 * released, so bootstrapPollAbort never waits behind a long operation. */
#include "bootstrap.h"

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
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "debug.h"

#define ID_MAGIC 0x4e584944u    /* "NXID": a unique id made by this file */
#define HELLO_MAGIC 0x4e58484cu /* rendezvous: rank -> root */
#define TABLE_MAGIC 0x4e585442u /* rendezvous: root -> rank */
#define MSG_MAGIC 0x4e584d53u   /* point-to-point message header */

#define MSG_KIND_DATA 1u
#define MSG_KIND_ABORT 2u

#define ROOT_TAG_SPACE 0ull    /* the view returned by bootstrapInit */
#define POLL_SLICE_MS 10       /* longest sleep between checks of deadline and abort flag */
#define JOIN_GRACE_SEC 2.0     /* a rank waits this long past its timeout for the root's verdict */
#define ABORT_BUDGET_SEC 1.0   /* total time bootstrapBroadcastAbort may take */
#define ABORT_BATCH 256        /* simultaneous connects while broadcasting an abort */
#define MAX_ABORT_TEXT 4096
#define OUT_CACHE_MAX 128      /* cached outgoing connections before the oldest is closed */
#define MAX_PENDING_HELLOS 512 /* unidentified connections the root keeps during init */
#define LISTEN_BACKLOG 1024

/* ---------------- wire formats ---------------- */

/* An IPv4 or IPv6 socket address in a fixed 24-byte form. */
struct wireAddr {
  uint16_t family;  /* AF_INET or AF_INET6 */
  uint16_t port;    /* network byte order */
  uint32_t scopeId; /* IPv6 link-local scope */
  uint8_t ip[16];   /* first 4 bytes for IPv4 */
};

struct idLayout {
  uint32_t magic;
  uint32_t reserved;
  uint64_t secret;
  struct wireAddr root;
};
_Static_assert(sizeof(struct idLayout) <= NCCLX_UNIQUE_ID_BYTES, "id layout must fit ncclxUniqueId");

struct helloMsg { /* rank -> root at init; magic first so garbage is refused after 4 bytes */
  uint32_t magic;
  int32_t rank;
  uint64_t secret;
  int32_t nranks;
  uint32_t reserved;
  struct wireAddr listenAddr;
};

struct tableHeader { /* root -> rank; followed by nranks wireAddr, or textLen bytes of error */
  uint32_t magic;
  int32_t status; /* ncclxResult_t */
  uint64_t secret;
  int32_t nranks;
  uint32_t textLen;
};

struct msgHeader {
  uint32_t magic;
  uint32_t kind;
  uint64_t secret;
  uint64_t tagSpace;
  uint64_t seq; /* per (src, dst) from 1; 0 = unordered (abort notices) */
  uint64_t size;
  int32_t src; /* rank in the root numbering */
  uint32_t tag;
};

/* ---------------- state ---------------- */

struct message {
  struct message* next;
  int src;
  uint32_t kind, tag;
  uint64_t tagSpace, seq;
  size_t size;
  char data[];
};

struct inConn { /* an accepted connection, read incrementally */
  int fd;
  char name[64];
  struct msgHeader hdr;
  size_t hdrGot;
  struct message* msg;
  size_t dataGot;
};

struct outConn {
  int fd;
  int busy; /* a sender owns it: messages to one peer are written one at a time */
  uint64_t lastUse;
};

struct abortNote {
  struct abortNote* next;
  uint64_t tagSpace;
  char text[];
};

struct bootstrapRoot {
  int rank, nranks;
  uint64_t secret;
  double timeoutSec; /* <= 0: no timeout */
  int listenFd;
  struct wireAddr* addrs; /* every rank's listener */

  pthread_mutex_t lock;
  int refs;
  struct bootstrap* views; /* live views, for tag space uniqueness */

  struct inConn* in;
  int nIn, capIn;
  struct message *queueHead, *queueTail; /* delivered, not yet received */
  struct message* holdback;              /* arrived ahead of an earlier message of the same src */
  uint64_t* recvSeq;                     /* next expected seq per src */

  struct outConn* out;
  uint64_t* sendSeq; /* last seq used per dst */
  int nOutOpen;
  uint64_t useClock;

  pthread_mutex_t abortLock; /* guards aborts only; never held while doing anything else */
  struct abortNote* aborts;
};

struct bootstrap {
  struct bootstrapRoot* root;
  int rank, nranks;
  uint64_t tagSpace;
  int* rootRanks; /* view rank -> root rank */
  struct bootstrap* nextView;
};

/* ---------------- small helpers ---------------- */

static double nowSec(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static double deadlineAfter(double timeoutSec) {
  return timeoutSec > 0 ? nowSec() + timeoutSec : INFINITY;
}

/* Milliseconds to sleep: at most sliceMs, never past the deadline. */
static int sliceUntil(double deadline, int sliceMs) {
  double left = deadline - nowSec();
  if (left <= 0) return 0;
  if (left * 1000.0 < sliceMs) return (int)(left * 1000.0) + 1;
  return sliceMs;
}

static void sleepSec(double s) {
  struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

static void wireToSockaddr(const struct wireAddr* w, struct sockaddr_storage* ss, socklen_t* len) {
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

static int sockaddrToWire(const struct sockaddr* sa, struct wireAddr* w) {
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
static const char* addrString(const struct wireAddr* w, char* buf, size_t size) {
  char ip[INET6_ADDRSTRLEN] = "?";
  if (w->family == AF_INET6) {
    inet_ntop(AF_INET6, w->ip, ip, sizeof(ip));
    snprintf(buf, size, "[%s]:%u", ip, (unsigned)ntohs(w->port));
  } else {
    inet_ntop(AF_INET, w->ip, ip, sizeof(ip));
    snprintf(buf, size, "%s:%u", ip, (unsigned)ntohs(w->port));
  }
  return buf;
}

static const char* peerString(int fd, char* buf, size_t size) {
  struct sockaddr_storage ss;
  socklen_t len = sizeof(ss);
  struct wireAddr w;
  if (getpeername(fd, (struct sockaddr*)&ss, &len) != 0 || sockaddrToWire((struct sockaddr*)&ss, &w) != 0)
    snprintf(buf, size, "an unknown address");
  else
    addrString(&w, buf, size);
  return buf;
}

static int isLoopback(const struct wireAddr* w) {
  if (w->family == AF_INET) return w->ip[0] == 127;
  static const uint8_t v6loop[16] = {[15] = 1};
  return memcmp(w->ip, v6loop, 16) == 0;
}

static uint64_t fnv1a64(const char* s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (; *s; s++) {
    h ^= (unsigned char)*s;
    h *= 0x100000001b3ull;
  }
  return h;
}

static uint64_t randomSecret(void) {
  uint64_t s = 0;
  if (getrandom(&s, sizeof(s), 0) != (ssize_t)sizeof(s)) {
    /* No entropy source: still unique enough to tell jobs apart, not to resist attackers. */
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    s = ((uint64_t)ts.tv_sec * 1000000007ull) ^ (uint64_t)ts.tv_nsec ^ ((uint64_t)getpid() << 40);
    WARN("bootstrap: getrandom failed (%s); the job secret is derived from time and pid", strerror(errno));
  }
  return s ? s : 1;
}

static int loadId(const ncclxUniqueId* id, struct idLayout* l) {
  memcpy(l, id->internal, sizeof(*l));
  return l->magic == ID_MAGIC && (l->root.family == AF_INET || l->root.family == AF_INET6) ? 0 : -1;
}

static void storeId(ncclxUniqueId* id, uint64_t secret, const struct wireAddr* root) {
  struct idLayout l;
  memset(&l, 0, sizeof(l));
  l.magic = ID_MAGIC;
  l.secret = secret;
  l.root = *root;
  memset(id, 0, sizeof(*id));
  memcpy(id->internal, &l, sizeof(l));
}

/* ---------------- sockets ---------------- */

/* A non-blocking listener on bindAddr (port 0: any free port). Returns fd or -1 (errno set). */
static int openListener(const struct wireAddr* bindAddr, int reuseAddr, struct wireAddr* actual) {
  int fd = socket(bindAddr->family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  int one = 1;
  if (reuseAddr) setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  struct sockaddr_storage ss;
  socklen_t len;
  wireToSockaddr(bindAddr, &ss, &len);
  if (bind(fd, (struct sockaddr*)&ss, len) != 0 || listen(fd, LISTEN_BACKLOG) != 0) {
    int e = errno;
    close(fd);
    errno = e;
    return -1;
  }
  if (actual) {
    len = sizeof(ss);
    getsockname(fd, (struct sockaddr*)&ss, &len);
    sockaddrToWire((struct sockaddr*)&ss, actual);
  }
  return fd;
}

static int retryableConnectError(int e) {
  return e == ECONNREFUSED || e == ETIMEDOUT || e == EHOSTUNREACH || e == ENETUNREACH ||
         e == ECONNRESET || e == EAGAIN || e == ECONNABORTED;
}

/* Connect (non-blocking socket) before the deadline. retry: keep trying with backoff while
 * the peer is not listening yet. Returns fd, or -1 with *err set. */
static int connectWithin(const struct wireAddr* to, double deadline, int retry, int* attempts, int* err) {
  struct sockaddr_storage ss;
  socklen_t len;
  wireToSockaddr(to, &ss, &len);
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
          int n = poll(&p, 1, sliceUntil(deadline, POLL_SLICE_MS));
          if (n > 0) {
            socklen_t elen = sizeof(e);
            if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &e, &elen) != 0) e = errno;
            break;
          }
          if (nowSec() >= deadline) break;
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
    double left = deadline - nowSec();
    if (!retry || !retryableConnectError(e) || left <= 0) {
      *err = e;
      if (attempts) *attempts = tries;
      return -1;
    }
    sleepSec(backoff < left ? backoff : left);
    backoff = backoff * 2 > 0.5 ? 0.5 : backoff * 2;
  }
}

/* Write everything before the deadline. Returns 0, or an errno value. */
static int sendAllWithin(int fd, const void* data, size_t size, double deadline) {
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
    if (nowSec() >= deadline) return ETIMEDOUT;
    struct pollfd pfd = {fd, POLLOUT, 0};
    poll(&pfd, 1, sliceUntil(deadline, POLL_SLICE_MS));
  }
  return 0;
}

/* Read exactly size bytes before the deadline. Returns 0, an errno value, or -1 on EOF. */
static int recvAllWithin(int fd, void* data, size_t size, double deadline) {
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
    if (nowSec() >= deadline) return ETIMEDOUT;
    struct pollfd pfd = {fd, POLLIN, 0};
    poll(&pfd, 1, sliceUntil(deadline, POLL_SLICE_MS));
  }
  return 0;
}

/* First UP, non-loopback IPv4 address of this host, else 127.0.0.1 (port 0). */
static void pickLocalAddress(struct wireAddr* w) {
  memset(w, 0, sizeof(*w));
  w->family = AF_INET;
  w->ip[0] = 127;
  w->ip[3] = 1;
  struct ifaddrs* list = NULL;
  if (getifaddrs(&list) != 0) return;
  for (struct ifaddrs* ifa = list; ifa; ifa = ifa->ifa_next) {
    if (!ifa->ifa_addr || ifa->ifa_addr->sa_family != AF_INET) continue;
    if (!(ifa->ifa_flags & IFF_UP) || (ifa->ifa_flags & IFF_LOOPBACK)) continue;
    sockaddrToWire(ifa->ifa_addr, w);
    w->port = 0;
    INFO(NCCLX_LOG_BOOTSTRAP, "bootstrap: using interface %s for the unique id", ifa->ifa_name);
    break;
  }
  freeifaddrs(list);
}

/* The local address the kernel would use to reach `to` (port 0): where peers can reach us. */
static int localAddressToward(const struct wireAddr* to, struct wireAddr* local) {
  int fd = socket(to->family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  struct sockaddr_storage ss;
  socklen_t len;
  wireToSockaddr(to, &ss, &len);
  int rc = connect(fd, (struct sockaddr*)&ss, len);
  if (rc == 0) {
    len = sizeof(ss);
    rc = getsockname(fd, (struct sockaddr*)&ss, &len);
  }
  if (rc == 0) rc = sockaddrToWire((struct sockaddr*)&ss, local);
  close(fd);
  if (rc == 0) local->port = 0;
  return rc;
}

/* ---------------- unique ids ---------------- */

/* Listeners opened by bootstrapGetUniqueId, waiting for rank 0 of that id in this process. */
struct keptListener {
  struct keptListener* next;
  uint64_t secret;
  struct wireAddr addr;
  int fd;
};
static pthread_mutex_t keptLock = PTHREAD_MUTEX_INITIALIZER;
static struct keptListener* keptListeners;

static int takeKeptListener(const struct idLayout* id) {
  int fd = -1;
  pthread_mutex_lock(&keptLock);
  for (struct keptListener** p = &keptListeners; *p; p = &(*p)->next) {
    struct keptListener* k = *p;
    if (k->secret == id->secret && memcmp(&k->addr, &id->root, sizeof(k->addr)) == 0) {
      fd = k->fd;
      *p = k->next;
      free(k);
      break;
    }
  }
  pthread_mutex_unlock(&keptLock);
  return fd;
}

ncclxResult_t bootstrapGetUniqueId(ncclxUniqueId* id) {
  if (id == NULL) return ncclxSetError(ncclxInvalidArgument, "bootstrap: unique id pointer is NULL");
  const char* env = getenv("NCCLX_COMM_ID");
  if (env && env[0]) {
    INFO(NCCLX_LOG_BOOTSTRAP, "bootstrap: unique id from NCCLX_COMM_ID=%s", env);
    return bootstrapIdFromString(env, id);
  }
  struct wireAddr want, bound;
  pickLocalAddress(&want);
  int fd = openListener(&want, 0, &bound);
  char name[80];
  if (fd < 0)
    return ncclxSetError(ncclxSystemError, "bootstrap: cannot listen on %s for a new unique id: %s",
                         addrString(&want, name, sizeof(name)), strerror(errno));
  struct keptListener* k = calloc(1, sizeof(*k));
  if (!k) {
    close(fd);
    return ncclxSetError(ncclxSystemError, "bootstrap: out of memory creating a unique id");
  }
  k->secret = randomSecret();
  k->addr = bound;
  k->fd = fd;
  pthread_mutex_lock(&keptLock);
  k->next = keptListeners;
  keptListeners = k;
  pthread_mutex_unlock(&keptLock);
  storeId(id, k->secret, &bound);
  INFO(NCCLX_LOG_BOOTSTRAP, "bootstrap: new unique id, root address %s", addrString(&bound, name, sizeof(name)));
  return ncclxSuccess;
}

ncclxResult_t bootstrapIdFromString(const char* hostport, ncclxUniqueId* id) {
  if (hostport == NULL || id == NULL)
    return ncclxSetError(ncclxInvalidArgument, "bootstrap: NULL %s", hostport ? "unique id pointer" : "address string");
  char host[256];
  const char* portStr;
  size_t len = strlen(hostport);
  if (len == 0 || len >= sizeof(host))
    return ncclxSetError(ncclxInvalidArgument, "bootstrap: \"%s\" is not a host:port address", hostport);
  if (hostport[0] == '[') {
    const char* close = strchr(hostport, ']');
    if (!close || close[1] != ':')
      return ncclxSetError(ncclxInvalidArgument,
                           "bootstrap: \"%s\" is not a valid address: expected [ipv6-address]:port", hostport);
    memcpy(host, hostport + 1, (size_t)(close - hostport - 1));
    host[close - hostport - 1] = '\0';
    portStr = close + 2;
  } else {
    const char* colon = strrchr(hostport, ':');
    if (!colon)
      return ncclxSetError(ncclxInvalidArgument, "bootstrap: \"%s\" is not a valid address: missing :port", hostport);
    if (strchr(hostport, ':') != colon)
      return ncclxSetError(ncclxInvalidArgument,
                           "bootstrap: \"%s\" is not a valid address: write IPv6 addresses as [address]:port",
                           hostport);
    memcpy(host, hostport, (size_t)(colon - hostport));
    host[colon - hostport] = '\0';
    portStr = colon + 1;
  }
  if (host[0] == '\0')
    return ncclxSetError(ncclxInvalidArgument, "bootstrap: \"%s\" is not a valid address: empty host", hostport);
  char* end = NULL;
  errno = 0;
  long port = strtol(portStr, &end, 10);
  if (portStr[0] < '0' || portStr[0] > '9' || *end != '\0' || errno != 0 || port < 1 || port > 65535)
    return ncclxSetError(ncclxInvalidArgument,
                         "bootstrap: \"%s\" is not a valid address: port must be a number in 1..65535", hostport);

  struct addrinfo hints, *res = NULL;
  memset(&hints, 0, sizeof(hints));
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  int rc = getaddrinfo(host, NULL, &hints, &res);
  if (rc != 0)
    return ncclxSetError(ncclxInvalidArgument, "bootstrap: cannot resolve host \"%s\" of \"%s\": %s", host,
                         hostport, gai_strerror(rc));
  /* Prefer IPv4 when a name has both: it is what the other ranks most likely resolve too. */
  const struct addrinfo* pick = NULL;
  for (const struct addrinfo* a = res; a; a = a->ai_next)
    if (a->ai_family == AF_INET) {
      pick = a;
      break;
    }
  for (const struct addrinfo* a = res; a && !pick; a = a->ai_next)
    if (a->ai_family == AF_INET6) pick = a;
  struct wireAddr root;
  int ok = pick && sockaddrToWire(pick->ai_addr, &root) == 0;
  freeaddrinfo(res);
  if (!ok)
    return ncclxSetError(ncclxInvalidArgument, "bootstrap: host \"%s\" of \"%s\" has no IPv4 or IPv6 address",
                         host, hostport);
  root.port = htons((uint16_t)port);
  storeId(id, fnv1a64(hostport), &root);
  return ncclxSuccess;
}

uint64_t bootstrapIdSecret(const ncclxUniqueId* id) {
  struct idLayout l;
  if (id == NULL || loadId(id, &l) != 0) return 0;
  return l.secret;
}

/* ---------------- root state ---------------- */

static void freeMessages(struct message* m) {
  while (m) {
    struct message* next = m->next;
    free(m);
    m = next;
  }
}

static void rootFree(struct bootstrapRoot* r) {
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
  free(r->in);
  free(r->out);
  free(r->addrs);
  free(r->sendSeq);
  free(r->recvSeq);
  pthread_mutex_destroy(&r->lock);
  pthread_mutex_destroy(&r->abortLock);
  free(r);
}

static struct bootstrapRoot* rootCreate(int rank, int nranks, uint64_t secret, double timeoutSec) {
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
    rootFree(r);
    return NULL;
  }
  for (int i = 0; i < nranks; i++) {
    r->out[i].fd = -1;
    r->recvSeq[i] = 1;
  }
  return r;
}

/* ---------------- rendezvous ---------------- */

struct helloConn {
  int fd;
  char name[64];
  size_t got;
  struct helloMsg msg;
};

/* Tell a rank why the root refused it (best effort; the rank is waiting for a reply). */
static void sendTableError(int fd, uint64_t secret, ncclxResult_t status, const char* text) {
  struct tableHeader h = {TABLE_MAGIC, (int32_t)status, secret, 0, (uint32_t)strlen(text)};
  double deadline = nowSec() + 1.0;
  if (sendAllWithin(fd, &h, sizeof(h), deadline) == 0) sendAllWithin(fd, text, h.textLen, deadline);
}

/* "rank 3" / "ranks 3,5,7" listing ranks whose fd is -1 (except rank 0). Returns the count. */
static int describeMissing(const int* fds, int nranks, char* buf, size_t size) {
  int missing = 0;
  for (int i = 1; i < nranks; i++) missing += fds[i] < 0;
  size_t off = (size_t)snprintf(buf, size, "rank%s ", missing == 1 ? "" : "s");
  int listed = 0;
  for (int i = 1; i < nranks && off < size; i++) {
    if (fds[i] >= 0) continue;
    if (listed == 16) {
      snprintf(buf + off, size - off, ",... (%d in total)", missing);
      break;
    }
    off += (size_t)snprintf(buf + off, size - off, "%s%d", listed ? "," : "", i);
    listed++;
  }
  return missing;
}

/* Validate a complete hello; register the rank or refuse the connection. Returns 1 if kept. */
static int acceptHello(struct bootstrapRoot* r, struct helloConn* h, int* fds, int* registered) {
  const struct helloMsg* m = &h->msg;
  char why[256];
  ncclxResult_t status = ncclxInvalidUsage;
  if (m->secret != r->secret) {
    WARN("bootstrap: root refused connection from %s: wrong job secret (a rank of another job, or a stale unique id)",
         h->name);
    return 0;
  }
  if (m->nranks != r->nranks)
    snprintf(why, sizeof(why), "rank %d from %s says nranks=%d but the root has nranks=%d", m->rank, h->name,
             m->nranks, r->nranks);
  else if (m->rank <= 0 || m->rank >= r->nranks)
    snprintf(why, sizeof(why), "connection from %s claims rank %d, outside 1..%d", h->name, m->rank, r->nranks - 1);
  else if (fds[m->rank] >= 0)
    snprintf(why, sizeof(why), "rank %d from %s is a duplicate: that rank already joined", m->rank, h->name);
  else if (m->listenAddr.family != AF_INET && m->listenAddr.family != AF_INET6)
    snprintf(why, sizeof(why), "rank %d from %s sent a listener address of unknown family %u", m->rank, h->name,
             (unsigned)m->listenAddr.family);
  else {
    fds[m->rank] = h->fd;
    r->addrs[m->rank] = m->listenAddr;
    (*registered)++;
    return 1;
  }
  WARN("bootstrap: root refused a rank: %s", why);
  sendTableError(h->fd, r->secret, status, why);
  return 0;
}

/* Read what a pending connection sent. Returns 1 to keep it pending, 0 when it was handled. */
static int progressHello(struct bootstrapRoot* r, struct helloConn* h, int* fds, int* registered) {
  for (;;) {
    ssize_t n = recv(h->fd, (char*)&h->msg + h->got, sizeof(h->msg) - h->got, MSG_DONTWAIT);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return 1;
    if (n <= 0) {
      if (h->got == 0)
        WARN("bootstrap: root: connection from %s closed without a hello", h->name);
      else
        WARN("bootstrap: root refused connection from %s: truncated hello (%zu of %zu bytes%s%s)", h->name, h->got,
             sizeof(h->msg), n < 0 ? ", " : "", n < 0 ? strerror(errno) : "");
      close(h->fd);
      return 0;
    }
    h->got += (size_t)n;
    if (h->got >= sizeof(uint32_t) && h->msg.magic != HELLO_MAGIC) {
      WARN("bootstrap: root refused connection from %s: not an ncclx bootstrap hello (first bytes 0x%08x)",
           h->name, (unsigned)h->msg.magic);
      close(h->fd);
      return 0;
    }
    if (h->got == sizeof(h->msg)) {
      if (!acceptHello(r, h, fds, registered)) close(h->fd);
      return 0;
    }
  }
}

/* Rank 0: collect every rank's listener address on the root address, then send the table. */
static ncclxResult_t rendezvousServe(struct bootstrapRoot* r, const struct idLayout* id, double deadline) {
  char rootName[80];
  addrString(&id->root, rootName, sizeof(rootName));
  int lfd = takeKeptListener(id);
  if (r->nranks == 1) {
    if (lfd >= 0) close(lfd);
    return ncclxSuccess;
  }
  if (lfd < 0) lfd = openListener(&id->root, 1, NULL);
  if (lfd < 0)
    return ncclxSetError(ncclxSystemError,
                         "bootstrap: rank 0 cannot listen on the root address %s: %s (rank 0 must run on the host "
                         "named by the unique id / NCCLX_COMM_ID)",
                         rootName, strerror(errno));
  INFO(NCCLX_LOG_BOOTSTRAP, "bootstrap: root listening at %s for %d ranks", rootName, r->nranks);

  double start = nowSec();
  int* fds = malloc(sizeof(int) * (size_t)r->nranks);
  struct helloConn* pending = calloc(MAX_PENDING_HELLOS, sizeof(*pending));
  struct pollfd* pfds = calloc((size_t)r->nranks + MAX_PENDING_HELLOS + 1, sizeof(*pfds));
  if (!fds || !pending || !pfds) {
    free(fds);
    free(pending);
    free(pfds);
    close(lfd);
    return ncclxSetError(ncclxSystemError, "bootstrap: out of memory at the root");
  }
  for (int i = 0; i < r->nranks; i++) fds[i] = -1;
  int nPending = 0, registered = 1;

  while (registered < r->nranks && nowSec() < deadline) {
    int np = 0;
    pfds[np++] = (struct pollfd){lfd, POLLIN, 0};
    for (int i = 0; i < nPending; i++) pfds[np++] = (struct pollfd){pending[i].fd, POLLIN, 0};
    for (int i = 1; i < r->nranks; i++)
      if (fds[i] >= 0) pfds[np++] = (struct pollfd){fds[i], POLLIN, 0};
    if (poll(pfds, (nfds_t)np, sliceUntil(deadline, POLL_SLICE_MS * 5)) <= 0) continue;

    /* A joined rank must stay silent until it gets the table: anything else means it left. */
    for (int i = 1, k = 1 + nPending; i < r->nranks; i++) {
      if (fds[i] < 0) continue;
      if (pfds[k++].revents) {
        char c;
        ssize_t n = recv(fds[i], &c, 1, MSG_DONTWAIT);
        if (n < 0 && (errno == EAGAIN || errno == EINTR)) continue;
        char who[80];
        WARN("bootstrap: rank %d (%s) disconnected from the root before init completed", i,
             addrString(&r->addrs[i], who, sizeof(who)));
        close(fds[i]);
        fds[i] = -1;
        registered--;
      }
    }
    for (int i = 0; i < nPending;) {
      if (pfds[1 + i].revents && !progressHello(r, &pending[i], fds, &registered)) {
        /* Handled: keep pfds aligned with pending by moving the tail entries down. */
        memmove(&pending[i], &pending[i + 1], sizeof(*pending) * (size_t)(nPending - i - 1));
        memmove(&pfds[1 + i], &pfds[2 + i], sizeof(*pfds) * (size_t)(nPending - i - 1));
        nPending--;
        continue;
      }
      i++;
    }
    if (pfds[0].revents) {
      for (;;) {
        struct sockaddr_storage ss;
        socklen_t len = sizeof(ss);
        int fd = accept4(lfd, (struct sockaddr*)&ss, &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) break;
        struct helloConn h = {.fd = fd};
        peerString(fd, h.name, sizeof(h.name));
        if (nPending == MAX_PENDING_HELLOS) {
          WARN("bootstrap: root refused connection from %s: %d connections are already waiting to identify", h.name,
               MAX_PENDING_HELLOS);
          close(fd);
          continue;
        }
        /* Read right away: a well-behaved rank has usually sent its hello already. */
        if (progressHello(r, &h, fds, &registered)) pending[nPending++] = h;
      }
    }
  }
  for (int i = 0; i < nPending; i++) {
    WARN("bootstrap: root dropped connection from %s: it never sent a complete hello (%zu of %zu bytes)",
         pending[i].name, pending[i].got, sizeof(pending[i].msg));
    close(pending[i].fd);
  }
  free(pending);
  free(pfds);
  close(lfd); /* the rendezvous is over: nothing may join this id any more */

  ncclxResult_t res = ncclxSuccess;
  if (registered < r->nranks) {
    char missing[256], msg[512];
    describeMissing(fds, r->nranks, missing, sizeof(missing));
    snprintf(msg, sizeof(msg), "%s never connected to the root %s within %g s", missing, rootName, r->timeoutSec);
    for (int i = 1; i < r->nranks; i++)
      if (fds[i] >= 0) sendTableError(fds[i], r->secret, ncclxRemoteError, msg);
    res = ncclxSetError(ncclxRemoteError, "bootstrap: %s", msg);
  } else {
    struct tableHeader h = {TABLE_MAGIC, ncclxSuccess, r->secret, r->nranks, 0};
    double sendDeadline = nowSec() + (r->timeoutSec > 0 ? r->timeoutSec : 30.0);
    for (int i = 1; i < r->nranks; i++) {
      int e = sendAllWithin(fds[i], &h, sizeof(h), sendDeadline);
      if (e == 0) e = sendAllWithin(fds[i], r->addrs, sizeof(*r->addrs) * (size_t)r->nranks, sendDeadline);
      if (e != 0 && res == ncclxSuccess)
        res = ncclxSetError(ncclxRemoteError, "bootstrap: root %s could not send the rank table to rank %d: %s",
                            rootName, i, strerror(e));
    }
    if (res == ncclxSuccess)
      INFO(NCCLX_LOG_BOOTSTRAP, "bootstrap: all %d ranks joined at the root in %.3f s", r->nranks, nowSec() - start);
  }
  for (int i = 1; i < r->nranks; i++)
    if (fds[i] >= 0) close(fds[i]);
  free(fds);
  return res;
}

/* Ranks > 0: say hello to the root and wait for the address table. */
static ncclxResult_t rendezvousJoin(struct bootstrapRoot* r, const struct idLayout* id, double deadline) {
  char rootName[80];
  addrString(&id->root, rootName, sizeof(rootName));
  int err = 0, attempts = 0;
  int fd = connectWithin(&id->root, deadline, 1, &attempts, &err);
  if (fd < 0)
    return ncclxSetError(ncclxRemoteError, "bootstrap: rank %d could not reach the root at %s within %g s: %s",
                         r->rank, rootName, r->timeoutSec, strerror(err));
  INFO(NCCLX_LOG_BOOTSTRAP, "bootstrap: rank %d connected to the root %s (%d attempt%s)", r->rank, rootName,
       attempts, attempts == 1 ? "" : "s");

  struct helloMsg hello;
  memset(&hello, 0, sizeof(hello));
  hello.magic = HELLO_MAGIC;
  hello.rank = r->rank;
  hello.secret = r->secret;
  hello.nranks = r->nranks;
  hello.listenAddr = r->addrs[r->rank];
  ncclxResult_t res = ncclxSuccess;
  struct tableHeader h;
  int e = sendAllWithin(fd, &hello, sizeof(hello), deadline);
  /* The root's verdict (e.g. which ranks are missing) is the better message: wait a bit for it. */
  double replyDeadline = deadline + JOIN_GRACE_SEC;
  if (e == 0) e = recvAllWithin(fd, &h, sizeof(h), replyDeadline);
  if (e == ETIMEDOUT) {
    res = ncclxSetError(ncclxRemoteError,
                        "bootstrap: rank %d got no rank table from the root at %s within %g s (other ranks missing?)",
                        r->rank, rootName, r->timeoutSec);
  } else if (e != 0) {
    res = ncclxSetError(ncclxRemoteError, "bootstrap: rank %d lost the connection to the root at %s during init: %s",
                        r->rank, rootName, e < 0 ? "closed by the root" : strerror(e));
  } else if (h.magic != TABLE_MAGIC || h.secret != r->secret) {
    res = ncclxSetError(ncclxRemoteError, "bootstrap: rank %d got a reply from %s that is not from this job's root",
                        r->rank, rootName);
  } else if (h.status != ncclxSuccess) {
    char text[1024];
    size_t n = h.textLen < sizeof(text) - 1 ? h.textLen : sizeof(text) - 1;
    if (recvAllWithin(fd, text, n, nowSec() + 1.0) != 0) n = 0;
    text[n] = '\0';
    ncclxResult_t status = h.status > 0 && h.status < ncclxNumResults ? (ncclxResult_t)h.status : ncclxRemoteError;
    res = ncclxSetError(status, "bootstrap: rank %d: init failed at the root %s: %s", r->rank, rootName,
                        n ? text : "(no reason given)");
  } else if (h.nranks != r->nranks) {
    res = ncclxSetError(ncclxInternalError, "bootstrap: rank %d: root %s sent a table for %d ranks, expected %d",
                        r->rank, rootName, h.nranks, r->nranks);
  } else if ((e = recvAllWithin(fd, r->addrs, sizeof(*r->addrs) * (size_t)r->nranks, replyDeadline)) != 0) {
    res = ncclxSetError(ncclxRemoteError, "bootstrap: rank %d: truncated rank table from the root %s: %s", r->rank,
                        rootName, e < 0 ? "connection closed" : strerror(e));
  }
  close(fd);
  return res;
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
static int findAbort(struct bootstrapRoot* r, uint64_t tagSpace, char* msg, size_t size) {
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
  if (m->kind == MSG_KIND_ABORT) {
    recordAbort(r, m);
    free(m);
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
  if (h->kind != MSG_KIND_DATA && h->kind != MSG_KIND_ABORT) return "unknown message kind";
  if (h->src < 0 || h->src >= r->nranks) return "source rank out of range";
  if (h->kind == MSG_KIND_ABORT && (h->size > MAX_ABORT_TEXT || h->seq != 0)) return "malformed abort notice";
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
static void progressLocked(struct bootstrapRoot* r) {
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
        peerString(fd, c->name, sizeof(c->name));
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
static void sleepLocked(struct bootstrapRoot* r, int extraFd, short extraEvents, int sliceMs) {
  struct pollfd stackFds[64];
  int n = r->nIn + 1 + (extraFd >= 0);
  struct pollfd* pfds = n <= 64 ? stackFds : malloc(sizeof(*pfds) * (size_t)n);
  if (!pfds) {
    pthread_mutex_unlock(&r->lock);
    sleepSec(sliceMs * 1e-3);
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
static struct message* takeMatch(struct bootstrapRoot* r, int src, uint32_t tag, uint64_t tagSpace) {
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
static void purgeTagSpace(struct bootstrapRoot* r, uint64_t tagSpace) {
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

/* ---------------- init, views, release ---------------- */

static struct bootstrap* viewAlloc(struct bootstrapRoot* r, int rank, int nranks, uint64_t tagSpace) {
  struct bootstrap* b = calloc(1, sizeof(*b));
  if (!b) return NULL;
  b->rootRanks = malloc(sizeof(int) * (size_t)nranks);
  if (!b->rootRanks) {
    free(b);
    return NULL;
  }
  b->root = r;
  b->rank = rank;
  b->nranks = nranks;
  b->tagSpace = tagSpace;
  return b;
}

ncclxResult_t bootstrapInit(const ncclxUniqueId* id, int rank, int nranks, double timeoutSec,
                            struct bootstrap** out) {
  if (out == NULL) return ncclxSetError(ncclxInvalidArgument, "bootstrap: output pointer is NULL");
  *out = NULL;
  if (id == NULL) return ncclxSetError(ncclxInvalidArgument, "bootstrap: unique id is NULL");
  if (nranks < 1 || rank < 0 || rank >= nranks)
    return ncclxSetError(ncclxInvalidArgument, "bootstrap: rank %d is not in 0..%d (nranks %d)", rank, nranks - 1,
                         nranks);
  struct idLayout l;
  if (loadId(id, &l) != 0)
    return ncclxSetError(ncclxInvalidArgument,
                         "bootstrap: the unique id is not valid (not made by ncclxGetUniqueId, or corrupted)");
  double deadline = deadlineAfter(timeoutSec);
  char name[80];

  struct bootstrapRoot* r = rootCreate(rank, nranks, l.secret, timeoutSec);
  struct bootstrap* b = r ? viewAlloc(r, rank, nranks, ROOT_TAG_SPACE) : NULL;
  if (!b) {
    rootFree(r);
    return ncclxSetError(ncclxSystemError, "bootstrap: out of memory for %d ranks", nranks);
  }
  /* Listen where the others can reach us: on the interface that routes to the root. */
  struct wireAddr local;
  if (isLoopback(&l.root)) {
    local = l.root; /* a single-host job: stay on loopback */
    local.port = 0;
    if (local.family == AF_INET) memcpy(local.ip, (const uint8_t[4]){127, 0, 0, 1}, 4);
  } else if (localAddressToward(&l.root, &local) != 0) {
    int e = errno;
    free(b->rootRanks);
    free(b);
    rootFree(r);
    return ncclxSetError(ncclxSystemError, "bootstrap: rank %d has no route to the root %s: %s", rank,
                         addrString(&l.root, name, sizeof(name)), strerror(e));
  }
  r->listenFd = openListener(&local, 0, &r->addrs[rank]);
  ncclxResult_t res = ncclxSuccess;
  if (r->listenFd < 0)
    res = ncclxSetError(ncclxSystemError, "bootstrap: rank %d cannot listen on %s: %s", rank,
                        addrString(&local, name, sizeof(name)), strerror(errno));
  else
    res = rank == 0 ? rendezvousServe(r, &l, deadline) : rendezvousJoin(r, &l, deadline);
  if (res != ncclxSuccess) {
    free(b->rootRanks);
    free(b);
    rootFree(r);
    return res;
  }
  for (int i = 0; i < nranks; i++) b->rootRanks[i] = i;
  r->refs = 1;
  r->views = b;
  char rootName[80];
  INFO(NCCLX_LOG_BOOTSTRAP, "bootstrap: rank %d of %d ready, listening at %s (root %s)", rank, nranks,
       addrString(&r->addrs[rank], name, sizeof(name)), addrString(&l.root, rootName, sizeof(rootName)));
  *out = b;
  return ncclxSuccess;
}

ncclxResult_t bootstrapView(struct bootstrap* parent, const int* parentRanks, int nranks, int myRank,
                            uint64_t tagSpace, struct bootstrap** out) {
  if (out == NULL) return ncclxSetError(ncclxInvalidArgument, "bootstrap view: output pointer is NULL");
  *out = NULL;
  if (parent == NULL || parentRanks == NULL)
    return ncclxSetError(ncclxInvalidArgument, "bootstrap view: NULL %s", parent ? "rank list" : "parent");
  if (nranks < 1 || nranks > parent->nranks || myRank < 0 || myRank >= nranks)
    return ncclxSetError(ncclxInvalidArgument, "bootstrap view: %d ranks with my rank %d over a parent of %d ranks",
                         nranks, myRank, parent->nranks);
  if (parentRanks[myRank] != parent->rank)
    return ncclxSetError(ncclxInvalidArgument,
                         "bootstrap view: rank %d of the view maps to parent rank %d, but this is parent rank %d",
                         myRank, parentRanks[myRank], parent->rank);
  if (tagSpace == ROOT_TAG_SPACE)
    return ncclxSetError(ncclxInvalidArgument, "bootstrap view: tag space %llu is reserved for the root",
                         (unsigned long long)tagSpace);
  char* seen = calloc((size_t)parent->nranks, 1);
  if (!seen) return ncclxSetError(ncclxSystemError, "bootstrap view: out of memory");
  for (int i = 0; i < nranks; i++) {
    int p = parentRanks[i];
    if (p < 0 || p >= parent->nranks || seen[p]) {
      free(seen);
      return ncclxSetError(ncclxInvalidArgument, "bootstrap view: entry %d (parent rank %d) is %s", i, p,
                           p < 0 || p >= parent->nranks ? "out of range" : "a duplicate");
    }
    seen[p] = 1;
  }
  free(seen);
  struct bootstrapRoot* r = parent->root;
  struct bootstrap* v = viewAlloc(r, myRank, nranks, tagSpace);
  if (!v) return ncclxSetError(ncclxSystemError, "bootstrap view: out of memory");
  for (int i = 0; i < nranks; i++) v->rootRanks[i] = parent->rootRanks[parentRanks[i]];

  pthread_mutex_lock(&r->lock);
  for (struct bootstrap* o = r->views; o; o = o->nextView) {
    if (o->tagSpace != tagSpace) continue;
    pthread_mutex_unlock(&r->lock);
    free(v->rootRanks);
    free(v);
    return ncclxSetError(ncclxInvalidUsage, "bootstrap view: tag space 0x%llx is already used by a live view",
                         (unsigned long long)tagSpace);
  }
  v->nextView = r->views;
  r->views = v;
  r->refs++;
  pthread_mutex_unlock(&r->lock);
  INFO(NCCLX_LOG_BOOTSTRAP, "bootstrap: view 0x%llx of %d ranks, rank %d (root rank %d)", (unsigned long long)tagSpace,
       nranks, myRank, r->rank);
  *out = v;
  return ncclxSuccess;
}

void bootstrapRelease(struct bootstrap* b) {
  if (!b) return;
  struct bootstrapRoot* r = b->root;
  pthread_mutex_lock(&r->lock);
  for (struct bootstrap** p = &r->views; *p; p = &(*p)->nextView)
    if (*p == b) {
      *p = b->nextView;
      break;
    }
  /* Nobody can receive this view's leftovers any more. */
  purgeTagSpace(r, b->tagSpace);
  int last = --r->refs == 0;
  pthread_mutex_unlock(&r->lock);
  free(b->rootRanks);
  free(b);
  if (last) rootFree(r);
}

int bootstrapRank(const struct bootstrap* b) { return b ? b->rank : -1; }
int bootstrapNranks(const struct bootstrap* b) { return b ? b->nranks : 0; }

/* ---------------- point-to-point ---------------- */

/* "rank 3 (10.0.0.2:4567)" for a rank of view b. */
static const char* describePeer(const struct bootstrap* b, int peer, char* buf, size_t size) {
  char addr[80];
  snprintf(buf, size, "rank %d (%s)", peer, addrString(&b->root->addrs[b->rootRanks[peer]], addr, sizeof(addr)));
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
    if (nowSec() >= deadline) return ETIMEDOUT;
    pthread_mutex_lock(&r->lock);
    progressLocked(r);
    sleepLocked(r, fd, POLLOUT, sliceUntil(deadline, POLL_SLICE_MS));
    pthread_mutex_unlock(&r->lock);
  }
  return 0;
}

ncclxResult_t bootstrapSend(struct bootstrap* b, int peer, uint32_t tag, const void* data, size_t size) {
  NCCLX_CHECK(checkPeer(b, peer, data, size, "send"));
  struct bootstrapRoot* r = b->root;
  int dst = b->rootRanks[peer];
  struct outConn* oc = &r->out[dst];
  double deadline = deadlineAfter(r->timeoutSec);
  char who[128];

  /* Own the connection to dst: messages to one peer go out one at a time, in seq order. */
  pthread_mutex_lock(&r->lock);
  while (oc->busy) {
    if (nowSec() >= deadline) {
      pthread_mutex_unlock(&r->lock);
      return ncclxSetError(ncclxRemoteError, "bootstrap: rank %d timed out behind another send to %s", b->rank,
                           describePeer(b, peer, who, sizeof(who)));
    }
    progressLocked(r);
    sleepLocked(r, -1, 0, 1);
  }
  oc->busy = 1;
  uint64_t seq = ++r->sendSeq[dst];
  int fd = oc->fd, fresh = fd < 0;
  pthread_mutex_unlock(&r->lock);

  struct msgHeader h = {MSG_MAGIC, MSG_KIND_DATA, r->secret, b->tagSpace, seq, size, r->rank, tag};
  int e = 0;
  size_t written = 0;
  if (fresh) fd = connectWithin(&r->addrs[dst], deadline, 0, NULL, &e);
  if (fd >= 0) e = sendWithProgress(r, fd, &h, data, size, deadline, &written);

  pthread_mutex_lock(&r->lock);
  if (e == 0) {
    oc->fd = fd;
    oc->lastUse = ++r->useClock;
    if (fresh) r->nOutOpen++;
  } else {
    if (fd >= 0) close(fd);
    if (!fresh) r->nOutOpen--;
    oc->fd = -1;
    if (written == 0) r->sendSeq[dst]--; /* the peer never saw this seq: keep the sequence dense */
  }
  oc->busy = 0;
  evictLocked(r);
  pthread_mutex_unlock(&r->lock);
  if (e != 0)
    return ncclxSetError(ncclxRemoteError, "bootstrap: rank %d could not send %zu bytes (tag %u) to %s: %s%s", b->rank,
                         size, tag, describePeer(b, peer, who, sizeof(who)), strerror(e),
                         fd < 0 ? " (connect failed)" : "");
  return ncclxSuccess;
}

ncclxResult_t bootstrapRecv(struct bootstrap* b, int peer, uint32_t tag, void* data, size_t size,
                            volatile int* abortFlag) {
  NCCLX_CHECK(checkPeer(b, peer, data, size, "recv"));
  struct bootstrapRoot* r = b->root;
  int src = b->rootRanks[peer];
  double deadline = deadlineAfter(r->timeoutSec);
  char who[128], notice[1024];

  pthread_mutex_lock(&r->lock);
  for (;;) {
    progressLocked(r);
    struct message* m = takeMatch(r, src, tag, b->tagSpace);
    if (m) {
      pthread_mutex_unlock(&r->lock);
      ncclxResult_t res = ncclxSuccess;
      if (m->size != size)
        res = ncclxSetError(ncclxInternalError,
                            "bootstrap: rank %d expected %zu bytes from %s with tag %u but the message has %zu bytes",
                            b->rank, size, describePeer(b, peer, who, sizeof(who)), tag, m->size);
      else if (size)
        memcpy(data, m->data, size);
      free(m);
      return res;
    }
    if (findAbort(r, b->tagSpace, notice, sizeof(notice))) {
      pthread_mutex_unlock(&r->lock);
      return ncclxSetError(ncclxRemoteError, "bootstrap: rank %d stopped waiting for tag %u from %s: %s", b->rank, tag,
                           describePeer(b, peer, who, sizeof(who)), notice);
    }
    if (abortFlag && *abortFlag) {
      pthread_mutex_unlock(&r->lock);
      return ncclxSetError(ncclxInvalidUsage, "bootstrap: rank %d: receive of tag %u from %s aborted", b->rank, tag,
                           describePeer(b, peer, who, sizeof(who)));
    }
    if (nowSec() >= deadline) {
      pthread_mutex_unlock(&r->lock);
      return ncclxSetError(ncclxRemoteError, "bootstrap: rank %d timed out after %g s waiting for tag %u from %s",
                           b->rank, r->timeoutSec, tag, describePeer(b, peer, who, sizeof(who)));
    }
    sleepLocked(r, -1, 0, sliceUntil(deadline, POLL_SLICE_MS));
  }
}

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
    int fd = socket(to->family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    struct sockaddr_storage ss;
    socklen_t len;
    wireToSockaddr(to, &ss, &len);
    if (connect(fd, (struct sockaddr*)&ss, len) != 0 && errno != EINPROGRESS) {
      close(fd);
      continue;
    }
    pfds[i].fd = fd;
    active++;
  }
  while (active > 0 && nowSec() < deadline) {
    if (poll(pfds, (nfds_t)count, sliceUntil(deadline, POLL_SLICE_MS)) <= 0) continue;
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
  double deadline = nowSec() + ABORT_BUDGET_SEC;
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
    progressLocked(r);
    pthread_mutex_unlock(&r->lock);
  }
  return findAbort(r, b->tagSpace, msg, msgSize);
}

int bootstrapPollFd(const struct bootstrap* b) { return b ? b->root->listenFd : -1; }

/* ---------------- host identity ---------------- */

static pthread_once_t hostOnce = PTHREAD_ONCE_INIT;
static char hostName[256];

static void hostInit(void) {
  if (gethostname(hostName, sizeof(hostName) - 1) != 0) snprintf(hostName, sizeof(hostName), "unknown-host");
  hostName[sizeof(hostName) - 1] = '\0';
}

const char* bootstrapHostname(void) {
  pthread_once(&hostOnce, hostInit);
  return hostName;
}
