/* A communicator's error state: sticky failures (with the abort notice to every rank), argument
 * errors that leave it usable, the checks at each call, and how a rank is named in messages. */
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "bootstrap/bootstrap.h"
#include "comm/comm.h"
#include "util/debug.h"

ncclxResult_t commCheckHandle(const struct ncclxComm* comm) {
  if (comm == NULL) return ncclxSetError(ncclxInvalidArgument, "communicator is NULL");
  if (comm->magic != NCCLX_COMM_MAGIC)
    return ncclxSetError(ncclxInvalidArgument,
                         "communicator %p is not a live ncclx communicator", (const void*)comm);
  if (atomic_load(&comm->destroyed))
    return ncclxSetError(ncclxInvalidUsage, "communicator %p was destroyed or aborted",
                         (const void*)comm);
  return ncclxSuccess;
}

static ncclxResult_t commSetErrorV(struct ncclxComm* comm, ncclxResult_t res, int notify,
                                   const char* fmt, va_list ap) {
  char msg[sizeof(comm->lastError)];
  vsnprintf(msg, sizeof(msg), fmt, ap);
  int first = 0;
  pthread_mutex_lock(&comm->errLock);
  if (atomic_load(&comm->asyncError) == ncclxSuccess) {
    snprintf(comm->lastError, sizeof(comm->lastError), "%s", msg);
    comm->lastErrorStamp = ncclxErrorStampNext();
    atomic_store(&comm->asyncError, res);
    first = 1;
  }
  pthread_mutex_unlock(&comm->errLock);
  ncclxSetError(res, "%s", msg);
  /* Only the first failure is news for the other ranks; later ones are consequences. */
  if (notify && first && comm->bootstrap) {
    char notice[sizeof(comm->lastError) + 32];
    snprintf(notice, sizeof(notice), "rank %d reports: %s", comm->rank, msg);
    bootstrapBroadcastAbort(comm->bootstrap, notice);
  }
  return res;
}

ncclxResult_t commSetError(struct ncclxComm* comm, ncclxResult_t res, const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  commSetErrorV(comm, res, 0, fmt, ap);
  va_end(ap);
  return res;
}

ncclxResult_t commFailV(struct ncclxComm* comm, ncclxResult_t res, const char* fmt, va_list ap) {
  return commSetErrorV(comm, res, 1, fmt, ap);
}

ncclxResult_t commFail(struct ncclxComm* comm, ncclxResult_t res, const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  commSetErrorV(comm, res, 1, fmt, ap);
  va_end(ap);
  return res;
}

ncclxResult_t commPollAbort(struct ncclxComm* comm) {
  if (atomic_load(&comm->abortFlag)) return commCheckHealthy(comm);
  char notice[1024];
  if (bootstrapPollAbort(comm->bootstrap, notice, sizeof(notice)))
    return commSetError(comm, ncclxRemoteError, "%s", notice);
  return ncclxSuccess;
}

ncclxResult_t commCheckHealthySlow(struct ncclxComm* comm) {
  ncclxResult_t err = (ncclxResult_t)atomic_load(&comm->asyncError);
  if (err == ncclxSuccess && atomic_load(&comm->abortFlag)) err = ncclxInvalidUsage;
  if (err == ncclxSuccess) return ncclxSuccess;
  pthread_mutex_lock(&comm->errLock);
  char msg[sizeof(comm->lastError)];
  snprintf(msg, sizeof(msg), "%s", comm->lastError[0] ? comm->lastError : "communicator was aborted");
  pthread_mutex_unlock(&comm->errLock);
  /* Repeat the cause for every later call, without a WARN line each time. */
  ncclxLogSetRank(comm->rank);
  return ncclxSetError(err, "communicator failed earlier: %s", msg);
}

ncclxResult_t commArgError(struct ncclxComm* comm, ncclxResult_t res, const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  commArgErrorV(comm, res, fmt, ap);
  va_end(ap);
  return res;
}

ncclxResult_t commArgErrorV(struct ncclxComm* comm, ncclxResult_t res, const char* fmt, va_list ap) {
  ncclxSetErrorV(res, fmt, ap);
  pthread_mutex_lock(&comm->errLock);
  if (atomic_load(&comm->asyncError) == ncclxSuccess) {
    snprintf(comm->lastError, sizeof(comm->lastError), "%s", ncclxThreadLastError());
    comm->lastErrorStamp = ncclxThreadErrorStamp();
  }
  pthread_mutex_unlock(&comm->errLock);
  return res;
}

const char* commDescribeRank(const struct ncclxComm* comm, int rank, char* buf, size_t size) {
  if (rank >= 0 && rank < comm->nranks && comm->peerInfo)
    snprintf(buf, size, "rank %d (host %s, pid %d)", rank, comm->peerInfo[rank].hostname,
             comm->peerInfo[rank].pid);
  else
    snprintf(buf, size, "rank %d", rank);
  return buf;
}
