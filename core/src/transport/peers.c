/* Network connections between ranks, made on first use.
 *
 * Each rank listens once per root communicator and publishes the handles in its peer info;
 * communicators split from it share those listeners (struct peersListener, reference
 * counted). A sender connects with the receiver's handle and sends a hello naming the
 * communicator (its hash) and its rank; the receiver accepts connections in whatever order
 * they come and files each under the rank its hello names, or parks it for the sharing
 * communicator it belongs to. Connects and accepts are progressed together, so two ranks
 * that need each other at the same moment cannot deadlock. */
#include "transport/peers.h"

#include <poll.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "config/config.h"
#include "util/debug.h"
#include "util/host.h"
#include "transport/shm/net_shm.h"
#include "transport/transport.h"
#include "comm/waitnote.h"

#define HELLO_MAGIC 0x6e63636c7868656cull

struct hello {
  uint64_t magic;
  uint64_t commHash;
  int32_t rank;
  int32_t reserved;
};

/* A received connection: its hello not complete yet, or read but for another sharer. */
struct pendingAccept {
  const ncclxNet_t* net; /* the transport it arrived on */
  void* recvComm;
  void* request;
  struct hello hello;
  struct pendingAccept* next;
};

/* The listeners of a root communicator and of every communicator split from it. Lock order:
 * a comm's connLock, then this lock. */
struct peersListener {
  pthread_mutex_t lock;
  int refs; /* communicators sharing it */
  const ncclxNet_t* net[NCCLX_NUM_TP];
  void* listenComm[NCCLX_NUM_TP];
  char handle[NCCLX_NUM_TP][NCCLX_NET_HANDLE_MAXSIZE];
  struct pendingAccept* unmatched; /* hello not complete yet */
  struct pendingAccept* parked;    /* hello read, for another sharer than the one that read it */
  uint64_t* hashes;                /* the sharers' commHash */
  int nHashes, capHashes;
};

static atomic_int listenersOpened, listenersLive;

int peersListenersOpened(void) { return atomic_load(&listenersOpened); }
int peersListenersLive(void) { return atomic_load(&listenersLive); }

/* A send connection being set up. */
struct pendingConnect {
  int peer;
  void* sendComm;
  void* request; /* hello in flight */
  struct hello hello;
};

static double nowSec(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void closeAccepts(struct pendingAccept* pa) {
  while (pa) {
    struct pendingAccept* next = pa->next;
    pa->net->closeRecv(pa->recvComm);
    free(pa);
    pa = next;
  }
}

/* With L->lock held: add a sharer's hash (0 on success). */
static int addSharer(struct peersListener* L, uint64_t hash) {
  if (L->nHashes == L->capHashes) {
    int cap = L->capHashes ? 2 * L->capHashes : 4;
    uint64_t* grown = realloc(L->hashes, sizeof(*grown) * (size_t)cap);
    if (!grown) return -1;
    L->hashes = grown;
    L->capHashes = cap;
  }
  L->hashes[L->nHashes++] = hash;
  return 0;
}

static int isSharer(const struct peersListener* L, uint64_t hash) {
  for (int i = 0; i < L->nHashes; i++)
    if (L->hashes[i] == hash) return 1;
  return 0;
}

/* Fill this rank's handles and the comm's (borrowed) listenComms from L. */
static void useListener(struct ncclxComm* comm, struct peersListener* L) {
  struct ncclxPeerInfo* me = &comm->peerInfo[comm->rank];
  comm->listener = L;
  for (int t = 0; t < NCCLX_NUM_TP; t++) {
    comm->tp[t].listenComm = L->listenComm[t];
    memcpy(t == NCCLX_TP_SHM ? me->shmHandle : me->netHandle, L->handle[t], NCCLX_NET_HANDLE_MAXSIZE);
  }
  me->shmEnabled = comm->tp[NCCLX_TP_SHM].net != NULL;
}

static void listenerFree(struct peersListener* L) {
  closeAccepts(L->unmatched);
  closeAccepts(L->parked);
  for (int t = 0; t < NCCLX_NUM_TP; t++)
    if (L->listenComm[t]) L->net[t]->closeListen(L->listenComm[t]);
  pthread_mutex_destroy(&L->lock);
  free(L->hashes);
  free(L);
  atomic_fetch_sub(&listenersLive, 1);
}

ncclxResult_t peersListen(struct ncclxComm* comm) {
  struct peersListener* L = calloc(1, sizeof(*L));
  if (!L || addSharer(L, comm->commHash) != 0) {
    free(L);
    return ncclxSetError(ncclxSystemError, "out of memory for the transport listeners");
  }
  pthread_mutex_init(&L->lock, NULL);
  L->refs = 1;
  atomic_fetch_add(&listenersOpened, 1);
  atomic_fetch_add(&listenersLive, 1);
  for (int t = 0; t < NCCLX_NUM_TP; t++) {
    struct ncclxTransport* tp = &comm->tp[t];
    if (!tp->net) continue;
    L->net[t] = tp->net;
    ncclxResult_t res = tp->net->listen(tp->ctx, tp->dev, L->handle[t], &L->listenComm[t]);
    if (res != ncclxSuccess || !L->listenComm[t]) {
      L->listenComm[t] = NULL;
      listenerFree(L);
      return ncclxSetError(res != ncclxSuccess ? res : ncclxInternalError,
                           "transport '%s' failed to listen on device %d", tp->net->name, tp->dev);
    }
  }
  useListener(comm, L);
  return ncclxSuccess;
}

ncclxResult_t peersListenShared(struct ncclxComm* child, struct ncclxComm* parent) {
  struct peersListener* L = parent->listener;
  int same = L != NULL;
  for (int t = 0; same && t < NCCLX_NUM_TP; t++)
    same = child->tp[t].net == L->net[t] && (!L->net[t] || child->tp[t].dev == parent->tp[t].dev);
  if (!same) return peersListen(child); /* e.g. the child's config turned shared memory off */
  pthread_mutex_lock(&L->lock);
  int err = addSharer(L, child->commHash);
  if (!err) L->refs++;
  pthread_mutex_unlock(&L->lock);
  if (err) return ncclxSetError(ncclxSystemError, "out of memory sharing the parent's listeners");
  useListener(child, L);
  return ncclxSuccess;
}

int peersOpenCount(const struct ncclxComm* comm) {
  int n = 0;
  for (int i = 0; i < comm->nranks; i++) n += (comm->conns[i].sendComm != NULL) + (comm->conns[i].recvComm != NULL);
  return n;
}

/* Large shm messages: double copy through the ring while the host has a CPU for every four
 * ranks, single copy (CMA) beyond. Measured with ncclx-perf on 2 AMD CPUs (medians of 3-5
 * alternating runs, 32 KiB-16 MiB): double copy 1.3-2.4x CMA's busbw at 2 ranks on every
 * collective, mostly ahead at 4, ahead or even at 8 (broadcast up to 2x); at 16 ranks even.
 * Beyond, a receiver that pulls alone (the sender needs no CPU) should win. Where every rank
 * has a CPU and process_vm_readv is fast on every rank's host (comm->cmaFastAll), one copy
 * wins (api/comm_lifecycle.c, cmaFastHere); with ranks sharing CPUs it was mixed even there (an Intel host, 4
 * ranks: all-reduce 256 KiB 141 us against 104, reduce-scatter 256 KiB 63 against 97). */
static int shmPreferCopy(const struct ncclxComm* comm) {
  if (commRanksOwnCpus(comm) && comm->cmaFastAll) return 0;
  return comm->ranksPerHostMax <= 4 * hostCpus();
}

/* One step of every pending connect; returns progress made (0/1). */
static ncclxResult_t stepConnect(struct ncclxComm* comm, struct pendingConnect* pc, int* progress) {
  int t = transportFor(comm, pc->peer);
  const struct ncclxTransport* tp = &comm->tp[t];
  const ncclxNet_t* net = tp->net;
  const char* handle = t == NCCLX_TP_SHM ? comm->peerInfo[pc->peer].shmHandle : comm->peerInfo[pc->peer].netHandle;
  char who[128];
  if (!pc->sendComm) {
    ncclxResult_t res = net->connect(tp->ctx, tp->dev, handle, &pc->sendComm);
    if (res != ncclxSuccess)
      return commFail(comm, res, "cannot connect to %s over %s",
                      commDescribeRank(comm, pc->peer, who, sizeof(who)), net->name);
    if (!pc->sendComm) return ncclxSuccess;
    comm->connectsMade++;
    *progress = 1;
    if (t == NCCLX_TP_SHM) {
      ncclxShmPreferCopy(pc->sendComm, shmPreferCopy(comm));
      ncclxShmSharedCpus(pc->sendComm, !commRanksOwnCpus(comm));
    }
    pc->hello = (struct hello){HELLO_MAGIC, comm->commHash, comm->rank, 0};
  }
  if (!pc->request) {
    ncclxResult_t res = net->isend(pc->sendComm, &pc->hello, sizeof(pc->hello), 0, NULL, NULL, &pc->request);
    if (res != ncclxSuccess)
      return commFail(comm, res, "cannot send hello to %s",
                      commDescribeRank(comm, pc->peer, who, sizeof(who)));
    if (!pc->request) return ncclxSuccess;
    *progress = 1;
  }
  int done = 0;
  ncclxResult_t res = net->test(pc->request, &done, NULL);
  if (res != ncclxSuccess)
    return commFail(comm, res, "%s closed the connection while connecting",
                    commDescribeRank(comm, pc->peer, who, sizeof(who)));
  if (done) {
    struct ncclxPeerConn* c = &comm->conns[pc->peer];
    c->net = net;
    c->sendComm = pc->sendComm;
    c->sendFd = -1;
    if (net->getPollFd) net->getPollFd(c->sendComm, &c->sendFd);
    pc->peer = -1;
    *progress = 1;
    TRACE(NCCLX_LOG_NET, "connected to rank %d", (int)(c - comm->conns));
  }
  return ncclxSuccess;
}

/* A completed hello for this comm: file it under its rank, or refuse it. */
static void fileAccept(struct ncclxComm* comm, struct pendingAccept* pa) {
  const struct hello* h = &pa->hello;
  const ncclxNet_t* net = pa->net;
  int valid = h->rank >= 0 && h->rank < comm->nranks && comm->conns[h->rank].recvComm == NULL &&
              comm->tp[transportFor(comm, h->rank)].net == net;
  if (!valid) {
    comm->acceptsRefused++;
    WARN("refused a %s connection: rank %d of this communicator %s", net->name, h->rank,
         h->rank < 0 || h->rank >= comm->nranks ? "does not exist"
         : comm->conns[h->rank].recvComm      ? "is already connected"
                                              : "must use another transport");
    net->closeRecv(pa->recvComm);
  } else {
    struct ncclxPeerConn* c = &comm->conns[h->rank];
    c->net = net;
    c->recvComm = pa->recvComm;
    c->recvFd = -1;
    if (net->getPollFd) net->getPollFd(c->recvComm, &c->recvFd);
    TRACE(NCCLX_LOG_NET, "accepted %s connection from rank %d", net->name, h->rank);
  }
  free(pa);
}

/* Accept new connections on every shared listener and read hellos; files those for this
 * comm under their rank, parks those for another sharer, refuses the rest. Then takes the
 * connections other sharers parked for this comm. */
static ncclxResult_t stepAccept(struct ncclxComm* comm, int* progress) {
  struct peersListener* L = comm->listener;
  ncclxResult_t res = ncclxSuccess;
  pthread_mutex_lock(&L->lock);
  for (int t = 0; t < NCCLX_NUM_TP && res == ncclxSuccess; t++) {
    if (!L->listenComm[t]) continue;
    for (;;) {
      void* rc = NULL;
      res = L->net[t]->accept(L->listenComm[t], &rc);
      if (res != ncclxSuccess) {
        res = commFail(comm, res, "transport '%s' accept failed", L->net[t]->name);
        break;
      }
      if (!rc) break;
      struct pendingAccept* pa = calloc(1, sizeof(*pa));
      if (!pa) {
        L->net[t]->closeRecv(rc);
        res = commFail(comm, ncclxSystemError, "out of memory accepting a connection");
        break;
      }
      pa->net = L->net[t];
      pa->recvComm = rc;
      pa->next = L->unmatched;
      L->unmatched = pa;
      *progress = 1;
    }
  }
  for (struct pendingAccept** link = &L->unmatched; res == ncclxSuccess && *link;) {
    struct pendingAccept* pa = *link;
    const ncclxNet_t* net = pa->net;
    if (!pa->request) {
      void* data = &pa->hello;
      size_t size = sizeof(pa->hello);
      int tag = 0;
      ncclxResult_t r = net->irecv(pa->recvComm, 1, &data, &size, &tag, NULL, NULL, &pa->request);
      if (r != ncclxSuccess) {
        res = commFail(comm, r, "cannot receive a connection's hello");
        break;
      }
      if (!pa->request) {
        link = &pa->next;
        continue;
      }
    }
    int done = 0;
    size_t got = 0;
    ncclxResult_t r = net->test(pa->request, &done, &got);
    if (r == ncclxSuccess && !done) {
      link = &pa->next;
      continue;
    }
    *link = pa->next;
    *progress = 1;
    const struct hello* h = &pa->hello;
    int ok = r == ncclxSuccess && got == sizeof(*h) && h->magic == HELLO_MAGIC;
    if (ok && h->commHash == comm->commHash) {
      fileAccept(comm, pa);
    } else if (ok && isSharer(L, h->commHash)) {
      pa->next = L->parked; /* another communicator's: it takes it on its next step */
      L->parked = pa;
    } else {
      comm->acceptsRefused++;
      WARN("refused a %s connection: %s (hello of %zu bytes, rank %d)", net->name,
           r != ncclxSuccess ? "it failed before saying hello" : "its hello is not from a peer of this communicator",
           got, r == ncclxSuccess ? h->rank : -1);
      net->closeRecv(pa->recvComm);
      free(pa);
    }
  }
  for (struct pendingAccept** link = &L->parked; *link;) {
    struct pendingAccept* pa = *link;
    if (pa->hello.commHash != comm->commHash) {
      link = &pa->next;
      continue;
    }
    *link = pa->next;
    *progress = 1;
    fileAccept(comm, pa);
  }
  pthread_mutex_unlock(&L->lock);
  return res;
}

/* Nothing moved for a while: sleep until a transport listener or the bootstrap has news, at
 * most ms. A rank that finished init early and waits for peers still initializing must not
 * take the CPU they need (128 ranks on 2 cores: waking every 200 us cost more CPU than the
 * whole init of the late ones). Shared memory's listener has no descriptor: the bound on
 * the sleep covers it. */
#define IDLE_POLL_FDS 16

static void idleSleep(struct ncclxComm* comm, int ms) {
  struct pollfd fds[IDLE_POLL_FDS + NCCLX_NUM_TP + 1];
  int n = 0;
  struct peersListener* L = comm->listener;
  pthread_mutex_lock(&L->lock); /* getPollFd may set up the descriptor: one caller at a time */
  for (int t = 0; t < NCCLX_NUM_TP; t++) {
    int fd = -1;
    if (L->listenComm[t] && L->net[t]->getPollFd && L->net[t]->getPollFd(L->listenComm[t], &fd) == ncclxSuccess &&
        fd >= 0)
      fds[n++] = (struct pollfd){.fd = fd, .events = POLLIN};
  }
  /* Accepted connections whose hello is still on its way. */
  for (struct pendingAccept* pa = L->unmatched; pa && n < IDLE_POLL_FDS + NCCLX_NUM_TP; pa = pa->next) {
    int fd = -1;
    if (pa->net->getPollFd && pa->net->getPollFd(pa->recvComm, &fd) == ncclxSuccess && fd >= 0)
      fds[n++] = (struct pollfd){.fd = fd, .events = POLLIN};
  }
  pthread_mutex_unlock(&L->lock);
  int bfd = bootstrapPollFd(comm->bootstrap);
  if (bfd >= 0) fds[n++] = (struct pollfd){.fd = bfd, .events = POLLIN};
  (void)poll(fds, (nfds_t)n, ms);
}

ncclxResult_t peersEnsure(struct ncclxComm* comm, const int* sendPeers, int nsend,
                          const int* recvPeers, int nrecv) {
  /* Fast path: everything already connected (no lock: connections are never removed
   * while the communicator is alive). */
  int missing = 0;
  for (int i = 0; i < nsend && !missing; i++)
    missing = sendPeers[i] != comm->rank && comm->conns[sendPeers[i]].sendComm == NULL;
  for (int i = 0; i < nrecv && !missing; i++)
    missing = recvPeers[i] != comm->rank && comm->conns[recvPeers[i]].recvComm == NULL;
  if (!missing) return ncclxSuccess;

  pthread_mutex_lock(&comm->connLock);
  ncclxResult_t res = ncclxSuccess;
  struct pendingConnect* pcs = calloc((size_t)nsend + 1, sizeof(*pcs));
  int npc = 0;
  if (!pcs) res = commFail(comm, ncclxSystemError, "out of memory connecting to peers");
  for (int i = 0; res == ncclxSuccess && i < nsend; i++) {
    int p = sendPeers[i], dup = 0;
    if (p == comm->rank || comm->conns[p].sendComm) continue;
    for (int j = 0; j < npc; j++) dup |= pcs[j].peer == p;
    if (!dup) pcs[npc++] = (struct pendingConnect){.peer = p};
  }
  double start = nowSec(), lastProgress = start;
  unsigned idle = 0;
  while (res == ncclxSuccess) {
    int progress = 0, pending = 0;
    for (int i = 0; i < npc && res == ncclxSuccess; i++) {
      if (pcs[i].peer < 0) continue;
      res = stepConnect(comm, &pcs[i], &progress);
      pending |= pcs[i].peer >= 0;
    }
    int needAccept = 0;
    for (int i = 0; i < nrecv; i++)
      needAccept |= recvPeers[i] != comm->rank && comm->conns[recvPeers[i]].recvComm == NULL;
    if (res == ncclxSuccess && needAccept) res = stepAccept(comm, &progress);
    if (res != ncclxSuccess || (!pending && !needAccept)) break;
    if (progress) {
      lastProgress = nowSec();
      idle = 0;
      continue;
    }
    if (++idle < 64) continue;
    if (idle < 128) {
      sched_yield();
      continue;
    }
    /* Sleeps of 1, 2, 4, then 8 ms: a peer still in its init may take a while, and dozens of
     * waiting ranks polling every millisecond would take the CPU it needs. Socket traffic
     * wakes us at once; the bound is the latency of a shared-memory connect (no descriptor),
     * paid once per peer. */
    unsigned sleeps = idle - 128;
    idleSleep(comm, sleeps < 4 ? 1 : sleeps < 8 ? 2 : sleeps < 16 ? 4 : 8);
    char notice[1024];
    int awaited[8], nAwaited = 0;
    for (int i = 0; i < npc && nAwaited < 8; i++)
      if (pcs[i].peer >= 0) awaited[nAwaited++] = pcs[i].peer;
    for (int i = 0; i < nrecv && nAwaited < 8; i++)
      if (recvPeers[i] != comm->rank && !comm->conns[recvPeers[i]].recvComm) awaited[nAwaited++] = recvPeers[i];
    if (atomic_load(&comm->abortFlag)) {
      res = commCheckHealthy(comm);
      if (res == ncclxSuccess) res = ncclxInvalidUsage;
    } else if (bootstrapPollAbort(comm->bootstrap, notice, sizeof(notice))) {
      res = commSetError(comm, ncclxRemoteError, "%s", notice);
    } else if ((res = waitNoteCheck(comm, awaited, nAwaited, nowSec() - lastProgress)) != ncclxSuccess) {
      /* the ranks run different calls: the error names both */
    } else if (comm->timeoutSec > 0 && nowSec() - lastProgress > comm->timeoutSec) {
      char list[1024] = "", who[128];
      size_t len = 0;
      for (int i = 0; i < npc && len < sizeof(list) - 130; i++)
        if (pcs[i].peer >= 0)
          len += (size_t)snprintf(list + len, sizeof(list) - len, " to %s;",
                                  commDescribeRank(comm, pcs[i].peer, who, sizeof(who)));
      for (int i = 0; i < nrecv && len < sizeof(list) - 130; i++)
        if (recvPeers[i] != comm->rank && !comm->conns[recvPeers[i]].recvComm)
          len += (size_t)snprintf(list + len, sizeof(list) - len, " from %s;",
                                  commDescribeRank(comm, recvPeers[i], who, sizeof(who)));
      if (nAwaited > 0) len = waitNoteDescribe(comm, awaited[0], list, len, sizeof(list));
      res = commFail(comm, ncclxRemoteError,
                     "timeout: no connection progress for %.0f s during %s #%llu; missing:%s",
                     comm->timeoutSec, comm->curOpName ? comm->curOpName : "connection setup",
                     (unsigned long long)comm->curOpSeq, list);
    }
  }
  /* Connections half made when we give up are closed; finished ones stay filed. */
  for (int i = 0; i < npc; i++)
    if (pcs[i].peer >= 0 && pcs[i].sendComm)
      comm->tp[transportFor(comm, pcs[i].peer)].net->closeSend(pcs[i].sendComm);
  free(pcs);
  pthread_mutex_unlock(&comm->connLock);
  return res;
}

ncclxResult_t peersConnectAll(struct ncclxComm* comm) {
  int* all = malloc(sizeof(int) * (size_t)comm->nranks);
  if (!all) return ncclxSetError(ncclxSystemError, "out of memory");
  for (int i = 0; i < comm->nranks; i++) all[i] = i;
  ncclxResult_t res = peersEnsure(comm, all, comm->nranks, all, comm->nranks);
  free(all);
  return res;
}

void peersClose(struct ncclxComm* comm) {
  pthread_mutex_lock(&comm->connLock);
  for (int i = 0; comm->conns && i < comm->nranks; i++) {
    struct ncclxPeerConn* c = &comm->conns[i];
    if (c->sendComm) c->net->closeSend(c->sendComm);
    if (c->recvComm) c->net->closeRecv(c->recvComm);
    c->sendComm = c->recvComm = NULL;
  }
  struct peersListener* L = comm->listener;
  comm->listener = NULL;
  for (int t = 0; t < NCCLX_NUM_TP; t++) comm->tp[t].listenComm = NULL;
  if (L) {
    /* Stop being a sharer: connections parked for this comm are closed, later ones refused. */
    pthread_mutex_lock(&L->lock);
    for (int i = 0; i < L->nHashes; i++)
      if (L->hashes[i] == comm->commHash) {
        L->hashes[i] = L->hashes[--L->nHashes];
        break;
      }
    struct pendingAccept *mine = NULL, **link = &L->parked;
    while (*link) {
      struct pendingAccept* pa = *link;
      if (pa->hello.commHash == comm->commHash) {
        *link = pa->next;
        pa->next = mine;
        mine = pa;
      } else {
        link = &pa->next;
      }
    }
    int last = --L->refs == 0;
    pthread_mutex_unlock(&L->lock);
    closeAccepts(mine);
    if (last) listenerFree(L);
  }
  pthread_mutex_unlock(&comm->connLock);
}

int peersSingleCopyAllowed(void) {
  const char* v = ncclxConfigGet("net.shm", "single_copy");
  return !v || strcmp(v, "none") != 0;
}
