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
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "coll/coll_ll.h"
#include "util/copy_nt.h"
#include "config/config.h"
#include "util/debug.h"
#include "transport/peers.h"
#include "sched/waitnote.h"
#include "util/reduce.h"
#include "transport/shm/shm_mem.h"
#include "sched/xfer.h"

#define LL_PAYLOAD 48
/* Banks in turn: a rank that only writes (a broadcast root, a reduce's non-roots) may run as
 * many calls ahead of the slowest reader as there are banks before it waits. Deep run-ahead
 * lets a rank that gets a CPU late catch up on several calls at once: 64 banks instead of 4
 * made small broadcasts 2x faster at 4 and 8 ranks on 2 CPUs. The count is the largest power
 * of two from LL_MIN_BANKS to LL_MAX_BANKS whose banks fit LL_BANK_BUDGET, so the board
 * stays small with many ranks or a large ll_max_bytes; every rank computes the same. */
#define LL_MIN_BANKS 4
#define LL_MAX_BANKS 64
#define LL_BANK_BUDGET ((size_t)4 << 20)
#define LL_MAGIC 0x6472616f624c4c78ull /* "xLLboard" */
#define LL_READY 0x59444552u
#define LL_DEFAULT_MAX_BYTES 4096
#define LL_YIELDS 200u
#define LL_YIELD_NS 200000ull
/* All-gathers larger than a line region and broadcasts larger than a bank of lines go
 * through the board's bulk area instead: per rank and bank one region of plain bytes (a
 * broadcast's root fills the whole bank), the flag the first line of the writer's line region
 * in the bank of the same call (so its signature is checked as an LL call's). Lines cost 4/3
 * of the bytes and a flag per 48; a bulk region is one memcpy and one flag. Its banks are the
 * first LL_BULK_BANKS of the line banks' turn (LL_BULK_BANKS <= LL_MIN_BANKS), so waiting to
 * reuse a bulk bank also covers the line bank. Regions are at most LL_BULK_MAX_BYTES, and
 * all of them fit LL_BULK_BUDGET (pages are only touched by the calls that use them). */
#define LL_BULK_BANKS 4
#define LL_BULK_BUDGET ((size_t)4 << 20)
#define LL_BULK_MAX_BYTES ((size_t)256 << 10)
#define LL_BULK_MIN_BYTES ((size_t)4 << 10)
_Static_assert(LL_BULK_BANKS <= LL_MIN_BANKS, "a bulk bank's reuse wait covers its line bank");

/* What says which call wrote a line or ring cell: its signature, then its sequence number,
 * stored last (release; llMark), so a reader that sees the number sees the data too. */
typedef struct {
  uint64_t sig;         /* llSig() of the call */
  _Atomic uint64_t seq; /* the call's sequence number */
} llFlag;

static void llMark(llFlag* f, uint64_t sig, uint64_t seq) {
  f->sig = sig;
  atomic_store_explicit(&f->seq, seq, memory_order_release);
}

typedef struct {
  unsigned char data[LL_PAYLOAD];
  llFlag flag;
} llLine;
_Static_assert(sizeof(llLine) == 64, "an LL line is one cache line");

typedef struct {
  _Atomic uint64_t done; /* last LL call this rank finished */
  /* Whether this rank can map the others' ncclxMemAlloc allocations (llMapUpdate): LL_MAP_*,
   * and the probe page they try it on (shmMemProbe; fd -1: none). */
  _Atomic uint64_t mapState;
  uint64_t probeId;
  int32_t probeFd;
  char pad[36];
} llCtl;
_Static_assert(sizeof(llCtl) == 64, "a rank's control line is one cache line");
enum { LL_MAP_UNKNOWN = 0, LL_MAP_PROBE_SET = 1, LL_MAP_YES = 2, LL_MAP_NO = 3 };

/* A bulk broadcast round's flag line, data part: the root's buffer (mapped rounds) or none
 * (the bytes are in the bulk bank). */
#define LL_MAPPED_ROUND 0x646e756f7270616dull /* "maproun d" */
typedef struct {
  uint64_t magic; /* LL_MAPPED_ROUND, or 0 */
  shmMemRef ref;  /* the round's bytes: ref.offset of the root's allocation ref.id */
} llRoundRef;
_Static_assert(sizeof(llRoundRef) <= LL_PAYLOAD, "a round's reference fits its flag line");

/* Small broadcasts go through a ring of 32-byte cells (16 bytes of data, the signature and the
 * sequence number), consecutive calls in consecutive cells: a reader then finds two 8-byte
 * calls per cache line and the next call's line next to this one, where a bank's first line is
 * 11 KiB from the next bank's (a page, and a TLB entry, per call). 2 ranks, alternating runs,
 * medians: 8 bytes 0.154 us against 0.167 through the banks (0.211 against 0.267 in this VM's
 * slow state), 64 bytes 0.154 against 0.171 (docs/performance-history.md, session 8). A round takes
 * max(1, ceil(bytes / 16)) cells from the ring position every rank keeps alike (b->ringPos) and
 * starts over at cell 0 when it would cross the end. */
#define LL_CELL_DATA 16
#define LL_RING_CELLS 512
#define LL_RING_MAX_CELLS 4
#define LL_RING_MAX_BYTES (LL_RING_MAX_CELLS * LL_CELL_DATA)
/* A call moves the position at most 2 * LL_RING_MAX_CELLS - 1 cells (with the skip to cell 0),
 * and a cell is written again only after the position went once round the ring, at least
 * LL_RING_CELLS - LL_RING_MAX_CELLS + 1 cells: so no sooner than this many calls later. */
#define LL_RING_REUSE (LL_RING_CELLS / (2 * LL_RING_MAX_CELLS))
_Static_assert(LL_RING_REUSE * (2 * LL_RING_MAX_CELLS - 1) < LL_RING_CELLS - LL_RING_MAX_CELLS + 1,
               "a ring cell is rewritten only after LL_RING_REUSE calls");

typedef struct {
  unsigned char data[LL_CELL_DATA];
  llFlag flag;
} llCell;
_Static_assert(sizeof(llCell) == 32, "two ring cells per cache line");
_Static_assert(LL_CELL_DATA <= LL_PAYLOAD, "llFill pads a cell through a line-sized buffer");

typedef struct {
  uint64_t magic, commHash, lines; /* lines per region */
  uint32_t nranks;
  _Atomic uint32_t ready, attached;
  char pad0[28];
  _Alignas(64) _Atomic uint32_t sleepers; /* ranks asleep in llWaitStep */
  _Atomic uint32_t wake;                    /* futex word: bumped when sleepers may proceed */
  char pad1[56];
  /* Per bulk bank: seq << 8 | rank of the last broadcast root that claimed it (llBcastClaim). */
  _Alignas(64) _Atomic uint64_t bulkRoot[LL_BULK_BANKS];
  char pad2[64 - 8 * LL_BULK_BANKS];
} llHeader;
_Static_assert(sizeof(llHeader) == 192, "LL header is three lines");
_Static_assert(COLL_LL_MAX_RANKS <= 256, "a bulk bank's claim holds the root in 8 bits");

struct ncclxLLBoard {
  char name[64];
  void* map;
  size_t mapBytes;
  llHeader* hdr;
  llCtl* ctl;
  llCell* ring;  /* LL_RING_CELLS cells */
  llLine* lines; /* [bank][rank][line] */
  char* bulk;    /* [bulk bank][rank][bulkBytes] */
  size_t perRegion, bulkBytes;
  uint64_t banks;     /* a power of two */
  uint64_t seq;       /* last call started */
  size_t ringPos;     /* the ring cell the next small broadcast starts at */
  uint64_t knownDone; /* every rank has finished at least this call */
  int unlinked;
  int bulkReady; /* this rank made sure the bulk area's pages exist (llBulkPopulate) */
  int mapAll;    /* LL_MAP_YES: every rank can map every other's allocations (llMapUpdate) */
  shmMapCache* maps;      /* per root rank, allocations mapped for mapped rounds */
  uint64_t mappedRounds;  /* rounds this rank read from a mapping */
  ncclxSharedCopy bulkCopy; /* this rank's copies into the bulk area: plain or non-temporal */
  int* pidfds; /* per rank, opened when a wait on that rank gets long; -1 if not (yet) */
};

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
static size_t llRegionLines(void) {
  size_t lines = (collLLMaxBytes() + LL_PAYLOAD - 1) / LL_PAYLOAD;
  return lines ? lines : 1;
}

/* Bytes of one rank's bulk region: the most that fits the budget, a multiple of 4 KiB. */
static size_t llBulkBytes(int nranks) {
  size_t b = LL_BULK_BUDGET / LL_BULK_BANKS / (size_t)(nranks > 0 ? nranks : 1);
  if (b > LL_BULK_MAX_BYTES) b = LL_BULK_MAX_BYTES;
  b &= ~(LL_BULK_MIN_BYTES - 1);
  return b < LL_BULK_MIN_BYTES ? LL_BULK_MIN_BYTES : b;
}

/* An all-gather goes through the bulk area once a rank's block outgrows its line region, a
 * broadcast once it outgrows a bank of lines (every rank's region). */
static int llGatherBulk(size_t blockBytes) { return blockBytes > llRegionLines() * LL_PAYLOAD; }
static int llBcastBulk(int nranks, size_t bytes) {
  return bytes > (size_t)nranks * llRegionLines() * LL_PAYLOAD;
}
/* Bytes of one round of a bulk broadcast: the whole bulk bank. */
static size_t llBcastBulkBytes(int nranks) { return (size_t)nranks * llBulkBytes(nranks); }

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

static double llNowSec(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Bounded wait during setup (for rank 0, who creates the board): 0 to retry, an error when
 * the comm failed or time ran out. */
static ncclxResult_t llSetupPause(struct ncclxComm* comm, double start, const char* what) {
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

__attribute__((noinline)) static ncclxResult_t llBoardCreate(struct ncclxComm* comm,
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

/* The comm's board, created on its first LL call. */
static inline ncclxResult_t llBoard(struct ncclxComm* comm, struct ncclxLLBoard** out) {
  *out = comm->ll;
  return comm->ll ? ncclxSuccess : llBoardCreate(comm, out);
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

/* ---------------- waiting ---------------- */

typedef struct llCall llCall;

typedef struct {
  struct ncclxComm* comm;
  struct ncclxLLBoard* b;
  const llCall* call; /* the call whose data we wait for (llCrossCheck), or NULL */
  unsigned polls, spins, yields;
  double start;
  uint64_t yieldStartNs;
} llWaiter;

static ncclxResult_t llCrossCheck(const llCall* c);

static uint64_t llNowNs(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* Field by field: zeroing the struct whole compiled to a rep stos, whose start-up cost was
 * 13% of the root's llRound samples. The spin budget is looked up at the first poll that
 * finds no data: most small calls never wait. */
static void llWaiterInit(llWaiter* w, struct ncclxComm* comm, struct ncclxLLBoard* b) {
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
__attribute__((noinline)) static void llWake(struct ncclxLLBoard* b) {
  atomic_fetch_add(&b->hdr->wake, 1);
  syscall(SYS_futex, (uint32_t*)&b->hdr->wake, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}
static inline void llWakeSleepers(struct ncclxLLBoard* b) {
  if (atomic_load_explicit(&b->hdr->sleepers, memory_order_relaxed) != 0) llWake(b);
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
static ncclxResult_t llWaitStep(llWaiter* w, _Atomic uint64_t* word, uint64_t want,
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
  if (w->yields >= LL_YIELDS && llRankExited(w->b, comm, whoRank))
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

/* What a call is, packed so that ranks can compare it line by line. */
static uint64_t llSig(const ncclxCollArgs* a) {
  uint64_t c = (uint64_t)a->count * 0x9e3779b97f4a7c15ull;
  return ((uint64_t)(a->coll & 0xff) << 56) | ((uint64_t)(a->datatype & 0xff) << 48) |
         ((uint64_t)(a->op & 0xff) << 40) | ((uint64_t)(a->root & 0xff) << 32) | (c >> 32);
}

/* "allreduce (float32 sum)", "broadcast (float32, root 0)" from a signature's fields. */
static void llDescribe(char* buf, size_t size, int coll, int type, int op, int root) {
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

static ncclxResult_t llMismatch(struct ncclxComm* comm, const ncclxCollArgs* a, int peer,
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

struct llCall {
  struct ncclxComm* comm;
  struct ncclxLLBoard* b;
  const ncclxCollArgs* a; /* the call */
  llLine* bank;
  llCell* cell;  /* a ring round: its first cell (else NULL) */
  size_t cells;  /* and how many */
  size_t ringAt; /* the ring position when the round started */
  uint64_t seq, sig;
  llWaiter w;
};

/* A broadcast has one writer: the root uses the whole bank, from its first line. */
static llLine* llRegion(const llCall* c, int rank) {
  if (c->a->coll == NCCLX_COLL_BROADCAST) return c->bank;
  return c->bank + (size_t)rank * c->b->perRegion;
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

static void llWrite(llCall* c, const void* src, size_t bytes, size_t skipLo, size_t skipHi) {
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
static ncclxResult_t llRead(llCall* c, int rank, size_t off, size_t len, void* dst) {
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
__attribute__((noinline)) static ncclxResult_t llWaitDone(llCall* c, uint64_t want) {
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

/* Before writing call seq into its bank: every rank has finished call seq - banks (known
 * without a look at the others' lines while the writer is that far ahead of them). */
static inline ncclxResult_t llWaitReusable(llCall* c, uint64_t banks) {
  if (c->seq <= banks || c->b->knownDone >= c->seq - banks) return ncclxSuccess;
  return llWaitDone(c, c->seq - banks);
}

/* dst = fold of op over every rank's [off, off + bytes), in rank order. */
static ncclxResult_t llReduceAll(llCall* c, size_t off, size_t count, void* dst) {
  const ncclxCollArgs* a = c->a;
  size_t bytes = count * collTypeSize(a->datatype);
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
static ncclxResult_t llOtherCall(const llCall* c, int root, uint64_t theirs) {
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

static ncclxResult_t llCrossCheck(const llCall* c) {
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
  size_t sz = a->coll == NCCLX_COLL_BARRIER ? 1 : collTypeSize(a->datatype);
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
  size_t blk = a->count * collTypeSize(a->datatype);
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
static ncclxResult_t llBulkRun(struct ncclxComm* comm, const ncclxCollArgs* a) {
  struct ncclxLLBoard* b;
  NCCLX_CHECK(llBoard(comm, &b));
  if (!b->bulkReady) NCCLX_CHECK(llBulkPopulate(comm, b));
  size_t total = a->count * collTypeSize(a->datatype);
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

/* A broadcast larger than a bank of lines goes through the bulk area: the root writes every
 * byte once and every other rank reads it once, where a ring copies it twice per hop through
 * the shared-memory transport (n ranks: n + 1 copies against 2 (n - 1)), which is what counts
 * when ranks share CPUs. */
ncclxResult_t collLLRun(struct ncclxComm* comm, const ncclxCollArgs* a) {
  size_t total = a->count * collTypeSize(a->datatype);
  /* At most a line's payload never goes bulk: a region has a line at least. */
  if (total > LL_PAYLOAD && ((a->coll == NCCLX_COLL_ALLGATHER && llGatherBulk(total)) ||
                             (a->coll == NCCLX_COLL_BROADCAST && llBcastBulk(comm->nranks, total))))
    return llBulkRun(comm, a);
  return llRound(comm, a);
}
