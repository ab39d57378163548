/* The progress engine: post every transfer of a step, drive them all to completion, and
 * turn a dead peer, a wrong size, a timeout or an abort into one clear error. */
#include "exec/xfer.h"

#include <poll.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "util/debug.h"
#include "util/host.h"
#include "transport/shm/net_shm.h"
#include "transport/peers.h"
#include "prof/prof.h"
#include "util/reduce.h"
#include "transport/transport.h"
#include "comm/waitnote.h"

/* ---------------- registered memory of the running operation ---------------- */

static _Thread_local const xferReg* publishedRegs;
static _Thread_local int publishedCount;

void xferPublishRegs(const xferReg* regs, int n) {
  publishedRegs = regs;
  publishedCount = n;
}

/* One thread-local test when nothing is registered (host memory). */
static inline void* xferMhandle(const void* netComm, const void* p, size_t len) {
  if (__builtin_expect(publishedCount == 0, 1)) return NULL;
  uintptr_t a = (uintptr_t)p;
  for (int i = 0; i < publishedCount; i++) {
    const xferReg* r = &publishedRegs[i];
    uintptr_t base = (uintptr_t)r->base;
    if (r->netComm == netComm && a >= base && a - base <= r->bytes && len <= r->bytes - (a - base))
      return r->mhandle;
  }
  return NULL;
}

#define XFER_STACK_STATES 64 /* pollfds of one sleep */


static void stepStart(ncclxXfer* x, struct xferState* s, int i) {
  struct ncclxComm* comm = s->comm;
  if (!profEnabled(comm, NCCLX_PROFILE_STEP | NCCLX_PROFILE_NET) || x->peer == comm->rank) return;
  ncclxProfilerEventDescr_v1_t d;
  memset(&d, 0, sizeof(d));
  d.type = NCCLX_PROFILE_STEP;
  d.parent = comm->curProfEvent;
  d.rank = comm->rank;
  d.step.peer = x->peer;
  d.step.isSend = x->isSend;
  d.step.bytes = x->bytes;
  d.step.step = i;
  d.step.transport = comm->tp[transportFor(comm, x->peer)].net->name;
  if (comm->profiler->startEvent(comm->profilerCtx, &s->event, &d) != ncclxSuccess) s->event = NULL;
}

static void stepState(struct xferState* s, ncclxProfilerState_t state, size_t bytes) {
  if (!s->event) return;
  ncclxProfilerStateArgs_v1_t args = {.bytes = bytes};
  s->comm->profiler->recordEventState(s->event, state, &args);
}

static void stepStop(struct xferState* s) {
  if (!s->event) return;
  s->comm->profiler->stopEvent(s->event);
  s->event = NULL;
}

static double nowSec(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static size_t msgBytes(const ncclxXfer* x, const struct xferState* s, size_t msg) {
  size_t off = msg * s->chunk;
  if (x->bytes == 0) return 0;
  return x->bytes - off < s->chunk ? x->bytes - off : s->chunk;
}

static const char* opName(const struct ncclxComm* comm) {
  return comm->curOpName ? comm->curOpName : "operation";
}

/* Transfers to self are copies; pair the k-th send with the k-th receive of a comm. */
static ncclxResult_t xferSelf(ncclxXfer* x, struct xferState* s, int n) {
  for (int i = 0; i < n; i++) {
    if (!x[i].isSend || x[i].peer != s[i].comm->rank || s[i].msgsDone == s[i].msgsTotal) continue;
    int j = 0;
    for (; j < n; j++)
      if (!x[j].isSend && x[j].peer == s[j].comm->rank && s[j].comm == s[i].comm &&
          s[j].msgsDone != s[j].msgsTotal)
        break;
    if (j == n)
      return commSetError(s[i].comm, ncclxInvalidUsage,
                          "%s #%llu: rank %d sends %zu bytes to itself with no matching receive",
                          opName(s[i].comm), (unsigned long long)s[i].comm->curOpSeq,
                          s[i].comm->rank, x[i].bytes);
    if (x[j].bytes != x[i].bytes)
      return commSetError(s[i].comm, ncclxInvalidUsage,
                          "%s #%llu: rank %d sends %zu bytes to itself but receives %zu",
                          opName(s[i].comm), (unsigned long long)s[i].comm->curOpSeq,
                          s[i].comm->rank, x[i].bytes, x[j].bytes);
    if (x[j].redDst) {
      size_t sz = ncclxTypeSize(x[j].redType);
      const void* other = x[j].redOther;
      ncclxReduce2(x[j].redDst, x[j].redPeerFirst ? x[i].buf : other,
                   x[j].redPeerFirst ? other : x[i].buf, x[i].bytes / sz, x[j].redType, x[j].redOp);
    } else if (x[i].bytes && x[j].buf != x[i].buf) {
      memmove(x[j].buf, x[i].buf, x[i].bytes);
    }
    s[i].msgsPosted = s[i].msgsDone = s[i].msgsTotal;
    s[j].msgsPosted = s[j].msgsDone = s[j].msgsTotal;
    x[i].doneBytes = x[i].bytes;
    x[j].doneBytes = x[j].bytes;
  }
  for (int i = 0; i < n; i++)
    if (!x[i].isSend && x[i].peer == s[i].comm->rank && s[i].msgsDone != s[i].msgsTotal)
      return commSetError(s[i].comm, ncclxInvalidUsage,
                          "%s #%llu: rank %d receives from itself with no matching send",
                          opName(s[i].comm), (unsigned long long)s[i].comm->curOpSeq,
                          s[i].comm->rank);
  return ncclxSuccess;
}

/* Connect what this step needs, per communicator. */
static ncclxResult_t xferConnect(ncclxXfer* x, struct xferState* s, int n) {
  /* Fast path, no allocation: every connection exists (they are never removed while the
   * communicator lives). */
  int missing = 0;
  for (int i = 0; i < n && !missing; i++) {
    const struct ncclxPeerConn* c = &s[i].comm->conns[x[i].peer];
    missing = x[i].peer != s[i].comm->rank && (x[i].isSend ? c->sendComm : c->recvComm) == NULL;
  }
  if (!missing) return ncclxSuccess;
  int* peers = malloc(sizeof(int) * (size_t)(2 * n + 2));
  if (!peers) return ncclxSetError(ncclxSystemError, "out of memory");
  ncclxResult_t res = ncclxSuccess;
  for (int i = 0; i < n && res == ncclxSuccess; i++) {
    struct ncclxComm* comm = s[i].comm;
    int seen = 0;
    for (int j = 0; j < i; j++) seen |= s[j].comm == comm;
    if (seen) continue;
    int ns = 0, nr = 0;
    for (int j = i; j < n; j++)
      if (s[j].comm == comm && x[j].isSend) peers[ns++] = x[j].peer;
    for (int j = i; j < n; j++)
      if (s[j].comm == comm && !x[j].isSend) peers[n + 1 + nr++] = x[j].peer;
    res = peersEnsure(comm, peers, ns, peers + n + 1, nr);
  }
  free(peers);
  return res;
}

/* Wait up to 300 ms for an abort notice from another rank. */
static int xferAwaitNotice(struct ncclxComm* comm, char* notice, size_t size) {
  double deadline = nowSec() + 0.3;
  do {
    if (bootstrapPollAbort(comm->bootstrap, notice, size)) return 1;
    usleep(5000);
  } while (nowSec() < deadline);
  return 0;
}

/* The signature every message of the running call carries (xfer.h). */
static int xferSignature(int kind, size_t bytes) {
  size_t folded = bytes ^ ((bytes >> XFER_SIG_BYTES_BITS) * (size_t)0x9e3779b1u);
  return NCCLX_NET_TAG_SIGNED | (kind & (XFER_SIG_KINDS - 1)) << XFER_SIG_BYTES_BITS |
         (int)(folded & XFER_SIG_BYTES_MASK);
}

/* Posting turns (see struct ncclxPeerConn): taken in start order, passed on once a
 * transfer's last message is posted, or when its run ends without posting it (the run
 * failed, and the communicator with it). */
static void xferTakeTurns(struct ncclxComm* comm, ncclxXfer* x, struct xferState* s, int n) {
  for (int i = 0; i < n; i++) {
    if (x[i].peer == s[i].comm->rank || s[i].msgsDone == s[i].msgsTotal) continue;
    size_t bytes = comm->xferSigBytes == XFER_SIG_PER_TRANSFER ? x[i].bytes : comm->xferSigBytes;
    s[i].tag = x[i].tagArrived = xferSignature(comm->xferSigKind, bytes);
    s[i].hasTag = 1;
    struct ncclxPeerConn* c = &s[i].comm->conns[x[i].peer];
    s[i].ticket = c->ticketNext[x[i].isSend]++;
    s[i].hasTicket = 1;
  }
}

static void xferPassTurn(ncclxXfer* x, struct xferState* s, int i) {
  if (!s[i].hasTicket) return;
  struct ncclxPeerConn* c = &s[i].comm->conns[x[i].peer];
  if (c->ticketServing[x[i].isSend] == s[i].ticket) c->ticketServing[x[i].isSend]++;
  s[i].hasTicket = 0;
}

/* A transport failed a request: when one of this run's receives saw a message signed by
 * another call (net.h), that is the error to report, whichever request the transport
 * failed first (the connection fails whole, so later posts and tests fail too). */
static ncclxResult_t xferCallMismatch(ncclxXfer* x, struct xferState* s, int n) {
  for (int j = 0; j < n; j++) {
    if (x[j].isSend || !s[j].hasTag || x[j].tagArrived == s[j].tag) continue;
    struct ncclxComm* comm = s[j].comm;
    char who[128], why[320];
    xferDescribeMismatch(x[j].tagArrived, s[j].tag, why, sizeof(why));
    return commFail(comm, ncclxInvalidUsage, "%s #%llu: %s %s", opName(comm),
                    (unsigned long long)comm->curOpSeq,
                    commDescribeRank(comm, x[j].peer, who, sizeof(who)), why);
  }
  return ncclxSuccess;
}

static ncclxResult_t xferPost(ncclxXfer* x, struct xferState* s, int n, int i, int* progress) {
  struct ncclxComm* comm = s[i].comm;
  struct ncclxPeerConn* c = &comm->conns[x[i].peer];
  const ncclxNet_t* net = c->net;
  while (s[i].msgsPosted < s[i].msgsTotal && x[i].inflight < XFER_MAX_INFLIGHT) {
    if (c->ticketServing[x[i].isSend] != s[i].ticket) return ncclxSuccess; /* keep order */
    int g = x[i].sendAfter - 1; /* forward only what has arrived */
    if (g >= 0 && s[g].msgsDone <= s[i].msgsPosted && s[g].msgsDone < s[g].msgsTotal)
      return ncclxSuccess;
    size_t len = msgBytes(&x[i], &s[i], s[i].msgsPosted);
    int slot = (x[i].head + x[i].inflight) % XFER_MAX_INFLIGHT;
    char* ptr = x[i].redDst ? (char*)x[i].buf + (size_t)slot * s[i].chunk
                            : (char*)x[i].buf + s[i].msgsPosted * s[i].chunk;
    void* req = NULL;
    ncclxResult_t res;
    /* The STEP event (or NULL) is the parent of the plugin's own NET events. */
    void* phandle = s[i].event;
    /* Device memory a plugin reads directly was registered (NCCLX_PTR_CUDA) by gpu_net.c;
     * host memory: NULL. */
    void* mh = xferMhandle(x[i].isSend ? c->sendComm : c->recvComm, ptr, len);
    int tag = s[i].tag;
    if (x[i].isSend) {
      if (net == &ncclxNetShm) ncclxShmSendKind(c->sendComm, comm->xferSendKind);
      res = net->isend(c->sendComm, ptr, len, tag, mh, phandle, &req);
    } else {
      void* data = ptr;
      res = net->irecv(c->recvComm, 1, &data, &len, &x[i].tagArrived, &mh, &phandle, &req);
    }
    if (res != ncclxSuccess) {
      char who[128], notice[1024];
      ncclxResult_t mismatch = xferCallMismatch(x, s, n);
      if (mismatch != ncclxSuccess) return mismatch;
      /* As in xferTest1: a peer that closed may only be the messenger of another rank's
       * failure, whose abort notice names the culprit. */
      if (xferAwaitNotice(comm, notice, sizeof(notice)))
        return commSetError(comm, ncclxRemoteError, "%s", notice);
      return commFail(comm, res, "%s #%llu: network '%s' refused to %s %zu bytes %s %s",
                      opName(comm), (unsigned long long)comm->curOpSeq, net->name,
                      x[i].isSend ? "send" : "receive", len, x[i].isSend ? "to" : "from",
                      commDescribeRank(comm, x[i].peer, who, sizeof(who)));
    }
    if (!req) return ncclxSuccess; /* transport busy: retry later */
    x[i].reqs[slot] = req;
    x[i].reqBytes[slot] = len;
    x[i].inflight++;
    __atomic_store_n(&x[i].postedBytes, x[i].postedBytes + len, __ATOMIC_RELAXED);
    if (s[i].msgsPosted++ == 0) stepState(&s[i], NCCLX_PROFILE_STATE_POSTED, 0);
    if (s[i].msgsPosted == s[i].msgsTotal) xferPassTurn(x, s, i);
    *progress = 1;
  }
  return ncclxSuccess;
}

/* Receive-and-reduce: message msg (in staging slot `slot`) has arrived. */
static void reduceArrived(ncclxXfer* x, const struct xferState* s, int slot, size_t msg,
                          size_t bytes) {
  size_t off = msg * s->chunk, sz = ncclxTypeSize(x->redType);
  const char* in = (const char*)x->buf + (size_t)slot * s->chunk;
  const char* other = (const char*)x->redOther + off;
  ncclxReduce2((char*)x->redDst + off, x->redPeerFirst ? in : other, x->redPeerFirst ? other : in,
               bytes / sz, x->redType, x->redOp);
}


/* Message at the head slot of x[i] is complete. */
static void xferRetire(ncclxXfer* x, struct xferState* s, int i, int* progress) {
  int slot = x[i].head;
  x[i].head = (x[i].head + 1) % XFER_MAX_INFLIGHT;
  x[i].inflight--;
  s[i].msgsDone++;
  *progress = 1;
  __atomic_store_n(&x[i].doneBytes, x[i].doneBytes + x[i].reqBytes[slot], __ATOMIC_RELAXED);
  stepState(&s[i], NCCLX_PROFILE_STATE_PROGRESS, x[i].doneBytes);
  if (s[i].msgsDone == s[i].msgsTotal) stepStop(&s[i]);
}

/* Receive-and-reduce: reduce the arrived messages in order, each once the gating send (if
 * any) has sent the same chunk of the buffer we are about to overwrite. */
static void xferReduceArrived(ncclxXfer* x, struct xferState* s, int i, int* progress) {
  int g = x[i].redAfter - 1;
  while (x[i].arrived > 0) {
    size_t msg = s[i].msgsDone;
    if (g >= 0 && s[g].msgsDone <= msg && s[g].msgsDone < s[g].msgsTotal) return;
    reduceArrived(&x[i], &s[i], x[i].head, msg, x[i].reqBytes[x[i].head]);
    x[i].arrived--;
    xferRetire(x, s, i, progress);
  }
}

static ncclxResult_t xferTest1(ncclxXfer* x, struct xferState* s, int n, int i, int* progress) {
  struct ncclxComm* comm = s[i].comm;
  while (x[i].inflight > x[i].arrived) {
    int slot = (x[i].head + x[i].arrived) % XFER_MAX_INFLIGHT;
    int done = 0;
    size_t got = 0;
    ncclxResult_t res = comm->conns[x[i].peer].net->test(x[i].reqs[slot], &done, &got);
    char who[128];
    if (res != ncclxSuccess) {
      x[i].inflight = x[i].arrived = 0; /* the transport freed the failed request */
      ncclxResult_t mismatch = xferCallMismatch(x, s, n);
      if (mismatch != ncclxSuccess) return mismatch;
      /* The peer may only be the messenger: when another rank failed first, it has sent an
       * abort notice naming the culprit, which we prefer to blaming the closed link. */
      char notice[1024];
      if (xferAwaitNotice(comm, notice, sizeof(notice)))
        return commSetError(comm, ncclxRemoteError, "%s", notice);
      return commFail(comm, ncclxRemoteError,
                      "%s closed the connection during %s #%llu (%s %zu of %zu bytes; it exited, "
                      "failed, or sent more than was expected)",
                      commDescribeRank(comm, x[i].peer, who, sizeof(who)), opName(comm),
                      (unsigned long long)comm->curOpSeq, x[i].isSend ? "sent" : "received",
                      x[i].doneBytes, x[i].bytes);
    }
    if (!done) break;
    if (!x[i].isSend && got != x[i].reqBytes[slot]) {
      x[i].inflight--; /* released by the transport; keeps the dump honest */
      return commFail(comm, ncclxInvalidUsage,
                      "%s #%llu: %s sent %zu bytes where %zu were expected "
                      "(counts differ between ranks?)",
                      opName(comm), (unsigned long long)comm->curOpSeq,
                      commDescribeRank(comm, x[i].peer, who, sizeof(who)), got, x[i].reqBytes[slot]);
    }
    *progress = 1;
    if (x[i].redDst)
      x[i].arrived++; /* stays in its staging slot until reduced */
    else
      xferRetire(x, s, i, progress);
  }
  if (x[i].redDst) xferReduceArrived(x, s, i, progress);
  return ncclxSuccess;
}

/* Nothing moved for a while: sleep until a receive connection or the bootstrap (abort
 * notices) has something, or a short time passes. */
static void xferSleep(ncclxXfer* x, struct xferState* s, int n, struct ncclxComm* comm) {
  struct pollfd fds[XFER_STACK_STATES + 1];
  int nfds = 0, sendsWaiting = 0;
  for (int i = 0; i < n && nfds < XFER_STACK_STATES; i++) {
    if (s[i].msgsDone == s[i].msgsTotal) continue;
    const struct ncclxPeerConn* c = &s[i].comm->conns[x[i].peer];
    int fd = x[i].isSend ? c->sendFd : c->recvFd;
    if (fd < 0) sendsWaiting = 1;
    else fds[nfds++] = (struct pollfd){.fd = fd, .events = POLLIN};
  }
  xferSleepOn(comm, fds, nfds, sendsWaiting);
}

void xferSleepOn(struct ncclxComm* comm, struct pollfd* fds, int nfds, int noFd) {
  int bfd = bootstrapPollFd(comm->bootstrap);
  if (bfd >= 0) fds[nfds++] = (struct pollfd){.fd = bfd, .events = POLLIN};
  if (noFd || nfds == 0) {
    usleep(50);
    return;
  }
  (void)poll(fds, (nfds_t)nfds, 2);
}

static ncclxResult_t xferCheckStuck(ncclxXfer* x, struct xferState* s, int n,
                                    struct ncclxComm* comm, double lastProgress) {
  char notice[1024];
  for (int i = 0; i < n; i++) {
    struct ncclxComm* c = s[i].comm;
    if (atomic_load(&c->abortFlag)) {
      ncclxResult_t res = commCheckHealthy(c);
      return res != ncclxSuccess ? res : ncclxInvalidUsage;
    }
  }
  if (bootstrapPollAbort(comm->bootstrap, notice, sizeof(notice)))
    return commSetError(comm, ncclxRemoteError, "%s", notice);
  double waited = nowSec() - lastProgress;
  int awaited[8], nAwaited = 0;
  for (int i = 0; i < n && nAwaited < 8; i++)
    if (s[i].msgsDone != s[i].msgsTotal && s[i].comm == comm) awaited[nAwaited++] = x[i].peer;
  NCCLX_CHECK(waitNoteCheck(comm, awaited, nAwaited, waited));
  if (comm->timeoutSec <= 0 || waited <= comm->timeoutSec) return ncclxSuccess;
  char list[1024] = "", who[128];
  size_t len = 0;
  for (int i = 0; i < n && len < sizeof(list) - 400; i++) {
    if (s[i].msgsDone == s[i].msgsTotal) continue;
    len += (size_t)snprintf(list + len, sizeof(list) - len, " %s %s (%zu of %zu bytes);",
                            x[i].isSend ? "sending to" : "receiving from",
                            commDescribeRank(s[i].comm, x[i].peer, who, sizeof(who)),
                            x[i].doneBytes, x[i].bytes);
  }
  if (nAwaited > 0) len = waitNoteDescribe(comm, awaited[0], list, len, sizeof(list));
  return commFail(comm, ncclxRemoteError, "timeout: no progress for %.0f s during %s #%llu, waiting on:%s",
                  comm->timeoutSec, opName(comm), (unsigned long long)comm->curOpSeq, list);
}

/* Waiting: spin, then yield, then sleep in poll().
 * Spinning pays while the peer we wait for runs on another core. It is pure loss when the
 * peer waits for the core we hold: with more ranks on this host than CPUs (8 ranks on 2
 * cores) we yield after a few polls, as Open MPI does when oversubscribed (measured: 2x
 * faster at 4 ranks on 2 cores than 200 polls). An adaptive budget for ranks <= CPUs was
 * tried and dropped: under outside load, yields make every wait look long, so it decayed
 * to a few polls and 2-rank latency tripled. */
#define XFER_YIELDS 200u      /* then sleep in poll(), but not before: */
#define XFER_YIELD_SEC 200e-6 /* ... this long without progress */

unsigned xferSpinPolls(const struct ncclxComm* comm) {
  return comm->ranksPerHostMax > hostCpus() ? XFER_SPIN_OVERSUBSCRIBED : XFER_SPIN_POLLS;
}

/* ---------------- runs: start, test, wait, end ---------------- */

/* A rank that was away (stopped, swapped out, computing) for half the timeout or more may
 * find its data delivered while its peers already failed this very call on their timeout:
 * it must fail it too, not return success. Their abort notices say so; reading them costs
 * syscalls, so only after such an absence, before a run (away between calls) and after it
 * (away inside one). */
static ncclxResult_t xferLateCheck(struct ncclxComm* comm, double awaySec) {
  if (comm->timeoutSec <= 0 || awaySec < comm->timeoutSec / 2) return ncclxSuccess;
  return commPollAbort(comm);
}

static ncclxResult_t xferStartWith(struct ncclxComm* comm, ncclxXfer* x, int n, ncclxXferRun* run,
                                   struct xferState* storage, int capacity) {
  memset(run, 0, sizeof(*run));
  run->comm = comm;
  run->x = x;
  run->n = n > 0 ? n : 0;
  run->pending = n > 0;
  if (n <= 0) return ncclxSuccess;
  struct xferState* s = n <= capacity ? storage : malloc(sizeof(*s) * (size_t)n);
  if (!s) {
    run->pending = 0;
    return run->res = commFail(comm, ncclxSystemError, "out of memory for %d transfers", n);
  }
  run->s = s;
  run->ownsStates = s != storage;
  for (int i = 0; i < n; i++) {
    s[i].comm = x[i].comm ? x[i].comm : comm;
    s[i].chunk = x[i].chunk ? x[i].chunk : s[i].comm->chunkBytes;
    s[i].msgsTotal = x[i].bytes == 0 ? 1 : (x[i].bytes + s[i].chunk - 1) / s[i].chunk;
    s[i].msgsPosted = s[i].msgsDone = 0;
    s[i].hasTicket = s[i].hasTag = 0;
    s[i].event = NULL;
    x[i].postedBytes = x[i].doneBytes = 0;
    x[i].inflight = x[i].head = x[i].arrived = 0;
  }
  run->live.xfers = x;
  run->live.n = n;
  pthread_mutex_lock(&comm->liveLock);
  comm->live = &run->live;
  pthread_mutex_unlock(&comm->liveLock);
  ncclxResult_t res = xferSelf(x, s, n);
  if (res == ncclxSuccess) res = xferConnect(x, s, n);
  if (res == ncclxSuccess) xferTakeTurns(comm, x, s, n);
  for (int i = 0; i < n && res == ncclxSuccess; i++)
    if (s[i].msgsDone != s[i].msgsTotal) stepStart(&x[i], &s[i], i);
  run->lastProgress = run->startTime = nowSec();
  if (res == ncclxSuccess) res = xferLateCheck(comm, run->startTime - comm->xferLastStart);
  comm->xferLastStart = run->startTime;
  run->spins = xferSpinPolls(comm);
  run->res = res;
  if (res != ncclxSuccess) run->pending = 0;
  else (void)xferTest(run, NULL); /* post what can go now */
  return res;
}

ncclxResult_t xferStart(struct ncclxComm* comm, ncclxXfer* x, int n, ncclxXferRun* run) {
  return xferStartWith(comm, x, n, run, run->inlineStates, XFER_RUN_STATES);
}

ncclxResult_t xferTest(ncclxXferRun* run, int* progressed) {
  ncclxXfer* x = run->x;
  struct xferState* s = run->s;
  int progress = 0, pending = 0;
  ncclxResult_t res = run->res;
  for (int i = 0; i < run->n && res == ncclxSuccess && run->pending; i++) {
    if (s[i].msgsDone == s[i].msgsTotal) continue;
    res = xferPost(x, s, run->n, i, &progress);
    if (res == ncclxSuccess) res = xferTest1(x, s, run->n, i, &progress);
    pending |= s[i].msgsDone != s[i].msgsTotal;
  }
  if (run->pending) run->pending = res == ncclxSuccess && pending;
  run->res = res;
  if (progress) run->idle = 0;
  if (progressed) *progressed = progress;
  return res;
}

/* Spin briefly (lowest latency when cores are free), then yield, then sleep in poll(). */
ncclxResult_t xferIdle(ncclxXferRun* run) {
  if (run->res != ncclxSuccess || !run->pending) return run->res;
  if (++run->idle < run->spins) return ncclxSuccess;
  if (run->idle == run->spins) run->lastProgress = nowSec(); /* stopped a few us ago */
  /* Sleep only after XFER_YIELD_SEC too: the shared-memory transport arms its doorbell
   * after ~50 us of idle test() calls, and a sleep before that waits for the poll
   * timeout instead of the peer's ring. */
  if (run->idle < run->spins + XFER_YIELDS || nowSec() - run->lastProgress < XFER_YIELD_SEC) {
    sched_yield();
    return ncclxSuccess;
  }
  xferSleep(run->x, run->s, run->n, run->comm);
  run->res = xferCheckStuck(run->x, run->s, run->n, run->comm, run->lastProgress);
  if (run->res != ncclxSuccess) run->pending = 0;
  return run->res;
}

ncclxResult_t xferWait(ncclxXferRun* run) {
  while (run->res == ncclxSuccess && run->pending) {
    int progress = 0;
    if (xferTest(run, &progress) != ncclxSuccess || !run->pending) break;
    if (!progress) (void)xferIdle(run);
  }
  return run->res;
}

ncclxResult_t xferEnd(ncclxXferRun* run) {
  struct ncclxComm* comm = run->comm;
  ncclxResult_t res = run->res;
  if (run->n <= 0) return res;
  if (res == ncclxSuccess && run->pending)
    res = commFail(comm, ncclxInternalError, "%s #%llu: transfers ended before they completed",
                   opName(comm), (unsigned long long)comm->curOpSeq);
  if (res == ncclxSuccess) res = xferLateCheck(comm, nowSec() - run->startTime);
  /* On failure, requests still in flight stay with the transport until the connection is
   * closed; the communicator is unusable from here on. */
  for (int i = 0; run->s && i < run->n; i++) {
    if (run->s[i].event && res != ncclxSuccess) {
      ncclxProfilerStateArgs_v1_t args = {.result = res, .message = ncclxThreadLastError()};
      comm->profiler->recordEventState(run->s[i].event, NCCLX_PROFILE_STATE_FAILED, &args);
    }
    stepStop(&run->s[i]);
    xferPassTurn(run->x, run->s, i);
  }
  pthread_mutex_lock(&comm->liveLock);
  if (comm->live == &run->live) comm->live = NULL;
  pthread_mutex_unlock(&comm->liveLock);
  if (run->ownsStates) free(run->s);
  run->s = NULL;
  run->n = 0;
  run->pending = 0;
  return res;
}

ncclxResult_t xferRun(struct ncclxComm* comm, ncclxXfer* x, int n) {
  if (n <= 0) return ncclxSuccess;
  ncclxXferRun run;
  struct xferState states[XFER_STACK_STATES];
  (void)xferStartWith(comm, x, n, &run, states, XFER_STACK_STATES);
  (void)xferWait(&run);
  return xferEnd(&run);
}

#define XFER_COPY_STEP ((size_t)256 << 10) /* bytes of xferRunCopying's copy per pass */

ncclxResult_t xferRunCopying(struct ncclxComm* comm, ncclxXfer* x, int n, void* dst,
                             const void* src, size_t bytes) {
  ncclxXferRun run;
  struct xferState states[XFER_STACK_STATES];
  (void)xferStartWith(comm, x, n, &run, states, XFER_STACK_STATES);
  size_t copied = 0;
  while (run.res == ncclxSuccess && (run.pending || copied < bytes)) {
    int progress = 0;
    if (run.pending && xferTest(&run, &progress) != ncclxSuccess) break;
    if (copied < bytes) {
      size_t len = bytes - copied < XFER_COPY_STEP ? bytes - copied : XFER_COPY_STEP;
      memcpy((char*)dst + copied, (const char*)src + copied, len);
      copied += len;
    } else if (!progress) {
      (void)xferIdle(&run);
    }
  }
  return xferEnd(&run);
}

ncclxResult_t xferSendRecv(struct ncclxComm* comm, int sendPeer, const void* sendBuf,
                           size_t sendBytes, int recvPeer, void* recvBuf, size_t recvBytes) {
  ncclxXfer x[2];
  int n = 0;
  memset(x, 0, sizeof(x));
  if (sendPeer >= 0) x[n++] = (ncclxXfer){.peer = sendPeer, .isSend = 1, .buf = (void*)sendBuf, .bytes = sendBytes};
  if (recvPeer >= 0) x[n++] = (ncclxXfer){.peer = recvPeer, .isSend = 0, .buf = recvBuf, .bytes = recvBytes};
  return xferRun(comm, x, n);
}

ncclxResult_t xferSend(struct ncclxComm* comm, int peer, const void* buf, size_t bytes) {
  return xferSendRecv(comm, peer, buf, bytes, -1, NULL, 0);
}

ncclxResult_t xferRecv(struct ncclxComm* comm, int peer, void* buf, size_t bytes) {
  return xferSendRecv(comm, -1, NULL, 0, peer, buf, bytes);
}
