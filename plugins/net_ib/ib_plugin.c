/* The ibverbs network plugin "ib": init, devices, properties, finalize and the exported
 * ncclxNetPlugin_v1 (the only symbol this library exports). Design: docs/net-ib.md. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ib_internal.h"

static void warnUnknown(void* arg, const char* message) {
  ibCtx* ctx = arg;
  ctx->log(NCCLX_LOG_WARN, NCCLX_LOG_NET | NCCLX_LOG_ENV, __FILE__, __LINE__, "NET/IB: %s", message);
}

static ncclxResult_t ibInit(void** ctxOut, const ncclxPluginEnv_t* env) {
  if (!ctxOut || !env || !env->log || !env->config || !env->config->get) return ncclxInternalError;
  *ctxOut = NULL;
  ibCtx* ctx = calloc(1, sizeof(*ctx));
  if (!ctx) return ncclxSystemError;
  ctx->log = env->log;
  ctx->profiler = env->profiler;
  pthread_mutex_init(&ctx->lock, NULL);

  /* Configuration first: a wrong key is worth reporting even on a host without devices. */
  ibConfigUnknownKeys(env->config, env->section, warnUnknown, ctx);
  char err[640];
  ncclxResult_t res = ibConfigLoad(env->config, env->section, &ctx->cfg, err, sizeof(err));
  if (res != ncclxSuccess) {
    ctx->log(NCCLX_LOG_WARN, NCCLX_LOG_NET | NCCLX_LOG_ENV, __FILE__, __LINE__, "NET/IB: %s", err);
    goto fail;
  }
  res = ibDevicesOpen(ctx); /* first: "no RDMA device found" is the usual refusal */
  if (res != ncclxSuccess) goto fail;
  char why[256];
  if (ibOobPickAddr(ctx->cfg.oobIfname, &ctx->oobAddr, ctx->oobIf, sizeof(ctx->oobIf), why,
                    sizeof(why)) != 0) {
    if (ctx->cfg.oobIfname[0]) {
      char where[160];
      ibConfigWhere(env->config, env->section, "oob_ifname", ctx->cfg.oobIfname, where, sizeof(where));
      IB_WARN(ctx, "[net.ib] oob_ifname = '%s' (%s): %s", ctx->cfg.oobIfname, where, why);
      res = ncclxInvalidUsage;
    } else {
      IB_WARN(ctx, "side channel: %s", why);
      res = ncclxSystemError;
    }
    ibDevicesClose(ctx);
    goto fail;
  }

  char addr[64];
  ibOobFormat(&ctx->oobAddr, addr, sizeof(addr));
  IB_INFO(ctx, "%d device(s), %d QP(s) per connection, timeout %d, retry_cnt %d, side channel on "
          "%s (%s)", ctx->ndev, ctx->cfg.qpsPerConn, ctx->cfg.timeout, ctx->cfg.retryCnt,
          ctx->oobIf, addr);
  *ctxOut = ctx;
  return ncclxSuccess;
fail:
  pthread_mutex_destroy(&ctx->lock);
  free(ctx);
  return res;
}

static ncclxResult_t ibDevices(void* vctx, int* ndev) {
  ibCtx* ctx = vctx;
  if (!ctx || !ndev) return ncclxInternalError;
  *ndev = ctx->ndev;
  return ncclxSuccess;
}

static ncclxResult_t ibGetProperties(void* vctx, int dev, ncclxNetProperties_v1_t* props) {
  ibCtx* ctx = vctx;
  if (!ctx || !props) return ncclxInternalError;
  if (dev < 0 || dev >= ctx->ndev) {
    IB_WARN(ctx, "getProperties: device %d does not exist (%d devices)", dev, ctx->ndev);
    return ncclxInternalError;
  }
  const ibDevice* d = &ctx->devs[dev];
  memset(props, 0, sizeof(*props));
  props->name = d->name;
  props->pciPath = d->pciPath;
  props->guid = d->guid;
  props->ptrSupport = NCCLX_PTR_HOST;
  props->regIsGlobal = 1;
  props->speedMbps = d->speedMbps;
  props->port = d->ibPort;
  props->latencyUs = 0.0f;
  int maxComms = d->maxQp / ctx->cfg.qpsPerConn;
  props->maxComms = maxComms > 0 ? maxComms : 1;
  props->maxRecvs = 1;
  props->maxMessageBytes = IB_MAX_MESSAGE;
  props->forceFlush = 0;
  return ncclxSuccess;
}

static ncclxResult_t ibFinalize(void* vctx) {
  ibCtx* ctx = vctx;
  if (!ctx) return ncclxInternalError;
  ibPendingFreeAll(ctx);
  ibDevicesClose(ctx);
  pthread_mutex_destroy(&ctx->lock);
  free(ctx);
  return ncclxSuccess;
}

__attribute__((visibility("default"))) const ncclxNet_v1_t ncclxNetPlugin_v1 = {
    .name = "ib",
    .abiVersion = NCCLX_NET_ABI_VERSION,
    .init = ibInit,
    .devices = ibDevices,
    .getProperties = ibGetProperties,
    .listen = ibListen,
    .connect = ibConnect,
    .accept = ibAccept,
    .regMr = ibRegMr,
    .deregMr = ibDeregMr,
    .isend = ibIsend,
    .irecv = ibIrecv,
    .iflush = NULL, /* host memory only: nothing to flush */
    .test = ibTest,
    .closeSend = ibCloseSend,
    .closeRecv = ibCloseRecv,
    .closeListen = ibCloseListen,
    .finalize = ibFinalize,
    .getPollFd = ibGetPollFd,
};
