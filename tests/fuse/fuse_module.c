/* CommFuse is a feature module (ncclx/module.h): with it switched off, named wrongly or
 * replaced by a file that is not a module, its calls fail with ncclxInvalidUsage naming the
 * module and the ini key, the communicator stays usable, and a loaded module serves them.
 *
 *   fuse_module on|off|missing|notmodule|differ|empty
 *
 * CTest sets NCCLX_MODULES_COMMFUSE for each mode. One rank: the point is the loading.
 * differ: two ranks, rank 1 with the module off: init fails on both, naming the setting
 * (ranks that load different modules would run different steps and wait for each other).
 * empty: two ranks, blocks of 0 elements under NCCLX_FUSE_AUTO (its cost model once read an
 * uninitialised candidate there and crashed): both calls succeed. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mp_fork.h"
#include "mp_util.h"
#include "ncclx.h"
#include "ncclx/fuse.h"

static int consumed;

static int consume(void* user, int src, size_t off, const void* data, size_t count) {
  (void)user, (void)src, (void)off;
  consumed += (int)count;
  return ((const float*)data)[0] == 7.0f ? 0 : 1;
}

static int expectRefused(ncclxResult_t res, ncclxComm_t comm, const char* word) {
  const char* why = ncclxGetLastError(comm);
  printf("ncclxAllGatherCompute: %s: %s\n", ncclxGetErrorString(res), why);
  int ok = res == ncclxInvalidUsage && strstr(why, "CommFuse module") && strstr(why, "[modules] commfuse") &&
           strstr(why, word);
  if (!ok) fprintf(stderr, "FAIL: expected ncclxInvalidUsage naming the CommFuse module, [modules] commfuse and '%s'\n", word);
  return ok ? 0 : 1;
}

static int differRank(int rank, int nranks, ncclxUniqueId id, void* arg) {
  (void)arg;
  if (rank == 1) setenv("NCCLX_MODULES_COMMFUSE", "off", 1); /* before this process reads its config */
  ncclxComm_t comm = NULL;
  ncclxResult_t res = ncclxCommInitRank(&comm, nranks, id, rank);
  const char* why = ncclxGetLastError(NULL);
  printf("rank %d: init %s: %s\n", rank, ncclxGetErrorString(res), why);
  if (res == ncclxSuccess) {
    ncclxCommDestroy(comm);
    return 1;
  }
  return res == ncclxInvalidUsage && strstr(why, "[modules]") && strstr(why, "commfuse = ") ? 0 : 1;
}

static int produceNothing(void* u, int d, size_t off, void* out, size_t n) {
  (void)u, (void)d, (void)off, (void)out, (void)n;
  return 0;
}

static int emptyRank(int rank, int nranks, ncclxUniqueId id, void* arg) {
  (void)arg;
  ncclxComm_t comm = NULL;
  if (ncclxCommInitRank(&comm, nranks, id, rank) != ncclxSuccess) return 2;
  float buf[1];
  ncclxResult_t a = ncclxAllGatherCompute(buf, buf, 0, ncclxFloat32, consume, NULL, NCCLX_FUSE_AUTO, comm, NULL);
  ncclxResult_t b = ncclxComputeReduceScatter(produceNothing, NULL, buf, 0, ncclxFloat32, ncclxSum, NCCLX_FUSE_AUTO,
                                              comm, NULL);
  printf("rank %d: empty blocks under AUTO: %s, %s\n", rank, ncclxGetErrorString(a), ncclxGetErrorString(b));
  ncclxCommDestroy(comm);
  return a != ncclxSuccess || b != ncclxSuccess;
}

static int twoRanks(mpRankFn fn, const char* what) {
  int bad = mpRunJob(2, fn, NULL, 30);
  printf("fuse_module %s: %s\n", what, bad ? "FAIL" : "PASS");
  return bad ? 1 : 0;
}

int main(int argc, char** argv) {
  const char* mode = argc > 1 ? argv[1] : "";
  if (!strcmp(mode, "differ")) return twoRanks(differRank, "differ");
  if (!strcmp(mode, "empty")) return twoRanks(emptyRank, "empty");
  ncclxUniqueId id;
  ncclxComm_t comm;
  if (ncclxGetUniqueId(&id) != ncclxSuccess || ncclxCommInitRank(&comm, 1, id, 0) != ncclxSuccess) {
    fprintf(stderr, "FAIL: init: %s\n", ncclxGetLastError(NULL));
    return 1;
  }
  float send[4] = {7, 7, 7, 7}, recv[4] = {0};
  ncclxResult_t res =
      ncclxAllGatherCompute(send, recv, 4, ncclxFloat32, consume, NULL, NCCLX_FUSE_SEQUENTIAL, comm, NULL);
  int bad = 0;
  if (!strcmp(mode, "on")) {
    bad = res != ncclxSuccess || consumed != 4 || recv[3] != 7.0f;
    if (bad) fprintf(stderr, "FAIL: %s, consumed %d, recv[3] %g: %s\n", ncclxGetErrorString(res), consumed, recv[3],
                     ncclxGetLastError(comm));
  } else if (!strcmp(mode, "off")) {
    bad = expectRefused(res, comm, "switched off");
  } else if (!strcmp(mode, "missing")) {
    bad = expectRefused(res, comm, "libncclx-module-nosuch.so");
  } else if (!strcmp(mode, "notmodule")) {
    bad = expectRefused(res, comm, "ncclxModule_v1");
  } else {
    fprintf(stderr, "usage: %s on|off|missing|notmodule\n", argv[0]);
    return 2;
  }
  /* Refused for a missing module, the communicator still works. */
  float x = 1, y = 0;
  if (ncclxAllReduce(&x, &y, 1, ncclxFloat32, ncclxSum, comm, NULL) != ncclxSuccess || y != 1.0f) {
    fprintf(stderr, "FAIL: the communicator is not usable after the refusal: %s\n", ncclxGetLastError(comm));
    bad = 1;
  }
  ncclxCommDestroy(comm);
  printf("fuse_module %s: %s\n", mode, bad ? "FAIL" : "PASS");
  return bad;
}
