/* LL rounds through the board's bulk area: all-gathers larger than a line region and
 * broadcasts larger than a bank of lines (see coll_ll.c). */
#include "coll/coll_ll_internal.h"

/* Starts a round through the bulk area: c is call a's next round, its flag line in the line
 * bank of its sequence number; returns the round's bulk bank. */
static char* llBulkCall(struct ncclxComm* comm, struct ncclxLLBoard* b, const ncclxCollArgs* a,
                        llCall* c) {
  int n = comm->nranks;
  *c = (llCall){.comm = comm, .a = a, .b = b};
  c->seq = ++b->seq;
  c->sig = llSig(a);
  c->bank = b->lines + (size_t)(c->seq & (b->banks - 1)) * (size_t)n * b->perRegion;
  c->ringAt = b->ringPos;
  llWaiterInit(&c->w, comm, b);
  c->w.call = c;
  return b->bulk + (size_t)(c->seq & (LL_BULK_BANKS - 1)) * (size_t)n * b->bulkBytes;
}

static void llBulkDone(llCall* c) {
  atomic_store_explicit(&c->b->ctl[c->comm->rank].done, c->seq, memory_order_release);
  llWakeSleepers(c->b); /* a writer may be asleep waiting to reuse a bank */
}

/* One round of a bulk all-gather: bytes [off, off + len) of every rank's block. Each rank
 * copies its piece into its bulk region once, then every other rank copies it out once: n
 * copies of every byte, where the ring moves it twice per hop (2 (n - 1) copies). */
static ncclxResult_t llGatherRound(struct ncclxComm* comm, struct ncclxLLBoard* b,
                                   const ncclxCollArgs* a, size_t off, size_t len) {
  int n = comm->nranks, me = comm->rank;
  size_t blk = a->count * dataTypeSize(a->datatype);
  llCall c;
  char* bank = llBulkCall(comm, b, a, &c);
  NCCLX_CHECK(llWaitReusable(&c, LL_BULK_BANKS));
  copyToShared(&b->bulkCopy, NCCLX_NT_AUTO, bank + (size_t)me * b->bulkBytes,
               (const char*)a->sendbuff + off, len);
  llWrite(&c, NULL, 0, 0, 0); /* the flag line, stored after the bytes (release) */
  llWakeSleepers(b);
  char* recv = a->recvbuff;
  for (int k = 1; k < n; k++) { /* starting after ourselves spreads the readers */
    int r = (me + k) % n;
    NCCLX_CHECK(llRead(&c, r, 0, 0, NULL)); /* waits for the flag, checks the signature */
    memcpy(recv + (size_t)r * blk + off, bank + (size_t)r * b->bulkBytes, len);
  }
  if (c.seq - 1 > b->knownDone) b->knownDone = c.seq - 1; /* every rank wrote this call */
  llBulkDone(&c);
  return ncclxSuccess;
}

/* Two ranks that both take themselves for a bulk broadcast's root would copy into the same
 * bank, and a reader, which checks the one flag of a round, could take a mix of the two
 * without an error. So a root claims the bank before copying. A bank is reused only once
 * every rank has finished the call before it in the bank (llWaitReusable), so a claim of this
 * very call can only be another root's: the second root fails before it writes a byte. */
static ncclxResult_t llBcastClaim(const llCall* c) {
  uint64_t mine = c->seq << 8 | (uint64_t)c->comm->rank;
  uint64_t prev = atomic_exchange_explicit(&c->b->hdr->bulkRoot[c->seq & (LL_BULK_BANKS - 1)],
                                           mine, memory_order_acq_rel);
  if (prev >> 8 != c->seq) return ncclxSuccess;
  char who[128];
  return commFail(c->comm, ncclxInvalidUsage,
                  "broadcast #%llu: %s broadcasts as the root of this call too, where rank %d "
                  "is root for this rank: ranks disagree on the root (collectives differ across "
                  "ranks)",
                  (unsigned long long)c->comm->curOpSeq,
                  commDescribeRank(c->comm, (int)(prev & 0xff), who, sizeof(who)), c->comm->rank);
}

/* With a CPU per rank, a bulk broadcast's readers copy straight out of the root's buffer
 * when it lies in an ncclxMemAlloc allocation: one copy per reader where the bulk bank costs
 * the root a copy in and each reader one out, and the root's own copy alone is left to it.
 * 2 ranks, alternating runs, medians: 2 MiB 228 us against 128, 16 MiB 1903 against 928
 * (Open MPI 175 and 1512). A root names its buffer only once every rank has said that it can
 * map every other's allocations. Each says so in its control line at its first bulk
 * broadcasts, after mapping the others' probe pages, and waits for nobody: a rank waiting
 * here for the others could wait for a call they never make (mismatched calls must fail as
 * such). Until all have said yes, and for good after a no, rounds go through the bank;
 * readers follow each round's flag line. */
static void llMapUpdate(struct ncclxComm* comm, struct ncclxLLBoard* b) {
  if (b->mapAll != LL_MAP_UNKNOWN) return;
  int n = comm->nranks, me = comm->rank;
  if (!commRanksOwnCpus(comm)) { /* the same answer on every rank: nothing to tell */
    b->mapAll = LL_MAP_NO;
    return;
  }
  _Atomic uint64_t* mine = &b->ctl[me].mapState;
  if (atomic_load_explicit(mine, memory_order_relaxed) < LL_MAP_YES) {
    for (int r = 0; r < n; r++)
      if (atomic_load_explicit(&b->ctl[r].mapState, memory_order_acquire) < LL_MAP_PROBE_SET)
        return; /* not attached yet: ask again at the next bulk broadcast */
    int ok = peersSingleCopyAllowed();
    for (int r = 0; r < n && ok; r++) {
      if (r == me) continue;
      shmMemRef probe = {.id = b->ctl[r].probeId, .bytes = SHM_MEM_PROBE_BYTES, .fd = b->ctl[r].probeFd};
      char* base = NULL;
      ok = probe.fd >= 0 && shmMemMapPeer(comm->peerInfo[r].pid, &probe, &base) == 0;
      if (ok) munmap(base, SHM_MEM_PROBE_BYTES);
      else INFO(NCCLX_LOG_COLL, "LL protocol: cannot map rank %d's ncclxMemAlloc buffers; bulk broadcasts go through the board", r);
    }
    if (ok && !(b->maps = calloc((size_t)n, sizeof(*b->maps)))) ok = 0;
    atomic_store_explicit(mine, ok ? LL_MAP_YES : LL_MAP_NO, memory_order_release);
  }
  for (int r = 0; r < n; r++) {
    uint64_t v = atomic_load_explicit(&b->ctl[r].mapState, memory_order_acquire);
    if (v == LL_MAP_NO) b->mapAll = LL_MAP_NO;
    if (v < LL_MAP_YES) return;
  }
  if (b->mapAll == LL_MAP_UNKNOWN) b->mapAll = LL_MAP_YES;
}

/* A reader's copy of a mapped round: len bytes of the root's allocation named by m. */
static ncclxResult_t llReadMapped(llCall* c, const llRoundRef* m, char* dst, size_t len, int streamOut) {
  struct ncclxComm* comm = c->comm;
  int root = c->a->root;
  shmMemRef ref = m->ref;
  if (ref.offset > ref.bytes || len > ref.bytes - ref.offset)
    return commFail(comm, ncclxInternalError,
                    "broadcast #%llu (LL protocol): root %d names %zu bytes at offset %llu of a "
                    "%llu-byte allocation",
                    (unsigned long long)comm->curOpSeq, root, len, (unsigned long long)ref.offset,
                    (unsigned long long)ref.bytes);
  char* base = NULL;
  int err = shmMapCacheGet(&c->b->maps[root], comm->peerInfo[root].pid, &ref, &base);
  if (err) {
    char who[128];
    int gone = err == ENOENT || err == ESTALE;
    return commFail(comm, gone ? ncclxRemoteError : ncclxSystemError,
                    "broadcast #%llu (LL protocol): cannot map %s's ncclxMemAlloc allocation "
                    "(%llu bytes): %s%s",
                    (unsigned long long)comm->curOpSeq, commDescribeRank(comm, root, who, sizeof(who)),
                    (unsigned long long)ref.bytes, strerror(err),
                    gone ? " (freed before the broadcast completed?)" : "");
  }
  if (streamOut) copyNonTemporal(dst, base + ref.offset, len);
  else memcpy(dst, base + ref.offset, len);
  c->b->mappedRounds++;
  return ncclxSuccess;
}

/* One round of a bulk broadcast: bytes [off, off + len) of the root's buffer, through the
 * whole bulk bank (every rank's region of it). The root copies them in once (copyToShared:
 * plain or non-temporal) and every other rank copies them out once (non-temporal if
 * streamOut); the root's own copy (if copyOwn) follows its flag, while the others read. In a
 * mapped round the root only names its buffer, and *mappedSeq is the round's number. */
static ncclxResult_t llBcastRound(struct ncclxComm* comm, struct ncclxLLBoard* b,
                                  const ncclxCollArgs* a, size_t off, size_t len, int streamOut,
                                  int copyOwn, uint64_t* mappedSeq) {
  llCall c;
  char* bank = llBulkCall(comm, b, a, &c);
  char* recv = (char*)a->recvbuff + off;
  llRoundRef* m = (llRoundRef*)llRegion(&c, a->root)[0].data;
  if (comm->rank == a->root) {
    const char* send = (const char*)a->sendbuff + off;
    NCCLX_CHECK(llWaitReusable(&c, LL_BULK_BANKS));
    NCCLX_CHECK(llBcastClaim(&c));
    llRoundRef ref = {0};
    if (b->mapAll == LL_MAP_YES && shmMemFind(send, len, &ref.ref)) {
      ref.magic = LL_MAPPED_ROUND;
      *mappedSeq = c.seq;
    } else {
      copyToShared(&b->bulkCopy, NCCLX_NT_AUTO, bank, send, len);
    }
    memcpy(m, &ref, sizeof(ref)); /* before the flag, which llWrite stores with release */
    llWrite(&c, NULL, 0, 0, 0);
    llWakeSleepers(b);
    if (copyOwn) memcpy(recv, send, len);
  } else {
    NCCLX_CHECK(llRead(&c, a->root, 0, 0, NULL));
    if (m->magic == LL_MAPPED_ROUND && b->maps) NCCLX_CHECK(llReadMapped(&c, m, recv, len, streamOut));
    else if (m->magic == LL_MAPPED_ROUND)
      return commFail(comm, ncclxInternalError, "broadcast #%llu (LL protocol): root %d sent a mapped round this rank cannot read",
                      (unsigned long long)comm->curOpSeq, a->root);
    else if (streamOut) copyNonTemporal(recv, bank, len);
    else memcpy(recv, bank, len);
  }
  llBulkDone(&c);
  return ncclxSuccess;
}

/* The root of mapped rounds returns only once every reader has copied them: the caller may
 * change its buffer then. */
static ncclxResult_t llWaitReaders(struct ncclxComm* comm, struct ncclxLLBoard* b, uint64_t seq) {
  llWaiter w;
  llWaiterInit(&w, comm, b);
  for (int r = 0; r < comm->nranks; r++)
    while (atomic_load_explicit(&b->ctl[r].done, memory_order_acquire) < seq)
      NCCLX_CHECK(llWaitStep(&w, &b->ctl[r].done, seq, "the readers of its buffer", r));
  return ncclxSuccess;
}

/* Fault the bulk area's pages in before the first use: with /dev/shm full that fails with
 * EFAULT here (MADV_POPULATE_WRITE, Linux 5.14) instead of a SIGBUS in memcpy. Kernels
 * without it (EINVAL) keep the old behaviour. */
static ncclxResult_t llBulkPopulate(struct ncclxComm* comm, struct ncclxLLBoard* b) {
#ifdef MADV_POPULATE_WRITE
  size_t bytes = (size_t)LL_BULK_BANKS * (size_t)comm->nranks * b->bulkBytes;
  if (madvise(b->bulk, bytes, MADV_POPULATE_WRITE) != 0 && errno != EINVAL)
    return commFail(comm, ncclxSystemError,
                    "LL protocol: cannot allocate the %zu-byte bulk area in /dev/shm%s: %s "
                    "(is /dev/shm full?)",
                    bytes, b->name, strerror(errno));
#else
  (void)comm;
#endif
  b->bulkReady = 1;
  return ncclxSuccess;
}

/* Receivers of a bulk broadcast write with non-temporal stores once the host's receive
 * buffers together (nranks * bytes) reach LL_STREAM_HOST_BYTES, half of this machine kind's
 * 32 MiB last-level cache: they cannot all stay in it, and a plain store first reads every
 * line it writes. 8 ranks on 2 CPUs, alternating runs: 2 MiB 794 us against 1000, 16 MiB 7328
 * against 8823; 4 ranks, 4 MiB: 678 against 765; below it slower (8 ranks, 1 MiB: 533 against
 * 417). A constant: sysconf's cache size reads 320 MiB on this VM (sysfs: 32 MiB). */
#define LL_STREAM_HOST_BYTES ((size_t)16 << 20)

/* A call through the bulk area (an all-gather whose blocks outgrow a line region, a
 * broadcast larger than a bank of lines): rounds of a bulk region (all-gather) or bank
 * (broadcast) each, the bulk banks pipelining them. Ranks that disagree on the count fail
 * at the first round: every round carries the whole call's signature. */
ncclxResult_t llBulkRun(struct ncclxComm* comm, const ncclxCollArgs* a) {
  struct ncclxLLBoard* b;
  NCCLX_CHECK(llBoard(comm, &b));
  if (!b->bulkReady) NCCLX_CHECK(llBulkPopulate(comm, b));
  size_t total = a->count * dataTypeSize(a->datatype);
  if (a->coll == NCCLX_COLL_BROADCAST) {
    size_t round = llBcastBulkBytes(comm->nranks);
    int streamOut = (size_t)comm->nranks * total >= LL_STREAM_HOST_BYTES;
    /* The root copies its own round by round, unless the buffers partly overlap: then a
     * round's copy could change what a later round sends, and it follows the last round. */
    int root = comm->rank == a->root, inPlace = a->recvbuff == a->sendbuff;
    int late = root && !inPlace && collRangesOverlap(a->sendbuff, total, a->recvbuff, total);
    llMapUpdate(comm, b);
    uint64_t mappedSeq = 0; /* the last round readers copy from our buffer */
    for (size_t off = 0; off < total; off += round)
      NCCLX_CHECK(llBcastRound(comm, b, a, off, total - off < round ? total - off : round, streamOut,
                               root && !inPlace && !late, &mappedSeq));
    if (mappedSeq) NCCLX_CHECK(llWaitReaders(comm, b, mappedSeq));
    if (late) memmove(a->recvbuff, a->sendbuff, total);
    return ncclxSuccess;
  }
  for (size_t off = 0; off < total; off += b->bulkBytes)
    NCCLX_CHECK(llGatherRound(comm, b, a, off, total - off < b->bulkBytes ? total - off : b->bulkBytes));
  /* Our own block last: in place it is already there, and it was the source above. */
  char* own = (char*)a->recvbuff + (size_t)comm->rank * total;
  if (own != (const char*)a->sendbuff) memmove(own, a->sendbuff, total);
  return ncclxSuccess;
}
