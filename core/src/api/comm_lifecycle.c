/* Communicator lifecycle: init, split, finalize, destroy, abort (its error state: comm_error.c). */
#include "comm/comm.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "coll/coll_hier.h"
#include "coll/coll_ll.h"
#include "config/config.h"
#include "util/debug.h"
#include "util/host.h"
#include "transport/shm/net_shm.h"
#include "transport/peers.h"
#include "exec/stream.h"
#include "prof/prof.h"
#include "transport/transport.h"
#include "tune/tune.h"
#include "module/module.h"
#include "comm/waitnote.h"
#include "exec/xfer.h"

#define API __attribute__((visibility("default")))

/* Tags of the communicator's own bootstrap exchanges. */
#define TAG_PEERINFO 0x1001u
#define TAG_INIT_BARRIER 0x1002u
#define TAG_SPLIT 0x1003u

/* How many group splits of one member list this rank made: members call ncclxCommSplitGroup
 * in the same order, so (list, occurrence) names the child identically on all of them. */
struct splitGroupCount {
  struct splitGroupCount* next;
  uint64_t listHash;
  uint64_t count;
};

static void splitGroupsFree(struct ncclxComm* comm) {
  for (struct splitGroupCount* g = comm->splitGroups; g;) {
    struct splitGroupCount* next = g->next;
    free(g);
    g = next;
  }
  comm->splitGroups = NULL;
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
  xferSetCall(comm, XFER_SIG_P2P, XFER_SIG_PER_TRANSFER);
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
  splitGroupsFree(comm);
  waitNoteFree(comm);
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
  collHierCommFree(comm);
  collLLCommFree(comm);
  moduleCommDestroy(comm);
  free(comm->scratch);
  comm->scratch = NULL;
  comm->scratchSize = 0;
}

/* Hosts, the most ranks on one, and the fewest CPUs a rank may use: what the tuner compares,
 * the same on every rank (a rank's own CPU count comes from its affinity, which launchers
 * may set differently per rank: ranks would then choose different protocols and wait for
 * each other). */
static void commCountHosts(struct ncclxComm* comm) {
  int nhosts = 0, maxPer = 0, cpus = 0, cmaFast = 1;
  for (int i = 0; i < comm->nranks; i++) {
    cmaFast &= comm->peerInfo[i].cmaFast != 0;
    int c = comm->peerInfo[i].cpus > 0 ? comm->peerInfo[i].cpus : 1;
    if (cpus == 0 || c < cpus) cpus = c;
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
  comm->hostCpusMin = cpus;
  comm->cmaFastAll = cmaFast;
}

/* Whether process_vm_readv runs at CMA_FAST of memcpy's speed or more on this host: where
 * every rank has a CPU, one copy by it then beats two pipelined memcpys through the shm
 * slots. On an Intel host of the project's machine kind it ran at 0.55-0.65 and won (2
 * ranks, all-gather 2 MiB: 140 us against 208); on the AMD ones at about 0.4, and lost
 * 1.3-2.4x. The probe reads this process's own memory, which the kernel always allows, so a
 * Yama ptrace_scope above 0 (ranks cannot read each other) or single_copy = none answers no
 * without it. Every rank's answer travels in its peer info and the comm ANDs them
 * (cmaFastAll), so all ranks choose alike (the tuner must). */
#define CMA_FAST 0.5
static int cmaPeersAllowed(void) {
  if (!peersSingleCopyAllowed()) return 0;
  FILE* f = fopen("/proc/sys/kernel/yama/ptrace_scope", "r");
  if (!f) return 1; /* no Yama: the usual same-user check, which ranks of one job pass */
  int scope = 1;
  if (fscanf(f, "%d", &scope) != 1) scope = 1;
  fclose(f);
  return scope == 0;
}

static int cmaFastHere(void) {
  double cma = 0, copy = 0;
  int fast = cmaPeersAllowed() && ncclxShmCmaSpeed(&cma, &copy) == 0 && cma >= CMA_FAST * copy;
  static atomic_int logged;
  if (!atomic_exchange(&logged, 1))
    INFO(NCCLX_LOG_INIT | NCCLX_LOG_NET, "shm: process_vm_readv at %.1f GB/s, memcpy at %.1f GB/s here: %s", cma,
         copy, fast ? "single copy where every rank has a CPU" : "two copies through the slots");
  return fast;
}

/* Before the bootstrap: transports open and listening, this rank's peer info filled in (at
 * init it rides along the bootstrap's own address all-gather). A split child (parent not
 * NULL) shares the parent's listeners. comm->commHash must be set: connections are filed by it. */
static ncclxResult_t commPrepare(struct ncclxComm* comm, struct ncclxComm* parent) {
  NCCLX_CHECK(transportsOpen(comm));
  comm->peerInfo = calloc((size_t)comm->nranks, sizeof(*comm->peerInfo));
  comm->conns = calloc((size_t)comm->nranks, sizeof(*comm->conns));
  if (!comm->peerInfo || !comm->conns)
    return ncclxSetError(ncclxSystemError, "out of memory for %d peers", comm->nranks);
  for (int i = 0; i < comm->nranks; i++) comm->conns[i].sendFd = comm->conns[i].recvFd = -1;

  struct ncclxPeerInfo* me = &comm->peerInfo[comm->rank];
  me->rank = comm->rank;
  me->pid = (int)getpid();
  me->cpus = hostCpus();
  snprintf(me->hostname, sizeof(me->hostname), "%s", bootstrapHostname());
  me->hostHash = hostIdentity(me->hostname);
  NCCLX_CHECK(parent ? peersListenShared(comm, parent) : peersListen(comm));
  me->cmaFast = me->shmEnabled && cmaFastHere();
  me->modulesHash = moduleConfigHash();
  return ncclxSuccess;
}

/* Everything after the bootstrap exists: peer info (gathered unless the bootstrap did it),
 * plugins, optional eager connections. Takes ownership of `b`. */
static ncclxResult_t commSetup(struct ncclxComm* comm, struct bootstrap* b, uint64_t commHash, int infoGathered) {
  comm->bootstrap = b;
  comm->commHash = commHash;
  if (!comm->name[0]) snprintf(comm->name, sizeof(comm->name), "%016llx", (unsigned long long)commHash);
  if (!infoGathered) NCCLX_CHECK(bootstrapAllGather(b, comm->peerInfo, sizeof(*comm->peerInfo), TAG_PEERINFO));
  for (int i = 0; i < comm->nranks; i++)
    if (comm->peerInfo[i].rank != i)
      return ncclxSetError(ncclxInternalError, "peer info exchange is corrupt: slot %d says rank %d",
                           i, comm->peerInfo[i].rank);
  for (int i = 0; i < comm->nranks; i++)
    if (comm->peerInfo[i].modulesHash != comm->peerInfo[comm->rank].modulesHash) {
      char mine[1024];
      moduleConfigDescribe(mine, sizeof(mine));
      return ncclxSetError(ncclxInvalidUsage, "rank %d's [modules] settings or loaded modules differ from rank %d's "
                           "(%s): every rank of a job must load the same feature modules", i, comm->rank, mine);
    }
  commCountHosts(comm);

  tuneCommInit(comm);
  profCommInit(comm);
  /* Eager: connect everything, then a barrier so nobody starts before all are connected.
   * Lazy: every rank listened before the peer info all-gather, so the all-gather finishing
   * means every peer can be connected to: no barrier, whose O(log n) rounds would be half
   * of a lazy init (docs/init.md). */
  if (!comm->lazyConnect) {
    NCCLX_CHECK(peersConnectAll(comm));
    NCCLX_CHECK(bootstrapBarrier(b, TAG_INIT_BARRIER));
  }
  struct bootstrapStats st;
  bootstrapGetStats(b, &st);
  INFO(NCCLX_LOG_INIT,
       "comm %p rank %d init counts: bootstrap msgs sent %llu recv %llu bytes %llu/%llu conns %llu+%llu, "
       "rendezvous msgs %llu bytes %llu (%.3f s), address all-gather %.3f s, peer connections %d",
       (void*)comm, comm->rank, (unsigned long long)st.msgsSent, (unsigned long long)st.msgsRecv,
       (unsigned long long)st.bytesSent, (unsigned long long)st.bytesRecv, (unsigned long long)st.connsOpened,
       (unsigned long long)st.connsAccepted, (unsigned long long)st.rdvMsgs, (unsigned long long)st.rdvBytes,
       st.rendezvousSec, st.addrGatherSec, peersOpenCount(comm));
  INFO(NCCLX_LOG_INIT,
       "comm %p name %s rank %d nranks %d hosts %d net %s dev %d shm %s timeout %.0fs %s connect - init complete",
       (void*)comm, comm->name, comm->rank, comm->nranks, comm->nhosts, comm->tp[NCCLX_TP_NET].net->name,
       comm->tp[NCCLX_TP_NET].dev, comm->tp[NCCLX_TP_SHM].net ? "on" : "off", comm->timeoutSec,
       comm->lazyConnect ? "lazy" : "eager");
  return ncclxSuccess;
}

static ncclxResult_t commInitRankImpl(ncclxComm_t* out, int nranks, int nIds, const ncclxUniqueId* ids,
                                      int rank, ncclxConfig_t* config) {
  const char* fn = nIds == 1 ? "ncclxCommInitRank" : "ncclxCommInitRankScalable";
  if (!out) return ncclxSetError(ncclxInvalidArgument, "%s: comm pointer is NULL", fn);
  *out = NULL;
  if (nranks < 1)
    return ncclxSetError(ncclxInvalidArgument, "%s: nranks %d must be >= 1", fn, nranks);
  if (rank < 0 || rank >= nranks)
    return ncclxSetError(ncclxInvalidArgument, "%s: rank %d is not in [0, %d)", fn, rank, nranks);
  if (nIds < 1 || nIds > nranks)
    return ncclxSetError(ncclxInvalidArgument,
                         "%s: nIds %d must be in 1..nranks (%d): every unique id needs a rank to serve it", fn, nIds,
                         nranks);
  if (!ids) return ncclxSetError(ncclxInvalidArgument, "%s: the unique id list (ids) is NULL", fn);
  for (int i = 0; i < nIds; i++)
    if (bootstrapIdSecret(&ids[i]) == 0)
      return ncclxSetError(ncclxInvalidArgument,
                           "%s: unique id %d of %d is not valid (not made by ncclxGetUniqueId, or corrupted)", fn, i,
                           nIds);
  ncclxLogSetRank(rank);
  NCCLX_CHECK(ncclxConfigLoad());
  struct ncclxComm* comm = commAlloc(rank, nranks);
  if (!comm) return ncclxSetError(ncclxSystemError, "out of memory allocating a communicator");
  ncclxResult_t res = commReadSettings(comm, config);
  struct bootstrap* b = NULL;
  comm->commHash = hashMix(0xcbf29ce484222325ull, bootstrapIdsSecret(ids, nIds));
  if (res == ncclxSuccess) res = commPrepare(comm, NULL);
  if (res == ncclxSuccess)
    res = bootstrapInitScalable(ids, nIds, rank, nranks, comm->timeoutSec > 0 ? comm->timeoutSec : 1e9,
                                comm->peerInfo, sizeof(*comm->peerInfo), &b);
  if (res == ncclxSuccess) res = commSetup(comm, b, comm->commHash, 1);
  if (res != ncclxSuccess) {
    char msg[1024];
    snprintf(msg, sizeof(msg), "%s", ncclxThreadLastError());
    if (!comm->bootstrap && b) bootstrapRelease(b);
    commFreeResources(comm);
    commRelease(comm);
    ncclxSetError(res, "%s (rank %d of %d) failed: %s", fn, rank, nranks, msg);
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
  return commInitRankImpl(comm, nranks, 1, &id, rank, NULL);
}

API ncclxResult_t ncclxCommInitRankConfig(ncclxComm_t* comm, int nranks, ncclxUniqueId id,
                                          int rank, ncclxConfig_t* config) {
  return commInitRankImpl(comm, nranks, 1, &id, rank, config);
}

API ncclxResult_t ncclxCommInitRankScalable(ncclxComm_t* comm, int nranks, int rank, int nIds,
                                            const ncclxUniqueId* ids, ncclxConfig_t* config) {
  return commInitRankImpl(comm, nranks, nIds, ids, rank, config);
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
  child->commHash = childHash;
  if (res == ncclxSuccess) res = commPrepare(child, comm);
  if (res == ncclxSuccess)
    res = bootstrapView(comm->bootstrap, members, n, myRank, childHash, &view);
  free(members);
  if (res == ncclxSuccess) res = commSetup(child, view, childHash, 0);
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

/* Only the members call it: the child's bootstrap is a view of the parent's with a tag space
 * derived from the member list, so no non-member is involved and nothing is all-gathered
 * over the parent. Members that pass different lists get different tag spaces: their init
 * exchange then fails at the timeout instead of mixing two communicators. */
API ncclxResult_t ncclxCommSplitGroup(ncclxComm_t comm, const int* ranks, int nranks, ncclxComm_t* newcomm,
                                      ncclxConfig_t* config) {
  NCCLX_CHECK(commCheckHandle(comm));
  if (!newcomm) return ncclxSetError(ncclxInvalidArgument, "ncclxCommSplitGroup: newcomm is NULL");
  *newcomm = NULL;
  if (!ranks) return ncclxSetError(ncclxInvalidArgument, "ncclxCommSplitGroup: ranks is NULL");
  if (nranks < 1 || nranks > comm->nranks)
    return ncclxSetError(ncclxInvalidArgument, "ncclxCommSplitGroup: nranks %d is not in 1..%d", nranks,
                         comm->nranks);
  ncclxLogSetRank(comm->rank);
  char* seen = calloc((size_t)comm->nranks, 1);
  if (!seen) return ncclxSetError(ncclxSystemError, "out of memory in ncclxCommSplitGroup");
  int myRank = -1;
  uint64_t listHash = hashMix(0xcbf29ce484222325ull, (uint64_t)nranks);
  for (int i = 0; i < nranks; i++) {
    int p = ranks[i];
    if (p < 0 || p >= comm->nranks || seen[p]) {
      free(seen);
      return ncclxSetError(ncclxInvalidArgument, "ncclxCommSplitGroup: ranks[%d] = %d is %s", i, p,
                           p < 0 || p >= comm->nranks ? "not a rank of the parent" : "a duplicate");
    }
    seen[p] = 1;
    if (p == comm->rank) myRank = i;
    listHash = hashMix(listHash, (uint64_t)(unsigned)p);
  }
  free(seen);
  if (myRank < 0)
    return ncclxSetError(ncclxInvalidArgument,
                         "ncclxCommSplitGroup: the calling rank %d is not in the member list (only members call it)",
                         comm->rank);

  pthread_mutex_lock(&comm->execLock);
  /* A destroy that ran while we waited for the lock has freed the list already. */
  ncclxResult_t res = atomic_load(&comm->destroyed)
                          ? ncclxSetError(ncclxInvalidUsage, "ncclxCommSplitGroup: the communicator was destroyed")
                          : commCheckHealthy(comm);
  struct splitGroupCount* g = res == ncclxSuccess ? comm->splitGroups : NULL;
  while (g && g->listHash != listHash) g = g->next;
  if (res == ncclxSuccess && !g) {
    g = calloc(1, sizeof(*g));
    if (!g) {
      res = ncclxSetError(ncclxSystemError, "out of memory in ncclxCommSplitGroup");
    } else {
      g->listHash = listHash;
      g->next = comm->splitGroups;
      comm->splitGroups = g;
    }
  }
  uint64_t occurrence = g ? ++g->count : 0;
  pthread_mutex_unlock(&comm->execLock);
  if (res != ncclxSuccess) return res;

  /* "group" keeps these tag spaces apart from color splits' (splitIndex, color) ones. */
  uint64_t childHash = hashMix(hashMix(hashString(comm->commHash, "group"), listHash), occurrence);
  struct ncclxComm* child = commAlloc(myRank, nranks);
  if (!child) return ncclxSetError(ncclxSystemError, "out of memory in ncclxCommSplitGroup");
  struct bootstrap* view = NULL;
  res = commReadSettings(child, config);
  child->commHash = childHash;
  if (res == ncclxSuccess) res = commPrepare(child, comm);
  if (res == ncclxSuccess) res = bootstrapView(comm->bootstrap, ranks, nranks, myRank, childHash, &view);
  if (res == ncclxSuccess) res = commSetup(child, view, childHash, 0);
  if (res != ncclxSuccess) {
    if (!child->bootstrap && view) bootstrapRelease(view);
    commFreeResources(child);
    commRelease(child);
    ncclxLogSetRank(comm->rank);
    return res;
  }
  ncclxLogSetRank(comm->rank);
  *newcomm = child;
  return ncclxSuccess;
}

/* ---------------- init counters (for tools/ncclx-init-bench, not in ncclx.h) ---------------- */

/* Fills up to max of: bootstrap msgs sent, recv, bytes sent, recv, connections opened,
 * accepted, rendezvous msgs, bytes, connections, peer (transport) connections open,
 * rendezvous microseconds, address all-gather microseconds, then the bootstrap's phase
 * timestamps in CLOCK_MONOTONIC microseconds (bootstrap entered, root contacted, partners
 * received, all-gather done: struct bootstrapStats). Returns how many it filled,
 * or -1 for a bad handle. Counters are per process: all views of one bootstrap together. */
API int ncclxInternalInitCounters(ncclxComm_t comm, int64_t* out, int max) {
  if (commCheckHandle(comm) != ncclxSuccess || !out || max < 0) return -1;
  struct bootstrapStats st;
  bootstrapGetStats(comm->bootstrap, &st);
  pthread_mutex_lock(&comm->connLock);
  int open = peersOpenCount(comm);
  pthread_mutex_unlock(&comm->connLock);
  int64_t v[] = {(int64_t)st.msgsSent,    (int64_t)st.msgsRecv,      (int64_t)st.bytesSent,
                 (int64_t)st.bytesRecv,   (int64_t)st.connsOpened,   (int64_t)st.connsAccepted,
                 (int64_t)st.rdvMsgs,     (int64_t)st.rdvBytes,      (int64_t)st.rdvConns,
                 (int64_t)open,           (int64_t)(st.rendezvousSec * 1e6), (int64_t)(st.addrGatherSec * 1e6),
                 (int64_t)(st.tStart * 1e6), (int64_t)(st.tRootContact * 1e6), (int64_t)(st.tReply * 1e6),
                 (int64_t)(st.tReady * 1e6)};
  int n = (int)(sizeof(v) / sizeof(v[0]));
  if (n > max) n = max;
  for (int i = 0; i < n; i++) out[i] = v[i];
  return n;
}

/* ---------------- teardown ---------------- */

API ncclxResult_t ncclxCommFinalize(ncclxComm_t comm) {
  NCCLX_CHECK(commCheckHandle(comm));
  if (atomic_exchange(&comm->finalized, 1))
    return commArgError(comm, ncclxInvalidUsage,
                        "ncclxCommFinalize: the communicator was finalized already; destroy it");
  /* Operations run to completion inside their call or stream task; taking the lock waits
   * for the one in flight. */
  int ref = commExecLock(comm);
  ncclxResult_t res = commCheckHealthy(comm);
  commExecUnlock(comm, ref);
  return res;
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
