/* Request ring and completion accounting (see ib_slots.h). */
#include "ib_slots.h"

#include <string.h>

#include "ib_proto.h"

void ibRingInit(ibRing* ring) { memset(ring, 0, sizeof(*ring)); }

int ibRingSlot(uint64_t seq) { return (int)(seq % IB_QUEUE); }

int ibRingCanPost(const ibRing* ring) {
  return ring->next - ring->first < IB_QUEUE && ring->r[ibRingSlot(ring->next)].state == IB_REQ_FREE;
}

ibReqState* ibRingPost(ibRing* ring, size_t size, int parts) {
  if (!ibRingCanPost(ring)) return NULL;
  ibReqState* r = &ring->r[ibRingSlot(ring->next)];
  memset(r, 0, sizeof(*r));
  r->state = IB_REQ_POSTED;
  r->seq = ring->next++;
  r->pending = parts;
  r->size = size;
  return r;
}

ibReqState* ibRingFind(ibRing* ring, uint64_t seq) {
  if (seq < ring->first || seq >= ring->next) return NULL;
  ibReqState* r = &ring->r[ibRingSlot(seq)];
  return (r->state != IB_REQ_FREE && r->seq == seq) ? r : NULL;
}

int ibRingMatch(const ibRing* ring, int slot, uint32_t seqLow, uint64_t* seq) {
  if (slot < 0 || slot >= IB_QUEUE) return 0;
  const ibReqState* r = &ring->r[slot];
  if (r->state == IB_REQ_FREE || (uint32_t)r->seq != seqLow) return 0;
  if (r->seq < ring->first || r->seq >= ring->next) return 0;
  *seq = r->seq;
  return 1;
}

void ibRingRelease(ibRing* ring, ibReqState* r) {
  r->state = IB_REQ_FREE;
  while (ring->first < ring->next && ring->r[ibRingSlot(ring->first)].state == IB_REQ_FREE)
    ring->first++;
}

int ibRingOutstanding(const ibRing* ring) {
  int n = 0;
  for (uint64_t s = ring->first; s < ring->next; s++) n += ring->r[ibRingSlot(s)].state == IB_REQ_POSTED;
  return n;
}

int ibReqSendPart(ibReqState* r) {
  if (r->state != IB_REQ_POSTED || r->pending <= 0) return 0;
  if (--r->pending > 0) return 0;
  r->state = IB_REQ_DONE;
  return 1;
}

const char* ibReqRecvPart(ibReqState* r, uint32_t imm, int* done) {
  *done = 0;
  if (r->state != IB_REQ_POSTED || r->pending <= 0) return "completion for a request that expects none";
  size_t size = 0;
  if (ibImmDecode(imm, &size)) {
    r->state = IB_REQ_FAILED;
    return "the sender's message is larger than the posted receive";
  }
  if (r->sizeKnown && size != r->msgSize) {
    r->state = IB_REQ_FAILED;
    return "the parts of one message announce different sizes";
  }
  if (size > r->size) {
    r->state = IB_REQ_FAILED;
    return "a message larger than the posted receive arrived";
  }
  r->msgSize = size;
  r->sizeKnown = 1;
  if (--r->pending == 0) {
    r->state = IB_REQ_DONE;
    *done = 1;
  }
  return NULL;
}
