/* NCCLX_FUSE_AUTO: the library's choice follows the callbacks' measured time, and a tuner
 * plugin's optional CommFuse entry pins it.
 *
 *   fuse_auto NP          with no compute, AUTO runs SEQUENTIAL (nothing to overlap); with
 *                         30 us of compute per 256 KiB block, about the transfer's time by
 *                         the built-in model (22 us), an overlapping schedule (RING_P2P,
 *                         SLICED or DIRECT_P2P); every call's gathered data is checked
 *                         (run with [core] fuse_auto_explore = 0: the model's choice alone)
 *   fuse_auto NP explore  with exploration (the default): 12 calls per phase, the model's
 *                         candidates measured in turn; every call's data is checked and the
 *                         schedule settled on is a concrete one
 *   fuse_auto NP pinned   run with NCCLX_TUNER_PLUGIN naming fuse_pin_tuner.c's plugin, which
 *                         pins SLICED(3): AUTO must run exactly that
 *
 * Each phase runs on a communicator of its own (docs/commfuse.md, "Automatic schedule") and
 * makes 12 calls. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "mp_fork.h"
#include "mp_util.h"
#include "ncclx/fuse.h"

#define COUNT 65536 /* floats per block: 256 KiB */

static double g_spinUs;

/* Compute in proportion to the elements, as a GEMM: the same per block however the schedule
 * cuts it into pieces. */
static int consumeSpin(void* user, int src, size_t off, const void* data, size_t count) {
  (void)user, (void)src, (void)off, (void)data;
  double end = mpNow() + g_spinUs * 1e-6 * (double)count / COUNT;
  while (g_spinUs > 0 && mpNow() < end) {
  }
  return 0;
}

/* Four AUTO calls on a fresh communicator; returns the schedule the last one ran (algo -1
 * on a failure, reported). */
/* 12 calls: the ranks compare times after calls 1 and 9 (and every 8th), each time the least
 * time since the last comparison, so a call slowed by preemption on a loaded machine does
 * not decide alone. */
static int g_calls = 12;

static ncclxFuseSchedule_t phase(ncclxComm_t parent, int rank, int nranks, double spinUs) {
  ncclxFuseSchedule_t ran = {(ncclxFuseAlgo_t)-1, 0, 0, 0.0};
  ncclxComm_t comm = NULL;
  MP_CALL(rank, parent, ncclxCommSplit(parent, 0, rank, &comm, NULL));
  g_spinUs = spinUs;
  float* send = malloc(COUNT * sizeof(float));
  float* recv = malloc((size_t)nranks * COUNT * sizeof(float));
  for (int call = 0; call < g_calls; call++) {
    for (size_t i = 0; i < COUNT; i++) send[i] = (float)(rank * 1000 + call + (int)(i % 97));
    MP_CALL(rank, comm, ncclxAllGatherCompute(send, recv, COUNT, ncclxFloat32, consumeSpin, NULL, NCCLX_FUSE_AUTO,
                                              comm, NULL));
    for (int b = 0; b < nranks; b++)
      for (size_t i = 0; i < COUNT; i++)
        if (recv[(size_t)b * COUNT + i] != (float)(b * 1000 + call + (int)(i % 97))) {
          fprintf(stderr, "rank %d: FAIL call %d: block %d element %zu wrong\n", rank, call, b, i);
          return ran;
        }
  }
  MP_CALL(rank, comm, ncclxFuseLastSchedule(comm, &ran));
  MP_CALL(rank, NULL, ncclxCommDestroy(comm));
  free(send);
  free(recv);
  return ran;
}

static int g_pinned, g_explore;

static int rankMain(int rank, int nranks, ncclxUniqueId id, void* arg) {
  (void)arg;
  ncclxComm_t comm = NULL;
  MP_CALL(rank, NULL, ncclxCommInitRank(&comm, nranks, id, rank));
  int bad = 0;
  if (g_explore) {
    ncclxFuseSchedule_t idle = phase(comm, rank, nranks, 0);
    ncclxFuseSchedule_t busy = phase(comm, rank, nranks, 30);
    printf("rank %d: settled on %s(%d) without compute, %s(%d) with 30 us per block\n", rank,
           ncclxFuseAlgoName(idle.algo), idle.slices, ncclxFuseAlgoName(busy.algo), busy.slices);
    bad = (unsigned)idle.algo >= ncclxFuseAuto || (unsigned)busy.algo >= ncclxFuseAuto;
  } else if (g_pinned) {
    ncclxFuseSchedule_t s = phase(comm, rank, nranks, 0);
    printf("rank %d: pinned by the tuner: %s(%d)\n", rank, ncclxFuseAlgoName(s.algo), s.slices);
    bad = s.algo != ncclxFuseSliced || s.slices != 3;
  } else {
    ncclxFuseSchedule_t idle = phase(comm, rank, nranks, 0);
    ncclxFuseSchedule_t busy = phase(comm, rank, nranks, 30);
    printf("rank %d: no compute: %s(%d); 30 us per block: %s(%d)\n", rank, ncclxFuseAlgoName(idle.algo), idle.slices,
           ncclxFuseAlgoName(busy.algo), busy.slices);
    bad = idle.algo != ncclxFuseSequential ||
          !(busy.algo == ncclxFuseRingP2P || busy.algo == ncclxFuseSliced || busy.algo == ncclxFuseDirectP2P);
  }
  if (bad) fprintf(stderr, "rank %d: FAIL: AUTO chose the wrong schedule\n", rank);
  MP_CALL(rank, comm, ncclxCommDestroy(comm));
  return bad;
}

int main(int argc, char** argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s NP [pinned]\n", argv[0]);
    return 2;
  }
  int np = atoi(argv[1]);
  g_pinned = argc > 2 && !strcmp(argv[2], "pinned");
  g_explore = argc > 2 && !strcmp(argv[2], "explore");
  ncclxUniqueId id;
  MP_CALL(-1, NULL, ncclxGetUniqueId(&id));
  mpJob job;
  mpJobInit(&job, np);
  double t0 = mpNow();
  for (int r = 0; r < np; r++) mpJobSpawn(&job, r, rankMain, id, NULL);
  int ranks[MP_MAX_RANKS];
  for (int r = 0; r < np; r++) ranks[r] = r;
  int stuck = mpJobWait(&job, ranks, np, t0 + 120);
  int bad = 0;
  char why[64];
  for (int r = 0; r < np; r++)
    if (!mpExitedZero(&job, r)) {
      fprintf(stderr, "fuse_auto: rank %d: %s\n", r, mpDescribeStatus(&job, r, why, sizeof(why)));
      bad++;
    }
  if (stuck) mpJobKillRest(&job);
  printf("fuse_auto np %d%s: %s in %.1f s\n", np, g_pinned ? " pinned" : g_explore ? " explore" : "",
         bad ? "FAILED" : "passed", mpNow() - t0);
  return bad ? 1 : 0;
}
