/* The dynamic exchange engine behind ncclxAllToAllvDynamic and the MoE helpers.
 *
 * To each peer a rank sends a list of segments (counts in units, each from its own address).
 * On the wire, per peer and direction:
 *   message 0:  header (segment counts, the sender's per-peer capacity, chunk size) and, when
 *               the data is small (<= 12 KiB), the data itself;
 *   then:       otherwise, the data as one stream cut in chunks (<= 192 KiB).
 * So there is no separate count round, and at decode sizes a peer costs one message; a
 * direction both sides know to be empty (dynPeer.noSend / noRecv) costs none. The
 * receiver posts message 0 (as large as any message 0 can be) before it knows the counts;
 * once place() has decided where the peer's segments go it posts the chunks with exact
 * sizes, so nothing can overrun a buffer. A side whose segments are adjacent in memory moves
 * chunks in place (zero copy); otherwise chunks go through two staging slots (gather before
 * sending, scatter after receiving), except from 16 KiB to a peer in several segments of
 * 32 KiB or more on average, where chunks are also cut at segment boundaries and land
 * straight in their segments. A message 0
 * with all counts zero is 32 bytes (the shared-memory transport's flag-line size).
 *
 * A count above what the receiver holds is refused by the receiver (place() returns the
 * error) and by the sender when it reads the capacity the receiver advertised in its own
 * header: both fail in the same operation, and commFail's abort notice bounds the others.
 *
 * Memory, in the communicator's scratch area (reused by every call): per peer the message-0
 * buffers (header + 12 KiB each way) and, only for exchanges whose segments are scattered
 * (MoE), two receive slots and, when the sender's segments are scattered, two send slots of
 * one chunk each. The chunk is 192 KiB up to 21 ranks and shrinks with more (4 MiB / nranks,
 * at least 16 KiB), so this stays under 1 MiB per peer and about 16 MiB per communicator up
 * to 256 ranks. Plus ~250 bytes of state per peer while an operation runs. */
#ifndef NCCLX_ALLTOALLV_DYNAMIC_H
#define NCCLX_ALLTOALLV_DYNAMIC_H

#include <stdint.h>

#include "moe_core.h"

#define DYN_NO_CAPACITY UINT64_MAX

/* One executing operation (dynExecOp): its communicator, as every rank sees it, its name
 * and sequence number for sentences and headers. */
typedef struct {
  ncclxComm_t comm;
  ncclxModuleCommInfo_v1_t info;
  const char* name; /* "alltoallv_dynamic", "moe_dispatch", ... */
  uint64_t seq;
  size_t maxMessageBytes; /* 0 = no limit */
} dynCall;

typedef struct {
  /* To this peer: nSendSeg counts (in units), segment i's data at sendPtr[i]. */
  const char* const* sendPtr;
  const uint64_t* sendSegs;
  int nSendSeg;
  /* From this peer: nRecvSeg counts, filled from its header (then hdrKnown = 1); place()
   * sets recvDst[i] for every segment i with a non-zero count. The arrays are the caller's. */
  int nRecvSeg;
  uint64_t* recvSegs;
  char** recvDst;
  /* Set by callers that know, as the peer does, that a direction carries nothing (the
   * combine after its dispatch): no message at all, not even a header, and the counts from
   * this peer are zero. Both sides must agree, or the next operation reads a stray header
   * (and fails naming it). */
  int noSend, noRecv;
  int hdrKnown;
  int placed;
} dynPeer;

typedef struct dynExchange {
  const dynCall* call;
  size_t unitBytes;      /* bytes per counted unit */
  const char* unitName;  /* "elements", "tokens": for error messages */
  const char* capName;   /* what limits capacity, e.g. "maxRecvCount" */
  uint64_t capacity;     /* advertised: units each peer may send here, or DYN_NO_CAPACITY */
  int scatteredRecv;     /* place() may split a peer's segments (else they are adjacent) */
  dynPeer* peers;        /* nranks entries */
  /* Called once peer's header is known (again after each later header while it returns
   * *placed = 0). On an error it writes the reason into why (without the op name). */
  ncclxResult_t (*place)(struct dynExchange* x, int peer, int* placed);
  void* ctx;
  char why[512];
} dynExchange;

/* Per peer and direction: the most data that rides inline in message 0, and the size of the
 * later messages (at most). Both shrink as ranks grow; see the memory note above. */
void dynStaging(int nranks, size_t* inlineMax, size_t* chunkMax);

/* Runs the exchange to completion, inside dynExecOp. */
ncclxResult_t dynExchangeRun(dynExchange* x);

/* What the profiler's COLL event says about a call (known when it executes). */
typedef struct {
  const void* sendbuff;
  void* recvbuff;
  size_t count;  /* elements (all-to-all) or tokens (MoE) this rank sends */
  size_t bytes;  /* data bytes this rank sends */
  ncclxDataType_t datatype;
  ncclxStream_t stream;  /* the stream it was queued on, NULL for the caller's thread */
} dynOpInfo;

/* Runs fn(call, arg) as one operation named `name` in the core's envelope (opBegin/opEnd):
 * one at a time per communicator, a destroyed or failed communicator refused, the next
 * collective sequence number, a profiler COLL event whose func is `name`
 * ("alltoallv_dynamic", "alltoallv_dynamic_compact", "moe_dispatch", "moe_combine"). */
ncclxResult_t dynExecOp(ncclxComm_t comm, const char* name, ncclxResult_t (*fn)(const dynCall* call, void* arg),
                        void* arg, const dynOpInfo* info);

/* The ncclxInvalidUsage refusal of the dynamic calls between ncclxGroupStart and
 * ncclxGroupEnd. */
ncclxResult_t dynCheckNotGrouped(ncclxComm_t comm, const char* fn);

/* alltoallv_dynamic_dev.c: takes the call (*taken = 1) when a buffer or count array is
 * device memory, or the stream is ordered with a CUDA stream; device memory no path can use
 * is refused naming the argument; otherwise the call is queued with CUDA ordering and stages
 * its device arguments when it executes. *taken = 0 leaves the call to the host path. */
ncclxResult_t dynDeviceSubmit(const char* fn, const void* sendbuff, const size_t* sendcounts, void* recvbuff,
                              size_t maxRecv, size_t* recvcounts, size_t* rdispls, ncclxDataType_t datatype,
                              ncclxComm_t comm, ncclxStream_t stream, int compact, int* taken);

#endif
