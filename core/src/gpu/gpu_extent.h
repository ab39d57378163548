/* Which bytes of its user buffers a collective reads and writes: what the GPU path must
 * stage. Pure arithmetic on already validated arguments (enqueue.c checked that the byte
 * sizes do not overflow). */
#ifndef NCCLX_GPU_EXTENT_H
#define NCCLX_GPU_EXTENT_H

#include <stddef.h>

#include "coll/coll.h"

typedef struct {
  size_t sendBytes;  /* bytes read from sendbuff, from its start (0: not used on this rank) */
  size_t recvBytes;  /* bytes of recvbuff written (0: not used on this rank) */
  int recvIsInput;   /* 1 when bytes inside the recv extent are kept as they are (gaps
                        between all-to-all-v blocks): they must be staged in as well */
} gpuCollExtent;

void gpuCollExtents(const ncclxCollArgs* a, int nranks, int rank, gpuCollExtent* e);

#endif /* NCCLX_GPU_EXTENT_H */
