/* AllToAllvDynamic's message 0 (see alltoallv_dynamic.h): a peer's header is checked
 * against this rank's call (magic, sequence, unit, segments, capacity) and its data placed
 * in the receive segments as it arrives; this rank's own block is copied in place. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alltoallv_dynamic_engine.h"

/* ---------------- message 0 ---------------- */

ncclxResult_t parseHeader(dynState* st, int peer, size_t got) {
  ncclxComm_t comm = st->comm;
  dynExchange* x = st->x;
  dynPeer* p = &x->peers[peer];
  dynChan* ch = &st->recv[peer];
  char who[128];
  moeCore->describeRank(comm, peer, who, sizeof(who));
  dynHeader h;
  memset(&h, 0, sizeof(h));
  if (got == sizeof(dynEmptyHeader) && *(const uint32_t*)ch->msg0 == DYN_MAGIC_EMPTY) {
    dynEmptyHeader e;
    memcpy(&e, ch->msg0, sizeof(e));
    h = (dynHeader){.magic = DYN_MAGIC, .nseg = e.nseg, .unitBytes = e.unitBytes, .seq = e.seq,
                    .capacity = e.capacity, .chunk = st->chunk};
    if (e.nseg == (uint32_t)p->nRecvSeg) { /* else refused below */
      got = hdrSize(p->nRecvSeg);           /* as if the zero counts had been sent */
      memset(ch->msg0 + sizeof(h), 0, got - sizeof(h));
    }
  } else if (got >= sizeof(h)) {
    memcpy(&h, ch->msg0, sizeof(h));
  }
  if (got < sizeof(h) || h.magic != DYN_MAGIC)
    return moeCore->fail(comm, ncclxInvalidUsage,
                    "%s #%llu: %s sent a %zu-byte message that does not start with a dynamic all-to-all "
                    "header (is it running a different collective? calls differ between ranks?)",
                    opName(st), opSeq(st), who, got);
  if (h.seq != st->call->seq)
    return moeCore->fail(comm, ncclxInvalidUsage,
                    "%s #%llu: %s is at collective #%llu (calls differ between ranks?)", opName(st),
                    opSeq(st), who, (unsigned long long)h.seq);
  if (h.unitBytes != x->unitBytes)
    return moeCore->fail(comm, ncclxInvalidUsage,
                    "%s #%llu: %s counts in %llu-byte %s, this rank in %zu-byte ones "
                    "(datatype or row size differs between ranks?)",
                    opName(st), opSeq(st), who, (unsigned long long)h.unitBytes, x->unitName, x->unitBytes);
  if (h.nseg != (uint32_t)p->nRecvSeg || got < hdrSize((int)h.nseg))
    return moeCore->fail(comm, ncclxInvalidUsage,
                    "%s #%llu: %s sends %u segments, this rank expects %d (arguments such as the number of "
                    "experts differ between ranks?)",
                    opName(st), opSeq(st), who, h.nseg, p->nRecvSeg);
  if (h.chunk == 0 || h.chunk > st->chunk)
    return moeCore->fail(comm, ncclxInvalidUsage, "%s #%llu: %s uses %llu-byte messages, this rank at most %zu",
                    opName(st), opSeq(st), who, (unsigned long long)h.chunk, st->chunk);
  memcpy(p->recvSegs, ch->msg0 + sizeof(h), 8 * (size_t)p->nRecvSeg);
  uint64_t total = 0, limit = (SIZE_MAX / 2) / x->unitBytes;
  for (int i = 0; i < p->nRecvSeg; i++) {
    if (p->recvSegs[i] > limit - total)
      return moeCore->fail(comm, ncclxInvalidUsage, "%s #%llu: %s announces more %s than fit in memory",
                      opName(st), opSeq(st), who, x->unitName);
    total += p->recvSegs[i];
  }
  uint64_t bytes = total * x->unitBytes;
  if ((h.inlined != 0 && h.inlined != bytes) || h.inlined > st->inlineMax ||
      got != hdrSize(p->nRecvSeg) + h.inlined)
    return moeCore->fail(comm, ncclxInvalidUsage,
                    "%s #%llu: %s sent a %zu-byte first message with %llu of its %llu bytes (calls differ "
                    "between ranks?)",
                    opName(st), opSeq(st), who, got, (unsigned long long)h.inlined,
                    (unsigned long long)bytes);
  ch->chunk = (size_t)h.chunk;
  chanSetData(ch, bytes, h.inlined, p->recvSegs, p->nRecvSeg, x->unitBytes);
  p->hdrKnown = 1;
  st->placeDirty = 1;
  /* The sender's half of the capacity check: the peer advertised what it can hold. */
  uint64_t sending = sumSegs(p->sendSegs, p->nSendSeg);
  if (h.capacity != DYN_NO_CAPACITY && sending > h.capacity && st->capPeer < 0) {
    st->capPeer = peer;
    st->capSince = nowSec();
    snprintf(st->capWhy, sizeof(st->capWhy),
             "%s #%llu: rank %d sends %llu %s to %s, which can receive at most %llu from each peer (its %s)",
             opName(st), opSeq(st), st->me, (unsigned long long)sending, x->unitName, who,
             (unsigned long long)h.capacity, x->capName ? x->capName : "capacity");
  }
  return ncclxSuccess;
}

/* Fail once our message 0 (with the counts) reached the peer that cannot take them, or
 * after a second. No abort notice: the receiver detects the same count and sends it. */
ncclxResult_t capFailReady(dynState* st) {
  if (st->capPeer < 0) return ncclxSuccess;
  if (st->send[st->capPeer].msgsDone == 0 && nowSec() - st->capSince < 1.0) return ncclxSuccess;
  return moeCore->failQuiet(st->comm, ncclxInvalidUsage, "%s", st->capWhy);
}

void selfCopy(dynState* st) {
  const dynPeer* p = &st->x->peers[st->me];
  for (int i = 0; i < p->nRecvSeg; i++) {
    size_t bytes = (size_t)p->recvSegs[i] * st->x->unitBytes;
    if (bytes && p->recvDst[i] != p->sendPtr[i]) memmove(p->recvDst[i], p->sendPtr[i], bytes);
  }
}

/* Ask place() about every peer whose header is known; then deliver message 0's inline data
 * and choose how the rest arrives. */
ncclxResult_t placePass(dynState* st, int* progress) {
  dynExchange* x = st->x;
  for (int peer = 0; peer < st->n; peer++) {
    dynPeer* p = &x->peers[peer];
    if (!p->hdrKnown || p->placed) continue;
    int placed = 0;
    x->why[0] = '\0';
    ncclxResult_t res = x->place(x, peer, &placed);
    if (res != ncclxSuccess)
      return moeCore->fail(st->comm, res, "%s #%llu: %s", opName(st), opSeq(st), x->why);
    if (!placed) continue;
    p->placed = 1;
    *progress = 1;
    if (peer == st->me) {
      selfCopy(st);
      continue;
    }
    dynChan* ch = &st->recv[peer];
    if (ch->inlined)
      segCopy(p->recvDst, p->recvSegs, p->nRecvSeg, x->unitBytes, 0, ch->inlined,
              ch->msg0 + hdrSize(p->nRecvSeg), 1);
    ch->direct = contiguousBase(p->recvDst, p->recvSegs, p->nRecvSeg, x->unitBytes);
    if (!ch->direct && !ch->segmented && ch->msgsTotal > 1 && !x->scatteredRecv)
      return moeCore->fail(st->comm, ncclxInternalError, "%s #%llu: segments from rank %d are not adjacent",
                      opName(st), opSeq(st), peer);
  }
  return ncclxSuccess;
}
