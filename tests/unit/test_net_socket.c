/* The built-in socket network (core/src/net_socket.c), driven through its ABI between two
 * processes on 127.0.0.1: data integrity at many sizes, queue depth and order, size rules,
 * strangers on the listener, killed peers, config errors. Prints a throughput figure. */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "transport/socket/net_socket.h" /* ncclxNetSocket */

static const ncclxNet_t* net = &ncclxNetSocket;

#define CHECK(cond)                                                                        \
  do {                                                                                     \
    if (!(cond)) {                                                                         \
      fprintf(stderr, "[pid %d] %s:%d: CHECK failed: %s\n", (int)getpid(), __FILE__,       \
              __LINE__, #cond);                                                            \
      exit(1);                                                                             \
    }                                                                                      \
  } while (0)

#define TIMEOUT_RESULT ((ncclxResult_t)ncclxNumResults)
#define MIB ((size_t)1 << 20)

/* Mirrors the start of net_socket.c's handle: to forge a stale one and find the address. */
typedef struct {
  uint32_t magic;
  uint16_t nsocks;
  uint16_t reserved;
  uint64_t nonce;
  union {
    struct sockaddr sa;
    struct sockaddr_in in4;
  } addr;
} mirrorHandle;

/* ---------------------------------------------------------------- stub plugin environment */

static char logText[1 << 16];
static size_t logLen;

static void testLog(ncclxLogLevel_t level, unsigned long subsys, const char* file, int line,
                    const char* fmt, ...) __attribute__((format(printf, 5, 6)));
static void testLog(ncclxLogLevel_t level, unsigned long subsys, const char* file, int line,
                    const char* fmt, ...) {
  (void)subsys;
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof(msg), fmt, ap);
  va_end(ap);
  size_t n = strlen(msg);
  if (logLen + n + 2 < sizeof(logText)) {
    memcpy(logText + logLen, msg, n);
    logLen += n;
    logText[logLen++] = '\n';
    logText[logLen] = '\0';
  }
  if (level <= NCCLX_LOG_WARN || getenv("TEST_VERBOSE"))
    fprintf(stderr, "[pid %d] %s %s:%d %s\n", (int)getpid(), level <= NCCLX_LOG_WARN ? "WARN" : "INFO",
            file, line, msg);
}

static void logClear(void) {
  logLen = 0;
  logText[0] = '\0';
}

static int logHas(const char* s) { return strstr(logText, s) != NULL; }

typedef struct {
  const char* keys[8];
  const char* vals[8];
  int n;
} testSection;

static const char* cfgGet(const ncclxConfigSection_t* s, const char* key) {
  const testSection* t = (const testSection*)(const void*)s;
  for (int i = 0; i < t->n; i++)
    if (strcmp(t->keys[i], key) == 0) return t->vals[i];
  return NULL;
}

static int cfgEntry(const ncclxConfigSection_t* s, int index, const char** key,
                    const char** value, const char** where) {
  static const char* lines[8] = {"test.ini:1", "test.ini:2", "test.ini:3", "test.ini:4",
                                 "test.ini:5", "test.ini:6", "test.ini:7", "test.ini:8"};
  const testSection* t = (const testSection*)(const void*)s;
  if (index < 0 || index >= t->n) return 0;
  *key = t->keys[index];
  *value = t->vals[index];
  *where = lines[index];
  return 1;
}

static const ncclxConfigApi_t cfgApi = {cfgGet, cfgEntry};

static ncclxResult_t profNoop(void** eHandle, int type, void* parent, int64_t id, void* ext) {
  (void)type, (void)parent, (void)id, (void)ext;
  if (eHandle) *eHandle = NULL;
  return ncclxSuccess;
}

static ncclxResult_t initWith(testSection* sec, void** ctx) {
  ncclxPluginEnv_t env = {NCCLX_PLUGIN_ENV_VERSION, testLog, &cfgApi,
                          (const ncclxConfigSection_t*)(const void*)sec, profNoop};
  return net->init(ctx, &env);
}

static void* openNet(int nsocks) {
  static char ns[16];
  snprintf(ns, sizeof(ns), "%d", nsocks);
  testSection sec = {{"ifname", "nsocks"}, {"lo", ns}, 2};
  void* ctx = NULL;
  CHECK(initWith(&sec, &ctx) == ncclxSuccess && ctx != NULL);
  return ctx;
}

/* ---------------------------------------------------------------- bounded helpers */

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static ncclxResult_t waitReq(void* req, size_t* size, double timeoutSec) {
  double end = now() + timeoutSec;
  for (long spins = 0;; spins++) {
    int done = 0;
    ncclxResult_t res = net->test(req, &done, size);
    if (res != ncclxSuccess || done) return res;
    if (now() > end) return TIMEOUT_RESULT;
    if (spins % 64 == 63) usleep(50);
  }
}

static void* isendRetry(void* sc, void* data, size_t size, int tag) {
  void* req = NULL;
  double end = now() + 10;
  while (!req) {
    CHECK(net->isend(sc, data, size, tag, NULL, NULL, &req) == ncclxSuccess);
    CHECK(now() < end);
  }
  return req;
}

static void* irecvOne(void* rc, void* data, size_t size) {
  void* req = NULL;
  int tag = 0;
  CHECK(net->irecv(rc, 1, &data, &size, &tag, NULL, NULL, &req) == ncclxSuccess);
  CHECK(req != NULL);
  return req;
}

static void* connectTo(void* ctx, const void* handle) {
  void* sc = NULL;
  double end = now() + 10;
  while (!sc) {
    CHECK(net->connect(ctx, 0, handle, &sc) == ncclxSuccess);
    CHECK(now() < end);
    if (!sc) usleep(100);
  }
  return sc;
}

static void* acceptOne(void* lc) {
  void* rc = NULL;
  double end = now() + 10;
  while (!rc) {
    CHECK(net->accept(lc, &rc) == ncclxSuccess);
    CHECK(now() < end);
    if (!rc) usleep(100);
  }
  return rc;
}

static void writeAll(int fd, const void* buf, size_t n) {
  CHECK(write(fd, buf, n) == (ssize_t)n); /* small messages through a pipe: never partial */
}

static void readAll(int fd, void* buf, size_t n) {
  size_t got = 0;
  while (got < n) {
    struct pollfd p = {fd, POLLIN, 0};
    CHECK(poll(&p, 1, 20000) == 1);
    ssize_t r = read(fd, (char*)buf + got, n - got);
    CHECK(r > 0);
    got += (size_t)r;
  }
}

typedef int (*childFn)(int fromParent, int toParent, int nsocks);

static pid_t spawn(childFn fn, int nsocks, int* toChild, int* fromChild) {
  int a[2], b[2];
  CHECK(pipe(a) == 0 && pipe(b) == 0);
  fflush(NULL);
  pid_t pid = fork();
  CHECK(pid >= 0);
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    close(a[1]);
    close(b[0]);
    exit(fn(a[0], b[1], nsocks));
  }
  close(a[0]);
  close(b[1]);
  *toChild = a[1];
  *fromChild = b[0];
  return pid;
}

/* Exit status of the child, or -1 when it had to be killed after the timeout. */
static int reap(pid_t pid, double timeoutSec) {
  double end = now() + timeoutSec;
  int status = 0;
  for (;;) {
    pid_t r = waitpid(pid, &status, WNOHANG);
    if (r == pid) break;
    if (now() > end) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      return -1;
    }
    usleep(1000);
  }
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  return 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
}

static uint8_t pattern(size_t i, unsigned k) {
  uint32_t x = (uint32_t)i * 2654435761u ^ (uint32_t)(i >> 32) ^ (k * 0x9e3779b9u);
  x ^= x >> 15;
  return (uint8_t)(x ^ (x >> 8));
}

static void fill(uint8_t* buf, size_t n, unsigned k) {
  for (size_t i = 0; i < n; i++) buf[i] = pattern(i, k);
}

static int verify(const uint8_t* buf, size_t n, unsigned k) {
  for (size_t i = 0; i < n; i++)
    if (buf[i] != pattern(i, k)) {
      fprintf(stderr, "message %u: byte %zu of %zu is 0x%02x, expected 0x%02x\n", k, i, n, buf[i],
              pattern(i, k));
      return 0;
    }
  return 1;
}

/* ---------------------------------------------------------------- data test */

/* {bytes sent, bytes posted by the receiver}: includes 0 bytes and receives larger than the
 * send, below and above the striping threshold. */
static const size_t dataSizes[][2] = {
    {0, 0},       {1, 1},           {7, 7},         {4096, 4096}, {MIB + 3, MIB + 3},
    {64 * MIB, 64 * MIB}, {1000, 5000}, {300 << 10, 2 * MIB}, {0, 64},
};
#define NDATA (sizeof(dataSizes) / sizeof(dataSizes[0]))
#define NFLIGHT NCCLX_NET_MAX_REQUESTS
#define THROUGHPUT_ITERS 8

static size_t flightSize(int i) { return (i % 8 == 5) ? (300 << 10) + (size_t)i : (size_t)(i * 37); }

static int dataSender(int fromParent, int toParent, int nsocks) {
  (void)toParent;
  void* ctx = openNet(nsocks);
  char handle[NCCLX_NET_HANDLE_MAXSIZE];
  readAll(fromParent, handle, sizeof(handle));
  void* sc = connectTo(ctx, handle);
  uint8_t* buf = malloc(64 * MIB);
  CHECK(buf);

  for (unsigned k = 0; k < NDATA; k++) { /* one at a time, varied tags */
    size_t n = dataSizes[k][0];
    fill(buf, n, k);
    void* req = isendRetry(sc, n ? buf : NULL, n, (int)k * 7 - 3);
    size_t sent = 12345;
    CHECK(waitReq(req, &sent, 30) == ncclxSuccess && sent == n);
  }

  /* NFLIGHT at once; one more must be refused with request NULL. */
  uint8_t* bufs[NFLIGHT];
  void* reqs[NFLIGHT];
  for (int i = 0; i < NFLIGHT; i++) {
    bufs[i] = malloc(flightSize(i) + 1);
    CHECK(bufs[i]);
    fill(bufs[i], flightSize(i), 100u + (unsigned)i);
    reqs[i] = NULL;
    CHECK(net->isend(sc, bufs[i], flightSize(i), i, NULL, NULL, &reqs[i]) == ncclxSuccess);
    CHECK(reqs[i] != NULL);
  }
  void* extra = (void*)1;
  CHECK(net->isend(sc, buf, 1, 0, NULL, NULL, &extra) == ncclxSuccess && extra == NULL);
  for (int i = NFLIGHT - 1; i >= 0; i--) { /* test newest first: completion stays in order */
    size_t sent = 0;
    CHECK(waitReq(reqs[i], &sent, 30) == ncclxSuccess && sent == flightSize(i));
  }
  for (int i = 0; i < NFLIGHT; i++) free(bufs[i]);

  /* Throughput: the same 64 MiB buffer THROUGHPUT_ITERS times, all queued. */
  void* treq[THROUGHPUT_ITERS];
  for (int i = 0; i < THROUGHPUT_ITERS; i++) treq[i] = isendRetry(sc, buf, 64 * MIB, i);
  for (int i = 0; i < THROUGHPUT_ITERS; i++) CHECK(waitReq(treq[i], NULL, 60) == ncclxSuccess);

  /* Larger than the receiver's buffer: completes here (it fits the socket buffers). */
  void* big = isendRetry(sc, buf, 2000, 0);
  CHECK(waitReq(big, NULL, 30) == ncclxSuccess);

  char bye;
  readAll(fromParent, &bye, 1); /* keep the connection until the receiver has checked */
  CHECK(net->closeSend(sc) == ncclxSuccess);
  CHECK(net->finalize(ctx) == ncclxSuccess);
  free(buf);
  return 0;
}

static void testData(int nsocks) {
  void* ctx = openNet(nsocks);
  char handle[NCCLX_NET_HANDLE_MAXSIZE];
  void* lc = NULL;
  CHECK(net->listen(ctx, 0, handle, &lc) == ncclxSuccess && lc);
  int toChild, fromChild;
  pid_t pid = spawn(dataSender, nsocks, &toChild, &fromChild);
  writeAll(toChild, handle, sizeof(handle));
  void* rc = acceptOne(lc);

  /* The poll fd wakes up when data arrives, before anything is posted. */
  int pfd = -1;
  CHECK(net->getPollFd(rc, &pfd) == ncclxSuccess && pfd >= 0);
  struct pollfd p = {pfd, POLLIN, 0};
  CHECK(poll(&p, 1, 10000) == 1);

  uint8_t* buf = malloc(64 * MIB);
  CHECK(buf);
  for (unsigned k = 0; k < NDATA; k++) {
    size_t n = dataSizes[k][0], cap = dataSizes[k][1];
    memset(buf, 0xee, cap + 1 < 64 * MIB ? cap + 1 : 64 * MIB);
    void* req = irecvOne(rc, cap ? buf : NULL, cap);
    size_t got = 12345;
    CHECK(waitReq(req, &got, 30) == ncclxSuccess);
    CHECK(got == n);
    CHECK(verify(buf, n, k));
    if (n < cap) CHECK(buf[n] == 0xee); /* nothing written past the message */
  }

  /* Queue depth, order, and the rejected extra request. */
  uint8_t* bufs[NFLIGHT];
  void* reqs[NFLIGHT];
  for (int i = 0; i < NFLIGHT; i++) {
    bufs[i] = malloc(flightSize(i) + 64);
    CHECK(bufs[i]);
    reqs[i] = irecvOne(rc, bufs[i], flightSize(i) + 64);
  }
  void* extra = (void*)1;
  void* ep = buf;
  size_t esz = 1;
  int etag = 0;
  CHECK(net->irecv(rc, 1, &ep, &esz, &etag, NULL, NULL, &extra) == ncclxSuccess && extra == NULL);
  int left = NFLIGHT;
  size_t sizes[NFLIGHT];
  double end = now() + 30;
  while (left > 0) {
    CHECK(now() < end);
    for (int i = NFLIGHT - 1; i >= 0; i--) {
      if (!reqs[i]) continue;
      int done = 0;
      CHECK(net->test(reqs[i], &done, &sizes[i]) == ncclxSuccess);
      if (!done) continue;
      reqs[i] = NULL;
      left--;
      for (int j = 0; j < i; j++) { /* in order: everything older is complete too */
        if (!reqs[j]) continue;
        CHECK(net->test(reqs[j], &done, &sizes[j]) == ncclxSuccess && done);
        reqs[j] = NULL;
        left--;
      }
    }
  }
  for (int i = 0; i < NFLIGHT; i++) {
    CHECK(sizes[i] == flightSize(i));
    CHECK(verify(bufs[i], sizes[i], 100u + (unsigned)i));
    free(bufs[i]);
  }

  /* Grouped receives are not supported; device memory is refused. */
  void* two[2] = {buf, buf + 8};
  size_t twoSizes[2] = {8, 8};
  int twoTags[2] = {0, 1};
  void* req = (void*)1;
  CHECK(net->irecv(rc, 2, two, twoSizes, twoTags, NULL, NULL, &req) == ncclxInternalError);
  void* mh = NULL;
  CHECK(net->regMr(rc, buf, 4096, NCCLX_PTR_CUDA, &mh) == ncclxInvalidArgument);
  CHECK(net->regMr(rc, buf, 4096, NCCLX_PTR_HOST, &mh) == ncclxSuccess && mh != NULL);
  CHECK(net->deregMr(rc, mh) == ncclxSuccess);

  /* Throughput (informational). */
  double t0 = now();
  void* treq[THROUGHPUT_ITERS];
  for (int i = 0; i < THROUGHPUT_ITERS; i++) treq[i] = irecvOne(rc, buf, 64 * MIB);
  for (int i = 0; i < THROUGHPUT_ITERS; i++) {
    size_t got = 0;
    CHECK(waitReq(treq[i], &got, 60) == ncclxSuccess && got == 64 * MIB);
  }
  double dt = now() - t0;
  printf("nsocks=%d: %d x 64 MiB in %.3f s = %.0f MB/s\n", nsocks, THROUGHPUT_ITERS, dt,
         (double)THROUGHPUT_ITERS * 64.0 * (double)MIB / dt / 1e6);

  /* A send larger than the posted receive is an error naming the peer. */
  logClear();
  req = irecvOne(rc, buf, 100);
  CHECK(waitReq(req, NULL, 30) == ncclxRemoteError);
  CHECK(logHas("posted receive") && logHas("127.0.0.1"));
  void* after = (void*)1;
  CHECK(net->irecv(rc, 1, &ep, &esz, &etag, NULL, NULL, &after) == ncclxRemoteError);

  writeAll(toChild, "x", 1);
  CHECK(reap(pid, 30) == 0);
  CHECK(net->closeRecv(rc) == ncclxSuccess);
  CHECK(net->closeListen(lc) == ncclxSuccess);
  CHECK(net->finalize(ctx) == ncclxSuccess);
  close(toChild);
  close(fromChild);
  free(buf);
  printf("data nsocks=%d: ok\n", nsocks);
}

/* ---------------------------------------------------------------- strangers */

static int goodSender(int fromParent, int toParent, int nsocks) {
  (void)toParent;
  void* ctx = openNet(nsocks);
  char handle[NCCLX_NET_HANDLE_MAXSIZE];
  readAll(fromParent, handle, sizeof(handle));
  void* sc = connectTo(ctx, handle);
  size_t n = MIB + 3;
  uint8_t* buf = malloc(n);
  CHECK(buf);
  fill(buf, n, 7);
  CHECK(waitReq(isendRetry(sc, buf, n, 1), NULL, 30) == ncclxSuccess);
  char bye;
  readAll(fromParent, &bye, 1);
  CHECK(net->closeSend(sc) == ncclxSuccess);
  CHECK(net->finalize(ctx) == ncclxSuccess);
  free(buf);
  return 0;
}

static int rawConnect(const mirrorHandle* h) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  CHECK(fd >= 0);
  CHECK(connect(fd, &h->addr.sa, sizeof(h->addr.in4)) == 0);
  return fd;
}

/* The listener closed fd: EOF or reset within the bound. */
static int closedByPeer(int fd, double timeoutSec) {
  double end = now() + timeoutSec;
  while (now() < end) {
    struct pollfd p = {fd, POLLIN, 0};
    if (poll(&p, 1, 100) == 1) {
      char c;
      ssize_t r = recv(fd, &c, 1, MSG_DONTWAIT);
      if (r == 0 || (r < 0 && errno == ECONNRESET)) return 1;
    }
  }
  return 0;
}

static void testStrangers(int nsocks) {
  void* ctx = openNet(nsocks);
  char handle[NCCLX_NET_HANDLE_MAXSIZE];
  void* lc = NULL;
  CHECK(net->listen(ctx, 0, handle, &lc) == ncclxSuccess && lc);
  mirrorHandle h;
  memcpy(&h, handle, sizeof(h));
  CHECK(h.addr.sa.sa_family == AF_INET && h.nsocks == nsocks);
  logClear();

  int garbage = rawConnect(&h);
  const char junk[] = "GET / HTTP/1.0\r\n\r\n";
  CHECK(write(garbage, junk, sizeof(junk) - 1) == (ssize_t)(sizeof(junk) - 1));
  int silent = rawConnect(&h);

  /* A real sender holding a handle with the wrong nonce (an old job, say). */
  char stale[NCCLX_NET_HANDLE_MAXSIZE];
  memcpy(stale, handle, sizeof(stale));
  ((mirrorHandle*)(void*)stale)->nonce ^= 0x5a5a5a5aull;
  void* staleSc = connectTo(ctx, stale);

  int toChild, fromChild;
  pid_t pid = spawn(goodSender, nsocks, &toChild, &fromChild);
  writeAll(toChild, handle, sizeof(handle));
  void* rc = acceptOne(lc);
  size_t n = MIB + 3, got = 0;
  uint8_t* buf = malloc(n);
  CHECK(buf);
  CHECK(waitReq(irecvOne(rc, buf, n), &got, 30) == ncclxSuccess && got == n);
  CHECK(verify(buf, n, 7));

  /* Nothing else becomes a connection; the impostors were logged and disconnected. */
  for (int i = 0; i < 20; i++) {
    void* other = NULL;
    CHECK(net->accept(lc, &other) == ncclxSuccess && other == NULL);
    usleep(1000);
  }
  CHECK(logHas("refused connection from 127.0.0.1:") && logHas("bad magic"));
  CHECK(logHas("wrong nonce"));
  CHECK(closedByPeer(garbage, 5));
  /* The impostor's data never arrives: its sends fail once the kernel sees the close. */
  size_t bigN = 16 * MIB;
  uint8_t* big = calloc(1, bigN);
  CHECK(big);
  CHECK(waitReq(isendRetry(staleSc, big, bigN, 0), NULL, 10) == ncclxRemoteError);

  /* The silent one is dropped after the hello timeout (checked once: it takes 10 s). */
  if (nsocks == 1) {
    double end = now() + 15;
    while (!logHas("no hello within") && now() < end) {
      void* other = NULL;
      CHECK(net->accept(lc, &other) == ncclxSuccess && other == NULL);
      usleep(20000);
    }
    CHECK(logHas("no hello within"));
    CHECK(closedByPeer(silent, 5));
  }

  writeAll(toChild, "x", 1);
  CHECK(reap(pid, 30) == 0);
  close(garbage);
  close(silent);
  CHECK(net->closeSend(staleSc) == ncclxSuccess);
  CHECK(net->closeRecv(rc) == ncclxSuccess);
  CHECK(net->closeListen(lc) == ncclxSuccess);
  CHECK(net->finalize(ctx) == ncclxSuccess);
  close(toChild);
  close(fromChild);
  free(buf);
  free(big);
  printf("strangers nsocks=%d: ok\n", nsocks);
}

/* ---------------------------------------------------------------- killed peers */

#define KILL_BYTES (256 * MIB)
#define STREAM_BYTES (32 * MIB)

/* Streams STREAM_BYTES messages until killed (or 60 s). */
static int endlessSender(int fromParent, int toParent, int nsocks) {
  (void)toParent;
  void* ctx = openNet(nsocks);
  char handle[NCCLX_NET_HANDLE_MAXSIZE];
  readAll(fromParent, handle, sizeof(handle));
  void* sc = connectTo(ctx, handle);
  uint8_t* buf = calloc(1, STREAM_BYTES);
  CHECK(buf);
  double end = now() + 60;
  while (now() < end) waitReq(isendRetry(sc, buf, STREAM_BYTES, 0), NULL, 60);
  return 1;
}

static void testKillSender(int nsocks) {
  void* ctx = openNet(nsocks);
  char handle[NCCLX_NET_HANDLE_MAXSIZE];
  void* lc = NULL;
  CHECK(net->listen(ctx, 0, handle, &lc) == ncclxSuccess);
  int toChild, fromChild;
  pid_t pid = spawn(endlessSender, nsocks, &toChild, &fromChild);
  writeAll(toChild, handle, sizeof(handle));
  void* rc = acceptOne(lc);
  uint8_t* buf = malloc(STREAM_BYTES);
  CHECK(buf);
  CHECK(waitReq(irecvOne(rc, buf, STREAM_BYTES), NULL, 30) == ncclxSuccess);
  void* req = irecvOne(rc, buf, STREAM_BYTES); /* in the middle of this one: */
  logClear();
  kill(pid, SIGKILL);
  CHECK(reap(pid, 10) == 128 + SIGKILL);
  /* What the kernel buffered still arrives (at most a few messages), then the error. */
  double t0 = now();
  ncclxResult_t res = ncclxSuccess;
  for (int i = 0; i < 16 && res == ncclxSuccess; i++) {
    if (i > 0) req = irecvOne(rc, buf, STREAM_BYTES);
    res = waitReq(req, NULL, 10);
  }
  if (res != ncclxRemoteError) fprintf(stderr, "killed sender: test() gave %d\n", (int)res);
  CHECK(res == ncclxRemoteError);
  CHECK(logHas("receive from 127.0.0.1:"));
  printf("killed sender nsocks=%d: receiver got ncclxRemoteError after %.3f s\n", nsocks, now() - t0);
  CHECK(net->closeRecv(rc) == ncclxSuccess);
  CHECK(net->closeListen(lc) == ncclxSuccess);
  CHECK(net->finalize(ctx) == ncclxSuccess);
  close(toChild);
  close(fromChild);
  free(buf);
}

static int idleReceiver(int fromParent, int toParent, int nsocks) {
  void* ctx = openNet(nsocks);
  char handle[NCCLX_NET_HANDLE_MAXSIZE];
  void* lc = NULL;
  CHECK(net->listen(ctx, 0, handle, &lc) == ncclxSuccess);
  writeAll(toParent, handle, sizeof(handle));
  void* rc = acceptOne(lc);
  (void)rc;
  writeAll(toParent, "r", 1);
  char never;
  readAll(fromParent, &never, 1); /* posts nothing; killed while waiting here */
  return 1;
}

static void testKillReceiver(int nsocks) {
  void* ctx = openNet(nsocks);
  int toChild, fromChild;
  pid_t pid = spawn(idleReceiver, nsocks, &toChild, &fromChild);
  char handle[NCCLX_NET_HANDLE_MAXSIZE];
  readAll(fromChild, handle, sizeof(handle));
  void* sc = connectTo(ctx, handle);
  char ready;
  readAll(fromChild, &ready, 1);
  uint8_t* buf = calloc(1, KILL_BYTES);
  CHECK(buf);
  void* req = isendRetry(sc, buf, KILL_BYTES, 0);
  int pfd = -1;
  CHECK(net->getPollFd(sc, &pfd) == ncclxSuccess && pfd >= 0);
  /* Fill the socket buffers: once nobody drains them the poll fd goes quiet (it woke up
   * while the kernel still moved data), and it wakes up again when the peer dies. */
  struct pollfd p = {pfd, POLLIN, 0};
  int quiet = 0;
  for (int i = 0; i < 100 && !quiet; i++) {
    int done = 1;
    CHECK(net->test(req, &done, NULL) == ncclxSuccess && !done);
    quiet = poll(&p, 1, 100) == 0;
  }
  CHECK(quiet);
  logClear();
  kill(pid, SIGKILL);
  CHECK(reap(pid, 10) == 128 + SIGKILL);
  CHECK(poll(&p, 1, 5000) == 1);
  double t0 = now();
  CHECK(waitReq(req, NULL, 10) == ncclxRemoteError);
  CHECK(logHas("send to 127.0.0.1:"));
  printf("killed receiver nsocks=%d: sender got ncclxRemoteError after %.3f s\n", nsocks, now() - t0);
  CHECK(net->closeSend(sc) == ncclxSuccess);
  CHECK(net->finalize(ctx) == ncclxSuccess);
  close(toChild);
  close(fromChild);
  free(buf);
}

/* ---------------------------------------------------------------- configuration, refusal */

static void expectBadConfig(testSection* sec, const char* mention) {
  void* ctx = (void*)1;
  logClear();
  CHECK(initWith(sec, &ctx) == ncclxInvalidUsage);
  CHECK(ctx == NULL);
  if (!logHas(mention)) fprintf(stderr, "log lacks '%s':\n%s", mention, logText);
  CHECK(logHas(mention));
}

static void testConfig(void) {
  testSection s1 = {{"ifname", "nsocks"}, {"lo", "0"}, 2};
  expectBadConfig(&s1, "nsocks = '0' (test.ini:2)");
  testSection s2 = {{"nsocks"}, {"x7"}, 1};
  expectBadConfig(&s2, "nsocks = 'x7' (test.ini:1)");
  testSection s3 = {{"nsocks"}, {"17"}, 1};
  expectBadConfig(&s3, "nsocks");
  testSection s4 = {{"buffer_bytes"}, {"12Q"}, 1};
  expectBadConfig(&s4, "buffer_bytes = '12Q' (test.ini:1)");
  testSection s5 = {{"ifname"}, {"nosuchif0"}, 1};
  expectBadConfig(&s5, "nosuchif0");

  /* An unknown key is a warning; good values are accepted. */
  testSection ok = {{"ifname", "colour", "buffer_bytes", "nsocks"}, {"lo", "blue", "512K", "3"}, 4};
  void* ctx = NULL;
  logClear();
  CHECK(initWith(&ok, &ctx) == ncclxSuccess && ctx);
  CHECK(logHas("colour") && logHas("test.ini:2"));
  int ndev = 0;
  CHECK(net->devices(ctx, &ndev) == ncclxSuccess && ndev == 1);
  ncclxNetProperties_t props;
  CHECK(net->getProperties(ctx, 0, &props) == ncclxSuccess);
  CHECK(strcmp(props.name, "lo") == 0 && props.ptrSupport == NCCLX_PTR_HOST);
  CHECK(props.maxRecvs == 1 && props.speedMbps > 0 && props.maxMessageBytes >= (64 << 20));
  CHECK(props.regIsGlobal == 1 && props.maxComms > 0);
  CHECK(net->getProperties(ctx, 1, &props) != ncclxSuccess);

  /* Connecting to a listener that is gone is a system error, not a hang. */
  char handle[NCCLX_NET_HANDLE_MAXSIZE];
  void* lc = NULL;
  CHECK(net->listen(ctx, 0, handle, &lc) == ncclxSuccess);
  CHECK(((mirrorHandle*)(void*)handle)->nsocks == 3);
  CHECK(net->closeListen(lc) == ncclxSuccess);
  void* sc = NULL;
  ncclxResult_t res = ncclxSuccess;
  double end = now() + 10;
  while (res == ncclxSuccess && !sc && now() < end) res = net->connect(ctx, 0, handle, &sc);
  CHECK(res == ncclxSystemError && sc == NULL);
  char garbage[NCCLX_NET_HANDLE_MAXSIZE] = {0};
  CHECK(net->connect(ctx, 0, garbage, &sc) == ncclxInternalError);
  CHECK(net->finalize(ctx) == ncclxSuccess);

  /* Defaults (first UP interface) initialize too. */
  testSection empty = {{NULL}, {NULL}, 0};
  ctx = NULL;
  CHECK(initWith(&empty, &ctx) == ncclxSuccess && ctx);
  CHECK(net->finalize(ctx) == ncclxSuccess);
  printf("config: ok\n");
}

int main(void) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  signal(SIGPIPE, SIG_DFL); /* the plugin must never raise it */
  CHECK(strcmp(net->name, "socket") == 0 && net->abiVersion == NCCLX_NET_ABI_VERSION);
  testConfig();
  const int socks[] = {1, 4};
  for (int i = 0; i < 2; i++) {
    testData(socks[i]);
    testStrangers(socks[i]);
    testKillSender(socks[i]);
    testKillReceiver(socks[i]);
  }
  printf("test_net_socket: all passed\n");
  return 0;
}
