/* Connection setup and teardown of the shared-memory transport.
 *
 * listen() creates a small segment of mailboxes. connect() creates the connection segment
 * and two doorbell FIFOs, drops the segment's name into a free mailbox and returns at once:
 * small messages can flow before the receiver accepts. accept() takes a posted mailbox,
 * checks the nonce, maps the segment, unlinks every name (a crash from here on leaves
 * nothing behind), chooses single copy (CMA) or double copy and marks the segment attached. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "transport/shm/shm_internal.h"

const char* shmPeerName(const shmComm* c, char* buf, size_t len) {
  snprintf(buf, len, "pid %d", (int)c->peerPid);
  return buf;
}

static int nameValid(const char* name) {
  size_t n = strnlen(name, SHM_NAME_MAX);
  return n > strlen("/" SHM_PREFIX) && n < SHM_NAME_MAX &&
         strncmp(name, "/" SHM_PREFIX, strlen("/" SHM_PREFIX)) == 0 && !strchr(name + 1, '/');
}

static int bellPathValid(const char* path) {
  size_t n = strnlen(path, SHM_PATH_MAX);
  const char* dir = SHM_DIR "/" SHM_PREFIX;
  return n < SHM_PATH_MAX && strncmp(path, dir, strlen(dir)) == 0 && !strchr(path + strlen(dir), '/');
}

static void bellPath(char out[SHM_PATH_MAX], const char* segName, const char* suffix) {
  snprintf(out, SHM_PATH_MAX, SHM_DIR "%s%s", segName, suffix);
}

ncclxResult_t shmListen(void* vctx, int dev, void* handle, void** listenComm) {
  shmCtx* ctx = vctx;
  if (!ctx || !handle || !listenComm) return ncclxInternalError;
  *listenComm = NULL;
  if (dev != 0) {
    SHM_WARN(ctx, "listen: device %d does not exist (1 device)", dev);
    return ncclxInternalError;
  }
  shmListenComm* lc = calloc(1, sizeof(*lc));
  if (!lc) return ncclxSystemError;
  lc->kind = SHM_KIND_LISTEN;
  lc->ctx = ctx;
  lc->nonce = shmRandom64();
  shmNewName(lc->name);
  void* p = NULL;
  int err = shmSegCreate(lc->name, sizeof(shmListenSeg), &p);
  if (err) {
    SHM_WARN(ctx, "listen: cannot create shared memory %s: %s", lc->name, strerror(err));
    free(lc);
    return ncclxSystemError;
  }
  lc->seg = p;
  lc->seg->version = SHM_VERSION;
  lc->seg->pid = (int32_t)getpid();
  lc->seg->nonce = lc->nonce;
  lc->seg->nbox = SHM_MAILBOXES;
  lc->seg->magic = SHM_LISTEN_MAGIC; /* nobody maps it before the handle is shipped */

  shmHandle* h = handle;
  memset(h, 0, sizeof(*h));
  h->magic = SHM_HANDLE_MAGIC;
  h->version = SHM_VERSION;
  h->pid = (int32_t)getpid();
  h->nonce = lc->nonce;
  memcpy(h->name, lc->name, sizeof(h->name));
  *listenComm = lc;
  return ncclxSuccess;
}

/* Removes the names of a connection: its segment and both doorbells. */
static void unlinkConn(const char* segName) {
  char path[SHM_PATH_MAX];
  shm_unlink(segName);
  bellPath(path, segName, ".r");
  unlink(path);
  bellPath(path, segName, ".s");
  unlink(path);
}

/* A connection posted but never accepted will not be: remove its names, after checking
 * that the segment really is one made for this listener (a stranger cannot make us delete
 * someone else's files by posting their name). */
static void dropPosted(shmListenComm* lc, const shmMailbox* mb) {
  void* p = NULL;
  size_t bytes = 0;
  if (mb->nonce != lc->nonce || !nameValid(mb->name) || shmSegOpen(mb->name, SHM_PAGE, &p, &bytes) != 0)
    return;
  shmConnHdr* hdr = p;
  if (hdr->magic == SHM_CONN_MAGIC && hdr->nonce == lc->nonce && hdr->senderPid == mb->pid) {
    atomic_store(&hdr->recvState, SHM_RECV_CLOSED);
    unlinkConn(mb->name);
    SHM_TRACE(lc->ctx, "closeListen: removed %s, never accepted", mb->name);
  }
  munmap(p, bytes);
}

ncclxResult_t shmCloseListen(void* listenComm) {
  shmListenComm* lc = listenComm;
  if (!lc || lc->kind != SHM_KIND_LISTEN) return ncclxInternalError;
  atomic_store(&lc->seg->closed, 1); /* senders posting after this clean up themselves */
  for (int b = 0; b < SHM_MAILBOXES; b++) {
    shmMailbox* box = &lc->seg->box[b];
    if (atomic_load_explicit(&box->state, memory_order_acquire) != SHM_BOX_POSTED) continue;
    shmMailbox mb;
    memcpy(&mb, box, sizeof(mb));
    mb.name[SHM_NAME_MAX - 1] = 0;
    atomic_store(&box->state, SHM_BOX_FREE);
    dropPosted(lc, &mb);
  }
  munmap(lc->seg, sizeof(shmListenSeg));
  shm_unlink(lc->name);
  lc->kind = 0;
  free(lc);
  return ncclxSuccess;
}

/* ------------------------------------------------------------------------------------------
 * Sender side
 * ------------------------------------------------------------------------------------------ */

/* Opens and checks the listener's segment. Remote error when it is gone or not the one the
 * handle names (an old job's handle, or a recycled pid). */
static ncclxResult_t openListen(shmCtx* ctx, const shmHandle* h, shmListenSeg** out) {
  *out = NULL;
  if (h->magic != SHM_HANDLE_MAGIC || h->version != SHM_VERSION || !nameValid(h->name)) {
    SHM_WARN(ctx,
             "connect: the handle is not a shm handle of version %d (magic 0x%x, "
             "version %u)",
             SHM_VERSION, h->magic, h->version);
    return ncclxInternalError;
  }
  void* p = NULL;
  size_t bytes = 0;
  int err = shmSegOpen(h->name, sizeof(shmListenSeg), &p, &bytes);
  if (err) {
    SHM_WARN(ctx, "connect: cannot open the listener's shared memory %s (pid %d): %s%s", h->name, (int)h->pid,
             strerror(err), err == ENOENT ? " (it closed its listener or exited)" : "");
    return ncclxRemoteError;
  }
  shmListenSeg* seg = p;
  if (seg->magic != SHM_LISTEN_MAGIC || seg->version != SHM_VERSION || seg->nonce != h->nonce ||
      seg->pid != h->pid || seg->nbox != SHM_MAILBOXES) {
    SHM_WARN(ctx,
             "connect: refused: %s belongs to another listener than the handle's (pid %d "
             "vs %d, nonce %s): a handle of an old or foreign job?",
             h->name, (int)seg->pid, (int)h->pid, seg->nonce == h->nonce ? "matches" : "differs");
    munmap(p, bytes);
    return ncclxRemoteError;
  }
  if (atomic_load(&seg->closed)) {
    SHM_WARN(ctx, "connect: the listener of pid %d is closed", (int)h->pid);
    munmap(p, bytes);
    return ncclxRemoteError;
  }
  *out = seg;
  return ncclxSuccess;
}

static int claimMailbox(shmListenSeg* seg) {
  unsigned start = (unsigned)(shmRandom64() % SHM_MAILBOXES);
  for (unsigned i = 0; i < SHM_MAILBOXES; i++) {
    unsigned b = (start + i) % SHM_MAILBOXES;
    uint32_t expect = SHM_BOX_FREE;
    if (atomic_compare_exchange_strong(&seg->box[b].state, &expect, SHM_BOX_CLAIMED)) return (int)b;
  }
  return -1;
}

/* Frees what a sendComm holds, and its names when asked. */
static void sendDestroy(shmComm* c, int unlinkNames) {
  if (c->hdr && unlinkNames) unlinkConn(c->name);
  if (c->listen) munmap(c->listen, sizeof(shmListenSeg));
  if (c->hdr) munmap(c->hdr, c->mapBytes);
  if (c->bellWait >= 0) close(c->bellWait);
  if (c->bellRing >= 0) close(c->bellRing);
  if (c->pidfd >= 0) close(c->pidfd);
  if (c->epfd >= 0) close(c->epfd);
  c->kind = 0;
  free(c);
}

static shmComm* commAlloc(shmCtx* ctx, uint32_t kind) {
  shmComm* c = calloc(1, sizeof(*c));
  if (!c) return NULL;
  c->kind = kind;
  c->ctx = ctx;
  c->bellWait = c->bellRing = c->pidfd = c->epfd = -1;
  c->lastCheckNs = shmNowNs();
  return c;
}

static void commMapSlots(shmComm* c) {
  c->slots = (shmSlot*)((char*)c->hdr + shmSlotsOffset());
  c->payload = (char*)c->hdr + shmPayloadOffset(c->hdr->nslots);
  c->nslots = c->hdr->nslots;
  c->payloadBytes = (size_t)c->hdr->payloadBytes;
  c->mask = (uint64_t)c->nslots - 1;
}

/* Segment, doorbells and header of a new connection. */
static ncclxResult_t sendCreate(shmComm* c, const shmHandle* h) {
  shmCtx* ctx = c->ctx;
  size_t payload = (ctx->bufferBytes / ctx->nslots) & ~(size_t)(SHM_LINE - 1);
  size_t bytes = shmConnBytes(ctx->nslots, payload);
  shmNewName(c->name);
  void* p = NULL;
  int err = shmSegCreate(c->name, bytes, &p);
  if (err) {
    SHM_WARN(ctx, "connect: cannot create %zu bytes of shared memory %s: %s", bytes, c->name, strerror(err));
    return ncclxSystemError;
  }
  c->hdr = p;
  c->mapBytes = bytes;
  shmConnHdr* hdr = c->hdr;
  bellPath(hdr->bellRecv, c->name, ".r");
  bellPath(hdr->bellSend, c->name, ".s");
  if ((err = shmBellCreate(hdr->bellRecv, &c->bellRing)) != 0 ||
      (err = shmBellCreate(hdr->bellSend, &c->bellWait)) != 0) {
    SHM_WARN(ctx, "connect: cannot create doorbell FIFO %s: %s",
             c->bellRing < 0 ? hdr->bellRecv : hdr->bellSend, strerror(err));
    return ncclxSystemError;
  }
  for (int i = 0; i < SHM_PROBE_BYTES; i += 8) {
    uint64_t v = shmRandom64();
    memcpy(c->probe + i, &v, 8);
  }
  hdr->version = SHM_VERSION;
  hdr->nslots = ctx->nslots;
  hdr->payloadBytes = payload;
  hdr->nonce = h->nonce;
  hdr->senderPid = (int32_t)getpid();
  hdr->senderPref = ctx->pref;
  hdr->probeAddr = (uint64_t)(uintptr_t)c->probe;
  memcpy(hdr->probe, c->probe, SHM_PROBE_BYTES);
  if (ctx->pref == SHM_PREF_NONE || shmMemProbe(&hdr->mapProbeFd, &hdr->mapProbeId) != 0)
    hdr->mapProbeFd = -1;
  hdr->magic = SHM_CONN_MAGIC; /* published by the mailbox's release store */
  commMapSlots(c);
  c->freeLimit = c->nslots;
  c->mySleeping = &hdr->sendSleeping;
  c->peerSleeping = &hdr->recvSleeping;
  return ncclxSuccess;
}

ncclxResult_t shmConnect(void* vctx, int dev, const void* handle, void** sendComm) {
  shmCtx* ctx = vctx;
  if (!ctx || !handle || !sendComm) return ncclxInternalError;
  *sendComm = NULL;
  if (dev != 0) {
    SHM_WARN(ctx, "connect: device %d does not exist (1 device)", dev);
    return ncclxInternalError;
  }
  shmHandle h;
  memcpy(&h, handle, sizeof(h));
  shmListenSeg* seg = NULL;
  ncclxResult_t res = openListen(ctx, &h, &seg);
  if (res != ncclxSuccess) return res;
  int box = claimMailbox(seg);
  if (box < 0) { /* every mailbox holds a connection not accepted yet: try again later */
    munmap(seg, sizeof(shmListenSeg));
    return ncclxSuccess;
  }
  shmComm* c = commAlloc(ctx, SHM_KIND_SEND);
  if (!c) res = ncclxSystemError;
  if (res == ncclxSuccess) res = sendCreate(c, &h);
  if (res != ncclxSuccess) {
    atomic_store(&seg->box[box].state, SHM_BOX_FREE);
    munmap(seg, sizeof(shmListenSeg));
    if (c) sendDestroy(c, 1); /* not posted: nobody else knows the names */
    return res;
  }
  c->peerPid = h.pid;
  c->pidfd = shmPidOpen(h.pid);
  c->listen = seg;
  shmMailbox* mb = &seg->box[box];
  mb->pid = (int32_t)getpid();
  mb->nonce = h.nonce;
  memcpy(mb->name, c->name, SHM_NAME_MAX);
  atomic_store_explicit(&mb->state, SHM_BOX_POSTED, memory_order_release);
  SHM_TRACE(ctx, "connect: %s posted to pid %d (mailbox %d)", c->name, (int)h.pid, box);
  *sendComm = c;
  return ncclxSuccess;
}

ncclxResult_t shmCheckAttached(shmComm* c) {
  if (c->attached || c->err != ncclxSuccess) return c->err;
  uint32_t st = atomic_load_explicit(&c->hdr->recvState, memory_order_acquire);
  char who[32];
  switch (st) {
    case SHM_RECV_PENDING:
      if (atomic_load(&c->listen->closed))
        return shmFail(c, ncclxRemoteError, "%s closed its listener without accepting our connection",
                       shmPeerName(c, who, sizeof(who)));
      return ncclxSuccess;
    case SHM_RECV_ATTACHED:
      c->mode = (int)c->hdr->mode;
      c->mapOk = c->hdr->mapOk == 1;
      c->attached = 1;
      munmap(c->listen, sizeof(shmListenSeg));
      c->listen = NULL;
      return ncclxSuccess;
    case SHM_RECV_REFUSED:
      c->attached = 1; /* the receiver unlinked the names */
      return shmFail(c, ncclxRemoteError, "%s refused the connection (see its log)",
                     shmPeerName(c, who, sizeof(who)));
    default:
      c->attached = 1;
      return shmFail(c, ncclxRemoteError, "%s closed the connection", shmPeerName(c, who, sizeof(who)));
  }
}

ncclxResult_t shmCloseSend(void* sendComm) {
  shmComm* c = sendComm;
  if (!c || c->kind != SHM_KIND_SEND) return ncclxInternalError;
  atomic_store(&c->hdr->sendClosed, 1);
  if (atomic_exchange(c->peerSleeping, 0)) shmBellRing(c->bellRing);
  /* Not accepted yet: like data on a closed TCP socket, what we sent must still reach the
   * receiver, so the names stay for its accept() (or its closeListen) to remove, unless
   * nobody will ever come: the listener is closed or gone. Once the receiver has taken the
   * connection (or refused it) the names are gone already. */
  int unlinkNames = !c->attached && atomic_load(&c->hdr->recvState) == SHM_RECV_PENDING &&
                    (atomic_load(&c->listen->closed) || !shmPeerAlive(c->peerPid, c->pidfd));
  sendDestroy(c, unlinkNames);
  return ncclxSuccess;
}

/* ------------------------------------------------------------------------------------------
 * Receiver side
 * ------------------------------------------------------------------------------------------ */

static void recvDestroy(shmComm* c) {
  if (c->mappedMessages)
    SHM_INFO(c->ctx, "receive from pid %d: %llu messages through mapped ncclxMemAlloc buffers", (int)c->peerPid,
             (unsigned long long)c->mappedMessages);
  shmMapCacheClear(&c->maps);
  if (c->hdr) munmap(c->hdr, c->mapBytes);
  if (c->bellWait >= 0) close(c->bellWait);
  if (c->bellRing >= 0) close(c->bellRing);
  if (c->pidfd >= 0) close(c->pidfd);
  if (c->epfd >= 0) close(c->epfd);
  c->kind = 0;
  free(c);
}

ncclxResult_t shmCloseRecv(void* recvComm) {
  shmComm* c = recvComm;
  if (!c || c->kind != SHM_KIND_RECV) return ncclxInternalError;
  uint32_t attached = SHM_RECV_ATTACHED;
  atomic_compare_exchange_strong(&c->hdr->recvState, &attached, SHM_RECV_CLOSED);
  if (atomic_exchange(c->peerSleeping, 0)) shmBellRing(c->bellRing);
  recvDestroy(c);
  return ncclxSuccess;
}

static const char* modeName(int mode) { return mode == SHM_MODE_CMA ? "single copy (CMA)" : "double copy"; }

/* Single copy needs process_vm_readv on the sender, which ptrace restrictions (YAMA,
 * containers, seccomp) may forbid: read the sender's probe bytes to find out. */
static ncclxResult_t chooseMode(shmComm* c, char* why, size_t whyLen) {
  shmCtx* ctx = c->ctx;
  int senderPref = c->hdr->senderPref;
  if (ctx->pref == SHM_PREF_NONE || senderPref == SHM_PREF_NONE) {
    snprintf(why, whyLen, "single_copy = none on the %s", ctx->pref == SHM_PREF_NONE ? "receiver" : "sender");
    c->mode = SHM_MODE_COPY;
    return ncclxSuccess;
  }
  uint8_t got[SHM_PROBE_BYTES];
  ssize_t n = shmCmaRead(c->peerPid, got, c->hdr->probeAddr, SHM_PROBE_BYTES);
  if (n == SHM_PROBE_BYTES && memcmp(got, c->hdr->probe, SHM_PROBE_BYTES) == 0) {
    snprintf(why, whyLen, "process_vm_readv works");
    c->mode = SHM_MODE_CMA;
    return ncclxSuccess;
  }
  snprintf(why, whyLen, "process_vm_readv of pid %d failed: %s", (int)c->peerPid,
           n < 0 ? strerror((int)-n) : "it returned other bytes");
  /* A sender that closed before we came sent only inline messages (large ones wait for
   * the mode), so its probe failing says nothing about CMA. */
  if ((ctx->pref == SHM_PREF_CMA || senderPref == SHM_PREF_CMA) && !atomic_load(&c->hdr->sendClosed)) {
    SHM_WARN(ctx,
             "accept: single_copy = cma on the %s but %s (ptrace restrictions such as "
             "kernel.yama.ptrace_scope or a container profile?); set single_copy = auto or none",
             ctx->pref == SHM_PREF_CMA ? "receiver" : "sender", why);
    return ncclxInvalidUsage;
  }
  c->mode = SHM_MODE_COPY;
  return ncclxSuccess;
}

/* Peer-mapped messages need the sender's memfds opened through /proc/<pid>/fd (the same
 * ptrace access check as reading its memory): map its probe allocation to find out. */
static void chooseMapped(shmComm* c, char* why, size_t whyLen) {
  const shmConnHdr* hdr = c->hdr;
  c->mapOk = 0;
  if (c->ctx->pref == SHM_PREF_NONE || hdr->senderPref == SHM_PREF_NONE) {
    snprintf(why, whyLen, "single_copy = none");
    return;
  }
  if (hdr->mapProbeFd < 0) {
    snprintf(why, whyLen, "the sender could not make its probe allocation (memfd refused)");
    return;
  }
  shmMemRef probe = {.id = hdr->mapProbeId, .bytes = SHM_MEM_PROBE_BYTES, .fd = hdr->mapProbeFd};
  char* base = NULL;
  int err = shmMemMapPeer(c->peerPid, &probe, &base);
  if (err) {
    snprintf(why, whyLen, "cannot map pid %d's probe allocation: %s", (int)c->peerPid, strerror(err));
    return;
  }
  munmap(base, SHM_MEM_PROBE_BYTES);
  snprintf(why, whyLen, "the sender's ncclxMemAlloc buffers map");
  c->mapOk = 1;
}

/* Checks the header of a segment named in a mailbox before trusting any of it. */
static const char* headerProblem(const shmConnHdr* hdr, size_t mapBytes, uint64_t nonce, int32_t pid) {
  if (hdr->magic != SHM_CONN_MAGIC || hdr->version != SHM_VERSION)
    return "not a connection segment of this version";
  if (hdr->nonce != nonce) return "nonce differs from this listener's";
  if (hdr->senderPid != pid) return "sender pid differs from the mailbox's";
  uint32_t n = hdr->nslots;
  if (n < 2 || n > 65536 || (n & (n - 1)) != 0) return "bad slot count";
  if (hdr->payloadBytes < SHM_MIN_SLOT_PAYLOAD || hdr->payloadBytes % SHM_LINE != 0 ||
      hdr->payloadBytes > SHM_MAX_MESSAGE)
    return "bad slot size";
  if (shmConnBytes(n, (size_t)hdr->payloadBytes) > mapBytes) return "segment smaller than its slots";
  if (!bellPathValid(hdr->bellRecv) || !bellPathValid(hdr->bellSend)) return "bad doorbell path";
  return NULL;
}

/* Maps the connection a mailbox names. *recvComm stays NULL when it is refused. */
static ncclxResult_t acceptOne(shmListenComm* lc, const shmMailbox* mb, void** recvComm) {
  shmCtx* ctx = lc->ctx;
  if (mb->nonce != lc->nonce || !nameValid(mb->name)) {
    SHM_WARN(ctx, "accept: refused a connection from pid %d: %s", (int)mb->pid,
             mb->nonce != lc->nonce ? "its handle's nonce is not this listener's (an old or "
                                      "foreign job?)"
                                    : "malformed segment name");
    return ncclxSuccess;
  }
  shmComm* c = commAlloc(ctx, SHM_KIND_RECV);
  if (!c) return ncclxSystemError;
  c->peerPid = mb->pid;
  void* p = NULL;
  int err = shmSegOpen(mb->name, SHM_PAGE, &p, &c->mapBytes);
  if (err) {
    /* ENOENT: the sender closed (and unlinked) before we got here. */
    SHM_LOG(ctx, err == ENOENT ? NCCLX_LOG_INFO : NCCLX_LOG_WARN,
            "NET/SHM: accept: dropped a connection from pid %d: cannot open %s: %s", (int)mb->pid, mb->name,
            strerror(err));
    recvDestroy(c);
    return ncclxSuccess;
  }
  c->hdr = p;
  const char* problem = headerProblem(c->hdr, c->mapBytes, lc->nonce, mb->pid);
  if (problem) {
    SHM_WARN(ctx, "accept: refused a connection from pid %d (%s): %s", (int)mb->pid, mb->name, problem);
    if (c->hdr->magic == SHM_CONN_MAGIC && c->hdr->nonce == lc->nonce) { /* ours: clean up */
      atomic_store(&c->hdr->recvState, SHM_RECV_REFUSED);
      shm_unlink(mb->name);
    }
    recvDestroy(c);
    return ncclxSuccess;
  }
  shm_unlink(mb->name);
  shmConnHdr* hdr = c->hdr;
  if ((err = shmBellOpen(hdr->bellRecv, &c->bellWait)) != 0 ||
      (err = shmBellOpen(hdr->bellSend, &c->bellRing)) != 0) {
    SHM_LOG(ctx, err == ENOENT ? NCCLX_LOG_INFO : NCCLX_LOG_WARN,
            "NET/SHM: accept: refused a connection from pid %d: cannot open doorbell %s: %s", (int)mb->pid,
            c->bellWait < 0 ? hdr->bellRecv : hdr->bellSend, strerror(err));
    atomic_store(&hdr->recvState, SHM_RECV_REFUSED);
  }
  unlink(hdr->bellRecv);
  unlink(hdr->bellSend);
  if (c->bellRing < 0) {
    recvDestroy(c);
    return ncclxSuccess;
  }
  char why[160];
  ncclxResult_t res = chooseMode(c, why, sizeof(why));
  if (res != ncclxSuccess) {
    atomic_store(&hdr->recvState, SHM_RECV_REFUSED);
    recvDestroy(c);
    return res;
  }
  char whyMapped[160];
  chooseMapped(c, whyMapped, sizeof(whyMapped));
  commMapSlots(c);
  c->mySleeping = &hdr->recvSleeping;
  c->peerSleeping = &hdr->sendSleeping;
  c->pidfd = shmPidOpen(c->peerPid);
  hdr->mode = (uint32_t)c->mode;
  hdr->mapOk = (uint32_t)c->mapOk;
  hdr->recvPid = (int32_t)getpid();
  atomic_store(&hdr->recvState, SHM_RECV_ATTACHED);
  if (atomic_exchange(c->peerSleeping, 0)) shmBellRing(c->bellRing); /* a sender waiting for the mode */
  /* A sender gone before we came says nothing about the host (its probe page is gone). */
  int logged = 2 * c->mode + c->mapOk;
  if (!atomic_load(&hdr->sendClosed) && atomic_exchange(&ctx->loggedMode, logged) != logged)
    SHM_INFO(ctx,
             "%s possible for messages above %zu bytes (%s); single copy from mapped ncclxMemAlloc "
             "buffers %s (%s); %u slots of %zu bytes per connection",
             modeName(c->mode), c->payloadBytes, why, c->mapOk ? "on" : "off", whyMapped, c->nslots,
             c->payloadBytes);
  SHM_TRACE(ctx, "accept: connection from pid %d, %s, mapped buffers %s", (int)c->peerPid,
            modeName(c->mode), c->mapOk ? "on" : "off");
  *recvComm = c;
  return ncclxSuccess;
}

ncclxResult_t shmAccept(void* listenComm, void** recvComm) {
  shmListenComm* lc = listenComm;
  if (!lc || lc->kind != SHM_KIND_LISTEN || !recvComm) return ncclxInternalError;
  *recvComm = NULL;
  for (unsigned i = 0; i < SHM_MAILBOXES; i++) {
    unsigned b = (lc->nextBox + i) % SHM_MAILBOXES;
    shmMailbox* box = &lc->seg->box[b];
    if (atomic_load_explicit(&box->state, memory_order_acquire) != SHM_BOX_POSTED) continue;
    shmMailbox mb;
    memcpy(&mb, box, sizeof(mb));
    mb.name[SHM_NAME_MAX - 1] = 0;
    atomic_store_explicit(&box->state, SHM_BOX_FREE, memory_order_release);
    lc->nextBox = b + 1;
    ncclxResult_t res = acceptOne(lc, &mb, recvComm);
    if (res != ncclxSuccess || *recvComm) return res;
  }
  return ncclxSuccess;
}
