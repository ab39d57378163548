/*
 * ncclx: all-to-all with counts known only at execution time, and mixture-of-experts
 * dispatch / combine built on it. docs/moe.md has the full semantics and an example.
 *
 * Everything here follows the stream rules of ncclx.h: with stream NULL a call runs on the
 * calling thread and returns when done; with a stream it is queued, and its count arrays and
 * routing inputs are read (and its count outputs written) when it EXECUTES on the stream.
 * A host function queued earlier (ncclxLaunchHostFunc) may therefore produce the inputs and
 * a later one consume the outputs, with no synchronization by the caller.
 *
 * These calls cannot be grouped: between ncclxGroupStart and ncclxGroupEnd they fail with
 * ncclxInvalidUsage and queue nothing (docs/moe.md). Each is one profiler COLL event named
 * "alltoallv_dynamic", "alltoallv_dynamic_compact", "moe_dispatch" or "moe_combine".
 */
#ifndef NCCLX_MOE_H
#define NCCLX_MOE_H

#include <stddef.h>
#include <stdint.h>

#include "ncclx.h"

#ifdef __cplusplus
extern "C" {
#endif

#define NCCLX_ALLTOALLV_DYNAMIC_SUPPORTED 1
#define NCCLX_MOE_SUPPORTED 1

#if defined(__GNUC__)
#define NCCLX_MOE_API __attribute__((visibility("default")))
#else
#define NCCLX_MOE_API
#endif

/* ---- Dynamic all-to-all-v ---- */

/* sendbuff holds this rank's blocks back to back: sendcounts[p] elements for rank p, in rank
 * order. The block from rank p lands at recvbuff + p * maxRecvCount elements, and
 * recvcounts[p] receives its size. sendcounts and recvcounts have nranks entries each and
 * are read / written when the operation executes. maxRecvCount may differ between ranks:
 * each rank advertises its own to its peers. A count above the receiver's maxRecvCount fails
 * with ncclxInvalidUsage on the receiver (naming the sender and both counts) and fails the
 * sender's call too (ncclxInvalidUsage, or ncclxRemoteError carrying the receiver's report);
 * nothing is written past a block, and the communicator is then unusable (like any failed
 * collective). recvbuff must not overlap sendbuff. */
NCCLX_MOE_API ncclxResult_t ncclxAllToAllvDynamic(const void* sendbuff, const size_t* sendcounts,
                                                  void* recvbuff, size_t maxRecvCount,
                                                  size_t* recvcounts, ncclxDataType_t datatype,
                                                  ncclxComm_t comm, ncclxStream_t stream);

/* The same exchange with the received blocks packed in rank order: block p at recvbuff +
 * rdispls[p] elements, recvcounts[p] long; recvbuff holds maxRecvTotal elements. More than
 * maxRecvTotal in total fails with ncclxInvalidUsage on the receiver; the senders fail when
 * its abort notice reaches them (in this call if it is still running, else in their next). */
NCCLX_MOE_API ncclxResult_t ncclxAllToAllvDynamicCompact(const void* sendbuff,
                                                         const size_t* sendcounts, void* recvbuff,
                                                         size_t maxRecvTotal, size_t* recvcounts,
                                                         size_t* rdispls, ncclxDataType_t datatype,
                                                         ncclxComm_t comm, ncclxStream_t stream);

/* ---- Mixture of experts ---- */

/* Experts are numbered 0..nExperts-1 and partitioned contiguously over the ranks: rank r owns
 * experts [r * nExperts / nranks, (r + 1) * nExperts / nranks) (integer division). */
typedef struct ncclxMoe* ncclxMoe_t;

typedef struct {
  size_t size;              /* sizeof(ncclxMoeConfig_t) */
  int nExperts;             /* experts of the layer over all ranks, >= 1 */
  int topk;                 /* experts per token, >= 1 */
  size_t hidden;            /* elements per token row */
  ncclxDataType_t datatype; /* of token rows: ncclxFloat16, ncclxBfloat16, ncclxFloat32, ncclxFloat64 */
  size_t maxTokens;         /* the largest nTokens this rank passes to ncclxMoeDispatch */
  size_t maxRecvTokens;     /* rows this rank's expert buffers (expertIn / expertOut) hold */
  /* Capacity policy (a config of the older size, without this field, means 0):
   *   0: none; more than maxRecvTokens rows arriving at a rank fails the dispatch and the
   *      communicator (fail hard).
   *   > 0: the most (token, k) pairs this rank sends to one expert per dispatch, as routers'
   *      per-group expert capacity. Pairs over it are dropped in token order, as if their
   *      expert id were -1 (the combine gives them no contribution), counted per expert
   *      (ncclxMoeDroppedCounts), and the call succeeds on every rank. ncclxMoeCreate
   *      checks that maxRecvTokens holds nranks x (local experts) x expertCapacity, so no
   *      dispatch can overflow a rank. */
  size_t expertCapacity;
} ncclxMoeConfig_t;
/* sizeof(ncclxMoeConfig_t) before expertCapacity: still accepted in config->size. */
#define NCCLX_MOE_CONFIG_SIZE_V1 offsetof(ncclxMoeConfig_t, expertCapacity)

/* Local: no communication. The handle keeps the routing between a dispatch and its combine
 * and a staging buffer of maxTokens * topk rows (see docs/moe.md for the memory used). */
NCCLX_MOE_API ncclxResult_t ncclxMoeCreate(ncclxMoe_t* moe, const ncclxMoeConfig_t* config,
                                           ncclxComm_t comm);
/* Safe while operations are still queued: the handle is freed after the last one. */
NCCLX_MOE_API ncclxResult_t ncclxMoeDestroy(ncclxMoe_t moe);
/* The experts this rank owns: firstExpert .. firstExpert + nLocalExperts - 1. */
NCCLX_MOE_API ncclxResult_t ncclxMoeLocalExperts(ncclxMoe_t moe, int* firstExpert,
                                                 int* nLocalExperts);

/* Sends every (token, k) pair to the rank owning expert expertIds[token * topk + k] (-1: the
 * pair is dropped). On the owner the rows arrive grouped by local expert in expertIn: the
 * rows of local expert i start at row expertCounts[0] + ... + expertCounts[i-1], and within
 * an expert they are ordered by source rank, then token, then k. expertCounts gets
 * nLocalExperts entries. tokens has nTokens rows of `hidden` elements (nTokens is read at
 * the call; with 0, tokens and expertIds may be NULL); expertIds and tokens
 * are read and expertIn and expertCounts written when the operation executes. More than
 * maxRecvTokens rows arriving fails with ncclxInvalidUsage. An id outside [-1, nExperts)
 * is refused with ncclxInvalidArgument on this rank (at synchronize when queued): its
 * pairs are not sent, as if -1, the other pairs are, every other rank succeeds, and the
 * communicator stays usable (the combine of this dispatch works as for a -1 id). */
NCCLX_MOE_API ncclxResult_t ncclxMoeDispatch(ncclxMoe_t moe, const void* tokens, size_t nTokens,
                                             const int32_t* expertIds, void* expertIn,
                                             size_t* expertCounts, ncclxStream_t stream);

/* The pairs this rank dropped for lack of expert capacity in the latest dispatch executed on
 * this handle: dropped[e] for every expert e (nExperts entries). With a stream, call it after
 * ncclxStreamSynchronize. Local: no communication. */
NCCLX_MOE_API ncclxResult_t ncclxMoeDroppedCounts(ncclxMoe_t moe, size_t* dropped);

/* The reverse of the latest dispatch executed on this handle: expertOut holds one output row
 * per row the dispatch put in expertIn (same layout); the rows go back to their tokens and
 * out[t] = sum over k of weights[t * topk + k] * (expert output of pair (t, k)), computed in
 * fp32 (fp64 for ncclxFloat64). out has nTokens rows, nTokens of that dispatch; a token whose
 * pairs were all dropped gets zeros. weights is read when the operation executes. */
NCCLX_MOE_API ncclxResult_t ncclxMoeCombine(ncclxMoe_t moe, const void* expertOut,
                                            const float* weights, void* out, ncclxStream_t stream);

#ifdef __cplusplus
}
#endif
#endif /* NCCLX_MOE_H */
