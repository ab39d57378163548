/*
 * A complete, minimal third-party network plugin for ncclx: "template", over TCP.
 *
 * Build it against the installed headers (see CMakeLists.txt) into libncclx-net-template.so
 * and load it with `[net] plugin = template` (or NCCLX_NET_PLUGIN=/path/to/the.so).
 * docs/plugin-guide.md walks through this file.
 *
 * Design, kept small on purpose:
 * - A connection is one TCP socket. The listen handle holds {magic, nonce, IPv4 address,
 *   port}; the sender's first 16 bytes are a hello {magic, nonce}, and the listener drops any
 *   socket whose hello does not match (a stranger, or a sender with a stale handle).
 * - A message is an 8-byte little-endian size followed by the bytes. Sends and receives are
 *   queued per comm (NCCLX_NET_MAX_REQUESTS each) and move in posting order; test() drives
 *   the socket without blocking.
 * - Nothing blocks: connect and accept are small state machines that the core calls again
 *   while they return a NULL comm.
 * Only the ncclx headers are used: a plugin never links libncclx.
 */
#include <arpa/inet.h>
#include <endian.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <unistd.h>

#include <ncclx/net.h>
#include <ncclx/profiler.h>

#define TPL_MAGIC 0x4c50544eu /* "NTPL" */
#define TPL_QUEUE NCCLX_NET_MAX_REQUESTS
#define TPL_MAX_MESSAGE ((size_t)1 << 30)
#define TPL_MAX_INCOMING 64
#define TPL_PROFILER_ID ((int64_t)0x7e000001) /* any value; profilers use it to tell plugins apart */

#define LOG(ctx, level, ...) (ctx)->log((level), NCCLX_LOG_NET, __FILE__, __LINE__, "NET/Template: " __VA_ARGS__)

typedef struct { uint32_t magic, addr; uint16_t port, pad; uint32_t pad2; uint64_t nonce; } tplHandle;
typedef struct { uint32_t magic, pad; uint64_t nonce; } tplHello;
_Static_assert(sizeof(tplHandle) <= NCCLX_NET_HANDLE_MAXSIZE, "handle too large");

typedef struct tplPending tplPending;
typedef struct {
  ncclxLogger_t log;
  ncclxProfilerCallback_t profiler;
  struct in_addr addr;   /* where listen() binds: [net.template] address */
  size_t maxMessage;     /* [net.template] max_message_bytes, TPL_MAX_MESSAGE by default */
  pthread_mutex_t lock;  /* connect() may run on several threads */
  tplPending* pending;
} tplCtx;

enum { KIND_LISTEN = 1, KIND_SEND, KIND_RECV };

struct tplComm;
typedef struct {
  struct tplComm* comm;
  int used, done;
  char* data;
  size_t size, moved; /* send: bytes; receive: capacity. moved counts header + payload */
  uint64_t hdr;       /* little-endian size on the wire */
  void* event;        /* profiler event, or NULL */
} tplReq;

typedef struct tplComm {
  int kind;
  tplCtx* ctx;
  int fd;
  ncclxResult_t err;
  tplReq reqs[TPL_QUEUE];
  unsigned head, tail; /* requests [head, tail) are in flight, oldest first */
} tplComm;

typedef struct { int fd; size_t got; tplHello hello; } tplIncoming;

typedef struct {
  int kind;
  tplCtx* ctx;
  int fd;
  uint64_t nonce;
  tplIncoming inc[TPL_MAX_INCOMING];
  int ninc;
} tplListen;

struct tplPending {    /* a connect() that has not finished yet */
  tplPending* next;
  void** owner;        /* the caller's sendComm slot identifies it across calls */
  tplHandle target;    /* with the handle: a slot the core gave up on may come back */
  int fd;
  size_t sent;
  tplHello hello;
};

/* ---------- init, devices, properties, finalize ---------- */

/* Where a key's value was set, for error messages: "file:line" or "env NCCLX_...". */
static const char* whereIs(const ncclxPluginEnv_t* env, const char* key, const char* value) {
  const char *k, *v, *w;
  for (int i = 0; env->config->entry && env->config->entry(env->section, i, &k, &v, &w); i++)
    if (strcasecmp(k, key) == 0 && strcmp(v, value) == 0) return w;
  return "environment";
}

/* max_message_bytes = N[K|M|G]: a smaller limit lets the core and the checker be tested
 * against one. Anything malformed or outside 1..TPL_MAX_MESSAGE is refused, not clamped. */
static ncclxResult_t parseMaxMessage(tplCtx* ctx, const ncclxPluginEnv_t* env) {
  ctx->maxMessage = TPL_MAX_MESSAGE;
  const char* v = env->config->get(env->section, "max_message_bytes");
  if (!v || !*v) return ncclxSuccess;
  char* end = NULL;
  errno = 0;
  unsigned long long n = strtoull(v, &end, 10);
  unsigned shift = 0;
  if (end && (*end == 'K' || *end == 'k')) shift = 10, end++;
  else if (end && (*end == 'M' || *end == 'm')) shift = 20, end++;
  else if (end && (*end == 'G' || *end == 'g')) shift = 30, end++;
  if (errno || end == v || *end || v[0] == '-' || n == 0 || n > (TPL_MAX_MESSAGE >> shift)) {
    LOG(ctx, NCCLX_LOG_WARN, "max_message_bytes = '%s' (%s): not a size from 1 to %zu",
        v, whereIs(env, "max_message_bytes", v), TPL_MAX_MESSAGE);
    return ncclxInvalidUsage;
  }
  ctx->maxMessage = (size_t)n << shift;
  return ncclxSuccess;
}

static ncclxResult_t tplInit(void** ctxOut, const ncclxPluginEnv_t* env) {
  tplCtx* ctx = calloc(1, sizeof(*ctx));
  if (!ctx) return ncclxSystemError;
  ctx->log = env->log;
  ctx->profiler = env->profiler;
  const char* addr = env->config->get(env->section, "address");
  if (!addr || !*addr) addr = "127.0.0.1";
  if (inet_pton(AF_INET, addr, &ctx->addr) != 1) {
    LOG(ctx, NCCLX_LOG_WARN, "address = '%s' (%s): not an IPv4 address", addr, whereIs(env, "address", addr));
    free(ctx);
    return ncclxInvalidUsage;
  }
  if (parseMaxMessage(ctx, env) != ncclxSuccess) {
    free(ctx);
    return ncclxInvalidUsage;
  }
  pthread_mutex_init(&ctx->lock, NULL);
  LOG(ctx, NCCLX_LOG_INFO, "listening on %s, messages up to %zu bytes", addr, ctx->maxMessage);
  *ctxOut = ctx;
  return ncclxSuccess;
}

static ncclxResult_t tplDevices(void* ctx, int* ndev) {
  (void)ctx;
  *ndev = 1;
  return ncclxSuccess;
}

static ncclxResult_t tplGetProperties(void* vctx, int dev, ncclxNetProperties_v1_t* props) {
  tplCtx* ctx = vctx;
  if (dev != 0) {
    LOG(ctx, NCCLX_LOG_WARN, "no device %d (there is 1)", dev);
    return ncclxInvalidArgument;
  }
  memset(props, 0, sizeof(*props));
  props->name = "template";
  props->ptrSupport = NCCLX_PTR_HOST;
  props->speedMbps = 10000;
  props->port = 1;
  props->maxComms = 65536;
  props->maxRecvs = 1;
  props->maxMessageBytes = ctx->maxMessage;
  return ncclxSuccess;
}

static ncclxResult_t tplFinalize(void* vctx) {
  tplCtx* ctx = vctx;
  while (ctx->pending) {
    tplPending* p = ctx->pending;
    ctx->pending = p->next;
    close(p->fd);
    free(p);
  }
  pthread_mutex_destroy(&ctx->lock);
  free(ctx);
  return ncclxSuccess;
}

/* ---------- connection setup ---------- */

static int nonBlockingSocket(void) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  int one = 1;
  if (fd >= 0) setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  return fd;
}

static ncclxResult_t tplListenOp(void* vctx, int dev, void* handle, void** listenComm) {
  tplCtx* ctx = vctx;
  tplListen* lc = calloc(1, sizeof(*lc));
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr = ctx->addr};
  socklen_t len = sizeof(sa);
  if (dev != 0) {
    LOG(ctx, NCCLX_LOG_WARN, "listen: no device %d (there is 1)", dev);
    return free(lc), ncclxInvalidArgument;
  }
  if (!lc) return ncclxSystemError;
  lc->fd = nonBlockingSocket();
  if (lc->fd < 0 || bind(lc->fd, (struct sockaddr*)&sa, len) != 0 || listen(lc->fd, 64) != 0 ||
      getsockname(lc->fd, (struct sockaddr*)&sa, &len) != 0) {
    LOG(ctx, NCCLX_LOG_WARN, "listen failed: %s", strerror(errno));
    if (lc->fd >= 0) close(lc->fd);
    free(lc);
    return ncclxSystemError;
  }
  lc->kind = KIND_LISTEN;
  lc->ctx = ctx;
  if (getrandom(&lc->nonce, sizeof(lc->nonce), 0) != sizeof(lc->nonce)) lc->nonce = (uintptr_t)lc ^ 0x9e3779b97f4a7c15ull;
  tplHandle h = {.magic = TPL_MAGIC, .addr = sa.sin_addr.s_addr, .port = sa.sin_port, .nonce = lc->nonce};
  memset(handle, 0, NCCLX_NET_HANDLE_MAXSIZE);
  memcpy(handle, &h, sizeof(h));
  *listenComm = lc;
  return ncclxSuccess;
}

static tplComm* commNew(tplCtx* ctx, int kind, int fd) {
  tplComm* c = calloc(1, sizeof(*c));
  if (!c) return NULL;
  c->kind = kind;
  c->ctx = ctx;
  c->fd = fd;
  return c;
}

/* connect: start a TCP connect and queue the hello; finish on later calls. */
static ncclxResult_t tplConnect(void* vctx, int dev, const void* handle, void** sendComm) {
  tplCtx* ctx = vctx;
  tplHandle h;
  memcpy(&h, handle, sizeof(h));
  *sendComm = NULL;
  if (dev != 0) {
    LOG(ctx, NCCLX_LOG_WARN, "connect: no device %d (there is 1)", dev);
    return ncclxInvalidArgument;
  }
  if (h.magic != TPL_MAGIC) {
    LOG(ctx, NCCLX_LOG_WARN, "connect: not a template handle (magic 0x%x)", h.magic);
    return ncclxInternalError;
  }
  pthread_mutex_lock(&ctx->lock);
  tplPending *p = NULL, **pp;
  for (pp = &ctx->pending; *pp; pp = &(*pp)->next)
    if ((*pp)->owner == sendComm) {
      p = *pp;
      *pp = p->next;
      break;
    }
  pthread_mutex_unlock(&ctx->lock);
  if (p && memcmp(&p->target, &h, sizeof(h)) != 0) { /* an abandoned connect: start over */
    close(p->fd);
    free(p);
    p = NULL;
  }
  if (!p) {
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = h.port};
    sa.sin_addr.s_addr = h.addr;
    if (!(p = calloc(1, sizeof(*p)))) return ncclxSystemError;
    p->owner = sendComm;
    p->target = h;
    p->hello.magic = TPL_MAGIC;
    p->hello.nonce = h.nonce;
    p->fd = nonBlockingSocket();
    if (p->fd < 0 || (connect(p->fd, (struct sockaddr*)&sa, sizeof(sa)) != 0 && errno != EINPROGRESS)) {
      LOG(ctx, NCCLX_LOG_WARN, "connect failed: %s", strerror(errno));
      if (p->fd >= 0) close(p->fd);
      free(p);
      return ncclxRemoteError;
    }
  }
  /* The hello goes out as soon as the socket is connected (send fails with EAGAIN before). */
  ssize_t n = send(p->fd, (char*)&p->hello + p->sent, sizeof(p->hello) - p->sent, MSG_NOSIGNAL);
  if (n > 0) p->sent += (size_t)n;
  if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != ENOTCONN && errno != EINTR) {
    LOG(ctx, NCCLX_LOG_WARN, "connect: %s", strerror(errno));
    close(p->fd);
    free(p);
    return ncclxRemoteError;
  }
  if (p->sent < sizeof(p->hello)) { /* not yet: keep it for the next call */
    pthread_mutex_lock(&ctx->lock);
    p->next = ctx->pending;
    ctx->pending = p;
    pthread_mutex_unlock(&ctx->lock);
    return ncclxSuccess;
  }
  tplComm* c = commNew(ctx, KIND_SEND, p->fd);
  if (!c) close(p->fd);
  free(p);
  *sendComm = c;
  return c ? ncclxSuccess : ncclxSystemError;
}

static void dropIncoming(tplListen* lc, int i) {
  close(lc->inc[i].fd);
  lc->inc[i] = lc->inc[--lc->ninc];
}

/* accept: take new sockets, read their hellos, hand out the first one that proves itself. */
static ncclxResult_t tplAccept(void* listenComm, void** recvComm) {
  tplListen* lc = listenComm;
  *recvComm = NULL;
  int fd;
  while (lc->ninc < TPL_MAX_INCOMING && (fd = accept4(lc->fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC)) >= 0) {
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    lc->inc[lc->ninc++] = (tplIncoming){.fd = fd};
  }
  for (int i = 0; i < lc->ninc;) {
    tplIncoming* in = &lc->inc[i];
    ssize_t n = recv(in->fd, (char*)&in->hello + in->got, sizeof(in->hello) - in->got, 0);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
      dropIncoming(lc, i);
      continue;
    }
    if (n > 0) in->got += (size_t)n;
    if (in->got < sizeof(in->hello)) {
      i++;
      continue;
    }
    if (in->hello.magic != TPL_MAGIC || in->hello.nonce != lc->nonce) {
      LOG(lc->ctx, NCCLX_LOG_WARN, "refused a connection: wrong magic or nonce (stale handle?)");
      dropIncoming(lc, i);
      continue;
    }
    tplComm* c = commNew(lc->ctx, KIND_RECV, in->fd);
    if (!c) return ncclxSystemError;
    lc->inc[i] = lc->inc[--lc->ninc];
    *recvComm = c;
    return ncclxSuccess;
  }
  return ncclxSuccess;
}

static ncclxResult_t tplCloseListen(void* listenComm) {
  tplListen* lc = listenComm;
  while (lc->ninc) dropIncoming(lc, lc->ninc - 1);
  close(lc->fd);
  free(lc);
  return ncclxSuccess;
}

/* ---------- data path ---------- */

/* Host memory needs no registration: hand back a token, and accept NULL handles too. */
static ncclxResult_t tplRegMr(void* comm, void* data, size_t size, int type, void** mhandle) {
  (void)data, (void)size;
  *mhandle = NULL;
  if (type != NCCLX_PTR_HOST) {
    LOG(((tplComm*)comm)->ctx, NCCLX_LOG_WARN, "regMr: only host memory is supported");
    return ncclxInvalidArgument;
  }
  *mhandle = comm;
  return ncclxSuccess;
}

static ncclxResult_t tplDeregMr(void* comm, void* mhandle) {
  (void)comm, (void)mhandle;
  return ncclxSuccess;
}

static ncclxResult_t fail(tplComm* c, ncclxResult_t res, const char* what) {
  if (c->err == ncclxSuccess) {
    LOG(c->ctx, NCCLX_LOG_WARN, "%s: %s", c->kind == KIND_SEND ? "send" : "receive", what);
    c->err = res;
  }
  return c->err;
}

/* Bytes of request r on the wire: the 8-byte header, then the payload. */
static size_t wireBytes(const tplComm* c, const tplReq* r) {
  return sizeof(r->hdr) + (c->kind == KIND_SEND ? r->size : (size_t)le64toh(r->hdr));
}

/* Moves bytes for the requests in order until the socket would block. */
static ncclxResult_t progress(tplComm* c) {
  for (unsigned i = c->head; i != c->tail && c->err == ncclxSuccess; i++) {
    tplReq* r = &c->reqs[i % TPL_QUEUE];
    while (r->used && !r->done) {
      int inHdr = r->moved < sizeof(r->hdr);
      char* p = inHdr ? (char*)&r->hdr + r->moved : r->data + (r->moved - sizeof(r->hdr));
      size_t want = inHdr ? sizeof(r->hdr) - r->moved : wireBytes(c, r) - r->moved;
      if (want > 0) {
        ssize_t n = c->kind == KIND_SEND ? send(c->fd, p, want, MSG_DONTWAIT | MSG_NOSIGNAL)
                                         : recv(c->fd, p, want, MSG_DONTWAIT);
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return ncclxSuccess;
        if (n < 0) return fail(c, ncclxRemoteError, strerror(errno));
        if (n == 0) return fail(c, ncclxRemoteError, "the peer closed the connection");
        r->moved += (size_t)n;
      }
      if (r->moved < sizeof(r->hdr)) continue;
      if (c->kind == KIND_RECV && le64toh(r->hdr) > r->size)
        return fail(c, ncclxRemoteError, "message larger than the posted receive");
      if (r->moved == wireBytes(c, r)) r->done = 1;
    }
  }
  return c->err;
}

static tplReq* post(tplComm* c, void* data, size_t size, void* phandle) {
  if (c->tail - c->head == TPL_QUEUE) return NULL; /* full: *request = NULL, the core retries */
  tplReq* r = &c->reqs[c->tail++ % TPL_QUEUE];
  memset(r, 0, sizeof(*r));
  r->comm = c;
  r->used = 1;
  r->data = data;
  r->size = size;
  if (c->kind == KIND_SEND) r->hdr = htole64((uint64_t)size);
  /* Report the transfer to the profiler; a NULL event means "not recorded". */
  if (phandle && c->ctx->profiler(&r->event, NCCLX_PROFILER_NET_START, phandle, TPL_PROFILER_ID,
                                  NULL) != ncclxSuccess)
    r->event = NULL;
  return r;
}

static ncclxResult_t tplIsend(void* sendComm, void* data, size_t size, int tag, void* mhandle,
                              void* phandle, void** request) {
  (void)tag, (void)mhandle; /* one buffer per receive: the tag selects nothing */
  tplComm* c = sendComm;
  *request = NULL;
  if (c->err != ncclxSuccess) return c->err;
  if (size > c->ctx->maxMessage || (size > 0 && !data)) {
    LOG(c->ctx, NCCLX_LOG_WARN, "send of %zu bytes refused (limit %zu)", size, c->ctx->maxMessage);
    return ncclxInternalError;
  }
  *request = post(c, data, size, phandle);
  progress(c); /* start right away for lower latency; a failure is reported by test() */
  return ncclxSuccess;
}

static ncclxResult_t tplIrecv(void* recvComm, int n, void** data, size_t* sizes, int* tags,
                              void** mhandles, void** phandles, void** request) {
  (void)tags, (void)mhandles;
  tplComm* c = recvComm;
  *request = NULL;
  if (n != 1) return ncclxInternalError; /* we said maxRecvs = 1 */
  if (c->err != ncclxSuccess) return c->err;
  *request = post(c, data[0], sizes[0], phandles ? phandles[0] : NULL);
  progress(c);
  return ncclxSuccess;
}

/* Reports completion once; the request is then released and never passed again. */
static ncclxResult_t tplTest(void* request, int* done, size_t* sizes) {
  tplReq* r = request;
  tplComm* c = r->comm;
  *done = 0;
  if (!r->used) return ncclxInternalError;
  if (!r->done) progress(c);
  if (!r->done && c->err == ncclxSuccess) return ncclxSuccess;
  ncclxResult_t res = r->done ? ncclxSuccess : c->err;
  *done = r->done;
  if (r->done && sizes) sizes[0] = r->moved - sizeof(r->hdr);
  if (r->event) c->ctx->profiler(&r->event, NCCLX_PROFILER_NET_STOP, NULL, TPL_PROFILER_ID, NULL);
  r->used = 0;
  while (c->head != c->tail && !c->reqs[c->head % TPL_QUEUE].used) c->head++;
  return res;
}

static ncclxResult_t tplClose(void* comm) {
  tplComm* c = comm;
  close(c->fd);
  free(c);
  return ncclxSuccess;
}

/* The core sleeps in poll() on this when it has nothing to do: readable = progress possible.
 * A send comm has no such descriptor here (the core then polls it by calling test()). */
static ncclxResult_t tplGetPollFd(void* comm, int* fd) {
  int kind = *(int*)comm; /* every comm starts with its kind */
  *fd = kind == KIND_RECV ? ((tplComm*)comm)->fd : kind == KIND_LISTEN ? ((tplListen*)comm)->fd : -1;
  return ncclxSuccess;
}

/* The one exported symbol. Everything else is static (and -fvisibility=hidden). */
__attribute__((visibility("default"))) const ncclxNet_v1_t ncclxNetPlugin_v1 = {
    .name = "template",
    .abiVersion = NCCLX_NET_ABI_VERSION,
    .init = tplInit,
    .devices = tplDevices,
    .getProperties = tplGetProperties,
    .listen = tplListenOp,
    .connect = tplConnect,
    .accept = tplAccept,
    .regMr = tplRegMr,
    .deregMr = tplDeregMr,
    .isend = tplIsend,
    .irecv = tplIrecv,
    .iflush = NULL, /* optional: host memory needs no flush */
    .test = tplTest,
    .closeSend = tplClose,
    .closeRecv = tplClose,
    .closeListen = tplCloseListen,
    .finalize = tplFinalize,
    .getPollFd = tplGetPollFd,
};
