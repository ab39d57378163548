/* Byte extents of a collective's user buffers (see gpu_extent.h). */
#include "gpu/gpu_extent.h"

/* End (in elements) of the furthest non-empty block of an all-to-all-v side. */
static size_t blocksEnd(const size_t* counts, const size_t* displs, int nranks) {
  size_t end = 0;
  for (int r = 0; r < nranks; r++)
    if (counts[r] > 0 && displs[r] + counts[r] > end) end = displs[r] + counts[r];
  return end;
}

void gpuCollExtents(const ncclxCollArgs* a, int nranks, int rank, gpuCollExtent* e) {
  size_t es = ncclxTypeSize(a->datatype), c = a->count, n = (size_t)nranks;
  e->sendBytes = e->recvBytes = 0;
  e->recvIsInput = 0;
  switch (a->coll) {
    case NCCLX_COLL_ALLREDUCE:
      e->sendBytes = e->recvBytes = c * es;
      break;
    case NCCLX_COLL_BROADCAST: /* only the root's sendbuff is read */
      e->sendBytes = rank == a->root ? c * es : 0;
      e->recvBytes = c * es;
      break;
    case NCCLX_COLL_REDUCE: /* only the root's recvbuff is written */
      e->sendBytes = c * es;
      e->recvBytes = rank == a->root ? c * es : 0;
      break;
    case NCCLX_COLL_ALLGATHER:
      e->sendBytes = c * es;
      e->recvBytes = n * c * es;
      break;
    case NCCLX_COLL_REDUCESCATTER:
      e->sendBytes = n * c * es;
      e->recvBytes = c * es;
      break;
    case NCCLX_COLL_ALLTOALL:
      e->sendBytes = e->recvBytes = n * c * es;
      break;
    case NCCLX_COLL_ALLTOALLV:
      e->sendBytes = blocksEnd(a->sendcounts, a->sdispls, nranks) * es;
      e->recvBytes = blocksEnd(a->recvcounts, a->rdispls, nranks) * es;
      e->recvIsInput = 1;
      break;
    default: /* barrier: no buffers */
      break;
  }
}
