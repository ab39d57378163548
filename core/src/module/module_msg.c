/* The core's message operations for feature modules (ncclx/module.h, "Messages"): single
 * messages on a peer's connection for operations that learn their sizes while they run
 * (AllToAllvDynamic, MoE), and the waiting rules of the progress engine (sched/xfer.c): spin,
 * then sleep on the connections, abort notices, wait notes, the timeout. */
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <time.h>
#include <unistd.h>

#include "comm/comm.h"
#include "module/module.h"
#include "comm/waitnote.h"
#include "exec/xfer.h"
#include "util/debug.h"

static double nowSec(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Errors here are the first half of a sentence the module completes with linkFailed (which
 * names the peer and the operation), so they are recorded without a log line of their own. */
static const struct ncclxPeerConn* connOf(ncclxComm_t comm, int peer) {
  return (unsigned)peer < (unsigned)comm->nranks && comm->conns ? &comm->conns[peer] : NULL;
}

static ncclxResult_t noConnection(ncclxComm_t comm, int peer, int isSend) {
  return ncclxSetError(ncclxInternalError, "module message %s rank %d: no connection (call connect first; comm %s)",
                       isSend ? "to" : "from", peer, comm->name);
}

ncclxResult_t moduleMsgSend(ncclxComm_t comm, int peer, const void* buf, size_t bytes, void** req) {
  *req = NULL;
  const struct ncclxPeerConn* c = connOf(comm, peer);
  if (!c || !c->net || !c->sendComm) return noConnection(comm, peer, 1);
  ncclxResult_t res = c->net->isend(c->sendComm, (void*)buf, bytes, comm->rank, NULL, NULL, req);
  if (res != ncclxSuccess) return ncclxSetErrorQuiet(res, "network '%s' refused a %zu-byte message", c->net->name, bytes);
  return ncclxSuccess;
}

ncclxResult_t moduleMsgRecv(ncclxComm_t comm, int peer, void* buf, size_t bytes, void** req) {
  *req = NULL;
  const struct ncclxPeerConn* c = connOf(comm, peer);
  if (!c || !c->net || !c->recvComm) return noConnection(comm, peer, 0);
  int tag = peer;
  ncclxResult_t res = c->net->irecv(c->recvComm, 1, &buf, &bytes, &tag, NULL, NULL, req);
  if (res != ncclxSuccess) return ncclxSetErrorQuiet(res, "network '%s' refused a %zu-byte message", c->net->name, bytes);
  return ncclxSuccess;
}

ncclxResult_t moduleMsgTest(ncclxComm_t comm, int peer, void* req, int* done, size_t* got) {
  *done = 0;
  *got = 0;
  const struct ncclxPeerConn* c = connOf(comm, peer);
  if (!c || !c->net || !req) return noConnection(comm, peer, 0);
  /* On failure the network has freed the request. */
  if (c->net->test(req, done, got) != ncclxSuccess) return ncclxSetErrorQuiet(ncclxRemoteError, "the connection failed");
  return ncclxSuccess;
}

/* The link's peer is often only the messenger of another rank's failure: its abort notice,
 * when one arrives within 300 ms, says what happened first-hand. */
ncclxResult_t moduleLinkFailed(ncclxComm_t comm, const char* fmt, ...) {
  char notice[1024];
  double deadline = nowSec() + 0.3;
  do {
    if (bootstrapPollAbort(comm->bootstrap, notice, sizeof(notice)))
      return commSetError(comm, ncclxRemoteError, "%s", notice);
    usleep(5000);
  } while (nowSec() < deadline);
  va_list ap;
  va_start(ap, fmt);
  commFailV(comm, ncclxRemoteError, fmt, ap);
  va_end(ap);
  return ncclxRemoteError;
}

unsigned moduleSpinPolls(ncclxComm_t comm) { return xferSpinPolls(comm); }

void moduleWaitPeers(ncclxComm_t comm, const int* peers, const int* isSend, int n) {
  struct pollfd fds[64];
  int nfds = 0, noFd = 0;
  for (int i = 0; i < n && nfds < 63; i++) {
    const struct ncclxPeerConn* c = connOf(comm, peers[i]);
    if (!c) continue;
    int fd = isSend[i] ? c->sendFd : c->recvFd;
    if (fd < 0) noFd = 1; /* a transport without a descriptor: poll it again soon */
    else fds[nfds++] = (struct pollfd){.fd = fd, .events = POLLIN};
  }
  xferSleepOn(comm, fds, nfds, noFd);
}

ncclxResult_t moduleWaitCheck(ncclxComm_t comm, const int* awaited, int nAwaited, double waitedSec,
                              const char* waitingOn) {
  NCCLX_CHECK(commPollAbort(comm));
  NCCLX_CHECK(waitNoteCheck(comm, awaited, nAwaited, waitedSec));
  if (comm->timeoutSec <= 0 || waitedSec <= comm->timeoutSec) return ncclxSuccess;
  char list[1280];
  size_t len = (size_t)snprintf(list, sizeof(list), "%.1000s", waitingOn ? waitingOn : "");
  if (len >= sizeof(list)) len = sizeof(list) - 1;
  if (nAwaited > 0) len = waitNoteDescribe(comm, awaited[0], list, len, sizeof(list));
  return commFail(comm, ncclxRemoteError, "timeout: no progress for %.0f s during %s #%llu, waiting on:%s",
                  comm->timeoutSec, comm->curOpName ? comm->curOpName : "module operation",
                  (unsigned long long)comm->curOpSeq, list);
}
