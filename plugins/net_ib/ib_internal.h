/* Internal types of the ibverbs network: the process context, devices, comms, requests.
 * Files: ib_plugin.c (init, devices, properties, the exported struct), ib_verbs.c (devices,
 * queue pairs, registration), ib_conn.c (listen/connect/accept), ib_data.c (data path). */
#ifndef NCCLX_IB_INTERNAL_H
#define NCCLX_IB_INTERNAL_H

#include <infiniband/verbs.h>
#include <pthread.h>

#include "ib_common.h"
#include "ib_config.h"
#include "ib_handle.h"
#include "ib_mr_cache.h"
#include "ib_oob.h"
#include "ib_proto.h"
#include "ib_slots.h"

#define IB_LOG(ctx, level, ...) (ctx)->log((level), NCCLX_LOG_NET, __FILE__, __LINE__, __VA_ARGS__)
#define IB_WARN(ctx, ...) IB_LOG(ctx, NCCLX_LOG_WARN, "NET/IB: " __VA_ARGS__)
#define IB_INFO(ctx, ...) IB_LOG(ctx, NCCLX_LOG_INFO, "NET/IB: " __VA_ARGS__)
#define IB_TRACE(ctx, ...) IB_LOG(ctx, NCCLX_LOG_TRACE, "NET/IB: " __VA_ARGS__)

/* Profiler: every isend/irecv with a phandle starts a NET event whose extData is this. */
#define NCCLX_IB_PROFILER_ID ((1 << 16) | 1) /* type "ib" (1) << 16 | payload version 1 */
typedef struct {
  uint32_t version; /* 1 */
  uint32_t isSend;
  int32_t dev;
  uint32_t qpn;     /* first QP of the connection */
  int32_t nqps;
  uint64_t seq;     /* message number on the connection */
  uint64_t bytes;   /* send: size; receive: capacity */
} ncclxIbProfilerDescr_v1_t;

/* One usable (device, port): an ncclx device. */
typedef struct {
  char name[IB_NAME_MAX];
  char label[IB_NAME_MAX + 8]; /* "mlx5_0:1" */
  int ibPort;
  struct ibv_context* vctx;
  struct ibv_pd* pd;
  int linkLayer;
  uint16_t lid;
  int mtu;
  int gidIndex;
  uint8_t gid[16];
  uint64_t guid;
  char* pciPath;
  int speedMbps;
  int maxQp;
  pthread_mutex_t mrLock; /* guards mr: comms of several threads share a device */
  ibMrCache mr;
} ibDevice;

typedef struct ibPending ibPending;

typedef struct {
  ncclxLogger_t log;
  ncclxProfilerCallback_t profiler;
  ibConfig cfg;
  ibSockAddr oobAddr;
  char oobIf[64];
  int ndev;
  ibDevice* devs;
  pthread_mutex_t lock; /* guards pending */
  ibPending* pending;
} ibCtx;

enum {
  IB_COMM_LISTEN = 0x4c42494e, /* "NIBL" */
  IB_COMM_SEND = 0x5342494e,
  IB_COMM_RECV = 0x5242494e,
  IB_REQ_MAGIC = 0x5142494e
};

/* First member of every comm, so a void* can be checked before use. */
typedef struct {
  uint32_t kind;
  ibCtx* ctx;
} ibHead;

typedef struct ibComm ibComm;

/* What the core holds as a request: slot and seq of a message on its comm. */
typedef struct {
  uint32_t magic;
  ibComm* comm;
  int slot;
  uint64_t seq;
  ibMrEntry* mr;   /* registration taken for a NULL mhandle, released at the end */
  void* eHandle;   /* profiler event, NULL when none */
  ncclxIbProfilerDescr_v1_t prof;
} ibRequest;

struct ibComm {
  ibHead head;
  ibDevice* dev;
  int devIndex;
  int nqps;
  struct ibv_qp* qps[IB_MAX_QPS];
  uint32_t psn[IB_MAX_QPS];
  struct ibv_comp_channel* chan;
  struct ibv_cq* cq;
  int armed;         /* CQ notification requested and not yet delivered */
  int epfd;          /* getPollFd: channel + side channel; -1 until asked for */
  int oobFd;         /* side channel, kept to notice a dead peer */
  uint8_t* ctl;      /* send: CTS ring; receive: CTS staging; IB_QUEUE * IB_CTS_BYTES */
  struct ibv_mr* ctlMr;
  uint64_t ctsArrived; /* send: CTS records received */
  int ctsInFlight;     /* receive: CTS sends not completed yet */
  int waitingCts;      /* send: the last isend found no CTS */
  uint64_t lastPeerCheckNs, peerGoneNs;
  ibRing ring;
  ibRequest reqs[IB_QUEUE];
  ncclxResult_t err;
  char peer[64];
};

/* ib_verbs.c */
ncclxResult_t ibDevicesOpen(ibCtx* ctx);
void ibDevicesClose(ibCtx* ctx);
/* CQ, QPs in INIT and the control buffer; the comm is freed by ibCommDestroy. */
ncclxResult_t ibCommCreate(ibCtx* ctx, int dev, int isSend, int nqps, ibComm** out);
void ibCommDestroy(ibComm* c);
ncclxResult_t ibCommConnectQps(ibComm* c, const ibConnInfo* remote);
void ibCommLocalInfo(const ibComm* c, int kind, uint64_t nonce, ibConnInfo* out);
/* Registration through the device cache. */
ncclxResult_t ibMrAcquire(ibDevice* d, ibCtx* ctx, void* data, size_t size, int access,
                          ibMrEntry** out);
void ibMrRelease(ibDevice* d, ibMrEntry* e);
uint32_t ibMrLkey(const ibMrEntry* e);
uint32_t ibMrRkey(const ibMrEntry* e);

/* ib_conn.c */
ncclxResult_t ibListen(void* ctx, int dev, void* handle, void** listenComm);
ncclxResult_t ibConnect(void* ctx, int dev, const void* handle, void** sendComm);
ncclxResult_t ibAccept(void* listenComm, void** recvComm);
ncclxResult_t ibCloseListen(void* listenComm);
ncclxResult_t ibListenPollFd(void* listenComm, int* fd);
void ibPendingFreeAll(ibCtx* ctx);

/* ib_data.c */
ncclxResult_t ibPostCtsRecv(ibComm* c, uint64_t seq);
ncclxResult_t ibRegMr(void* comm, void* data, size_t size, int type, void** mhandle);
ncclxResult_t ibDeregMr(void* comm, void* mhandle);
ncclxResult_t ibIsend(void* sendComm, void* data, size_t size, int tag, void* mhandle,
                      void* phandle, void** request);
ncclxResult_t ibIrecv(void* recvComm, int n, void** data, size_t* sizes, int* tags,
                      void** mhandles, void** phandles, void** request);
ncclxResult_t ibTest(void* request, int* done, size_t* sizes);
ncclxResult_t ibCloseSend(void* sendComm);
ncclxResult_t ibCloseRecv(void* recvComm);
ncclxResult_t ibGetPollFd(void* comm, int* fd);
ncclxResult_t ibCommFail(ibComm* c, ncclxResult_t res, const char* fmt, ...)
    __attribute__((format(printf, 3, 4)));

#endif
