/* The shared-memory transport through its plugin ABI only, between two processes (fork),
 * with a stub environment: byte-exact data at many sizes, 32 in flight, ordering, receives
 * larger and smaller than sends, messages out of mapped ncclxMemAlloc buffers, a wrong nonce,
 * a peer killed mid-transfer, the doorbell, and
 * no /dev/shm leftovers; in both single_copy = cma and none. Prints (does not assert) latency
 * and bandwidth; `test_net_shm perf` runs only those measurements. SHM_TEST_TRACE=1 shows
 * the transport's TRACE lines. */
#include <dirent.h>
#include <errno.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "transport/shm/net_shm.h"
#include "transport/shm/shm_internal.h" /* SHM_ARM_IDLE */

static const ncclxNet_t* N = &ncclxNetShm;
static int failures;
static const char* role = "parent";
static pid_t children[64];
static int nchildren;

#define CHECK(cond, ...)                                                                \
  do {                                                                                  \
    if (!(cond)) {                                                                      \
      fprintf(stderr, "[%s %d] FAIL %s:%d: ", role, (int)getpid(), __FILE__, __LINE__); \
      fprintf(stderr, __VA_ARGS__);                                                     \
      fprintf(stderr, "\n");                                                            \
      failures++;                                                                       \
    }                                                                                   \
  } while (0)
#define REQUIRE(cond, ...)      \
  do {                          \
    if (!(cond)) {              \
      CHECK(cond, __VA_ARGS__); \
      return;                   \
    }                           \
  } while (0)

static double nowSec(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---- Stub environment ---- */

struct ncclxConfigSection {
  const char* keys[4];
  const char* values[4];
  int n;
};

static void stubLog(ncclxLogLevel_t level, unsigned long subsys, const char* file, int line, const char* fmt,
                    ...) {
  (void)subsys;
  static int trace = -1;
  if (trace < 0) trace = getenv("SHM_TEST_TRACE") != NULL;
  if (level == NCCLX_LOG_TRACE && !trace) return;
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "  [%s %d] %s %s:%d ", role, (int)getpid(),
          level == NCCLX_LOG_WARN   ? "WARN"
          : level == NCCLX_LOG_INFO ? "INFO"
                                    : "TRACE",
          file, line);
  vfprintf(stderr, fmt, ap);
  fprintf(stderr, "\n");
  va_end(ap);
}

static const char* stubGet(const ncclxConfigSection_t* s, const char* key) {
  for (int i = 0; i < s->n; i++)
    if (strcasecmp(s->keys[i], key) == 0) return s->values[i];
  return NULL;
}

static int stubEntry(const ncclxConfigSection_t* s, int index, const char** key, const char** value,
                     const char** where) {
  if (index < 0 || index >= s->n) return 0;
  *key = s->keys[index];
  *value = s->values[index];
  *where = "test:1";
  return 1;
}

static ncclxResult_t stubProfiler(void** e, int type, void* parent, int64_t id, void* data) {
  (void)type, (void)parent, (void)id, (void)data;
  if (e) *e = NULL;
  return ncclxSuccess;
}

static const ncclxConfigApi_t stubConfig = {stubGet, stubEntry};
static struct ncclxConfigSection section;
static ncclxPluginEnv_t env = {NCCLX_PLUGIN_ENV_VERSION, stubLog, &stubConfig, &section, stubProfiler};

static void setMode(const char* singleCopy) {
  section.n = 1;
  section.keys[0] = "single_copy";
  section.values[0] = singleCopy;
}

/* A bad value of any key fails init with ncclxInvalidUsage; good ones pass. */
static void testConfigValues(void) {
  static const struct {
    const char *key, *value;
    int ok;
  } cases[] = {
      {"nontemporal", "always", 1}, {"nontemporal", "Never", 1}, {"nontemporal", "auto", 1},
      {"nontemporal", "sometimes", 0}, {"nontemporal", "", 0},  {"single_copy", "both", 0},
      {"slots", "6", 0},               {"slots", "8", 1},       {"buffer_bytes", "1K", 0},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    section.n = 1;
    section.keys[0] = cases[i].key;
    section.values[0] = cases[i].value;
    void* ctx = NULL;
    ncclxResult_t res = N->init(&ctx, &env);
    CHECK(cases[i].ok ? res == ncclxSuccess : res == ncclxInvalidUsage, "%s = '%s': init result %d",
          cases[i].key, cases[i].value, (int)res);
    if (ctx) N->finalize(ctx);
  }
  section.n = 0;
}

/* ---- Data patterns ---- */

static void fill(void* buf, size_t n, uint64_t seed) {
  uint64_t* w = buf;
  size_t words = n / 8;
  for (size_t i = 0; i < words; i++) w[i] = (i + 1) * 0x9e3779b97f4a7c15ull ^ seed;
  for (size_t i = words * 8; i < n; i++) ((uint8_t*)buf)[i] = (uint8_t)(i * 131u + seed);
}

/* Offset of the first wrong byte, or n. */
static size_t verify(const void* buf, size_t n, uint64_t seed) {
  const uint64_t* w = buf;
  size_t words = n / 8;
  for (size_t i = 0; i < words; i++)
    if (w[i] != ((i + 1) * 0x9e3779b97f4a7c15ull ^ seed)) {
      for (size_t b = i * 8;; b++) {
        uint64_t expect = (i + 1) * 0x9e3779b97f4a7c15ull ^ seed;
        if (((const uint8_t*)buf)[b] != ((const uint8_t*)&expect)[b - i * 8]) return b;
      }
    }
  for (size_t i = words * 8; i < n; i++)
    if (((const uint8_t*)buf)[i] != (uint8_t)(i * 131u + seed)) return i;
  return n;
}

static void* bigAlloc(size_t n) {
  void* p = mmap(NULL, n ? n : 1, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    perror("mmap");
    exit(2);
  }
  memset(p, 0xee, n); /* fault the pages in, and make stale data visible */
  return p;
}

/* ---- Requests ---- */

/* Test until done: spin, then yield, then poll the comm's descriptor. ncclxSuccess with
 * *size set, the transport's error, or ncclxInternalError after timeoutSec. */
static ncclxResult_t waitReq(void* req, size_t* size, int fd, double timeoutSec) {
  double deadline = nowSec() + timeoutSec;
  for (unsigned i = 0;; i++) {
    int done = 0;
    size_t got = 0;
    ncclxResult_t res = N->test(req, &done, &got);
    if (res != ncclxSuccess) return res;
    if (done) {
      if (size) *size = got;
      return ncclxSuccess;
    }
    if (i < 2000) continue;
    if ((i & 255) == 0 && nowSec() > deadline) return ncclxInternalError;
    if (i < 4000 || fd < 0) {
      sched_yield();
      continue;
    }
    struct pollfd p = {.fd = fd, .events = POLLIN};
    poll(&p, 1, 1);
  }
}

static ncclxResult_t sendWait(void* sc, void* buf, size_t n, int fd) {
  void* req = NULL;
  double deadline = nowSec() + 20;
  while (!req) {
    ncclxResult_t res = N->isend(sc, buf, n, 0, NULL, NULL, &req);
    if (res != ncclxSuccess) return res;
    if (!req && nowSec() > deadline) return ncclxInternalError;
  }
  return waitReq(req, NULL, fd, 20);
}

static ncclxResult_t recvWait(void* rc, void* buf, size_t n, size_t* got, int fd) {
  void* req = NULL;
  int tag = 0;
  double deadline = nowSec() + 20;
  while (!req) {
    ncclxResult_t res = N->irecv(rc, 1, &buf, &n, &tag, NULL, NULL, &req);
    if (res != ncclxSuccess) return res;
    if (!req && nowSec() > deadline) return ncclxInternalError;
  }
  return waitReq(req, got, fd, 20);
}

/* ---- Two processes: pipes and connection setup ---- */

typedef struct {
  int in, out; /* pipes to the other process */
  void* ctx;
  void* listen;
  void* send; /* to the other process */
  void* recv; /* from the other process */
  int sendFd, recvFd;
} Peer;

static int readFull(int fd, void* buf, size_t n, int timeoutMs) {
  size_t got = 0;
  while (got < n) {
    struct pollfd p = {.fd = fd, .events = POLLIN};
    if (poll(&p, 1, timeoutMs) <= 0) return -1;
    ssize_t r = read(fd, (char*)buf + got, n - got);
    if (r <= 0) return -1;
    got += (size_t)r;
  }
  return 0;
}

static void sync2(Peer* p) {
  char b = 's';
  if (write(p->out, &b, 1) != 1 || readFull(p->in, &b, 1, 30000) != 0) {
    fprintf(stderr, "[%s] lost the other process\n", role);
    exit(3);
  }
}

/* Both sides listen, swap handles, then connect and accept together. */
static int establish(Peer* p) {
  char mine[NCCLX_NET_HANDLE_MAXSIZE], theirs[NCCLX_NET_HANDLE_MAXSIZE];
  memset(mine, 0, sizeof(mine));
  if (N->init(&p->ctx, &env) != ncclxSuccess) return -1;
  if (N->listen(p->ctx, 0, mine, &p->listen) != ncclxSuccess) return -1;
  if (write(p->out, mine, sizeof(mine)) != (ssize_t)sizeof(mine)) return -1;
  if (readFull(p->in, theirs, sizeof(theirs), 30000) != 0) return -1;
  double deadline = nowSec() + 20;
  while (!p->send || !p->recv) {
    if (!p->send && N->connect(p->ctx, 0, theirs, &p->send) != ncclxSuccess) return -1;
    if (!p->recv && N->accept(p->listen, &p->recv) != ncclxSuccess) return -1;
    if (nowSec() > deadline) return -1;
  }
  N->getPollFd(p->send, &p->sendFd);
  N->getPollFd(p->recv, &p->recvFd);
  return 0;
}

static void teardown(Peer* p) {
  if (p->send) N->closeSend(p->send);
  if (p->recv) N->closeRecv(p->recv);
  if (p->listen) N->closeListen(p->listen);
  if (p->ctx) N->finalize(p->ctx);
  p->send = p->recv = p->listen = p->ctx = NULL;
}

typedef void (*RoleFn)(Peer* p, int isParent, const char* mode);

/* Runs fn in a forked child and in this process, connected both ways. Returns the child's
 * pid through *childPid when asked (the caller then reaps it), else reaps it here. */
static void runPair(const char* mode, RoleFn fn, pid_t* childPid) {
  int p2c[2], c2p[2];
  if (pipe(p2c) || pipe(c2p)) {
    perror("pipe");
    exit(2);
  }
  fflush(stdout);
  fflush(stderr);
  pid_t pid = fork();
  if (pid < 0) {
    perror("fork");
    exit(2);
  }
  Peer p;
  memset(&p, 0, sizeof(p));
  int isParent = pid != 0;
  p.in = isParent ? c2p[0] : p2c[0];
  p.out = isParent ? p2c[1] : c2p[1];
  close(isParent ? c2p[1] : p2c[1]);
  close(isParent ? p2c[0] : c2p[0]);
  if (!isParent) {
    role = "child";
    failures = 0; /* count only the child's own */
  }
  if (establish(&p) != 0) {
    CHECK(0, "connection setup failed (mode %s)", mode);
  } else {
    fn(&p, isParent, mode);
  }
  teardown(&p);
  close(p.in);
  close(p.out);
  if (!isParent) {
    fflush(stderr);
    _exit(failures ? 1 : 0);
  }
  if (nchildren < 64) children[nchildren++] = pid;
  if (childPid) {
    *childPid = pid;
    return;
  }
  int status = 0;
  waitpid(pid, &status, 0);
  CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child failed (mode %s, status 0x%x)", mode, status);
}

/* ---- Scenarios ---- */

static const size_t kSizes[] = {0, 1, 63, 4096, 65536 + 1, (1 << 20) + 3, (size_t)64 << 20};
#define NSIZES (sizeof(kSizes) / sizeof(kSizes[0]))

/* Byte-exact data both ways at every size, receives larger than sends, 32 in flight. */
static void scenarioData(Peer* p, int isParent, const char* mode) {
  int wantMode = strcmp(mode, "none") == 0 ? 2 : 1;
  CHECK(ncclxShmCommMode(p->recv) == wantMode, "receive mode %d, expected %d", ncclxShmCommMode(p->recv),
        wantMode);
  size_t maxSize = kSizes[NSIZES - 1];
  char* buf = bigAlloc(maxSize + 4096);
  /* Parent sends first, then the child; each message exactly sized. */
  for (int dir = 0; dir < 2; dir++) {
    int sending = (dir == 0) == isParent;
    for (size_t i = 0; i < NSIZES; i++) {
      size_t n = kSizes[i];
      uint64_t seed = 1000 * (uint64_t)dir + i;
      if (sending) {
        fill(buf, n, seed);
        CHECK(sendWait(p->send, buf, n, p->sendFd) == ncclxSuccess, "send of %zu bytes failed", n);
      } else {
        memset(buf, 0xee, n + 64);
        size_t got = 12345;
        ncclxResult_t res = recvWait(p->recv, buf, n, &got, p->recvFd);
        CHECK(res == ncclxSuccess, "receive of %zu bytes failed: %d", n, (int)res);
        CHECK(got == n, "received %zu bytes, expected %zu", got, n);
        size_t bad = verify(buf, n, seed);
        CHECK(bad == n, "%zu-byte message differs at byte %zu", n, bad);
        CHECK((uint8_t)buf[n] == 0xee, "%zu-byte message wrote past its end", n);
      }
    }
  }
  /* Receives larger than the sends: the real size is reported. */
  static const size_t small[] = {100, 20000, (1 << 20) + 3};
  for (size_t i = 0; i < 3; i++) {
    if (isParent) {
      fill(buf, small[i], 77 + i);
      CHECK(sendWait(p->send, buf, small[i], p->sendFd) == ncclxSuccess, "send %zu failed", small[i]);
    } else {
      size_t got = 0;
      CHECK(recvWait(p->recv, buf, small[i] * 2 + 1000, &got, p->recvFd) == ncclxSuccess,
            "larger receive failed");
      CHECK(got == small[i], "larger receive reports %zu bytes, expected %zu", got, small[i]);
      CHECK(verify(buf, got, 77 + i) == got, "larger receive of %zu bytes: wrong data", got);
    }
  }
  /* 32 in flight, mixed sizes, tested in scrambled order: each lands in its own buffer. */
  enum { K = NCCLX_NET_MAX_REQUESTS };
  static const size_t mix[] = {1, 100, 5000, 40000, 300000, 0, 16384, 2000000};
  size_t off[K + 1];
  off[0] = 0;
  for (int k = 0; k < K; k++) off[k + 1] = off[k] + ((mix[k % 8] + 4095) & ~(size_t)4095) + 4096;
  REQUIRE(off[K] <= maxSize, "in-flight buffers too large");
  void* reqs[K];
  for (int k = 0; k < K; k++) {
    void* data = buf + off[k];
    size_t n = mix[k % 8];
    reqs[k] = NULL;
    if (isParent)
      fill(data, n, 500 + (uint64_t)k);
    else
      memset(data, 0xee, n);
    ncclxResult_t res = isParent ? N->isend(p->send, data, n, 0, NULL, NULL, &reqs[k])
                                 : N->irecv(p->recv, 1, &data, &n, (int[]){0}, NULL, NULL, &reqs[k]);
    CHECK(res == ncclxSuccess && reqs[k], "posting request %d of %d failed (res %d)", k, K, (int)res);
    if (!reqs[k]) return;
  }
  int left = K, doneFlags[K] = {0};
  double deadline = nowSec() + 20;
  while (left > 0 && nowSec() < deadline) {
    for (int j = 0; j < K; j++) {
      int k = (j * 7 + 3) % K; /* scrambled order */
      if (doneFlags[k]) continue;
      int done = 0;
      size_t got = 0;
      ncclxResult_t res = N->test(reqs[k], &done, &got);
      REQUIRE(res == ncclxSuccess, "request %d failed: %d", k, (int)res);
      if (!done) continue;
      doneFlags[k] = 1;
      left--;
      if (!isParent) {
        CHECK(got == mix[k % 8], "in-flight message %d: %zu bytes, expected %zu", k, got, mix[k % 8]);
        CHECK(verify(buf + off[k], got, 500 + (uint64_t)k) == got,
              "in-flight message %d: wrong data (order?)", k);
      }
    }
  }
  CHECK(left == 0, "%d of %d in-flight requests never completed", left, K);
  munmap(buf, maxSize + 4096);
}

/* Large messages out of the sender's ncclxMemAlloc allocations (ncclxShmMemAlloc) go as one
 * copy from its mapped memory unless single_copy = none: byte-exact at offsets into an
 * allocation, from more allocations than a receiver keeps mapped (SHM_MAP_CACHE, 8, so the
 * first is unmapped and mapped again), and counted alike on both sides. */
/* The sender (parent) decides once its receiver has attached, and tells the child, so both
 * skip or neither does. */
static int mappedUnavailable(Peer* p, int isParent, const char* mode) {
  char skip = 0;
  if (isParent) {
    double deadline = nowSec() + 20;
    while (ncclxShmCommMode(p->send) <= 0 && nowSec() < deadline) usleep(1000);
    skip = strcmp(mode, "none") != 0 && ncclxShmCommMapped(p->send) != 1;
    if (write(p->out, &skip, 1) != 1) exit(3);
    if (skip) printf("  mapped buffers unavailable here (/proc/<pid>/fd or memfd refused): skipped\n");
  } else if (readFull(p->in, &skip, 1, 30000) != 0) {
    fprintf(stderr, "[%s] lost the other process\n", role);
    exit(3);
  }
  return skip;
}

static void scenarioMapped(Peer* p, int isParent, const char* mode) {
  if (mappedUnavailable(p, isParent, mode)) return;
  enum { NSMALL = 10 };
  size_t bigBytes = ((size_t)64 << 20) + 8192, smallBytes = (size_t)256 << 10;
  struct Msg {
    int alloc; /* 0: the big one, k: small one k */
    size_t off, n;
  } msgs[3 + NSMALL + 1] = {{0, 13, 65537}, {0, 4096 + 5, (1 << 20) + 3}, {0, 0, (size_t)64 << 20}};
  for (int k = 1; k <= NSMALL; k++) msgs[2 + k] = (struct Msg){k, (size_t)k * 64, (128 << 10) + (size_t)k};
  msgs[3 + NSMALL] = (struct Msg){1, 7, 200000};
  int nmsgs = 3 + NSMALL + 1;
  char* allocs[1 + NSMALL] = {0};
  char* recvBuf = NULL; /* the receiver's; the sender's aligned scratch for fill() */
  recvBuf = bigAlloc(bigBytes);
  if (isParent) {
    for (int k = 0; k <= NSMALL; k++) {
      allocs[k] = ncclxShmMemAlloc(k ? smallBytes : bigBytes);
      REQUIRE(allocs[k] != NULL, "ncclxShmMemAlloc of %zu bytes failed", k ? smallBytes : bigBytes);
    }
  }
  for (int i = 0; i < nmsgs; i++) {
    size_t n = msgs[i].n;
    uint64_t seed = 3000 + (uint64_t)i;
    if (isParent) {
      char* buf = allocs[msgs[i].alloc] + msgs[i].off; /* misaligned on purpose */
      fill(recvBuf, n, seed);
      memcpy(buf, recvBuf, n);
      CHECK(sendWait(p->send, buf, n, p->sendFd) == ncclxSuccess, "mapped send %d (%zu bytes) failed", i, n);
    } else {
      size_t got = 0;
      recvBuf[n] = (char)0xee;
      CHECK(recvWait(p->recv, recvBuf, n, &got, p->recvFd) == ncclxSuccess, "mapped receive %d failed", i);
      CHECK(got == n && verify(recvBuf, n, seed) == n, "mapped message %d (%zu bytes): wrong data", i, n);
      CHECK((uint8_t)recvBuf[n] == 0xee, "mapped message %d wrote past its end", i);
    }
  }
  long long want = strcmp(mode, "none") != 0 ? nmsgs : 0;
  long long sent = ncclxShmCommMappedMessages(isParent ? p->send : p->recv);
  CHECK(sent == want, "%s %lld messages through mapped buffers, expected %lld (single_copy = %s)",
        isParent ? "sent" : "received", sent, want, mode);
  /* Ranks sharing CPUs (ncclxShmSharedCpus): only messages larger than the ring go mapped,
   * and a message marked as part of an exchange (ncclxShmSendKind), that one only. */
  size_t ring = (size_t)1 << 20, fits = ring, exceeds = ring + 1;
  if (isParent) {
    ncclxShmSharedCpus(p->send, 1);
    fill(recvBuf, exceeds, 77);
    memcpy(allocs[0], recvBuf, exceeds);
    CHECK(sendWait(p->send, allocs[0], fits, p->sendFd) == ncclxSuccess, "send of a ring's worth failed");
    CHECK(sendWait(p->send, allocs[0], exceeds, p->sendFd) == ncclxSuccess, "send beyond the ring failed");
    ncclxShmSendKind(p->send, NCCLX_SHM_SEND_EXCHANGE); /* mapped from 8 KiB */
    CHECK(sendWait(p->send, allocs[0], fits, p->sendFd) == ncclxSuccess, "exchange send failed");
    /* The word covers one message: the next goes through the ring again. */
    CHECK(sendWait(p->send, allocs[0], fits, p->sendFd) == ncclxSuccess, "send after the exchange failed");
    ncclxShmSharedCpus(p->send, 0);
  } else {
    size_t got = 0;
    CHECK(recvWait(p->recv, recvBuf, fits, &got, p->recvFd) == ncclxSuccess && verify(recvBuf, fits, 77) == fits,
          "a ring's worth: wrong data");
    CHECK(recvWait(p->recv, recvBuf, exceeds, &got, p->recvFd) == ncclxSuccess &&
              verify(recvBuf, exceeds, 77) == exceeds,
          "beyond the ring: wrong data");
    for (int k = 0; k < 2; k++)
      CHECK(recvWait(p->recv, recvBuf, fits, &got, p->recvFd) == ncclxSuccess && verify(recvBuf, fits, 77) == fits,
            "exchange %d: wrong data", k);
  }
  want += want ? 2 : 0; /* beyond the ring, and the exchange */
  CHECK(ncclxShmCommMappedMessages(isParent ? p->send : p->recv) == want,
        "with shared CPUs: %lld mapped messages, expected %lld", ncclxShmCommMappedMessages(isParent ? p->send : p->recv),
        want);
  /* With a CPU per rank, messages a slot could hold go mapped too, from 4 KiB
   * (SHM_MAPPED_MIN_BYTES), except the application's sends; with shared CPUs they stay in
   * the slots unless part of an exchange of 8 KiB or more (SHM_EXCHANGE_MAPPED_MIN). */
  enum { COLL = NCCLX_SHM_SEND_COLL, EXCH = NCCLX_SHM_SEND_EXCHANGE, USER = NCCLX_SHM_SEND_USER };
  struct Small {
    size_t n;
    int shared, kind, mapped;
  } smalls[] = {{4095, 0, COLL, 0},  {4096, 0, COLL, 1},  {40000, 0, COLL, 1}, {40000, 0, USER, 0},
                {40000, 0, EXCH, 1}, {40000, 1, COLL, 0}, {8191, 1, EXCH, 0},  {8192, 1, EXCH, 1},
                {40000, 1, EXCH, 1}, {40000, 1, USER, 0}};
  int nsmalls = (int)(sizeof(smalls) / sizeof(smalls[0]));
  /* A message a slot holds goes mapped only from an allocation that a mapped message named
   * lately (the receiver has it mapped): allocs[2]'s last was long ago, so a first message
   * from it goes through the slot and the next ones are mapped. */
  for (int k = -1; k < nsmalls; k++) {
    struct Small first = {40000, 0, COLL, 0}, m = k < 0 ? first : smalls[k];
    uint64_t seed = 90 + (uint64_t)(k + 1);
    if (isParent) {
      ncclxShmSharedCpus(p->send, m.shared);
      if (m.kind) ncclxShmSendKind(p->send, m.kind);
      fill(recvBuf, m.n, seed);
      memcpy(allocs[2] + 3, recvBuf, m.n);
      CHECK(sendWait(p->send, allocs[2] + 3, m.n, p->sendFd) == ncclxSuccess, "small send %d failed", k);
      ncclxShmSharedCpus(p->send, 0);
    } else {
      size_t got = 0;
      CHECK(recvWait(p->recv, recvBuf, m.n, &got, p->recvFd) == ncclxSuccess && got == m.n &&
                verify(recvBuf, m.n, seed) == m.n,
            "small message %d (%zu bytes): wrong data", k, m.n);
    }
    want += want ? m.mapped : 0;
    CHECK(ncclxShmCommMappedMessages(isParent ? p->send : p->recv) == want,
          "small message %d (%zu bytes, shared CPUs %d, send kind %d): %lld mapped messages, expected %lld", k,
          m.n, m.shared, m.kind, ncclxShmCommMappedMessages(isParent ? p->send : p->recv), want);
  }
  /* Cycling through more allocations than a receiver keeps mapped, small messages stop going
   * mapped (each would cost the receiver a new mapping): the second round adds none. */
  long long afterFirst = 0;
  for (int round = 0; round < 2; round++) {
    if (round == 1) afterFirst = ncclxShmCommMappedMessages(isParent ? p->send : p->recv);
    for (int k = 1; k <= NSMALL; k++) {
      if (isParent) {
        memcpy(allocs[k], recvBuf, 4096);
        CHECK(sendWait(p->send, allocs[k], 4096, p->sendFd) == ncclxSuccess, "cycling send %d failed", k);
      } else {
        size_t got = 0;
        CHECK(recvWait(p->recv, recvBuf + 8192, 4096, &got, p->recvFd) == ncclxSuccess && got == 4096,
              "cycling message %d: wrong size", k);
      }
    }
  }
  CHECK(ncclxShmCommMappedMessages(isParent ? p->send : p->recv) == afterFirst,
        "cycling through %d allocations: %lld mapped messages in the second round", NSMALL,
        ncclxShmCommMappedMessages(isParent ? p->send : p->recv) - afterFirst);
  if (isParent) {
    CHECK(ncclxShmMemFree(allocs[0] + 1) == 0, "a pointer inside an allocation was released");
    for (int k = 0; k <= NSMALL; k++) CHECK(ncclxShmMemFree(allocs[k]) == 1, "allocation %d not released", k);
    CHECK(ncclxShmMemFree(allocs[0]) == 0, "an allocation was released twice");
  }
  munmap(recvBuf, bigBytes);
  sync2(p);
}

/* A sender that releases its allocation while a mapped message in it is still unread: the
 * receiver fails with ncclxRemoteError naming the early release, the sender's request fails
 * too, nothing crashes. */
static void scenarioMappedFreed(Peer* p, int isParent, const char* mode) {
  if (mappedUnavailable(p, isParent, mode)) return;
  size_t n = (size_t)1 << 20;
  if (isParent) {
    char* buf = ncclxShmMemAlloc(n);
    REQUIRE(buf != NULL, "ncclxShmMemAlloc failed");
    fill(buf, n, 9);
    /* A large message waits for the receiver's attach to learn the mode: make it go now. */
    double deadline = nowSec() + 10;
    while (ncclxShmCommMode(p->send) <= 0 && nowSec() < deadline) usleep(1000);
    REQUIRE(ncclxShmCommMode(p->send) > 0, "the receiver has not attached within 10 s");
    void* req = NULL;
    CHECK(N->isend(p->send, buf, n, 0, NULL, NULL, &req) == ncclxSuccess && req, "isend failed");
    CHECK(ncclxShmCommMappedMessages(p->send) == 1, "the message did not go as a mapped one");
    CHECK(ncclxShmMemFree(buf) == 1, "release failed");
    sync2(p);
    if (req) CHECK(waitReq(req, NULL, p->sendFd, 20) == ncclxRemoteError, "the send did not fail");
  } else {
    sync2(p);
    char* dst = bigAlloc(n);
    size_t got = 0;
    CHECK(recvWait(p->recv, dst, n, &got, p->recvFd) == ncclxRemoteError,
          "receiving from a released allocation did not fail with ncclxRemoteError");
    munmap(dst, n);
  }
}

/* A receiver sleeping in poll() on its descriptor is woken by the next message. */
static void scenarioDoorbell(Peer* p, int isParent, const char* mode) {
  (void)mode;
  char msg[8] = "wakeup!";
  if (isParent) {
    sync2(p);
    usleep(100 * 1000);
    CHECK(sendWait(p->send, msg, sizeof(msg), p->sendFd) == ncclxSuccess, "doorbell send failed");
    return;
  }
  char got[8] = {0};
  void *req = NULL, *data = got;
  size_t n = sizeof(got);
  REQUIRE(N->irecv(p->recv, 1, &data, &n, (int[]){0}, NULL, NULL, &req) == ncclxSuccess && req,
          "irecv failed");
  int done = 0;
  /* Idle long enough for the transport to arm its doorbell: SHM_ARM_IDLE idle test() calls and
   * SHM_ARM_NS both. On a loaded machine 2 ms alone was sometimes too few calls (the suite
   * at -j2 failed this once: the receiver then slept out poll's 5 s). */
  double until = nowSec() + 0.002;
  for (int polls = 0; (polls < 4 * SHM_ARM_IDLE || nowSec() < until) && !done; polls++)
    N->test(req, &done, NULL);
  REQUIRE(!done, "message arrived before it was sent");
  sync2(p);
  double t0 = nowSec();
  struct pollfd pfd = {.fd = p->recvFd, .events = POLLIN};
  int r = poll(&pfd, 1, 5000);
  double slept = nowSec() - t0;
  CHECK(r == 1 && slept < 2.0, "the doorbell did not wake the receiver (poll %d after %.3f s)", r, slept);
  CHECK(waitReq(req, NULL, p->recvFd, 5) == ncclxSuccess && memcmp(got, msg, 8) == 0,
        "doorbell message lost");
  printf("  doorbell: receiver slept %.1f ms in poll() and woke on the message\n", slept * 1e3);
}

/* Ping-pong latency and streaming bandwidth (printed, not asserted). */
static void scenarioPerf(Peer* p, int isParent, const char* mode) {
  const int iters = 5000, warm = 500;
  uint64_t tiny = 0;
  double t0 = 0;
  for (int i = 0; i < iters + warm; i++) {
    if (i == warm) t0 = nowSec();
    if (isParent) {
      sendWait(p->send, &tiny, 8, -1);
      recvWait(p->recv, &tiny, 8, NULL, -1);
    } else {
      recvWait(p->recv, &tiny, 8, NULL, -1);
      sendWait(p->send, &tiny, 8, -1);
    }
  }
  double lat = (nowSec() - t0) / iters / 2;
  if (isParent) printf("  [%s] 8 B ping-pong: %.3f us one-way\n", mode, lat * 1e6);

  static const size_t sizes[] = {(size_t)1 << 20, (size_t)64 << 20};
  for (int s = 0; s < 2; s++) {
    size_t n = sizes[s];
    int count = s == 0 ? 400 : 12, inflight = s == 0 ? 4 : 2;
    char* buf = bigAlloc(n * (size_t)inflight);
    if (isParent) fill(buf, n, 9);
    sync2(p);
    double start = nowSec();
    void* reqs[4] = {0};
    int posted = 0, finished = 0;
    while (finished < count) {
      while (posted < count && posted - finished < inflight) {
        void* data = buf + (size_t)(posted % inflight) * n;
        size_t len = n;
        void* r = NULL;
        if (isParent)
          N->isend(p->send, data, len, 0, NULL, NULL, &r);
        else
          N->irecv(p->recv, 1, &data, &len, (int[]){0}, NULL, NULL, &r);
        if (!r) break;
        reqs[posted % inflight] = r;
        posted++;
      }
      ncclxResult_t res = waitReq(reqs[finished % inflight], NULL, isParent ? p->sendFd : p->recvFd, 20);
      if (res != ncclxSuccess) {
        CHECK(0, "bandwidth run failed: %d", (int)res);
        break;
      }
      finished++;
    }
    /* The receiver's last completion ends the run: it tells the sender. */
    if (isParent)
      recvWait(p->recv, &tiny, 8, NULL, p->recvFd);
    else
      sendWait(p->send, &tiny, 8, p->sendFd);
    double secs = nowSec() - start;
    if (isParent)
      printf("  [%s] %zu MiB messages: %.2f GB/s\n", mode, n >> 20, (double)n * count / secs / 1e9);
    munmap(buf, n * (size_t)inflight);
  }
}

/* A send larger than the posted receive fails the receiver, and the sender of a message
 * that does not fit the ring (it must wait for the receiver). */
static void scenarioTooBig(Peer* p, int isParent, const char* mode) {
  (void)mode;
  size_t big = (size_t)4 << 20;
  char* buf = bigAlloc(big);
  if (isParent) {
    ncclxResult_t res = sendWait(p->send, buf, big, p->sendFd);
    CHECK(res == ncclxRemoteError, "sender of a too-large message: result %d, expected ncclxRemoteError",
          (int)res);
  } else {
    size_t got = 0;
    ncclxResult_t res = recvWait(p->recv, buf, 100, &got, p->recvFd);
    CHECK(res == ncclxRemoteError, "receiver of a too-large message: result %d, expected ncclxRemoteError",
          (int)res);
    void* req = NULL;
    void* data = buf;
    size_t n = 100;
    res = N->irecv(p->recv, 1, &data, &n, (int[]){0}, NULL, NULL, &req);
    CHECK(res == ncclxRemoteError && !req, "a failed connection accepted another receive");
  }
  /* The small case on the other connection: only the receiver must fail. */
  if (!isParent) {
    char small[200];
    memset(small, 1, sizeof(small));
    CHECK(sendWait(p->send, small, sizeof(small), p->sendFd) == ncclxSuccess, "small send failed");
  } else {
    char small[100];
    CHECK(recvWait(p->recv, small, sizeof(small), NULL, p->recvFd) == ncclxRemoteError,
          "a 200-byte message into a 100-byte receive did not fail");
  }
  munmap(buf, big);
}

/* single_copy = auto, the core's choice per connection (ncclxShmPreferCopy): with double copy
 * a send that the ring holds completes before the receiver posts anything; with CMA it waits
 * for the receiver to read it. Under CMA: every message larger than a slot (512 KiB), and a
 * collective's (kind COLL) of SHM_COLL_CMA_MIN or more (16 KiB here) unless the ranks share
 * CPUs; not one below it (4 KiB), nor the application's own send (kind USER). Data exact
 * every time. */
static void scenarioPreferCopy(Peer* p, int isParent, const char* mode) {
  (void)mode;
  struct {
    size_t n;
    int prefer, kind, shared, waits;
  } cases[] = {{(size_t)512 << 10, 1, NCCLX_SHM_SEND_COLL, 0, 0},
               {16 << 10, 1, NCCLX_SHM_SEND_COLL, 0, 0},
               {(size_t)512 << 10, 0, NCCLX_SHM_SEND_COLL, 0, 1},
               {16 << 10, 0, NCCLX_SHM_SEND_COLL, 0, 1},
               {4 << 10, 0, NCCLX_SHM_SEND_COLL, 0, 0},
               {16 << 10, 0, NCCLX_SHM_SEND_USER, 0, 0},
               {16 << 10, 0, NCCLX_SHM_SEND_COLL, 1, 0}};
  size_t max = (size_t)512 << 10;
  char* buf = bigAlloc(max);
  /* Both sides must agree: the sender learns the mode when the receiver has attached. */
  double until = nowSec() + 5.0;
  while (ncclxShmCommMode(isParent ? p->send : p->recv) == 0 && nowSec() < until) sched_yield();
  int cma = ncclxShmCommMode(isParent ? p->send : p->recv) == 1;
  for (int k = 0; k < (int)(sizeof(cases) / sizeof(cases[0])); k++) {
    size_t n = cases[k].n;
    if (!cases[k].prefer && !cma) break; /* no CMA here: nothing to compare with */
    if (isParent) {
      ncclxShmPreferCopy(p->send, cases[k].prefer);
      ncclxShmSharedCpus(p->send, cases[k].shared);
      ncclxShmSendKind(p->send, cases[k].kind);
      fill(buf, n, 77 + (uint64_t)k);
      void* req = NULL;
      CHECK(N->isend(p->send, buf, n, 0, NULL, NULL, &req) == ncclxSuccess && req, "isend failed");
      int done = 0;
      until = nowSec() + (cases[k].waits ? 0.2 : 5.0);
      while (!done && nowSec() < until) CHECK(N->test(req, &done, NULL) == ncclxSuccess, "test failed");
      if (cases[k].waits)
        CHECK(!done, "case %d: a %zu-byte send completed before the receiver read it", k, n);
      else
        CHECK(done, "case %d: a %zu-byte send did not complete before the receive was posted", k, n);
      sync2(p);
      if (req && !done) CHECK(waitReq(req, NULL, p->sendFd, 20) == ncclxSuccess, "send failed");
    } else {
      sync2(p);
      memset(buf, 0, n);
      size_t got = 0;
      CHECK(recvWait(p->recv, buf, n, &got, p->recvFd) == ncclxSuccess && got == n, "receive failed");
      CHECK(verify(buf, n, 77 + (uint64_t)k) == n, "case %d: data differs", k);
    }
  }
  munmap(buf, max);
}

/* The child stops answering and is killed: the parent's pending operation must fail with
 * ncclxRemoteError within seconds. `which` 0: the parent is sending (CMA waits for the ack,
 * double copy for ring space); 1: the parent is receiving a stream from the child. */
static int killWhich;
static void scenarioKill(Peer* p, int isParent, const char* mode) {
  (void)mode;
  size_t n = (size_t)64 << 20;
  char* buf = bigAlloc(n);
  if (!isParent) {
    sync2(p);
    if (killWhich == 0) {
      for (;;) pause(); /* never receives */
    }
    for (;;) sendWait(p->send, buf, (size_t)1 << 20, p->sendFd); /* streams until killed */
  }
  pid_t child = 0;
  CHECK(readFull(p->in, &child, sizeof(child), 10000) == 0, "no pid from the child");
  sync2(p);
  void* req = NULL;
  ncclxResult_t res;
  if (killWhich == 0) {
    N->isend(p->send, buf, n, 0, NULL, NULL, &req);
    REQUIRE(req, "isend refused");
    int done = 0;
    for (int i = 0; i < 100; i++) N->test(req, &done, NULL);
    CHECK(!done, "a 64 MiB send completed without a receiver");
    kill(child, SIGKILL);
    double t0 = nowSec();
    res = waitReq(req, NULL, p->sendFd, 10);
    printf("  [%s] dead receiver noticed by the sender after %.1f ms\n", mode, (nowSec() - t0) * 1e3);
  } else {
    size_t got = 0;
    for (int i = 0; i < 5; i++)
      CHECK(recvWait(p->recv, buf, n, &got, p->recvFd) == ncclxSuccess, "stream receive failed");
    kill(child, SIGKILL);
    double t0 = nowSec();
    res = ncclxSuccess;
    for (int i = 0; i < 1000 && res == ncclxSuccess; i++) res = recvWait(p->recv, buf, n, &got, p->recvFd);
    printf("  [%s] dead sender noticed by the receiver after %.1f ms\n", mode, (nowSec() - t0) * 1e3);
  }
  CHECK(res == ncclxRemoteError, "pending operation with a killed peer: result %d, expected ncclxRemoteError",
        (int)res);
  munmap(buf, n);
}

/* The child reports its pid before sync in scenarioKill. */
static void scenarioKillWrap(Peer* p, int isParent, const char* mode) {
  if (!isParent) {
    pid_t me = getpid();
    if (write(p->out, &me, sizeof(me)) != (ssize_t)sizeof(me)) _exit(3);
  }
  scenarioKill(p, isParent, mode);
}

static int leftovers(pid_t pid, int print);

/* As with TCP, messages sent before the receiver accepted still arrive after the sender
 * closed; and a connection never accepted leaves no names behind, whichever side closes
 * first. */
static void testEarlyClose(void) {
  void *ctx = NULL, *lc = NULL, *sc = NULL, *rc = NULL;
  char handle[NCCLX_NET_HANDLE_MAXSIZE];
  setMode("cma");
  REQUIRE(N->init(&ctx, &env) == ncclxSuccess, "init failed");
  REQUIRE(N->listen(ctx, 0, handle, &lc) == ncclxSuccess, "listen failed");
  REQUIRE(N->connect(ctx, 0, handle, &sc) == ncclxSuccess && sc, "connect failed");
  for (int i = 0; i < 3; i++) {
    uint64_t v = 100 + (uint64_t)i;
    CHECK(sendWait(sc, &v, sizeof(v), -1) == ncclxSuccess, "early send %d failed", i);
  }
  N->closeSend(sc);
  for (int i = 0; i < 10 && !rc; i++) N->accept(lc, &rc);
  REQUIRE(rc, "a connection whose sender closed early was not accepted");
  for (int i = 0; i < 3; i++) {
    uint64_t v = 0;
    size_t got = 0;
    CHECK(recvWait(rc, &v, sizeof(v), &got, -1) == ncclxSuccess && got == 8 && v == 100 + (uint64_t)i,
          "message %d sent before close: got %zu bytes, value %llu", i, got, (unsigned long long)v);
  }
  uint64_t v = 0;
  double t0 = nowSec();
  CHECK(recvWait(rc, &v, sizeof(v), NULL, -1) == ncclxRemoteError && nowSec() - t0 < 5,
        "a receive after the sender closed did not fail promptly");
  N->closeRecv(rc);

  /* Never accepted: the listener closes first, then the sender. */
  sc = NULL;
  REQUIRE(N->connect(ctx, 0, handle, &sc) == ncclxSuccess && sc, "connect failed");
  CHECK(sendWait(sc, &v, sizeof(v), -1) == ncclxSuccess, "send failed");
  N->closeListen(lc);
  N->closeSend(sc);
  CHECK(leftovers(getpid(), 1) == 0, "names left after listener-then-sender close");

  /* Never accepted: the sender closes first (names stay for the receiver), then the listener. */
  lc = sc = NULL;
  REQUIRE(N->listen(ctx, 0, handle, &lc) == ncclxSuccess, "listen failed");
  REQUIRE(N->connect(ctx, 0, handle, &sc) == ncclxSuccess && sc, "connect failed");
  CHECK(sendWait(sc, &v, sizeof(v), -1) == ncclxSuccess, "send failed");
  N->closeSend(sc);
  CHECK(leftovers(getpid(), 0) > 0, "the names of an unaccepted connection vanished at closeSend");
  N->closeListen(lc);
  CHECK(leftovers(getpid(), 1) == 0, "names left after sender-then-listener close");
  N->finalize(ctx);
}

/* A handle with a wrong nonce or of a closed listener is refused; the right one works. */
static void testWrongNonce(void) {
  void *ctx = NULL, *lc = NULL, *sc = NULL, *rc = NULL;
  char handle[NCCLX_NET_HANDLE_MAXSIZE], bad[NCCLX_NET_HANDLE_MAXSIZE];
  setMode("auto");
  REQUIRE(N->init(&ctx, &env) == ncclxSuccess, "init failed");
  REQUIRE(N->listen(ctx, 0, handle, &lc) == ncclxSuccess, "listen failed");
  memcpy(bad, handle, sizeof(bad));
  bad[16] ^= 1; /* inside the nonce */
  ncclxResult_t res = N->connect(ctx, 0, bad, &sc);
  CHECK(res != ncclxSuccess && !sc, "connect with a wrong nonce: result %d", (int)res);
  CHECK(N->accept(lc, &rc) == ncclxSuccess && !rc, "accept produced a connection for a wrong nonce");
  CHECK(N->connect(ctx, 0, handle, &sc) == ncclxSuccess && sc, "connect with the right handle failed");
  for (int i = 0; i < 10 && !rc; i++) N->accept(lc, &rc);
  CHECK(rc != NULL, "accept with the right handle failed");
  if (sc) N->closeSend(sc);
  if (rc) N->closeRecv(rc);
  N->closeListen(lc);
  sc = NULL;
  res = N->connect(ctx, 0, handle, &sc);
  CHECK(res == ncclxRemoteError && !sc, "connect to a closed listener: result %d", (int)res);
  N->finalize(ctx);
}

/* Names in /dev/shm created by pid. */
static int leftovers(pid_t pid, int print) {
  char prefix[32];
  snprintf(prefix, sizeof(prefix), "ncclx-%d-", (int)pid);
  DIR* d = opendir("/dev/shm");
  if (!d) return 0;
  int n = 0;
  struct dirent* e;
  while ((e = readdir(d)) != NULL)
    if (strncmp(e->d_name, prefix, strlen(prefix)) == 0) {
      n++;
      if (print) fprintf(stderr, "  leftover /dev/shm/%s\n", e->d_name);
    }
  closedir(d);
  return n;
}

int main(int argc, char** argv) {
  int perfOnly = argc > 1 && strcmp(argv[1], "perf") == 0; /* just the numbers */
  setvbuf(stdout, NULL, _IONBF, 0);
  signal(SIGPIPE, SIG_IGN);
  if (access("/dev/shm", W_OK) != 0) {
    printf("SKIP: /dev/shm is not writable\n");
    return 77;
  }
  if (perfOnly) {
    setMode("auto");
    runPair("auto", scenarioPerf, NULL);
    setMode("none");
    runPair("none", scenarioPerf, NULL);
    return failures ? 1 : 0;
  }
  testConfigValues();
  testWrongNonce();
  testEarlyClose();

  static const char* modes[] = {"cma", "none"};
  for (int m = 0; m < 2; m++) {
    setMode(modes[m]);
    if (m == 0) { /* is CMA allowed here at all? */
      void* ctx = NULL;
      if (N->init(&ctx, &env) != ncclxSuccess) {
        printf("  single_copy = cma unavailable here: testing auto instead\n");
        modes[0] = "auto";
        setMode("auto");
      } else {
        N->finalize(ctx);
      }
    }
    printf("mode %s: data\n", modes[m]);
    runPair(modes[m], scenarioData, NULL);
    printf("mode %s: doorbell\n", modes[m]);
    runPair(modes[m], scenarioDoorbell, NULL);
    printf("mode %s: too large\n", modes[m]);
    runPair(modes[m], scenarioTooBig, NULL);
    printf("mode %s: mapped ncclxMemAlloc buffers\n", modes[m]);
    runPair(modes[m], scenarioMapped, NULL);
    if (strcmp(modes[m], "none") != 0) {
      printf("mode %s: mapped buffer released too early\n", modes[m]);
      runPair(modes[m], scenarioMappedFreed, NULL);
    }
    if (strcmp(modes[m], "none") != 0) {
      setMode("auto");
      printf("mode auto: double copy preferred, then not\n");
      runPair("auto", scenarioPreferCopy, NULL);
      setMode(modes[m]);
    }
    printf("mode %s: performance\n", modes[m]);
    runPair(modes[m], scenarioPerf, NULL);
    for (killWhich = 0; killWhich < 2; killWhich++) {
      printf("mode %s: killed %s\n", modes[m], killWhich ? "sender" : "receiver");
      pid_t child = 0;
      runPair(modes[m], scenarioKillWrap, &child);
      int status = 0;
      waitpid(child, &status, 0);
      CHECK(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL, "killed child: status 0x%x", status);
      /* Its listen segment stays behind; the next init removes it. */
      int before = leftovers(child, 0);
      void* ctx = NULL;
      CHECK(N->init(&ctx, &env) == ncclxSuccess, "init failed");
      if (ctx) N->finalize(ctx);
      CHECK(before > 0, "the killed child's listen segment was not in /dev/shm (test broken?)");
      CHECK(leftovers(child, 1) == 0, "init did not remove the killed child's objects");
    }
  }
  /* Other ring layouts than the default 16 slots: many small ones and a few large ones. */
  static const char* slotCounts[] = {"64", "4"};
  for (int i = 0; i < 2; i++) {
    setMode("none");
    section.keys[1] = "slots";
    section.values[1] = slotCounts[i];
    section.n = 2;
    printf("mode none, %s slots: data\n", slotCounts[i]);
    runPair("none", scenarioData, NULL);
  }
  CHECK(leftovers(getpid(), 1) == 0, "this process left objects in /dev/shm");
  for (int i = 0; i < nchildren; i++)
    CHECK(leftovers(children[i], 1) == 0, "child %d left objects in /dev/shm", (int)children[i]);
  if (failures) {
    printf("FAILED: %d check(s)\n", failures);
    return 1;
  }
  printf("OK\n");
  return 0;
}
