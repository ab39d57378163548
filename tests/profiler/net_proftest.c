/* libncclx-net-proftest.so: a network plugin that reports every transfer to the profiler
 * through env->profiler, for tests/profiler/test_net_events.sh.
 *
 * It moves bytes with the out-of-tree template plugin (examples/net_plugin_template, compiled
 * into this object with its exported struct renamed to proftestInner) and wraps isend, irecv
 * and test: NET START when a request is accepted, one UPDATE and STOP when test() sees it
 * complete. The parent handle is the core's phandle (the STEP event, once the core passes
 * one) or NULL, which the core resolves to the running operation. The payload is
 * ProftestInfo; the plugin id below tells profilers whose payload it is. */
#include <stdlib.h>
#include <string.h>

#include "ncclx/net.h"
#include "ncclx/profiler.h"

#define PROFTEST_ID ((int64_t)0x7e0000f1)
#define PROFTEST_MAGIC 0x50524f46u

extern const ncclxNet_v1_t proftestInner;

typedef struct {
  unsigned magic;
  int isSend;
  size_t bytes; /* posted, then received */
} ProftestInfo;

typedef struct {
  void* inner;
  void* event; /* profiler handle, NULL when not recorded */
  ProftestInfo info;
} ProftestReq;

static ncclxProfilerCallback_t profiler; /* one network per process */

static ncclxResult_t ptInit(void** ctx, const ncclxPluginEnv_t* env) {
  profiler = env->profiler;
  return proftestInner.init(ctx, env);
}

/* Wraps an accepted inner request (NULL: the inner plugin asked to be called again). */
static ncclxResult_t wrap(ncclxResult_t res, void* inner, int isSend, size_t bytes, void* phandle,
                          void** request) {
  *request = NULL;
  if (res != ncclxSuccess || inner == NULL) return res;
  ProftestReq* r = calloc(1, sizeof(*r));
  if (!r) return ncclxSystemError; /* the inner request leaks; a test plugin, out of memory */
  r->inner = inner;
  r->info = (ProftestInfo){PROFTEST_MAGIC, isSend, bytes};
  if (profiler(&r->event, NCCLX_PROFILER_NET_START, phandle, PROFTEST_ID, &r->info) != ncclxSuccess) r->event = NULL;
  *request = r;
  return ncclxSuccess;
}

static ncclxResult_t ptIsend(void* sendComm, void* data, size_t size, int tag, void* mhandle, void* phandle,
                             void** request) {
  void* inner = NULL;
  ncclxResult_t res = proftestInner.isend(sendComm, data, size, tag, mhandle, NULL, &inner);
  return wrap(res, inner, 1, size, phandle, request);
}

static ncclxResult_t ptIrecv(void* recvComm, int n, void** data, size_t* sizes, int* tags, void** mhandles,
                             void** phandles, void** request) {
  void* inner = NULL;
  ncclxResult_t res = proftestInner.irecv(recvComm, n, data, sizes, tags, mhandles, NULL, &inner);
  return wrap(res, inner, 0, n > 0 ? sizes[0] : 0, phandles ? phandles[0] : NULL, request);
}

static ncclxResult_t ptTest(void* request, int* done, size_t* sizes) {
  ProftestReq* r = request;
  size_t got[64]; /* more than any maxRecvs the template reports */
  ncclxResult_t res = proftestInner.test(r->inner, done, sizes ? sizes : got);
  if (res != ncclxSuccess || !*done) return res;
  if (!r->info.isSend) r->info.bytes = sizes ? sizes[0] : got[0];
  profiler(&r->event, NCCLX_PROFILER_NET_UPDATE, NULL, PROFTEST_ID, &r->info);
  profiler(&r->event, NCCLX_PROFILER_NET_STOP, NULL, PROFTEST_ID, NULL);
  free(r);
  return ncclxSuccess;
}

/* The inner plugin's table with the wrapped operations; filled when the object is loaded,
 * before the core looks the symbol up. */
__attribute__((visibility("default"))) ncclxNet_v1_t ncclxNetPlugin_v1;

__attribute__((constructor)) static void proftestSetup(void) {
  ncclxNetPlugin_v1 = proftestInner;
  ncclxNetPlugin_v1.name = "proftest";
  ncclxNetPlugin_v1.init = ptInit;
  ncclxNetPlugin_v1.isend = ptIsend;
  ncclxNetPlugin_v1.irecv = ptIrecv;
  ncclxNetPlugin_v1.test = ptTest;
}
