/* The progress engine: runs a set of point-to-point transfers to completion.
 *
 * All transfers in one xferRun are posted at once (large ones split into chunks of
 * comm->chunkBytes, a few chunks in flight each) and progressed together, so a rank can send
 * to one peer and receive from another in the same step without deadlock. For one
 * (peer, direction) pair, transfers are issued in array order; the other side must list its
 * matching transfers in the same order.
 *
 * Transfers can also be linked: a receive can reduce each arriving chunk into a buffer
 * (redDst, optionally after a send of that buffer's chunk has gone: redAfter), and a send can
 * forward each chunk of a receive once it has arrived (sendAfter). This overlaps receiving
 * with reducing or forwarding inside one step instead of one step per piece.
 *
 * Waiting spins briefly (a few polls only when this host has more ranks than CPUs), then
 * yields, then sleeps in poll() on the transports' descriptors, so 8 ranks on 2 cores do
 * not burn scheduler slices. A transfer fails with
 * ncclxRemoteError when its peer closes the connection or sends a wrong size, and every
 * transfer fails when there is no progress for comm->timeoutSec, when comm->abortFlag is set
 * or when another rank broadcasts an abort. Failures are recorded on the comm with commFail,
 * naming the peer and the operation (comm->curOpName, comm->curOpSeq). */
#ifndef NCCLX_XFER_H
#define NCCLX_XFER_H

#include <stddef.h>

#include "comm/call_sig.h"
#include "comm/comm.h"
#include "ncclx/module.h"
#include "ncclx/tuner.h"

typedef struct {
  struct ncclxComm* comm; /* NULL: the comm passed to xferRun */
  int peer;               /* rank in that comm; transfers to self are copied, not sent */
  int isSend;
  void* buf;              /* send: source (not modified); recv: destination */
  size_t bytes;
  /* Optional (zero: defaults). Both sides of a transfer must use the same chunk. */
  size_t chunk;           /* bytes per message; 0 = comm->chunkBytes */
  /* Receive-and-reduce (a receive with redDst set): each chunk lands in buf, a staging area
   * of XFER_MAX_INFLIGHT chunks (so it stays in cache), and is reduced into redDst as soon
   * as it arrives, while later chunks are in flight: redDst[i] = redOther[i] op in[i]
   * (in[i] op redOther[i] with redPeerFirst). redDst may equal redOther. chunk must be a
   * multiple of the type size. */
  void* redDst;
  const void* redOther;
  ncclxDataType_t redType;
  ncclxRedOp_t redOp;
  int redPeerFirst;
  /* 1 + index, in the same xferRun array, of a send that reads redDst: chunk k is reduced
   * only after that send's chunk k has gone (0: no such send). Both use the same chunk. */
  int redAfter;
  /* Send only: 1 + index of a receive in the same xferRun array; message k of this send is
   * posted once message k of that receive has arrived (a pipelined forward, as in a
   * broadcast tree: both use the same chunk). 0: none. */
  int sendAfter;
  /* Private to xfer.c. */
  size_t postedBytes, doneBytes;
  int inflight; /* messages posted and not retired (includes arrived ones) */
  int arrived;  /* receive-and-reduce: arrived, waiting to be reduced */
  int head;
  int tagArrived; /* receive: what the transport says arrived, when its signed tag differs */
  void* reqs[8];
  size_t reqBytes[8];
} ncclxXfer;

#define XFER_MAX_INFLIGHT 4 /* messages in flight per transfer (<= size of ncclxXfer.reqs) */

/* The name of a module call kind in mismatch errors: the module's operation name, once this
 * rank has run one of that kind. */
void xferNameModuleKind(int kind, const char* name);
/* What differs between the call a message came from (its signature theirs) and ours (xfer_sig.c). */
void xferDescribeMismatch(int theirs, int ours, char* buf, size_t size);
/* Sign the transfers that follow with this call (kind, bytes per rank, or
 * XFER_SIG_PER_TRANSFER); xferSetCall(comm, XFER_SIG_P2P, XFER_SIG_PER_TRANSFER) after it. */
static inline void xferSetCall(struct ncclxComm* comm, int kind, size_t bytes) {
  comm->xferSigKind = kind;
  comm->xferSigBytes = bytes;
}

/* Memory registered with a network for the operation running on this thread (the GPU path
 * registers the device buffers its plugin reads directly: gpu/gpu_net.c). The engine hands
 * each message the handle of the registration that covers it, or NULL (host memory). */
typedef struct {
  void* netComm; /* sendComm or recvComm of the connection */
  const ncclxNet_t* net;
  char* base;
  size_t bytes;
  void* mhandle;
  int flush; /* a direct receive on a device with forceFlush */
} xferReg;
/* Until the next call, on this thread (regs stays the caller's; NULL, 0: none). */
void xferPublishRegs(const xferReg* regs, int n);

ncclxResult_t xferRun(struct ncclxComm* comm, ncclxXfer* xfers, int n);
/* xferRun that also copies src to dst (bytes, not overlapping) in steps between progress
 * passes, so a local copy rides along with the transfers instead of preceding or following
 * them. The transfers must not write src or read dst (a broadcast root's sendbuff to its
 * recvbuff; a rank's own all-gather or all-to-all block, received into other blocks). */
ncclxResult_t xferRunCopying(struct ncclxComm* comm, ncclxXfer* xfers, int n, void* dst,
                             const void* src, size_t bytes);

/* Private to xfer.c (here so that a run can be embedded). */
struct xferState {
  struct ncclxComm* comm;
  size_t chunk;
  size_t msgsTotal, msgsPosted, msgsDone;
  uint64_t ticket; /* posting turn on its connection (struct ncclxPeerConn.ticket*) */
  int tag;         /* the signed tag of its messages */
  int hasTag;      /* tag is set (not a transfer to self) */
  int hasTicket;   /* 1 while it holds a turn it has not finished posting */
  void* event; /* profiler STEP event, or NULL */
};

/* What ncclxCommDump sees of the step in progress (xfer.c publishes it on comm->live). */
struct ncclxXferLive {
  ncclxXfer* xfers;
  int n;
};

#define XFER_RUN_STATES 4
/* xferRun in parts, for a thread that computes while its transfers move and makes them
 * progress between pieces of work: xferStart posts what it can and returns; xferTest makes
 * one non-blocking pass (post, test; *progressed says whether anything moved) and leaves
 * run->pending 0 once every transfer is complete; xferIdle is what a waiter calls after a
 * pass that moved nothing (spin, then yield, then sleep in poll() for at most 2 ms; it
 * checks the abort flag, abort notices and the communicator's timeout); xferWait loops
 * until complete; xferEnd releases the run and returns its result (an error if it was
 * still pending: call it only once complete, or on a failure path). Errors are recorded
 * on the communicator as with xferRun, and stick to the run (run->res). Several runs may be
 * in flight on one communicator from one thread; transfers of later runs to the same
 * (peer, direction) must be started after the earlier ones (messages match in order).
 * The buffers and the xfers array must stay valid until xferEnd. */
typedef struct {
  struct ncclxComm* comm;
  ncclxXfer* x;
  int n;
  int pending;            /* some transfer is not complete */
  ncclxResult_t res;
  /* Private to xfer.c. */
  struct xferState* s;
  int ownsStates;
  unsigned idle, spins;
  double lastProgress;
  double startTime;
  struct ncclxXferLive live;
  struct xferState inlineStates[XFER_RUN_STATES];
} ncclxXferRun;

ncclxResult_t xferStart(struct ncclxComm* comm, ncclxXfer* xfers, int n, ncclxXferRun* run);
ncclxResult_t xferTest(ncclxXferRun* run, int* progressed);
ncclxResult_t xferIdle(ncclxXferRun* run);
ncclxResult_t xferWait(ncclxXferRun* run);
ncclxResult_t xferEnd(ncclxXferRun* run);

/* Polls of a waiting rank before it yields: XFER_SPIN_POLLS, or XFER_SPIN_OVERSUBSCRIBED when
 * this host has more ranks than CPUs (spinning then only holds the core the awaited peer
 * needs). Shared by every wait loop of the core. */
#define XFER_SPIN_POLLS 200u /* ~5 us at ~25 ns per idle poll */
#define XFER_SPIN_OVERSUBSCRIBED 4u
unsigned xferSpinPolls(const struct ncclxComm* comm);
/* Sleep until one of fds (room for one more: the bootstrap's, for abort notices) has news,
 * about 2 ms at most; only 50 us when noFd (something waited on has no descriptor). */
struct pollfd;
void xferSleepOn(struct ncclxComm* comm, struct pollfd* fds, int nfds, int noFd);

/* Shorthands for the common steps of collective algorithms. A peer < 0 skips that half. */
ncclxResult_t xferSendRecv(struct ncclxComm* comm, int sendPeer, const void* sendBuf,
                           size_t sendBytes, int recvPeer, void* recvBuf, size_t recvBytes);
ncclxResult_t xferSend(struct ncclxComm* comm, int peer, const void* buf, size_t bytes);
ncclxResult_t xferRecv(struct ncclxComm* comm, int peer, void* buf, size_t bytes);
#endif
