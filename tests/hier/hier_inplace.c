/* What tests/mp/coll_check does not cover for the hierarchical algorithms: in-place
 * all-to-all (the per-host aggregation stages each window before overwriting it), at block
 * sizes that split into several windows with a remainder, and in-place all-reduce on the
 * leaders' ring path. Launched like coll_check (run_mp.sh + as_host.sh); the algorithm is
 * whatever NCCLX_ALGO forces.
 *
 *   hier_inplace
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mp_util.h"

static int rank, nranks;
static ncclxComm_t comm;
static int64_t failures;

/* Byte i of the block rank src sends to rank dst. */
static unsigned char a2aByte(int src, int dst, size_t i, int trial) {
  return (unsigned char)(mpHash((uint64_t)src, (uint64_t)dst, i, (uint64_t)trial) & 0xff);
}

static void alltoallCase(size_t count, ncclxDataType_t type, int inPlace, int trial) {
  size_t blk = count * mpTypeSize(type), total = blk * (size_t)nranks;
  unsigned char* send = malloc(total + 1);
  unsigned char* recv = inPlace ? send : malloc(total + 1);
  for (int d = 0; d < nranks; d++)
    for (size_t i = 0; i < blk; i++) send[(size_t)d * blk + i] = a2aByte(rank, d, i, trial);
  if (!inPlace) memset(recv, 0xA5, total);
  MP_CALL(rank, comm, ncclxAllToAll(send, recv, count, type, comm, NULL));
  long bad = 0;
  for (int s = 0; s < nranks; s++)
    for (size_t i = 0; i < blk; i++) {
      unsigned char want = a2aByte(s, rank, i, trial), got = recv[(size_t)s * blk + i];
      if (got != want && bad++ < 3)
        fprintf(stderr, "rank %d: alltoall %s count %zu %s: byte %zu from rank %d is %u, want %u\n",
                rank, mpTypeName(type), count, inPlace ? "in place" : "out of place", i, s, got,
                want);
    }
  failures += bad;
  if (!inPlace) free(recv);
  free(send);
}

/* In-place sum of int64 values exact at any rank count; large enough for the ring path. */
static void allreduceCase(size_t count, int trial) {
  int64_t* buf = malloc(count * sizeof(*buf));
  for (size_t i = 0; i < count; i++) buf[i] = (int64_t)(mpHash((uint64_t)rank, i, (uint64_t)trial, 7) % 1000);
  MP_CALL(rank, comm, ncclxAllReduce(buf, buf, count, ncclxInt64, ncclxSum, comm, NULL));
  long bad = 0;
  for (size_t i = 0; i < count; i++) {
    int64_t want = 0;
    for (int r = 0; r < nranks; r++) want += (int64_t)(mpHash((uint64_t)r, i, (uint64_t)trial, 7) % 1000);
    if (buf[i] != want && bad++ < 3)
      fprintf(stderr, "rank %d: allreduce in place count %zu: element %zu is %lld, want %lld\n",
              rank, count, i, (long long)buf[i], (long long)want);
  }
  failures += bad;
  free(buf);
}

int main(void) {
  MP_CALL(-1, NULL, ncclxCommInitFromEnv(&comm));
  MP_CALL(-1, comm, ncclxCommUserRank(comm, &rank));
  MP_CALL(rank, comm, ncclxCommCount(comm, &nranks));
  /* Block sizes: tiny, odd, and (with 4 KiB chunks) several windows plus a remainder. */
  static const size_t counts[] = {1, 3, 1000, 33333};
  static const ncclxDataType_t types[] = {ncclxUint8, ncclxFloat32, ncclxInt64};
  int trial = 0;
  for (size_t c = 0; c < sizeof(counts) / sizeof(counts[0]); c++)
    for (size_t t = 0; t < sizeof(types) / sizeof(types[0]); t++)
      for (int inPlace = 0; inPlace <= 1; inPlace++)
        alltoallCase(counts[c], types[t], inPlace, trial++);
  allreduceCase(1, trial++);
  allreduceCase(100003, trial++);
  int64_t total = 0;
  MP_CALL(rank, comm, ncclxAllReduce(&failures, &total, 1, ncclxInt64, ncclxSum, comm, NULL));
  MP_CALL(rank, comm, ncclxCommDestroy(comm));
  if (rank == 0) printf("hier_inplace: %d ranks, %lld failures in total: %s\n", nranks, (long long)total,
                        total ? "FAIL" : "PASS");
  return total || failures ? 1 : 0;
}
