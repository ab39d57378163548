/* The library loads with dlopen (Python ctypes, plugin hosts), not only at startup: it must not
 * need the static TLS block (a CUDA build links cudart_static, whose TLS is page aligned),
 * and a 1-rank communicator made through dlsym'd entry points runs an all-reduce. */
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

#include "ncclx.h"

typedef ncclxResult_t (*getUniqueIdFn)(ncclxUniqueId*);
typedef ncclxResult_t (*initRankFn)(ncclxComm_t*, int, ncclxUniqueId, int);
typedef ncclxResult_t (*allReduceFn)(const void*, void*, size_t, ncclxDataType_t, ncclxRedOp_t,
                                     ncclxComm_t, ncclxStream_t);
typedef ncclxResult_t (*destroyFn)(ncclxComm_t);

int main(int argc, char** argv) {
  if (argc != 2) return fprintf(stderr, "usage: init_dlopen path/to/libncclx.so\n"), 2;
  void* h = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (!h) return fprintf(stderr, "dlopen %s failed: %s\n", argv[1], dlerror()), 1;
  getUniqueIdFn getId = (getUniqueIdFn)dlsym(h, "ncclxGetUniqueId");
  initRankFn initRank = (initRankFn)dlsym(h, "ncclxCommInitRank");
  allReduceFn allReduce = (allReduceFn)dlsym(h, "ncclxAllReduce");
  destroyFn destroy = (destroyFn)dlsym(h, "ncclxCommDestroy");
  if (!getId || !initRank || !allReduce || !destroy) return fprintf(stderr, "missing entry point\n"), 1;
  ncclxUniqueId id;
  ncclxComm_t comm = NULL;
  if (getId(&id) != ncclxSuccess || initRank(&comm, 1, id, 0) != ncclxSuccess)
    return fprintf(stderr, "cannot make a 1-rank communicator\n"), 1;
  float in[4] = {1, 2, 3, 4}, out[4] = {0};
  int ok = allReduce(in, out, 4, ncclxFloat32, ncclxSum, comm, NULL) == ncclxSuccess &&
           memcmp(in, out, sizeof in) == 0;
  destroy(comm);
  printf("init_dlopen: %s\n", ok ? "loaded and ran an all-reduce" : "all-reduce failed");
  return ok ? 0 : 1;
}
