/* ncclx feature-module ABI, version 1.
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
#define NCCLX_MODULE_BYTES_PER_TRANSFER ((size_t)-1) /* each transfer signs its own size */

/* One operation of a module as the core runs it (opBegin ... opEnd): under the
 * communicator's execution lock (one operation at a time), numbered with the collectives
 * (every rank makes the same calls in the same order), its messages signed, reported to the
 * profiler as the collective it resembles. */
typedef struct {
  const char* name;       /* "allgather-compute": in errors, logs and wait notes */
  const char* path;       /* how this rank runs it ("CommFuse ring_p2p"), for wait notes */
  int callKind;           /* 0 .. NCCLX_MODULE_CALL_KINDS - 1 */
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

typedef struct {
  size_t size;     /* sizeof(ncclxModuleCore_v1_t) of the core: the table only grows at its end */
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
   * until then. With stream NULL the module runs the call itself. */
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

typedef struct {
  const char* name;  /* "commfuse" */
  int abiVersion;    /* NCCLX_MODULE_ABI_VERSION */
  /* Called once, when the module is loaded; core stays valid until finalize; slot names the
   * module's per-communicator state (getState, setState). */
  ncclxResult_t (*init)(const ncclxModuleCore_v1_t* core, int slot);
  /* The table of a family's calls (ncclxModuleFuse_v1_t for NCCLX_MODULE_FAMILY_FUSE), or NULL
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
