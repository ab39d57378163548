/* The progress engine: runs a set of point-to-point transfers to completion.
 *
 * All transfers in one xferRun are posted at once (large ones split into chunks of
 * comm->chunkBytes, a few chunks in flight each) and progressed together, so a rank can send
 * to one peer and receive from another in the same step without deadlock. For one
 * (peer, direction) pair, transfers are issued in array order; the other side must list its
 * matching transfers in the same order.
 *
 * Waiting spins briefly, then yields, then sleeps in poll() on the transports' descriptors,
 * so 8 ranks on 2 cores do not burn scheduler slices. A transfer fails with
 * ncclxRemoteError when its peer closes the connection or sends a wrong size, and every
 * transfer fails when there is no progress for comm->timeoutSec, when comm->abortFlag is set
 * or when another rank broadcasts an abort. Failures are recorded on the comm with commFail,
 * naming the peer and the operation (comm->curOpName, comm->curOpSeq). */
#ifndef NCCLX_XFER_H
#define NCCLX_XFER_H

#include <stddef.h>

#include "comm.h"

typedef struct {
  struct ncclxComm* comm; /* NULL: the comm passed to xferRun */
  int peer;               /* rank in that comm; transfers to self are copied, not sent */
  int isSend;
  void* buf;              /* send: source (not modified); recv: destination */
  size_t bytes;
  /* Private to xfer.c. */
  size_t postedBytes, doneBytes;
  int inflight;
  int head;
  void* reqs[8];
  size_t reqBytes[8];
} ncclxXfer;

ncclxResult_t xferRun(struct ncclxComm* comm, ncclxXfer* xfers, int n);

/* What ncclxCommDump sees of the step in progress (xfer.c publishes it on comm->live). */
struct ncclxXferLive {
  ncclxXfer* xfers;
  int n;
};

/* Shorthands for the common steps of collective algorithms. A peer < 0 skips that half. */
ncclxResult_t xferSendRecv(struct ncclxComm* comm, int sendPeer, const void* sendBuf,
                           size_t sendBytes, int recvPeer, void* recvBuf, size_t recvBytes);
ncclxResult_t xferSend(struct ncclxComm* comm, int peer, const void* buf, size_t bytes);
ncclxResult_t xferRecv(struct ncclxComm* comm, int peer, void* buf, size_t bytes);
#endif
