/* The CUDA build of libncclx links into a program and serves host memory like any build:
 * two forked ranks run allreduces (float32 sum, bfloat16 max) and a stream-queued
 * allgather on host buffers and check the results, then the parent confirms it is talking
 * to a CUDA build (ncclxCudaGetDeviceCount is not "built without CUDA"). Runs everywhere,
 * GPU or not: this is what proves the CPU suite's assumptions hold for the CUDA build. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ncclx.h"
#include "ncclx/cuda.h"

#define N 10007

static int fail(int rank, const char* what, ncclxComm_t comm) {
  fprintf(stderr, "rank %d: %s: %s\n", rank, what, ncclxGetLastError(comm));
  return 1;
}

static uint16_t bf16(float f) { /* exact for the small integers used here */
  uint32_t u;
  memcpy(&u, &f, 4);
  return (uint16_t)(u >> 16);
}

static int runRank(ncclxUniqueId id, int rank) {
  ncclxComm_t comm;
  if (ncclxCommInitRank(&comm, 2, id, rank) != ncclxSuccess) return fail(rank, "init", NULL);
  float* in = malloc(N * sizeof(float));
  float* out = malloc(2 * N * sizeof(float));
  uint16_t* h = malloc(N * sizeof(uint16_t));
  for (int i = 0; i < N; i++) in[i] = (float)(rank + 1) * (float)(i % 13), h[i] = bf16((float)(rank * 7 + i % 5));
  if (ncclxAllReduce(in, out, N, ncclxFloat32, ncclxSum, comm, NULL) != ncclxSuccess) return fail(rank, "allreduce", comm);
  for (int i = 0; i < N; i++)
    if (out[i] != 3.0f * (float)(i % 13)) return fprintf(stderr, "rank %d: sum[%d] = %g\n", rank, i, out[i]), 1;
  if (ncclxAllReduce(h, h, N, ncclxBfloat16, ncclxMax, comm, NULL) != ncclxSuccess) return fail(rank, "bf16 allreduce", comm);
  for (int i = 0; i < N; i++)
    if (h[i] != bf16((float)(7 + i % 5))) return fprintf(stderr, "rank %d: max[%d] = %#x\n", rank, i, h[i]), 1;
  ncclxStream_t s;
  if (ncclxStreamCreate(&s) != ncclxSuccess) return fail(rank, "stream", NULL);
  if (ncclxAllGather(in, out, N, ncclxFloat32, comm, s) != ncclxSuccess) return fail(rank, "allgather", comm);
  if (ncclxStreamSynchronize(s) != ncclxSuccess) return fail(rank, "stream synchronize", comm);
  for (int r = 0; r < 2; r++)
    for (int i = 0; i < N; i++)
      if (out[r * N + i] != (float)(r + 1) * (float)(i % 13))
        return fprintf(stderr, "rank %d: allgather[%d][%d] = %g\n", rank, r, i, out[r * N + i]), 1;
  ncclxStreamDestroy(s);
  if (ncclxCommDestroy(comm) != ncclxSuccess) return fail(rank, "destroy", NULL);
  free(in), free(out), free(h);
  return 0;
}

int main(void) {
  ncclxUniqueId id;
  if (ncclxGetUniqueId(&id) != ncclxSuccess) return fail(-1, "unique id", NULL);
  pid_t pids[2];
  for (int r = 0; r < 2; r++) {
    if ((pids[r] = fork()) < 0) return perror("fork"), 1;
    if (pids[r] == 0) {
      alarm(120); /* a hang is a failure */
      exit(runRank(id, r));
    }
  }
  int failed = 0;
  for (int r = 0; r < 2; r++) {
    int st;
    if (waitpid(pids[r], &st, 0) < 0 || !WIFEXITED(st) || WEXITSTATUS(st) != 0) failed = 1;
  }
  if (failed) return fprintf(stderr, "gpu_links: a rank failed\n"), 1;
  /* After the ranks: the CUDA runtime starts only now, in the parent. */
  int n = -1;
  ncclxResult_t res = ncclxCudaGetDeviceCount(&n);
  if (res == ncclxInvalidUsage) {
    fprintf(stderr, "gpu_links: libncclx was built without CUDA: %s\n", ncclxGetLastError(NULL));
    return 1;
  }
  printf("gpu_links: CUDA build of libncclx runs 2-rank host collectives (CUDA devices: %d%s%s)\n",
         n, res == ncclxSuccess ? "" : ", ", res == ncclxSuccess ? "" : ncclxGetLastError(NULL));
  return 0;
}
