/* Bootstrap unit test: each scenario forks processes that rendezvous on one unique id
 * (on this host) and checks init, all-gather, tagged send/recv, barriers, views, refusal of
 * strangers, missing ranks, and abort notices. Children report through their exit code. */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bootstrap/bootstrap.h"
#include "util/debug.h"

static int gRank = -1; /* for failure messages */

#define CHECK(cond, ...)                                                          \
  do {                                                                            \
    if (!(cond)) {                                                                \
      fprintf(stderr, "FAIL %s:%d (rank %d): ", __FILE__, __LINE__, gRank);       \
      fprintf(stderr, __VA_ARGS__);                                               \
      fprintf(stderr, "\n");                                                      \
      return 1;                                                                   \
    }                                                                             \
  } while (0)
#define CHECK_OK(call)                                                                               \
  do {                                                                                               \
    ncclxResult_t res_ = (call);                                                                     \
    CHECK(res_ == ncclxSuccess, "%s returned %d: %s", #call, (int)res_, ncclxThreadLastError());     \
  } while (0)

static double nowSec(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void sleepMs(int ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

/* ---------------- process runner ---------------- */

typedef int (*procFn)(int proc, void* arg);

/* Fork nproc children running fn(proc, arg); wait at most limitSec, killing late ones.
 * codes[i] gets the exit code (or 128 + signal). Returns 0 if all ended in time. */
static int runProcs(const char* name, int nproc, procFn fn, void* arg, double limitSec, int* codes) {
  pid_t pids[16];
  fflush(NULL);
  for (int i = 0; i < nproc; i++) {
    pids[i] = fork();
    if (pids[i] < 0) {
      perror("fork");
      return -1;
    }
    if (pids[i] == 0) {
      gRank = i;
      ncclxLogSetRank(i);
      /* exit, not _exit: under ASan the leak check then covers the children too. */
      exit(fn(i, arg));
    }
    codes[i] = -1;
  }
  double deadline = nowSec() + limitSec;
  int left = nproc, overrun = 0;
  while (left > 0) {
    for (int i = 0; i < nproc; i++) {
      int status;
      if (codes[i] != -1 || waitpid(pids[i], &status, WNOHANG) != pids[i]) continue;
      codes[i] = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      left--;
    }
    if (left > 0 && nowSec() > deadline) {
      fprintf(stderr, "FAIL %s: %d process(es) still running after %.0f s, killing them\n", name, left, limitSec);
      for (int i = 0; i < nproc; i++)
        if (codes[i] == -1) kill(pids[i], SIGKILL);
      overrun = 1;
      deadline = nowSec() + 1e9;
    }
    if (left > 0) sleepMs(10);
  }
  return overrun ? -1 : 0;
}

/* Run and require every process to exit 0. */
static int runAll(const char* name, int nproc, procFn fn, void* arg, double limitSec) {
  int codes[16];
  double t0 = nowSec();
  int bad = runProcs(name, nproc, fn, arg, limitSec, codes) != 0;
  for (int i = 0; i < nproc; i++)
    if (codes[i] != 0) {
      fprintf(stderr, "FAIL %s: process %d exited with %d\n", name, i, codes[i]);
      bad = 1;
    }
  printf("%-40s %s (%.2f s)\n", name, bad ? "FAILED" : "ok", nowSec() - t0);
  return bad;
}

/* ---------------- helpers ---------------- */

struct scenario {
  ncclxUniqueId id;
  int nranks;
  double timeout;
  char hostport[64];
  struct sockaddr_in rootAddr; /* when hostport was used */
};

static int freePort(void) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t len = sizeof(a);
  if (fd < 0 || bind(fd, (struct sockaddr*)&a, sizeof(a)) != 0 || getsockname(fd, (struct sockaddr*)&a, &len) != 0) {
    perror("freePort");
    exit(1);
  }
  close(fd);
  return ntohs(a.sin_port);
}

/* An id at 127.0.0.1:<free port>, made from the string like NCCLX_COMM_ID would be. */
static int scenarioFromString(struct scenario* s, int nranks, double timeout) {
  memset(s, 0, sizeof(*s));
  int port = freePort();
  snprintf(s->hostport, sizeof(s->hostport), "127.0.0.1:%d", port);
  s->rootAddr.sin_family = AF_INET;
  s->rootAddr.sin_port = htons((uint16_t)port);
  s->rootAddr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  s->nranks = nranks;
  s->timeout = timeout;
  return bootstrapIdFromString(s->hostport, &s->id) == ncclxSuccess ? 0 : 1;
}

static int scenarioFromUniqueId(struct scenario* s, int nranks, double timeout) {
  memset(s, 0, sizeof(*s));
  s->nranks = nranks;
  s->timeout = timeout;
  return bootstrapGetUniqueId(&s->id) == ncclxSuccess ? 0 : 1;
}

/* Connect with retries until the listener is there. Returns fd or -1. */
static int connectRetry(const struct sockaddr* sa, socklen_t len, double timeoutSec) {
  double deadline = nowSec() + timeoutSec;
  while (nowSec() < deadline) {
    int fd = socket(sa->sa_family, SOCK_STREAM, 0);
    if (fd >= 0 && connect(fd, sa, len) == 0) return fd;
    if (fd >= 0) close(fd);
    sleepMs(20);
  }
  return -1;
}

/* 1 if the other side closed (or reset) the connection within timeoutSec. */
static int closedByPeer(int fd, double timeoutSec) {
  double deadline = nowSec() + timeoutSec;
  char buf[256];
  while (nowSec() < deadline) {
    struct pollfd p = {fd, POLLIN, 0};
    if (poll(&p, 1, 50) <= 0) continue;
    ssize_t n = recv(fd, buf, sizeof(buf), 0);
    if (n == 0 || (n < 0 && errno == ECONNRESET)) return 1;
  }
  return 0;
}

static int sendBytes(int fd, const void* data, size_t size) {
  return send(fd, data, size, MSG_NOSIGNAL) == (ssize_t)size ? 0 : -1;
}

/* White-box copies of the private wire headers in bootstrap.c, to forge messages that look
 * right but carry the wrong job secret. Keep in sync with bootstrap.c. */
struct forgedHello {
  uint32_t magic; /* HELLO_MAGIC */
  int32_t rank;
  uint64_t secret;
  int32_t nranks;
  uint32_t reserved;
  uint8_t addr[24];
};
struct forgedMsg {
  uint32_t magic; /* MSG_MAGIC */
  uint32_t kind;
  uint64_t secret, tagSpace, seq, size;
  int32_t src;
  uint32_t tag;
};
#define FORGED_HELLO_MAGIC 0x4e58484cu
#define FORGED_MSG_MAGIC 0x4e584d53u

/* ---------------- scenario: the basics for N ranks ---------------- */

struct viewThreadArg {
  struct bootstrap* b;
  int* values;
  int fill;
  ncclxResult_t res;
};

static void* viewAllGatherThread(void* p) {
  struct viewThreadArg* a = p;
  int n = bootstrapNranks(a->b);
  for (int i = 0; i < n; i++) a->values[i] = -1;
  a->values[bootstrapRank(a->b)] = a->fill;
  a->res = bootstrapAllGather(a->b, a->values, sizeof(int), 50);
  return NULL;
}

static int basicRank(int rank, void* arg) {
  const struct scenario* s = arg;
  int n = s->nranks;
  struct bootstrap* b = NULL;
  CHECK_OK(bootstrapInit(&s->id, rank, n, s->timeout, &b));
  CHECK(bootstrapRank(b) == rank && bootstrapNranks(b) == n, "rank/nranks %d/%d", bootstrapRank(b),
        bootstrapNranks(b));
  CHECK(bootstrapPollFd(b) >= 0, "no poll fd");
  CHECK(bootstrapHostname()[0] != '\0' && bootstrapHostname() == bootstrapHostname(), "hostname");

  /* All-gather of small slots, then of 64 KiB slots (several rounds exceed socket buffers). */
  int64_t small[8];
  for (int i = 0; i < n; i++) small[i] = -1;
  small[rank] = rank * 1000 + 7;
  CHECK_OK(bootstrapAllGather(b, small, sizeof(small[0]), 10));
  for (int i = 0; i < n; i++) CHECK(small[i] == i * 1000 + 7, "allgather slot %d = %lld", i, (long long)small[i]);
  size_t big = 64 * 1024;
  unsigned char* all = calloc((size_t)n, big);
  CHECK(all != NULL, "oom");
  for (size_t j = 0; j < big; j++) all[(size_t)rank * big + j] = (unsigned char)(rank * 31 + j * 7);
  CHECK_OK(bootstrapAllGather(b, all, big, 11));
  for (int i = 0; i < n; i++)
    for (size_t j = 0; j < big; j++)
      CHECK(all[(size_t)i * big + j] == (unsigned char)(i * 31 + j * 7), "big allgather slot %d byte %zu", i, j);
  free(all);

  /* Tags out of order: send tag 2 then 1, receive 1 then 2 (to self when alone). Same tag: FIFO. */
  int to = (rank + 1) % n, from = (rank - 1 + n) % n;
  int two = 200 + rank, one = 100 + rank, got = 0;
  CHECK_OK(bootstrapSend(b, to, 2, &two, sizeof(two)));
  CHECK_OK(bootstrapSend(b, to, 1, &one, sizeof(one)));
  for (int k = 0; k < 3; k++) {
    int v = rank * 10 + k;
    CHECK_OK(bootstrapSend(b, to, 3, &v, sizeof(v)));
  }
  CHECK_OK(bootstrapRecv(b, from, 1, &got, sizeof(got), NULL));
  CHECK(got == 100 + from, "tag 1 got %d", got);
  CHECK_OK(bootstrapRecv(b, from, 2, &got, sizeof(got), NULL));
  CHECK(got == 200 + from, "tag 2 got %d", got);
  for (int k = 0; k < 3; k++) {
    CHECK_OK(bootstrapRecv(b, from, 3, &got, sizeof(got), NULL));
    CHECK(got == from * 10 + k, "tag 3 message %d got %d", k, got);
  }
  /* Every rank sends 8 MiB before receiving: more than the socket buffers hold, so senders
   * must keep draining their own listener while they wait. */
  size_t huge = 8u << 20;
  unsigned char* out = malloc(huge);
  unsigned char* in = malloc(huge);
  CHECK(out && in, "oom");
  for (size_t j = 0; j < huge; j++) out[j] = (unsigned char)(rank + j);
  CHECK_OK(bootstrapSend(b, to, 4, out, huge));
  CHECK_OK(bootstrapRecv(b, from, 4, in, huge, NULL));
  for (size_t j = 0; j < huge; j++) CHECK(in[j] == (unsigned char)(from + j), "8 MiB message byte %zu", j);
  free(out);
  free(in);
  /* Size mismatch is an internal error naming peer and tag. */
  int64_t eight = 8;
  CHECK_OK(bootstrapSend(b, to, 77, &eight, sizeof(eight)));
  int32_t four;
  ncclxResult_t res = bootstrapRecv(b, from, 77, &four, sizeof(four), NULL);
  char expectPeer[32];
  snprintf(expectPeer, sizeof(expectPeer), "rank %d", from);
  CHECK(res == ncclxInternalError, "size mismatch returned %d", (int)res);
  CHECK(strstr(ncclxThreadLastError(), "tag 77") && strstr(ncclxThreadLastError(), expectPeer),
        "size mismatch message: %s", ncclxThreadLastError());
  CHECK_OK(bootstrapBarrier(b, 12));

  /* Bad view arguments. */
  int everyone[8];
  for (int i = 0; i < n; i++) everyone[i] = i;
  struct bootstrap* bad = NULL;
  CHECK(bootstrapView(b, everyone, n, rank, 0, &bad) == ncclxInvalidArgument, "tag space 0 accepted");
  if (n > 1) CHECK(bootstrapView(b, everyone, n, (rank + 1) % n, 5, &bad) == ncclxInvalidArgument, "wrong myRank");
  struct bootstrap* whole = NULL;
  CHECK_OK(bootstrapView(b, everyone, n, rank, 0x5157, &whole));
  CHECK(bootstrapView(b, everyone, n, rank, 0x5157, &bad) == ncclxInvalidUsage, "duplicate tag space accepted");
  CHECK_OK(bootstrapBarrier(whole, 12));
  bootstrapRelease(whole);

  /* The odd ranks form a view and all-gather on it (tag 50) while, in another thread, every
   * rank all-gathers on the root with the same tag: the two must not mix. */
  int members[8], k = 0;
  for (int i = 1; i < n; i += 2) members[k++] = i;
  struct bootstrap* odd = NULL;
  int viewValues[8], rootValues[8];
  pthread_t thread;
  struct viewThreadArg va = {0};
  if (rank % 2 == 1) {
    CHECK_OK(bootstrapView(b, members, k, rank / 2, 0x0dd0dd, &odd));
    CHECK(bootstrapRank(odd) == rank / 2 && bootstrapNranks(odd) == k, "view rank");
    va = (struct viewThreadArg){odd, viewValues, 5000 + rank, ncclxSuccess};
    CHECK(pthread_create(&thread, NULL, viewAllGatherThread, &va) == 0, "pthread_create");
  }
  for (int i = 0; i < n; i++) rootValues[i] = -1;
  rootValues[rank] = 7000 + rank;
  CHECK_OK(bootstrapAllGather(b, rootValues, sizeof(int), 50));
  for (int i = 0; i < n; i++) CHECK(rootValues[i] == 7000 + i, "root allgather slot %d = %d", i, rootValues[i]);
  if (odd) {
    pthread_join(thread, NULL);
    CHECK(va.res == ncclxSuccess, "view allgather: %d", (int)va.res);
    for (int i = 0; i < k; i++)
      CHECK(viewValues[i] == 5000 + members[i], "view slot %d = %d", i, viewValues[i]);
  }
  CHECK_OK(bootstrapBarrier(b, 13));
  /* The view outlives the root handle (reference counted). */
  bootstrapRelease(b);
  if (odd) {
    CHECK_OK(bootstrapBarrier(odd, 14));
    va.fill = 9000 + rank;
    viewAllGatherThread(&va);
    CHECK(va.res == ncclxSuccess, "view allgather after root release");
    for (int i = 0; i < k; i++) CHECK(viewValues[i] == 9000 + members[i], "view slot %d = %d", i, viewValues[i]);
    bootstrapRelease(odd);
  }
  return 0;
}

/* ---------------- scenario: strangers ---------------- */

/* Process 0..2 are ranks (1 and 2 start late); process 3 harasses the root during init. */
static int strangerAtInitProc(int proc, void* arg) {
  const struct scenario* s = arg;
  if (proc < 3) {
    if (proc > 0) sleepMs(1500);
    struct bootstrap* b = NULL;
    CHECK_OK(bootstrapInit(&s->id, proc, 3, s->timeout, &b));
    int v[3] = {-1, -1, -1};
    v[proc] = proc + 40;
    CHECK_OK(bootstrapAllGather(b, v, sizeof(int), 1));
    for (int i = 0; i < 3; i++) CHECK(v[i] == i + 40, "slot %d = %d", i, v[i]);
    bootstrapRelease(b);
    return 0;
  }
  const struct sockaddr* root = (const struct sockaddr*)&s->rootAddr;
  /* Plain garbage. */
  int fd = connectRetry(root, sizeof(s->rootAddr), 3.0);
  CHECK(fd >= 0, "stranger could not connect to the root");
  const char junk[] = "GET / HTTP/1.0\r\n\r\n0123456789012345678901234567890123456789";
  CHECK(sendBytes(fd, junk, sizeof(junk)) == 0, "send");
  CHECK(closedByPeer(fd, 1.0), "root did not refuse garbage within 1 s");
  close(fd);
  /* A well-formed hello of another job (wrong secret). */
  fd = connectRetry(root, sizeof(s->rootAddr), 1.0);
  struct forgedHello h = {FORGED_HELLO_MAGIC, 1, 0x1234, 3, 0, {0}};
  CHECK(fd >= 0 && sendBytes(fd, &h, sizeof(h)) == 0, "hello send");
  CHECK(closedByPeer(fd, 1.0), "root did not refuse a wrong secret within 1 s");
  close(fd);
  /* A truncated hello, and a silent connection that just closes. */
  fd = connectRetry(root, sizeof(s->rootAddr), 1.0);
  CHECK(fd >= 0 && sendBytes(fd, &h, 6) == 0, "partial send");
  close(fd);
  fd = connectRetry(root, sizeof(s->rootAddr), 1.0);
  CHECK(fd >= 0, "connect");
  close(fd);
  return 0;
}

/* After init, every rank writes junk to the next rank's listener; everything keeps working. */
static int strangerLaterRank(int rank, void* arg) {
  const struct scenario* s = arg;
  int n = s->nranks;
  struct bootstrap* b = NULL;
  CHECK_OK(bootstrapInit(&s->id, rank, n, s->timeout, &b));
  struct sockaddr_storage addrs[8];
  socklen_t len = sizeof(addrs[rank]);
  CHECK(getsockname(bootstrapPollFd(b), (struct sockaddr*)&addrs[rank], &len) == 0, "getsockname");
  CHECK_OK(bootstrapAllGather(b, addrs, sizeof(addrs[0]), 1));
  const struct sockaddr* next = (const struct sockaddr*)&addrs[(rank + 1) % n];
  socklen_t nextLen = next->sa_family == AF_INET6 ? sizeof(struct sockaddr_in6) : sizeof(struct sockaddr_in);

  int junkFd = connectRetry(next, nextLen, 1.0);
  char junk[100];
  memset(junk, 0xab, sizeof(junk));
  CHECK(junkFd >= 0 && sendBytes(junkFd, junk, sizeof(junk)) == 0, "junk");
  int secretFd = connectRetry(next, nextLen, 1.0);
  struct forgedMsg m = {FORGED_MSG_MAGIC, 1, 0x4242, 0, 1, 4, 0, 2};
  CHECK(secretFd >= 0 && sendBytes(secretFd, &m, sizeof(m)) == 0 && sendBytes(secretFd, "abcd", 4) == 0, "forged");
  int truncFd = connectRetry(next, nextLen, 1.0);
  CHECK(truncFd >= 0 && sendBytes(truncFd, &m, 10) == 0, "truncated");
  close(truncFd);
  /* A huge size in a header from a stranger must not make the rank allocate it. */
  int hugeFd = connectRetry(next, nextLen, 1.0);
  struct forgedMsg huge = m;
  huge.size = UINT64_MAX / 4;
  CHECK(hugeFd >= 0 && sendBytes(hugeFd, &huge, sizeof(huge)) == 0, "huge");

  CHECK_OK(bootstrapBarrier(b, 2)); /* every rank progresses its listener */
  int v = rank, got = -1;
  CHECK_OK(bootstrapSend(b, (rank + 1) % n, 3, &v, sizeof(v)));
  CHECK_OK(bootstrapRecv(b, (rank - 1 + n) % n, 3, &got, sizeof(got), NULL));
  CHECK(got == (rank - 1 + n) % n, "got %d", got);
  CHECK(closedByPeer(junkFd, 2.0), "junk connection was not refused");
  CHECK(closedByPeer(secretFd, 2.0), "wrong-secret message was not refused");
  CHECK(closedByPeer(hugeFd, 2.0), "huge message from a stranger was not refused");
  close(junkFd);
  close(secretFd);
  close(hugeFd);
  CHECK_OK(bootstrapBarrier(b, 4));
  bootstrapRelease(b);
  return 0;
}

/* Rank 1 joins twice (the second is a duplicate): the root refuses it and completes init with
 * the genuine ranks. */
static int duplicateProc(int proc, void* arg) {
  const struct scenario* s = arg;
  static const int rankOf[4] = {0, 1, 1, 2}, delayMs[4] = {0, 0, 1000, 2000};
  sleepMs(delayMs[proc]);
  struct bootstrap* b = NULL;
  ncclxResult_t res = bootstrapInit(&s->id, rankOf[proc], 3, s->timeout, &b);
  if (proc == 2) {
    CHECK(res != ncclxSuccess && strstr(ncclxThreadLastError(), "duplicate"), "duplicate rank 1: %d %s", (int)res,
          ncclxThreadLastError());
    return 0;
  }
  CHECK_OK(res);
  int v[3] = {0, 0, 0};
  v[rankOf[proc]] = proc + 1;
  CHECK_OK(bootstrapAllGather(b, v, sizeof(int), 1));
  CHECK(v[0] == 1 && v[1] == 2 && v[2] == 4, "table %d %d %d", v[0], v[1], v[2]);
  bootstrapRelease(b);
  return 0;
}

/* Rank 2 says nranks = 4 where the others say 3: the job is misconfigured, and every rank
 * fails at once (well before the 10 s timeout) with a sentence naming both numbers. */
static int wrongNranksProc(int rank, void* arg) {
  const struct scenario* s = arg;
  double t0 = nowSec();
  struct bootstrap* b = NULL;
  ncclxResult_t res = bootstrapInit(&s->id, rank, rank == 2 ? 4 : 3, s->timeout, &b);
  const char* why = ncclxThreadLastError();
  CHECK(res != ncclxSuccess && strstr(why, "nranks=4") && strstr(why, "nranks=3"), "rank %d: %d %s", rank, (int)res,
        why);
  CHECK(nowSec() - t0 < 3.0, "rank %d failed after %.1f s, not at once", rank, nowSec() - t0);
  return 0;
}

/* ---------------- scenario: missing ranks ---------------- */

static int missingRankProc(int rank, void* arg) {
  const struct scenario* s = arg;
  if (rank == 2) return 0; /* never shows up */
  struct bootstrap* b = NULL;
  double t0 = nowSec();
  ncclxResult_t res = bootstrapInit(&s->id, rank, 3, s->timeout, &b);
  double took = nowSec() - t0;
  CHECK(res != ncclxSuccess, "init succeeded without rank 2");
  CHECK(strstr(ncclxThreadLastError(), "rank 2 never connected"), "message: %s", ncclxThreadLastError());
  CHECK(took < s->timeout + (rank == 0 ? 1.5 : 3.0), "took %.2f s with a %.0f s timeout", took, s->timeout);
  return 0;
}

static int missingRootProc(int rank, void* arg) {
  const struct scenario* s = arg;
  if (rank == 0) return 0;
  struct bootstrap* b = NULL;
  double t0 = nowSec();
  ncclxResult_t res = bootstrapInit(&s->id, rank, 2, s->timeout, &b);
  double took = nowSec() - t0;
  CHECK(res != ncclxSuccess, "init succeeded without the root");
  CHECK(strstr(ncclxThreadLastError(), s->hostport), "message does not name %s: %s", s->hostport,
        ncclxThreadLastError());
  CHECK(took < s->timeout + 2.0, "took %.2f s", took);
  return 0;
}

/* ---------------- scenario: aborts and bounded waits ---------------- */

static int abortRank(int rank, void* arg) {
  const struct scenario* s = arg;
  int n = s->nranks;
  struct bootstrap* b = NULL;
  CHECK_OK(bootstrapInit(&s->id, rank, n, s->timeout, &b));
  int all[8];
  for (int i = 0; i < n; i++) all[i] = i;
  struct bootstrap* view = NULL;
  CHECK_OK(bootstrapView(b, all, n, rank, 0xabc, &view));
  char msg[256] = "";
  CHECK(bootstrapPollAbort(b, msg, sizeof(msg)) == 0, "abort before anyone aborted");
  /* Synchronize on the other view: a rank may leave a barrier while others are still in it,
   * and an abort of b would (rightly) fail their pending receives on b. */
  CHECK_OK(bootstrapBarrier(view, 1));
  if (rank == 2) {
    bootstrapBroadcastAbort(b, "rank 2 gives up: injected failure");
    CHECK(bootstrapPollAbort(b, msg, sizeof(msg)) == 0, "own abort seen");
  } else {
    double deadline = nowSec() + 5.0;
    int seen = 0;
    while (!seen && nowSec() < deadline) {
      struct pollfd p = {bootstrapPollFd(b), POLLIN, 0};
      poll(&p, 1, 100);
      seen = bootstrapPollAbort(b, msg, sizeof(msg));
    }
    CHECK(seen, "no abort notice within 5 s");
    CHECK(strcmp(msg, "rank 2 gives up: injected failure") == 0, "abort text '%s'", msg);
    CHECK(bootstrapPollAbort(b, NULL, 0) == 1, "abort not sticky");
    CHECK(bootstrapPollAbort(view, msg, sizeof(msg)) == 0, "abort leaked into another view");
    /* A receive on the aborted view fails at once, with the notice. */
    int x;
    double t0 = nowSec();
    ncclxResult_t res = bootstrapRecv(b, (rank + 1) % n, 99, &x, sizeof(x), NULL);
    CHECK(res == ncclxRemoteError && strstr(ncclxThreadLastError(), "injected failure") && nowSec() - t0 < 1.0,
          "recv after abort: %d %s", (int)res, ncclxThreadLastError());
  }
  /* The other view still works. */
  CHECK_OK(bootstrapBarrier(view, 2));
  bootstrapRelease(view);
  bootstrapRelease(b);
  return 0;
}

static volatile int gAbortFlag;
static void* raiseAbortFlag(void* p) {
  (void)p;
  sleepMs(300);
  gAbortFlag = 1;
  return NULL;
}

static int boundedWaitRank(int rank, void* arg) {
  const struct scenario* s = arg;
  struct bootstrap* b = NULL;
  CHECK_OK(bootstrapInit(&s->id, rank, 2, s->timeout, &b));
  if (rank == 0) {
    int x;
    pthread_t t;
    pthread_create(&t, NULL, raiseAbortFlag, NULL);
    double t0 = nowSec();
    ncclxResult_t res = bootstrapRecv(b, 1, 9, &x, sizeof(x), &gAbortFlag);
    pthread_join(t, NULL);
    CHECK(res != ncclxSuccess && nowSec() - t0 < 1.5, "abort flag: %d after %.2f s", (int)res, nowSec() - t0);
    t0 = nowSec();
    res = bootstrapRecv(b, 1, 9, &x, sizeof(x), NULL);
    double took = nowSec() - t0;
    CHECK(res == ncclxRemoteError && strstr(ncclxThreadLastError(), "tag 9"), "timeout: %d %s", (int)res,
          ncclxThreadLastError());
    CHECK(took > s->timeout - 0.2 && took < s->timeout + 2.0, "timed out after %.2f s", took);
    CHECK(bootstrapSend(b, 5, 1, &x, sizeof(x)) == ncclxInvalidArgument, "bad peer accepted");
  }
  bootstrapRelease(b);
  return 0;
}

/* ---------------- ids (in the parent) ---------------- */

static int idTests(void) {
  ncclxUniqueId a, b;
  CHECK_OK(bootstrapIdFromString("127.0.0.1:29500", &a));
  CHECK_OK(bootstrapIdFromString("127.0.0.1:29500", &b));
  CHECK(memcmp(&a, &b, sizeof(a)) == 0 && bootstrapIdSecret(&a) != 0, "same string, different ids");
  CHECK_OK(bootstrapIdFromString("127.0.0.1:29501", &b));
  CHECK(bootstrapIdSecret(&a) != bootstrapIdSecret(&b), "different strings, same secret");
  CHECK_OK(bootstrapIdFromString("[::1]:29500", &b));
  CHECK_OK(bootstrapIdFromString("localhost:80", &b));
  static const char* bad[] = {"", "nohost", "1.2.3.4:", "1.2.3.4:0", "1.2.3.4:99999", "1.2.3.4:12x",
                              ":5000", "::1:5000", "[::1:5000", "[::1]5000", "no.such.host.invalid:5000"};
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
    ncclxResult_t res = bootstrapIdFromString(bad[i], &b);
    CHECK(res == ncclxInvalidArgument, "\"%s\" accepted (%d)", bad[i], (int)res);
    char quoted[80];
    snprintf(quoted, sizeof(quoted), "\"%s\"", bad[i]);
    CHECK(strstr(ncclxThreadLastError(), quoted), "message for %s does not quote it: %s", quoted,
          ncclxThreadLastError());
  }
  CHECK(bootstrapIdFromString(NULL, &b) == ncclxInvalidArgument, "NULL string");
  /* NCCLX_COMM_ID wins over a fresh address. */
  setenv("NCCLX_COMM_ID", "127.0.0.1:29500", 1);
  CHECK_OK(bootstrapGetUniqueId(&b));
  unsetenv("NCCLX_COMM_ID");
  CHECK(memcmp(&a, &b, sizeof(a)) == 0, "NCCLX_COMM_ID ignored");
  CHECK_OK(bootstrapGetUniqueId(&a));
  CHECK_OK(bootstrapGetUniqueId(&b));
  CHECK(bootstrapIdSecret(&a) != bootstrapIdSecret(&b), "two unique ids share a secret");
  memset(&a, 0, sizeof(a));
  struct bootstrap* bs = NULL;
  CHECK(bootstrapInit(&a, 0, 1, 1.0, &bs) == ncclxInvalidArgument && bs == NULL, "zero id accepted");
  CHECK_OK(bootstrapGetUniqueId(&a));
  CHECK(bootstrapInit(&a, 2, 2, 1.0, &bs) == ncclxInvalidArgument, "rank out of range accepted");
  printf("%-40s ok\n", "ids");
  return 0;
}

static int ipv6Available(void) {
  int fd = socket(AF_INET6, SOCK_STREAM, 0);
  struct sockaddr_in6 a = {.sin6_family = AF_INET6, .sin6_addr = IN6ADDR_LOOPBACK_INIT};
  int ok = fd >= 0 && bind(fd, (struct sockaddr*)&a, sizeof(a)) == 0;
  if (fd >= 0) close(fd);
  return ok;
}

int main(void) {
  signal(SIGPIPE, SIG_IGN);
  int failed = idTests();
  struct scenario s;
  char name[64];

  static const int sizes[] = {1, 2, 3, 5, 8};
  for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
    int n = sizes[i];
    /* Alternate between fresh unique ids and NCCLX_COMM_ID-style strings. */
    int fromString = (i % 2 == 1);
    if (fromString ? scenarioFromString(&s, n, 20.0) : scenarioFromUniqueId(&s, n, 20.0)) return 1;
    snprintf(name, sizeof(name), "basic, %d rank%s (%s)", n, n == 1 ? "" : "s", fromString ? "string id" : "unique id");
    failed |= runAll(name, n, basicRank, &s, 50.0);
  }
  if (ipv6Available()) {
    int port = freePort();
    memset(&s, 0, sizeof(s));
    snprintf(s.hostport, sizeof(s.hostport), "[::1]:%d", port);
    s.nranks = 3;
    s.timeout = 20.0;
    if (bootstrapIdFromString(s.hostport, &s.id) != ncclxSuccess) return 1;
    failed |= runAll("basic, 3 ranks over IPv6 [::1]", 3, basicRank, &s, 50.0);
  } else {
    printf("%-40s skipped (no IPv6 loopback)\n", "basic over IPv6");
  }

  if (scenarioFromString(&s, 3, 10.0)) return 1;
  failed |= runAll("stranger at the root during init", 4, strangerAtInitProc, &s, 30.0);
  if (scenarioFromUniqueId(&s, 5, 10.0)) return 1;
  failed |= runAll("strangers at rank listeners", 5, strangerLaterRank, &s, 30.0);
  /* A job with an identity: the root refuses the duplicate and keeps the first. (Without one,
   * a duplicate may be another job's rank that arrived first, so the root fails the whole
   * init instead: tests/init/init_job_identity.c.) */
  setenv("NCCLX_JOB_ID", "test-bootstrap-duplicate", 1);
  int dupIdFailed = scenarioFromString(&s, 3, 10.0);
  unsetenv("NCCLX_JOB_ID");
  if (dupIdFailed) return 1;
  failed |= runAll("duplicate rank", 4, duplicateProc, &s, 30.0);
  if (scenarioFromString(&s, 3, 10.0)) return 1;
  failed |= runAll("wrong nranks fails every rank at once", 3, wrongNranksProc, &s, 30.0);
  if (scenarioFromString(&s, 3, 2.0)) return 1;
  failed |= runAll("rank 2 never shows up (2 s timeout)", 3, missingRankProc, &s, 20.0);
  if (scenarioFromString(&s, 2, 2.0)) return 1;
  failed |= runAll("root never shows up (2 s timeout)", 2, missingRootProc, &s, 20.0);
  if (scenarioFromUniqueId(&s, 4, 10.0)) return 1;
  failed |= runAll("abort notice", 4, abortRank, &s, 30.0);
  if (scenarioFromString(&s, 2, 2.0)) return 1;
  failed |= runAll("abort flag and recv timeout", 2, boundedWaitRank, &s, 20.0);

  printf(failed ? "test_bootstrap: FAILED\n" : "test_bootstrap: all passed\n");
  return failed ? 1 : 0;
}
