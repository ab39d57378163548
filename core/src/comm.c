/* Communicator lifecycle: init, split, finalize, destroy, abort, and its error state. */
#include "comm.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "config.h"
#include "debug.h"
#include "peers.h"
#include "stream.h"
#include "prof.h"
#include "transport.h"
#include "tune.h"

#define API __attribute__((visibility("default")))

/* Tags of the communicator's own bootstrap exchanges. */
#define TAG_PEERINFO 0x1001u
#define TAG_INIT_BARRIER 0x1002u
#define TAG_SPLIT 0x1003u

/* ---------------- error state ---------------- */

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

ncclxResult_t commFail(struct ncclxComm* comm, ncclxResult_t res, const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  commSetErrorV(comm, res, 1, fmt, ap);
  va_end(ap);
  return res;
}

ncclxResult_t commCheckHealthy(struct ncclxComm* comm) {
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
  ncclxSetErrorV(res, fmt, ap);
  va_end(ap);
  pthread_mutex_lock(&comm->errLock);
  if (atomic_load(&comm->asyncError) == ncclxSuccess)
    snprintf(comm->lastError, sizeof(comm->lastError), "%s", ncclxThreadLastError());
  pthread_mutex_unlock(&comm->errLock);
  return res;
}

ncclxResult_t commCheckCall(struct ncclxComm* comm, ncclxStream_t stream, const char* fn) {
  char why[512];
  ncclxResult_t res = commCheckHandle(comm);
  if (res != ncclxSuccess) {
    snprintf(why, sizeof(why), "%s", ncclxThreadLastError());
    return ncclxSetError(res, "%s: %s", fn, why);
  }
  ncclxLogSetRank(comm->rank);
  NCCLX_CHECK(commCheckHealthy(comm));
  res = streamCheckHandle(stream);
  if (res != ncclxSuccess) {
    snprintf(why, sizeof(why), "%s", ncclxThreadLastError());
    return commArgError(comm, res, "%s: %s", fn, why);
  }
  return ncclxSuccess;
}

const char* commDescribeRank(const struct ncclxComm* comm, int rank, char* buf, size_t size) {
  if (rank >= 0 && rank < comm->nranks && comm->peerInfo)
    snprintf(buf, size, "rank %d (host %s, pid %d)", rank, comm->peerInfo[rank].hostname,
             comm->peerInfo[rank].pid);
  else
    snprintf(buf, size, "rank %d", rank);
  return buf;
}

void* commScratch(struct ncclxComm* comm, size_t bytes) {
  if (bytes <= comm->scratchSize) return comm->scratch;
  size_t size = bytes < 4096 ? 4096 : bytes;
  void* p = NULL;
  if (posix_memalign(&p, 64, size) != 0) return NULL;
  free(comm->scratch);
  comm->scratch = p;
  comm->scratchSize = size;
  return p;
}

void commRetain(struct ncclxComm* comm) { atomic_fetch_add(&comm->refs, 1); }

void commRelease(struct ncclxComm* comm) {
  if (atomic_fetch_sub(&comm->refs, 1) != 1) return;
  pthread_mutex_destroy(&comm->connLock);
  pthread_mutex_destroy(&comm->execLock);
  pthread_mutex_destroy(&comm->errLock);
  pthread_mutex_destroy(&comm->liveLock);
  comm->magic = 0;
  free(comm);
}

/* ---------------- init ---------------- */

static uint64_t hashString(uint64_t h, const char* s) {
  for (; *s; s++) h = (h ^ (unsigned char)*s) * 0x100000001b3ull;
  return h;
}

static uint64_t hashMix(uint64_t h, uint64_t v) {
  for (int i = 0; i < 8; i++) h = (h ^ ((v >> (8 * i)) & 0xff)) * 0x100000001b3ull;
  return h;
}

/* Ranks in different network namespaces count as different hosts (that is how tests
 * emulate a cluster on one machine), so the identity is the hostname plus the namespace.
 * [core] host_id replaces both: for containers that share a hostname, or to make ranks of
 * one machine look like several hosts. */
static uint64_t hostIdentity(const char* hostname) {
  const char* forced = ncclxConfigGet("core", "host_id");
  if (forced && *forced) return hashString(0x84222325cbf29ce4ull, forced);
  uint64_t h = hashString(0xcbf29ce484222325ull, hostname);
  char ns[64];
  ssize_t n = readlink("/proc/self/ns/net", ns, sizeof(ns) - 1);
  if (n > 0) {
    ns[n] = '\0';
    h = hashString(h, ns);
  }
  return h;
}

/* Settings from ncclx.ini, overridden by the user's ncclxConfig_t. */
static ncclxResult_t commReadSettings(struct ncclxComm* comm, const ncclxConfig_t* config) {
  long timeout = 600, lazy = 1;
  int lazyBool = 1;
  size_t chunk = 512 * 1024;
  NCCLX_CHECK(ncclxConfigGetInt("core", "timeout_s", 600, 0, 100000000L, &timeout));
  NCCLX_CHECK(ncclxConfigGetBool("core", "lazy_connect", 1, &lazyBool));
  NCCLX_CHECK(ncclxConfigGetSize("core", "chunk_bytes", chunk, &chunk));
  lazy = lazyBool;
  if (config) {
    if (config->magic != NCCLX_CONFIG_MAGIC || config->size < sizeof(ncclxConfig_t))
      return ncclxSetError(ncclxInvalidArgument,
                           "ncclxConfig_t was not initialized with NCCLX_CONFIG_INITIALIZER");
    if (config->timeoutSec != NCCLX_CONFIG_UNDEF_INT) {
      if (config->timeoutSec < 0)
        return ncclxSetError(ncclxInvalidArgument, "ncclxConfig_t.timeoutSec %d is negative",
                             config->timeoutSec);
      timeout = config->timeoutSec;
    }
    if (config->lazyConnect != NCCLX_CONFIG_UNDEF_INT) lazy = config->lazyConnect != 0;
    if (config->commName) snprintf(comm->name, sizeof(comm->name), "%s", config->commName);
  }
  if (chunk < 4096) chunk = 4096;
  comm->timeoutSec = (double)timeout;
  comm->lazyConnect = (int)lazy;
  comm->chunkBytes = chunk;
  return ncclxSuccess;
}

static struct ncclxComm* commAlloc(int rank, int nranks) {
  struct ncclxComm* comm = calloc(1, sizeof(*comm));
  if (!comm) return NULL;
  comm->magic = NCCLX_COMM_MAGIC;
  comm->rank = rank;
  comm->nranks = nranks;
  pthread_mutex_init(&comm->connLock, NULL);
  pthread_mutex_init(&comm->execLock, NULL);
  pthread_mutex_init(&comm->errLock, NULL);
  pthread_mutex_init(&comm->liveLock, NULL);
  atomic_init(&comm->refs, 1);
  atomic_init(&comm->abortFlag, 0);
  atomic_init(&comm->asyncError, ncclxSuccess);
  atomic_init(&comm->destroyed, 0);
  return comm;
}

static void commFreeResources(struct ncclxComm* comm) {
  peersClose(comm);
  tuneCommFinalize(comm);
  profCommFinalize(comm);
  transportsClose(comm);
  if (comm->bootstrap) bootstrapRelease(comm->bootstrap);
  comm->bootstrap = NULL;
  free(comm->peerInfo);
  comm->peerInfo = NULL;
  free(comm->conns);
  comm->conns = NULL;
  free(comm->scratch);
  comm->scratch = NULL;
  comm->scratchSize = 0;
}

static void commCountHosts(struct ncclxComm* comm) {
  int nhosts = 0, maxPer = 0;
  for (int i = 0; i < comm->nranks; i++) {
    int seenBefore = 0, same = 0;
    for (int j = 0; j < comm->nranks; j++) {
      if (comm->peerInfo[j].hostHash != comm->peerInfo[i].hostHash) continue;
      same++;
      if (j < i) seenBefore = 1;
    }
    if (!seenBefore) nhosts++;
    if (same > maxPer) maxPer = same;
  }
  comm->nhosts = nhosts;
  comm->ranksPerHostMax = maxPer;
}

/* Everything after the bootstrap exists: network, peer info, plugins, optional eager
 * connections. Takes ownership of `b`. */
static ncclxResult_t commSetup(struct ncclxComm* comm, struct bootstrap* b, uint64_t commHash) {
  comm->bootstrap = b;
  comm->commHash = commHash;
  if (!comm->name[0]) snprintf(comm->name, sizeof(comm->name), "%016llx", (unsigned long long)commHash);

  NCCLX_CHECK(transportsOpen(comm));

  comm->peerInfo = calloc((size_t)comm->nranks, sizeof(*comm->peerInfo));
  comm->conns = calloc((size_t)comm->nranks, sizeof(*comm->conns));
  if (!comm->peerInfo || !comm->conns)
    return ncclxSetError(ncclxSystemError, "out of memory for %d peers", comm->nranks);
  for (int i = 0; i < comm->nranks; i++) comm->conns[i].sendFd = comm->conns[i].recvFd = -1;

  struct ncclxPeerInfo* me = &comm->peerInfo[comm->rank];
  me->rank = comm->rank;
  me->pid = (int)getpid();
  snprintf(me->hostname, sizeof(me->hostname), "%s", bootstrapHostname());
  me->hostHash = hostIdentity(me->hostname);
  NCCLX_CHECK(peersListen(comm));
  NCCLX_CHECK(bootstrapAllGather(b, comm->peerInfo, sizeof(*comm->peerInfo), TAG_PEERINFO));
  for (int i = 0; i < comm->nranks; i++)
    if (comm->peerInfo[i].rank != i)
      return ncclxSetError(ncclxInternalError, "peer info exchange is corrupt: slot %d says rank %d",
                           i, comm->peerInfo[i].rank);
  commCountHosts(comm);

  tuneCommInit(comm);
  profCommInit(comm);
  if (!comm->lazyConnect) NCCLX_CHECK(peersConnectAll(comm));
  NCCLX_CHECK(bootstrapBarrier(b, TAG_INIT_BARRIER));
  INFO(NCCLX_LOG_INIT,
       "comm %p name %s rank %d nranks %d hosts %d net %s dev %d shm %s timeout %.0fs %s connect - init complete",
       (void*)comm, comm->name, comm->rank, comm->nranks, comm->nhosts, comm->tp[NCCLX_TP_NET].net->name,
       comm->tp[NCCLX_TP_NET].dev, comm->tp[NCCLX_TP_SHM].net ? "on" : "off", comm->timeoutSec,
       comm->lazyConnect ? "lazy" : "eager");
  return ncclxSuccess;
}

static ncclxResult_t commInitRankImpl(ncclxComm_t* out, int nranks, const ncclxUniqueId* id,
                                      int rank, ncclxConfig_t* config) {
  if (!out) return ncclxSetError(ncclxInvalidArgument, "ncclxCommInitRank: comm pointer is NULL");
  *out = NULL;
  if (nranks < 1)
    return ncclxSetError(ncclxInvalidArgument, "ncclxCommInitRank: nranks %d must be >= 1", nranks);
  if (rank < 0 || rank >= nranks)
    return ncclxSetError(ncclxInvalidArgument, "ncclxCommInitRank: rank %d is not in [0, %d)", rank,
                         nranks);
  ncclxLogSetRank(rank);
  NCCLX_CHECK(ncclxConfigLoad());
  struct ncclxComm* comm = commAlloc(rank, nranks);
  if (!comm) return ncclxSetError(ncclxSystemError, "out of memory allocating a communicator");
  ncclxResult_t res = commReadSettings(comm, config);
  struct bootstrap* b = NULL;
  if (res == ncclxSuccess)
    res = bootstrapInit(id, rank, nranks, comm->timeoutSec > 0 ? comm->timeoutSec : 1e9, &b);
  if (res == ncclxSuccess) res = commSetup(comm, b, hashMix(0xcbf29ce484222325ull, bootstrapIdSecret(id)));
  if (res != ncclxSuccess) {
    char msg[1024];
    snprintf(msg, sizeof(msg), "%s", ncclxThreadLastError());
    if (!comm->bootstrap && b) bootstrapRelease(b);
    commFreeResources(comm);
    commRelease(comm);
    ncclxSetError(res, "ncclxCommInitRank (rank %d of %d) failed: %s", rank, nranks, msg);
    return res;
  }
  *out = comm;
  return ncclxSuccess;
}

API ncclxResult_t ncclxGetUniqueId(ncclxUniqueId* id) {
  if (!id) return ncclxSetError(ncclxInvalidArgument, "ncclxGetUniqueId: id is NULL");
  NCCLX_CHECK(ncclxConfigLoad());
  return bootstrapGetUniqueId(id);
}

API ncclxResult_t ncclxCommInitRank(ncclxComm_t* comm, int nranks, ncclxUniqueId id, int rank) {
  return commInitRankImpl(comm, nranks, &id, rank, NULL);
}

API ncclxResult_t ncclxCommInitRankConfig(ncclxComm_t* comm, int nranks, ncclxUniqueId id,
                                          int rank, ncclxConfig_t* config) {
  return commInitRankImpl(comm, nranks, &id, rank, config);
}

/* ---------------- split ---------------- */

struct splitEntry {
  int color, key, rank;
};

static int splitCompare(const void* a, const void* b) {
  const struct splitEntry *x = a, *y = b;
  if (x->key != y->key) return x->key < y->key ? -1 : 1;
  return x->rank < y->rank ? -1 : x->rank > y->rank;
}

API ncclxResult_t ncclxCommSplit(ncclxComm_t comm, int color, int key, ncclxComm_t* newcomm,
                                 ncclxConfig_t* config) {
  NCCLX_CHECK(commCheckHandle(comm));
  if (!newcomm) return ncclxSetError(ncclxInvalidArgument, "ncclxCommSplit: newcomm is NULL");
  *newcomm = NULL;
  if (color < 0 && color != NCCLX_SPLIT_NOCOLOR)
    return ncclxSetError(ncclxInvalidArgument,
                         "ncclxCommSplit: color %d must be >= 0 or NCCLX_SPLIT_NOCOLOR", color);
  ncclxLogSetRank(comm->rank);
  pthread_mutex_lock(&comm->execLock);
  ncclxResult_t res = commCheckHealthy(comm);
  struct splitEntry* all = calloc((size_t)comm->nranks, sizeof(*all));
  int* members = calloc((size_t)comm->nranks, sizeof(int));
  uint64_t splitIndex = ++comm->splitCount;
  if (res == ncclxSuccess && (!all || !members))
    res = ncclxSetError(ncclxSystemError, "out of memory in ncclxCommSplit");
  if (res == ncclxSuccess) {
    all[comm->rank] = (struct splitEntry){color, key, comm->rank};
    res = bootstrapAllGather(comm->bootstrap, all, sizeof(*all), TAG_SPLIT);
  }
  pthread_mutex_unlock(&comm->execLock);
  if (res != ncclxSuccess || color == NCCLX_SPLIT_NOCOLOR) {
    free(all);
    free(members);
    return res;
  }
  int n = 0;
  for (int i = 0; i < comm->nranks; i++)
    if (all[i].color == color) all[n++] = all[i];
  qsort(all, (size_t)n, sizeof(*all), splitCompare);
  int myRank = -1;
  for (int i = 0; i < n; i++) {
    members[i] = all[i].rank;
    if (all[i].rank == comm->rank) myRank = i;
  }
  free(all);

  struct ncclxComm* child = commAlloc(myRank, n);
  if (!child) {
    free(members);
    return ncclxSetError(ncclxSystemError, "out of memory in ncclxCommSplit");
  }
  uint64_t childHash = hashMix(hashMix(comm->commHash, splitIndex), (uint64_t)(unsigned)color);
  struct bootstrap* view = NULL;
  res = commReadSettings(child, config);
  if (res == ncclxSuccess)
    res = bootstrapView(comm->bootstrap, members, n, myRank, childHash, &view);
  free(members);
  if (res == ncclxSuccess) res = commSetup(child, view, childHash);
  if (res != ncclxSuccess) {
    if (!child->bootstrap && view) bootstrapRelease(view);
    commFreeResources(child);
    commRelease(child);
    return res;
  }
  ncclxLogSetRank(comm->rank);
  *newcomm = child;
  return ncclxSuccess;
}

/* ---------------- teardown ---------------- */

API ncclxResult_t ncclxCommFinalize(ncclxComm_t comm) {
  NCCLX_CHECK(commCheckHandle(comm));
  /* Operations run to completion inside their call or stream task; taking the lock waits
   * for the one in flight. */
  pthread_mutex_lock(&comm->execLock);
  pthread_mutex_unlock(&comm->execLock);
  return commCheckHealthy(comm);
}

static ncclxResult_t commDestroyImpl(ncclxComm_t comm) {
  atomic_store(&comm->destroyed, 1);
  pthread_mutex_lock(&comm->execLock);
  commFreeResources(comm);
  pthread_mutex_unlock(&comm->execLock);
  commRelease(comm);
  return ncclxSuccess;
}

API ncclxResult_t ncclxCommDestroy(ncclxComm_t comm) {
  NCCLX_CHECK(commCheckHandle(comm));
  ncclxLogSetRank(comm->rank);
  return commDestroyImpl(comm);
}

API ncclxResult_t ncclxCommAbort(ncclxComm_t comm) {
  NCCLX_CHECK(commCheckHandle(comm));
  /* In-flight operations see the flag in their wait loop and return; then we free. */
  commFail(comm, ncclxInvalidUsage, "communicator aborted by ncclxCommAbort on rank %d", comm->rank);
  atomic_store(&comm->abortFlag, 1);
  return commDestroyImpl(comm);
}

API ncclxResult_t ncclxCommGetAsyncError(ncclxComm_t comm, ncclxResult_t* asyncError) {
  NCCLX_CHECK(commCheckHandle(comm));
  if (!asyncError) return ncclxSetError(ncclxInvalidArgument, "ncclxCommGetAsyncError: asyncError is NULL");
  *asyncError = (ncclxResult_t)atomic_load(&comm->asyncError);
  return ncclxSuccess;
}

API ncclxResult_t ncclxCommCount(const ncclxComm_t comm, int* count) {
  NCCLX_CHECK(commCheckHandle(comm));
  if (!count) return ncclxSetError(ncclxInvalidArgument, "ncclxCommCount: count is NULL");
  *count = comm->nranks;
  return ncclxSuccess;
}

API ncclxResult_t ncclxCommUserRank(const ncclxComm_t comm, int* rank) {
  NCCLX_CHECK(commCheckHandle(comm));
  if (!rank) return ncclxSetError(ncclxInvalidArgument, "ncclxCommUserRank: rank is NULL");
  *rank = comm->rank;
  return ncclxSuccess;
}
