/*
 * The built-in TCP socket network, plugin name "socket": the ops table and the small
 * operations (devices, properties, registration, poll fds, finalize). The wire protocol and
 * the file layout are described in net_socket_internal.h.
 *
 * Built into the core (symbol ncclxNetSocket) or, with -DNCCLX_NET_SOCKET_STANDALONE and the
 * other net_socket_*.c files, into libncclx-net-socket.so (symbol ncclxNetPlugin_v1).
 */
#include "transport/socket/net_socket_internal.h"

static ncclxResult_t sockDevices(void* ctx, int* ndev) {
  if (!ctx || !ndev) return ncclxInternalError;
  *ndev = 1;
  return ncclxSuccess;
}

static ncclxResult_t sockGetProperties(void* vctx, int dev, ncclxNetProperties_v1_t* props) {
  sockCtx* ctx = vctx;
  if (!ctx || !props) return ncclxInternalError;
  if (dev != 0) {
    SOCK_WARN(ctx, "getProperties: device %d does not exist (1 device)", dev);
    return ncclxInternalError;
  }
  memset(props, 0, sizeof(*props));
  props->name = ctx->ifname;
  props->pciPath = ctx->pciPath;
  props->guid = ctx->guid;
  props->ptrSupport = NCCLX_PTR_HOST;
  props->regIsGlobal = 1;
  props->speedMbps = ctx->speedMbps;
  props->port = 1;
  props->latencyUs = ctx->latencyUs;
  props->maxComms = 65536;
  props->maxRecvs = 1;
  props->maxMessageBytes = SOCK_MAX_MESSAGE;
  props->forceFlush = 0;
  return ncclxSuccess;
}

static ncclxResult_t sockFinalize(void* vctx) {
  sockCtx* ctx = vctx;
  if (!ctx) return ncclxInternalError;
  pthread_mutex_lock(&ctx->lock);
  while (ctx->pending) {
    sockPendingConnect* p = ctx->pending;
    ctx->pending = p->next;
    sockPendingFree(p);
  }
  pthread_mutex_unlock(&ctx->lock);
  pthread_mutex_destroy(&ctx->lock);
  free(ctx->pciPath);
  free(ctx);
  return ncclxSuccess;
}

/* ------------------------------------------------------------------------------------------
 * Registration and poll fds
 * ------------------------------------------------------------------------------------------ */

static char sockMrToken; /* host memory needs no registration: every handle is this one */

static ncclxResult_t sockRegMr(void* comm, void* data, size_t size, int type, void** mhandle) {
  int kind = sockCommKind(comm);
  if (!mhandle || (kind != SOCK_KIND_SEND && kind != SOCK_KIND_RECV)) return ncclxInternalError;
  *mhandle = NULL;
  if (type != NCCLX_PTR_HOST) {
    SOCK_WARN(((sockCommHead*)comm)->ctx, "regMr: pointer type %d of %p (%zu bytes) is not "
              "supported: the socket network only moves host memory", type, data, size);
    return ncclxInvalidArgument;
  }
  *mhandle = &sockMrToken;
  return ncclxSuccess;
}

static ncclxResult_t sockDeregMr(void* comm, void* mhandle) {
  int kind = sockCommKind(comm);
  if (kind != SOCK_KIND_SEND && kind != SOCK_KIND_RECV) return ncclxInternalError;
  return (mhandle == NULL || mhandle == &sockMrToken) ? ncclxSuccess : ncclxInternalError;
}

/* recvComm: readable when any of its sockets has data (the socket itself when there is one).
 * sendComm: readable when a socket with unsent data has room again.
 * listenComm: readable on a new connection or hello bytes. */
static ncclxResult_t sockGetPollFd(void* comm, int* fd) {
  int kind = sockCommKind(comm);
  if (!fd) return ncclxInternalError;
  *fd = -1;
  if (kind == SOCK_KIND_LISTEN) return sockListenPollFd(comm, fd);
  if (kind != SOCK_KIND_SEND && kind != SOCK_KIND_RECV) return ncclxInternalError;
  return sockCommPollFd(comm, fd);
}

SOCK_EXPORT const ncclxNet_v1_t SOCK_PLUGIN_SYMBOL = {
    .name = "socket",
    .abiVersion = NCCLX_NET_ABI_VERSION,
    .init = sockInit,
    .devices = sockDevices,
    .getProperties = sockGetProperties,
    .listen = sockListen,
    .connect = sockConnect,
    .accept = sockAccept,
    .regMr = sockRegMr,
    .deregMr = sockDeregMr,
    .isend = sockIsend,
    .irecv = sockIrecv,
    .iflush = NULL,
    .test = sockTest,
    .closeSend = sockCloseSend,
    .closeRecv = sockCloseRecv,
    .closeListen = sockCloseListen,
    .finalize = sockFinalize,
    .getPollFd = sockGetPollFd,
};
