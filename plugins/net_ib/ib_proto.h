/* The data-path protocol of net_ib, as pure functions (the verbs calls live in ib_data.c).
 *
 * Message number `seq` on a connection with nqps queue pairs:
 * 1. The receiver's irecv posts one zero-length RECV on every QP, then SENDs a 32-byte
 *    "clear to send" (CTS) record {seq, addr, capacity, rkey} on QP 0. The sender keeps
 *    IB_QUEUE RECVs posted for CTS records, so seq's record lands in ring slot seq % IB_QUEUE.
 * 2. The sender's isend for seq waits for that record (isend returns no request until then),
 *    cuts the message into at most nqps parts and issues one RDMA WRITE WITH IMMEDIATE on
 *    every QP (zero bytes on QPs without a part). The immediate is the message size, or the
 *    error flag when the message is larger than the receive.
 * 3. The receive is complete when the immediates of all nqps QPs arrived; the send is complete
 *    when all nqps writes completed locally.
 * Every QP carries exactly one immediate per message in seq order, so the receiver's RECVs
 * (consumed in posting order) match messages without any tag lookup. */
#ifndef NCCLX_IB_PROTO_H
#define NCCLX_IB_PROTO_H

#include "ib_common.h"

#define IB_CTS_BYTES 32
#define IB_STRIPE_ALIGN 128               /* parts start on cache-line multiples */
#define IB_STRIPE_MIN ((size_t)64 << 10)  /* below this, one part: small messages stay whole */

typedef struct {
  uint64_t seq;
  uint64_t addr;
  uint64_t size;   /* capacity of the posted receive */
  uint32_t rkey;
} ibCts;

void ibCtsEncode(const ibCts* cts, void* buf);
/* NULL when buf holds a valid record for message `seq`, else why not. */
const char* ibCtsDecode(const void* buf, uint64_t seq, ibCts* out);

/* Immediate data (host order; the caller converts with htobe32/be32toh). */
#define IB_IMM_ERROR 0x80000000u
uint32_t ibImmEncode(size_t size, int tooLarge);
/* 0 and *size for a data immediate, 1 for the "send larger than receive" flag. */
int ibImmDecode(uint32_t imm, size_t* size);

/* Part of a `size`-byte message that QP j carries: [*off, *off + *len). Parts are assigned
 * starting at QP `lead` (seq % nqps) so small messages rotate over the QPs. */
void ibStripe(size_t size, int nqps, int lead, int j, size_t* off, size_t* len);

/* Work request ids: kind, QP, ring slot and the low 32 bits of seq (checked on completion). */
enum { IB_WR_DATA_SEND = 1, IB_WR_DATA_RECV = 2, IB_WR_CTS_SEND = 3, IB_WR_CTS_RECV = 4 };
uint64_t ibWrId(int kind, int qp, int slot, uint64_t seq);
void ibWrIdDecode(uint64_t id, int* kind, int* qp, int* slot, uint32_t* seqLow);

#endif
