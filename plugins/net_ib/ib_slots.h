/* Request bookkeeping of one comm: a ring of IB_QUEUE slots indexed by message number
 * (seq % IB_QUEUE). At most IB_QUEUE messages are between post and release, so a slot, the
 * CTS ring entry and the work-request ids of a message are never ambiguous. Pure logic. */
#ifndef NCCLX_IB_SLOTS_H
#define NCCLX_IB_SLOTS_H

#include "ib_common.h"

enum { IB_REQ_FREE = 0, IB_REQ_POSTED = 1, IB_REQ_DONE = 2, IB_REQ_FAILED = 3 };

typedef struct {
  int state;
  uint64_t seq;
  int pending;      /* completions still expected: one per QP */
  size_t size;      /* send: message bytes; receive: capacity */
  size_t msgSize;   /* receive: bytes announced by the immediates */
  int sizeKnown;
} ibReqState;

typedef struct {
  uint64_t first;   /* oldest message not yet released */
  uint64_t next;    /* number of the next message to post */
  ibReqState r[IB_QUEUE];
} ibRing;

void ibRingInit(ibRing* ring);
int ibRingSlot(uint64_t seq);
int ibRingCanPost(const ibRing* ring);
/* Takes the next message number; parts = completions that finish it. NULL when full. */
ibReqState* ibRingPost(ibRing* ring, size_t size, int parts);
/* The posted request for message seq, or NULL when that message is not in flight. */
ibReqState* ibRingFind(ibRing* ring, uint64_t seq);
/* Message number of a posted request whose 32 low bits are seqLow, in [first, next). */
int ibRingMatch(const ibRing* ring, int slot, uint32_t seqLow, uint64_t* seq);
void ibRingRelease(ibRing* ring, ibReqState* r);
/* Requests posted and not yet reported done. */
int ibRingOutstanding(const ibRing* ring);

/* One local send completion. Returns 1 when the request just became done. */
int ibReqSendPart(ibReqState* r);
/* One immediate (host order) of a receive. Returns NULL, or an error message when the sender
 * flagged a too-large message, the parts disagree on the size, or it exceeds the capacity.
 * *done = 1 when this was the last part. */
const char* ibReqRecvPart(ibReqState* r, uint32_t imm, int* done);

#endif
