/* Data path of the shared-memory transport.
 *
 * A connection is a ring of slots, each used in turn (use number `seq`, slot seq % nslots).
 * The sender fills a slot and stores full = seq + 1; the receiver, taking messages strictly
 * in order, copies out and stores done = seq + 1, which frees the slot. A message is
 *  - INLINE when it fits a slot: copied in and out (bytes <= 32 ride in the flag's cache line),
 *    unless it goes MAPPED or CMA (sendOne: each kind of send has its size thresholds);
 *  - MAPPED when in an ncclxMemAlloc allocation the receiver can map (shm_mem.c) and larger
 *    than a slot or than its kind's threshold: the slot names the allocation, the receiver
 *    maps it (once per connection, cached) and copies the message out with memcpy; `done` is
 *    the ack that completes the send;
 *  - CMA when single copy works and the message is larger than a slot or than its kind's
 *    threshold: the slot carries the sender's address and the receiver reads it with
 *    process_vm_readv straight into the user buffer; `done` acks it;
 *  - FRAG_FIRST/FRAG_NEXT otherwise: cut into slot-sized pieces, pipelined through the ring.
 *
 * Nothing here makes a system call on the fast path. A side that finds nothing to do for
 * SHM_ARM_IDLE test() calls and SHM_ARM_NS "arms": it sets its sleeping flag, after which the
 * peer rings its doorbell FIFO (the getPollFd descriptor) once. While idle it also checks every
 * few milliseconds that the peer process still exists and has not closed the connection. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <unistd.h>

#include "util/copy_nt.h"
#include "transport/shm/net_shm.h"
#include "transport/shm/shm_internal.h"

ncclxResult_t shmFail(shmComm* c, ncclxResult_t err, const char* fmt, ...) {
  if (c->err != ncclxSuccess) return c->err;
  c->err = err;
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof(msg), fmt, ap);
  va_end(ap);
  SHM_WARN(c->ctx, "%s %s: %s", c->kind == SHM_KIND_SEND ? "send to" : "receive from",
           shmPeerName(c, (char[32]){0}, 32), msg);
  /* Tell the peer, so it fails now instead of at its timeout. */
  if (c->kind == SHM_KIND_RECV) {
    uint32_t attached = SHM_RECV_ATTACHED;
    atomic_compare_exchange_strong(&c->hdr->recvState, &attached, SHM_RECV_FAILED);
  } else {
    atomic_store(&c->hdr->sendClosed, 1);
  }
  if (atomic_exchange(c->peerSleeping, 0)) shmBellRing(c->bellRing);
  return err;
}

static inline shmReq* reqAt(shmComm* c, uint64_t i) { return &c->reqs[i % SHM_QUEUE]; }
static inline shmSlot* slotOf(shmComm* c, uint64_t seq) { return &c->slots[seq & c->mask]; }
static inline char* payloadOf(shmComm* c, uint64_t seq) {
  return c->payload + (size_t)(seq & c->mask) * c->payloadBytes;
}

/* After publishing or consuming: ring the peer if it went to sleep. The fence orders our
 * flag store before the load of its sleeping flag (it does the mirror image when arming). */
static inline void wakePeer(shmComm* c) {
  atomic_thread_fence(memory_order_seq_cst);
  if (atomic_load_explicit(c->peerSleeping, memory_order_relaxed) && atomic_exchange(c->peerSleeping, 0))
    shmBellRing(c->bellRing);
}

/* ------------------------------------------------------------------------------------------
 * Sender
 * ------------------------------------------------------------------------------------------ */

/* Is the slot for use c->seq free? The receiver consumes in order, so once the newest
 * published use is done the whole ring is free; this keeps the receiver's cache lines out
 * of the sender's fast path most of the time. */
static int slotFree(shmComm* c) {
  uint64_t s = c->seq;
  if (s < c->freeLimit) return 1;
  if (atomic_load_explicit(&slotOf(c, s - 1)->r.done, memory_order_acquire) == s) {
    c->freeLimit = s + c->nslots;
    return 1;
  }
  uint64_t prev = s - c->nslots; /* the use that must be consumed first */
  if (atomic_load_explicit(&slotOf(c, prev)->r.done, memory_order_acquire) >= prev + 1) {
    c->freeLimit = s + 1;
    return 1;
  }
  return 0;
}

/* A plain copy into a slot the receiver has read before needs those lines back from its
 * core; at times (copy_nt.h) that makes it 10x slower: copyToShared switches to
 * non-temporal stores while plain copies are slow. [net.shm] nontemporal = always | never
 * fixes the choice. */
static inline void copyToSlot(shmComm* c, void* dst, const void* src, size_t len) {
  copyToShared(&c->slotCopy, c->ctx->nontemporal, dst, src, len);
}

static inline void publish(shmComm* c, shmSlot* sl, uint32_t kind, const shmReq* r) {
  sl->s.size = r->size;
  sl->s.tag = r->tag;
  sl->s.kind = kind;
  atomic_store_explicit(&sl->s.full, c->seq + 1, memory_order_release);
  c->seq++;
}

/* The smallest message r that goes mapped when it lies in an ncclxMemAlloc allocation: where
 * ranks share CPUs only messages larger than the ring, or from SHM_EXCHANGE_MAPPED_MIN for
 * one half of an exchange; else from SHM_MAPPED_MIN_BYTES; every message a slot cannot hold
 * at the latest, and an application's send only then (ncclxShmSharedCpus, ncclxShmSendKind). */
static size_t mappedMinOf(const shmComm* c, const shmReq* r) {
  size_t slot = c->payloadBytes + 1; /* the smallest message a slot cannot hold */
  if (c->sharedCpus && r->sendKind != NCCLX_SHM_SEND_EXCHANGE) return (size_t)c->nslots * c->payloadBytes + 1;
  if (r->sendKind == NCCLX_SHM_SEND_USER) return slot;
  size_t min = c->sharedCpus ? SHM_EXCHANGE_MAPPED_MIN : SHM_MAPPED_MIN_BYTES;
  return min < slot ? min : slot;
}

/* The allocations this sender's receiver has probably mapped: the SHM_MAP_CACHE most recent
 * that mapped messages named, as the receiver's own cache evolves. A message a slot holds
 * goes mapped only from one of them: mapping costs the receiver an open and an mmap, more
 * than copying a few KiB twice, and an application that cycles through more allocations than
 * the cache holds would pay it for every message. Returns whether id was there, and makes it
 * the most recent either way. */
static int mirrorTouch(shmComm* c, uint64_t id) {
  int victim = 0;
  for (int i = 0; i < SHM_MAP_CACHE; i++) {
    if (c->mirror.ids[i] == id && c->mirror.used[i]) {
      c->mirror.used[i] = ++c->mirror.clock;
      return 1;
    }
    if (c->mirror.used[i] < c->mirror.used[victim]) victim = i;
  }
  c->mirror.ids[victim] = id;
  c->mirror.used[victim] = ++c->mirror.clock;
  return 0;
}

/* Publishes as much of request r as the ring takes; returns 1 when r is fully published. */
static int sendOne(shmComm* c, shmReq* r, int* published) {
  size_t mappedMin = mappedMinOf(c, r);
  int fits = r->size <= c->payloadBytes; /* one slot holds it */
  /* A message that does not fit needs the receiver's mode; one that could go mapped asks
   * whether the receiver maps, but goes through a slot while that is not known yet. */
  if ((!fits || r->size >= mappedMin) && !c->attached && shmCheckAttached(c) != ncclxSuccess) return 0;
  if (!fits && !c->attached) return 0;
  if (!slotFree(c)) return 0; /* every way needs one; checked before the registry's lock */
  shmMemRef ref; /* a message begun in fragments stays in fragments */
  int mapped = r->off == 0 && c->attached && c->mapOk && r->size >= mappedMin &&
               shmMemFind(r->data, r->size, &ref);
  if (mapped) mapped = mirrorTouch(c, ref.id) || !fits;
  /* An exchange's message from ordinary memory is read once by the receiver too, as a mapped
   * one would be: nothing waits on its sender's wait (ncclxShmSendKind). So is a collective
   * step's where every rank has a CPU and CMA is fast (SHM_COLL_CMA_MIN). */
  int exchangeCma = r->sendKind == NCCLX_SHM_SEND_EXCHANGE && r->size >= SHM_EXCHANGE_CMA_MIN;
  int collCma = r->sendKind == NCCLX_SHM_SEND_COLL && c->coreSingleCopy && !c->sharedCpus &&
                r->size >= SHM_COLL_CMA_MIN;
  int cma = c->attached && c->mode == SHM_MODE_CMA && !mapped &&
            (exchangeCma || collCma || (!fits && !c->preferCopy));
  if (fits && !mapped && !cma) {
    shmSlot* sl = slotOf(c, c->seq);
    if (r->size)
      copyToSlot(c, r->size <= SHM_TINY_BYTES ? (char*)sl->s.tiny : payloadOf(c, c->seq), r->data, r->size);
    publish(c, sl, SHM_MSG_INLINE, r);
    r->off = r->size;
    r->state = SHM_REQ_DONE;
    *published = 1;
    return 1;
  }
  /* One memcpy by the receiver beats both CMA and two copies; but with ranks sharing CPUs,
   * a message the ring could hold is better copied in and left (ncclxShmSharedCpus). */
  if (mapped || cma) {
    shmSlot* sl = slotOf(c, c->seq);
    sl->s.addr = (uint64_t)(uintptr_t)r->data;
    if (mapped) memcpy(sl->s.tiny, &ref, sizeof(ref));
    r->ackSeq = c->seq;
    publish(c, sl, mapped ? SHM_MSG_MAPPED : SHM_MSG_CMA, r);
    r->state = SHM_REQ_WAIT_ACK;
    c->mappedMessages += (uint64_t)mapped;
    *published = 1;
    return 1;
  }
  while (r->off < r->size && slotFree(c)) {
    size_t len = r->size - r->off < c->payloadBytes ? r->size - r->off : c->payloadBytes;
    copyToSlot(c, payloadOf(c, c->seq), r->data + r->off, len);
    uint32_t kind = r->off == 0 ? SHM_MSG_FRAG_FIRST : SHM_MSG_FRAG_NEXT;
    r->off += len;
    publish(c, slotOf(c, c->seq), kind, r);
    wakePeer(c); /* let a sleeping receiver start copying out while we copy in */
    *published = 1;
  }
  if (r->off < r->size) return 0;
  r->state = SHM_REQ_DONE;
  return 1;
}

/* CMA acks arrive in order. A failure status sticks on its slot (the receiver consumes
 * nothing after a failure), so `done` beyond our use means ours succeeded. */
static void sendAcks(shmComm* c, int* progress) {
  for (uint64_t i = c->first; i < c->cursor; i++) {
    shmReq* r = reqAt(c, i);
    if (r->state != SHM_REQ_WAIT_ACK) continue;
    shmSlot* sl = slotOf(c, r->ackSeq);
    uint64_t d = atomic_load_explicit(&sl->r.done, memory_order_acquire);
    if (d < r->ackSeq + 1) return;
    uint32_t status = d == r->ackSeq + 1 ? atomic_load(&sl->r.status) : SHM_STATUS_OK;
    *progress = 1;
    if (status != SHM_STATUS_OK) {
      char who[32];
      shmFail(c, ncclxRemoteError, "%s %s our %zu-byte message", shmPeerName(c, who, sizeof(who)),
              status == SHM_STATUS_TOO_BIG ? "has a smaller receive buffer than" : "failed to receive",
              r->size);
      return;
    }
    r->off = r->size;
    r->state = SHM_REQ_DONE;
  }
}

static void sendProgress(shmComm* c, int* progress) {
  int published = 0;
  while (c->cursor < c->next && c->err == ncclxSuccess) {
    if (!sendOne(c, reqAt(c, c->cursor), &published)) break;
    c->cursor++;
  }
  if (published) {
    wakePeer(c);
    *progress = 1;
  }
  sendAcks(c, progress);
}

/* ------------------------------------------------------------------------------------------
 * Receiver
 * ------------------------------------------------------------------------------------------ */

static inline void consume(shmComm* c, shmSlot* sl) {
  atomic_store_explicit(&sl->r.done, c->seq + 1, memory_order_release);
  c->seq++;
}

static void refuse(shmComm* c, shmSlot* sl, uint32_t status) {
  atomic_store_explicit(&sl->r.status, status, memory_order_relaxed);
  consume(c, sl); /* the release store publishes the status with the ack */
}

/* Reads a CMA message into r, at most SHM_CMA_BUDGET bytes per call so that other transfers
 * the caller is driving keep moving. Returns 1 when r is complete. */
static int cmaRead(shmComm* c, shmReq* r, shmSlot* sl) {
  size_t budget = SHM_CMA_BUDGET;
  while (r->off < r->got && budget > 0) {
    size_t len = r->got - r->off;
    if (len > c->ctx->cmaChunk) len = c->ctx->cmaChunk;
    ssize_t n = shmCmaRead(c->peerPid, r->data + r->off, sl->s.addr + r->off, len);
    if (n <= 0) {
      int e = n < 0 ? (int)-n : EFAULT;
      refuse(c, sl, SHM_STATUS_FAILED);
      shmFail(c, e == EPERM ? ncclxSystemError : ncclxRemoteError,
              "process_vm_readv of %zu bytes at offset %zu of a %zu-byte message failed: %s%s", len, r->off,
              r->got, strerror(e), e == ESRCH ? " (the sender exited)" : "");
      return 0;
    }
    r->off += (size_t)n;
    budget -= (size_t)n < budget ? (size_t)n : budget;
  }
  return r->off == r->got;
}

/* Copies a MAPPED message into r, at most SHM_CMA_BUDGET bytes per call like cmaRead.
 * Returns 1 when r is complete. */
static int mappedRead(shmComm* c, shmReq* r, shmSlot* sl) {
  shmMemRef ref;
  memcpy(&ref, sl->s.tiny, sizeof(ref));
  if (ref.offset > ref.bytes || r->got > ref.bytes - ref.offset) {
    refuse(c, sl, SHM_STATUS_FAILED);
    shmFail(c, ncclxRemoteError, "protocol error: a %zu-byte mapped message at offset %llu of a %llu-byte allocation",
            r->got, (unsigned long long)ref.offset, (unsigned long long)ref.bytes);
    return 0;
  }
  char* base = NULL;
  int err = r->mapFailed ? r->mapFailed : shmMapCacheGet(&c->maps, c->peerPid, &ref, &base);
  /* The fd gone or naming something else: the sender released the buffer too early. */
  int gone = err == ENOENT || err == ESTALE;
  if (err && !gone && c->mode == SHM_MODE_CMA) {
    /* Out of address space or descriptors here: the sender's address is in the slot too. */
    if (!c->mapFallback) {
      c->mapFallback = 1;
      SHM_INFO(c->ctx, "receive from pid %d: cannot map its ncclxMemAlloc allocation (%s); reading it with process_vm_readv instead",
               (int)c->peerPid, strerror(err));
    }
    r->mapFailed = err; /* the rest of this message too, without trying again */
    int done = cmaRead(c, r, sl);
    c->mappedMessages += (uint64_t)done; /* counted by kind, as the sender counts it */
    return done;
  }
  if (err) {
    char who[32];
    refuse(c, sl, SHM_STATUS_FAILED);
    shmFail(c, gone ? ncclxRemoteError : ncclxSystemError,
            "cannot map %s's ncclxMemAlloc allocation %llu (fd %d, %llu bytes) holding a %zu-byte message: %s%s",
            shmPeerName(c, who, sizeof(who)), (unsigned long long)ref.id, (int)ref.fd,
            (unsigned long long)ref.bytes, r->got, strerror(err),
            gone ? " (freed before the send completed?)" : "");
    return 0;
  }
  size_t len = r->got - r->off < SHM_CMA_BUDGET ? r->got - r->off : SHM_CMA_BUDGET;
  memcpy(r->data + r->off, base + ref.offset + r->off, len); /* offset + got <= bytes: checked */
  r->off += len;
  if (r->off == r->got) c->mappedMessages++;
  return r->off == r->got;
}

/* Consumes what has arrived for the posted receives, in order. */
static void recvProgress(shmComm* c, int* progress) {
  int consumed = 0;
  char who[32];
  while (c->cursor < c->next && c->err == ncclxSuccess) {
    shmReq* r = reqAt(c, c->cursor);
    shmSlot* sl = slotOf(c, c->seq);
    if (atomic_load_explicit(&sl->s.full, memory_order_acquire) != c->seq + 1) break;
    uint32_t kind = sl->s.kind;
    size_t size = (size_t)sl->s.size;
    consumed = 1;
    if (!r->started) {
      if (kind == SHM_MSG_FRAG_NEXT || kind < SHM_MSG_INLINE || kind > SHM_MSG_LAST ||
          (kind == SHM_MSG_INLINE && size > c->payloadBytes) ||
          (kind == SHM_MSG_CMA && c->mode != SHM_MODE_CMA) || (kind == SHM_MSG_MAPPED && !c->mapOk)) {
        refuse(c, sl, SHM_STATUS_FAILED);
        shmFail(c, ncclxRemoteError, "protocol error: message kind %u of %zu bytes at slot use %llu", kind,
                size, (unsigned long long)(c->seq - 1));
        break;
      }
      if ((r->tag & NCCLX_NET_TAG_SIGNED) && sl->s.tag != r->tag) {
        if (r->tagOut) *r->tagOut = sl->s.tag;
        refuse(c, sl, SHM_STATUS_FAILED);
        shmFail(c, ncclxInvalidUsage,
                "%s sent a message signed %#x where this receive expects %#x (the ranks' calls "
                "differ)", shmPeerName(c, who, sizeof(who)), (unsigned)sl->s.tag, (unsigned)r->tag);
        break;
      }
      if (size > r->size) {
        refuse(c, sl, SHM_STATUS_TOO_BIG);
        shmFail(c, ncclxRemoteError, "%s sent %zu bytes but the posted receive holds only %zu",
                shmPeerName(c, who, sizeof(who)), size, r->size);
        break;
      }
      r->started = (int)kind;
      r->got = size;
    } else if (size != r->got || !((kind == SHM_MSG_FRAG_NEXT && r->started == SHM_MSG_FRAG_FIRST) ||
                                   (kind == SHM_MSG_CMA && r->started == SHM_MSG_CMA) ||
                                   (kind == SHM_MSG_MAPPED && r->started == SHM_MSG_MAPPED))) {
      refuse(c, sl, SHM_STATUS_FAILED);
      shmFail(c, ncclxRemoteError,
              "protocol error: fragment kind %u of a %zu-byte message "
              "announced as %zu bytes",
              kind, r->got, size);
      break;
    }
    if (kind == SHM_MSG_INLINE) {
      if (size) memcpy(r->data, size <= SHM_TINY_BYTES ? (char*)sl->s.tiny : payloadOf(c, c->seq), size);
      r->off = size;
    } else if (kind == SHM_MSG_CMA) {
      if (!cmaRead(c, r, sl)) break; /* budget spent, or failed */
    } else if (kind == SHM_MSG_MAPPED) {
      if (!mappedRead(c, r, sl)) break; /* budget spent, or failed */
    } else {
      size_t len = r->got - r->off < c->payloadBytes ? r->got - r->off : c->payloadBytes;
      memcpy(r->data + r->off, payloadOf(c, c->seq), len);
      r->off += len;
    }
    consume(c, sl);
    if (r->off == r->got) {
      r->state = SHM_REQ_DONE;
      c->cursor++;
    }
  }
  if (consumed) {
    wakePeer(c);
    *progress = 1;
  }
}

static void progressComm(shmComm* c, int* progress) {
  if (c->kind == SHM_KIND_SEND)
    sendProgress(c, progress);
  else
    recvProgress(c, progress);
}

/* ------------------------------------------------------------------------------------------
 * Idle: arm the doorbell, notice a dead or departed peer
 * ------------------------------------------------------------------------------------------ */

/* Is there a request we are waiting for? (A sender with everything published and acked
 * waits for nothing, even if the receiver has gone.) */
static int waiting(shmComm* c) {
  for (uint64_t i = c->first; i < c->next; i++) {
    int st = reqAt(c, i)->state;
    if (st == SHM_REQ_POSTED || st == SHM_REQ_WAIT_ACK) return 1;
  }
  return 0;
}

/* Gone or closed peers fail the comm, but only after one more look: a peer may publish its
 * last message and exit (or close) right after our previous look. */
static void checkPeer(shmComm* c) {
  char who[32];
  int alive = shmPeerAlive(c->peerPid, c->pidfd);
  int closed = c->kind == SHM_KIND_RECV ? atomic_load(&c->hdr->sendClosed) != 0
                                        : atomic_load(&c->hdr->recvState) >= SHM_RECV_REFUSED;
  if (alive && !closed) return;
  int progress = 0;
  progressComm(c, &progress);
  if (c->err != ncclxSuccess || !waiting(c)) return;
  shmPeerName(c, who, sizeof(who));
  if (!alive) {
    shmFail(c, ncclxRemoteError, "peer %s exited", who);
  } else if (c->kind == SHM_KIND_RECV) {
    shmFail(c, ncclxRemoteError, "%s closed the connection", who);
  } else {
    uint32_t st = atomic_load(&c->hdr->recvState);
    shmFail(c, ncclxRemoteError, "%s %s", who,
            st == SHM_RECV_REFUSED  ? "refused the connection (see its log)"
            : st == SHM_RECV_FAILED ? "failed on this connection (see its log)"
                                    : "closed the connection");
  }
}

static void arm(shmComm* c) {
  shmBellDrain(c->bellWait); /* leftovers of an earlier sleep */
  atomic_store(c->mySleeping, 1);
  atomic_thread_fence(memory_order_seq_cst);
  c->armed = 1;
}

static void disarm(shmComm* c) {
  c->armed = 0;
  atomic_store_explicit(c->mySleeping, 0, memory_order_relaxed);
}

/* Arm only after SHM_ARM_NS of idling: a wait shorter than that costs the peer no system
 * call. The clock is read every 16 idle calls (it costs ~70 ns in a VM). */
static int armDue(shmComm* c) {
  if (c->idle == 32) c->idleStartNs = shmNowNs();
  return c->idle >= SHM_ARM_IDLE && (c->idle & 15) == 0 && shmNowNs() - c->idleStartNs >= SHM_ARM_NS;
}

static void idleStep(shmComm* c) {
  ++c->idle;
  if (!c->armed && armDue(c)) {
    arm(c);
    int progress = 0;
    progressComm(c, &progress); /* anything published just before the flag went up */
    if (progress) {
      disarm(c);
      c->idle = 0;
      return;
    }
  }
  if (c->armed || (c->idle & 63) == 0) {
    uint64_t now = shmNowNs();
    /* Armed, we are called after the caller's poll() returned: maybe on the peer's pidfd. */
    if (now - c->lastCheckNs >= (c->armed ? SHM_PEER_CHECK_NS / 5 : SHM_PEER_CHECK_NS)) {
      c->lastCheckNs = now;
      if (c->kind == SHM_KIND_SEND && !c->attached) shmCheckAttached(c);
      if (c->err == ncclxSuccess) checkPeer(c);
    }
  }
}

/* ------------------------------------------------------------------------------------------
 * The ABI: isend, irecv, test, getPollFd
 * ------------------------------------------------------------------------------------------ */

static shmReq* reqPost(shmComm* c, void* data, size_t size, int tag) {
  while (c->first < c->next && reqAt(c, c->first)->state == SHM_REQ_FREE) c->first++;
  if (c->next - c->first >= SHM_QUEUE) return NULL;
  shmReq* r = reqAt(c, c->next++);
  memset(r, 0, sizeof(*r));
  r->magic = SHM_REQ_MAGIC;
  r->state = SHM_REQ_POSTED;
  r->comm = c;
  r->data = data;
  r->size = size;
  r->tag = tag;
  return r;
}

static void reqRelease(shmComm* c, shmReq* r) {
  r->state = SHM_REQ_FREE;
  r->magic = 0;
  while (c->first < c->cursor && reqAt(c, c->first)->state == SHM_REQ_FREE) c->first++;
}

ncclxResult_t shmIsend(void* sendComm, void* data, size_t size, int tag, void* mhandle, void* phandle,
                       void** request) {
  (void)mhandle, (void)phandle;
  shmComm* c = sendComm;
  if (!c || c->kind != SHM_KIND_SEND || !request) return ncclxInternalError;
  int sendKind = c->nextSendKind; /* for this message only (ncclxShmSendKind) */
  c->nextSendKind = NCCLX_SHM_SEND_COLL;
  *request = NULL;
  if (size > 0 && !data) {
    SHM_WARN(c->ctx, "isend: NULL buffer for %zu bytes", size);
    return ncclxInternalError;
  }
  if (c->err != ncclxSuccess) return c->err;
  shmReq* r = reqPost(c, data, size, tag);
  if (!r) return ncclxSuccess; /* queue full: the core retries (and says it again) */
  r->sendKind = sendKind;
  int progress = 0;
  sendProgress(c, &progress);
  *request = r;
  return ncclxSuccess;
}

ncclxResult_t shmIrecv(void* recvComm, int n, void** data, size_t* sizes, int* tags, void** mhandles,
                       void** phandles, void** request) {
  (void)mhandles, (void)phandles;
  shmComm* c = recvComm;
  if (!c || c->kind != SHM_KIND_RECV || !request) return ncclxInternalError;
  *request = NULL;
  if (n != 1 || !data || !sizes) {
    SHM_WARN(c->ctx, "irecv: %d buffers requested, maxRecvs is 1", n);
    return ncclxInternalError;
  }
  if (sizes[0] > 0 && !data[0]) {
    SHM_WARN(c->ctx, "irecv: NULL buffer for %zu bytes", sizes[0]);
    return ncclxInternalError;
  }
  if (c->err != ncclxSuccess) return c->err;
  /* One buffer per receive: the tag has nothing to select. */
  shmReq* r = reqPost(c, data[0], sizes[0], tags ? tags[0] : 0);
  if (!r) return ncclxSuccess;
  r->tagOut = tags;
  int progress = 0;
  recvProgress(c, &progress); /* the message may be waiting already */
  *request = r;
  return ncclxSuccess;
}

ncclxResult_t shmTest(void* request, int* done, size_t* sizes) {
  shmReq* r = request;
  if (!done) return ncclxInternalError;
  *done = 0;
  if (!r || r->magic != SHM_REQ_MAGIC || r->state == SHM_REQ_FREE) return ncclxInternalError;
  shmComm* c = r->comm;
  int progress = 0;
  if (r->state != SHM_REQ_DONE && c->err == ncclxSuccess) progressComm(c, &progress);
  if (progress) {
    c->idle = 0;
    if (c->armed) disarm(c);
  }
  if (r->state == SHM_REQ_DONE) {
    *done = 1;
    if (sizes) sizes[0] = c->kind == SHM_KIND_RECV ? r->got : r->size;
    reqRelease(c, r);
    return ncclxSuccess;
  }
  if (!progress && c->err == ncclxSuccess) idleStep(c);
  if (c->err != ncclxSuccess) {
    ncclxResult_t err = c->err;
    reqRelease(c, r);
    return err;
  }
  return ncclxSuccess;
}

/* The doorbell, plus the peer's pidfd so that a sleeper also wakes when the peer dies. */
ncclxResult_t shmGetPollFd(void* comm, int* fd) {
  if (!comm || !fd) return ncclxInternalError;
  *fd = -1;
  uint32_t kind = *(const uint32_t*)comm;
  if (kind == SHM_KIND_LISTEN) return ncclxSuccess;
  if (kind != SHM_KIND_SEND && kind != SHM_KIND_RECV) return ncclxInternalError;
  shmComm* c = comm;
  if (c->epfd < 0 && c->pidfd >= 0) {
    int ep = epoll_create1(EPOLL_CLOEXEC);
    struct epoll_event ev = {.events = EPOLLIN};
    ev.data.fd = c->bellWait;
    int ok = ep >= 0 && epoll_ctl(ep, EPOLL_CTL_ADD, c->bellWait, &ev) == 0;
    ev.data.fd = c->pidfd;
    ok = ok && epoll_ctl(ep, EPOLL_CTL_ADD, c->pidfd, &ev) == 0;
    if (ok)
      c->epfd = ep;
    else if (ep >= 0)
      close(ep);
  }
  *fd = c->epfd >= 0 ? c->epfd : c->bellWait;
  return ncclxSuccess;
}
