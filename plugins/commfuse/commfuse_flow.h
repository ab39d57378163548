/* CommFuse flows: the point-to-point steps of one ring (or pairwise) pattern, progressed by
 * the thread that computes, between its pieces of work, with no helper thread.
 *
 * Why: a helper thread that shares the rank's core with the GEMM only runs when the
 * scheduler gives it the core, which on a machine with one core per rank is often only
 * when the GEMM's piece ends (traced: a helper signalled at the start of a 1 ms GEMM first
 * ran when it ended, and its transfer started then). Posting from the computing thread
 * happens at once; the transports then move the data on their own (the peer pulls it with
 * process_vm_readv, a NIC or the emulated link would DMA it), and the computing thread
 * tests, forwards and reduces between pieces.
 *
 * A flow is a list of steps; step k has a send half and a receive half (either may be
 * absent). Halves are posted in step order (messages match in order per peer): a receive
 * as soon as it is not held, its buffer's previous reader (recvAfterSend) is done and at
 * most FLOW_RECV_WINDOW receives are outstanding; a send once it is not held and the
 * receive it forwards (sendAfterRecv) is complete. A receive may reduce on completion:
 * redDst = redA op received.
 *
 * Emulated link (schedule.linkBytesPerSec > 0): each send is preceded by an 8-byte stamp,
 * the time its bytes have crossed the link: max(post time, the end of the previous
 * transfer on that link) + bytes / rate. A receive is complete when its data has arrived
 * and that time has passed, a send when the transport is done and that time has passed
 * (a DMA engine reads the buffer until then). Times are CLOCK_MONOTONIC: one host. */
#ifndef NCCLX_COMMFUSE_FLOW_H
#define NCCLX_COMMFUSE_FLOW_H

#include "commfuse_internal.h"

#define FLOW_RECV_WINDOW 4

typedef struct {
  int peer; /* < 0: no such half */
  char* buf;
  size_t bytes;
  int held;     /* posted only after fuseFlowRelease */
  int state;    /* 0 not posted, 1 posted, 2 complete */
  double stamp; /* the link end (sent, or received) */
  fuseXfer x[2];
  ncclxModuleStep_t* run; /* while posted (state 1) */
} fuseHalf;

typedef struct {
  fuseHalf send, recv;
  int sendAfterRecv; /* step whose receive must be complete first, or -1 */
  int recvAfterSend; /* step whose send must be complete first (buffer reuse), or -1 */
  char* redDst;      /* optional: on receive, redDst = redA op recv.buf (redElems) */
  const char* redA;
  size_t redElems;
} fuseFlowStep;

typedef struct {
  fuseOp* f;
  fuseFlowStep* steps;
  int n;
  int nextSend, nextRecv; /* next half to post */
  int recvsOut;           /* receives posted and not complete */
  int sendsDone, recvsDone;
} fuseFlow;

/* Steps start zeroed (every half absent): set peers, buffers and dependencies, then
 * fuseFlowStart. Memory comes from malloc; fuseFlowEnd frees it. */
ncclxResult_t fuseFlowInit(fuseFlow* w, fuseOp* f, int nsteps);
void fuseFlowStep0(fuseFlowStep* s); /* a step with no halves and no dependencies */
ncclxResult_t fuseFlowStart(fuseFlow* w);
/* One non-blocking pass: post what may go, test what is in flight. */
ncclxResult_t fuseFlowPump(fuseFlow* w);
void fuseFlowRelease(fuseFlow* w, int step, int isSend);
/* Whether a half is complete (as of the last pump). */
int fuseFlowDone(const fuseFlow* w, int step, int isSend);
/* Wait (pumping) until a half is complete; step < 0 with isSend -1: everything. */
ncclxResult_t fuseFlowWait(fuseFlow* w, int step, int isSend);
/* Wait for everything (on success), end the runs and free. */
ncclxResult_t fuseFlowEnd(fuseFlow* w, ncclxResult_t res);
#endif
