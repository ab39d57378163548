/* gpuCollExtents: the bytes of its user buffers each collective reads and writes, which is
 * exactly what the GPU path stages through host memory (too little corrupts results, too
 * much reads past the user's allocation). */
#include <stdio.h>

#include "gpu/gpu_extent.h"

static int failures;
#define EXPECT(a, nranks, rank, send, recv, input)                                         \
  do {                                                                                     \
    gpuCollExtent e_;                                                                      \
    gpuCollExtents(&(a), (nranks), (rank), &e_);                                           \
    if (e_.sendBytes != (size_t)(send) || e_.recvBytes != (size_t)(recv) ||                \
        e_.recvIsInput != (input)) {                                                       \
      failures++;                                                                          \
      fprintf(stderr, "%s:%d: %s nranks %d rank %d: got send %zu recv %zu input %d, "     \
              "want %zu %zu %d\n", __FILE__, __LINE__, ncclxCollName((a).coll), (nranks),   \
              (rank), e_.sendBytes, e_.recvBytes, e_.recvIsInput, (size_t)(send),           \
              (size_t)(recv), (input));                                                    \
    }                                                                                      \
  } while (0)

int main(void) {
  ncclxCollArgs a = {.count = 10, .datatype = ncclxFloat32, .root = 2};
  a.coll = NCCLX_COLL_ALLREDUCE;
  EXPECT(a, 4, 0, 40, 40, 0);
  a.coll = NCCLX_COLL_BROADCAST;
  EXPECT(a, 4, 2, 40, 40, 0); /* root reads sendbuff */
  EXPECT(a, 4, 1, 0, 40, 0);  /* others only receive */
  a.coll = NCCLX_COLL_REDUCE;
  EXPECT(a, 4, 2, 40, 40, 0);
  EXPECT(a, 4, 3, 40, 0, 0); /* non-roots write nothing */
  a.coll = NCCLX_COLL_ALLGATHER;
  EXPECT(a, 4, 1, 40, 160, 0);
  a.coll = NCCLX_COLL_REDUCESCATTER;
  EXPECT(a, 4, 1, 160, 40, 0);
  a.coll = NCCLX_COLL_ALLTOALL;
  EXPECT(a, 3, 0, 120, 120, 0);
  a.coll = NCCLX_COLL_BARRIER;
  EXPECT(a, 3, 0, 0, 0, 0);

  a.coll = NCCLX_COLL_ALLREDUCE;
  a.datatype = ncclxBfloat16;
  a.count = 0;
  EXPECT(a, 8, 0, 0, 0, 0);

  /* all-to-all-v: up to the end of the furthest non-empty block; empty blocks' displacements
   * do not count (they may point anywhere); gaps between blocks are kept, so recv is input. */
  size_t sc[4] = {2, 0, 3, 1}, sd[4] = {0, 1000, 2, 9};
  size_t rc[4] = {1, 1, 0, 4}, rd[4] = {5, 0, 500, 1};
  a = (ncclxCollArgs){.coll = NCCLX_COLL_ALLTOALLV, .datatype = ncclxFloat64, .sendcounts = sc,
                      .sdispls = sd, .recvcounts = rc, .rdispls = rd};
  EXPECT(a, 4, 0, 10 * 8, 6 * 8, 1);
  size_t zero[4] = {0, 0, 0, 0};
  a.sendcounts = a.recvcounts = zero;
  EXPECT(a, 4, 0, 0, 0, 1);

  if (failures) return 1;
  printf("test_gpu_extent: staging extents of every collective as expected\n");
  return 0;
}
