/* Collective algorithms. Each runs on the calling thread with the comm's execLock held,
 * over xferRun, and returns when this rank's part is complete. Arguments are already
 * validated; count may be 0. Algorithms are correct for any nranks >= 1. */
#ifndef NCCLX_COLL_H
#define NCCLX_COLL_H

#include "comm/comm.h"
#include "util/names.h"
#include "ncclx/tuner.h"
#include "exec/xfer.h"

typedef struct {
  ncclxCollType_t coll;
  const void* sendbuff;
  void* recvbuff;
  size_t count; /* allreduce/bcast/reduce: count; allgather: sendcount; reducescatter:
                   recvcount; alltoall: per-peer count */
  ncclxDataType_t datatype;
  ncclxRedOp_t op;
  int root;
  /* alltoallv only (elements, nranks entries each). */
  const size_t* sendcounts;
  const size_t* sdispls;
  const size_t* recvcounts;
  const size_t* rdispls;
  int algo;         /* ncclxAlgo_t chosen by the tuner */
  int proto;        /* ncclxProto_t */
  size_t chunkBytes; /* pipeline chunk chosen by the tuner (the comm default otherwise) */
  int hostBuffers;   /* set at the call when no CUDA driver was loaded: both buffers are host
                        memory, so execution need not probe them again */
} ncclxCollArgs;


/* Whether algo can run this call on comm: the collective, the rank count and, for
 * NCCLX_ALGO_HIERARCHICAL, the host layout (offered only with several hosts, one of them with
 * several ranks, where it pays off). The tuner's table is masked with this, so a tuner
 * cannot pick an algorithm that does not exist for the call. */
int collAlgoSupportedOn(const struct ncclxComm* comm, ncclxCollType_t coll, int algo);
/* The same without a layout: hierarchical counts as supported (it runs correctly on any
 * layout, only slower where collAlgoSupportedOn says no). Kept for callers that only know
 * nranks; prefer collAlgoSupportedOn. */
int collAlgoSupported(ncclxCollType_t coll, int algo, int nranks);
/* Dispatch to the algorithm in args->algo. */
ncclxResult_t collRun(struct ncclxComm* comm, const ncclxCollArgs* args);

/* ---- Helpers the algorithm files share (coll_util.c). ---- */
/* Send and receive at once; a half of zero bytes is skipped (the peer computes the same
 * sizes, so it skips it too). A peer < 0 skips that half as well. */
ncclxResult_t collSendRecv(struct ncclxComm* comm, int sendPeer, const void* sendBuf, size_t sendBytes,
                           int recvPeer, void* recvBuf, size_t recvBytes);
/* Whether [a, a + alen) and [b, b + blen) share a byte (empty ranges share none). */
int collRangesOverlap(const void* a, size_t alen, const void* b, size_t blen);
/* Whether a rank copies its own data from send to recv (bytes) alongside its transfers
 * (xferRunCopying) rather than before or after them (a broadcast root's sendbuff, an
 * all-gather's or a pairwise all-to-all's own block): out of place, not partly overlapping,
 * and commRanksOwnCpus (on a shared CPU the copy would take the time slices the children
 * need: 4 ranks on 2 CPUs, 15% slower at 512 KiB-2 MiB). */
int collRootCopyAlongside(const struct ncclxComm* comm, const void* send, const void* recv,
                          size_t bytes);
/* Bytes of one pipeline piece (the call's chunk, 1 MiB when unset), and the same in elements
 * (at least one). */
size_t collPieceBytes(const struct ncclxComm* comm);
size_t collPieceElems(const struct ncclxComm* comm, size_t typeSize);
/* The comm's scratch area of at least `bytes`; when it cannot be had, the comm fails (the
 * other ranks already wait for this one) with "<what>: cannot allocate ...". */
ncclxResult_t collScratch(struct ncclxComm* comm, const char* what, size_t bytes, char** out);

/* Algorithms (coll_*.c). */
ncclxResult_t allreduceRing(struct ncclxComm* comm, const ncclxCollArgs* a);
ncclxResult_t allreduceRecursiveDoubling(struct ncclxComm* comm, const ncclxCollArgs* a);
ncclxResult_t allreduceRabenseifner(struct ncclxComm* comm, const ncclxCollArgs* a);
ncclxResult_t allreduceTree(struct ncclxComm* comm, const ncclxCollArgs* a); /* reduce + bcast */
ncclxResult_t allreduceLinear(struct ncclxComm* comm, const ncclxCollArgs* a);
ncclxResult_t broadcastTree(struct ncclxComm* comm, const ncclxCollArgs* a);
ncclxResult_t broadcastRing(struct ncclxComm* comm, const ncclxCollArgs* a); /* pipelined chain */
ncclxResult_t reduceTree(struct ncclxComm* comm, const ncclxCollArgs* a);
ncclxResult_t allgatherRing(struct ncclxComm* comm, const ncclxCollArgs* a);
ncclxResult_t allgatherRecursiveDoubling(struct ncclxComm* comm, const ncclxCollArgs* a);
ncclxResult_t allgatherBruck(struct ncclxComm* comm, const ncclxCollArgs* a);
ncclxResult_t allgatherLinear(struct ncclxComm* comm, const ncclxCollArgs* a);
ncclxResult_t reducescatterRing(struct ncclxComm* comm, const ncclxCollArgs* a);
ncclxResult_t reducescatterPairwise(struct ncclxComm* comm, const ncclxCollArgs* a);
ncclxResult_t reducescatterLinear(struct ncclxComm* comm, const ncclxCollArgs* a);
ncclxResult_t alltoallPairwise(struct ncclxComm* comm, const ncclxCollArgs* a);
ncclxResult_t alltoallLinear(struct ncclxComm* comm, const ncclxCollArgs* a);
/* One window of a linear all-to-all: block b (len bytes at src + b * srcStride) goes to rank
 * b, and rank b's block lands at dst + b * dstStride (this rank's own block is copied).
 * xfers: room for 2 * nranks transfers. Used by the linear reduce-scatter, all-gather and
 * all-reduce too. */
ncclxResult_t alltoallLinearWindow(struct ncclxComm* comm, ncclxXfer* xfers, const char* src,
                                   size_t srcStride, char* dst, size_t dstStride, size_t len);
/* Room for alltoallLinearWindow's transfers, or NULL after failing comm (out of memory). */
ncclxXfer* collLinearXfers(struct ncclxComm* comm);
/* Elements per block of one window of a linear exchange: nranks windows fit a pipeline
 * piece, and none is larger than the block (count elements). At least 1. */
size_t collLinearWindowElems(const struct ncclxComm* comm, size_t typeSize, size_t count);
/* One window of a linear reduce-scatter: block b's window (len elements at src + b * stride
 * bytes) goes to rank b, and dst = the nranks contributions to this rank's window, reduced
 * in rank order (the same bits on every host), staged in scratch (nranks windows). */
ncclxResult_t collLinearReduceWindow(struct ncclxComm* comm, ncclxXfer* xfers, const char* src,
                                     size_t stride, char* scratch, char* dst, size_t len,
                                     const ncclxCollArgs* a);
ncclxResult_t alltoallBruck(struct ncclxComm* comm, const ncclxCollArgs* a);
ncclxResult_t alltoallvPairwise(struct ncclxComm* comm, const ncclxCollArgs* a);
ncclxResult_t alltoallvLinear(struct ncclxComm* comm, const ncclxCollArgs* a);
ncclxResult_t barrierDissemination(struct ncclxComm* comm, const ncclxCollArgs* a);
#endif
