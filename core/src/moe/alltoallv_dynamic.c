/* ncclxAllToAllvDynamic and its compact variant, and the exchange engine they share with
 * the MoE helpers (see alltoallv_dynamic.h for the protocol).
 *
 * The counts are read when the operation executes on its stream, so the engine cannot use
 * xferRun (which needs every size up front, and one message per transfer): it drives the
 * transports itself with the same rules as xfer.c (order per connection, spin/yield/poll
 * waiting, abort flag, abort notices, timeout, commFail naming the peer). */
#include "moe/alltoallv_dynamic.h"

#include <poll.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "coll/coll.h"
#include "util/debug.h"
#include "gpu/gpu.h"
#include "sched/xfer.h"
#include "ncclx/moe.h"
#include "transport/peers.h"
#include "prof/prof.h"
#include "sched/stream.h"
#include "sched/waitnote.h"

#define API __attribute__((visibility("default")))

#define DYN_MAGIC 0x6e786479u /* "nxdy" */
#define DYN_INFLIGHT 4        /* messages in flight per peer and direction (2 when staged) */
/* Per peer and direction: data up to the inline size rides in message 0 with the header;
 * larger data follows in chunks. The inline limit keeps message 0 within one slot of the
 * shared-memory transport (measured with 16 KiB slots; the default is 64 KiB now, where 12 KiB
 * has not been re-measured): above that, the two staging copies cost
 * more than the message they save (measured). Where every rank has a CPU and CMA is fast, a
 * message 0 of SHM_COLL_CMA_MIN or more is read by process_vm_readv instead of copied through
 * a slot (moe-bench, 2 ranks, 8 / 64 / 256 tokens, two runs: 55-58 / 478-482 / 2314-2358 us
 * before, 52-55 / 473-483 / 2273-2282 after). Both sizes shrink as ranks grow so that the
 * staging of a whole communicator stays bounded (see dynStaging). */
#define DYN_INLINE_MAX ((size_t)12 << 10)
#define DYN_INLINE_MIN ((size_t)4 << 10)
#define DYN_CHUNK_MAX ((size_t)192 << 10)
#define DYN_CHUNK_MIN ((size_t)16 << 10)
#define DYN_BUDGET ((size_t)4 << 20) /* chunk and inline sizes * nranks, until the minimums */
/* From this many bytes to a peer in several segments (data that is not inline), messages
 * are cut at segment boundaries too, so each lands straight in its segment: no staging
 * copy, 4 in flight instead of 2. Measured against one staged stream in the same runs
 * (moe-bench, 4 and 8 ranks, 4..128 tokens): mostly faster, by up to a third, from 16 KiB
 * on. But only when the segments are large enough on average: every message costs a
 * handshake with the receiver, and many small ones cost more than the staging copy (2
 * ranks, 16 tokens of 8 KiB, 8 experts per rank, ~16 KiB segments: a dispatch took twice
 * as long cut as staged). Both sides decide from the counts alone. */
#define DYN_SEGMENTED_MIN ((size_t)16 << 10)
#define DYN_SEGMENT_MEAN_MIN ((size_t)32 << 10)

typedef struct {
  uint32_t magic;
  uint32_t nseg;
  uint64_t unitBytes;
  uint64_t seq;      /* the sender's collective sequence number */
  uint64_t capacity; /* units the sender can receive from each peer, or DYN_NO_CAPACITY */
  uint64_t chunk;    /* size of the messages after message 0 */
  uint64_t inlined;  /* data bytes in message 0: 0, or all of them */
  /* then nseg uint64_t counts, then the inline data */
} dynHeader;
_Static_assert(sizeof(dynHeader) == 48, "dynamic header layout");

/* Message 0 when every count to the peer is zero: no chunk size or inline data to describe,
 * so it fits the 32 bytes that the shared-memory transport carries in the slot's flag line
 * (no payload copy), and other transports move less. At decode sizes most pairs of ranks
 * exchange nothing but this. */
#define DYN_MAGIC_EMPTY 0x6e786465u /* "nxde" */
typedef struct {
  uint32_t magic;
  uint32_t nseg;
  uint64_t unitBytes;
  uint64_t seq;
  uint64_t capacity;
} dynEmptyHeader;
_Static_assert(sizeof(dynEmptyHeader) == 32, "empty dynamic header layout");

/* One direction of one peer: message 0, then the data as one stream cut in chunks. A side
 * whose segments are contiguous in memory moves chunks in place (zero copy); otherwise
 * chunks go through two staging slots (gather before sending, scatter after receiving).
 * Large data in several segments is cut at segment boundaries too (segmented): every
 * message then has one segment as source and destination, and nothing is staged. */
typedef struct {
  void* reqs[DYN_INFLIGHT];
  size_t reqBytes[DYN_INFLIGHT];
  uint64_t reqOff[DYN_INFLIGHT]; /* stream offset of each data message in flight */
  int head, inflight;
  size_t msgsTotal, msgsPosted, msgsDone;
  uint64_t total;  /* data bytes */
  uint64_t posted; /* data bytes covered by posted messages (message 0's inline data too) */
  uint64_t done;   /* data bytes delivered */
  size_t chunk;
  char* direct;     /* contiguous data, or NULL: staged */
  char* msg0;       /* header (+ inline data) */
  size_t msg0Bytes; /* send: exact; receive: what is posted */
  char* slots;      /* staged: 2 * chunk bytes */
  uint64_t inlined;
  int segmented;    /* messages cut at segment boundaries (see DYN_SEGMENTED_MIN) */
  int curSeg;       /* segmented: segment and offset of the next message */
  uint64_t segOff;
} dynChan;

typedef struct {
  dynExchange* x;
  struct ncclxComm* comm;
  int n, me;
  size_t chunk, inlineMax;
  dynChan* send;
  dynChan* recv;
  int placeDirty;
  /* The sender's half of a capacity failure waits until our header reached that peer, so
   * the peer reports it first-hand (and sends the only abort notice). */
  int capPeer; /* -1: none */
  double capSince;
  char capWhy[512];
} dynState;

static double nowSec(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static const char* opName(const struct ncclxComm* comm) {
  return comm->curOpName ? comm->curOpName : "alltoallv_dynamic";
}

static unsigned long long opSeq(const struct ncclxComm* comm) { return (unsigned long long)comm->curOpSeq; }

static size_t hdrSize(int nseg) { return sizeof(dynHeader) + 8 * (size_t)nseg; }

static size_t alignUp(size_t v) { return (v + 63) & ~(size_t)63; }

static uint64_t sumSegs(const uint64_t* segs, int n) {
  uint64_t s = 0;
  for (int i = 0; i < n; i++) s += segs[i];
  return s;
}

static size_t clampSize(size_t v, size_t lo, size_t hi) { return v < lo ? lo : v > hi ? hi : v; }

void dynStaging(int nranks, size_t* inlineMax, size_t* chunkMax) {
  size_t share = DYN_BUDGET / (size_t)(nranks > 0 ? nranks : 1);
  *inlineMax = clampSize(share, DYN_INLINE_MIN, DYN_INLINE_MAX);
  *chunkMax = clampSize(share, DYN_CHUNK_MIN, DYN_CHUNK_MAX);
}

/* ---------------- segments as one stream ---------------- */

/* Copy stream bytes [off, off + len) of the segments to or from buf. */
static void segCopy(char* const* ptrs, const uint64_t* segs, int nseg, size_t unit, uint64_t off, size_t len,
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
static char* contiguousBase(char* const* ptrs, const uint64_t* segs, int nseg, size_t unit) {
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
static void chanSetData(dynChan* ch, uint64_t total, uint64_t inlined, const uint64_t* segs, int nseg,
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

/* Wait up to 300 ms for an abort notice: the peer whose link broke is often only the
 * messenger of another rank's failure. */
static int awaitNotice(struct ncclxComm* comm, char* notice, size_t size) {
  double deadline = nowSec() + 0.3;
  do {
    if (bootstrapPollAbort(comm->bootstrap, notice, size)) return 1;
    usleep(5000);
  } while (nowSec() < deadline);
  return 0;
}

/* A transport refused a message or failed a request. Prefer, in order: our own pending
 * capacity failure, an abort notice from the rank that failed first, then blaming the peer. */
static ncclxResult_t linkFailed(dynState* st, int peer, int isSend, const char* how) {
  struct ncclxComm* comm = st->comm;
  const dynChan* ch = isSend ? &st->send[peer] : &st->recv[peer];
  char notice[1024], who[128];
  if (st->capPeer >= 0) return commSetError(comm, ncclxInvalidUsage, "%s", st->capWhy);
  if (awaitNotice(comm, notice, sizeof(notice))) return commSetError(comm, ncclxRemoteError, "%s", notice);
  return commFail(comm, ncclxRemoteError,
                  "%s during %s #%llu: %s %s (%s %llu of %llu data bytes; it exited, failed, or sent "
                  "something this rank did not expect)",
                  how, opName(comm), opSeq(comm), isSend ? "sending to" : "receiving from",
                  commDescribeRank(comm, peer, who, sizeof(who)), isSend ? "sent" : "received",
                  (unsigned long long)ch->done, (unsigned long long)ch->total);
}

/* ---------------- message 0 ---------------- */

static ncclxResult_t parseHeader(dynState* st, int peer, size_t got) {
  struct ncclxComm* comm = st->comm;
  dynExchange* x = st->x;
  dynPeer* p = &x->peers[peer];
  dynChan* ch = &st->recv[peer];
  char who[128];
  commDescribeRank(comm, peer, who, sizeof(who));
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
    return commFail(comm, ncclxInvalidUsage,
                    "%s #%llu: %s sent a %zu-byte message that does not start with a dynamic all-to-all "
                    "header (is it running a different collective? calls differ between ranks?)",
                    opName(comm), opSeq(comm), who, got);
  if (h.seq != comm->curOpSeq)
    return commFail(comm, ncclxInvalidUsage,
                    "%s #%llu: %s is at collective #%llu (calls differ between ranks?)", opName(comm),
                    opSeq(comm), who, (unsigned long long)h.seq);
  if (h.unitBytes != x->unitBytes)
    return commFail(comm, ncclxInvalidUsage,
                    "%s #%llu: %s counts in %llu-byte %s, this rank in %zu-byte ones "
                    "(datatype or row size differs between ranks?)",
                    opName(comm), opSeq(comm), who, (unsigned long long)h.unitBytes, x->unitName, x->unitBytes);
  if (h.nseg != (uint32_t)p->nRecvSeg || got < hdrSize((int)h.nseg))
    return commFail(comm, ncclxInvalidUsage,
                    "%s #%llu: %s sends %u segments, this rank expects %d (arguments such as the number of "
                    "experts differ between ranks?)",
                    opName(comm), opSeq(comm), who, h.nseg, p->nRecvSeg);
  if (h.chunk == 0 || h.chunk > st->chunk)
    return commFail(comm, ncclxInvalidUsage, "%s #%llu: %s uses %llu-byte messages, this rank at most %zu",
                    opName(comm), opSeq(comm), who, (unsigned long long)h.chunk, st->chunk);
  memcpy(p->recvSegs, ch->msg0 + sizeof(h), 8 * (size_t)p->nRecvSeg);
  uint64_t total = 0, limit = (SIZE_MAX / 2) / x->unitBytes;
  for (int i = 0; i < p->nRecvSeg; i++) {
    if (p->recvSegs[i] > limit - total)
      return commFail(comm, ncclxInvalidUsage, "%s #%llu: %s announces more %s than fit in memory",
                      opName(comm), opSeq(comm), who, x->unitName);
    total += p->recvSegs[i];
  }
  uint64_t bytes = total * x->unitBytes;
  if ((h.inlined != 0 && h.inlined != bytes) || h.inlined > st->inlineMax ||
      got != hdrSize(p->nRecvSeg) + h.inlined)
    return commFail(comm, ncclxInvalidUsage,
                    "%s #%llu: %s sent a %zu-byte first message with %llu of its %llu bytes (calls differ "
                    "between ranks?)",
                    opName(comm), opSeq(comm), who, got, (unsigned long long)h.inlined,
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
             opName(comm), opSeq(comm), comm->rank, (unsigned long long)sending, x->unitName, who,
             (unsigned long long)h.capacity, x->capName ? x->capName : "capacity");
  }
  return ncclxSuccess;
}

/* Fail once our message 0 (with the counts) reached the peer that cannot take them, or
 * after a second. No abort notice: the receiver detects the same count and sends it. */
static ncclxResult_t capFailReady(dynState* st) {
  if (st->capPeer < 0) return ncclxSuccess;
  if (st->send[st->capPeer].msgsDone == 0 && nowSec() - st->capSince < 1.0) return ncclxSuccess;
  return commSetError(st->comm, ncclxInvalidUsage, "%s", st->capWhy);
}

static void selfCopy(dynState* st) {
  const dynPeer* p = &st->x->peers[st->me];
  for (int i = 0; i < p->nRecvSeg; i++) {
    size_t bytes = (size_t)p->recvSegs[i] * st->x->unitBytes;
    if (bytes && p->recvDst[i] != p->sendPtr[i]) memmove(p->recvDst[i], p->sendPtr[i], bytes);
  }
}

/* Ask place() about every peer whose header is known; then deliver message 0's inline data
 * and choose how the rest arrives. */
static ncclxResult_t placePass(dynState* st, int* progress) {
  dynExchange* x = st->x;
  for (int peer = 0; peer < st->n; peer++) {
    dynPeer* p = &x->peers[peer];
    if (!p->hdrKnown || p->placed) continue;
    int placed = 0;
    x->why[0] = '\0';
    ncclxResult_t res = x->place(x, peer, &placed);
    if (res != ncclxSuccess)
      return commFail(st->comm, res, "%s #%llu: %s", opName(st->comm), opSeq(st->comm), x->why);
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
      return commFail(st->comm, ncclxInternalError, "%s #%llu: segments from rank %d are not adjacent",
                      opName(st->comm), opSeq(st->comm), peer);
  }
  return ncclxSuccess;
}

/* ---------------- progress ---------------- */

static ncclxResult_t chanPost(dynState* st, int peer, int isSend, int* progress) {
  struct ncclxComm* comm = st->comm;
  dynChan* ch = isSend ? &st->send[peer] : &st->recv[peer];
  dynPeer* p = &st->x->peers[peer];
  struct ncclxPeerConn* c = &comm->conns[peer];
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
    ncclxResult_t res;
    if (isSend) {
      res = c->net->isend(c->sendComm, ptr, len, comm->rank, NULL, NULL, &req);
    } else {
      void* data = ptr;
      int tag = peer;
      res = c->net->irecv(c->recvComm, 1, &data, &len, &tag, NULL, NULL, &req);
    }
    if (res != ncclxSuccess) {
      char how[128];
      snprintf(how, sizeof(how), "network '%s' refused a %zu-byte message", c->net->name, len);
      return linkFailed(st, peer, isSend, how);
    }
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
  struct ncclxComm* comm = st->comm;
  dynChan* ch = isSend ? &st->send[peer] : &st->recv[peer];
  dynPeer* p = &st->x->peers[peer];
  const ncclxNet_t* net = comm->conns[peer].net;
  while (ch->inflight > 0) {
    int slot = ch->head, done = 0;
    size_t got = 0;
    if (net->test(ch->reqs[slot], &done, &got) != ncclxSuccess) {
      ch->inflight = 0; /* the transport freed the failed request */
      return linkFailed(st, peer, isSend, "the connection failed");
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
      return commFail(
          comm, ncclxInvalidUsage,
          "%s #%llu: %s sent a %zu-byte message where %zu bytes were expected (calls differ between "
          "ranks?)",
          opName(comm), opSeq(comm), commDescribeRank(comm, peer, who, sizeof(who)), got, ch->reqBytes[slot]);
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
  struct pollfd fds[64];
  int nfds = 0, sendsWaiting = 0;
  for (int peer = 0; peer < st->n && nfds < 63; peer++) {
    if (peer == st->me) continue;
    const struct ncclxPeerConn* c = &st->comm->conns[peer];
    for (int isSend = 0; isSend < 2 && nfds < 63; isSend++) {
      if (chanComplete(st, peer, isSend)) continue;
      int fd = isSend ? c->sendFd : c->recvFd;
      if (fd < 0) sendsWaiting |= isSend;
      else fds[nfds++] = (struct pollfd){.fd = fd, .events = POLLIN};
    }
  }
  int bfd = bootstrapPollFd(st->comm->bootstrap);
  if (bfd >= 0) fds[nfds++] = (struct pollfd){.fd = bfd, .events = POLLIN};
  if (sendsWaiting || nfds == 0) {
    usleep(50);
    return;
  }
  (void)poll(fds, (nfds_t)nfds, 2);
}

static ncclxResult_t checkStuck(dynState* st, double lastProgress) {
  struct ncclxComm* comm = st->comm;
  NCCLX_CHECK(commPollAbort(comm));
  int awaited[8], nAwaited = 0;
  for (int peer = 0; peer < st->n && nAwaited < 8; peer++)
    if (peer != st->me && (!chanComplete(st, peer, 0) || !chanComplete(st, peer, 1))) awaited[nAwaited++] = peer;
  double waited = nowSec() - lastProgress;
  NCCLX_CHECK(waitNoteCheck(comm, awaited, nAwaited, waited));
  if (comm->timeoutSec <= 0 || waited <= comm->timeoutSec) return ncclxSuccess;
  char list[1024] = "", who[128];
  size_t len = 0;
  for (int peer = 0; peer < st->n && len < sizeof(list) - 400; peer++) {
    if (peer == st->me) continue;
    for (int isSend = 0; isSend < 2 && len < sizeof(list) - 200; isSend++) {
      if (chanComplete(st, peer, isSend)) continue;
      const dynChan* ch = isSend ? &st->send[peer] : &st->recv[peer];
      len += (size_t)snprintf(
          list + len, sizeof(list) - len, " %s %s (%s);", isSend ? "sending to" : "receiving from",
          commDescribeRank(comm, peer, who, sizeof(who)), ch->msgsDone == 0 ? "first message" : "data");
    }
  }
  if (nAwaited > 0) len = waitNoteDescribe(comm, awaited[0], list, len, sizeof(list));
  return commFail(comm, ncclxRemoteError, "timeout: no progress for %.0f s during %s #%llu, waiting on:%s",
                  comm->timeoutSec, opName(comm), opSeq(comm), list);
}

/* ---------------- setup and the loop ---------------- */

/* Message 0 lands at the start of the receive area; when place() may scatter a peer's
 * segments, the same area then serves as the two staging slots. */
static size_t recvAreaBytes(const dynState* st, const dynChan* r) {
  size_t slots = st->x->scatteredRecv ? 2 * st->chunk : 0;
  return r->msg0Bytes > slots ? r->msg0Bytes : slots;
}

static ncclxResult_t setupChannels(dynState* st) {
  struct ncclxComm* comm = st->comm;
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
      return commFail(comm, ncclxInternalError, "%s #%llu: %llu bytes for rank %d, which expects none",
                      opName(comm), opSeq(comm), (unsigned long long)bytes, peer);
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
  char* buf = total ? commScratch(comm, total) : NULL;
  if (total && !buf)
    return commFail(comm, ncclxSystemError, "%s #%llu: cannot allocate %zu bytes of staging", opName(comm),
                    opSeq(comm), total);
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
                          .seq = comm->curOpSeq,
                          .capacity = x->capacity};
      memcpy(s->msg0, &e, sizeof(e));
      continue;
    }
    dynHeader h = {.magic = DYN_MAGIC,
                   .nseg = (uint32_t)p->nSendSeg,
                   .unitBytes = x->unitBytes,
                   .seq = comm->curOpSeq,
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
  if (!peers) return commFail(st->comm, ncclxSystemError, "%s: out of memory", opName(st->comm));
  int *to = peers, *from = peers + n;
  for (int i = 1; i < n; i++) {
    int peer = (st->me + i) % n;
    if (!st->x->peers[peer].noSend) to[ns++] = peer;
    if (!st->x->peers[peer].noRecv) from[nr++] = peer;
  }
  ncclxResult_t res = peersEnsure(st->comm, to, ns, from, nr);
  free(peers);
  return res;
}

/* Waiting follows the progress engine's rule (xferSpinPolls: poll before yielding, but
 * yield almost at once when this host has more ranks than CPUs). Other load on the machine
 * has the same effect unseen, so the budget adapts per thread: a wait that outlasts the spin
 * halves it, one that ends within it grows it back. Sleep in poll() only after DYN_YIELDS
 * yields and DYN_YIELD_SEC: the shared-memory transport arms its doorbell after ~50 us of
 * idle test() calls, and a sleep before that lasts the whole poll timeout. */
#define DYN_SPIN_MIN XFER_SPIN_OVERSUBSCRIBED
#define DYN_YIELDS 200u
#define DYN_YIELD_SEC 200e-6
static __thread unsigned spinBudget;

static unsigned spinLimit(const struct ncclxComm* comm) { return xferSpinPolls(comm); }

static unsigned spinPolls(const struct ncclxComm* comm) {
  unsigned limit = spinLimit(comm);
  if (spinBudget == 0 || spinBudget > limit) spinBudget = limit;
  return spinBudget;
}

static void spinLearn(const struct ncclxComm* comm, int waitedPastSpin) {
  unsigned limit = spinLimit(comm);
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
  struct ncclxComm* comm = x->comm;
  dynState st = {.x = x, .comm = comm, .n = comm->nranks, .me = comm->rank, .capPeer = -1};
  size_t chunkMax;
  dynStaging(st.n, &st.inlineMax, &chunkMax);
  st.chunk = comm->chunkBytes && comm->chunkBytes < chunkMax ? comm->chunkBytes : chunkMax;
  if (comm->maxMessageBytes && st.chunk > comm->maxMessageBytes) st.chunk = comm->maxMessageBytes;
  dynPeer* self = &x->peers[st.me];
  if (self->nSendSeg != self->nRecvSeg)
    return commFail(comm, ncclxInternalError, "%s #%llu: %d segments to self but %d expected", opName(comm),
                    opSeq(comm), self->nSendSeg, self->nRecvSeg);
  for (int peer = 0; peer < st.n; peer++) x->peers[peer].hdrKnown = x->peers[peer].placed = 0;
  size_t nchan = st.n > 0 ? (size_t)st.n : 1;
  st.send = calloc(2 * nchan, sizeof(dynChan));
  st.recv = st.send ? st.send + nchan : NULL;
  ncclxResult_t res = ncclxSuccess;
  if (!st.send)
    res = commFail(comm, ncclxSystemError, "%s #%llu: out of memory for %d peers", opName(comm), opSeq(comm),
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

/* ---------------- execution under the comm's lock ---------------- */

/* A COLL event with our own op name (profCollStart names only the core's collectives). */
static void* profDynStart(struct ncclxComm* comm, const char* name, uint64_t seq, const dynOpInfo* info) {
  if (!profEnabled(comm, NCCLX_PROFILE_COLL | NCCLX_PROFILE_STEP)) return NULL;
  ncclxProfilerEventDescr_v1_t d;
  memset(&d, 0, sizeof(d));
  d.type = NCCLX_PROFILE_COLL;
  d.rank = comm->rank;
  d.coll.seq = seq;
  d.coll.func = name;
  d.coll.sendbuff = info->sendbuff;
  d.coll.recvbuff = info->recvbuff;
  d.coll.count = info->count;
  d.coll.bytes = info->bytes;
  d.coll.root = -1;
  d.coll.datatype = ncclxTypeName(info->datatype);
  d.coll.algo = "dynamic";
  d.coll.proto = "simple";
  d.coll.stream = info->stream;
  void* handle = NULL;
  if (comm->profiler->startEvent(comm->profilerCtx, &handle, &d) != ncclxSuccess) return NULL;
  return handle;
}

ncclxResult_t dynExecOp(struct ncclxComm* comm, const char* name,
                        ncclxResult_t (*fn)(struct ncclxComm* comm, void* arg), void* arg,
                        const dynOpInfo* info) {
  ncclxLogSetRank(comm->rank);
  pthread_mutex_lock(&comm->execLock);
  ncclxResult_t res =
      atomic_load(&comm->destroyed)
          ? ncclxSetError(ncclxInvalidUsage, "%s: communicator was destroyed before the queued call ran", name)
          : commCheckHealthy(comm);
  if (res == ncclxSuccess) {
    uint64_t seq = ++comm->collSeq;
    comm->curOpName = name;
    comm->curOpSeq = seq;
    comm->curAlgo = comm->curProto = -1, comm->curPathText = NULL;
    INFO(NCCLX_LOG_COLL, "%s #%llu: %zu %s (%zu bytes) to send, comm %s nranks %d", name,
         (unsigned long long)seq, info->count, ncclxTypeName(info->datatype), info->bytes, comm->name,
         comm->nranks);
    void* ev = profDynStart(comm, name, seq, info);
    comm->curProfEvent = ev;
    res = fn(comm, arg);
    if (res != ncclxSuccess) profFailed(comm, ev, res, ncclxThreadLastError());
    profStop(comm, ev);
    comm->curProfEvent = NULL;
    comm->curOpName = NULL;
  }
  pthread_mutex_unlock(&comm->execLock);
  return res;
}

/* ---------------- groups ---------------- */

int dynInGroup(void) { return enqueueGroupDepth() > 0; }

/* Dynamic calls are not grouped: a group runs its operations at ncclxGroupEnd with every
 * size known at call time, while ours learn their sizes when they execute. Refusing keeps
 * the order of operations the one the caller wrote. */
ncclxResult_t dynCheckNotGrouped(struct ncclxComm* comm, const char* fn) {
  if (!dynInGroup()) return ncclxSuccess;
  return commArgError(comm, ncclxInvalidUsage,
                      "%s: cannot be called between ncclxGroupStart and ncclxGroupEnd (its counts are "
                      "read when it executes); call it outside the group, on the same stream",
                      fn);
}

/* ---------------- the public all-to-all ---------------- */

typedef struct {
  ncclxTask base;
  struct ncclxComm* comm;
  const char* sendbuff;
  const size_t* sendcounts;
  char* recvbuff;
  size_t maxRecv; /* per peer, or in total (compact) */
  size_t* recvcounts;
  size_t* rdispls; /* compact only */
  size_t elemBytes;
  ncclxDataType_t datatype;
  ncclxStream_t stream;
  int compact;
  int nextPeer;       /* compact: first peer not placed yet */
  uint64_t placedSum; /* compact: elements placed before nextPeer */
  /* nranks entries each */
  dynPeer* peers;
  const char** sendPtrs;
  uint64_t* sendSegs;
  uint64_t* recvSegs;
  char** recvDst;
} a2avTask;

static ncclxResult_t placePerPeer(dynExchange* x, int peer, int* placed) {
  a2avTask* t = x->ctx;
  uint64_t count = x->peers[peer].recvSegs[0];
  if (count > t->maxRecv) {
    char who[128];
    snprintf(x->why, sizeof(x->why), "%s sends %llu elements to rank %d, more than its maxRecvCount %zu",
             commDescribeRank(x->comm, peer, who, sizeof(who)), (unsigned long long)count, x->comm->rank,
             t->maxRecv);
    return ncclxInvalidUsage;
  }
  t->recvcounts[peer] = (size_t)count;
  x->peers[peer].recvDst[0] = count ? t->recvbuff + (size_t)peer * t->maxRecv * t->elemBytes : NULL;
  *placed = 1;
  return ncclxSuccess;
}

/* Blocks are packed in peer order, so a peer is placed once every lower peer's count is known. */
static ncclxResult_t placePacked(dynExchange* x, int peer, int* placed) {
  a2avTask* t = x->ctx;
  while (t->nextPeer < x->comm->nranks && x->peers[t->nextPeer].hdrKnown) {
    int q = t->nextPeer;
    uint64_t count = x->peers[q].recvSegs[0];
    if (count > t->maxRecv - t->placedSum) {
      char who[128];
      snprintf(x->why, sizeof(x->why),
               "%s sends %llu elements to rank %d, which has room for only %llu more: its maxRecvTotal "
               "is %zu and ranks before %d sent %llu",
               commDescribeRank(x->comm, q, who, sizeof(who)), (unsigned long long)count, x->comm->rank,
               (unsigned long long)(t->maxRecv - t->placedSum), t->maxRecv, q,
               (unsigned long long)t->placedSum);
      return ncclxInvalidUsage;
    }
    t->recvcounts[q] = (size_t)count;
    t->rdispls[q] = (size_t)t->placedSum;
    x->peers[q].recvDst[0] = count ? t->recvbuff + (size_t)t->placedSum * t->elemBytes : NULL;
    t->placedSum += count;
    t->nextPeer++;
  }
  *placed = peer < t->nextPeer;
  return ncclxSuccess;
}

static ncclxResult_t a2avExec(struct ncclxComm* comm, void* arg) {
  a2avTask* t = arg;
  int n = comm->nranks;
  const char* fn = t->compact ? "ncclxAllToAllvDynamicCompact" : "ncclxAllToAllvDynamic";
  /* The counts are the caller's at this moment: check them now (failures here must reach
   * the peers, which are already waiting for our headers: commFail). */
  uint64_t sum = 0, limit = (SIZE_MAX / 2) / t->elemBytes;
  for (int p = 0; p < n; p++) {
    size_t c = t->sendcounts[p];
    if (c > limit - sum)
      return commFail(comm, ncclxInvalidArgument,
                      "%s #%llu: sendcounts[%d] = %zu: the send counts add up to "
                      "more than fits in memory",
                      fn, opSeq(comm), p, c);
    t->sendSegs[p] = c;
    t->sendPtrs[p] = t->sendbuff ? t->sendbuff + sum * t->elemBytes : NULL;
    sum += c;
  }
  if (sum > 0 && !t->sendbuff)
    return commFail(comm, ncclxInvalidArgument, "%s #%llu: sendbuff is NULL but the send counts add up to %llu",
                    fn, opSeq(comm), (unsigned long long)sum);
  size_t recvBytes = (t->compact ? t->maxRecv : t->maxRecv * (size_t)n) * t->elemBytes;
  if (collRangesOverlap(t->sendbuff, (size_t)sum * t->elemBytes, t->recvbuff, recvBytes))
    return commFail(comm, ncclxInvalidArgument,
                    "%s #%llu: sendbuff and recvbuff overlap (in place is not supported)", fn, opSeq(comm));
  t->nextPeer = 0;
  t->placedSum = 0;
  dynExchange x = {.comm = comm,
                   .unitBytes = t->elemBytes,
                   .unitName = "elements",
                   .capName = t->compact ? "maxRecvTotal" : "maxRecvCount",
                   .capacity = t->compact ? DYN_NO_CAPACITY : t->maxRecv,
                   .peers = t->peers,
                   .place = t->compact ? placePacked : placePerPeer,
                   .ctx = t};
  return dynExchangeRun(&x);
}

static ncclxResult_t a2avRun(ncclxTask* task) {
  a2avTask* t = (a2avTask*)task;
  /* The counts are valid now (they may have been produced by an earlier stream task). */
  size_t count = 0;
  for (int p = 0; p < t->comm->nranks; p++) count += t->sendcounts[p];
  dynOpInfo info = {.sendbuff = t->sendbuff,
                    .recvbuff = t->recvbuff,
                    .count = count,
                    .bytes = count * t->elemBytes,
                    .datatype = t->datatype,
                    .stream = t->stream};
  return dynExecOp(t->comm, t->compact ? "alltoallv_dynamic_compact" : "alltoallv_dynamic", a2avExec, t, &info);
}

static void a2avRelease(ncclxTask* task) {
  a2avTask* t = (a2avTask*)task;
  commRelease(t->comm);
  free(t);
}

static ncclxResult_t a2avSubmit(const char* fn, const void* sendbuff, const size_t* sendcounts, void* recvbuff,
                                size_t maxRecv, size_t* recvcounts, size_t* rdispls, ncclxDataType_t datatype,
                                ncclxComm_t comm, ncclxStream_t stream, int compact) {
  NCCLX_CHECK(commCheckCall(comm, stream, fn));
  NCCLX_CHECK(dynCheckNotGrouped(comm, fn));
  if ((unsigned)datatype >= ncclxNumTypes)
    return commArgError(comm, ncclxInvalidArgument, "%s: invalid datatype %d", fn, (int)datatype);
  if (!sendcounts || !recvcounts || (compact && !rdispls))
    return commArgError(comm, ncclxInvalidArgument, "%s: %s is NULL", fn,
                       !sendcounts   ? "sendcounts"
                       : !recvcounts ? "recvcounts"
                                     : "rdispls");
  size_t n = (size_t)comm->nranks, sz = ncclxTypeSize(datatype);
  size_t slots = compact ? 1 : n;
  if (maxRecv > 0 && maxRecv > ((SIZE_MAX / 2) / sz) / slots)
    return commArgError(comm, ncclxInvalidArgument, "%s: %s %zu is too large", fn,
                       compact ? "maxRecvTotal" : "maxRecvCount", maxRecv);
  if (maxRecv > 0 && !recvbuff)
    return commArgError(comm, ncclxInvalidArgument, "%s: recvbuff is NULL with %s %zu", fn,
                       compact ? "maxRecvTotal" : "maxRecvCount", maxRecv);
  if (sendbuff && collRangesOverlap(sendbuff, 1, recvbuff, maxRecv * slots * sz))
    return commArgError(comm, ncclxInvalidArgument,
                       "%s: sendbuff lies inside recvbuff (in place is not supported)", fn);
  /* Device memory or a CUDA-ordered stream: the GPU path's (alltoallv_dynamic_dev.c). */
  int gpuTaken = 0;
  ncclxResult_t gpuRes = gpuA2avDynamicSubmit(fn, sendbuff, sendcounts, recvbuff, maxRecv, recvcounts, rdispls,
                                              datatype, comm, stream, compact, &gpuTaken);
  if (gpuTaken || gpuRes != ncclxSuccess) return gpuRes;
  /* One allocation: the task and its per-peer arrays. */
  size_t bytes = sizeof(a2avTask) + n * (sizeof(dynPeer) + 2 * sizeof(uint64_t) + 2 * sizeof(char*));
  a2avTask* t = calloc(1, bytes);
  if (!t) return commArgError(comm, ncclxSystemError, "%s: out of memory", fn);
  t->peers = (dynPeer*)(t + 1);
  t->sendSegs = (uint64_t*)(t->peers + n);
  t->recvSegs = t->sendSegs + n;
  t->recvDst = (char**)(t->recvSegs + n);
  t->sendPtrs = (const char**)(t->recvDst + n);
  for (size_t p = 0; p < n; p++) {
    t->peers[p] = (dynPeer){.sendPtr = &t->sendPtrs[p],
                            .sendSegs = &t->sendSegs[p],
                            .nSendSeg = 1,
                            .nRecvSeg = 1,
                            .recvSegs = &t->recvSegs[p],
                            .recvDst = &t->recvDst[p]};
  }
  t->base.run = a2avRun;
  t->base.release = a2avRelease;
  t->comm = comm;
  t->sendbuff = sendbuff;
  t->sendcounts = sendcounts;
  t->recvbuff = recvbuff;
  t->maxRecv = maxRecv;
  t->recvcounts = recvcounts;
  t->rdispls = rdispls;
  t->elemBytes = sz;
  t->datatype = datatype;
  t->stream = stream;
  t->compact = compact;
  commRetain(comm);
  return streamEnqueue(stream, &t->base);
}

API ncclxResult_t ncclxAllToAllvDynamic(const void* sendbuff, const size_t* sendcounts, void* recvbuff,
                                        size_t maxRecvCount, size_t* recvcounts, ncclxDataType_t datatype,
                                        ncclxComm_t comm, ncclxStream_t stream) {
  return a2avSubmit("ncclxAllToAllvDynamic", sendbuff, sendcounts, recvbuff, maxRecvCount, recvcounts, NULL,
                    datatype, comm, stream, 0);
}

API ncclxResult_t ncclxAllToAllvDynamicCompact(const void* sendbuff, const size_t* sendcounts, void* recvbuff,
                                               size_t maxRecvTotal, size_t* recvcounts, size_t* rdispls,
                                               ncclxDataType_t datatype, ncclxComm_t comm,
                                               ncclxStream_t stream) {
  return a2avSubmit("ncclxAllToAllvDynamicCompact", sendbuff, sendcounts, recvbuff, maxRecvTotal, recvcounts,
                    rdispls, datatype, comm, stream, 1);
}
