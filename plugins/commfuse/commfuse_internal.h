/* CommFuse internals: one fused operation in execution, the step machinery shared by the
 * schedules (commfuse_steps.c), and the schedules themselves (commfuse_ag.c, commfuse_rs.c).
 *
 * CommFuse is a feature module (ncclx/module.h): everything it needs of the core goes
 * through fuseCore, the table the core handed to its init (commfuse_module.c).
 *
 * Threading: the thread executing the call holds comm->execLock for the whole operation and
 * runs the user's callbacks. RING_P2P and SLICED (all-gather, reduce-scatter) progress
 * their transfers on that same thread between callbacks (flows, commfuse_flow.h); the
 * all-to-all and DIRECT_P2P hand steps to a borrowed helper thread. At any moment exactly
 * one thread touches the communicator: the executing thread never calls into comm while
 * a helper job runs. */
#ifndef NCCLX_COMMFUSE_INTERNAL_H
#define NCCLX_COMMFUSE_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "commfuse_helper.h"
#include "ncclx/fuse.h"
#include "ncclx/module.h"

extern const ncclxModuleCore_v1_t* fuseCore;
extern int fuseSlot; /* our per-communicator state (struct fuseCommState) */

#define NCCLX_CHECK(call)                              \
  do {                                                 \
    ncclxResult_t ncclx_res_ = (call);                 \
    if (ncclx_res_ != ncclxSuccess) return ncclx_res_; \
  } while (0)
#define FUSE_INFO(subsys, ...) fuseCore->log(NCCLX_LOG_INFO, (subsys), __FILE__, __LINE__, __VA_ARGS__)

typedef ncclxModuleXfer_v1_t fuseXfer;
typedef enum { FUSE_AG, FUSE_RS, FUSE_A2A } fuseKind;

/* What CommFuse keeps per communicator: the last schedule run (ncclxFuseLastSchedule) and
 * NCCLX_FUSE_AUTO's choices per call shape. */
struct fuseCommState {
  int _Atomic lastSchedule; /* algo << 16 | slices of the last fused call; -1: none yet */
  struct fuseAutoTable* autoTable;
};
/* The communicator's state, created on first use (NULL: out of memory). */
struct fuseCommState* fuseCommState(ncclxComm_t comm);

typedef struct fuseOp {
  ncclxComm_t comm;
  ncclxModuleCommInfo_v1_t info; /* its rank, nranks, timeout */
  fuseKind kind;
  const char* name; /* "allgather-compute" / "compute-reducescatter" / "alltoall-compute" */
  uint64_t seq;
  ncclxFuseSchedule_t sched; /* validated; sched.unit >= 1 */
  ncclxDataType_t type;
  size_t typeSize;
  size_t count; /* elements per block */
  const void* sendbuff;
  void* recvbuff;
  ncclxFuseConsumeFn consume;
  ncclxFuseProduceFn produce;
  ncclxRedOp_t op;
  void* user;
  struct fuseHelper* helper; /* NULL when nothing overlaps (1 rank): jobs run inline */
  ncclxResult_t inlineRes;   /* result of the last inline job, for fuseWait */

  /* The helper's current job (set by the fuseStart* functions). */
  fuseXfer xfers[2];
  int nxfers;
  char* jobBase; /* all-to-all slice jobs: the staged blocks */
  size_t jobOff, jobLen;
  double* linkEnd;   /* emulated link: when the link to each peer is free again */

  /* NCCLX_FUSE_AUTO (commfuse_auto.c): the shape's record, and the callbacks' time. */
  struct fuseAutoShape* autoShape;
  double computeSec;
  double autoStart; /* when the call's schedule started (fuseNow) */
  ncclxFuseConsumeFn userConsume; /* the caller's callbacks, behind timing wrappers */
  ncclxFuseProduceFn userProduce;
  void* userData;
} fuseOp;

/* ---- the calls (commfuse.c), as the family table of commfuse_module.c lists them ---- */
ncclxResult_t fuseAllGatherCompute(const void* sendbuff, void* recvbuff, size_t sendcount, ncclxDataType_t datatype,
                                   ncclxFuseConsumeFn consume, void* user, ncclxFuseSchedule_t schedule,
                                   ncclxComm_t comm, ncclxStream_t stream);
ncclxResult_t fuseComputeReduceScatter(ncclxFuseProduceFn produce, void* user, void* recvbuff, size_t recvcount,
                                       ncclxDataType_t datatype, ncclxRedOp_t op, ncclxFuseSchedule_t schedule,
                                       ncclxComm_t comm, ncclxStream_t stream);
ncclxResult_t fuseAllToAllCompute(ncclxFuseProduceFn produce, ncclxFuseConsumeFn consume, void* user,
                                  void* recvbuff, size_t count, ncclxDataType_t datatype,
                                  ncclxFuseSchedule_t schedule, ncclxComm_t comm, ncclxStream_t stream);
ncclxResult_t fuseLastSchedule(ncclxComm_t comm, ncclxFuseSchedule_t* schedule);
int fuseSchedulePieces(ncclxFuseSchedule_t schedule, size_t count, ncclxDataType_t datatype, int nranks);
const char* fuseAlgoName(ncclxFuseAlgo_t algo);

/* ---- the automatic schedule (commfuse_auto.c) ---- */
/* f->sched AUTO: replace it with the schedule chosen for f's shape (else nothing). */
void fuseAutoResolve(fuseOp* f);
/* After the call: record the callbacks' time; on agreement calls, exchange it (bootstrap)
 * and choose again. Returns res, or the exchange's error. */
ncclxResult_t fuseAutoRecord(fuseOp* f, ncclxResult_t res);
/* Estimated microseconds of one call. */
double fuseAutoEstimate(int algo, int k, int n, double blockUs, double alphaUs, double computeUs);

/* ---- time and the emulated link (commfuse_flow.c) ---- */
double fuseNow(void); /* CLOCK_MONOTONIC, seconds */
void fuseSleepUntil(double t);
/* A send of `bytes` to peer posted now: when its bytes have crossed the emulated link
 * (after the link's previous transfer), which is then busy until that time. */
double fuseLinkStamp(fuseOp* f, int peer, size_t bytes);

/* ---- steps (commfuse_steps.c) ---- */
/* One point-to-point step on this thread; with the emulated link it also carries the
 * stamps and ends once their link times have passed (see commfuse_flow.h). */
ncclxResult_t fuseStepRun(fuseOp* f, fuseXfer* x, int n);
/* The same step on the helper (inline without one); fuseWait collects it. */
void fuseStepStart(fuseOp* f, const fuseXfer* x, int n);
/* A ring all-gather / reduce-scatter of one slice (byte offsets and lengths), run to
 * completion on this thread. See commfuse_steps.c for the layouts. */
ncclxResult_t fuseAgSliceRun(fuseOp* f, size_t offBytes, size_t lenBytes);
ncclxResult_t fuseRsSliceRun(fuseOp* f, char* blocks, size_t lenBytes, char* dst, char* partials);
/* Collect the helper's job (success when none is pending). Errors are the communicator's
 * (already recorded with fuseCore->fail), repeated on this thread. */
ncclxResult_t fuseWait(fuseOp* f);
/* A callback returned rc: fail the communicator with an abort notice to every rank, stop
 * the helper's job, and return the error for this rank. */
ncclxResult_t fuseCallbackFailed(fuseOp* f, const char* which, int rank, int rc);
/* Staging memory from the communicator's scratch (failure is recorded with fuseCore->fail). */
ncclxResult_t fuseScratch(fuseOp* f, size_t bytes, char** out);
/* Slice s of k of a block, in elements, cut at multiples of sched.unit. */
void fuseSlice(const fuseOp* f, int k, int s, size_t* off, size_t* len);
/* The number of slices SLICED really uses (k, capped by the units in a block). */
int fuseSliceCount(const fuseOp* f);
/* The pieces per block RING_P2P uses: sched.slices, or the automatic choice for 0. */
int fuseRingPieces(const fuseOp* f);
int fuseAutoPieces(size_t count, size_t typeSize, size_t unit, int nranks);

/* ---- schedules ---- */
ncclxResult_t fuseAllGather(fuseOp* f);     /* commfuse_ag.c */
ncclxResult_t fuseReduceScatter(fuseOp* f); /* commfuse_rs.c */
ncclxResult_t fuseAllToAll(fuseOp* f);      /* commfuse_a2a.c */
/* RING_P2P pipelined by the computing thread (commfuse_pipe.c), fuseRingPieces pieces. */
ncclxResult_t fusePipeAllGather(fuseOp* f);
ncclxResult_t fusePipeReduceScatter(fuseOp* f);
#endif
