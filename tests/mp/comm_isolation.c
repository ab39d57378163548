/* Communicators with the same members and rank numbers must never see each other's
 * traffic. Each communicator carries different values, so any mix-up shows as a wrong sum
 * (or a hang that the timeout turns into an error).
 *
 *   1. dup = split(world, color 0, key rank): same ranks, same numbering; allreduces
 *      alternate between dup and world, dup first so its connections are made first.
 *   2. sub = split(world) with the last rank opting out (NCCLX_SPLIT_NOCOLOR): ranks
 *      0..n-2 keep their numbers; allreduce on sub, destroy sub, then allreduce on world.
 *   3. two more dups busy at the same time on two streams.
 * Launched with run_mp.sh. */
#include <stdio.h>
#include <stdlib.h>

#include "mp_util.h"

#define N 4099

static int g_rank, g_nranks;
static long g_bad;

#define CALL(comm, expr) MP_CALL(g_rank, comm, expr)

static void fill(int64_t* v, int64_t scale) {
  for (int i = 0; i < N; i++) v[i] = (g_rank + 1) * scale + i;
}

/* Sum over `members` ranks 0..members-1 of (r+1)*scale + i. */
static void check(const char* what, const int64_t* r, int64_t scale, int members) {
  int64_t tri = (int64_t)members * (members + 1) / 2;
  for (int i = 0; i < N; i++) {
    int64_t exp = tri * scale + (int64_t)members * i;
    if (r[i] != exp && g_bad++ < 10)
      fprintf(stderr, "rank %d: MISMATCH %s index %d: got %lld expected %lld\n", g_rank, what, i,
              (long long)r[i], (long long)exp);
  }
}

static void allreduce(ncclxComm_t comm, int64_t scale, int members, const char* what,
                      ncclxStream_t stream, int64_t* s, int64_t* r) {
  fill(s, scale);
  CALL(comm, ncclxAllReduce(s, r, N, ncclxInt64, ncclxSum, comm, stream));
  if (!stream) check(what, r, scale, members);
}

int main(void) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  ncclxComm_t world, dup, sub, d1, d2;
  g_rank = mpEnvInt("OMPI_COMM_WORLD_RANK");
  CALL(NULL, ncclxCommInitFromEnv(&world));
  CALL(world, ncclxCommUserRank(world, &g_rank));
  CALL(world, ncclxCommCount(world, &g_nranks));
  int64_t *s = malloc(N * sizeof(int64_t)), *r = malloc(N * sizeof(int64_t));

  CALL(world, ncclxCommSplit(world, 0, g_rank, &dup, NULL));
  for (int round = 0; round < 4; round++) {
    allreduce(dup, 1000, g_nranks, "dup allreduce", NULL, s, r);
    allreduce(world, 1, g_nranks, "world allreduce", NULL, s, r);
  }

  int out = g_rank == g_nranks - 1;
  CALL(world, ncclxCommSplit(world, out ? NCCLX_SPLIT_NOCOLOR : 0, g_rank, &sub, NULL));
  if (!out) {
    allreduce(sub, 1000000, g_nranks - 1, "nocolor-sub allreduce", NULL, s, r);
    CALL(sub, ncclxCommDestroy(sub));
  }
  allreduce(world, 7, g_nranks, "world allreduce after the sub comm", NULL, s, r);
  allreduce(dup, 11, g_nranks, "dup allreduce after the sub comm", NULL, s, r);

  CALL(world, ncclxCommSplit(world, 0, g_rank, &d1, NULL));
  CALL(world, ncclxCommSplit(world, 0, g_rank, &d2, NULL));
  ncclxStream_t st1, st2;
  CALL(NULL, ncclxStreamCreate(&st1));
  CALL(NULL, ncclxStreamCreate(&st2));
  enum { K = 6 };
  int64_t *s1 = malloc(K * N * sizeof(int64_t)), *r1 = malloc(K * N * sizeof(int64_t));
  int64_t *s2 = malloc(K * N * sizeof(int64_t)), *r2 = malloc(K * N * sizeof(int64_t));
  for (int k = 0; k < K; k++) {
    allreduce(d1, 100 + k, g_nranks, "", st1, s1 + k * N, r1 + k * N);
    allreduce(d2, 200 + k, g_nranks, "", st2, s2 + k * N, r2 + k * N);
  }
  CALL(d1, ncclxStreamSynchronize(st1));
  CALL(d2, ncclxStreamSynchronize(st2));
  for (int k = 0; k < K; k++) {
    check("stream dup #1 allreduce", r1 + k * N, 100 + k, g_nranks);
    check("stream dup #2 allreduce", r2 + k * N, 200 + k, g_nranks);
  }
  CALL(NULL, ncclxStreamDestroy(st1));
  CALL(NULL, ncclxStreamDestroy(st2));
  CALL(d1, ncclxCommDestroy(d1));
  CALL(d2, ncclxCommDestroy(d2));
  CALL(dup, ncclxCommDestroy(dup));

  int64_t mine = g_bad, total = 0;
  CALL(world, ncclxAllReduce(&mine, &total, 1, ncclxInt64, ncclxSum, world, NULL));
  CALL(world, ncclxCommDestroy(world));
  if (g_rank == 0)
    printf("comm_isolation: %d ranks, %lld mismatches: %s\n", g_nranks, (long long)total,
           total ? "FAIL" : "PASS");
  free(s); free(r); free(s1); free(r1); free(s2); free(r2);
  return g_bad ? 1 : 0;
}
