/* The AllToAllvDynamic engine's wire format and state, shared by its files:
 * alltoallv_dynamic.c (channels, progress, the loop) and alltoallv_dynamic_place.c (message
 * 0: reading a peer's header and placing its data). */
#ifndef NCCLX_ALLTOALLV_DYNAMIC_ENGINE_H
#define NCCLX_ALLTOALLV_DYNAMIC_ENGINE_H

#include <stdint.h>
#include <time.h>

#include "alltoallv_dynamic.h"

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
  const dynCall* call;
  ncclxComm_t comm;
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

static inline double nowSec(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static inline const char* opName(const dynState* st) { return st->call->name; }
static inline unsigned long long opSeq(const dynState* st) { return (unsigned long long)st->call->seq; }

static inline size_t hdrSize(int nseg) { return sizeof(dynHeader) + 8 * (size_t)nseg; }

static inline size_t alignUp(size_t v) { return (v + 63) & ~(size_t)63; }

static inline uint64_t sumSegs(const uint64_t* segs, int n) {
  uint64_t s = 0;
  for (int i = 0; i < n; i++) s += segs[i];
  return s;
}

static inline size_t clampSize(size_t v, size_t lo, size_t hi) { return v < lo ? lo : v > hi ? hi : v; }

/* alltoallv_dynamic.c */
void segCopy(char* const* ptrs, const uint64_t* segs, int nseg, size_t unit, uint64_t off, size_t len,
                    char* buf, int toSegs);
char* contiguousBase(char* const* ptrs, const uint64_t* segs, int nseg, size_t unit);
void chanSetData(dynChan* ch, uint64_t total, uint64_t inlined, const uint64_t* segs, int nseg,
                        size_t unit);
/* alltoallv_dynamic_place.c */
ncclxResult_t parseHeader(dynState* st, int peer, size_t got);
ncclxResult_t capFailReady(dynState* st);
void selfCopy(dynState* st);
ncclxResult_t placePass(dynState* st, int* progress);

#endif
