/* The communicator: who the ranks are, how to reach them, and its error state. */
#ifndef NCCLX_COMM_H
#define NCCLX_COMM_H

#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>

#include "bootstrap/bootstrap.h"
#include "ncclx.h"
#include "plugin/plugin_loader.h"

#define NCCLX_HOSTNAME_MAX 64

struct ncclxXferLive;

/* What every rank publishes about itself at init (bootstrap all-gather). */
struct ncclxPeerInfo {
  int rank;
  int pid;
  uint64_t hostHash;
  char hostname[NCCLX_HOSTNAME_MAX];
  char netHandle[NCCLX_NET_HANDLE_MAXSIZE]; /* from the network's listen */
  char shmHandle[NCCLX_NET_HANDLE_MAXSIZE]; /* from shared memory's listen, if enabled */
  int shmEnabled;
  int cpus; /* CPUs this rank's process may run on (hostCpus) */
  int cmaFast; /* process_vm_readv between ranks is allowed and fast here (api/comm_lifecycle.c, cmaFastHere) */
  uint64_t modulesHash; /* the [modules] settings (module/module.h): the same on every rank */
};

/* A transport the communicator talks over: the network, or shared memory for peers on the
 * same host. Both implement the net ABI, so the progress engine drives them alike. */
enum { NCCLX_TP_NET = 0, NCCLX_TP_SHM = 1, NCCLX_NUM_TP = 2 };
struct ncclxTransport {
  const ncclxNet_t* net; /* NULL when this transport is not in use */
  void* ctx;
  int dev;
  void* listenComm;
};

/* Network connections to one peer; created on first use unless lazy_connect = false. */
struct ncclxPeerConn {
  const ncclxNet_t* net; /* transport chosen for this peer (same in both directions) */
  void* sendComm;
  void* recvComm;
  int sendFd, recvFd; /* from getPollFd, -1 when none */
  /* xfer.c: the order in which transfers post their messages, per direction. Messages match
   * in posting order, so a transfer started later (in this run or in a later one still in
   * flight: CommFuse flows, pipelines) posts only once every earlier transfer on the same
   * connection and direction has posted its last message. A transfer takes a ticket when
   * it starts and posts while `serving` equals it. */
  uint64_t ticketNext[2], ticketServing[2]; /* [isSend] */
};

#define NCCLX_MODULE_SLOTS 4

struct ncclxComm {
  uint64_t magic; /* NCCLX_COMM_MAGIC while alive: catches stale or garbage handles */
  int rank, nranks;
  uint64_t commHash;
  char name[64];
  struct bootstrap* bootstrap;
  struct ncclxPeerInfo* peerInfo; /* nranks entries */
  int nhosts, ranksPerHostMax;
  int hostCpusMin; /* the fewest CPUs of any rank's process: with ranksPerHostMax, whether
                      ranks share CPUs, as every rank sees it (tune.c) */
  int cmaFastAll;  /* every rank found process_vm_readv fast (peerInfo.cmaFast): the same
                      on every rank (peers.c, tune.c) */
  struct ncclxHostMap* hostMap; /* coll_hier.c: built on the first hierarchical call */
  struct ncclxLLBoard* ll;       /* coll_ll.c: mapped on the first LL-protocol call */

  /* Transports: tp[NCCLX_TP_NET] always, tp[NCCLX_TP_SHM] when [core] shm is on. */
  struct ncclxTransport tp[NCCLX_NUM_TP];
  /* gpu_net.c: every transport takes host memory, last seen with these transports */
  int hostMemOk;
  struct ncclxTransport hostMemOkFor[NCCLX_NUM_TP];
  size_t maxMessageBytes; /* smallest over the transports in use */
  struct ncclxPeerConn* conns; /* nranks entries */
  struct peersListener* listener; /* peers.c: transport listeners, shared with split children */
  pthread_mutex_t connLock;
  int connectsMade, acceptsRefused; /* peers.c, under connLock: each peer must be connected once */

  /* Settings resolved at init from ncclx.ini and ncclxConfig_t. */
  double timeoutSec; /* 0 = never time out */
  size_t chunkBytes; /* pipeline chunk for large transfers */
  int xferSendKind;  /* NCCLX_SHM_SEND_* of the sends running now: EXCHANGE while a linear
                      * exchange runs (alltoallLinearWindow, linear all-to-all(v): no send
                      * forwards received data), USER for the
                      * application's send/recv (xfer.c tells the shm transport per send) */
  int lazyConnect;
  /* The running call as its messages sign it (xferSetCall): which call, and its size per
   * rank; SIZE_MAX: each transfer's own size (send/recv, all-to-all-v). */
  int xferSigKind;
  size_t xferSigBytes;
  double xferLastStart; /* xfer.c: when the last run started (late-rank check) */

  /* Execution: one operation at a time per communicator. */
  pthread_mutex_t execLock;
  void* scratch;
  size_t scratchSize;
  uint64_t collSeq, p2pSeq;
  const char* curOpName; /* "allreduce", for error messages */
  int curOpIsP2p;        /* the running operation is send/recv: its sequence numbers count apart */
  uint64_t curOpSeq;
  /* How this rank runs it, for wait notes: a collective's algorithm and protocol (-1: none),
   * or a module's text. Set per call, so plain values: formatting costs on small calls. */
  int curAlgo, curProto;
  const char* curPathText;
  struct waitNotes* waitNotes; /* waitnote.c: notes sent during the running call */
  void* curProfEvent;    /* profiler handle of the running op: parent of its STEP events */
  /* The step in progress, published for ncclxCommDump from other threads. */
  struct ncclxXferLive* live; /* under liveLock: it lives on the running step's stack */
  pthread_mutex_t liveLock;

  /* Error state: sticky once set. */
  atomic_int abortFlag;
  atomic_int asyncError; /* ncclxResult_t */
  pthread_mutex_t errLock;
  char lastError[1024];
  unsigned long lastErrorStamp; /* under errLock: ncclxErrorStampNext when lastError was set */
  atomic_int finalized;         /* ncclxCommFinalize ran: only destroy/abort may follow */

  /* Last choices, by call shape (collective, bytes, datatype, op): the model and a tuner
   * plugin's answer are functions of the shape (tuner.h), so repeated calls of one shape (the
   * common case in training loops) skip both. */
  struct {
    int coll, algo, proto, datatype, op;
    size_t bytes, chunkBytes;
  } tuneCache[16];

  /* Plugins. */
  const ncclxTuner_t* tuner;
  void* tunerCtx;
  void* moduleState[NCCLX_MODULE_SLOTS]; /* feature modules' own state (module/module.h), by slot */
  const ncclxProfiler_t* profiler;
  void* profilerCtx;

  atomic_int refs;      /* the user's handle plus queued stream operations */
  atomic_int destroyed; /* Destroy/Abort called: new calls are refused */
  uint64_t splitCount;  /* children created, for their bootstrap tag space */
  void* splitGroups;    /* api/comm_lifecycle.c: group splits made so far, per member list (tag spaces) */
};

#define NCCLX_COMM_MAGIC 0x6e63636c78636f6dull

/* Validate a handle passed by the user. */
ncclxResult_t commCheckHandle(const struct ncclxComm* comm);
/* Record a failure on comm: sticky error, lastError text, thread error, WARN log.
 * Returns res. Does not notify peers (see commFail). */
ncclxResult_t commSetError(struct ncclxComm* comm, ncclxResult_t res, const char* fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* A fatal communication failure: commSetError, then tell every rank through the bootstrap
 * so that ranks that do not talk to the culprit fail too, naming it. */
ncclxResult_t commFail(struct ncclxComm* comm, ncclxResult_t res, const char* fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* A bad argument: recorded for the thread and readable through ncclxGetLastError(comm),
 * but the communicator stays usable (no sticky error). Returns res. */
ncclxResult_t commArgError(struct ncclxComm* comm, ncclxResult_t res, const char* fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* va_list forms of commFail and commArgError (feature modules' error services). */
ncclxResult_t commFailV(struct ncclxComm* comm, ncclxResult_t res, const char* fmt, va_list ap);
ncclxResult_t commArgErrorV(struct ncclxComm* comm, ncclxResult_t res, const char* fmt, va_list ap);
/* ncclxSuccess, or the sticky error (with lastError) if the comm failed or was aborted. */
ncclxResult_t commCheckHealthySlow(struct ncclxComm* comm);
/* ncclxSuccess, or the comm's earlier failure (or abort) again: asked twice per call, so the
 * healthy case is two loads here. */
static inline ncclxResult_t commCheckHealthy(struct ncclxComm* comm) {
  if (atomic_load(&comm->asyncError) == ncclxSuccess && !atomic_load(&comm->abortFlag))
    return ncclxSuccess;
  return commCheckHealthySlow(comm);
}
/* What every bounded wait polls: the error to return if this comm was aborted or failed, or
 * if another rank's abort notice arrived on the bootstrap (recorded here), else ncclxSuccess. */
ncclxResult_t commPollAbort(struct ncclxComm* comm);
/* "rank 3 (host h, pid p)" into buf. */
const char* commDescribeRank(const struct ncclxComm* comm, int rank, char* buf, size_t size);
/* A scratch buffer of at least `bytes`, owned by the comm, valid until the next call.
 * Only while holding execLock. */
void* commScratch(struct ncclxComm* comm, size_t bytes);

void commRetain(struct ncclxComm* comm);
void commRelease(struct ncclxComm* comm);
/* Take and drop comm->execLock around an operation run on the calling thread without a
 * reference of its own. Uncontended that is one atomic instruction; when another thread holds
 * the lock (a stream task blocked in a collective, say), the caller takes a reference before
 * waiting, so an Abort or Destroy that gets the lock first cannot free the comm under it.
 * commExecLock returns whether it did. (As before, a Destroy that completes between a call's
 * entry checks and this is a race in the application.) */
int commExecLock(struct ncclxComm* comm);
void commExecUnlock(struct ncclxComm* comm, int ref);

/* Whether every rank has a CPU of its own: the largest host's ranks fit the fewest CPUs any
 * rank may use (the same answer on every rank; hosts emulated on one machine count apart). */
static inline int commRanksOwnCpus(const struct ncclxComm* comm) {
  return comm->ranksPerHostMax <= comm->hostCpusMin;
}
#endif
