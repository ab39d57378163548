/*
 * ncclx CommFuse: all-gather and reduce-scatter fused with the computation beside them.
 *
 * Training puts an all-gather right before a GEMM (tensor/sequence parallel forward, FSDP
 * parameter gather) and a reduce-scatter right after one (row-parallel output, gradient
 * reduction). These calls take the computation as a per-block callback and interleave it
 * with the communication:
 *
 *   ncclxAllGatherCompute:     gather every rank's block, calling consume() on each block
 *                              as soon as it is here (own block first, no wait at the head);
 *   ncclxComputeReduceScatter: call produce() for each destination block and reduce the
 *                              partials across ranks (own block last, nothing left to send
 *                              after the last compute: no tail);
 *   ncclxAllToAllCompute:      produce() each rank's block, exchange them pairwise, and
 *                              consume() each received block while the next one moves
 *                              (Ulysses sequence <-> head re-layout).
 *
 * The schedule picks how communication and computation interleave, so benchmarks compare
 * methods on the same transport:
 *
 *   SEQUENTIAL    the ring collective, then all the compute (or all the compute, then the
 *                 ring collective);
 *   SLICED(k)     the slicing baseline: every block cut into k slices; the collective on slice
 *                 s+1 (AG) or s-1 (RS) runs while slice s computes. One slice stays exposed;
 *   RING_P2P      CommFuse: N-1 ring steps, one block of compute per step while the next
 *                 block moves (AG), or while the previous partial moves (RS);
 *   DIRECT_P2P    pairwise steps: each rank sends its own block (AG), or its partial for
 *                 block b straight to rank b (RS, then a local reduction);
 *   AUTO          the library picks one of these and its pieces per call shape, from the
 *                 cost model's transfer time and the callbacks' measured time (use this).
 *
 * Semantics, every schedule: the results equal the unfused collective followed (AG) or
 * preceded (RS) by the same callbacks. Callbacks run on the thread executing the call (the
 * caller with stream NULL, the stream's thread otherwise), one at a time; between them
 * that thread makes the transfers progress (RING_P2P, SLICED), or a progress thread moves
 * them (DIRECT_P2P, all-to-all). They must not call ncclx on the same communicator. A callback that
 * returns non-zero aborts the operation on every rank: this rank returns
 * ncclxInvalidUsage, the others ncclxRemoteError naming it, and the communicator is
 * unusable afterwards (like any communication failure).
 */
#ifndef NCCLX_FUSE_H
#define NCCLX_FUSE_H

#include <stddef.h>

#include "../ncclx.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
  ncclxFuseSequential = 0,
  ncclxFuseSliced = 1,
  ncclxFuseRingP2P = 2,
  ncclxFuseDirectP2P = 3,
  ncclxFuseAuto = 4, /* the library picks one of the above per call shape (NCCLX_FUSE_AUTO) */
  ncclxFuseNumAlgos = 5
} ncclxFuseAlgo_t;

typedef struct {
  ncclxFuseAlgo_t algo;
  /* SLICED: the number of slices k >= 1 per block (fewer when a block has fewer than
   * k units). SLICED(1) is SEQUENTIAL.
   * RING_P2P (all-gather and reduce-scatter): the number of pieces p >= 1 each block is
   * cut into inside the ring pipeline, so a received block is consumed (or a partial is
   * forwarded) piece by piece as it arrives; p = 1 moves whole blocks; 0 (the default,
   * NCCLX_FUSE_RING_P2P) chooses: the block over 256 KiB, rounded, at most 4 / nranks
   * (2 at 2 ranks from 384 KiB blocks, else 1: from 3 ranks a piece is the whole block; see
   * ncclxFuseSchedulePieces). Other schedules ignore it. */
  int slices;
  /* Slices are cut at multiples of `unit` elements (a matrix row, say); 0 means 1. Every
   * schedule requires the block count to be a multiple of unit. */
  size_t unit;
  /* Benchmark only, 0 = off: emulate a link of this many bytes/s per direction whose
   * transfers cost no CPU (a NIC or NVLink with DMA). A transfer of b bytes posted at time
   * t is complete, on both sides, no earlier than max(t, the end of the previous transfer
   * on that link) + b / linkBytesPerSec; the sender tells the receiver that time in an
   * 8-byte message ahead of the data. Waiting for it is a sleep. One host only (the
   * ranks compare CLOCK_MONOTONIC times). */
  double linkBytesPerSec;
} ncclxFuseSchedule_t;

#define NCCLX_FUSE_SEQUENTIAL ((ncclxFuseSchedule_t){ncclxFuseSequential, 1, 0, 0.0})
#define NCCLX_FUSE_SLICED(k) ((ncclxFuseSchedule_t){ncclxFuseSliced, (k), 0, 0.0})
#define NCCLX_FUSE_RING_P2P ((ncclxFuseSchedule_t){ncclxFuseRingP2P, 0, 0, 0.0})
#define NCCLX_FUSE_RING_P2P_PIECES(p) ((ncclxFuseSchedule_t){ncclxFuseRingP2P, (p), 0, 0.0})
#define NCCLX_FUSE_DIRECT_P2P ((ncclxFuseSchedule_t){ncclxFuseDirectP2P, 1, 0, 0.0})
/* The default to use: the library picks the schedule and its pieces from the transfer time
 * (the tuner's cost model) and the callbacks' time measured on earlier calls of the same
 * shape (docs/commfuse.md, "Automatic schedule"); a tuner plugin may pin it (tuner.h). */
#define NCCLX_FUSE_AUTO ((ncclxFuseSchedule_t){ncclxFuseAuto, 0, 0, 0.0})

/* Called for elements [offset, offset+count) of the block of rank srcRank, which `data`
 * holds (it points into recvbuff) and which stays unchanged until the call returns.
 * DIRECT_P2P and SEQUENTIAL call it once per rank with offset 0 and the whole block, in
 * the order r, r-1, ..., r+1 (mod nranks) on rank r; RING_P2P(p) once per piece, pieces
 * in order, ranks in that order; SLICED once per slice and rank, slices in order, ranks
 * in that same order. Return 0, or non-zero to abort. */
typedef int (*ncclxFuseConsumeFn)(void* user, int srcRank, size_t offset, const void* data,
                                  size_t count);

/* Write this rank's contribution to elements [offset, offset+count) of the block that rank
 * dstRank owns into `out` (library staging, or recvbuff for the own block; the library may
 * send it right after return). RING_P2P and SEQUENTIAL call it in the order r-1, r-2, ...,
 * r on rank r (RING_P2P(p): once per piece, pieces in order), DIRECT_P2P in the order
 * r+1, r+2, ..., r, SLICED once per slice in the SEQUENTIAL order. Return 0, or non-zero
 * to abort. */
typedef int (*ncclxFuseProduceFn)(void* user, int dstRank, size_t offset, void* out,
                                  size_t count);

/* All-gather of sendcount elements per rank into recvbuff (nranks * sendcount elements,
 * rank order; sendbuff may be recvbuff's own block), consuming each block as it arrives. */
ncclxResult_t ncclxAllGatherCompute(const void* sendbuff, void* recvbuff, size_t sendcount,
                                    ncclxDataType_t datatype, ncclxFuseConsumeFn consume,
                                    void* user, ncclxFuseSchedule_t schedule, ncclxComm_t comm,
                                    ncclxStream_t stream);

/* Reduce-scatter of partials computed by produce: recvbuff (recvcount elements) ends with
 * op over all ranks of their contributions to this rank's block. */
ncclxResult_t ncclxComputeReduceScatter(ncclxFuseProduceFn produce, void* user, void* recvbuff,
                                        size_t recvcount, ncclxDataType_t datatype,
                                        ncclxRedOp_t op, ncclxFuseSchedule_t schedule,
                                        ncclxComm_t comm, ncclxStream_t stream);

/* All-to-all of blocks computed by produce, each received block consumed as it arrives.
 * On rank r, produce(user, d, off, out, n) writes the block this rank sends to rank d
 * (d = r, r+1, ..., r-1); recvbuff (nranks * count elements) ends with block s = what rank
 * s produced for r, exactly as ncclxAllToAll of the produced blocks; consume (may be NULL)
 * gets block s once it is in recvbuff, in the order r, r-1, ..., r+1. RING_P2P and
 * DIRECT_P2P both run pairwise steps (step t sends to r+t and receives from r-t) and call
 * produce for step t+1 and consume for step t-1 while step t moves; SEQUENTIAL produces
 * all, exchanges, consumes all; SLICED(k) does that per slice, slice s exchanged while
 * slice s+1 is produced and slice s-1 consumed. */
ncclxResult_t ncclxAllToAllCompute(ncclxFuseProduceFn produce, ncclxFuseConsumeFn consume,
                                   void* user, void* recvbuff, size_t count,
                                   ncclxDataType_t datatype, ncclxFuseSchedule_t schedule,
                                   ncclxComm_t comm, ncclxStream_t stream);

/* The schedule the last fused call on comm ran (AUTO resolved), for logs and tests;
 * ncclxInvalidUsage before the first fused call. */
ncclxResult_t ncclxFuseLastSchedule(ncclxComm_t comm, ncclxFuseSchedule_t* schedule);

/* How many pieces (RING_P2P) or slices (SLICED) per block the schedule cuts a block of
 * count elements into on a communicator of nranks ranks, i.e. how many callbacks each
 * block gets: 1 for the others. */
int ncclxFuseSchedulePieces(ncclxFuseSchedule_t schedule, size_t count, ncclxDataType_t datatype,
                            int nranks);

/* "sequential", "sliced", "ring_p2p", "direct_p2p"; "unknown" otherwise. */
const char* ncclxFuseAlgoName(ncclxFuseAlgo_t algo);

#ifdef __cplusplus
}
#endif
#endif /* NCCLX_FUSE_H */
