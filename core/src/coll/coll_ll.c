/* The low-latency (LL) protocol: small collectives of ranks that share one host, through one
 * shared-memory board per communicator.
 *
 * Each rank owns a region of 64-byte lines in each of the board's banks; a line carries 48 bytes of
 * data, the call's signature and the call's sequence number, so data and flag arrive in the
 * same cache line and a reader needs no separate doorbell or fence per message. Every LL
 * collective is one round: each rank that contributes writes its whole input into its region
 * of bank (seq % banks), then reads what it needs from the others' regions (allreduce: all of
 * them, reduced in rank order so that every rank computes the same bits; broadcast: the
 * root's, which spans the whole bank; alltoall: its block of each). A broadcast larger than a
 * bank of lines and an all-gather larger than a line region are sequences of rounds through
 * the board's bulk area (llBcastRound, llGatherRound). A broadcast of at most
 * LL_RING_MAX_BYTES goes through the board's ring instead (llRingRound). No transport
 * connection is used.
 *
 * Reuse of a bank: call k overwrites call k-banks's lines, so a writer first makes sure
 * every rank has finished that call (ctl[r].done). After a call that read every rank's lines of
 * call k, every rank has finished call k-1 (it wrote call k after it), so in the usual
 * back-to-back allreduces the check costs nothing; broadcast and reduce, where a rank can run
 * ahead, read the done counters. A ring cell is written by a call only once every rank has
 * finished the call LL_RING_REUSE before it (see llCell), and a reader that finds a later
 * call in its cells knows the ranks' sequences of calls went apart.
 *
 * The board is created by rank 0 on the first LL call (all ranks are on its host) under a
 * name every rank derives from rank 0's pid and the comm hash, and unlinked once all ranks
 * have it mapped. Waits spin, yield, then sleep on a futex in the board, and end with the
 * comm's timeout or an abort notice. */
#include "coll/coll_ll_internal.h"

/* ---------------- waiting ---------------- */


ncclxResult_t llCrossCheck(const llCall* c);

static uint64_t llNowNs(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* Field by field: zeroing the struct whole compiled to a rep stos, whose start-up cost was
 * 13% of the root's llRound samples. The spin budget is looked up at the first poll that
 * finds no data: most small calls never wait. */
void llWaiterInit(llWaiter* w, struct ncclxComm* comm, struct ncclxLLBoard* b) {
  w->comm = comm;
  w->b = b;
  w->call = NULL;
  w->polls = w->spins = w->yields = 0;
  w->start = 0;
  w->yieldStartNs = 0;
}

/* No fence between our stores and this check (two per call would cost more than the rest
 * of a small call's bookkeeping): in the rare race where a waiter goes to sleep just as we
 * publish, it sleeps out its 1 ms futex timeout and then sees the data. */
__attribute__((noinline)) void llWake(struct ncclxLLBoard* b) {
  atomic_fetch_add(&b->hdr->wake, 1);
  syscall(SYS_futex, (uint32_t*)&b->hdr->wake, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

/* Whether rank's process has exited (all LL ranks share this host). A pidfd turns readable
 * when the process exits, zombie or not; kill(pid, 0) would still see a zombie. Opened on the
 * first long wait for that rank only. */
static int llRankExited(struct ncclxLLBoard* b, const struct ncclxComm* comm, int rank) {
  if (rank == comm->rank) return 0;
  if (b->pidfds[rank] == -2) {
    b->pidfds[rank] = (int)syscall(SYS_pidfd_open, (pid_t)comm->peerInfo[rank].pid, 0);
    if (b->pidfds[rank] < 0 && errno == ESRCH) return 1; /* exited and already reaped */
  }
  if (b->pidfds[rank] < 0) return 0; /* no pidfd (old kernel, another pid namespace): timeout */
  struct pollfd p = {.fd = b->pidfds[rank], .events = POLLIN};
  return poll(&p, 1, 0) == 1;
}

/* One more round of waiting for *word >= want: spin, yield, then sleep up to 1 ms at a time
 * on the board's futex. Fails on abort, an abort notice or the comm's timeout; `who` names
 * what we wait for in the message. */
ncclxResult_t llWaitStep(llWaiter* w, _Atomic uint64_t* word, uint64_t want,
                                const char* who, int whoRank) {
  struct ncclxComm* comm = w->comm;
  if (w->polls == 0) w->spins = xferSpinPolls(comm);
  if (++w->polls < w->spins) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
    return ncclxSuccess;
  }
  if (w->start == 0) w->start = llNowSec();
  uint64_t now = llNowNs();
  if (w->yields == 0) w->yieldStartNs = now;
  if (w->yields < LL_YIELDS || now - w->yieldStartNs < LL_YIELD_NS) {
    w->yields++;
    sched_yield();
  } else {
    llHeader* h = w->b->hdr;
    atomic_fetch_add(&h->sleepers, 1);
    uint32_t seen = atomic_load(&h->wake);
    atomic_thread_fence(memory_order_seq_cst);
    if (atomic_load_explicit(word, memory_order_acquire) < want) {
      struct timespec ts = {0, 1000000};
      syscall(SYS_futex, (uint32_t*)&h->wake, FUTEX_WAIT, seen, &ts, NULL, 0);
    }
    atomic_fetch_sub(&h->sleepers, 1);
  }
  if ((w->polls & 63u) != 0) return ncclxSuccess;
  char desc[128];
  /* Before the abort notice: a root that wrote the other path and then aborted is named as
   * a mismatch, not as an abort (its stores are visible long before its notice, a socket
   * message, can arrive, unless this rank is descheduled between the two checks). */
  if (w->call) NCCLX_CHECK(llCrossCheck(w->call));
  NCCLX_CHECK(commPollAbort(comm));
  NCCLX_CHECK(waitNoteCheck(comm, &whoRank, 1, llNowSec() - w->start));
  /* A rank may write what we wait for and exit at once (its last barrier): its stores are
   * visible once it is gone, so look again before blaming it (unit.algos failed once so). */
  if (w->yields >= LL_YIELDS && llRankExited(w->b, comm, whoRank) &&
      atomic_load_explicit(word, memory_order_acquire) < want)
    return commFail(comm, ncclxRemoteError, "%s #%llu (LL protocol): %s exited while this rank "
                    "waited for %s", comm->curOpName ? comm->curOpName : "operation",
                    (unsigned long long)comm->curOpSeq,
                    commDescribeRank(comm, whoRank, desc, sizeof(desc)), who);
  if (comm->timeoutSec > 0 && llNowSec() - w->start > comm->timeoutSec) {
    char said[400] = "";
    waitNoteDescribe(comm, whoRank, said, 0, sizeof(said));
    return commFail(comm, ncclxRemoteError,
                    "timeout: no progress for %.0f s during %s #%llu (LL protocol), waiting for "
                    "%s of %s%s",
                    comm->timeoutSec, comm->curOpName ? comm->curOpName : "operation",
                    (unsigned long long)comm->curOpSeq, who,
                    commDescribeRank(comm, whoRank, desc, sizeof(desc)), said);
  }
  return ncclxSuccess;
}

/* ---------------- one call ---------------- */


/* "allreduce (float32 sum)", "broadcast (float32, root 0)" from a signature's fields. */
void llDescribe(char* buf, size_t size, int coll, int type, int op, int root) {
  const char* c = ncclxCollName(coll);
  const char* t = ncclxTypeName((ncclxDataType_t)type);
  const char* o = ncclxOpName((ncclxRedOp_t)op);
  if (coll == NCCLX_COLL_BARRIER) snprintf(buf, size, "%s", c);
  else if (coll == NCCLX_COLL_REDUCE) snprintf(buf, size, "%s (%s %s, root %d)", c, t, o, root);
  else if (coll == NCCLX_COLL_BROADCAST) snprintf(buf, size, "%s (%s, root %d)", c, t, root);
  else if (coll == NCCLX_COLL_ALLREDUCE || coll == NCCLX_COLL_REDUCESCATTER)
    snprintf(buf, size, "%s (%s %s)", c, t, o);
  else snprintf(buf, size, "%s (%s)", c, t);
}

ncclxResult_t llMismatch(struct ncclxComm* comm, const ncclxCollArgs* a, int peer,
                                uint64_t theirs) {
  char who[128], mine[96], other[96];
  /* A broadcast's lines are written by the rank that took itself for the root, whoever the
   * reader expected. */
  if ((int)(theirs >> 56) == NCCLX_COLL_BROADCAST) peer = (int)((theirs >> 32) & 0xff);
  llDescribe(other, sizeof(other), (int)(theirs >> 56), (int)((theirs >> 48) & 0xff),
             (int)((theirs >> 40) & 0xff), (int)((theirs >> 32) & 0xff));
  llDescribe(mine, sizeof(mine), a->coll, a->datatype, a->op, a->root & 0xff);
  int sameShape = (theirs >> 32) == (llSig(a) >> 32);
  return commFail(comm, ncclxInvalidUsage,
                  "%s #%llu: %s called %s%s where rank %d called %s with count %zu: "
                  "collectives differ across ranks",
                  ncclxCollName(a->coll), (unsigned long long)comm->curOpSeq,
                  commDescribeRank(comm, peer, who, sizeof(who)), other,
                  sameShape ? " with another count" : "", comm->rank, mine, a->count);
}



/* Bytes one round can carry per writer. */
static size_t llRoundBytes(const struct ncclxLLBoard* b, int nranks, ncclxCollType_t coll) {
  size_t lines = coll == NCCLX_COLL_BROADCAST ? (size_t)nranks * b->perRegion : b->perRegion;
  return lines * LL_PAYLOAD;
}

/* Writes src[0, bytes) into this rank's region, except lines wholly inside [skipLo, skipHi):
 * no other rank reads those (an all-to-all's own block), so no reader ever waits on one. */
/* A line's or cell's data (size bytes) from len <= size bytes of src, zero-padded, stored back
 * to back from a fixed-size copy (size is a constant once inlined): a reader polling the line
 * must not pull it away between the stores (an 8-byte copy loop measured 5x slower at 2 KiB). */
static inline void llFill(unsigned char* data, size_t size, const void* src, size_t len) {
  if (len == size) {
    memcpy(data, src, size);
    return;
  }
  unsigned char tail[LL_PAYLOAD] = {0};
  memcpy(tail, src, len);
  memcpy(data, tail, size);
}

void llWrite(llCall* c, const void* src, size_t bytes, size_t skipLo, size_t skipHi) {
  llLine* line = llRegion(c, c->comm->rank);
  size_t nlines = bytes ? (bytes + LL_PAYLOAD - 1) / LL_PAYLOAD : 1;
  for (size_t i = 0; i < nlines; i++) {
    size_t off = i * LL_PAYLOAD, len = bytes - off < LL_PAYLOAD ? bytes - off : LL_PAYLOAD;
    if (off >= skipLo && off + LL_PAYLOAD <= skipHi) continue;
    if (bytes) llFill(line[i].data, LL_PAYLOAD, (const char*)src + off, len);
    llMark(&line[i].flag, c->sig, c->seq);
  }
}

/* Lines read per wait: the writer stores its lines in order, each sequence number with
 * release, so once the last line of a group carries this call's number every earlier line
 * is there too. Waiting on every line instead made the reader pull lines one miss at a time
 * (4 KiB: 86 dependent misses); a group is copied with sequential loads the prefetcher
 * follows, while the writer is still storing the next group. */
#define LL_GROUP_LINES 8

/* Copy bytes [off, off + len) of rank's input for this call into dst. */
ncclxResult_t llRead(llCall* c, int rank, size_t off, size_t len, void* dst) {
  llLine* line = llRegion(c, rank);
  size_t first = off / LL_PAYLOAD, last = len ? (off + len - 1) / LL_PAYLOAD : first;
  size_t ready = first; /* lines [first, ready) are known to be written */
  for (size_t i = first; i <= last; i++) {
    if (i >= ready) {
      size_t wait = i + LL_GROUP_LINES - 1 < last ? i + LL_GROUP_LINES - 1 : last;
      while (atomic_load_explicit(&line[wait].flag.seq, memory_order_acquire) < c->seq)
        NCCLX_CHECK(llWaitStep(&c->w, &line[wait].flag.seq, c->seq, "the contribution", rank));
      ready = wait + 1;
    }
    if (line[i].flag.sig != c->sig) return llMismatch(c->comm, c->a, rank, line[i].flag.sig);
    if (!len) continue;
    size_t lo = i == first ? off - i * LL_PAYLOAD : 0;
    size_t hi = i == last ? off + len - i * LL_PAYLOAD : LL_PAYLOAD;
    char* to = (char*)dst + (i * LL_PAYLOAD + lo - off);
    if (hi - lo == LL_PAYLOAD) memcpy(to, line[i].data, LL_PAYLOAD); /* inlined, fixed size */
    else memcpy(to, line[i].data + lo, hi - lo);
  }
  return ncclxSuccess;
}

/* Waits until every rank has finished call want, and remembers the least they have finished. */
__attribute__((noinline)) ncclxResult_t llWaitDone(llCall* c, uint64_t want) {
  struct ncclxLLBoard* b = c->b;
  uint64_t least = UINT64_MAX;
  for (int r = 0; r < c->comm->nranks; r++) {
    uint64_t d;
    while ((d = atomic_load_explicit(&b->ctl[r].done, memory_order_acquire)) < want)
      NCCLX_CHECK(llWaitStep(&c->w, &b->ctl[r].done, want, "the end of the previous call", r));
    if (d < least) least = d;
  }
  b->knownDone = least;
  return ncclxSuccess;
}


/* dst = fold of op over every rank's [off, off + bytes), in rank order. */
static ncclxResult_t llReduceAll(llCall* c, size_t off, size_t count, void* dst) {
  const ncclxCollArgs* a = c->a;
  size_t bytes = count * dataTypeSize(a->datatype);
  _Alignas(64) unsigned char tmp[COLL_LL_MAX_BYTES_LIMIT];
  /* Our own input straight from the send buffer, unless dst overwrites it (in place). */
  const char* own = (const char*)a->sendbuff + off;
  uintptr_t o = (uintptr_t)own, d = (uintptr_t)dst;
  int ownDirect = bytes && (o + bytes <= d || d + bytes <= o);
  int me = c->comm->rank;
  if (me == 0 && ownDirect) memcpy(dst, own, bytes);
  else NCCLX_CHECK(llRead(c, 0, off, bytes, dst));
  for (int r = 1; r < c->comm->nranks; r++) {
    const void* src = own;
    if (r != me || !ownDirect) {
      NCCLX_CHECK(llRead(c, r, off, bytes, tmp));
      src = tmp;
    }
    ncclxReduce2(dst, dst, src, count, a->datatype, a->op);
  }
  if (a->op == ncclxAvg) ncclxAvgFinish(dst, count, a->datatype, c->comm->nranks);
  return ncclxSuccess;
}

/* A ring cell of ours holds another call: the root has made more or fewer LL calls than this
 * rank before this one (a bank's line cannot, as its position follows the sequence number). */
ncclxResult_t llOtherCall(const llCall* c, int root, uint64_t theirs) {
  char who[128];
  return commFail(c->comm, ncclxInvalidUsage,
                  "%s #%llu: %s wrote its LL call %llu where rank %d reads its call %llu: the "
                  "ranks' sequences of collectives differ (a call skipped or added on some rank)",
                  ncclxCollName(c->a->coll), (unsigned long long)c->comm->curOpSeq,
                  commDescribeRank(c->comm, root, who, sizeof(who)), (unsigned long long)theirs,
                  c->comm->rank, (unsigned long long)c->seq);
}

/* A broadcast round of at most LL_RING_MAX_BYTES through the ring (see llCell): the root
 * writes its cells in order, each sequence number with release, so a reader waits on the
 * last one only. */
static ncclxResult_t llRingRound(llCall* c, size_t bytes) {
  struct ncclxLLBoard* b = c->b;
  const ncclxCollArgs* a = c->a;
  size_t cells = bytes ? (bytes + LL_CELL_DATA - 1) / LL_CELL_DATA : 1;
  size_t at = b->ringPos + cells <= LL_RING_CELLS ? b->ringPos : 0;
  b->ringPos = at + cells;
  c->cell = b->ring + at;
  c->cells = cells;
  llCell* cell = c->cell;
  if (c->comm->rank == a->root) {
    NCCLX_CHECK(llWaitReusable(c, LL_RING_REUSE));
    for (size_t i = 0; i < cells; i++) {
      size_t off = i * LL_CELL_DATA, len = bytes - off < LL_CELL_DATA ? bytes - off : LL_CELL_DATA;
      if (bytes) llFill(cell[i].data, LL_CELL_DATA, (const char*)a->sendbuff + off, len);
      llMark(&cell[i].flag, c->sig, c->seq);
    }
    llWakeSleepers(b);
    if (bytes && a->recvbuff != a->sendbuff) memmove(a->recvbuff, a->sendbuff, bytes);
  } else {
    _Atomic uint64_t* last = &cell[cells - 1].flag.seq;
    while (atomic_load_explicit(last, memory_order_acquire) < c->seq)
      NCCLX_CHECK(llWaitStep(&c->w, last, c->seq, "the contribution", a->root));
    for (size_t i = 0; i < cells; i++) {
      uint64_t seq = atomic_load_explicit(&cell[i].flag.seq, memory_order_relaxed);
      if (seq != c->seq) return llOtherCall(c, a->root, seq);
      if (cell[i].flag.sig != c->sig) return llMismatch(c->comm, c->a, a->root, cell[i].flag.sig);
      size_t off = i * LL_CELL_DATA, len = bytes - off < LL_CELL_DATA ? bytes - off : LL_CELL_DATA;
      if (len == LL_CELL_DATA) memcpy((char*)a->recvbuff + off, cell[i].data, LL_CELL_DATA);
      else if (len) memcpy((char*)a->recvbuff + off, cell[i].data, len);
    }
    /* A reader of back-to-back broadcasts finds the root calls ahead, so the next call's
     * cells (most likely as many, from ringPos) are already written: fetching them now
     * overlaps their misses with the caller's work between calls. 2 ranks, 64 bytes: 0.16
     * -> 0.10 us in five code layouts (Open MPI 0.12). */
    size_t next = b->ringPos + cells <= LL_RING_CELLS ? b->ringPos : 0;
    for (size_t i = next & ~(size_t)1; i < next + cells; i += 2) __builtin_prefetch(&b->ring[i], 0, 3);
  }
  atomic_store_explicit(&b->ctl[c->comm->rank].done, c->seq, memory_order_release);
  llWakeSleepers(b); /* a root may be asleep waiting to reuse a cell */
  return ncclxSuccess;
}

/* Another signature at this call's sequence number in a ring cell or the first line of a
 * bank region means some rank made another call here, one whose flag is where this rank does
 * not wait: the other path (ring, lines or bulk area), or the same path with another layout
 * (a bulk round flags only its writer's first line; a line round waits on a later line).
 * Checked while a wait is long: such a call then fails as a mismatch instead of timing out.
 * The signature is read after the sequence number (acquire): read before, it could be the
 * previous call's. */
static int llForeign(const llCall* c, llFlag* f, uint64_t* theirs) {
  if (atomic_load_explicit(&f->seq, memory_order_acquire) != c->seq) return 0;
  *theirs = f->sig;
  return *theirs != c->sig;
}

ncclxResult_t llCrossCheck(const llCall* c) {
  const struct ncclxLLBoard* b = c->b;
  uint64_t theirs;
  /* A ring writer's first cell: at the position every rank shares, or at cell 0 if its call
   * did not fit before the end. */
  llCell* first[2] = {&b->ring[c->ringAt < LL_RING_CELLS ? c->ringAt : 0], &b->ring[0]};
  for (int i = 0; i < 2; i++)
    if (llForeign(c, &first[i]->flag, &theirs))
      return llMismatch(c->comm, c->a, (int)((theirs >> 32) & 0xff), theirs);
  for (int r = 0; r < c->comm->nranks; r++) { /* a bank call: every writer's first line */
    llLine* line = c->bank + (size_t)r * b->perRegion;
    if (llForeign(c, &line->flag, &theirs)) {
      int bcast = (int)(theirs >> 56) == NCCLX_COLL_BROADCAST;
      return llMismatch(c->comm, c->a, bcast ? (int)((theirs >> 32) & 0xff) : r, theirs);
    }
  }
  return ncclxSuccess;
}

/* One round through the board: the whole call a. */
static ncclxResult_t llRound(struct ncclxComm* comm, const ncclxCollArgs* a) {
  int n = comm->nranks, me = comm->rank;
  size_t sz = a->coll == NCCLX_COLL_BARRIER ? 1 : dataTypeSize(a->datatype);
  llCall c; /* every field set below (see llWaiterInit) */
  c.comm = comm, c.a = a;
  NCCLX_CHECK(llBoard(comm, &c.b));
  c.seq = ++c.b->seq;
  c.sig = llSig(a);
  c.bank = c.b->lines + (size_t)(c.seq & (c.b->banks - 1)) * (size_t)n * c.b->perRegion;
  c.cell = NULL, c.cells = 0, c.ringAt = c.b->ringPos;
  llWaiterInit(&c.w, comm, c.b);
  c.w.call = &c;

  size_t in = a->count * sz; /* bytes this rank contributes */
  if (a->coll == NCCLX_COLL_REDUCESCATTER || a->coll == NCCLX_COLL_ALLTOALL) in *= (size_t)n;
  if (a->coll == NCCLX_COLL_BARRIER) in = 0;
  if (in > llRoundBytes(c.b, n, a->coll))
    return commFail(comm, ncclxInternalError, "LL protocol: %zu bytes do not fit a %zu-byte region",
                    in, llRoundBytes(c.b, n, a->coll));
  if (a->coll == NCCLX_COLL_BROADCAST && in <= LL_RING_MAX_BYTES) return llRingRound(&c, in);
  int writes = a->coll != NCCLX_COLL_BROADCAST || me == a->root;
  if (writes) {
    NCCLX_CHECK(llWaitReusable(&c, c.b->banks));
    size_t own = a->count * sz; /* an all-to-all's own block stays here: 1/n fewer lines */
    if (a->coll == NCCLX_COLL_ALLTOALL) llWrite(&c, a->sendbuff, in, (size_t)me * own, (size_t)(me + 1) * own);
    else llWrite(&c, a->sendbuff, in, 0, 0);
    llWakeSleepers(c.b);
  }

  int readAll = 1; /* read a line of every rank: they all finished the previous call */
  size_t bytes = a->count * sz;
  char* recv = a->recvbuff;
  switch (a->coll) {
    case NCCLX_COLL_ALLREDUCE:
      NCCLX_CHECK(llReduceAll(&c, 0, a->count, recv));
      break;
    case NCCLX_COLL_REDUCE:
      if (me == a->root) NCCLX_CHECK(llReduceAll(&c, 0, a->count, recv));
      else readAll = 0;
      break;
    case NCCLX_COLL_REDUCESCATTER:
      NCCLX_CHECK(llReduceAll(&c, (size_t)me * bytes, a->count, recv));
      break;
    case NCCLX_COLL_BROADCAST:
      readAll = 0;
      if (me == a->root) {
        if (bytes && recv != a->sendbuff) memmove(recv, a->sendbuff, bytes);
      } else {
        NCCLX_CHECK(llRead(&c, a->root, 0, bytes, recv));
      }
      break;
    case NCCLX_COLL_ALLGATHER: /* our own block from the send buffer (if not in place) */
      for (int r = 0; r < n; r++) {
        char* to = recv + (size_t)r * bytes;
        if (r != me) NCCLX_CHECK(llRead(&c, r, 0, bytes, to));
        else if (bytes && to != (const char*)a->sendbuff) memmove(to, a->sendbuff, bytes);
      }
      break;
    case NCCLX_COLL_ALLTOALL: /* in place, our own block is already where it goes */
      for (int r = 0; r < n; r++) {
        char* to = recv + (size_t)r * bytes;
        const char* mine = (const char*)a->sendbuff + (size_t)me * bytes;
        if (r != me) NCCLX_CHECK(llRead(&c, r, (size_t)me * bytes, bytes, to));
        else if (bytes && to != mine) memmove(to, mine, bytes);
      }
      break;
    case NCCLX_COLL_BARRIER:
      for (int r = 0; r < n; r++) NCCLX_CHECK(llRead(&c, r, 0, 0, NULL));
      break;
    default:
      return commFail(comm, ncclxInternalError, "LL protocol cannot run %s",
                      ncclxCollName(a->coll));
  }
  if (readAll && c.seq - 1 > c.b->knownDone) c.b->knownDone = c.seq - 1;
  atomic_store_explicit(&c.b->ctl[me].done, c.seq, memory_order_release);
  llWakeSleepers(c.b); /* a writer may be asleep waiting to reuse a bank */
  return ncclxSuccess;
}

/* A broadcast larger than a bank of lines goes through the bulk area: the root writes every
 * byte once and every other rank reads it once, where a ring copies it twice per hop through
 * the shared-memory transport (n ranks: n + 1 copies against 2 (n - 1)), which is what counts
 * when ranks share CPUs. */
ncclxResult_t collLLRun(struct ncclxComm* comm, const ncclxCollArgs* a) {
  size_t total = a->count * dataTypeSize(a->datatype);
  /* At most a line's payload never goes bulk: a region has a line at least. */
  if (total > LL_PAYLOAD && ((a->coll == NCCLX_COLL_ALLGATHER && llGatherBulk(total)) ||
                             (a->coll == NCCLX_COLL_BROADCAST && llBcastBulk(comm->nranks, total))))
    return llBulkRun(comm, a);
  return llRound(comm, a);
}
