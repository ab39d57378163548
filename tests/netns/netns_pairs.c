/* Every pair of ranks exchanges data once, on a communicator that connects all pairs during
 * init (run it with NCCLX_CORE_LAZY_CONNECT=0), so each rank's log holds exactly one
 * "accepted <transport> connection from rank P" line per peer and netns_test.py can check
 * which transport each pair used: shared memory within an emulated host, the network
 * between hosts.
 *
 *   netns_pairs            (under tools/ncclx-hosts; exit 0 when every value arrived) */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "ncclx.h"

#define PER_PEER 4096 /* int32 per peer: above one small message, below the big-message path */

static int32_t value(int from, int to, size_t i) { return (int32_t)(from * 1000003 + to * 7919 + (int)i); }

int main(void) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  ncclxComm_t comm = NULL;
  ncclxResult_t res = ncclxCommInitFromEnv(&comm);
  if (res != ncclxSuccess) {
    fprintf(stderr, "netns_pairs: init failed: %s: %s\n", ncclxGetErrorString(res),
            ncclxGetLastError(NULL));
    return 1;
  }
  int rank = -1, n = 0;
  ncclxCommUserRank(comm, &rank);
  ncclxCommCount(comm, &n);
  int32_t* send = malloc((size_t)n * PER_PEER * sizeof(int32_t));
  int32_t* recv = malloc((size_t)n * PER_PEER * sizeof(int32_t));
  if (!send || !recv) return 1;
  for (int p = 0; p < n; p++)
    for (size_t i = 0; i < PER_PEER; i++) send[(size_t)p * PER_PEER + i] = value(rank, p, i);
  res = ncclxAllToAll(send, recv, PER_PEER, ncclxInt32, comm, NULL);
  if (res != ncclxSuccess) {
    fprintf(stderr, "netns_pairs: rank %d: alltoall failed: %s: %s\n", rank,
            ncclxGetErrorString(res), ncclxGetLastError(comm));
    return 1;
  }
  long bad = 0;
  for (int p = 0; p < n; p++)
    for (size_t i = 0; i < PER_PEER; i++)
      if (recv[(size_t)p * PER_PEER + i] != value(p, rank, i)) bad++;
  printf("netns_pairs: rank %d of %d: %d peers, %ld wrong values\n", rank, n, n - 1, bad);
  ncclxCommFinalize(comm);
  ncclxCommDestroy(comm);
  free(send);
  free(recv);
  return bad ? 1 : 0;
}
