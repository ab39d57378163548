/* AllToAllvDynamic and the MoE helpers are a feature module (ncclx/module.h, [modules] moe):
 * loaded, they serve every call of ncclx/moe.h; switched off, named wrongly, replaced by a
 * file that is not a module or by a module of another family, every call fails with
 * ncclxInvalidUsage naming the module, the ini key and the reason, nothing is queued, and the
 * communicator stays usable.
 *
 *   a2av_module on|off|missing|notmodule|otherfamily|differ
 *   a2av_module loadfail MODULE_DIR
 *
 * CTest sets NCCLX_MODULES_MOE for each mode. One rank: the point is the loading.
 * differ: two ranks, rank 1 with the module off: init fails on both, naming the setting.
 * loadfail: two ranks with the same setting, a relative path that only rank 0 can load (it
 * runs in MODULE_DIR, rank 1 in an empty folder): modules load at init, so init fails on both
 * instead of rank 1 failing alone at its first call while rank 0 waits in it. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "mp_fork.h"
#include "mp_util.h"
#include "ncclx.h"
#include "ncclx/moe.h"

static int failures;

static void expect(int ok, const char* what) {
  if (!ok) {
    fprintf(stderr, "FAIL: %s\n", what);
    failures++;
  }
}

static void expectRefused(const char* call, ncclxResult_t res, ncclxComm_t comm, const char* word) {
  const char* why = ncclxGetLastError(comm);
  printf("%s: %s: %s\n", call, ncclxGetErrorString(res), why);
  int ok = res == ncclxInvalidUsage && strstr(why, call) && strstr(why, "AllToAllvDynamic/MoE module") &&
           strstr(why, "[modules] moe") && strstr(why, "NCCLX_MODULES_MOE") && strstr(why, word);
  if (!ok)
    fprintf(stderr, "FAIL: %s: expected ncclxInvalidUsage naming the call, the module, [modules] moe and '%s'\n",
            call, word);
  failures += !ok;
}

/* Every call of the family, on one rank. With the module: results checked. Without: each
 * refused, naming `word`. */
static void everyCall(ncclxComm_t comm, const char* word) {
  float send[4] = {1, 2, 3, 4}, recv[8] = {0};
  size_t sendcounts[1] = {4}, recvcounts[1] = {0}, rdispls[1] = {9};
  ncclxMoeConfig_t cfg = {.size = sizeof(cfg), .nExperts = 2, .topk = 1, .hidden = 2, .datatype = ncclxFloat32,
                          .maxTokens = 2, .maxRecvTokens = 4};
  ncclxMoe_t moe = (ncclxMoe_t)0x1;
  if (!word) {
    ncclxResult_t a = ncclxAllToAllvDynamic(send, sendcounts, recv, 8, recvcounts, ncclxFloat32, comm, NULL);
    expect(a == ncclxSuccess && recvcounts[0] == 4 && recv[3] == 4, "ncclxAllToAllvDynamic with the module loaded");
    ncclxResult_t b = ncclxAllToAllvDynamicCompact(send, sendcounts, recv + 4, 4, recvcounts, rdispls, ncclxFloat32,
                                                   comm, NULL);
    expect(b == ncclxSuccess && recvcounts[0] == 4 && rdispls[0] == 0 && recv[7] == 4,
           "ncclxAllToAllvDynamicCompact with the module loaded");
    ncclxResult_t c = ncclxMoeCreate(&moe, &cfg, comm);
    expect(c == ncclxSuccess && moe, "ncclxMoeCreate fails with the module loaded");
    if (c != ncclxSuccess) return;
    float tokens[4] = {1, 2, 3, 4}, in[8], out[4], w[2] = {0.5f, 2.0f};
    int32_t ids[2] = {1, 0};
    size_t counts[2], dropped[2] = {9, 9};
    int first = -1, nl = -1;
    expect(ncclxMoeLocalExperts(moe, &first, &nl) == ncclxSuccess && first == 0 && nl == 2, "local experts");
    expect(ncclxMoeDispatch(moe, tokens, 2, ids, in, counts, NULL) == ncclxSuccess, "dispatch");
    expect(counts[0] == 1 && counts[1] == 1 && in[0] == 3 && in[2] == 1, "dispatch groups rows by expert");
    expect(ncclxMoeDroppedCounts(moe, dropped) == ncclxSuccess && !dropped[0] && !dropped[1], "dropped counts");
    expect(ncclxMoeCombine(moe, in, w, out, NULL) == ncclxSuccess, "combine");
    expect(out[0] == 0.5f && out[1] == 1.0f && out[2] == 6.0f && out[3] == 8.0f, "combine scales by the weights");
    expect(ncclxMoeDestroy(moe) == ncclxSuccess, "destroy");
    return;
  }
  expectRefused("ncclxAllToAllvDynamic",
                ncclxAllToAllvDynamic(send, sendcounts, recv, 8, recvcounts, ncclxFloat32, comm, NULL), comm, word);
  expectRefused("ncclxAllToAllvDynamicCompact",
                ncclxAllToAllvDynamicCompact(send, sendcounts, recv + 4, 4, recvcounts, rdispls, ncclxFloat32, comm,
                                             NULL),
                comm, word);
  expectRefused("ncclxMoeCreate", ncclxMoeCreate(&moe, &cfg, comm), comm, word);
  expect(moe == NULL, "a refused ncclxMoeCreate leaves *moe set");
  /* No handle can exist without the module: calls with any pointer are refused the same. */
  float x[2];
  size_t n[2];
  int32_t id = 0;
  expectRefused("ncclxMoeDestroy", ncclxMoeDestroy(NULL), comm, word);
  expectRefused("ncclxMoeLocalExperts", ncclxMoeLocalExperts(NULL, NULL, NULL), comm, word);
  expectRefused("ncclxMoeDispatch", ncclxMoeDispatch(NULL, x, 1, &id, x, n, NULL), comm, word);
  expectRefused("ncclxMoeDroppedCounts", ncclxMoeDroppedCounts(NULL, n), comm, word);
  expectRefused("ncclxMoeCombine", ncclxMoeCombine(NULL, x, x, x, NULL), comm, word);
}

static int differRank(int rank, int nranks, ncclxUniqueId id, void* arg) {
  (void)arg;
  if (rank == 1) setenv("NCCLX_MODULES_MOE", "off", 1); /* before this process reads its config */
  ncclxComm_t comm = NULL;
  ncclxResult_t res = ncclxCommInitRank(&comm, nranks, id, rank);
  const char* why = ncclxGetLastError(NULL);
  printf("rank %d: init %s: %s\n", rank, ncclxGetErrorString(res), why);
  if (res == ncclxSuccess) {
    ncclxCommDestroy(comm);
    return 1;
  }
  return res == ncclxInvalidUsage && strstr(why, "[modules]") && strstr(why, "moe = ") ? 0 : 1;
}

static const char* moduleDir;

static int loadfailRank(int rank, int nranks, ncclxUniqueId id, void* arg) {
  (void)arg;
  char empty[] = "/tmp/a2av_module.XXXXXX";
  if (chdir(rank == 0 ? moduleDir : mkdtemp(empty)) != 0) return 2;
  setenv("NCCLX_MODULES_MOE", "./libncclx-module-moe.so", 1);
  ncclxComm_t comm = NULL;
  ncclxResult_t res = ncclxCommInitRank(&comm, nranks, id, rank);
  const char* why = ncclxGetLastError(NULL);
  printf("rank %d: init %s: %s\n", rank, ncclxGetErrorString(res), why);
  if (rank == 1) rmdir(empty);
  if (res == ncclxSuccess) {
    ncclxCommDestroy(comm);
    return 1;
  }
  int named = rank == 0 ? strstr(why, "rank 1's [modules] settings or loaded modules differ") != NULL
                        : strstr(why, "moe = ./libncclx-module-moe.so (not loaded: ") != NULL;
  return res == ncclxInvalidUsage && named ? 0 : 1;
}

static int twoRanks(mpRankFn fn, const char* what) {
  int bad = mpRunJob(2, fn, NULL, 30);
  printf("a2av_module %s: %s\n", what, bad ? "FAIL (both ranks must fail init naming the modules)" : "PASS");
  return bad ? 1 : 0;
}

int main(int argc, char** argv) {
  const char* mode = argc > 1 ? argv[1] : "";
  if (!strcmp(mode, "differ")) return twoRanks(differRank, "differ");
  if (!strcmp(mode, "loadfail") && argc > 2) {
    moduleDir = argv[2];
    return twoRanks(loadfailRank, "loadfail");
  }
  const char* word = !strcmp(mode, "on")            ? NULL
                     : !strcmp(mode, "off")         ? "switched off"
                     : !strcmp(mode, "missing")     ? "libncclx-module-nosuch.so"
                     : !strcmp(mode, "notmodule")   ? "ncclxModule_v1"
                     : !strcmp(mode, "otherfamily") ? "does not implement the family"
                                                    : "";
  if (word && !word[0]) {
    fprintf(stderr, "usage: %s on|off|missing|notmodule|otherfamily|differ\n", argv[0]);
    return 2;
  }
  ncclxUniqueId id;
  ncclxComm_t comm;
  if (ncclxGetUniqueId(&id) != ncclxSuccess || ncclxCommInitRank(&comm, 1, id, 0) != ncclxSuccess) {
    fprintf(stderr, "FAIL: init: %s\n", ncclxGetLastError(NULL));
    return 1;
  }
  everyCall(comm, word);
  /* The communicator still works after the refusals. */
  float x = 1, y = 0;
  expect(ncclxAllReduce(&x, &y, 1, ncclxFloat32, ncclxSum, comm, NULL) == ncclxSuccess && y == 1.0f,
         "the communicator is not usable after the refusals");
  ncclxCommDestroy(comm);
  printf("a2av_module %s: %s\n", mode, failures ? "FAIL" : "PASS");
  return failures != 0;
}
