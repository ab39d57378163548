/* Everything that talks to libibverbs outside the data path: finding and opening devices,
 * creating and connecting queue pairs, registering memory through the cache. */
#include <endian.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ib_devsel.h"
#include "ib_internal.h"

#define IB_MAX_PORTS 64 /* (device, port) pairs looked at; plenty for any host */
#define IB_MAX_GIDS 256

static int linkLayerOf(uint8_t ll) {
  if (ll == IBV_LINK_LAYER_ETHERNET) return IB_LINK_ETH;
  /* Older drivers report "unspecified" for InfiniBand ports. */
  if (ll == IBV_LINK_LAYER_INFINIBAND || ll == IBV_LINK_LAYER_UNSPECIFIED) return IB_LINK_IB;
  return IB_LINK_UNKNOWN;
}

static void deregCallback(void* arg, void* reg) {
  ibCtx* ctx = arg;
  int rc = ibv_dereg_mr((struct ibv_mr*)reg);
  if (rc != 0) IB_WARN(ctx, "ibv_dereg_mr failed: %s", strerror(rc));
}

static char* pciPathOf(const char* name) {
  char path[PATH_MAX], real[PATH_MAX];
  snprintf(path, sizeof(path), "/sys/class/infiniband/%s/device", name);
  return realpath(path, real) ? strdup(real) : NULL;
}

/* GID table of a port as records for ibGidPick. Where the kernel cannot report GID types,
 * the plain query still gives the GIDs (typed by link layer, so RoCE sees them as v1). */
static int readGids(struct ibv_context* vctx, int port, int tableLen, int linkLayer,
                    ibGidRecord* out, int max) {
  int n = 0;
  for (int i = 0; i < tableLen && n < max; i++) {
    struct ibv_gid_entry e;
    memset(&e, 0, sizeof(e));
    if (ibv_query_gid_ex(vctx, (uint32_t)port, (uint32_t)i, &e, 0) == 0) {
      out[n].type = e.gid_type == IBV_GID_TYPE_ROCE_V2   ? IB_GID_TYPE_ROCE_V2
                    : e.gid_type == IBV_GID_TYPE_ROCE_V1 ? IB_GID_TYPE_ROCE_V1
                                                         : IB_GID_TYPE_IB;
    } else if (errno != ENODATA && ibv_query_gid(vctx, (uint8_t)port, i, &e.gid) == 0) {
      out[n].type = linkLayer == IB_LINK_IB ? IB_GID_TYPE_IB : IB_GID_TYPE_ROCE_V1;
    } else {
      continue; /* an empty entry */
    }
    out[n].index = i;
    memcpy(out[n].gid, e.gid.raw, 16);
    n++;
  }
  return n;
}

typedef struct {
  int devIndex; /* in the ibv device list */
  struct ibv_port_attr attr;
} portProbe;

/* Sets up ctx->devs[ctx->ndev] for one selected port; 0 when it is usable. */
static ncclxResult_t deviceSetup(ibCtx* ctx, struct ibv_device* vdev, int port,
                                 const struct ibv_port_attr* pa, int* usable) {
  *usable = 0;
  ibDevice* d = &ctx->devs[ctx->ndev];
  memset(d, 0, sizeof(*d));
  snprintf(d->name, sizeof(d->name), "%s", ibv_get_device_name(vdev));
  snprintf(d->label, sizeof(d->label), "%s:%d", d->name, port);
  d->ibPort = port;
  d->vctx = ibv_open_device(vdev);
  if (!d->vctx) {
    IB_WARN(ctx, "cannot open %s: %s; skipping it", d->label, strerror(errno));
    return ncclxSuccess;
  }
  struct ibv_device_attr da;
  int rc = ibv_query_device(d->vctx, &da);
  d->pd = rc == 0 ? ibv_alloc_pd(d->vctx) : NULL;
  if (!d->pd) {
    IB_WARN(ctx, "%s: %s failed: %s; skipping it", d->label, rc ? "ibv_query_device" : "ibv_alloc_pd",
            strerror(rc ? rc : errno));
    ibv_close_device(d->vctx);
    return ncclxSuccess;
  }
  d->linkLayer = linkLayerOf(pa->link_layer);
  d->lid = pa->lid;
  d->mtu = pa->active_mtu;
  d->guid = be64toh(da.node_guid);
  d->maxQp = da.max_qp;
  d->speedMbps = ibPortSpeedMbps(pa->active_speed, pa->active_width);
  if (d->speedMbps == 0) d->speedMbps = 10000;

  ibGidRecord gids[IB_MAX_GIDS];
  int ngid = readGids(d->vctx, port, pa->gid_tbl_len, d->linkLayer, gids, IB_MAX_GIDS);
  char why[300];
  d->gidIndex = ibGidPick(gids, ngid, d->linkLayer, ctx->cfg.gidIndex, why, sizeof(why));
  if (d->gidIndex < 0 && d->linkLayer == IB_LINK_IB && ctx->cfg.gidIndex < 0) {
    /* InfiniBand routes by LID inside a subnet: the GID only matters with a GRH. */
    IB_INFO(ctx, "%s: %s; routing by LID only", d->label, why);
    d->gidIndex = 0;
  }
  if (d->gidIndex < 0) {
    ibv_dealloc_pd(d->pd);
    ibv_close_device(d->vctx);
    if (ctx->cfg.gidIndex >= 0) {
      IB_WARN(ctx, "[net.ib] gid_index on %s: %s", d->label, why);
      return ncclxInvalidUsage;
    }
    IB_WARN(ctx, "%s: %s; skipping it", d->label, why);
    return ncclxSuccess;
  }
  for (int i = 0; i < ngid; i++)
    if (gids[i].index == d->gidIndex) memcpy(d->gid, gids[i].gid, 16);
  if (d->linkLayer == IB_LINK_IB && d->lid == 0) {
    IB_WARN(ctx, "%s: active InfiniBand port without a LID (no subnet manager?); skipping it", d->label);
    ibv_dealloc_pd(d->pd);
    ibv_close_device(d->vctx);
    return ncclxSuccess;
  }
  d->pciPath = pciPathOf(d->name);
  pthread_mutex_init(&d->mrLock, NULL);
  ibMrCacheInit(&d->mr, (size_t)sysconf(_SC_PAGESIZE), ctx->cfg.mrCacheIdle, deregCallback, ctx);
  IB_INFO(ctx, "device %d = %s (%s, LID %u, GID index %d, MTU %d, %d Mb/s)", ctx->ndev, d->label,
          ibLinkName(d->linkLayer), (unsigned)d->lid, d->gidIndex, ibMtuBytes(d->mtu), d->speedMbps);
  *usable = 1;
  return ncclxSuccess;
}

ncclxResult_t ibDevicesOpen(ibCtx* ctx) {
  int ndev = 0;
  errno = 0;
  struct ibv_device** list = ibv_get_device_list(&ndev);
  if (!list || ndev <= 0) {
    if (list)
      IB_WARN(ctx, "no RDMA device found (ibv_get_device_list returned 0 devices); use another "
              "network");
    else
      IB_WARN(ctx, "no RDMA device found (ibv_get_device_list failed: %s); use another network",
              strerror(errno));
    if (list) ibv_free_device_list(list);
    return ncclxSystemError;
  }

  /* Probe every port, then let the pure selection rules decide. */
  ibPortRecord recs[IB_MAX_PORTS];
  portProbe probes[IB_MAX_PORTS];
  int nrec = 0;
  for (int i = 0; i < ndev && nrec < IB_MAX_PORTS; i++) {
    struct ibv_context* vctx = ibv_open_device(list[i]);
    if (!vctx) {
      IB_WARN(ctx, "cannot open %s: %s; skipping it", ibv_get_device_name(list[i]), strerror(errno));
      continue;
    }
    struct ibv_device_attr da;
    if (ibv_query_device(vctx, &da) == 0) {
      for (int p = 1; p <= da.phys_port_cnt && nrec < IB_MAX_PORTS; p++) {
        if (ibv_query_port(vctx, (uint8_t)p, &probes[nrec].attr) != 0) continue;
        probes[nrec].devIndex = i;
        snprintf(recs[nrec].name, sizeof(recs[nrec].name), "%s", ibv_get_device_name(list[i]));
        recs[nrec].port = p;
        recs[nrec].active = probes[nrec].attr.state == IBV_PORT_ACTIVE;
        recs[nrec].linkLayer = linkLayerOf(probes[nrec].attr.link_layer);
        nrec++;
      }
    }
    ibv_close_device(vctx);
  }

  const ibConfig* cfg = &ctx->cfg;
  char unmatched[256];
  if (ibHcaUnmatched(&cfg->hcaFilter, recs, nrec, unmatched, sizeof(unmatched)) > 0)
    IB_WARN(ctx, "[net.ib] hca = '%s': %s matches no RDMA port on this host", cfg->hca, unmatched);
  int sel[IB_MAX_PORTS];
  char why[1200];
  int nsel = ibSelectPorts(recs, nrec, &cfg->hcaFilter, cfg->port, sel, IB_MAX_PORTS, why, sizeof(why));
  ncclxResult_t res = ncclxSuccess;
  if (nsel == 0) {
    int configured = cfg->hca[0] != '\0' || cfg->port != 0;
    IB_WARN(ctx, "%s%s", why, configured ? " (check [net.ib] hca and port)" : "");
    res = configured ? ncclxInvalidUsage : ncclxSystemError;
  } else if (!(ctx->devs = calloc((size_t)nsel, sizeof(ibDevice)))) {
    res = ncclxSystemError;
  }
  for (int k = 0; k < nsel && res == ncclxSuccess; k++) {
    const portProbe* pp = &probes[sel[k]];
    int usable = 0;
    res = deviceSetup(ctx, list[pp->devIndex], recs[sel[k]].port, &pp->attr, &usable);
    ctx->ndev += usable;
  }
  ibv_free_device_list(list);
  if (res == ncclxSuccess && ctx->ndev == 0 && nsel > 0) {
    IB_WARN(ctx, "no selected RDMA port could be set up (see the warnings above)");
    res = ncclxSystemError;
  }
  if (res != ncclxSuccess) ibDevicesClose(ctx);
  return res;
}

void ibDevicesClose(ibCtx* ctx) {
  for (int i = 0; i < ctx->ndev; i++) {
    ibDevice* d = &ctx->devs[i];
    pthread_mutex_lock(&d->mrLock);
    int busy = ibMrCacheFini(&d->mr);
    pthread_mutex_unlock(&d->mrLock);
    if (busy) IB_WARN(ctx, "%s: %d memory registration(s) still held at finalize", d->label, busy);
    pthread_mutex_destroy(&d->mrLock);
    ibv_dealloc_pd(d->pd);
    ibv_close_device(d->vctx);
    free(d->pciPath);
  }
  free(ctx->devs);
  ctx->devs = NULL;
  ctx->ndev = 0;
}

/* ---------- comms: CQ, QPs, control buffer ---------- */

static size_t ctlBytes(void) { return ((size_t)IB_QUEUE * IB_CTS_BYTES + 4095) & ~(size_t)4095; }

void ibCommDestroy(ibComm* c) {
  if (!c) return;
  for (int j = 0; j < c->nqps; j++)
    if (c->qps[j]) ibv_destroy_qp(c->qps[j]);
  if (c->cq) ibv_destroy_cq(c->cq);
  if (c->chan) ibv_destroy_comp_channel(c->chan);
  if (c->ctlMr) ibv_dereg_mr(c->ctlMr);
  free(c->ctl);
  if (c->oobFd >= 0) close(c->oobFd);
  if (c->epfd >= 0) close(c->epfd);
  c->head.kind = 0;
  free(c);
}

static ncclxResult_t verbsFail(ibCtx* ctx, const ibDevice* d, const char* call, int err) {
  IB_WARN(ctx, "%s on %s failed: %s%s", call, d->label, strerror(err),
          err == ENOMEM || err == EAGAIN ? " (resources exhausted: check ulimit -l and the "
                                           "device's QP/CQ limits)" : "");
  return ncclxSystemError;
}

ncclxResult_t ibCommCreate(ibCtx* ctx, int dev, int isSend, int nqps, ibComm** out) {
  *out = NULL;
  ibDevice* d = &ctx->devs[dev];
  ibComm* c = calloc(1, sizeof(*c));
  if (!c) return ncclxSystemError;
  c->head.kind = isSend ? IB_COMM_SEND : IB_COMM_RECV;
  c->head.ctx = ctx;
  c->dev = d;
  c->devIndex = dev;
  c->epfd = -1;
  c->oobFd = -1;
  ibRingInit(&c->ring);
  ncclxResult_t res = ncclxSuccess;

  if (!(c->chan = ibv_create_comp_channel(d->vctx))) {
    res = verbsFail(ctx, d, "ibv_create_comp_channel", errno);
    goto fail;
  }
  /* The channel is only polled, never waited on: ibv_get_cq_event must not block. */
  int fl = fcntl(c->chan->fd, F_GETFL);
  if (fl < 0 || fcntl(c->chan->fd, F_SETFL, fl | O_NONBLOCK) != 0) {
    res = verbsFail(ctx, d, "fcntl(O_NONBLOCK) on the completion channel", errno);
    goto fail;
  }
  /* Per message: one completion per QP, plus one CTS send or receive. */
  int cqe = (nqps + 2) * IB_QUEUE + 16;
  if (!(c->cq = ibv_create_cq(d->vctx, cqe, c, c->chan, 0))) {
    res = verbsFail(ctx, d, "ibv_create_cq", errno);
    goto fail;
  }
  for (int j = 0; j < nqps; j++) {
    struct ibv_qp_init_attr qa;
    memset(&qa, 0, sizeof(qa));
    qa.send_cq = c->cq;
    qa.recv_cq = c->cq;
    qa.qp_type = IBV_QPT_RC;
    /* CTS sends may outlive the receives they announced by a little: twice the ring. */
    qa.cap.max_send_wr = 2 * IB_QUEUE;
    qa.cap.max_recv_wr = IB_QUEUE;
    qa.cap.max_send_sge = 1;
    qa.cap.max_recv_sge = 1;
    if (!(c->qps[j] = ibv_create_qp(d->pd, &qa))) {
      res = verbsFail(ctx, d, "ibv_create_qp", errno);
      goto fail;
    }
    c->nqps = j + 1;
    c->psn[j] = (uint32_t)(ibRandom64() & 0xffffff);
    struct ibv_qp_attr at;
    memset(&at, 0, sizeof(at));
    at.qp_state = IBV_QPS_INIT;
    at.pkey_index = 0;
    at.port_num = (uint8_t)d->ibPort;
    /* Only the receiver's memory is written remotely; the sender exposes nothing. */
    at.qp_access_flags = isSend ? 0 : IBV_ACCESS_REMOTE_WRITE;
    int rc = ibv_modify_qp(c->qps[j], &at,
                           IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
    if (rc != 0) {
      res = verbsFail(ctx, d, "ibv_modify_qp(INIT)", rc);
      goto fail;
    }
  }
  c->nqps = nqps;
  if (!(c->ctl = aligned_alloc(4096, ctlBytes()))) {
    res = ncclxSystemError;
    goto fail;
  }
  memset(c->ctl, 0, ctlBytes());
  if (!(c->ctlMr = ibv_reg_mr(d->pd, c->ctl, ctlBytes(), IBV_ACCESS_LOCAL_WRITE))) {
    res = verbsFail(ctx, d, "ibv_reg_mr(control ring)", errno);
    goto fail;
  }
  /* The sender's CTS receives go up before the receiver learns our QPs: none can miss. */
  for (uint64_t s = 0; isSend && s < IB_QUEUE && res == ncclxSuccess; s++) res = ibPostCtsRecv(c, s);
  if (res != ncclxSuccess) goto fail;
  *out = c;
  return ncclxSuccess;
fail:
  ibCommDestroy(c);
  return res;
}

void ibCommLocalInfo(const ibComm* c, int kind, uint64_t nonce, ibConnInfo* out) {
  memset(out, 0, sizeof(*out));
  out->kind = kind;
  out->nonce = nonce;
  out->linkLayer = c->dev->linkLayer;
  out->mtu = c->dev->mtu;
  out->nqps = c->nqps;
  out->lid = c->dev->lid;
  memcpy(out->gid, c->dev->gid, 16);
  for (int j = 0; j < c->nqps; j++) {
    out->qpn[j] = c->qps[j]->qp_num;
    out->psn[j] = c->psn[j];
  }
  out->depth = IB_QUEUE;
}

ncclxResult_t ibCommConnectQps(ibComm* c, const ibConnInfo* remote) {
  ibCtx* ctx = c->head.ctx;
  const ibDevice* d = c->dev;
  const ibConfig* cfg = &ctx->cfg;
  for (int j = 0; j < c->nqps; j++) {
    struct ibv_qp_attr at;
    memset(&at, 0, sizeof(at));
    at.qp_state = IBV_QPS_RTR;
    at.path_mtu = (enum ibv_mtu)ibMtuMin(d->mtu, remote->mtu);
    at.dest_qp_num = remote->qpn[j];
    at.rq_psn = remote->psn[j];
    at.max_dest_rd_atomic = 1;
    at.min_rnr_timer = 12;
    at.ah_attr.port_num = (uint8_t)d->ibPort;
    at.ah_attr.sl = (uint8_t)cfg->sl;
    /* RoCE always routes by GID; InfiniBand by LID within the subnet. */
    if (d->linkLayer == IB_LINK_ETH || remote->lid == 0) {
      at.ah_attr.is_global = 1;
      memcpy(at.ah_attr.grh.dgid.raw, remote->gid, 16);
      at.ah_attr.grh.sgid_index = (uint8_t)d->gidIndex;
      at.ah_attr.grh.hop_limit = 255;
      at.ah_attr.grh.traffic_class = (uint8_t)cfg->trafficClass;
    } else {
      at.ah_attr.dlid = remote->lid;
    }
    int rc = ibv_modify_qp(c->qps[j], &at,
                           IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                               IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
    if (rc != 0) return verbsFail(ctx, d, "ibv_modify_qp(RTR)", rc);
    memset(&at, 0, sizeof(at));
    at.qp_state = IBV_QPS_RTS;
    at.timeout = (uint8_t)cfg->timeout;
    at.retry_cnt = (uint8_t)cfg->retryCnt;
    at.rnr_retry = 7; /* receives are always posted before their CTS: RNR cannot happen */
    at.sq_psn = c->psn[j];
    at.max_rd_atomic = 1;
    rc = ibv_modify_qp(c->qps[j], &at,
                       IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                           IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC);
    if (rc != 0) return verbsFail(ctx, d, "ibv_modify_qp(RTS)", rc);
  }
  return ncclxSuccess;
}

/* ---------- registration ---------- */

ncclxResult_t ibMrAcquire(ibDevice* d, ibCtx* ctx, void* data, size_t size, int access,
                          ibMrEntry** out) {
  *out = NULL;
  if ((uintptr_t)data + size < (uintptr_t)data) {
    IB_WARN(ctx, "buffer %p + %zu bytes wraps the address space", data, size);
    return ncclxInternalError;
  }
  pthread_mutex_lock(&d->mrLock);
  ibMrEntry* e = ibMrCacheFind(&d->mr, data, size, access);
  if (!e) {
    uintptr_t s, t;
    ibMrCacheMissRange(&d->mr, data, size, access, &s, &t);
    int flags = access == IB_MR_REMOTE_WRITE ? IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE : 0;
    struct ibv_mr* mr = ibv_reg_mr(d->pd, (void*)s, t - s, flags);
    if (!mr) {
      int err = errno;
      pthread_mutex_unlock(&d->mrLock);
      IB_WARN(ctx, "registering %zu bytes at %p on %s failed: %s%s", size, data, d->label,
              strerror(err), err == ENOMEM || err == EPERM
                                 ? " (locked-memory limit too small? check ulimit -l)" : "");
      return ncclxSystemError;
    }
    e = ibMrCacheInsert(&d->mr, s, t, access, mr);
    if (!e) {
      ibv_dereg_mr(mr);
      pthread_mutex_unlock(&d->mrLock);
      return ncclxSystemError;
    }
  }
  pthread_mutex_unlock(&d->mrLock);
  *out = e;
  return ncclxSuccess;
}

void ibMrRelease(ibDevice* d, ibMrEntry* e) {
  pthread_mutex_lock(&d->mrLock);
  ibMrCacheRelease(&d->mr, e);
  pthread_mutex_unlock(&d->mrLock);
}

uint32_t ibMrLkey(const ibMrEntry* e) { return ((const struct ibv_mr*)e->reg)->lkey; }
uint32_t ibMrRkey(const ibMrEntry* e) { return ((const struct ibv_mr*)e->reg)->rkey; }
