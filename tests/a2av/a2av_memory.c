/* a2av_memory NP: what the dynamic exchange keeps per communicator, measured.
 *
 * Forks NP ranks (linked with the internal archive, so the communicator's fields are
 * visible). Each runs plain and compact dynamic all-to-alls and MoE dispatch/combine with
 * per-peer blocks from 0 to 4 MiB, then reports the communicator's scratch area (where the
 * engine keeps its staging; nothing else in these runs uses it) and the growth of the
 * process's resident memory, and fails when the scratch area exceeds 1 MiB per peer. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "comm/comm.h"
#include "ncclx/moe.h"

#define CHECK(rank, call)                                                                \
  do {                                                                                   \
    ncclxResult_t r_ = (call);                                                           \
    if (r_ != ncclxSuccess) {                                                            \
      fprintf(stderr, "rank %d: %s failed: %s\n", rank, #call, ncclxGetLastError(NULL)); \
      exit(1);                                                                           \
    }                                                                                    \
  } while (0)

static long rssKiB(void) {
  FILE* f = fopen("/proc/self/status", "r");
  char line[256];
  long v = -1;
  while (f && fgets(line, sizeof line, f))
    if (sscanf(line, "VmRSS: %ld", &v) == 1) break;
  if (f) fclose(f);
  return v;
}

static int rankMain(int rank, int np, ncclxUniqueId id) {
  alarm(120); /* never hang a test run */
  ncclxComm_t comm;
  CHECK(rank, ncclxCommInitRank(&comm, np, id, rank));
  long rss0 = rssKiB();
  size_t maxCount = (size_t)4 << 20; /* int8 elements per peer */
  char* send = calloc(maxCount * (size_t)np, 1);
  char* recv = calloc(maxCount * (size_t)np, 1);
  size_t sendcounts[64], recvcounts[64], rdispls[64];
  for (size_t count = 0; count <= maxCount; count = count ? count * 4 : 1) {
    for (int p = 0; p < np; p++) sendcounts[p] = count;
    CHECK(rank, ncclxAllToAllvDynamic(send, sendcounts, recv, maxCount, recvcounts, ncclxInt8, comm, NULL));
    CHECK(rank, ncclxAllToAllvDynamicCompact(send, sendcounts, recv, maxCount * (size_t)np, recvcounts, rdispls,
                                             ncclxInt8, comm, NULL));
  }
  /* MoE with 8 KiB rows, 256 tokens, top-2 of 2 experts per rank: scattered receives. */
  ncclxMoeConfig_t cfg = {.size = sizeof(cfg),
                          .nExperts = 2 * np,
                          .topk = 2,
                          .hidden = 4096,
                          .datatype = ncclxBfloat16,
                          .maxTokens = 256,
                          .maxRecvTokens = 512 * (size_t)np};
  ncclxMoe_t moe;
  CHECK(rank, ncclxMoeCreate(&moe, &cfg, comm));
  size_t rowBytes = 4096 * 2;
  char* tokens = calloc(256, rowBytes);
  char* in = calloc(cfg.maxRecvTokens, rowBytes);
  char* out = calloc(256, rowBytes);
  int32_t ids[512];
  float weights[512];
  size_t counts[2];
  for (int i = 0; i < 512; i++) ids[i] = (i * 7 + rank) % (2 * np), weights[i] = 0.5f;
  CHECK(rank, ncclxMoeDispatch(moe, tokens, 256, ids, in, counts, NULL));
  CHECK(rank, ncclxMoeCombine(moe, in, weights, out, NULL));
  CHECK(rank, ncclxMoeDestroy(moe));
  long rss1 = rssKiB();
  struct ncclxComm* c = comm;
  size_t scratch = c->scratchSize, bound = (size_t)(np > 1 ? np - 1 : 1) << 20;
  printf(
      "a2av_memory: rank %d of %d: engine staging (comm scratch) %zu KiB = %.0f KiB per peer "
      "(bound 1024); resident memory grew %ld KiB, of which at most %zu KiB are user buffers and %zu KiB "
      "the MoE handle's staging\n",
      rank, np, scratch >> 10, np > 1 ? (double)(scratch >> 10) / (np - 1) : 0.0, rss1 - rss0,
      (2 * maxCount * (size_t)np + (cfg.maxRecvTokens + 512) * rowBytes) >> 10, (512 * rowBytes) >> 10);
  free(send), free(recv), free(tokens), free(in), free(out);
  CHECK(rank, ncclxCommDestroy(comm));
  return scratch <= bound ? 0 : 1;
}

int main(int argc, char** argv) {
  int np = argc > 1 ? atoi(argv[1]) : 0;
  if (np < 1 || np > 64) {
    fprintf(stderr, "usage: %s NP (1..64)\n", argv[0]);
    return 2;
  }
  ncclxUniqueId id;
  CHECK(-1, ncclxGetUniqueId(&id));
  fflush(stdout);
  for (int r = 0; r < np; r++)
    if (fork() == 0) exit(rankMain(r, np, id));
  int bad = 0;
  for (int r = 0; r < np; r++) {
    int st;
    if (wait(&st) < 0 || !WIFEXITED(st) || WEXITSTATUS(st) != 0) bad++;
  }
  printf("a2av_memory: %d ranks: %s\n", np, bad ? "FAILED" : "ok");
  return bad ? 1 : 0;
}
