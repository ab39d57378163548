/* CommFuse internals: one fused operation in execution, the step machinery shared by the
 * schedules (commfuse_steps.c), and the schedules themselves (commfuse_ag.c, commfuse_rs.c).
 *
 * Threading: the thread executing the call holds comm->execLock for the whole operation and
 * runs the user's callbacks; communication steps run either on that thread (exposed) or on
 * a borrowed helper thread (overlapped). At any moment exactly one of the two touches the
 * communicator: the executing thread never calls into comm while a helper job runs. */
#ifndef NCCLX_COMMFUSE_INTERNAL_H
#define NCCLX_COMMFUSE_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "comm.h"
#include "commfuse_helper.h"
#include "ncclx/fuse.h"
#include "xfer.h"

typedef enum { FUSE_AG, FUSE_RS, FUSE_A2A } fuseKind;

/* Piece counters shared by the executing thread and a helper running a whole pipelined
 * ring (commfuse_pipe.c): each side publishes how far it got and sleeps, never spins,
 * until the other gets far enough (one core per rank: spinning would steal it). */
typedef struct {
  pthread_mutex_t lock;
  pthread_cond_t cond; /* CLOCK_MONOTONIC */
  atomic_long produced; /* pieces the executing thread has produced (RS) */
  atomic_long moved;    /* pieces the helper has finished (sent/received, reduced) */
  atomic_int ended;     /* the helper's job returned */
  atomic_int sleepers;  /* threads in (or entering) a wait on cond */
} fuseProgress;

typedef struct fuseOp {
  struct ncclxComm* comm;
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
  ncclxXfer xfers[2];
  int nxfers;
  char* jobBase; /* slice jobs: blocks of stride jobStride bytes */
  size_t jobStride, jobOff, jobLen;
  char* jobDst;
  char* jobPartials; /* RS slice jobs: two pieces of jobLen bytes */
  fuseProgress prog; /* RING_P2P pipelines */
  char* pipeTmp[2];  /* RS pipeline: this rank's partials of steps t % 2 */
  char* pipeAcc[2];  /* RS pipeline: partials received for steps t % 2 */
} fuseOp;

/* ---- steps (commfuse_steps.c) ---- */
/* One point-to-point step on this thread, then the link emulation's sleep if enabled. */
ncclxResult_t fuseStepRun(fuseOp* f, ncclxXfer* x, int n);
/* The same step on the helper (inline without one); fuseWait collects it. */
void fuseStepStart(fuseOp* f, const ncclxXfer* x, int n);
/* A ring all-gather / reduce-scatter of one slice (byte offsets and lengths), on this
 * thread (Run) or on the helper (Start). See commfuse_steps.c for the layouts. */
ncclxResult_t fuseAgSliceRun(fuseOp* f, size_t offBytes, size_t lenBytes);
void fuseAgSliceStart(fuseOp* f, size_t offBytes, size_t lenBytes);
ncclxResult_t fuseRsSliceRun(fuseOp* f, char* blocks, size_t lenBytes, char* dst, char* partials);
void fuseRsSliceStart(fuseOp* f, char* blocks, size_t lenBytes, char* dst, char* partials);
/* Collect the helper's job (success when none is pending). Errors are the communicator's
 * (already recorded with commFail/commSetError), repeated on this thread. */
ncclxResult_t fuseWait(fuseOp* f);
/* A callback returned rc: fail the communicator with an abort notice to every rank, stop
 * the helper's job, and return the error for this rank. */
ncclxResult_t fuseCallbackFailed(fuseOp* f, const char* which, int rank, int rc);
/* Staging memory from the communicator's scratch (failure is recorded with commFail). */
ncclxResult_t fuseScratch(fuseOp* f, size_t bytes, char** out);
/* Slice s of k of a block, in elements, cut at multiples of sched.unit. */
void fuseSlice(const fuseOp* f, int k, int s, size_t* off, size_t* len);
/* The number of slices SLICED really uses (k, capped by the units in a block). */
int fuseSliceCount(const fuseOp* f);

/* ---- schedules ---- */
ncclxResult_t fuseAllGather(fuseOp* f);     /* commfuse_ag.c */
ncclxResult_t fuseReduceScatter(fuseOp* f); /* commfuse_rs.c */
ncclxResult_t fuseAllToAll(fuseOp* f);      /* commfuse_a2a.c */
/* RING_P2P as one pipelined job on the helper (commfuse_pipe.c); p = sched.slices pieces. */
ncclxResult_t fusePipeAllGather(fuseOp* f);
ncclxResult_t fusePipeReduceScatter(fuseOp* f);
#endif
