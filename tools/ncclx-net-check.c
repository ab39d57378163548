/*
 * ncclx-net-check: conformance test of an ncclx network plugin, through the ABI only.
 *
 *   ncclx-net-check [-o KEY=VALUE]... [-d DEV] [-t SECONDS] [-k SECONDS] [-v] [--no-kill] PLUGIN.so
 *
 * The parent dlopens the plugin and checks its table (name, ABI version, required
 * operations). It then forks a receiver, a sender and (for the killed-peer check) a victim;
 * each initializes the plugin on its own, with a logger on stderr and a config section made
 * of the -o options. The receiver listens and ships its handle over a socketpair, and the
 * two run the checks below in lockstep, reporting each result to the parent, which prints a
 * PASS/FAIL/SKIP line per check and a summary. Exit status: 0 when nothing failed, 1 when a
 * check failed, 2 for a usage error.
 *
 * Only shared objects can be tested: the built-in "socket" and "shm" networks live inside
 * libncclx and are not exported (build them standalone, e.g. net_socket.c with
 * -DNCCLX_NET_SOCKET_STANDALONE, to test them).
 */
#include <dlfcn.h>
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ncclx/net.h"
#include "netcheck_env.h"
#include "netcheck_util.h"

enum { ROLE_PARENT, ROLE_RECV, ROLE_SEND, ROLE_VICTIM, NROLES };
static const char* const roleNames[NROLES] = {"parent", "receiver", "sender", "victim"};
#define SIDE(r) (1u << (r))
#define RS (SIDE(ROLE_RECV) | SIDE(ROLE_SEND))

enum {
  C_LOAD,
  C_INIT,
  C_CONNECT,
  C_SIZE0,
  C_SIZE1,
  C_SIZE4095,
  C_SIZE1M,
  C_SIZE16M,
  C_INFLIGHT,
  C_ORDER,
  C_LARGER_RECV,
  C_REGMR,
  C_MULTI,
  C_REFUSE,
  C_TRUNC,
  C_CLOSE,
  C_KILL,
  C_FINALIZE,
  NCHECKS
};

static const struct {
  const char* name;
  unsigned sides; /* who must report */
} checkInfo[NCHECKS] = {
    [C_LOAD] = {"load (symbol, name, ABI version, required ops)", SIDE(ROLE_PARENT)},
    [C_INIT] = {"init, devices, getProperties", RS},
    [C_CONNECT] = {"listen, connect, accept (non-blocking)", RS},
    [C_SIZE0] = {"message of 0 bytes", RS},
    [C_SIZE1] = {"message of 1 byte", RS},
    [C_SIZE4095] = {"message of 4095 bytes", RS},
    [C_SIZE1M] = {"message of 1 MiB", RS},
    [C_SIZE16M] = {"message of 16 MiB", RS},
    [C_INFLIGHT] = {"32 requests in flight", RS},
    [C_ORDER] = {"ordering of 300 messages", RS},
    [C_LARGER_RECV] = {"receive larger than the send", RS},
    [C_REGMR] = {"regMr/deregMr and registered buffers", RS},
    [C_MULTI] = {"one listener, two senders, no cross-talk", RS},
    [C_REFUSE] = {"garbage handle, wrong nonce, stranger: refused", RS},
    [C_TRUNC] = {"send larger than the receive is an error", RS},
    [C_CLOSE] = {"close after use and after failure", RS},
    [C_KILL] = {"peer killed mid-transfer gives an error", SIDE(ROLE_RECV)},
    [C_FINALIZE] = {"finalize", RS},
};

typedef struct {
  const char* path;
  int dev;
  double bound;     /* seconds for one check */
  double killBound; /* seconds from the kill to the receiver's error */
  int noKill;
} ncOptions;

/* One process's view of the plugin under test. */
typedef struct {
  const ncclxNet_v1_t* net;
  const ncOptions* opt;
  void* ctx;
  ncclxNetProperties_v1_t props;
  int role;
  int peerFd;   /* receiver <-> sender */
  int victimFd; /* receiver <-> victim */
  void* listenComm;
  char handleCopy[NCCLX_NET_HANDLE_MAXSIZE]; /* listenComm's handle, sent to each sender */
  void* comm;                                /* the main connection: recvComm or sendComm */
  int broken; /* the main connection failed a check: later ones on it cannot run */
  double slowest;
  const char* slowestOp;
  void* parked[16]; /* buffers of receives that failed: freed after finalize */
  int nparked;
} ncTester;

/* A buffer whose receive did not complete may still be written to until its comm is
 * closed: keep it until the plugin is finalized. */
static void release(ncTester* t, void* buf, int safe) {
  if (safe || t->nparked == (int)(sizeof(t->parked) / sizeof(t->parked[0])))
    free(buf);
  else
    t->parked[t->nparked++] = buf;
}

static const char* resName(ncclxResult_t r) {
  switch (r) {
    case ncclxSuccess:
      return "ncclxSuccess";
    case ncclxUnhandledCudaError:
      return "ncclxUnhandledCudaError";
    case ncclxSystemError:
      return "ncclxSystemError";
    case ncclxInternalError:
      return "ncclxInternalError";
    case ncclxInvalidArgument:
      return "ncclxInvalidArgument";
    case ncclxInvalidUsage:
      return "ncclxInvalidUsage";
    case ncclxRemoteError:
      return "ncclxRemoteError";
    case ncclxInProgress:
      return "ncclxInProgress";
    default:
      return "unknown result";
  }
}

/* ------------------------------------------------------------------------------------------
 * Driving the plugin with bounds
 * ------------------------------------------------------------------------------------------ */

/* Every plugin call must return promptly: remember the slowest of the current check. */
static void noteCall(ncTester* t, const char* op, double t0) {
  double d = ncNow() - t0;
  if (d > t->slowest) {
    t->slowest = d;
    t->slowestOp = op;
  }
}

static void beginCheck(ncTester* t) {
  t->slowest = 0;
  t->slowestOp = "";
  ncCheckStart = ncNow();
}

/* A check that passed still fails when a call blocked. init and finalize may take their
 * time (they are not timed); everything else must return within a second. */
static int blockedCall(ncTester* t, char* why, size_t size) {
  if (t->slowest <= 1.0) return 0;
  snprintf(why, size, "%s blocked for %.2f s (operations must not block)", t->slowestOp,
           t->slowest);
  return 1;
}

/* 1 done (*size set), -1 error (*res set), 0 deadline passed. */
static int waitReq(ncTester* t, void* req, size_t* size, double deadline, ncclxResult_t* res) {
  for (unsigned spins = 0;; spins++) {
    int done = 0;
    size_t got = 0;
    double t0 = ncNow();
    ncclxResult_t r = t->net->test(req, &done, &got);
    noteCall(t, "test()", t0);
    if (r != ncclxSuccess) {
      *res = r;
      return -1;
    }
    if (done) {
      if (size) *size = got;
      return 1;
    }
    if (ncNow() > deadline) return 0;
    if (spins > 200) usleep(50);
  }
}

/* Post one send or receive, retrying while the plugin answers "not now". 1 posted, -1 error,
 * 0 deadline passed. */
static int post(ncTester* t, void* comm, int send, void* buf, size_t size, void* mh, void** req,
                double deadline, ncclxResult_t* res) {
  *req = NULL;
  for (;;) {
    double t0 = ncNow();
    ncclxResult_t r;
    if (send) {
      r = t->net->isend(comm, buf, size, 0, mh, NULL, req);
      noteCall(t, "isend()", t0);
    } else {
      int tag = 0;
      void* mhs[1] = {mh};
      r = t->net->irecv(comm, 1, &buf, &size, &tag, mhs, NULL, req);
      noteCall(t, "irecv()", t0);
    }
    if (r != ncclxSuccess) {
      *res = r;
      return -1;
    }
    if (*req) return 1;
    if (ncNow() > deadline) return 0;
    usleep(20);
  }
}

/* Exchange pass flags with the peer at the end of a check: returns the peer's flag, or -1
 * when the peer is gone or too slow. */
static int syncPeer(ncTester* t, int fd, int pass) {
  char mine = pass ? 'P' : 'F', theirs = 0;
  if (ncWriteAll(fd, &mine, 1) != 0) return -1;
  if (ncReadAll(fd, &theirs, 1, t->opt->bound + 10) != 0) return -1;
  return theirs == 'P';
}

static void endCheck(ncTester* t, int check, int pass, const char* fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void endCheck(ncTester* t, int check, int pass, const char* fmt, ...) {
  char msg[400], why[160];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof(msg), fmt, ap);
  va_end(ap);
  if (pass && blockedCall(t, why, sizeof(why))) {
    pass = 0;
    snprintf(msg, sizeof(msg), "%s", why);
  }
  ncReport(check, pass ? NC_PASS : NC_FAIL, "%s", msg);
  int peer = syncPeer(t, t->peerFd, pass);
  if (!pass || peer != 1) t->broken = 1;
}

static int notRun(ncTester* t, int check) {
  if (!t->broken) return 0;
  beginCheck(t);
  endCheck(t, check, 0, "not run: an earlier check failed on this connection");
  return 1;
}

/* ------------------------------------------------------------------------------------------
 * Checks (each runs in the receiver and the sender, in the same order)
 * ------------------------------------------------------------------------------------------ */

static int checkInit(ncTester* t, int check) {
  ncclxPluginEnv_t env;
  netcheckEnvFill(&env);
  beginCheck(t);
  double t0 = ncNow();
  ncclxResult_t res = t->net->init(&t->ctx, &env);
  double initTime = ncNow() - t0;
  char msg[400];
  int ndev = 0, pass = 0;
  if (res != ncclxSuccess) {
    snprintf(msg, sizeof(msg), "init returned %s (see the plugin's log above)", resName(res));
  } else if ((res = t->net->devices(t->ctx, &ndev)) != ncclxSuccess || ndev < 1) {
    snprintf(msg, sizeof(msg), "devices returned %s with %d device(s)", resName(res), ndev);
  } else if (t->opt->dev >= ndev) {
    snprintf(msg, sizeof(msg), "device %d requested, the plugin has %d", t->opt->dev, ndev);
  } else if ((res = t->net->getProperties(t->ctx, t->opt->dev, &t->props)) != ncclxSuccess) {
    snprintf(msg, sizeof(msg), "getProperties(%d) returned %s", t->opt->dev, resName(res));
  } else {
    const ncclxNetProperties_v1_t* p = &t->props;
    ncclxNetProperties_v1_t bogus;
    if (!p->name)
      snprintf(msg, sizeof(msg), "device name is NULL");
    else if (!(p->ptrSupport & NCCLX_PTR_HOST))
      snprintf(msg, sizeof(msg),
               "ptrSupport 0x%x lacks NCCLX_PTR_HOST (this tool tests host memory)", p->ptrSupport);
    else if (p->maxRecvs < 1)
      snprintf(msg, sizeof(msg), "maxRecvs is %d (must be >= 1)", p->maxRecvs);
    else if (p->maxMessageBytes == 0)
      snprintf(msg, sizeof(msg), "maxMessageBytes is 0");
    else if (p->speedMbps <= 0 || p->latencyUs < 0)
      snprintf(msg, sizeof(msg), "speedMbps %d / latencyUs %.1f is not plausible", p->speedMbps,
               p->latencyUs);
    else if (t->net->getProperties(t->ctx, ndev, &bogus) == ncclxSuccess)
      snprintf(msg, sizeof(msg),
               "getProperties(%d) of a device that does not exist returned success", ndev);
    else {
      pass = 1;
      snprintf(msg, sizeof(msg),
               "init %.2f s; %d device(s); device %d: %s, %d Mb/s, ptrSupport "
               "0x%x, maxRecvs %d, maxMessageBytes %zu",
               initTime, ndev, t->opt->dev, p->name, p->speedMbps, p->ptrSupport, p->maxRecvs,
               p->maxMessageBytes);
    }
  }
  char why[160];
  if (pass && blockedCall(t, why, sizeof(why))) pass = 0, snprintf(msg, sizeof(msg), "%s", why);
  ncReport(check, pass ? NC_PASS : NC_FAIL, "%s", msg);
  return pass;
}

/* Receiver: listen (once) and ship the handle on fd, then accept `count` comms. Sender:
 * read the handle and connect `count` comms at once. 0 on success, else msg says why. */
static int makeConnections(ncTester* t, int fd, int count, void** comms, char* msg, size_t size) {
  char handle[NCCLX_NET_HANDLE_MAXSIZE];
  double deadline = ncNow() + t->opt->bound;
  ncclxResult_t res;
  for (int i = 0; i < count; i++) comms[i] = NULL;
  if (t->role == ROLE_RECV) {
    if (!t->listenComm) {
      memset(handle, 0, sizeof(handle));
      double t0 = ncNow();
      res = t->net->listen(t->ctx, t->opt->dev, handle, &t->listenComm);
      noteCall(t, "listen()", t0);
      if (res != ncclxSuccess || !t->listenComm)
        return snprintf(msg, size, "listen returned %s, listenComm %p", resName(res),
                        t->listenComm),
               -1;
      memcpy(t->handleCopy, handle, sizeof(handle));
    }
    if (ncWriteAll(fd, t->handleCopy, sizeof(t->handleCopy)) != 0)
      return snprintf(msg, size, "cannot pass the handle to the peer process"), -1;
    int got = 0;
    unsigned nullCalls = 0;
    while (got < count) {
      void* rc = NULL;
      double t0 = ncNow();
      res = t->net->accept(t->listenComm, &rc);
      noteCall(t, "accept()", t0);
      if (res != ncclxSuccess) return snprintf(msg, size, "accept returned %s", resName(res)), -1;
      if (rc)
        comms[got++] = rc;
      else
        nullCalls++;
      if (ncNow() > deadline)
        return snprintf(msg, size, "accepted %d of %d connection(s) within %.0f s", got, count,
                        t->opt->bound),
               -1;
      if (!rc && nullCalls > 100) usleep(50);
    }
    snprintf(msg, size, "accepted %d connection(s) after %u call(s) returning NULL", count,
             nullCalls);
    return 0;
  }
  int r = ncReadAll(fd, handle, sizeof(handle), t->opt->bound * 4);
  if (r != 0)
    return snprintf(msg, size, "no handle from the receiver (%s)",
                    r == -2 ? "timeout" : "it exited"),
           -1;
  deadline = ncNow() + t->opt->bound;
  int got = 0;
  unsigned calls = 0;
  while (got < count) {
    for (int i = 0; i < count; i++) {
      if (comms[i]) continue;
      double t0 = ncNow();
      res = t->net->connect(t->ctx, t->opt->dev, handle, &comms[i]);
      noteCall(t, "connect()", t0);
      calls++;
      if (res != ncclxSuccess) return snprintf(msg, size, "connect returned %s", resName(res)), -1;
      if (comms[i]) got++;
    }
    if (ncNow() > deadline)
      return snprintf(msg, size, "connected %d of %d within %.0f s", got, count, t->opt->bound), -1;
    if (got < count && calls > 100) usleep(50);
  }
  snprintf(msg, size, "connected %d connection(s) in %u call(s)", count, calls);
  return 0;
}

static void checkConnect(ncTester* t, int check) {
  char msg[300];
  beginCheck(t);
  int ok = makeConnections(t, t->peerFd, 1, &t->comm, msg, sizeof(msg)) == 0;
  if (ok && t->net->getPollFd) {
    int fd = -2;
    ncclxResult_t res = t->net->getPollFd(t->comm, &fd);
    size_t len = strlen(msg);
    if (res != ncclxSuccess || fd < -1)
      ok = 0,
      snprintf(msg + len, sizeof(msg) - len, "; getPollFd returned %s, fd %d", resName(res), fd);
    else
      snprintf(msg + len, sizeof(msg) - len, "; poll fd %d", fd);
  }
  endCheck(t, check, ok, "%s", msg);
}

/* One message of `size` bytes; the receiver posts `recvSize` and expects `expect` bytes. */
static void checkMessage(ncTester* t, int check, size_t size, size_t recvSize, void* mh,
                         int regmr) {
  if (notRun(t, check)) return;
  beginCheck(t);
  if (size > t->props.maxMessageBytes || recvSize > t->props.maxMessageBytes) {
    ncReport(check, NC_SKIP, "larger than maxMessageBytes (%zu)", t->props.maxMessageBytes);
    (void)syncPeer(t, t->peerFd, 1);
    return;
  }
  int send = t->role == ROLE_SEND;
  size_t n = send ? size : recvSize;
  uint8_t* buf = malloc(n ? n : 1);
  if (!buf) {
    endCheck(t, check, 0, "out of memory for %zu bytes", n);
    return;
  }
  char msg[300] = "";
  int pass = 0;
  ncclxResult_t res = ncclxSuccess;
  double deadline = ncNow() + t->opt->bound;
  if (send)
    ncPatFill(buf, n, (uint64_t)check);
  else
    memset(buf, 0xEE, n);
  if (regmr) {
    double t0 = ncNow();
    res = t->net->regMr(t->comm, buf, n ? n : 1, NCCLX_PTR_HOST, &mh);
    noteCall(t, "regMr()", t0);
    if (res != ncclxSuccess) {
      endCheck(t, check, 0, "regMr of %zu host bytes returned %s", n, resName(res));
      free(buf);
      return;
    }
  }
  void* req = NULL;
  size_t got = 0;
  int r = post(t, t->comm, send, buf, n, mh, &req, deadline, &res);
  if (r == 1) r = waitReq(t, req, &got, deadline, &res);
  if (r < 0)
    snprintf(msg, sizeof(msg), "%s returned %s", send ? "isend/test" : "irecv/test", resName(res));
  else if (r == 0)
    snprintf(msg, sizeof(msg), "not complete after %.0f s", t->opt->bound);
  else if (send)
    pass = 1, snprintf(msg, sizeof(msg), "sent %zu bytes", size);
  else if (got != size)
    snprintf(msg, sizeof(msg), "test reported %zu bytes, %zu were sent", got, size);
  else {
    size_t bad = ncPatCheck(buf, size, (uint64_t)check);
    if (bad != (size_t)-1)
      snprintf(msg, sizeof(msg), "byte %zu of %zu is wrong", bad, size);
    else
      pass = 1, snprintf(msg, sizeof(msg), "%zu bytes byte-exact%s", size,
                         recvSize > size ? " (into a larger receive)" : "");
  }
  if (regmr) {
    double t0 = ncNow();
    res = t->net->deregMr(t->comm, mh);
    noteCall(t, "deregMr()", t0);
    if (res != ncclxSuccess)
      pass = 0, snprintf(msg, sizeof(msg), "deregMr returned %s", resName(res));
  }
  release(t, buf, r == 1 || send);
  endCheck(t, check, pass, "%s", msg);
}

/* 32 requests posted before any is tested; message k must land in receive k. */
static void checkInflight(ncTester* t, int check) {
  if (notRun(t, check)) return;
  beginCheck(t);
  enum { N = NCCLX_NET_MAX_REQUESTS, SZ = 4096 };
  int send = t->role == ROLE_SEND;
  uint8_t* bufs = malloc((size_t)N * SZ);
  void* reqs[N];
  int done[N];
  ncclxResult_t res = ncclxSuccess;
  double deadline = ncNow() + t->opt->bound;
  char msg[300] = "";
  int posted = 0, pass = 0, failed = 0;
  if (!bufs) {
    endCheck(t, check, 0, "out of memory");
    return;
  }
  for (int k = 0; k < N; k++) {
    if (send)
      ncPatFill(bufs + (size_t)k * SZ, SZ, 100u + (unsigned)k);
    else
      memset(bufs + (size_t)k * SZ, 0xEE, SZ);
    done[k] = 0;
  }
  for (; posted < N; posted++) {
    int r =
        post(t, t->comm, send, bufs + (size_t)posted * SZ, SZ, NULL, &reqs[posted], deadline, &res);
    if (r != 1) {
      snprintf(msg, sizeof(msg), "only %d of %d requests could be posted (%s)", posted, N,
               r < 0 ? resName(res) : "the plugin kept answering NULL");
      failed = 1;
      break;
    }
  }
  int ndone = 0;
  while (!failed && ndone < posted) {
    for (int k = 0; k < posted && !failed; k++) {
      if (done[k]) continue;
      int d = 0;
      size_t got = 0;
      double t0 = ncNow();
      res = t->net->test(reqs[k], &d, &got);
      noteCall(t, "test()", t0);
      if (res != ncclxSuccess) {
        snprintf(msg, sizeof(msg), "test of request %d returned %s", k, resName(res));
        failed = 1;
      } else if (d) {
        done[k] = 1;
        ndone++;
        size_t bad = send ? (size_t)-1 : ncPatCheck(bufs + (size_t)k * SZ, SZ, 100u + (unsigned)k);
        if (!send && got != SZ) {
          snprintf(msg, sizeof(msg), "request %d reported %zu bytes, expected %d", k, got, SZ);
          failed = 1;
        } else if (bad != (size_t)-1) {
          snprintf(msg, sizeof(msg),
                   "receive %d holds the wrong data (byte %zu): messages "
                   "matched out of order",
                   k, bad);
          failed = 1;
        }
      }
    }
    if (!failed && ncNow() > deadline) {
      snprintf(msg, sizeof(msg), "%d of %d requests complete after %.0f s", ndone, posted,
               t->opt->bound);
      failed = 1;
    }
  }
  if (!failed)
    pass = 1, snprintf(msg, sizeof(msg),
                       "%d requests of %d bytes in flight, all complete and in order", N, SZ);
  release(t, bufs, pass);
  endCheck(t, check, pass, "%s", msg);
}

/* 300 messages of mixed sizes with up to 8 in flight, tested oldest first as the core does. */
static void checkOrdering(ncTester* t, int check) {
  if (notRun(t, check)) return;
  beginCheck(t);
  enum { N = 300, W = 8 };
  size_t sizes[] = {1, 64, 4096, 65543, 0, 3000, 17, 250000};
  size_t maxSize = 250000;
  /* The plugin's limit binds the checker too: a larger message is the checker's error. */
  if (maxSize > t->props.maxMessageBytes) maxSize = t->props.maxMessageBytes;
  for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++)
    if (sizes[i] > maxSize) sizes[i] = maxSize;
  int send = t->role == ROLE_SEND;
  uint8_t* bufs = malloc((size_t)W * maxSize);
  if (!bufs) {
    endCheck(t, check, 0, "out of memory");
    return;
  }
  void* reqs[W];
  ncclxResult_t res = ncclxSuccess;
  double deadline = ncNow() + t->opt->bound;
  char msg[300] = "";
  int posted = 0, completed = 0, failed = 0;
  while (!failed && completed < N) {
    while (posted < N && posted - completed < W) {
      size_t sz = sizes[posted % 8];
      uint8_t* b = bufs + (size_t)(posted % W) * maxSize;
      if (send) ncPatFill(b, sz, 1000u + (unsigned)posted);
      int r = post(t, t->comm, send, b, sz, NULL, &reqs[posted % W], deadline, &res);
      if (r != 1) {
        snprintf(msg, sizeof(msg), "posting message %d: %s", posted,
                 r < 0 ? resName(res) : "timeout");
        failed = 1;
        break;
      }
      posted++;
    }
    if (failed) break;
    size_t got = 0, sz = sizes[completed % 8];
    int r = waitReq(t, reqs[completed % W], &got, deadline, &res);
    if (r != 1) {
      snprintf(msg, sizeof(msg), "message %d: %s", completed, r < 0 ? resName(res) : "timeout");
      failed = 1;
      break;
    }
    if (!send) {
      size_t bad =
          ncPatCheck(bufs + (size_t)(completed % W) * maxSize, sz, 1000u + (unsigned)completed);
      if (got != sz || bad != (size_t)-1) {
        snprintf(msg, sizeof(msg), "message %d: %zu bytes (expected %zu)%s", completed, got, sz,
                 bad != (size_t)-1 ? ", wrong data: out of order?" : "");
        failed = 1;
        break;
      }
    }
    completed++;
  }
  if (!failed)
    snprintf(msg, sizeof(msg), "%d messages of 0..%zu bytes, %d in flight, in order", N, maxSize,
             W);
  release(t, bufs, !failed);
  endCheck(t, check, !failed, "%s", msg);
}

/* Sender side of checkRefuse: connect with `handle` on `slot` until an error, a comm or a
 * short deadline. 1 = refused by connect (with a WARN line), 2 = a comm (the listener must
 * then refuse it), 0 = neither. The slot is reused by the caller, as the core may reuse a
 * slot it gave up on (net.h, connect). */
static int refuseAttempt(ncTester* t, const char* handle, void** slot, char* why, size_t size) {
  double deadline = ncNow() + (t->opt->bound < 2 ? t->opt->bound : 2);
  unsigned warned = netcheckWarnings;
  ncclxResult_t res = ncclxSuccess;
  *slot = NULL;
  while (!*slot && ncNow() < deadline) {
    res = t->net->connect(t->ctx, t->opt->dev, handle, slot);
    if (res != ncclxSuccess) break;
    if (!*slot) usleep(100);
  }
  if (*slot) {
    t->net->closeSend(*slot);
    *slot = NULL;
    return 2;
  }
  if (res == ncclxSuccess) return snprintf(why, size, "still connecting after 2 s"), 0;
  if (netcheckWarnings == warned)
    return snprintf(why, size, "connect returned %s without a WARN line", resName(res)), 0;
  return 1;
}

/* A garbage handle and handles spliced from two listeners' (the bytes that differ: port,
 * nonce) must not give a connection, and each refusal is logged. A closed listener's handle
 * (a stale one: a restarted rank, an earlier job) must end too, not stay "connecting". The
 * listener then still takes a good sender on the very slot the refused attempts used. */
static void checkRefuse(ncTester* t, int check) {
  if (notRun(t, check)) return;
  beginCheck(t);
  char msg[400] = "", hs[3][NCCLX_NET_HANDLE_MAXSIZE]; /* listener, second, closed one */
  int pass = 1;
  double deadline = ncNow() + t->opt->bound * 4;
  if (t->role == ROLE_RECV) {
    void* other = NULL;
    memset(hs[1], 0, sizeof(hs[1]));
    ncclxResult_t res = t->net->listen(t->ctx, t->opt->dev, hs[1], &other);
    if (res != ncclxSuccess || !other) {
      memset(hs[1], 0, sizeof(hs[1])); /* the sender then skips the splices */
      snprintf(msg, sizeof(msg), "second listen returned %s", resName(res));
      pass = 0;
    }
    memcpy(hs[0], t->handleCopy, sizeof(hs[0]));
    void* closed = NULL;
    memset(hs[2], 0, sizeof(hs[2]));
    if (pass && (t->net->listen(t->ctx, t->opt->dev, hs[2], &closed) != ncclxSuccess || !closed ||
                 t->net->closeListen(closed) != ncclxSuccess)) {
      memset(hs[2], 0, sizeof(hs[2])); /* the sender then skips it */
      snprintf(msg, sizeof(msg), "a third listen, closed at once, failed");
      pass = 0;
    }
    if (ncWriteAll(t->peerFd, hs, sizeof(hs)) != 0)
      pass = 0, snprintf(msg, sizeof(msg), "cannot pass the handles to the sender");
    unsigned warned = netcheckWarnings;
    uint32_t reached = 0;
    int strangers = 0, reported = 0;
    double graceEnd = 0;
    /* Accept on both listeners while the sender tries; nothing may come through. */
    while (ncNow() < deadline && (!reported || ncNow() < graceEnd)) {
      void* lcs[2] = {t->listenComm, other};
      for (int l = 0; l < 2 && lcs[l]; l++) {
        void* rc = NULL;
        if (t->net->accept(lcs[l], &rc) == ncclxSuccess && rc) {
          strangers++;
          t->net->closeRecv(rc);
        }
      }
      if (!reported) {
        struct pollfd pfd = {.fd = t->peerFd, .events = POLLIN};
        if (poll(&pfd, 1, 1) == 1) {
          if (ncReadAll(t->peerFd, &reached, sizeof(reached), t->opt->bound) != 0) pass = 0;
          reported = 1;
          graceEnd = ncNow() + 0.3; /* let the listeners read the last hellos */
        }
      }
    }
    if (other) t->net->closeListen(other);
    if (pass && !reported) pass = 0, snprintf(msg, sizeof(msg), "no word from the sender");
    if (pass && strangers)
      pass = 0, snprintf(msg, sizeof(msg), "accepted %d connection(s) with a wrong handle", strangers);
    if (pass && reached && netcheckWarnings == warned)
      pass = 0, snprintf(msg, sizeof(msg), "%u stranger(s) refused without a WARN line", reached);
    int32_t go = pass; /* tells the sender whether a good connect follows */
    if (ncWriteAll(t->peerFd, &go, sizeof(go)) != 0) pass = 0;
    void* rc = NULL;
    if (pass && makeConnections(t, t->peerFd, 1, &rc, msg, sizeof(msg)) != 0) pass = 0;
    if (rc) t->net->closeRecv(rc);
    if (pass)
      snprintf(msg, sizeof(msg), "%u stranger(s) reached a listener and were refused; then "
               "a good sender was accepted", reached);
  } else {
    void* slot = NULL; /* one slot for every attempt, the good one included */
    uint32_t reached = 0;
    int refused = 0;
    if (ncReadAll(t->peerFd, hs, sizeof(hs), t->opt->bound * 4) != 0) {
      endCheck(t, check, 0, "no handles from the receiver");
      return;
    }
    char bad[NCCLX_NET_HANDLE_MAXSIZE], why[200] = "";
    ncPatFill((uint8_t*)bad, sizeof(bad), 0xbad);
    int r = refuseAttempt(t, bad, &slot, why, sizeof(why));
    if (r != 1) pass = 0, snprintf(msg, sizeof(msg), "garbage handle: %s", r == 2 ? "connected" : why);
    for (size_t i = 0; pass && i < sizeof(bad); i++) {
      if (hs[0][i] == hs[1][i]) continue;
      memcpy(bad, hs[0], sizeof(bad));
      bad[i] = hs[1][i];
      r = refuseAttempt(t, bad, &slot, why, sizeof(why));
      if (r == 2) reached++;
      else if (r == 1) refused++;
      else pass = 0, snprintf(msg, sizeof(msg), "handle with byte %zu of another listener's: %s", i, why);
    }
    static const char zeros[NCCLX_NET_HANDLE_MAXSIZE];
    if (pass && memcmp(hs[2], zeros, sizeof(zeros)) != 0) {
      r = refuseAttempt(t, hs[2], &slot, why, sizeof(why));
      if (r == 2) reached++; /* a comm: nobody may accept it (the receiver checks) */
      else if (r == 1) refused++;
      else pass = 0, snprintf(msg, sizeof(msg), "a closed listener's handle: %s", why);
    }
    int32_t go = 0;
    if (ncWriteAll(t->peerFd, &reached, sizeof(reached)) != 0 ||
        ncReadAll(t->peerFd, &go, sizeof(go), t->opt->bound * 4) != 0)
      pass = 0;
    if (pass && !go) pass = 0, snprintf(msg, sizeof(msg), "the receiver failed this check");
    if (pass) {
      /* The good handle again through makeConnections would use a fresh slot: use ours. */
      char h[NCCLX_NET_HANDLE_MAXSIZE];
      ncclxResult_t res = ncclxSuccess;
      slot = NULL;
      if (ncReadAll(t->peerFd, h, sizeof(h), t->opt->bound * 4) != 0) {
        pass = 0, snprintf(msg, sizeof(msg), "no handle from the receiver after the refusals");
      } else {
        double end = ncNow() + t->opt->bound;
        while (!slot && ncNow() < end &&
               (res = t->net->connect(t->ctx, t->opt->dev, h, &slot)) == ncclxSuccess)
          if (!slot) usleep(100);
        if (!slot)
          pass = 0, snprintf(msg, sizeof(msg), "after the refusals, connect on the same slot: %s",
                             res != ncclxSuccess ? resName(res) : "timeout");
      }
      if (slot) t->net->closeSend(slot);
    }
    if (pass)
      snprintf(msg, sizeof(msg), "garbage refused; %d spliced or closed listener's handle(s) "
               "refused by connect, %u by the listener; then connected on the same slot",
               refused, reached);
  }
  endCheck(t, check, pass, "%s", msg);
}

/* A second and third connection to the same listener; each keeps to its own messages. */
static void checkMulti(ncTester* t, int check) {
  beginCheck(t);
  char msg[300];
  void* comms[2] = {NULL, NULL};
  if (makeConnections(t, t->peerFd, 2, comms, msg, sizeof(msg)) != 0) {
    endCheck(t, check, 0, "%s", msg);
    return;
  }
  int send = t->role == ROLE_SEND, pass = 1;
  double deadline = ncNow() + t->opt->bound;
  ncclxResult_t res = ncclxSuccess;
  /* Round 0: 777 bytes on connection A, 555 on B. Round 1: B first (556), then A (778). */
  size_t firstSize[2] = {0, 0};
  for (int round = 0; round < 2 && pass; round++) {
    uint8_t bufs[2][1024];
    void* reqs[2] = {NULL, NULL};
    for (int j = 0; j < 2 && pass; j++) {
      int i = round == 0 ? j : 1 - j;
      size_t sz = (i == 0 ? 777 : 555) + (size_t)round;
      if (send) ncPatFill(bufs[i], sz, (uint64_t)sz);
      int r = post(t, comms[i], send, bufs[i], send ? sz : sizeof(bufs[i]), NULL, &reqs[i],
                   deadline, &res);
      if (r != 1)
        pass = 0, snprintf(msg, sizeof(msg), "posting on connection %d: %s", i,
                           r < 0 ? resName(res) : "timeout");
    }
    for (int i = 0; i < 2 && pass; i++) {
      size_t got = 0;
      int r = waitReq(t, reqs[i], &got, deadline, &res);
      if (r != 1) {
        pass = 0,
        snprintf(msg, sizeof(msg), "connection %d: %s", i, r < 0 ? resName(res) : "timeout");
      } else if (!send) {
        /* Which accepted comm is A is not defined; it must stay consistent over rounds. */
        size_t base = got - (size_t)round;
        if ((base != 777 && base != 555) || (round == 1 && base != firstSize[i]) ||
            ncPatCheck(bufs[i], got, (uint64_t)got) != (size_t)-1) {
          pass = 0;
          snprintf(msg, sizeof(msg),
                   "accepted comm %d received %zu bytes in round %d (first round: "
                   "%zu): messages crossed connections",
                   i, got, round, firstSize[i]);
        }
        if (round == 0) firstSize[i] = base;
      }
    }
    if (pass && !send && round == 0 && firstSize[0] == firstSize[1]) {
      pass = 0;
      snprintf(msg, sizeof(msg), "both accepted comms received the %zu-byte message", firstSize[0]);
    }
  }
  for (int i = 0; i < 2; i++) {
    double t0 = ncNow();
    res = send ? t->net->closeSend(comms[i]) : t->net->closeRecv(comms[i]);
    noteCall(t, send ? "closeSend()" : "closeRecv()", t0);
    if (res != ncclxSuccess && pass)
      pass = 0, snprintf(msg, sizeof(msg), "closing connection %d returned %s", i, resName(res));
  }
  if (pass)
    snprintf(msg, sizeof(msg),
             "2 connections from one handle, 2 rounds each, no cross-talk, closed");
  /* Not on the main connection: a failure here does not stop later checks on it. */
  int broken = t->broken;
  endCheck(t, check, pass, "%s", msg);
  t->broken = broken;
}

/* The sender sends 8192 bytes into a 1024-byte receive: the receiver must see an error. */
static void checkTruncation(ncTester* t, int check) {
  if (notRun(t, check)) return;
  beginCheck(t);
  int send = t->role == ROLE_SEND;
  uint8_t* buf = malloc(8192);
  char msg[300];
  ncclxResult_t res = ncclxSuccess;
  void* req = NULL;
  size_t got = 0;
  int pass = 0;
  if (!buf) {
    endCheck(t, check, 0, "out of memory");
    return;
  }
  ncPatFill(buf, 8192, 9);
  /* The sender's view is informational: its send may wait forever for a receive that never
   * comes, so it looks for one second only. */
  double deadline = ncNow() + (send ? 1.0 : t->opt->bound);
  int r = post(t, t->comm, send, buf, send ? 8192 : 1024, NULL, &req, deadline, &res);
  if (r == 1) r = waitReq(t, req, &got, deadline, &res);
  if (send) {
    pass = 1; /* the ABI only requires the receiver to fail; say what the sender saw */
    snprintf(msg, sizeof(msg), "sender: %s",
             r == 1  ? "send completed"
             : r < 0 ? resName(res)
                     : "send still pending (allowed)");
  } else if (r < 0) {
    pass = 1;
    snprintf(msg, sizeof(msg), "receiver got %s", resName(res));
  } else if (r == 1) {
    snprintf(msg, sizeof(msg),
             "the receive reported success with %zu bytes for an 8192-byte "
             "message into 1024 bytes",
             got);
  } else {
    snprintf(msg, sizeof(msg), "no error within %.0f s", t->opt->bound);
  }
  release(t, buf, r == 1 || send);
  endCheck(t, check, pass, "%s", msg);
  t->broken = 1; /* the connection is unusable after this, by design */
}

static void checkClose(ncTester* t, int check) {
  beginCheck(t);
  int send = t->role == ROLE_SEND;
  double t0 = ncNow();
  ncclxResult_t res = send ? t->net->closeSend(t->comm) : t->net->closeRecv(t->comm);
  noteCall(t, send ? "closeSend()" : "closeRecv()", t0);
  t->comm = NULL;
  int broken = t->broken;
  endCheck(t, check, res == ncclxSuccess,
           "%s of the failed main connection returned %s (multi-connection "
           "check closed 2 more)",
           send ? "closeSend" : "closeRecv", resName(res));
  t->broken = broken;
}

/* Receiver side of the killed-peer check: the victim streams 16 MiB messages and is
 * SIGKILLed by the parent; a receive must then fail within killBound seconds. */
static void checkKillReceiver(ncTester* t, int check) {
  char msg[300];
  beginCheck(t);
  void* rc = NULL;
  if (makeConnections(t, t->victimFd, 1, &rc, msg, sizeof(msg)) != 0) {
    ncReport(check, NC_FAIL, "victim connection: %s", msg);
    return;
  }
  size_t size =
      t->props.maxMessageBytes < ((size_t)16 << 20) ? t->props.maxMessageBytes : ((size_t)16 << 20);
  uint8_t* buf = malloc(size);
  if (!buf) {
    ncReport(check, NC_FAIL, "out of memory");
    return;
  }
  double start = ncNow(), killedAt = 0;
  double giveUp = start + 4 * t->opt->bound + t->opt->killBound;
  int received = 0, status = NC_FAIL;
  ncclxResult_t res = ncclxSuccess;
  void* req = NULL;
  for (;;) {
    if (!req && post(t, rc, 0, buf, size, NULL, &req, giveUp, &res) != 1) {
      snprintf(msg, sizeof(msg), "posting a receive failed: %s", resName(res));
      break;
    }
    int done = 0;
    size_t got = 0;
    double t0 = ncNow();
    res = t->net->test(req, &done, &got);
    noteCall(t, "test()", t0);
    double now = ncNow();
    if (killedAt == 0 && ncPeerGone(t->victimFd)) killedAt = now;
    if (res != ncclxSuccess) {
      req = NULL;
      if (killedAt == 0) killedAt = now; /* the error beat the socketpair's EOF */
      status = now - killedAt <= t->opt->killBound ? NC_PASS : NC_FAIL;
      snprintf(msg, sizeof(msg),
               "%s %.2f s after the sender was killed (%d messages of %zu bytes "
               "received before)",
               resName(res), now - killedAt, received, size);
      break;
    }
    if (done) {
      received++;
      req = NULL;
    }
    if (killedAt > 0 && now - killedAt > t->opt->killBound) {
      snprintf(msg, sizeof(msg),
               "no error %.0f s after the sender was killed (test keeps returning "
               "not-done: a dead peer would hang the job)",
               t->opt->killBound);
      break;
    }
    if (killedAt == 0 && now > giveUp) {
      snprintf(msg, sizeof(msg), "the victim was never killed (%d messages received)", received);
      break;
    }
    if (!done) usleep(100);
  }
  double t0 = ncNow();
  res = t->net->closeRecv(rc);
  noteCall(t, "closeRecv()", t0);
  if (res != ncclxSuccess && status == NC_PASS)
    status = NC_FAIL,
    snprintf(msg, sizeof(msg), "closeRecv after the failure returned %s", resName(res));
  char why[160];
  if (status == NC_PASS && blockedCall(t, why, sizeof(why)))
    status = NC_FAIL, snprintf(msg, sizeof(msg), "%s", why);
  ncReport(check, status, "%s", msg);
  release(t, buf, 0); /* the failed receive may have been writing into it until closeRecv */
}

/* The victim: connect to the receiver, stream messages, ask the parent to be killed. */
static int runVictim(ncTester* t) {
  char msg[300];
  ncclxPluginEnv_t env;
  netcheckEnvFill(&env);
  ncclxResult_t res = t->net->init(&t->ctx, &env);
  if (res == ncclxSuccess) res = t->net->getProperties(t->ctx, t->opt->dev, &t->props);
  if (res != ncclxSuccess) {
    ncReport(C_KILL, NC_FAIL, "victim: init/getProperties returned %s", resName(res));
    return 1;
  }
  void* sc = NULL;
  /* The receiver gets here after every other check: wait for its handle long enough. */
  ncOptions longer = *t->opt;
  longer.bound = t->opt->bound * 12;
  const ncOptions* saved = t->opt;
  t->opt = &longer;
  int r = makeConnections(t, t->victimFd, 1, &sc, msg, sizeof(msg));
  t->opt = saved;
  if (r != 0) {
    ncReport(C_KILL, NC_FAIL, "victim: %s", msg);
    return 1;
  }
  size_t size =
      t->props.maxMessageBytes < ((size_t)16 << 20) ? t->props.maxMessageBytes : ((size_t)16 << 20);
  uint8_t* buf = malloc(size);
  if (!buf) return 1;
  memset(buf, 0x5a, size);
  double giveUp = ncNow() + 60;
  for (int sent = 0; ncNow() < giveUp; sent++) {
    void* req = NULL;
    if (post(t, sc, 1, buf, size, NULL, &req, giveUp, &res) != 1 ||
        waitReq(t, req, NULL, giveUp, &res) != 1) {
      ncReport(C_KILL, NC_FAIL, "victim: sending message %d failed before the kill: %s", sent,
               resName(res));
      return 1;
    }
    if (sent == 1) ncReport(C_KILL, NC_KILLME, "victim sent 2 messages");
  }
  ncReport(C_KILL, NC_FAIL, "victim: not killed within 60 s");
  return 1;
}

static void checkFinalize(ncTester* t, int check) {
  beginCheck(t);
  ncclxResult_t res = ncclxSuccess;
  double t0 = ncNow();
  if (t->listenComm) res = t->net->closeListen(t->listenComm);
  noteCall(t, "closeListen()", t0);
  t->listenComm = NULL;
  ncclxResult_t fin = t->net->finalize(t->ctx); /* may take its time: not timed */
  while (t->nparked > 0) free(t->parked[--t->nparked]);
  char why[160] = "";
  int pass = res == ncclxSuccess && fin == ncclxSuccess;
  if (pass && blockedCall(t, why, sizeof(why))) pass = 0;
  ncReport(check, pass ? NC_PASS : NC_FAIL, "closeListen returned %s, finalize returned %s%s%s",
           resName(res), resName(fin), why[0] ? "; " : "", why);
}

static int runChecks(ncTester* t) {
  if (!checkInit(t, C_INIT)) return 1;
  checkConnect(t, C_CONNECT);
  checkMessage(t, C_SIZE0, 0, 0, NULL, 0);
  checkMessage(t, C_SIZE1, 1, 1, NULL, 0);
  checkMessage(t, C_SIZE4095, 4095, 4095, NULL, 0);
  checkMessage(t, C_SIZE1M, (size_t)1 << 20, (size_t)1 << 20, NULL, 0);
  checkMessage(t, C_SIZE16M, (size_t)16 << 20, (size_t)16 << 20, NULL, 0);
  checkInflight(t, C_INFLIGHT);
  checkOrdering(t, C_ORDER);
  checkMessage(t, C_LARGER_RECV, 1000, 4096, NULL, 0);
  checkMessage(t, C_REGMR, (size_t)1 << 20, (size_t)1 << 20, NULL, 1);
  checkMulti(t, C_MULTI);
  checkRefuse(t, C_REFUSE);
  checkTruncation(t, C_TRUNC);
  checkClose(t, C_CLOSE);
  if (t->role == ROLE_RECV) {
    if (t->opt->noKill)
      ncReport(C_KILL, NC_SKIP, "--no-kill");
    else
      checkKillReceiver(t, C_KILL);
  }
  checkFinalize(t, C_FINALIZE);
  return 0;
}

/* ------------------------------------------------------------------------------------------
 * Parent: load, fork, collect, print
 * ------------------------------------------------------------------------------------------ */

static const char* validate(const ncclxNet_v1_t* net) {
  static char why[160];
  if (!net->name || !net->name[0]) return "name is NULL or empty";
  if (net->abiVersion != NCCLX_NET_ABI_VERSION) {
    snprintf(why, sizeof(why), "ABI version %d, this tool speaks %d", net->abiVersion,
             NCCLX_NET_ABI_VERSION);
    return why;
  }
  const struct {
    const char* name;
    const void* fn;
  } ops[] = {{"init", (const void*)net->init},
             {"devices", (const void*)net->devices},
             {"getProperties", (const void*)net->getProperties},
             {"listen", (const void*)net->listen},
             {"connect", (const void*)net->connect},
             {"accept", (const void*)net->accept},
             {"regMr", (const void*)net->regMr},
             {"deregMr", (const void*)net->deregMr},
             {"isend", (const void*)net->isend},
             {"irecv", (const void*)net->irecv},
             {"test", (const void*)net->test},
             {"closeSend", (const void*)net->closeSend},
             {"closeRecv", (const void*)net->closeRecv},
             {"closeListen", (const void*)net->closeListen},
             {"finalize", (const void*)net->finalize}};
  for (size_t i = 0; i < sizeof(ops) / sizeof(ops[0]); i++)
    if (!ops[i].fn) {
      snprintf(why, sizeof(why), "required operation %s is NULL", ops[i].name);
      return why;
    }
  return NULL;
}

static void usage(void) {
  fprintf(stderr,
          "usage: ncclx-net-check [options] PLUGIN.so\n"
          "  -o KEY=VALUE  plugin configuration, as in its [net.NAME] section (repeatable)\n"
          "  -d DEV        device to test (default 0)\n"
          "  -t SECONDS    bound for each check (default 30)\n"
          "  -k SECONDS    bound from killing a peer to the receiver's error (default 20)\n"
          "  --no-kill     skip the killed-peer check\n"
          "  -v            show the plugin's INFO log lines (-vv: TRACE)\n"
          "PLUGIN.so is a path to a network plugin (libncclx-net-NAME.so). The built-in\n"
          "'socket' and 'shm' networks are part of libncclx and not exported, so they cannot be\n"
          "tested by name; build them as standalone plugins to test them.\n");
}

static int parseArgs(int argc, char** argv, ncOptions* o) {
  memset(o, 0, sizeof(*o));
  o->bound = 30;
  o->killBound = 20;
  for (int i = 1; i < argc; i++) {
    const char* a = argv[i];
    const char* v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(a, "-o") && v) {
      if (netcheckAddOption(v) != 0) return -1;
      i++;
    } else if (!strcmp(a, "-d") && v) {
      o->dev = atoi(v), i++;
    } else if (!strcmp(a, "-t") && v) {
      o->bound = atof(v), i++;
    } else if (!strcmp(a, "-k") && v) {
      o->killBound = atof(v), i++;
    } else if (!strcmp(a, "--no-kill")) {
      o->noKill = 1;
    } else if (!strcmp(a, "-v")) {
      netcheckLogLevel = NCCLX_LOG_INFO;
    } else if (!strcmp(a, "-vv")) {
      netcheckLogLevel = NCCLX_LOG_TRACE;
    } else if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
      usage();
      exit(0);
    } else if (a[0] == '-' || o->path) {
      fprintf(stderr, "ncclx-net-check: unexpected argument '%s'\n", a);
      return -1;
    } else {
      o->path = a;
    }
  }
  if (!o->path) {
    fprintf(stderr, "ncclx-net-check: no plugin given\n");
    return -1;
  }
  if (o->dev < 0 || o->bound < 1 || o->killBound < 1) {
    fprintf(stderr, "ncclx-net-check: -d must be >= 0, -t and -k at least 1 second\n");
    return -1;
  }
  if (!strchr(o->path, '/')) {
    fprintf(stderr,
            "ncclx-net-check: '%s' is not a path to a shared object. Built-in networks "
            "(socket, shm) are not exported by libncclx and cannot be tested by name; give a "
            "path such as ./plugins/libncclx-net-ofi.so\n",
            o->path);
    return -1;
  }
  return 0;
}

typedef struct {
  int seen;
  int status;
  double seconds;
  char msg[500];
} ncResult;

static pid_t forkRole(int role, const ncclxNet_v1_t* net, const ncOptions* opt, int resultFd,
                      int peerFd, int victimFd, const int* closeFds, int ncloseFds) {
  pid_t pid = fork();
  if (pid != 0) return pid;
  prctl(PR_SET_PDEATHSIG, SIGKILL); /* never outlive the parent (e.g. killed by a test timeout) */
  if (getppid() == 1) _exit(1);
  for (int i = 0; i < ncloseFds; i++)
    if (closeFds[i] >= 0 && closeFds[i] != peerFd && closeFds[i] != victimFd &&
        closeFds[i] != resultFd)
      close(closeFds[i]);
  netcheckRole = roleNames[role];
  ncRoleId = role;
  ncResultFd = resultFd;
  ncTester t;
  memset(&t, 0, sizeof(t));
  t.net = net;
  t.opt = opt;
  t.role = role;
  t.peerFd = peerFd;
  t.victimFd = victimFd;
  exit(role == ROLE_VICTIM ? runVictim(&t) : runChecks(&t)); /* exit: leak checkers run */
}

int main(int argc, char** argv) {
  ncOptions opt;
  if (parseArgs(argc, argv, &opt) != 0) {
    usage();
    return 2;
  }
  static ncResult results[NCHECKS][NROLES];
  void* dl = dlopen(opt.path, RTLD_NOW | RTLD_LOCAL);
  const ncclxNet_v1_t* net = dl ? dlsym(dl, NCCLX_NET_PLUGIN_SYMBOL) : NULL;
  const char* why = !dl    ? dlerror()
                    : !net ? "no exported symbol " NCCLX_NET_PLUGIN_SYMBOL
                           : validate(net);
  results[C_LOAD][ROLE_PARENT].seen = 1;
  results[C_LOAD][ROLE_PARENT].status = why ? NC_FAIL : NC_PASS;
  snprintf(results[C_LOAD][ROLE_PARENT].msg, sizeof(results[C_LOAD][ROLE_PARENT].msg), "%s%s%s%s",
           why ? why : "plugin '", why ? "" : net->name, why ? "" : "'",
           why || !net ? "" : (net->getPollFd ? ", getPollFd present" : ", no getPollFd"));
  printf("ncclx-net-check: %s, device %d, %d option(s)\n", opt.path, opt.dev, netcheckSection.n);
  fflush(stdout);

  pid_t pids[NROLES] = {0, -1, -1, -1};
  double started = ncNow();
  if (!why) {
    int res[2], rs[2], rv[2];
    if (pipe(res) != 0 || socketpair(AF_UNIX, SOCK_STREAM, 0, rs) != 0 ||
        socketpair(AF_UNIX, SOCK_STREAM, 0, rv) != 0) {
      perror("ncclx-net-check: pipe");
      return 2;
    }
    int all[6] = {res[0], res[1], rs[0], rs[1], rv[0], rv[1]};
    signal(SIGPIPE, SIG_IGN);
    pids[ROLE_RECV] = forkRole(ROLE_RECV, net, &opt, res[1], rs[0], rv[0], all, 6);
    pids[ROLE_SEND] = forkRole(ROLE_SEND, net, &opt, res[1], rs[1], -1, all, 6);
    if (!opt.noKill)
      pids[ROLE_VICTIM] = forkRole(ROLE_VICTIM, net, &opt, res[1], -1, rv[1], all, 6);
    for (int i = 1; i < 6; i++) close(all[i]);

    double deadline = started + 12 * opt.bound + opt.killBound + 30;
    int timedOut = 0;
    for (;;) {
      ncRecord r;
      int rr = ncReadAll(res[0], &r, sizeof(r), deadline - ncNow());
      if (rr == -2) {
        timedOut = 1;
        break;
      }
      if (rr != 0) break; /* every child closed its end: all done */
      if (r.check < 0 || r.check >= NCHECKS || r.role <= 0 || r.role >= NROLES) continue;
      if (r.status == NC_KILLME) {
        if (pids[ROLE_VICTIM] > 0) kill(pids[ROLE_VICTIM], SIGKILL);
        continue;
      }
      ncResult* slot = &results[r.check][r.role];
      slot->seen = 1;
      slot->status = r.status;
      slot->seconds = r.seconds;
      snprintf(slot->msg, sizeof(slot->msg), "%s", r.msg);
    }
    close(res[0]);
    for (int role = 1; role < NROLES; role++) {
      if (pids[role] <= 0) continue;
      if (timedOut) kill(pids[role], SIGKILL);
      int st = 0;
      if (waitpid(pids[role], &st, 0) == pids[role] && WIFSIGNALED(st) && role != ROLE_VICTIM)
        fprintf(stderr, "ncclx-net-check: the %s process died with signal %d\n", roleNames[role],
                WTERMSIG(st));
    }
    if (timedOut)
      fprintf(stderr, "ncclx-net-check: gave up after %.0f s; missing results are failures\n",
              ncNow() - started);
  }

  /* A plugin that refused to start fails once, with its reason, not once per check. */
  int initFailed = 0;
  for (int role = 0; role < NROLES; role++)
    initFailed |= results[C_INIT][role].seen && results[C_INIT][role].status == NC_FAIL;
  int passed = 0, failed = 0, skipped = 0;
  for (int c = 0; c < NCHECKS; c++) {
    if (initFailed && c > C_INIT) continue;
    int status = NC_PASS, any = 0;
    double secs = 0;
    char detail[1400] = "";
    size_t len = 0;
    for (int role = 0; role < NROLES; role++) {
      const ncResult* r = &results[c][role];
      int expected = (checkInfo[c].sides & SIDE(role)) != 0;
      if (!r->seen && !expected) continue;
      if (!r->seen && why && c != C_LOAD) continue; /* nothing ran */
      any = 1;
      int st = r->seen ? r->status : NC_FAIL;
      if (r->seen && r->seconds > secs) secs = r->seconds;
      if (st == NC_FAIL)
        status = NC_FAIL;
      else if (st == NC_SKIP && status == NC_PASS)
        status = NC_SKIP;
      len += (size_t)snprintf(
          detail + len, sizeof(detail) - len, "%s%s: %s", len ? "; " : "", roleNames[role],
          r->seen ? r->msg : "no result (the process failed, exited or timed out)");
      if (len >= sizeof(detail)) len = sizeof(detail) - 1;
    }
    if (!any) {
      status = NC_FAIL;
      snprintf(detail, sizeof(detail), "not run (the plugin did not load)");
    }
    printf("%s  %-48s %6.2fs  %s\n",
           status == NC_PASS   ? "PASS"
           : status == NC_SKIP ? "SKIP"
                               : "FAIL",
           checkInfo[c].name, secs, detail);
    if (status == NC_PASS)
      passed++;
    else if (status == NC_SKIP)
      skipped++;
    else
      failed++;
  }
  if (initFailed)
    printf("ncclx-net-check: init failed (see its line above and the plugin's log), so the "
           "other %d checks were not run\n", NCHECKS - C_INIT - 1);
  printf("ncclx-net-check: %d passed, %d failed, %d skipped in %.1f s (%s)\n", passed, failed,
         skipped, ncNow() - started, opt.path);
  return failed ? 1 : 0;
}
