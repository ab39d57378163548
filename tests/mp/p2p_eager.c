/* Ungrouped sends before receives on both ranks of a pair, from ncclxMemAlloc buffers:
 *
 *   p2p_eager   every rank sends ROUNDS messages of each size up to one shared-memory slot
 *               (64 KiB by default) to its partner (rank ^ 1) on the NULL stream, each send
 *               before the matching receive, and checks what it receives.
 *
 * Such a send must complete once copied into a slot, as it does from any other buffer: the
 * transport may move a collective's message of that size straight out of a mapped
 * allocation, where the send completes only when the receiver has copied it, but not an
 * application's send (ncclxShmSendKind). A send that waited here would wait for a receive
 * its partner posts only after its own send: both ranks fail at the timeout (10 s). */
#include <stdio.h>
#include <stdlib.h>

#include "mp_util.h"

#define ROUNDS 8

static int g_rank;
#define CALL(comm, expr) MP_CALL(g_rank, comm, expr)

static float value(int rank, int round, size_t i) { return (float)(rank * 1000 + round * 10 + (int)(i % 7)); }

int main(void) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  ncclxComm_t comm;
  int nranks;
  g_rank = mpEnvInt("OMPI_COMM_WORLD_RANK");
  CALL(NULL, ncclxCommInitFromEnv(&comm));
  CALL(comm, ncclxCommUserRank(comm, &g_rank));
  CALL(comm, ncclxCommCount(comm, &nranks));
  int peer = g_rank ^ 1;
  if (peer >= nranks) { /* an odd rank count: the last rank has no partner */
    CALL(comm, ncclxCommDestroy(comm));
    return 0;
  }
  const size_t sizes[] = {4096, 8192, 40000, 65536}; /* bytes */
  size_t maxBytes = 65536;
  float *s = NULL, *r = NULL;
  CALL(comm, ncclxMemAlloc((void**)&s, maxBytes));
  CALL(comm, ncclxMemAlloc((void**)&r, maxBytes));
  long bad = 0;
  for (size_t k = 0; k < sizeof(sizes) / sizeof(sizes[0]); k++) {
    size_t count = sizes[k] / sizeof(float);
    for (int round = 0; round < ROUNDS; round++) {
      for (size_t i = 0; i < count; i++) s[i] = value(g_rank, round, i);
      CALL(comm, ncclxSend(s, count, ncclxFloat32, peer, comm, NULL));
      CALL(comm, ncclxRecv(r, count, ncclxFloat32, peer, comm, NULL));
      for (size_t i = 0; i < count; i++)
        if (r[i] != value(peer, round, i) && bad++ < 5)
          fprintf(stderr, "rank %d: MISMATCH %zu-byte message %d, index %zu: got %g expected %g\n", g_rank,
                  sizes[k], round, i, (double)r[i], (double)value(peer, round, i));
    }
  }
  CALL(comm, ncclxMemFree(s));
  CALL(comm, ncclxMemFree(r));
  CALL(comm, ncclxCommDestroy(comm));
  printf("rank %d: p2p_eager %s\n", g_rank, bad ? "FAIL" : "ok");
  return bad ? 1 : 0;
}
