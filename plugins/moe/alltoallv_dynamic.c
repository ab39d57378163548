/* The exchange engine shared by ncclxAllToAllvDynamic, its compact variant and the MoE
 * helpers (see alltoallv_dynamic.h for the protocol).
 *
 * The counts are read when the operation executes on its stream, so the engine cannot use
 * the core's steps (which need every size up front, and one message per transfer): it posts
 * single messages (the core's msgSend/msgRecv/msgTest) and waits by the progress engine's
 * rules (spinPolls, waitPeers, waitCheck: abort notices, wait notes, the timeout). */
#include "alltoallv_dynamic_engine.h"

#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void dynStaging(int nranks, size_t* inlineMax, size_t* chunkMax) {
  size_t share = DYN_BUDGET / (size_t)(nranks > 0 ? nranks : 1);
  *inlineMax = clampSize(share, DYN_INLINE_MIN, DYN_INLINE_MAX);
  *chunkMax = clampSize(share, DYN_CHUNK_MIN, DYN_CHUNK_MAX);
}

/* ---------------- segments as one stream ---------------- */

/* Copy stream bytes [off, off + len) of the segments to or from buf. */
void segCopy(char* const* ptrs, const uint64_t* segs, int nseg, size_t unit, uint64_t off, size_t len,
                    char* buf, int toSegs) {
  for (int i = 0; i < nseg && len; i++) {
    uint64_t bytes = segs[i] * unit;
    if (off >= bytes) {
      off -= bytes;
      continue;
    }
    size_t n = bytes - off < len ? (size_t)(bytes - off) : len;
    if (toSegs) memcpy(ptrs[i] + off, buf, n);
    else memcpy(buf, ptrs[i] + off, n);
    buf += n;
    len -= n;
    off = 0;
  }
}

/* The start of the stream when the non-empty segments are back to back in memory. */
char* contiguousBase(char* const* ptrs, const uint64_t* segs, int nseg, size_t unit) {
  char *base = NULL, *end = NULL;
  for (int i = 0; i < nseg; i++) {
    if (!segs[i]) continue;
    if (base && ptrs[i] != end) return NULL;
    if (!base) base = ptrs[i];
    end = ptrs[i] + segs[i] * unit;
  }
  return base;
}

/* After message 0: the number of chunks still to move, and how they are cut. */
void chanSetData(dynChan* ch, uint64_t total, uint64_t inlined, const uint64_t* segs, int nseg,
                        size_t unit) {
  ch->total = total;
  ch->inlined = inlined;
  ch->posted = ch->done = inlined;
  uint64_t rest = total - inlined;
  ch->msgsTotal = 1 + (rest ? (size_t)((rest + ch->chunk - 1) / ch->chunk) : 0);
  int nonEmpty = 0;
  for (int i = 0; i < nseg; i++) nonEmpty += segs[i] != 0;
  ch->segmented = inlined == 0 && nonEmpty > 1 && total >= DYN_SEGMENTED_MIN &&
                  total / (uint64_t)nonEmpty >= DYN_SEGMENT_MEAN_MIN;
  ch->curSeg = 0;
  ch->segOff = 0;
  if (!ch->segmented) return;
  ch->msgsTotal = 1;
  for (int i = 0; i < nseg; i++) ch->msgsTotal += (size_t)((segs[i] * unit + ch->chunk - 1) / ch->chunk);
}

static int chanComplete(const dynState* st, int peer, int isSend) {
  const dynChan* ch = isSend ? &st->send[peer] : &st->recv[peer];
  if (!isSend && !st->x->peers[peer].placed) return 0;
  return ch->msgsDone == ch->msgsTotal;
}

/* ---------------- failures ---------------- */

/* A transport refused a message or failed a request. Prefer our own pending capacity
 * failure, then (in the core) an abort notice from the rank that failed first, then blaming
 * the peer. */
static ncclxResult_t linkFailed(dynState* st, int peer, int isSend, const char* how) {
  const dynChan* ch = isSend ? &st->send[peer] : &st->recv[peer];
  char who[128];
  if (st->capPeer >= 0) return moeCore->failQuiet(st->comm, ncclxInvalidUsage, "%s", st->capWhy);
  return moeCore->linkFailed(st->comm,
                             "%s during %s #%llu: %s %s (%s %llu of %llu data bytes; it exited, failed, or sent "
                             "something this rank did not expect)",
                             how, opName(st), opSeq(st), isSend ? "sending to" : "receiving from",
                             moeCore->describeRank(st->comm, peer, who, sizeof(who)), isSend ? "sent" : "received",
                             (unsigned long long)ch->done, (unsigned long long)ch->total);
}

/* ---------------- progress ---------------- */

static ncclxResult_t chanPost(dynState* st, int peer, int isSend, int* progress) {
  dynChan* ch = isSend ? &st->send[peer] : &st->recv[peer];
  dynPeer* p = &st->x->peers[peer];
  for (;;) {
    if (ch->msgsPosted >= ch->msgsTotal) return ncclxSuccess;
    int staged = ch->msgsPosted > 0 && !ch->direct && !ch->segmented;
    if (ch->inflight >= (staged ? 2 : DYN_INFLIGHT)) return ncclxSuccess;
    if (isSend && peer == st->capPeer && ch->msgsPosted > 0) return ncclxSuccess; /* header only */
    char* ptr;
    size_t len;
    uint64_t off = ch->posted;
    if (ch->msgsPosted == 0) {
      ptr = ch->msg0;
      len = ch->msg0Bytes;
    } else if (ch->segmented) {
      const uint64_t* segs = isSend ? p->sendSegs : p->recvSegs;
      char* const* ptrs = isSend ? (char* const*)p->sendPtr : p->recvDst;
      int nseg = isSend ? p->nSendSeg : p->nRecvSeg;
      size_t unit = st->x->unitBytes;
      while (ch->curSeg < nseg && ch->segOff >= segs[ch->curSeg] * unit) ch->curSeg++, ch->segOff = 0;
      if (ch->curSeg >= nseg) return ncclxSuccess; /* cannot happen: msgsTotal counts the pieces */
      uint64_t left = segs[ch->curSeg] * unit - ch->segOff;
      len = left < ch->chunk ? (size_t)left : ch->chunk;
      ptr = ptrs[ch->curSeg] + ch->segOff;
    } else {
      len = ch->total - off < ch->chunk ? (size_t)(ch->total - off) : ch->chunk;
      if (ch->direct) {
        ptr = ch->direct + off;
      } else {
        /* Staged messages complete in order, so message k uses slot k % 2. */
        ptr = ch->slots + (ch->msgsPosted % 2) * ch->chunk;
        if (isSend)
          segCopy((char* const*)p->sendPtr, p->sendSegs, p->nSendSeg, st->x->unitBytes, off, len, ptr, 0);
      }
    }
    void* req = NULL;
    ncclxResult_t res = isSend ? moeCore->msgSend(st->comm, peer, ptr, len, &req)
                               : moeCore->msgRecv(st->comm, peer, ptr, len, &req);
    if (res != ncclxSuccess) return linkFailed(st, peer, isSend, moeCore->lastError());
    if (!req) return ncclxSuccess; /* transport busy: the same message again later */
    int slot = (ch->head + ch->inflight) % DYN_INFLIGHT;
    ch->reqs[slot] = req;
    ch->reqBytes[slot] = len;
    ch->reqOff[slot] = off;
    ch->inflight++;
    if (ch->msgsPosted++ > 0) ch->posted += len;
    if (ch->segmented && ch->msgsPosted > 1) ch->segOff += len;
    *progress = 1;
  }
}

static ncclxResult_t chanTest(dynState* st, int peer, int isSend, int* progress) {
  dynChan* ch = isSend ? &st->send[peer] : &st->recv[peer];
  dynPeer* p = &st->x->peers[peer];
  while (ch->inflight > 0) {
    int slot = ch->head, done = 0;
    size_t got = 0;
    if (moeCore->msgTest(st->comm, peer, ch->reqs[slot], &done, &got) != ncclxSuccess) {
      ch->inflight = 0; /* the transport freed the failed request */
      return linkFailed(st, peer, isSend, moeCore->lastError());
    }
    if (!done) return ncclxSuccess;
    ch->head = (ch->head + 1) % DYN_INFLIGHT;
    ch->inflight--;
    size_t msg = ch->msgsDone++;
    *progress = 1;
    if (msg == 0) {
      if (!isSend) NCCLX_CHECK(parseHeader(st, peer, got));
      continue;
    }
    if (!isSend && got != ch->reqBytes[slot]) {
      char who[128];
      return moeCore->fail(
          st->comm, ncclxInvalidUsage,
          "%s #%llu: %s sent a %zu-byte message where %zu bytes were expected (calls differ between "
          "ranks?)",
          opName(st), opSeq(st), moeCore->describeRank(st->comm, peer, who, sizeof(who)), got, ch->reqBytes[slot]);
    }
    if (!isSend && !ch->direct && !ch->segmented)
      segCopy(p->recvDst, p->recvSegs, p->nRecvSeg, st->x->unitBytes, ch->reqOff[slot], ch->reqBytes[slot],
              ch->slots + (msg % 2) * ch->chunk, 1);
    ch->done += ch->reqBytes[slot];
  }
  return ncclxSuccess;
}

/* Nothing moved for a while: sleep until a connection or the bootstrap has news. */
static void idleSleep(dynState* st) {
  int peers[64], isSend[64], n = 0;
  for (int peer = 0; peer < st->n && n < 63; peer++) {
    if (peer == st->me) continue;
    for (int dir = 0; dir < 2 && n < 63; dir++)
      if (!chanComplete(st, peer, dir)) peers[n] = peer, isSend[n++] = dir;
  }
  moeCore->waitPeers(st->comm, peers, isSend, n);
}

static ncclxResult_t checkStuck(dynState* st, double lastProgress) {
  int awaited[8], nAwaited = 0;
  for (int peer = 0; peer < st->n && nAwaited < 8; peer++)
    if (peer != st->me && (!chanComplete(st, peer, 0) || !chanComplete(st, peer, 1))) awaited[nAwaited++] = peer;
  double waited = nowSec() - lastProgress, timeout = st->call->info.timeoutSec;
  /* What we wait for, said only by the timeout. */
  char list[1024] = "", who[128];
  size_t len = 0;
  for (int peer = 0; timeout > 0 && waited > timeout && peer < st->n && len < sizeof(list) - 400; peer++) {
    if (peer == st->me) continue;
    for (int isSend = 0; isSend < 2 && len < sizeof(list) - 200; isSend++) {
      if (chanComplete(st, peer, isSend)) continue;
      const dynChan* ch = isSend ? &st->send[peer] : &st->recv[peer];
      len += (size_t)snprintf(list + len, sizeof(list) - len, " %s %s (%s);",
                              isSend ? "sending to" : "receiving from",
                              moeCore->describeRank(st->comm, peer, who, sizeof(who)),
                              ch->msgsDone == 0 ? "first message" : "data");
    }
  }
  return moeCore->waitCheck(st->comm, awaited, nAwaited, waited, list);
}

/* ---------------- setup and the loop ---------------- */

/* Message 0 lands at the start of the receive area; when place() may scatter a peer's
 * segments, the same area then serves as the two staging slots. */
static size_t recvAreaBytes(const dynState* st, const dynChan* r) {
  size_t slots = st->x->scatteredRecv ? 2 * st->chunk : 0;
  return r->msg0Bytes > slots ? r->msg0Bytes : slots;
}

static ncclxResult_t setupChannels(dynState* st) {
  ncclxComm_t comm = st->comm;
  dynExchange* x = st->x;
  int n = st->n;
  size_t total = 0;
  for (int peer = 0; peer < n; peer++) {
    if (peer == st->me) continue;
    const dynPeer* p = &x->peers[peer];
    dynChan* s = &st->send[peer];
    dynChan* r = &st->recv[peer];
    s->chunk = st->chunk;
    uint64_t bytes = sumSegs(p->sendSegs, p->nSendSeg) * x->unitBytes;
    if (p->noSend && bytes)
      return moeCore->fail(comm, ncclxInternalError, "%s #%llu: %llu bytes for rank %d, which expects none",
                      opName(st), opSeq(st), (unsigned long long)bytes, peer);
    chanSetData(s, bytes, bytes <= st->inlineMax ? bytes : 0, p->sendSegs, p->nSendSeg, x->unitBytes);
    s->msg0Bytes = bytes ? hdrSize(p->nSendSeg) + (size_t)s->inlined : sizeof(dynEmptyHeader);
    s->direct = contiguousBase((char* const*)p->sendPtr, p->sendSegs, p->nSendSeg, x->unitBytes);
    r->msgsTotal = 1; /* the rest once the header is known */
    r->msg0Bytes = hdrSize(p->nRecvSeg) + st->inlineMax;
    if (p->noSend) s->msgsTotal = 0, s->msg0Bytes = 0;
    if (p->noRecv) r->msgsTotal = 0, r->msg0Bytes = 0;
    size_t recvArea = recvAreaBytes(st, r);
    int sendStaged = !s->direct && !s->segmented && s->msgsTotal > 1;
    total += alignUp(s->msg0Bytes) + (sendStaged ? 2 * st->chunk : 0) + alignUp(recvArea);
  }
  /* Staging lives in the comm's scratch: after a failure the transport may still hold
   * requests on it, and the comm (unlike this call's stack) outlives that. Pages that
   * small messages never reach are never touched. */
  char* buf = NULL;
  if (total) NCCLX_CHECK(moeCore->scratch(comm, total, (void**)&buf));
  for (int peer = 0; peer < n; peer++) {
    if (peer == st->me) continue;
    dynChan* s = &st->send[peer];
    dynChan* r = &st->recv[peer];
    const dynPeer* p = &x->peers[peer];
    s->msg0 = buf;
    buf += alignUp(s->msg0Bytes);
    if (!s->direct && !s->segmented && s->msgsTotal > 1) {
      s->slots = buf;
      buf += 2 * st->chunk;
    }
    r->msg0 = r->slots = buf;
    buf += alignUp(recvAreaBytes(st, r));
    if (p->noSend) continue;
    if (s->total == 0) {
      dynEmptyHeader e = {.magic = DYN_MAGIC_EMPTY,
                          .nseg = (uint32_t)p->nSendSeg,
                          .unitBytes = x->unitBytes,
                          .seq = st->call->seq,
                          .capacity = x->capacity};
      memcpy(s->msg0, &e, sizeof(e));
      continue;
    }
    dynHeader h = {.magic = DYN_MAGIC,
                   .nseg = (uint32_t)p->nSendSeg,
                   .unitBytes = x->unitBytes,
                   .seq = st->call->seq,
                   .capacity = x->capacity,
                   .chunk = st->chunk,
                   .inlined = s->inlined};
    memcpy(s->msg0, &h, sizeof(h));
    memcpy(s->msg0 + sizeof(h), p->sendSegs, 8 * (size_t)p->nSendSeg);
    segCopy((char* const*)p->sendPtr, p->sendSegs, p->nSendSeg, x->unitBytes, 0, (size_t)s->inlined,
            s->msg0 + hdrSize(p->nSendSeg), 0);
  }
  return ncclxSuccess;
}

/* Connections to every peer a message goes to or comes from (set up on first use). */
static ncclxResult_t connectPeers(dynState* st) {
  int n = st->n, ns = 0, nr = 0;
  if (n <= 1) return ncclxSuccess;
  int* peers = malloc(2 * sizeof(int) * (size_t)n);
  if (!peers) return moeCore->fail(st->comm, ncclxSystemError, "%s: out of memory", opName(st));
  int *to = peers, *from = peers + n;
  for (int i = 1; i < n; i++) {
    int peer = (st->me + i) % n;
    if (!st->x->peers[peer].noSend) to[ns++] = peer;
    if (!st->x->peers[peer].noRecv) from[nr++] = peer;
  }
  ncclxResult_t res = moeCore->connect(st->comm, to, ns, from, nr);
  free(peers);
  return res;
}

/* Waiting follows the progress engine's rule (spinPolls: poll before yielding, but yield
 * almost at once when this host has more ranks than CPUs). Other load on the machine has the
 * same effect unseen, so the budget adapts per thread: a wait that outlasts the spin halves
 * it, one that ends within it grows it back. Sleep (waitPeers) only after DYN_YIELDS yields
 * and DYN_YIELD_SEC: the shared-memory transport arms its doorbell after ~50 us of idle
 * test() calls, and a sleep before that lasts the whole poll timeout. */
#define DYN_SPIN_MIN 4u /* the core's budget on an oversubscribed host */
#define DYN_YIELDS 200u
#define DYN_YIELD_SEC 200e-6
static __thread unsigned spinBudget;

static unsigned spinPolls(ncclxComm_t comm) {
  unsigned limit = moeCore->spinPolls(comm);
  if (spinBudget == 0 || spinBudget > limit) spinBudget = limit;
  return spinBudget;
}

static void spinLearn(ncclxComm_t comm, int waitedPastSpin) {
  unsigned limit = moeCore->spinPolls(comm);
  if (waitedPastSpin)
    spinBudget = spinBudget / 2 > DYN_SPIN_MIN ? spinBudget / 2 : DYN_SPIN_MIN;
  else
    spinBudget = spinBudget + spinBudget / 4 + 1 < limit ? spinBudget + spinBudget / 4 + 1 : limit;
}

static ncclxResult_t progressLoop(dynState* st) {
  int n = st->n;
  double lastProgress = nowSec();
  unsigned idle = 0, spins = spinPolls(st->comm);
  for (;;) {
    int progress = 0, pending = 0;
    if (st->placeDirty) {
      st->placeDirty = 0;
      NCCLX_CHECK(placePass(st, &progress));
    }
    for (int k = 1; k < n; k++) {
      /* Staggered: rank r starts with r+1 (sends) and r-1 (receives). Sends first, so every
       * header leaves before anything received can stop this rank. */
      int to = (st->me + k) % n, from = (st->me - k + n) % n;
      if (!chanComplete(st, to, 1)) {
        NCCLX_CHECK(chanPost(st, to, 1, &progress));
        NCCLX_CHECK(chanTest(st, to, 1, &progress));
        pending |= !chanComplete(st, to, 1);
      }
      if (!chanComplete(st, from, 0)) {
        /* Data receives wait for placement (their destination). */
        if (st->recv[from].msgsPosted == 0 || st->x->peers[from].placed)
          NCCLX_CHECK(chanPost(st, from, 0, &progress));
        NCCLX_CHECK(chanTest(st, from, 0, &progress));
        pending |= !chanComplete(st, from, 0);
      }
    }
    NCCLX_CHECK(capFailReady(st));
    pending |= !st->x->peers[st->me].placed || st->placeDirty || st->capPeer >= 0;
    if (!pending) return ncclxSuccess;
    if (progress) {
      if (idle) {
        spinLearn(st->comm, idle >= spins);
        spins = spinPolls(st->comm);
      }
      idle = 0;
      continue;
    }
    /* Spin briefly (lowest latency when cores are free), then yield, then sleep in poll(). */
    if (++idle < spins) continue;
    if (idle == spins) lastProgress = nowSec();
    if (idle < spins + DYN_YIELDS || nowSec() - lastProgress < DYN_YIELD_SEC) {
      sched_yield();
      continue;
    }
    idleSleep(st);
    NCCLX_CHECK(checkStuck(st, lastProgress));
  }
}

ncclxResult_t dynExchangeRun(dynExchange* x) {
  const dynCall* call = x->call;
  ncclxComm_t comm = call->comm;
  const ncclxModuleCommInfo_v1_t* info = &call->info;
  dynState st = {.x = x, .call = call, .comm = comm, .n = info->nranks, .me = info->rank, .capPeer = -1};
  size_t chunkMax;
  dynStaging(st.n, &st.inlineMax, &chunkMax);
  st.chunk = info->chunkBytes && info->chunkBytes < chunkMax ? info->chunkBytes : chunkMax;
  if (call->maxMessageBytes && st.chunk > call->maxMessageBytes) st.chunk = call->maxMessageBytes;
  dynPeer* self = &x->peers[st.me];
  if (self->nSendSeg != self->nRecvSeg)
    return moeCore->fail(comm, ncclxInternalError, "%s #%llu: %d segments to self but %d expected", opName(&st),
                    opSeq(&st), self->nSendSeg, self->nRecvSeg);
  for (int peer = 0; peer < st.n; peer++) x->peers[peer].hdrKnown = x->peers[peer].placed = 0;
  size_t nchan = st.n > 0 ? (size_t)st.n : 1;
  st.send = calloc(2 * nchan, sizeof(dynChan));
  st.recv = st.send ? st.send + nchan : NULL;
  ncclxResult_t res = ncclxSuccess;
  if (!st.send)
    res = moeCore->fail(comm, ncclxSystemError, "%s #%llu: out of memory for %d peers", opName(&st), opSeq(&st),
                   st.n);
  if (res == ncclxSuccess) res = setupChannels(&st);
  if (res == ncclxSuccess) {
    /* Our own "header" is known at once, and so are the empty ones nobody sends. */
    memcpy(self->recvSegs, self->sendSegs, 8 * (size_t)self->nSendSeg);
    self->hdrKnown = 1;
    for (int peer = 0; peer < st.n; peer++) {
      dynPeer* p = &x->peers[peer];
      if (peer == st.me || !p->noRecv) continue;
      memset(p->recvSegs, 0, 8 * (size_t)p->nRecvSeg);
      p->hdrKnown = 1;
    }
    st.placeDirty = 1;
    res = connectPeers(&st);
  }
  if (res == ncclxSuccess) res = progressLoop(&st);
  free(st.send);
  return res;
}
