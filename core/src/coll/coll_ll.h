/* The low-latency protocol (NCCLX_PROTO_LL): small collectives of ranks on one host through a
 * shared-memory board, one round per call, data and flag in the same cache line. */
#ifndef NCCLX_COLL_LL_H
#define NCCLX_COLL_LL_H

#include <stddef.h>

#include "coll/coll.h"

#define COLL_LL_MAX_RANKS 64
#define COLL_LL_MAX_BYTES_LIMIT 16384 /* ceiling of [core] ll_max_bytes */

struct ncclxLLBoard;

/* [core] ll_max_bytes: the most bytes a rank contributes to an LL call (default 4096). */
size_t collLLMaxBytes(void);
/* Whether a call of callBytes (tuneCallBytes) can run on the LL protocol on comm: every rank
 * on this host with shared memory, at most COLL_LL_MAX_RANKS ranks, small enough (a broadcast
 * of any size: it runs in rounds). */
int collLLRunnable(const struct ncclxComm* comm, ncclxCollType_t coll, size_t callBytes);
/* Rounds through the board a call of callBytes takes (more than 1 only for broadcasts and
 * all-gathers). */
size_t collLLRounds(const struct ncclxComm* comm, ncclxCollType_t coll, size_t callBytes);
/* Whether the call is one round through the board's lines, the case collLLModelCost prices
 * (not a broadcast or an all-gather through the bulk area). */
int collLLLineRound(const struct ncclxComm* comm, ncclxCollType_t coll, size_t callBytes);
/* Modelled time in us: alpha plus beta per byte written and read, gamma per byte reduced. */
double collLLModelCost(const struct ncclxComm* comm, ncclxCollType_t coll, size_t callBytes,
                       double alphaUs, double betaUsPerByte, double gammaUsPerByte);
/* Run a call the tuner gave proto LL (any collective but alltoallv). */
ncclxResult_t collLLRun(struct ncclxComm* comm, const ncclxCollArgs* a);
/* Unmap the board (comm destroy). */
void collLLCommFree(struct ncclxComm* comm);
#endif
