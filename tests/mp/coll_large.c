/* Large messages: 64 MiB of float32 (16 Mi elements) through allreduce, allgather (64 MiB
 * gathered in total) and broadcast, with every element checked. Buffers come from
 * ncclxMemAlloc and are registered with the communicator, as a training job would do.
 * Launched with run_mp.sh at 2 and 3 ranks. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mp_util.h"

#define COUNT ((size_t)16 << 20)

static int g_rank, g_nranks;
static long g_bad;

#define CALL(comm, expr) MP_CALL(g_rank, comm, expr)

static void report(const char* coll, size_t idx, float got, float exp) {
  if (g_bad++ < 5)
    fprintf(stderr, "rank %d: MISMATCH %s dtype=float32 count=%zu index %zu: got %.9g expected %.9g\n",
            g_rank, coll, COUNT, idx, got, exp);
}

/* Small integers: every partial sum is exact in float32. */
static float value(int rank, size_t i) { return (float)((rank * 7 + (int)(i % 1013)) % 29); }

static void* alloc(ncclxComm_t comm, size_t bytes, void** handle) {
  void* p = NULL;
  CALL(comm, ncclxMemAlloc(&p, bytes));
  CALL(comm, ncclxCommRegister(comm, p, bytes, handle));
  return p;
}

static void release(ncclxComm_t comm, void* p, void* handle) {
  CALL(comm, ncclxCommDeregister(comm, handle));
  CALL(comm, ncclxMemFree(p));
}

int main(void) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  ncclxComm_t comm;
  g_rank = mpEnvInt("OMPI_COMM_WORLD_RANK");
  CALL(NULL, ncclxCommInitFromEnv(&comm));
  CALL(comm, ncclxCommUserRank(comm, &g_rank));
  CALL(comm, ncclxCommCount(comm, &g_nranks));
  size_t bytes = COUNT * sizeof(float);
  void *hs, *hr;
  float* s = alloc(comm, bytes, &hs);
  float* r = alloc(comm, bytes, &hr);

  /* allreduce, out of place then in place */
  for (size_t i = 0; i < COUNT; i++) s[i] = value(g_rank, i);
  double t0 = mpNow();
  CALL(comm, ncclxAllReduce(s, r, COUNT, ncclxFloat32, ncclxSum, comm, NULL));
  double tAr = mpNow() - t0;
  for (size_t i = 0; i < COUNT; i++) {
    float exp = 0;
    for (int q = 0; q < g_nranks; q++) exp += value(q, i);
    if (r[i] != exp) report("allreduce", i, r[i], exp);
    if (s[i] != value(g_rank, i)) report("allreduce (sendbuff modified)", i, s[i], value(g_rank, i));
  }
  CALL(comm, ncclxAllReduce(s, s, COUNT, ncclxFloat32, ncclxMax, comm, NULL));
  for (size_t i = 0; i < COUNT; i++) {
    float exp = value(0, i);
    for (int q = 1; q < g_nranks; q++) exp = value(q, i) > exp ? value(q, i) : exp;
    if (s[i] != exp) report("allreduce in-place max", i, s[i], exp);
  }

  /* allgather: every rank contributes COUNT / nranks elements (odd count on purpose). */
  size_t per = (COUNT / (size_t)g_nranks) | 1u;
  if (per * (size_t)g_nranks > COUNT) per -= 2;
  for (size_t i = 0; i < per; i++) s[i] = (float)(g_rank * 1000003 + (int)(i % 4096));
  memset(r, 0, bytes);
  t0 = mpNow();
  CALL(comm, ncclxAllGather(s, r, per, ncclxFloat32, comm, NULL));
  double tAg = mpNow() - t0;
  for (int q = 0; q < g_nranks; q++)
    for (size_t i = 0; i < per; i++) {
      float exp = (float)(q * 1000003 + (int)(i % 4096));
      if (r[(size_t)q * per + i] != exp) report("allgather", (size_t)q * per + i, r[(size_t)q * per + i], exp);
    }

  /* broadcast from the last rank, in place */
  int root = g_nranks - 1;
  for (size_t i = 0; i < COUNT; i++) s[i] = g_rank == root ? (float)(i % 65521) : -1.0f;
  t0 = mpNow();
  CALL(comm, ncclxBroadcast(s, s, COUNT, ncclxFloat32, root, comm, NULL));
  double tBc = mpNow() - t0;
  for (size_t i = 0; i < COUNT; i++)
    if (s[i] != (float)(i % 65521)) report("broadcast", i, s[i], (float)(i % 65521));

  int64_t mine = g_bad, total = 0;
  CALL(comm, ncclxAllReduce(&mine, &total, 1, ncclxInt64, ncclxSum, comm, NULL));
  release(comm, s, hs);
  release(comm, r, hr);
  CALL(comm, ncclxCommFinalize(comm));
  CALL(comm, ncclxCommDestroy(comm));
  if (g_rank == 0)
    printf("coll_large: %d ranks, 64 MiB: allreduce %.2f s (%.0f MB/s), allgather %.2f s, broadcast %.2f s; "
           "%lld mismatches: %s\n",
           g_nranks, tAr, (double)bytes / tAr / 1e6, tAg, tBc, (long long)total, total ? "FAIL" : "PASS");
  return g_bad ? 1 : 0;
}
