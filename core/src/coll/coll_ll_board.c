/* The LL board: how large calls may be and how many rounds they take, and the board itself
 * (created by rank 0, opened and mapped by the others, freed with the communicator). */
#include "coll/coll_ll_internal.h"

static size_t llMaxBytesValue;
static pthread_once_t llMaxOnce = PTHREAD_ONCE_INIT;
static void llReadMax(void) {
  size_t v = LL_DEFAULT_MAX_BYTES;
  if (ncclxConfigGetSize("core", "ll_max_bytes", v, &v) != ncclxSuccess) v = LL_DEFAULT_MAX_BYTES;
  if (v > COLL_LL_MAX_BYTES_LIMIT) {
    WARN("[core] ll_max_bytes %zu is above the limit %zu; using the limit", v,
         (size_t)COLL_LL_MAX_BYTES_LIMIT);
    v = COLL_LL_MAX_BYTES_LIMIT;
  }
  llMaxBytesValue = v;
}
size_t collLLMaxBytes(void) {
  pthread_once(&llMaxOnce, llReadMax);
  return llMaxBytesValue;
}

/* Bytes one rank writes for a call of callBytes (tuneCallBytes). */
static size_t llInputBytes(const struct ncclxComm* comm, ncclxCollType_t coll, size_t callBytes) {
  return coll == NCCLX_COLL_ALLGATHER ? callBytes / (size_t)comm->nranks : callBytes;
}

int collLLRunnable(const struct ncclxComm* comm, ncclxCollType_t coll, size_t callBytes) {
  if (collLLMaxBytes() == 0 || coll == NCCLX_COLL_ALLTOALLV || comm->nranks < 2 || comm->nranks > COLL_LL_MAX_RANKS ||
      comm->nhosts != 1 || !comm->tp[NCCLX_TP_SHM].net)
    return 0;
  /* A broadcast or all-gather of any size runs piece by piece (collLLRun). */
  if ((coll != NCCLX_COLL_BROADCAST && coll != NCCLX_COLL_ALLGATHER &&
       llInputBytes(comm, coll, callBytes) > collLLMaxBytes()) ||
      !comm->peerInfo)
    return 0;
  for (int r = 0; r < comm->nranks; r++)
    if (!comm->peerInfo[r].shmEnabled) return 0;
  return 1;
}

/* Lines of one rank's region in a bank: what [core] ll_max_bytes needs, at least one. */
size_t llRegionLines(void) {
  size_t lines = (collLLMaxBytes() + LL_PAYLOAD - 1) / LL_PAYLOAD;
  return lines ? lines : 1;
}

/* Bytes of one rank's bulk region: the most that fits the budget, a multiple of 4 KiB. */
size_t llBulkBytes(int nranks) {
  size_t b = LL_BULK_BUDGET / LL_BULK_BANKS / (size_t)(nranks > 0 ? nranks : 1);
  if (b > LL_BULK_MAX_BYTES) b = LL_BULK_MAX_BYTES;
  b &= ~(LL_BULK_MIN_BYTES - 1);
  return b < LL_BULK_MIN_BYTES ? LL_BULK_MIN_BYTES : b;
}

/* An all-gather goes through the bulk area once a rank's block outgrows its line region, a
 * broadcast once it outgrows a bank of lines (every rank's region). */
int llGatherBulk(size_t blockBytes) { return blockBytes > llRegionLines() * LL_PAYLOAD; }
int llBcastBulk(int nranks, size_t bytes) {
  return bytes > (size_t)nranks * llRegionLines() * LL_PAYLOAD;
}
/* Bytes of one round of a bulk broadcast: the whole bulk bank. */
size_t llBcastBulkBytes(int nranks) { return (size_t)nranks * llBulkBytes(nranks); }

size_t collLLRounds(const struct ncclxComm* comm, ncclxCollType_t coll, size_t callBytes) {
  if (coll == NCCLX_COLL_ALLGATHER && collLLMaxBytes() > 0) {
    size_t blk = llInputBytes(comm, coll, callBytes), bulk = llBulkBytes(comm->nranks);
    return llGatherBulk(blk) ? (blk + bulk - 1) / bulk : 1;
  }
  if (coll != NCCLX_COLL_BROADCAST || collLLMaxBytes() == 0 || !llBcastBulk(comm->nranks, callBytes))
    return 1;
  size_t round = llBcastBulkBytes(comm->nranks);
  return (callBytes + round - 1) / round;
}

int collLLLineRound(const struct ncclxComm* comm, ncclxCollType_t coll, size_t callBytes) {
  if (coll == NCCLX_COLL_ALLGATHER) return !llGatherBulk(llInputBytes(comm, coll, callBytes));
  if (coll == NCCLX_COLL_BROADCAST) return !llBcastBulk(comm->nranks, callBytes);
  return 1;
}

double collLLModelCost(const struct ncclxComm* comm, ncclxCollType_t coll, size_t callBytes,
                       double alphaUs, double betaUsPerByte, double gammaUsPerByte) {
  /* What a rank reads from the others' lines (its own part comes from its send buffer). */
  double n = comm->nranks, in = (double)llInputBytes(comm, coll, callBytes);
  double read = 0, reduce = 0;
  switch (coll) {
    case NCCLX_COLL_ALLREDUCE:
    case NCCLX_COLL_REDUCE: read = reduce = (n - 1) * in; break;
    case NCCLX_COLL_REDUCESCATTER: read = reduce = (n - 1) * in / n; break;
    case NCCLX_COLL_ALLTOALL: read = (n - 1) * in / n; break; /* in: the whole send buffer */
    case NCCLX_COLL_BROADCAST: read = in; break;
    case NCCLX_COLL_BARRIER: read = n * 64; break; /* one line per rank */
    default: read = (n - 1) * in; break; /* allgather */
  }
  /* Reading a line another core just wrote costs a cache-line transfer per 48 bytes. */
  return alphaUs + (in + read) * betaUsPerByte + reduce * gammaUsPerByte;
}

/* ---------------- the board ---------------- */

static uint64_t llBanks(int nranks, size_t perRegion) {
  size_t bank = (size_t)nranks * perRegion * sizeof(llLine);
  uint64_t banks = LL_MAX_BANKS;
  while (banks > LL_MIN_BANKS && banks * bank > LL_BANK_BUDGET) banks /= 2;
  return banks;
}

/* Offset of the bulk area: after the lines, on a page boundary. */
static size_t llBulkOffset(int nranks, size_t perRegion, uint64_t banks) {
  size_t end = sizeof(llHeader) + (size_t)nranks * sizeof(llCtl) + LL_RING_CELLS * sizeof(llCell) +
               (size_t)banks * (size_t)nranks * perRegion * sizeof(llLine);
  return (end + 4095) & ~(size_t)4095;
}

static size_t llBoardBytes(int nranks, size_t perRegion, uint64_t banks) {
  return llBulkOffset(nranks, perRegion, banks) +
         (size_t)LL_BULK_BANKS * (size_t)nranks * llBulkBytes(nranks);
}


/* Bounded wait during setup (for rank 0, who creates the board): 0 to retry, an error when
 * the comm failed or time ran out. */
ncclxResult_t llSetupPause(struct ncclxComm* comm, double start, const char* what) {
  NCCLX_CHECK(commPollAbort(comm));
  int creator = 0;
  NCCLX_CHECK(waitNoteCheck(comm, &creator, 1, llNowSec() - start));
  if (comm->timeoutSec > 0 && llNowSec() - start > comm->timeoutSec) {
    char said[400] = "";
    waitNoteDescribe(comm, creator, said, 0, sizeof(said));
    return commFail(comm, ncclxRemoteError, "LL protocol: timeout after %.0f s waiting for %s%s",
                    comm->timeoutSec, what, said);
  }
  usleep(50);
  return ncclxSuccess;
}

static ncclxResult_t llMapFd(struct ncclxComm* comm, struct ncclxLLBoard* b, int fd) {
  b->map = mmap(NULL, b->mapBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (b->map == MAP_FAILED) {
    b->map = NULL;
    return commFail(comm, ncclxSystemError, "LL protocol: cannot map %s (%zu bytes): %s",
                    b->name, b->mapBytes, strerror(errno));
  }
  b->hdr = b->map;
  b->ctl = (llCtl*)((char*)b->map + sizeof(llHeader));
  b->ring = (llCell*)(b->ctl + comm->nranks);
  b->lines = (llLine*)(b->ring + LL_RING_CELLS);
  b->bulk = (char*)b->map + llBulkOffset(comm->nranks, b->perRegion, b->banks);
  return ncclxSuccess;
}

static ncclxResult_t llCreate(struct ncclxComm* comm, struct ncclxLLBoard* b) {
  int fd = shm_open(b->name, O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0)
    return commFail(comm, ncclxSystemError, "LL protocol: cannot create /dev/shm%s: %s", b->name,
                    strerror(errno));
  /* The lines' pages are taken now (every LL call cycles through the banks), so a full
   * /dev/shm is an error here instead of SIGBUS at a first touch; the bulk area's only when an
   * all-gather or broadcast first uses it (llBulkPopulate). */
  size_t lineBytes = llBulkOffset(comm->nranks, b->perRegion, b->banks);
  int e = ftruncate(fd, (off_t)b->mapBytes) != 0 ? errno : posix_fallocate(fd, 0, (off_t)lineBytes);
  if (e != 0) {
    close(fd);
    shm_unlink(b->name);
    return commFail(comm, ncclxSystemError, "LL protocol: cannot make /dev/shm%s %zu bytes: %s",
                    b->name, b->mapBytes, strerror(e));
  }
  ncclxResult_t res = llMapFd(comm, b, fd);
  if (res != ncclxSuccess) {
    shm_unlink(b->name);
    return res;
  }
  b->hdr->magic = LL_MAGIC;
  b->hdr->commHash = comm->commHash;
  b->hdr->lines = b->perRegion;
  b->hdr->nranks = (uint32_t)comm->nranks;
  atomic_store_explicit(&b->hdr->ready, LL_READY, memory_order_release);
  return ncclxSuccess;
}

static ncclxResult_t llOpen(struct ncclxComm* comm, struct ncclxLLBoard* b) {
  double start = llNowSec();
  char what[160];
  snprintf(what, sizeof(what), "rank 0 to create the LL board /dev/shm%s", b->name);
  for (;;) {
    int fd = shm_open(b->name, O_RDWR, 0);
    if (fd >= 0) {
      struct stat st;
      if (fstat(fd, &st) == 0 && (size_t)st.st_size == b->mapBytes) {
        NCCLX_CHECK(llMapFd(comm, b, fd));
        break;
      }
      if (fstat(fd, &st) == 0 && (size_t)st.st_size > b->mapBytes) {
        close(fd);
        return commFail(comm, ncclxInvalidUsage,
                        "LL protocol: board /dev/shm%s has %zu bytes, this rank expects %zu "
                        "(different [core] ll_max_bytes on different ranks?)",
                        b->name, (size_t)st.st_size, b->mapBytes);
      }
      close(fd); /* rank 0 has not sized it yet */
    } else if (errno != ENOENT) {
      return commFail(comm, ncclxSystemError, "LL protocol: cannot open /dev/shm%s: %s", b->name,
                      strerror(errno));
    }
    NCCLX_CHECK(llSetupPause(comm, start, what));
  }
  while (atomic_load_explicit(&b->hdr->ready, memory_order_acquire) != LL_READY)
    NCCLX_CHECK(llSetupPause(comm, start, what));
  if (b->hdr->magic != LL_MAGIC || b->hdr->commHash != comm->commHash ||
      b->hdr->nranks != (uint32_t)comm->nranks || b->hdr->lines != b->perRegion)
    return commFail(comm, ncclxInvalidUsage,
                    "LL protocol: board /dev/shm%s describes %u ranks x %llu lines, this rank "
                    "expects %d x %zu (different [core] ll_max_bytes on different ranks?)",
                    b->name, b->hdr->nranks, (unsigned long long)b->hdr->lines, comm->nranks,
                    b->perRegion);
  return ncclxSuccess;
}

__attribute__((noinline)) ncclxResult_t llBoardCreate(struct ncclxComm* comm,
                                                            struct ncclxLLBoard** out) {
  struct ncclxLLBoard* b = calloc(1, sizeof(*b));
  if (!b) return commFail(comm, ncclxSystemError, "LL protocol: out of memory");
  b->pidfds = malloc((size_t)comm->nranks * sizeof(int));
  if (!b->pidfds) {
    free(b);
    return commFail(comm, ncclxSystemError, "LL protocol: out of memory");
  }
  for (int r = 0; r < comm->nranks; r++) b->pidfds[r] = -2; /* not opened yet */
  b->perRegion = llRegionLines();
  b->banks = llBanks(comm->nranks, b->perRegion);
  b->bulkBytes = llBulkBytes(comm->nranks);
  b->mapBytes = llBoardBytes(comm->nranks, b->perRegion, b->banks);
  /* Matches the shm transport's stale-object pattern: removed if rank 0's process dies. */
  snprintf(b->name, sizeof(b->name), "/ncclx-%d-%016llx", comm->peerInfo[0].pid,
           (unsigned long long)(comm->commHash ^ LL_MAGIC));
  ncclxResult_t res = comm->rank == 0 ? llCreate(comm, b) : llOpen(comm, b);
  if (res != ncclxSuccess) {
    if (b->map) munmap(b->map, b->mapBytes);
    free(b->pidfds);
    free(b);
    return res;
  }
  /* The probe page the others try mapping before reading this rank's buffers (llMapUpdate). */
  llCtl* own = &b->ctl[comm->rank];
  own->probeFd = -1;
  if (!peersSingleCopyAllowed() || shmMemProbe(&own->probeFd, &own->probeId) != 0) own->probeFd = -1;
  atomic_store_explicit(&own->mapState, LL_MAP_PROBE_SET, memory_order_release);
  if (atomic_fetch_add(&b->hdr->attached, 1) + 1 == (uint32_t)comm->nranks) {
    shm_unlink(b->name); /* everyone has it: nothing left behind, whatever happens next */
    b->unlinked = 1;
  }
  INFO(NCCLX_LOG_INIT, "LL protocol: board /dev/shm%s, %zu bytes (%d ranks x %zu bytes x %llu banks)",
       b->name, b->mapBytes, comm->nranks, b->perRegion * LL_PAYLOAD, (unsigned long long)b->banks);
  comm->ll = b;
  *out = b;
  return ncclxSuccess;
}


void collLLCommFree(struct ncclxComm* comm) {
  struct ncclxLLBoard* b = comm->ll;
  if (!b) return;
  /* Rank 0 removes the name if some rank never attached (the others time out). */
  if (comm->rank == 0 && !b->unlinked &&
      atomic_load(&b->hdr->attached) < (uint32_t)comm->nranks)
    shm_unlink(b->name);
  if (b->mappedRounds)
    INFO(NCCLX_LOG_COLL, "LL protocol: %llu broadcast rounds read from mapped ncclxMemAlloc buffers",
         (unsigned long long)b->mappedRounds);
  for (int r = 0; b->maps && r < comm->nranks; r++) shmMapCacheClear(&b->maps[r]);
  free(b->maps);
  munmap(b->map, b->mapBytes);
  for (int r = 0; b->pidfds && r < comm->nranks; r++)
    if (b->pidfds[r] >= 0) close(b->pidfds[r]);
  free(b->pidfds);
  free(b);
  comm->ll = NULL;
}
