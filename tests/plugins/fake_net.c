/* A fake network plugin, built several times with different defines to exercise each way the
 * loader can refuse a plugin:
 *   FAKE_NAME        the plugin's name (string)
 *   FAKE_ABI         abiVersion to claim (default: the real one)
 *   FAKE_HIDE_SYMBOL leave ncclxNetPlugin_v1 hidden, as if the author forgot to export it
 *   FAKE_NULL_OP     leave the required isend NULL
 *   FAKE_INIT_FAILS  init returns ncclxSystemError
 * The good variant reports as many devices as its section key `ndev` says (default 0), so a
 * test can make it load (NCCLX_NET_<NAME>_NDEV=1) or be refused for having none. It moves no
 * data: every data-path operation fails. */
#include <stdlib.h>

#include "ncclx/net.h"

#ifndef FAKE_ABI
#define FAKE_ABI NCCLX_NET_ABI_VERSION
#endif

typedef struct {
  const ncclxPluginEnv_t* env;
  int ndev;
} FakeCtx;

static ncclxResult_t fakeInit(void** ctx, const ncclxPluginEnv_t* env) {
#ifdef FAKE_INIT_FAILS
  env->log(NCCLX_LOG_WARN, NCCLX_LOG_NET, __FILE__, __LINE__, "fake net %s: init fails on purpose", FAKE_NAME);
  *ctx = NULL;
  return ncclxSystemError;
#else
  FakeCtx* c = calloc(1, sizeof(*c));
  if (c == NULL) return ncclxSystemError;
  c->env = env;
  const char* ndev = env->config->get(env->section, "ndev");
  c->ndev = ndev ? atoi(ndev) : 0;
  env->log(NCCLX_LOG_INFO, NCCLX_LOG_NET, __FILE__, __LINE__, "fake net %s: init with %d devices",
           FAKE_NAME, c->ndev);
  *ctx = c;
  return ncclxSuccess;
#endif
}

static ncclxResult_t fakeDevices(void* ctx, int* ndev) {
  *ndev = ((FakeCtx*)ctx)->ndev;
  return ncclxSuccess;
}

static ncclxResult_t fakeFinalize(void* ctx) {
  FakeCtx* c = ctx;
  c->env->log(NCCLX_LOG_INFO, NCCLX_LOG_NET, __FILE__, __LINE__, "fake net %s: finalize", FAKE_NAME);
  free(c);
  return ncclxSuccess;
}

static ncclxResult_t fakeGetProperties(void* ctx, int dev, ncclxNetProperties_v1_t* props) {
  (void)ctx, (void)dev, (void)props;
  return ncclxInternalError;
}
static ncclxResult_t fakeListen(void* ctx, int dev, void* handle, void** listenComm) {
  (void)ctx, (void)dev, (void)handle, (void)listenComm;
  return ncclxInternalError;
}
static ncclxResult_t fakeConnect(void* ctx, int dev, const void* handle, void** sendComm) {
  (void)ctx, (void)dev, (void)handle, (void)sendComm;
  return ncclxInternalError;
}
static ncclxResult_t fakeAccept(void* listenComm, void** recvComm) {
  (void)listenComm, (void)recvComm;
  return ncclxInternalError;
}
static ncclxResult_t fakeRegMr(void* comm, void* data, size_t size, int type, void** mhandle) {
  (void)comm, (void)data, (void)size, (void)type, (void)mhandle;
  return ncclxInternalError;
}
static ncclxResult_t fakeDeregMr(void* comm, void* mhandle) {
  (void)comm, (void)mhandle;
  return ncclxInternalError;
}
#ifndef FAKE_NULL_OP
static ncclxResult_t fakeIsend(void* sendComm, void* data, size_t size, int tag, void* mhandle,
                               void* phandle, void** request) {
  (void)sendComm, (void)data, (void)size, (void)tag, (void)mhandle, (void)phandle, (void)request;
  return ncclxInternalError;
}
#endif
static ncclxResult_t fakeIrecv(void* recvComm, int n, void** data, size_t* sizes, int* tags,
                               void** mhandles, void** phandles, void** request) {
  (void)recvComm, (void)n, (void)data, (void)sizes, (void)tags, (void)mhandles, (void)phandles, (void)request;
  return ncclxInternalError;
}
static ncclxResult_t fakeTest(void* request, int* done, size_t* sizes) {
  (void)request, (void)done, (void)sizes;
  return ncclxInternalError;
}
static ncclxResult_t fakeClose(void* comm) {
  (void)comm;
  return ncclxInternalError;
}

#ifdef FAKE_HIDE_SYMBOL
#define FAKE_EXPORT
#else
#define FAKE_EXPORT __attribute__((visibility("default")))
#endif

FAKE_EXPORT const ncclxNet_v1_t ncclxNetPlugin_v1 = {
    .name = FAKE_NAME,
    .abiVersion = FAKE_ABI,
    .init = fakeInit,
    .devices = fakeDevices,
    .getProperties = fakeGetProperties,
    .listen = fakeListen,
    .connect = fakeConnect,
    .accept = fakeAccept,
    .regMr = fakeRegMr,
    .deregMr = fakeDeregMr,
#ifdef FAKE_NULL_OP
    .isend = NULL,
#else
    .isend = fakeIsend,
#endif
    .irecv = fakeIrecv,
    .test = fakeTest,
    .closeSend = fakeClose,
    .closeRecv = fakeClose,
    .closeListen = fakeClose,
    .finalize = fakeFinalize,
};
