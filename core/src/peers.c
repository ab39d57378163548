/* Network connections between ranks, made on first use.
 *
 * Each rank listens once per communicator and publishes the handle in its peer info. A
 * sender connects with the receiver's handle and sends a hello naming its rank; the
 * receiver accepts connections in whatever order they come and files each under the rank
 * its hello names. Connects and accepts are progressed together, so two ranks that need
 * each other at the same moment cannot deadlock. */
#include "peers.h"

#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "debug.h"
#include "transport.h"

#define HELLO_MAGIC 0x6e63636c7868656cull

struct hello {
  uint64_t magic;
  uint64_t commHash;
  int32_t rank;
  int32_t reserved;
};

/* A received connection whose hello has not arrived yet. */
struct pendingAccept {
  const ncclxNet_t* net; /* the transport it arrived on */
  void* recvComm;
  void* request;
  struct hello hello;
  struct pendingAccept* next;
};

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

ncclxResult_t peersListen(struct ncclxComm* comm) {
  struct ncclxPeerInfo* me = &comm->peerInfo[comm->rank];
  for (int t = 0; t < NCCLX_NUM_TP; t++) {
    struct ncclxTransport* tp = &comm->tp[t];
    if (!tp->net) continue;
    char* handle = t == NCCLX_TP_SHM ? me->shmHandle : me->netHandle;
    memset(handle, 0, NCCLX_NET_HANDLE_MAXSIZE);
    ncclxResult_t res = tp->net->listen(tp->ctx, tp->dev, handle, &tp->listenComm);
    if (res != ncclxSuccess || !tp->listenComm)
      return ncclxSetError(res != ncclxSuccess ? res : ncclxInternalError,
                           "transport '%s' failed to listen on device %d", tp->net->name, tp->dev);
  }
  me->shmEnabled = comm->tp[NCCLX_TP_SHM].net != NULL;
  return ncclxSuccess;
}

int peersOpenCount(const struct ncclxComm* comm) {
  int n = 0;
  for (int i = 0; i < comm->nranks; i++) n += (comm->conns[i].sendComm != NULL) + (comm->conns[i].recvComm != NULL);
  return n;
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

/* Accept new connections on every transport and read hellos; files finished ones under
 * their rank. A hello must arrive on the transport that rank should use. */
static ncclxResult_t stepAccept(struct ncclxComm* comm, int* progress) {
  for (int t = 0; t < NCCLX_NUM_TP; t++) {
    struct ncclxTransport* tp = &comm->tp[t];
    if (!tp->net) continue;
    for (;;) {
      void* rc = NULL;
      ncclxResult_t res = tp->net->accept(tp->listenComm, &rc);
      if (res != ncclxSuccess) return commFail(comm, res, "transport '%s' accept failed", tp->net->name);
      if (!rc) break;
      struct pendingAccept* pa = calloc(1, sizeof(*pa));
      if (!pa) return commFail(comm, ncclxSystemError, "out of memory accepting a connection");
      pa->net = tp->net;
      pa->recvComm = rc;
      pa->next = comm->unmatchedAccepts;
      comm->unmatchedAccepts = pa;
      *progress = 1;
    }
  }
  for (struct pendingAccept** link = (struct pendingAccept**)&comm->unmatchedAccepts; *link;) {
    struct pendingAccept* pa = *link;
    const ncclxNet_t* net = pa->net;
    if (!pa->request) {
      void* data = &pa->hello;
      size_t size = sizeof(pa->hello);
      int tag = 0;
      ncclxResult_t res = net->irecv(pa->recvComm, 1, &data, &size, &tag, NULL, NULL, &pa->request);
      if (res != ncclxSuccess) return commFail(comm, res, "cannot receive a connection's hello");
      if (!pa->request) {
        link = &pa->next;
        continue;
      }
    }
    int done = 0;
    size_t got = 0;
    ncclxResult_t res = net->test(pa->request, &done, &got);
    if (res == ncclxSuccess && !done) {
      link = &pa->next;
      continue;
    }
    *link = pa->next;
    *progress = 1;
    const struct hello* h = &pa->hello;
    int valid = res == ncclxSuccess && got == sizeof(*h) && h->magic == HELLO_MAGIC &&
                h->commHash == comm->commHash && h->rank >= 0 && h->rank < comm->nranks &&
                comm->conns[h->rank].recvComm == NULL &&
                comm->tp[transportFor(comm, h->rank)].net == net;
    if (!valid) {
      comm->acceptsRefused++;
      WARN("refused a %s connection: %s (hello of %zu bytes, rank %d)", net->name,
           res != ncclxSuccess ? "it failed before saying hello" : "its hello is not from a peer of this communicator",
           got, res == ncclxSuccess ? h->rank : -1);
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
  return ncclxSuccess;
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
    usleep(idle < 1024 ? 20 : 200);
    char notice[1024];
    if (atomic_load(&comm->abortFlag)) {
      res = commCheckHealthy(comm);
      if (res == ncclxSuccess) res = ncclxInvalidUsage;
    } else if (bootstrapPollAbort(comm->bootstrap, notice, sizeof(notice))) {
      res = commSetError(comm, ncclxRemoteError, "%s", notice);
    } else if (comm->timeoutSec > 0 && nowSec() - lastProgress > comm->timeoutSec) {
      char list[512] = "", who[128];
      size_t len = 0;
      for (int i = 0; i < npc && len < sizeof(list) - 130; i++)
        if (pcs[i].peer >= 0)
          len += (size_t)snprintf(list + len, sizeof(list) - len, " to %s;",
                                  commDescribeRank(comm, pcs[i].peer, who, sizeof(who)));
      for (int i = 0; i < nrecv && len < sizeof(list) - 130; i++)
        if (recvPeers[i] != comm->rank && !comm->conns[recvPeers[i]].recvComm)
          len += (size_t)snprintf(list + len, sizeof(list) - len, " from %s;",
                                  commDescribeRank(comm, recvPeers[i], who, sizeof(who)));
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
  for (struct pendingAccept* pa = comm->unmatchedAccepts; pa;) {
    struct pendingAccept* next = pa->next;
    pa->net->closeRecv(pa->recvComm);
    free(pa);
    pa = next;
  }
  comm->unmatchedAccepts = NULL;
  for (int t = 0; t < NCCLX_NUM_TP; t++) {
    struct ncclxTransport* tp = &comm->tp[t];
    if (tp->net && tp->listenComm) tp->net->closeListen(tp->listenComm);
    tp->listenComm = NULL;
  }
  pthread_mutex_unlock(&comm->connLock);
}
