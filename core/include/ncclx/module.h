/* ncclx feature-module ABI, version 1: frozen (two module families, CommFuse and
 * AllToAllvDynamic/MoE, are built on it). Changes come as a new version.
 *
 * A feature module is a shared object, libncclx-module-<name>.so, that implements a family of
 * public calls (CommFuse's ncclxAllGatherCompute and friends, MoE's dispatch and combine) on top
 * of the core. libncclx keeps the public symbols and forwards them to the module named in
 * ncclx.ini:
 *
 *   [modules]
 *   commfuse = on            ; default: the module built with ncclx
 *   commfuse = off           ; its calls fail with ncclxInvalidUsage naming the key
 *   commfuse = mine          ; libncclx-module-mine.so on [core] plugin_path, ... (a replacement)
 *   commfuse = /path/x.so    ; a path, used as is
 *
 * A module sees the core only through ncclxModuleCore_v1_t: operations on a communicator
 * (facts, the operation envelope, point-to-point steps, streams, scratch memory, errors,
 * reductions, an out-of-band all-gather, the link cost model, per-communicator state), never
 * the core's structs. It exports one symbol, NCCLX_MODULE_SYMBOL, of type ncclxModule_v1_t,
 * and for each family it implements a table of that family's calls (below).
 *
 * Every rank of a job must load the same modules: a schedule a module picks must be picked
 * by every rank. docs/plugin-guide.md, "Feature modules", has a minimal module. */
#ifndef NCCLX_MODULE_H
#define NCCLX_MODULE_H

#include <stddef.h>
#include <stdint.h>

#include "ncclx.h"
#include "ncclx/fuse.h"
#include "ncclx/moe.h"
#include "ncclx/plugin.h"
#include "ncclx/tuner.h"

#ifdef __cplusplus
extern "C" {
#endif

#define NCCLX_MODULE_ABI_VERSION 1
#define NCCLX_MODULE_SYMBOL "ncclxModule_v1"

/* ---------------- what the core offers ---------------- */

/* A communicator's facts, as every rank sees them. */
typedef struct {
  int rank, nranks;
  int nhosts;          /* hosts the ranks run on */
  double timeoutSec;   /* [core] timeout_s: a wait without progress this long fails; 0 = never */
  size_t chunkBytes;   /* the pipeline chunk of large transfers */
  const char* name;    /* for log lines */
} ncclxModuleCommInfo_v1_t;

/* Kinds a module's operation signs its messages with (0 .. NCCLX_MODULE_CALL_KINDS - 1): ranks
 * that run different kinds, or different bytesPerRank, fail where the messages land. */
#define NCCLX_MODULE_CALL_KINDS 4
/* An operation that moves its data with messages only (msgSend, msgRecv), no steps: nothing
 * to sign, and the kinds stay the step-using modules' own. */
#define NCCLX_MODULE_NO_STEPS (-1)
#define NCCLX_MODULE_BYTES_PER_TRANSFER ((size_t)-1) /* each transfer signs its own size */

/* One operation of a module as the core runs it (opBegin ... opEnd): under the
 * communicator's execution lock (one operation at a time), numbered with the collectives
 * (every rank makes the same calls in the same order), its messages signed, reported to the
 * profiler as the collective it resembles. */
typedef struct {
  const char* name;       /* "allgather-compute": in errors, logs and wait notes */
  const char* path;       /* how this rank runs it ("CommFuse ring_p2p"), for wait notes */
  int callKind;           /* 0 .. NCCLX_MODULE_CALL_KINDS - 1, or NCCLX_MODULE_NO_STEPS */
  size_t bytesPerRank;    /* or NCCLX_MODULE_BYTES_PER_TRANSFER */
  /* The profiler event (only read when a profiler is on). */
  ncclxCollType_t profColl;
  int profAlgo;           /* NCCLX_ALGO_* */
  const void* sendbuff;
  void* recvbuff;
  size_t count;
  ncclxDataType_t datatype;
  ncclxRedOp_t op;
  ncclxStream_t stream;   /* the stream the call was queued on, or NULL */
} ncclxModuleOp_v1_t;

/* The profiler event of an operation that is none of the collectives (opBeginNamed): its
 * own name ("moe_dispatch"), algorithm name and the bytes this rank sends. */
typedef struct {
  const char* func;
  const char* algo;
  size_t bytes;
} ncclxModuleOpEvent_v1_t;

/* Filled by opBegin, handed back to opEnd. */
typedef struct {
  uint64_t seq;           /* the call's sequence number, shared with the collectives */
  void* corePrivate[4];
} ncclxModuleOpCtx_v1_t;

/* One transfer of a step: send bytes of buf to peer, or receive them from peer. Transfers
 * to one peer in one direction complete in the order they were started. */
typedef struct {
  int peer;
  int isSend;
  void* buf;
  size_t bytes;
} ncclxModuleXfer_v1_t;

typedef struct ncclxModuleStep ncclxModuleStep_t; /* transfers in flight (opaque) */
typedef struct ncclxModuleDev ncclxModuleDev_t;   /* one operation's device copies (opaque) */

typedef struct {
  size_t size;     /* sizeof(ncclxModuleCore_v1_t) of the core that filled it */
  int abiVersion;  /* NCCLX_MODULE_ABI_VERSION */

  /* Facts and checks. checkCall: the handle is valid, the communicator usable and the stream
   * acceptable, else the error (recorded) for fn. */
  void (*commInfo)(ncclxComm_t comm, ncclxModuleCommInfo_v1_t* info);
  ncclxResult_t (*checkCall)(ncclxComm_t comm, ncclxStream_t stream, const char* fn);

  /* Errors. argError: bad arguments, the communicator stays usable. fail: the communicator
   * fails (sticky error, every rank told with an abort notice). setError: this thread's error
   * only. The sentence is what ncclxGetLastError returns. lastError: this thread's sentence. */
  ncclxResult_t (*argError)(ncclxComm_t comm, ncclxResult_t res, const char* fmt, ...)
      __attribute__((format(printf, 3, 4)));
  ncclxResult_t (*fail)(ncclxComm_t comm, ncclxResult_t res, const char* fmt, ...)
      __attribute__((format(printf, 3, 4)));
  ncclxResult_t (*setError)(ncclxResult_t res, const char* fmt, ...) __attribute__((format(printf, 2, 3)));
  const char* (*lastError)(void);
  void (*clearError)(void); /* a module's own thread, before a job: no stale sentence */
  /* abort: every wait of comm returns now (a helper thread that must be stopped). aborted:
   * whether that happened; checkHealth: ncclxSuccess, or the communicator's earlier failure
   * again (as this thread's error). */
  void (*abort)(ncclxComm_t comm);
  int (*aborted)(ncclxComm_t comm);
  ncclxResult_t (*checkHealth)(ncclxComm_t comm);

  /* The operation envelope. opBegin fails (nothing to end) when the communicator failed or
   * was destroyed before a queued call ran. */
  ncclxResult_t (*opBegin)(ncclxComm_t comm, const ncclxModuleOp_v1_t* op, ncclxModuleOpCtx_v1_t* ctx);
  void (*opEnd)(ncclxComm_t comm, ncclxModuleOpCtx_v1_t* ctx, ncclxResult_t res);

  /* Streams: run(arg) in order on stream, then release(arg); the communicator is kept alive
   * until then. With stream NULL, run and release now, on this thread. When queueing fails
   * (a destroyed stream, no memory) release(arg) still runs and the error is returned. */
  ncclxResult_t (*enqueue)(ncclxComm_t comm, ncclxStream_t stream, ncclxResult_t (*run)(void* arg),
                           void (*release)(void* arg), void* arg);

  /* Point-to-point steps inside an operation. stepRun: start, drive and finish. stepStart/
   * stepTest/stepIdle/stepEnd: the same in pieces, for steps that overlap the module's own
   * work; stepTest sets *progressed when bytes moved, stepPending says whether transfers
   * remain, stepIdle waits a little (spin, yield, sleep) and detects dead or stuck peers,
   * stepEnd returns the step's result and frees it. connect: make the connections to these
   * peers now (they are otherwise made by the first step that uses them). */
  ncclxResult_t (*stepRun)(ncclxComm_t comm, const ncclxModuleXfer_v1_t* x, int n);
  ncclxResult_t (*stepStart)(ncclxComm_t comm, const ncclxModuleXfer_v1_t* x, int n, ncclxModuleStep_t** step);
  ncclxResult_t (*stepTest)(ncclxModuleStep_t* step, int* progressed);
  int (*stepPending)(const ncclxModuleStep_t* step);
  ncclxResult_t (*stepIdle)(ncclxModuleStep_t* step);
  /* abandonedFor: ncclxSuccess for a step that ran its course, else the error that made the
   * module give it up (transfers still in flight are then not a new error). */
  ncclxResult_t (*stepEnd)(ncclxModuleStep_t* step, ncclxResult_t abandonedFor);
  ncclxResult_t (*connect)(ncclxComm_t comm, const int* sendPeers, int nsend, const int* recvPeers, int nrecv);

  /* The communicator's scratch memory: at least bytes, valid until the operation ends. */
  ncclxResult_t (*scratch)(ncclxComm_t comm, size_t bytes, void** out);

  /* dst[i] = a[i] op b[i] for count elements (dst may be a or b). avgFinish: the last step of
   * ncclxAvg, dst[i] = dst[i] / nranks. typeSize: 0 for an invalid type. */
  void (*reduce)(void* dst, const void* a, const void* b, size_t count, ncclxDataType_t type, ncclxRedOp_t op);
  void (*avgFinish)(void* dst, size_t count, ncclxDataType_t type, int nranks);
  size_t (*typeSize)(ncclxDataType_t type);
  const char* (*typeName)(ncclxDataType_t type);

  /* Every rank's size bytes, in rank order, over the bootstrap (no data connections needed);
   * tag tells apart the module's concurrent uses (0 .. 255). */
  ncclxResult_t (*oobAllGather)(ncclxComm_t comm, void* all, size_t size, uint32_t tag);

  /* The cost model's link to a ring neighbour: us per message, us per byte. */
  void (*linkCost)(ncclxComm_t comm, double* alphaUs, double* betaUsPerByte);
  /* The tuner plugin's CommFuse entry (tuner.h) and its context, or NULL. */
  const ncclxTunerFuse_v1_t* (*tunerFuse)(ncclxComm_t comm, void** tunerCtx);

  /* The module's state for comm (NULL until set), by the slot init received; the core calls
   * the module's commDestroy with it when the communicator goes. */
  void* (*getState)(ncclxComm_t comm, int slot);
  void (*setState)(ncclxComm_t comm, int slot, void* state);

  /* A value of ncclx.ini (environment overrides applied), or NULL when it is set nowhere. */
  const char* (*configGet)(const char* section, const char* key);
  /* Logging as plugins get it (plugin.h): the core adds host, pid and the rank this thread
   * last set with logSetRank (a module's own threads set it). */
  ncclxLogger_t log;
  void (*logSetRank)(int rank);

  /* The communicator's life and lock, for a module's own handles on it (an MoE layer): retain
   * keeps comm alive until the matching release; execLock orders a read after the operation
   * running now (returns what execUnlock takes; not inside an operation of this thread: the
   * lock is the one opBegin holds, and it is not recursive). */
  void (*retain)(ncclxComm_t comm);
  void (*release)(ncclxComm_t comm);
  int (*execLock)(ncclxComm_t comm);
  void (*execUnlock)(ncclxComm_t comm, int ref);
  /* failQuiet: the communicator fails without telling the other ranks (a peer that saw the
   * fault first-hand tells them). describeRank: "rank 3 (host h, pid p)" for sentences. inGroup:
   * whether this thread is between ncclxGroupStart and ncclxGroupEnd. */
  ncclxResult_t (*failQuiet)(ncclxComm_t comm, ncclxResult_t res, const char* fmt, ...)
      __attribute__((format(printf, 3, 4)));
  const char* (*describeRank)(ncclxComm_t comm, int rank, char* buf, size_t size);
  int (*inGroup)(void);
  float (*halfToFloat)(uint16_t h);
  uint16_t (*floatToHalf)(float f);

  /* Messages: for operations whose sizes are learnt while they run (each peer's first message
   * says how much follows), below steps. msgSend / msgRecv post one message of at most bytes
   * to or from peer (connected first with connect); *req stays NULL while the network is busy
   * (post it again later). msgTest completes one (*got: the bytes that arrived). Messages to
   * one peer in one direction arrive in the order posted, and must not mix with a step's.
   * Messages and waits are used only between opBegin and opEnd (the connections live as long
   * as the communicator, which an operation keeps alive). A
   * refusal or a failed message returns an error and fails nothing: linkFailed then fails the
   * communicator, with an abort notice from the rank that failed first when one arrives
   * within 0.3 s (the peer is often only its messenger), else with the module's sentence. */
  ncclxResult_t (*msgSend)(ncclxComm_t comm, int peer, const void* buf, size_t bytes, void** req);
  ncclxResult_t (*msgRecv)(ncclxComm_t comm, int peer, void* buf, size_t bytes, void** req);
  ncclxResult_t (*msgTest)(ncclxComm_t comm, int peer, void* req, int* done, size_t* got);
  ncclxResult_t (*linkFailed)(ncclxComm_t comm, const char* fmt, ...) __attribute__((format(printf, 2, 3)));
  /* Waiting on messages: spinPolls, how many idle polls to spin before yielding (few when the
   * host has more ranks than CPUs); waitPeers sleeps (about 2 ms at most) until the connections
   * of these peers (isSend[i]: the sending one) or the bootstrap have news; waitCheck, called
   * after waitedSec without progress: abort notices, wait notes to the awaited peers
   * (ranks that disagree on the call fail at once), and past the timeout the failure, listing
   * waitingOn (the module's words: " receiving from rank 2 (first message);"). */
  unsigned (*spinPolls)(ncclxComm_t comm);
  void (*waitPeers)(ncclxComm_t comm, const int* peers, const int* isSend, int n);
  ncclxResult_t (*waitCheck)(ncclxComm_t comm, const int* awaited, int nAwaited, double waitedSec,
                             const char* waitingOn);

  /* Device memory (docs/gpu.md). The transports move host memory: a module stages device
   * buffers through pinned host memory with these. memDevice: the CUDA device p lies on, -1
   * for host memory (always when the process has no CUDA driver loaded; a build without CUDA
   * still recognizes device memory, which checkBuffer then refuses). checkBuffer:
   * ncclxSuccess, or the error with msg naming fn and arg for memory no path can use (device
   * memory in a build without CUDA); records nothing. streamIsDevice: stream is ordered with
   * a CUDA stream (ncclxStreamFromCuda). enqueueDevice: enqueue, plus that ordering: run
   * executes after the CUDA work issued before on the stream's CUDA stream. */
  int (*memDevice)(const void* p);
  ncclxResult_t (*checkBuffer)(const char* fn, const char* arg, const void* p, char* msg, size_t size);
  int (*streamIsDevice)(ncclxStream_t stream);
  ncclxResult_t (*enqueueDevice)(ncclxComm_t comm, ncclxStream_t stream, ncclxResult_t (*run)(void* arg),
                                 void (*release)(void* arg), void* arg);
  /* One operation's copies on device's internal copy stream, in order: devOpen makes device
   * current (what names the operation in errors; call devClose whatever it returns, with
   * *dev, which may be NULL); devPinned gives pinned host memory, valid until devClose (at
   * most 4 buffers per devOpen); devCopy queues a copy in any direction; devCopyBlocks queues n blocks,
   * block i of counts[i] * elemBytes bytes from src + i * stride * elemBytes to dst at the same
   * offset (src and counts in devPinned memory, read by the kernel where they are); devWait
   * waits for everything queued, bounded by the timeout and the abort flag; devClose puts the
   * device back and frees the pinned memory (abandoned while a copy may still run). A CUDA
   * failure fails the communicator with ncclxUnhandledCudaError naming step. */
  ncclxResult_t (*devOpen)(ncclxComm_t comm, int device, const char* what, ncclxModuleDev_t** dev);
  ncclxResult_t (*devPinned)(ncclxModuleDev_t* dev, size_t bytes, void** out);
  ncclxResult_t (*devCopy)(ncclxModuleDev_t* dev, void* dst, const void* src, size_t bytes, const char* step);
  ncclxResult_t (*devCopyBlocks)(ncclxModuleDev_t* dev, void* dst, const void* src, const size_t* counts, int n,
                                 size_t stride, size_t elemBytes, const char* step);
  ncclxResult_t (*devWait)(ncclxModuleDev_t* dev);
  void (*devClose)(ncclxModuleDev_t* dev);

  /* opBegin, with the profiler event named by event (profColl and profAlgo are not read). */
  ncclxResult_t (*opBeginNamed)(ncclxComm_t comm, const ncclxModuleOp_v1_t* op, const ncclxModuleOpEvent_v1_t* event,
                                ncclxModuleOpCtx_v1_t* ctx);
  /* The largest message every network of comm takes (msgSend, msgRecv), 0 = no limit. */
  size_t (*maxMessageBytes)(ncclxComm_t comm);
} ncclxModuleCore_v1_t;

/* ---------------- what a module offers ---------------- */

/* The CommFuse family (ncclx/fuse.h). */
#define NCCLX_MODULE_FAMILY_FUSE "fuse"
typedef struct {
  ncclxResult_t (*allGatherCompute)(const void* sendbuff, void* recvbuff, size_t sendcount, ncclxDataType_t datatype,
                                    ncclxFuseConsumeFn consume, void* user, ncclxFuseSchedule_t schedule,
                                    ncclxComm_t comm, ncclxStream_t stream);
  ncclxResult_t (*computeReduceScatter)(ncclxFuseProduceFn produce, void* user, void* recvbuff, size_t recvcount,
                                        ncclxDataType_t datatype, ncclxRedOp_t op, ncclxFuseSchedule_t schedule,
                                        ncclxComm_t comm, ncclxStream_t stream);
  ncclxResult_t (*allToAllCompute)(ncclxFuseProduceFn produce, ncclxFuseConsumeFn consume, void* user,
                                   void* recvbuff, size_t count, ncclxDataType_t datatype,
                                   ncclxFuseSchedule_t schedule, ncclxComm_t comm, ncclxStream_t stream);
  ncclxResult_t (*lastSchedule)(ncclxComm_t comm, ncclxFuseSchedule_t* schedule);
  int (*schedulePieces)(ncclxFuseSchedule_t schedule, size_t count, ncclxDataType_t datatype, int nranks);
} ncclxModuleFuse_v1_t;

/* The AllToAllvDynamic / MoE family (ncclx/moe.h). The handle type is the module's own. */
#define NCCLX_MODULE_FAMILY_MOE "moe"
typedef struct {
  ncclxResult_t (*allToAllvDynamic)(const void* sendbuff, const size_t* sendcounts, void* recvbuff, size_t maxRecvCount,
                                    size_t* recvcounts, ncclxDataType_t datatype, ncclxComm_t comm,
                                    ncclxStream_t stream);
  ncclxResult_t (*allToAllvDynamicCompact)(const void* sendbuff, const size_t* sendcounts, void* recvbuff,
                                           size_t maxRecvTotal, size_t* recvcounts, size_t* rdispls,
                                           ncclxDataType_t datatype, ncclxComm_t comm, ncclxStream_t stream);
  ncclxResult_t (*moeCreate)(ncclxMoe_t* moe, const ncclxMoeConfig_t* config, ncclxComm_t comm);
  ncclxResult_t (*moeDestroy)(ncclxMoe_t moe);
  ncclxResult_t (*moeLocalExperts)(ncclxMoe_t moe, int* firstExpert, int* nLocalExperts);
  ncclxResult_t (*moeDispatch)(ncclxMoe_t moe, const void* tokens, size_t nTokens, const int32_t* expertIds,
                               void* expertIn, size_t* expertCounts, ncclxStream_t stream);
  ncclxResult_t (*moeDroppedCounts)(ncclxMoe_t moe, size_t* dropped);
  ncclxResult_t (*moeCombine)(ncclxMoe_t moe, const void* expertOut, const float* weights, void* out,
                              ncclxStream_t stream);
} ncclxModuleMoe_v1_t;

typedef struct {
  const char* name;  /* "commfuse" */
  int abiVersion;    /* NCCLX_MODULE_ABI_VERSION */
  /* Called once, when the module is loaded; core stays valid until finalize; slot names the
   * module's per-communicator state (getState, setState). */
  ncclxResult_t (*init)(const ncclxModuleCore_v1_t* core, int slot);
  /* The table of a family's calls (ncclxModuleFuse_v1_t for NCCLX_MODULE_FAMILY_FUSE,
   * ncclxModuleMoe_v1_t for NCCLX_MODULE_FAMILY_MOE), or NULL
   * when the module does not implement that family. */
  const void* (*family)(const char* family);
  /* A communicator with state set goes away (optional). */
  void (*commDestroy)(ncclxComm_t comm, void* state);
  void (*finalize)(void); /* optional */
} ncclxModule_v1_t;

#ifdef __cplusplus
}
#endif
#endif
