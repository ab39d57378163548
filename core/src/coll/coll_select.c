/* Which algorithms exist for which collective, and dispatch (their names: util/names.c). */
#include "coll/coll.h"
#include "coll/coll_hier.h"
#include "coll/coll_ll.h"
#include "util/debug.h"

#define API __attribute__((visibility("default")))

typedef ncclxResult_t (*collFn)(struct ncclxComm* comm, const ncclxCollArgs* a);

/* The implementation of (coll, algo), or NULL. Barrier has a single algorithm
 * (dissemination); it runs whatever implemented algorithm the tuner names, so a barrier
 * never fails for lack of a choice. */
static collFn collLookup(ncclxCollType_t coll, int algo, int nranks) {
  if (algo == NCCLX_ALGO_HIERARCHICAL) {
    switch (coll) {
      case NCCLX_COLL_ALLREDUCE: return allreduceHier;
      case NCCLX_COLL_BROADCAST: return broadcastHier;
      case NCCLX_COLL_REDUCE: return reduceHier;
      case NCCLX_COLL_ALLGATHER: return allgatherHier;
      case NCCLX_COLL_ALLTOALL: return alltoallHier;
      default: return NULL;
    }
  }
  switch (coll) {
    case NCCLX_COLL_ALLREDUCE:
      switch (algo) {
        case NCCLX_ALGO_RING: return allreduceRing;
        case NCCLX_ALGO_RECURSIVE_DOUBLING: return allreduceRecursiveDoubling;
        case NCCLX_ALGO_RABENSEIFNER: return allreduceRabenseifner;
        case NCCLX_ALGO_TREE: return allreduceTree;
        case NCCLX_ALGO_LINEAR: return allreduceLinear;
        default: return NULL;
      }
    case NCCLX_COLL_BROADCAST:
      switch (algo) {
        case NCCLX_ALGO_TREE: return broadcastTree;
        case NCCLX_ALGO_RING: return broadcastRing;
        default: return NULL;
      }
    case NCCLX_COLL_REDUCE:
      return algo == NCCLX_ALGO_TREE ? reduceTree : NULL;
    case NCCLX_COLL_ALLGATHER:
      switch (algo) {
        case NCCLX_ALGO_RING: return allgatherRing;
        case NCCLX_ALGO_BRUCK: return allgatherBruck;
        case NCCLX_ALGO_LINEAR: return allgatherLinear;
        case NCCLX_ALGO_RECURSIVE_DOUBLING:
          return (nranks & (nranks - 1)) == 0 ? allgatherRecursiveDoubling : NULL;
        default: return NULL;
      }
    case NCCLX_COLL_REDUCESCATTER:
      switch (algo) {
        case NCCLX_ALGO_RING: return reducescatterRing;
        case NCCLX_ALGO_PAIRWISE: return reducescatterPairwise;
        case NCCLX_ALGO_LINEAR: return reducescatterLinear;
        default: return NULL;
      }
    case NCCLX_COLL_ALLTOALL:
      switch (algo) {
        case NCCLX_ALGO_PAIRWISE: return alltoallPairwise;
        case NCCLX_ALGO_LINEAR: return alltoallLinear;
        case NCCLX_ALGO_BRUCK: return alltoallBruck;
        default: return NULL;
      }
    case NCCLX_COLL_ALLTOALLV:
      switch (algo) {
        case NCCLX_ALGO_PAIRWISE: return alltoallvPairwise;
        case NCCLX_ALGO_LINEAR: return alltoallvLinear;
        default: return NULL;
      }
    case NCCLX_COLL_BARRIER:
      return algo >= 0 && algo < NCCLX_ALGO_HIERARCHICAL ? barrierDissemination : NULL;
    default:
      return NULL;
  }
}

int collAlgoSupported(ncclxCollType_t coll, int algo, int nranks) {
  return nranks >= 1 && collLookup(coll, algo, nranks) != NULL;
}

int collAlgoSupportedOn(const struct ncclxComm* comm, ncclxCollType_t coll, int algo) {
  if (algo == NCCLX_ALGO_HIERARCHICAL && !collHierUseful(comm)) return 0;
  return collAlgoSupported(coll, algo, comm->nranks);
}

ncclxResult_t collRun(struct ncclxComm* comm, const ncclxCollArgs* args) {
  if (args->proto == NCCLX_PROTO_LL) return collLLRun(comm, args);
  collFn fn = collLookup(args->coll, args->algo, comm->nranks);
  if (!fn)
    return commFail(comm, ncclxInternalError,
                        "%s: algorithm '%s' (%d) cannot run on %d rank(s)",
                        ncclxCollName(args->coll), ncclxAlgoName(args->algo), args->algo,
                        comm->nranks);
  return fn(comm, args);
}
