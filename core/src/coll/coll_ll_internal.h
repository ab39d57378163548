/* The LL protocol's board and calls, shared by its three files (see coll_ll.c for the
 * protocol): coll_ll_board.c (sizes, creating and mapping the board), coll_ll.c (waiting and
 * one round through the banks or the ring), coll_ll_bulk.c (rounds through the bulk area). */
#ifndef NCCLX_COLL_LL_INTERNAL_H
#define NCCLX_COLL_LL_INTERNAL_H

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
#include "comm/waitnote.h"
#include "util/reduce.h"
#include "transport/shm/shm_mem.h"
#include "exec/xfer.h"

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

static inline void llMark(llFlag* f, uint64_t sig, uint64_t seq) {
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

typedef struct llCall llCall;

typedef struct {
  struct ncclxComm* comm;
  struct ncclxLLBoard* b;
  const llCall* call; /* the call whose data we wait for (llCrossCheck), or NULL */
  unsigned polls, spins, yields;
  double start;
  uint64_t yieldStartNs;
} llWaiter;

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

/* coll_ll_board.c */
ncclxResult_t llBoardCreate(struct ncclxComm* comm,
                                                            struct ncclxLLBoard** out);
size_t llRegionLines(void);
size_t llBulkBytes(int nranks);
int llGatherBulk(size_t blockBytes);
int llBcastBulk(int nranks, size_t bytes);
size_t llBcastBulkBytes(int nranks);
ncclxResult_t llSetupPause(struct ncclxComm* comm, double start, const char* what);
/* coll_ll.c */
void llWake(struct ncclxLLBoard* b);
ncclxResult_t llWaitDone(llCall* c, uint64_t want);
ncclxResult_t llRead(llCall* c, int rank, size_t off, size_t len, void* dst);
void llWrite(llCall* c, const void* src, size_t bytes, size_t skipLo, size_t skipHi);
ncclxResult_t llWaitStep(llWaiter* w, _Atomic uint64_t* word, uint64_t want,
                                const char* who, int whoRank);
void llWaiterInit(llWaiter* w, struct ncclxComm* comm, struct ncclxLLBoard* b);
ncclxResult_t llMismatch(struct ncclxComm* comm, const ncclxCollArgs* a, int peer,
                                uint64_t theirs);
ncclxResult_t llOtherCall(const llCall* c, int root, uint64_t theirs);
ncclxResult_t llCrossCheck(const llCall* c);
void llDescribe(char* buf, size_t size, int coll, int type, int op, int root);
/* coll_ll_bulk.c */
ncclxResult_t llBulkRun(struct ncclxComm* comm, const ncclxCollArgs* a);


/* A broadcast has one writer: the root uses the whole bank, from its first line. */
static inline llLine* llRegion(const llCall* c, int rank) {
  if (c->a->coll == NCCLX_COLL_BROADCAST) return c->bank;
  return c->bank + (size_t)rank * c->b->perRegion;
}

/* What a call is, packed so that ranks can compare it line by line. */
static inline uint64_t llSig(const ncclxCollArgs* a) {
  uint64_t c = (uint64_t)a->count * 0x9e3779b97f4a7c15ull;
  return ((uint64_t)(a->coll & 0xff) << 56) | ((uint64_t)(a->datatype & 0xff) << 48) |
         ((uint64_t)(a->op & 0xff) << 40) | ((uint64_t)(a->root & 0xff) << 32) | (c >> 32);
}

static inline double llNowSec(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* The comm's board, created on its first LL call. */
static inline ncclxResult_t llBoard(struct ncclxComm* comm, struct ncclxLLBoard** out) {
  *out = comm->ll;
  return comm->ll ? ncclxSuccess : llBoardCreate(comm, out);
}

static inline void llWakeSleepers(struct ncclxLLBoard* b) {
  if (atomic_load_explicit(&b->hdr->sleepers, memory_order_relaxed) != 0) llWake(b);
}

/* Before writing call seq into its bank: every rank has finished call seq - banks (known
 * without a look at the others' lines while the writer is that far ahead of them). */
static inline ncclxResult_t llWaitReusable(llCall* c, uint64_t banks) {
  if (c->seq <= banks || c->b->knownDone >= c->seq - banks) return ncclxSuccess;
  return llWaitDone(c, c->seq - banks);
}


#endif
