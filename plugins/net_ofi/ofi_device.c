/* One libfabric device: open/close its fabric, domain, endpoint, completion queue and
 * address vector; read completions and hand them to their operations; the life cycle of
 * the objects that own operations. */
#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include <rdma/fi_eq.h>

#include "ofi_internal.h"

#define OFI_CQ_BATCH 16
#define OFI_CQ_ROUNDS 8 /* bound the work of one progress call */

uint64_t ofiNowNs(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

uint64_t ofiRandom64(void) {
  uint64_t v;
  if (getrandom(&v, sizeof(v), GRND_NONBLOCK) == (ssize_t)sizeof(v)) return v;
  /* No entropy yet: mix time, pid and a counter; uniqueness is what matters here. */
  static atomic_uint_fast64_t counter;
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  v = (uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 30) ^ ((uint64_t)getpid() << 48) ^
      atomic_fetch_add(&counter, 0x9e3779b97f4a7c15ull);
  v ^= v >> 31;
  v *= 0xbf58476d1ce4e5b9ull;
  return v ^ (v >> 29);
}

/* FNV-1a. */
uint64_t ofiHash(uint64_t h, const void* data, size_t len) {
  const unsigned char* p = data;
  if (h == 0) h = 0xcbf29ce484222325ull;
  for (size_t i = 0; i < len; i++) {
    h ^= p[i];
    h *= 0x100000001b3ull;
  }
  return h;
}

ncclxResult_t ofiErrClass(int fiErr) {
  switch (fiErr) {
    case FI_ETRUNC:
    case FI_ECONNREFUSED:
    case FI_ECONNRESET:
    case FI_ECONNABORTED:
    case FI_ENOTCONN:
    case FI_ESHUTDOWN:
    case FI_ETIMEDOUT:
    case FI_EHOSTDOWN:
    case FI_EHOSTUNREACH:
    case FI_ENETUNREACH:
    case FI_EADDRNOTAVAIL:
    case FI_EREMOTEIO:
    case FI_EIO:
      return ncclxRemoteError;
    default:
      return ncclxSystemError;
  }
}

/* ------------------------------------------------------------------------------------------
 * Objects and operations
 * ------------------------------------------------------------------------------------------ */

void ofiObjInit(ofiObj* obj, uint32_t kind, ofiDevice* d, void (*destroy)(ofiObj*)) {
  obj->kind = kind;
  obj->dev = d;
  obj->liveOps = 0;
  obj->released = 0;
  obj->destroy = destroy;
  obj->prev = NULL;
  obj->next = d->objs;
  if (d->objs) d->objs->prev = obj;
  d->objs = obj;
}

static void objFree(ofiObj* obj) {
  ofiDevice* d = obj->dev;
  if (obj->prev)
    obj->prev->next = obj->next;
  else
    d->objs = obj->next;
  if (obj->next) obj->next->prev = obj->prev;
  obj->kind = 0;
  obj->destroy(obj);
}

void ofiObjRelease(ofiObj* obj) {
  obj->released = 1;
  if (obj->liveOps == 0) objFree(obj);
}

void ofiOpPosted(ofiOp* op, ofiObj* owner, ofiOpDone done) {
  op->owner = owner;
  op->done = done;
  op->posted = 1;
  owner->liveOps++;
}

static void opComplete(ofiDevice* d, void* context, size_t len, uint64_t tag, int err,
                       const char* msg) {
  if (!context) {
    if (err) OFI_WARN(d->ctx, "%s: error completion without an operation: %s", d->name, msg);
    return;
  }
  ofiOp* op = context; /* fctx is the first member */
  ofiObj* owner = op->owner;
  if (!op->posted || !owner) {
    OFI_WARN(d->ctx, "%s: completion for an operation that is not posted (ignored)", d->name);
    return;
  }
  op->posted = 0;
  op->ctag = tag;
  owner->liveOps--;
  ofiMrPut(d, op->mr);
  op->mr = NULL;
  op->done(op, len, err, msg); /* also for released owners: they may need to settle */
  if (owner->released && owner->liveOps == 0 && owner->kind != OFI_OBJ_DEVICE) objFree(owner);
}

/* One operation on endpoint e: tagged (tag, ignore, peer) or, in connected mode, untagged.
 * buf is registered for the operation when the provider needs it and mhandle is NULL. */
static ssize_t postOp(ofiDevice* d, struct fid_ep* e, int tagged, ofiOp* op, ofiObj* owner,
                      ofiOpDone done, int send, void* buf, size_t len, void* mhandle,
                      fi_addr_t peer, uint64_t tag, uint64_t ignore) {
  void* desc = NULL;
  ofiMrEntry* held = NULL;
  if (ofiMrDesc(d, mhandle, buf, len, &desc, &held) != ncclxSuccess) return -FI_EINVAL;
  ssize_t ret;
  if (tagged)
    ret = send ? fi_tsend(e, buf, len, desc, peer, tag, &op->fctx)
               : fi_trecv(e, buf, len, desc, peer, tag, ignore, &op->fctx);
  else
    ret = send ? fi_send(e, buf, len, desc, FI_ADDR_UNSPEC, &op->fctx)
               : fi_recv(e, buf, len, desc, FI_ADDR_UNSPEC, &op->fctx);
  if (ret != 0) {
    ofiMrPut(d, held);
    return ret;
  }
  op->mr = held;
  op->ep = e;
  ofiOpPosted(op, owner, done);
  return 0;
}

ssize_t ofiPostTagged(ofiDevice* d, int ep, ofiOp* op, ofiObj* owner, ofiOpDone done, int send,
                      void* buf, size_t len, void* mhandle, fi_addr_t peer, uint64_t tag,
                      uint64_t ignore) {
  return postOp(d, d->eps[ep], 1, op, owner, done, send, buf, len, mhandle, peer, tag, ignore);
}

ssize_t ofiPostMsg(ofiDevice* d, struct fid_ep* ep, ofiOp* op, ofiObj* owner, ofiOpDone done,
                   int send, void* buf, size_t len, void* mhandle) {
  return postOp(d, ep, 0, op, owner, done, send, buf, len, mhandle, FI_ADDR_UNSPEC, 0, 0);
}

/* Endpoints are closed only once no operation is posted on them (or by the device's close,
 * after which nothing is cancelled), so op->ep is valid here. */
void ofiCancel(ofiDevice* d, ofiOp* op) {
  (void)d;
  if (op->posted && op->ep) (void)fi_cancel(&op->ep->fid, &op->fctx);
}

/* ------------------------------------------------------------------------------------------
 * Progress
 * ------------------------------------------------------------------------------------------ */

static void probeRecvDone(ofiOp* op, size_t len, int err, const char* msg);

/* Probes from peers checking that we are alive land here and are dropped; the receive keeps
 * them from piling up in the provider's unexpected-message queue. */
static void postProbeRecv(ofiDevice* d) {
  ssize_t ret =
      ofiPostTagged(d, 0, &d->probeRecv, &d->self, probeRecvDone, 0, d->probeBuf,
                    sizeof(d->probeBuf), NULL, FI_ADDR_UNSPEC, OFI_TAG_KIND(OFI_KIND_PROBE),
                    OFI_PROBE_IGNORE);
  if (ret == 0) {
    d->probeRecvNeeded = 0;
  } else {
    d->probeRecvNeeded = 1;
    if (ret != -FI_EAGAIN)
      OFI_WARN(d->ctx, "%s: posting the probe receive failed: %s", d->name, fi_strerror((int)-ret));
  }
}

static void probeRecvDone(ofiOp* op, size_t len, int err, const char* msg) {
  (void)len;
  ofiDevice* d = op->owner->dev;
  if (err == FI_ECANCELED) return;
  if (err) OFI_TRACE(d->ctx, "%s: probe receive failed: %s", d->name, msg);
  d->probeRecvNeeded = 1; /* reposted at the end of this progress call */
}

int ofiProgress(ofiDevice* d) {
  struct fi_cq_tagged_entry ents[OFI_CQ_BATCH];
  int total = 0;
  if (d->inProgress) return 0;
  d->inProgress = 1;
  for (int round = 0; round < OFI_CQ_ROUNDS; round++) {
    ssize_t n = fi_cq_read(d->cq, ents, OFI_CQ_BATCH);
    if (n > 0) {
      for (ssize_t i = 0; i < n; i++)
        opComplete(d, ents[i].op_context, ents[i].len, ents[i].tag, 0, NULL);
      total += (int)n;
      if (n < OFI_CQ_BATCH) break;
      continue;
    }
    if (n == -FI_EAGAIN) break;
    if (n == -FI_EAVAIL) {
      struct fi_cq_err_entry e;
      memset(&e, 0, sizeof(e));
      if (fi_cq_readerr(d->cq, &e, 0) != 1) break;
      char prov[256], msg[384];
      const char* detail = fi_cq_strerror(d->cq, e.prov_errno, e.err_data, prov, sizeof(prov));
      if (e.err == FI_ETRUNC && e.olen > 0)
        snprintf(msg, sizeof(msg),
                 "the message is %zu bytes longer than the posted receive "
                 "(the sender sent more than was expected)",
                 e.olen);
      else if (e.err == FI_ETRUNC)
        snprintf(msg, sizeof(msg),
                 "the message is longer than the posted receive (the sender "
                 "sent more than was expected)");
      else
        snprintf(msg, sizeof(msg), "%s (provider: %s)", fi_strerror(e.err), detail ? detail : "?");
      opComplete(d, e.op_context, e.len, e.tag, e.err ? e.err : FI_EOTHER, msg);
      total++;
      continue;
    }
    OFI_WARN(d->ctx, "%s: fi_cq_read failed: %s", d->name, fi_strerror((int)-n));
    break;
  }
  /* Connects and accepts under way: their handshakes move when the events are read. */
  if (d->msgMode && d->cmBusy && ofiNowNs() - d->lastEventsNs >= OFI_MSG_EVENTS_EVERY_NS)
    ofiMsgEvents(d);
  if (d->probeRecvNeeded) postProbeRecv(d);
  if (d->connectRecvsNeeded) ofiPostConnectRecvs(d);
  if (d->replyQueue) ofiRetryReplies(d);
  if (d->deferred) ofiRetryDeferred(d);
  d->inProgress = 0;
  return total;
}

void ofiArmPollFd(ofiDevice* d) {
  if (!d->pollFdWanted || d->cqFd < 0) return;
  struct fid* fids[1] = {&d->cq->fid};
  (void)fi_trywait(d->fabric, fids, 1); /* -FI_EAGAIN: completions are waiting; fine too */
}

/* ------------------------------------------------------------------------------------------
 * Peers
 * ------------------------------------------------------------------------------------------ */

ncclxResult_t ofiPeerInsert(ofiDevice* d, const void* addr, size_t len, fi_addr_t* fa) {
  for (int i = 0; i < d->npeers; i++)
    if (d->peers[i].len == len && memcmp(d->peers[i].addr, addr, len) == 0) {
      *fa = d->peers[i].fa;
      return ncclxSuccess;
    }
  if (len == 0 || len > OFI_MAX_ADDR) return ncclxInternalError;
  if (d->npeers == d->capPeers) {
    int cap = d->capPeers ? 2 * d->capPeers : 16;
    ofiPeerAddr* n = realloc(d->peers, (size_t)cap * sizeof(*n));
    if (!n) return ncclxSystemError;
    d->peers = n;
    d->capPeers = cap;
  }
  fi_addr_t out = FI_ADDR_NOTAVAIL;
  int ret = fi_av_insert(d->av, addr, 1, &out, 0, NULL);
  if (ret != 1 || out == FI_ADDR_NOTAVAIL) {
    char name[128];
    ofiFormatAddr(d, addr, len, name, sizeof(name));
    OFI_WARN(d->ctx, "%s: cannot add peer address %s to the address vector: %s", d->name, name,
             ret < 0 ? fi_strerror(-ret) : "not inserted");
    return ncclxSystemError;
  }
  ofiPeerAddr* p = &d->peers[d->npeers++];
  memcpy(p->addr, addr, len);
  p->len = len;
  p->fa = out;
  *fa = out;
  return ncclxSuccess;
}

void ofiFormatAddr(ofiDevice* d, const void* addr, size_t len, char* out, size_t size) {
  char buf[256];
  size_t blen = sizeof(buf);
  const char* s = d->av ? fi_av_straddr(d->av, addr, buf, &blen) : NULL;
  if (s && blen <= sizeof(buf)) {
    snprintf(out, size, "%s", buf);
    return;
  }
  if (ofiFormatSockaddr(addr, len, out, size)) return; /* connected mode has no AV */
  /* Unknown format: hex of the first bytes. */
  size_t o = 0;
  const unsigned char* p = addr;
  for (size_t i = 0; i < len && o + 3 < size && i < 24; i++)
    o += (size_t)snprintf(out + o, size - o, "%02x", p[i]);
  if (o == 0 && size) out[0] = '\0';
}

/* ------------------------------------------------------------------------------------------
 * Open and close
 * ------------------------------------------------------------------------------------------ */

static int readSysInt(const char* path) {
  FILE* f = fopen(path, "r");
  int v = 0;
  if (f) {
    if (fscanf(f, "%d", &v) != 1) v = 0;
    fclose(f);
  }
  return v;
}

/* Speed and PCI path: the provider's NIC attributes when it has them, else sysfs of a
 * network interface of the same name (the tcp provider names domains after interfaces). */
static void deviceDescribe(ofiDevice* d) {
  const struct fi_info* info = d->info;
  d->speedMbps = 0;
  d->pciPath = NULL;
  if (info->nic && info->nic->link_attr && info->nic->link_attr->speed > 0)
    d->speedMbps = (int)(info->nic->link_attr->speed / 1000000u);
  if (info->nic && info->nic->bus_attr && info->nic->bus_attr->bus_type == FI_BUS_PCI) {
    const struct fi_pci_attr* pci = &info->nic->bus_attr->attr.pci;
    char path[128];
    snprintf(path, sizeof(path), "/sys/bus/pci/devices/%04x:%02x:%02x.%x", pci->domain_id,
             pci->bus_id, pci->device_id, pci->function_id);
    d->pciPath = realpath(path, NULL);
  }
  char path[160];
  if (d->speedMbps <= 0) {
    snprintf(path, sizeof(path), "/sys/class/net/%s/speed", d->name);
    d->speedMbps = readSysInt(path);
  }
  if (!d->pciPath) {
    snprintf(path, sizeof(path), "/sys/class/net/%s/device", d->name);
    d->pciPath = realpath(path, NULL);
  }
  if (d->speedMbps <= 0) d->speedMbps = 10000; /* virtual devices report nothing useful */
  const char* prov =
      info->fabric_attr && info->fabric_attr->prov_name ? info->fabric_attr->prov_name : "";
  d->latencyUs = strcmp(prov, "shm") == 0 ? 1.0f : (strcmp(d->name, "lo") == 0 ? 10.0f : 0.0f);
  d->guid = ofiHash(ofiHash(0, prov, strlen(prov)), d->name, strlen(d->name));
  size_t maxMsg = info->ep_attr ? info->ep_attr->max_msg_size : 0;
  d->maxMsg = maxMsg == 0 || maxMsg > OFI_MAX_MESSAGE ? OFI_MAX_MESSAGE : maxMsg;
}

ncclxResult_t ofiDeviceSetup(ofiCtx* ctx, ofiDevice* d, const struct fi_info* info) {
  memset(d, 0, sizeof(*d));
  d->ctx = ctx;
  d->cqFd = -1;
  d->self.kind = OFI_OBJ_DEVICE;
  d->self.dev = d;
  d->info = fi_dupinfo(info);
  if (!d->info) {
    OFI_WARN(ctx, "fi_dupinfo failed (out of memory)");
    return ncclxSystemError;
  }
  pthread_mutex_init(&d->lock, NULL);
  snprintf(d->name, sizeof(d->name), "%s",
           info->domain_attr && info->domain_attr->name ? info->domain_attr->name : "?");
  snprintf(d->addrStr, sizeof(d->addrStr), "(opened on first use)");
  uint64_t mrMode = info->domain_attr ? (uint64_t)info->domain_attr->mr_mode : 0;
  const char* prov =
      info->fabric_attr && info->fabric_attr->prov_name ? info->fabric_attr->prov_name : "";
  /* libfabric 1.17's shm provider loops forever (CMA) or never completes (SAR) a receive
   * smaller than its message, and a sender running ahead fills the receiver's unexpected-
   * message pool until posting a receive fails (FI_ENOMEM): with it, data only goes into
   * receives the receiver has announced. */
  d->clearToSend = ctx->clearToSend >= 0 ? ctx->clearToSend : strcmp(prov, "shm") == 0;
  d->msgMode = info->ep_attr && info->ep_attr->type == FI_EP_MSG;
  if (d->msgMode) d->clearToSend = 0; /* TCP's flow control: nothing arrives unexpected */
  d->mrLocal = ctx->mrForce || (mrMode & FI_MR_LOCAL) != 0;
  d->mrEndpoint = (mrMode & FI_MR_ENDPOINT) != 0 && !d->msgMode; /* not asked for there */
  d->mrProvKey = (mrMode & FI_MR_PROV_KEY) != 0;
  d->nextMrKey = 1;
  d->nextListenId = (uint32_t)ofiRandom64();
  d->nextConnId = (uint32_t)ofiRandom64() & OFI_CONN_ID_MASK;
  d->nextPendingId = (uint32_t)ofiRandom64();
  deviceDescribe(d);
  return ncclxSuccess;
}

static void closeResources(ofiDevice* d);

#define OFI_TRY(call, what)                                    \
  do {                                                         \
    int ret_ = (int)(call);                                    \
    if (ret_ != 0) {                                           \
      OFI_WARN(ctx, "device %s: %s failed: %s", d->name, what, \
               fi_strerror(ret_ < 0 ? -ret_ : ret_));          \
      closeResources(d);                                       \
      return ncclxSystemError;                                 \
    }                                                          \
  } while (0)

/* Fabric, domain, completion queue, address vector and endpoint. Device lock held. */
static ncclxResult_t openResources(ofiDevice* d) {
  ofiCtx* ctx = d->ctx;
  OFI_TRY(fi_fabric(d->info->fabric_attr, &d->fabric, NULL), "fi_fabric");
  OFI_TRY(fi_domain(d->fabric, d->info, &d->domain, NULL), "fi_domain");

  struct fi_cq_attr cqa;
  memset(&cqa, 0, sizeof(cqa));
  cqa.format = FI_CQ_FORMAT_TAGGED;
  /* tcp signals its wait fd on every completion (a system call each): 1.2-1.4x slower over
   * loopback, so by default the core polls it instead of sleeping on it. */
  const char* prov = d->info->fabric_attr && d->info->fabric_attr->prov_name ? d->info->fabric_attr->prov_name : "";
  int pollFd = ctx->pollFd >= 0 ? ctx->pollFd : strncasecmp(prov, "tcp", 3) != 0;
  cqa.wait_obj = pollFd ? FI_WAIT_FD : FI_WAIT_NONE;
  int ret = fi_cq_open(d->domain, &cqa, &d->cq, NULL);
  if (ret != 0 && pollFd) {
    OFI_INFO(ctx, "device %s: no completion queue with a wait fd (%s); the core will poll", d->name,
             fi_strerror(-ret));
    cqa.wait_obj = FI_WAIT_NONE;
    ret = fi_cq_open(d->domain, &cqa, &d->cq, NULL);
  }
  OFI_TRY(ret, "fi_cq_open");
  if (cqa.wait_obj == FI_WAIT_FD && fi_control(&d->cq->fid, FI_GETWAIT, &d->cqFd) != 0)
    d->cqFd = -1;
  if (d->msgMode) { /* endpoints come with connections (ofi_msg.c) */
    struct fi_eq_attr eqa;
    memset(&eqa, 0, sizeof(eqa));
    eqa.wait_obj = FI_WAIT_NONE;
    OFI_TRY(fi_eq_open(d->fabric, &eqa, &d->eq, NULL), "fi_eq_open");
    snprintf(d->addrStr, sizeof(d->addrStr), "(an endpoint per connection)");
    return ncclxSuccess;
  }

  struct fi_av_attr ava;
  memset(&ava, 0, sizeof(ava));
  ava.type =
      d->info->domain_attr->av_type != FI_AV_UNSPEC ? d->info->domain_attr->av_type : FI_AV_TABLE;
  OFI_TRY(fi_av_open(d->domain, &ava, &d->av, NULL), "fi_av_open");
  /* Registrations bound to one endpoint (FI_MR_ENDPOINT) would not serve the others. */
  int want = ctx->endpoints;
  if (want > 1 && d->mrLocal && d->mrEndpoint) {
    OFI_INFO(ctx, "device %s: the provider binds memory registrations to an endpoint; using 1 "
             "endpoint instead of %d", d->name, want);
    want = 1;
  }
  for (int i = 0; i < want; i++) {
    OFI_TRY(fi_endpoint(d->domain, d->info, &d->eps[i], NULL), "fi_endpoint");
    d->neps = i + 1;
    OFI_TRY(fi_ep_bind(d->eps[i], &d->av->fid, 0), "binding the address vector");
    OFI_TRY(fi_ep_bind(d->eps[i], &d->cq->fid, FI_TRANSMIT | FI_RECV),
            "binding the completion queue");
    OFI_TRY(fi_enable(d->eps[i]), "fi_enable");
    size_t len = sizeof(d->addrs[i]);
    ret = fi_getname(&d->eps[i]->fid, d->addrs[i], &len);
    if (ret == -FI_ETOOSMALL || (i > 0 && ret == 0 && len != d->addrLen)) {
      if (ret == -FI_ETOOSMALL)
        OFI_WARN(ctx, "device %s: endpoint address of %zu bytes does not fit in a connection "
                 "handle (at most %d)", d->name, len, OFI_MAX_ADDR);
      else
        OFI_WARN(ctx, "device %s: endpoint %d's address is %zu bytes, endpoint 0's %zu", d->name,
                 i, len, d->addrLen);
      closeResources(d);
      return ncclxSystemError;
    }
    OFI_TRY(ret, "fi_getname");
    d->addrLen = len;
  }
  ofiFormatAddr(d, d->addrs[0], d->addrLen, d->addrStr, sizeof(d->addrStr));
  postProbeRecv(d);
  if (!d->msgMode) ofiPostConnectRecvs(d);
  return ncclxSuccess;
}

ncclxResult_t ofiDeviceEnsureOpen(ofiDevice* d) {
  if (d->opened > 0) return ncclxSuccess;
  if (d->opened < 0) return ncclxSystemError; /* failed before: said so then */
  ncclxResult_t res = openResources(d);
  d->opened = res == ncclxSuccess ? 1 : -1;
  if (res == ncclxSuccess && d->msgMode)
    OFI_INFO(d->ctx, "device %d (%s) open: connected endpoints, one per connection", d->index, d->name);
  else if (res == ncclxSuccess)
    OFI_INFO(d->ctx, "device %d (%s) open at %s with %d endpoint(s)", d->index, d->name,
             d->addrStr, d->neps);
  return res;
}

static void closeFid(ofiDevice* d, struct fid* fid, const char* what) {
  if (!fid) return;
  int ret = fi_close(fid);
  if (ret != 0)
    OFI_INFO(d->ctx, "device %s: closing the %s failed: %s", d->name, what, fi_strerror(-ret));
}

static void closeResources(ofiDevice* d) {
  /* Endpoints go first: after they are closed no completion can reference our memory,
   * so objects still waiting for their operations can be freed. */
  for (int i = 0; i < d->neps; i++) {
    closeFid(d, d->eps[i] ? &d->eps[i]->fid : NULL, "endpoint");
    d->eps[i] = NULL;
  }
  d->neps = 0;
  while (d->objs) {
    ofiObj* o = d->objs;
    d->objs = o->next;
    o->kind = 0;
    o->destroy(o);
  }
  ofiMrCloseAll(d);
  ofiMsgClosePeps(d);
  closeFid(d, d->av ? &d->av->fid : NULL, "address vector");
  closeFid(d, d->cq ? &d->cq->fid : NULL, "completion queue");
  closeFid(d, d->eq ? &d->eq->fid : NULL, "event queue");
  closeFid(d, d->domain ? &d->domain->fid : NULL, "domain");
  closeFid(d, d->fabric ? &d->fabric->fid : NULL, "fabric");
  d->av = NULL;
  d->cq = NULL;
  d->eq = NULL;
  d->domain = NULL;
  d->fabric = NULL;
  d->cqFd = -1;
}

void ofiDeviceClose(ofiDevice* d) {
  if (!d->info) return; /* never set up */
  closeResources(d);
  free(d->peers);
  d->peers = NULL;
  free(d->pciPath);
  d->pciPath = NULL;
  fi_freeinfo(d->info);
  d->info = NULL;
  pthread_mutex_destroy(&d->lock);
}
