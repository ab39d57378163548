/* Device memory and the net ABI's pointer types (gpu_net.h): the per-transfer decision,
 * registration of device buffers with plugins that read device memory directly, the
 * progress engine's lookup of those registrations, and forced flushes.
 *
 * In every build: a build without CUDA refuses what it cannot handle with the same rules. */
#include "gpu/gpu_net.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "util/debug.h"
#include "gpu/gpu.h"
#include "transport/peers.h"
#include "transport/transport.h"

/* ---- the decision ---- */

gpuNetPlan gpuNetDecide(int memKind, int ptrSupport, int toSelf, int cpuTouches, int cudaBuild) {
  int hostOk = toSelf || (ptrSupport & NCCLX_PTR_HOST); /* a copy to self is the CPU's */
  if (memKind != GPU_MEM_DEVICE) return hostOk ? GPU_NET_PASS : GPU_NET_REFUSE;
  if (!cudaBuild) return GPU_NET_REFUSE;
  if (!toSelf && !cpuTouches && (ptrSupport & NCCLX_PTR_CUDA)) return GPU_NET_DIRECT;
  return hostOk ? GPU_NET_STAGE : GPU_NET_REFUSE;
}

/* ---- device properties, cached ----
 * Keyed by (plugin, context, device): a plugin's properties do not change while it is
 * loaded. Append-only, published by the count, so lookups take no lock. */

#define CAPS_SLOTS 16

struct caps {
  const ncclxNet_t* net;
  void* ctx;
  int dev;
  int ptrSupport, forceFlush;
};

static struct caps capsTable[CAPS_SLOTS];
static atomic_int capsCount;
static pthread_mutex_t capsLock = PTHREAD_MUTEX_INITIALIZER;

static const struct caps* capsFind(const struct ncclxTransport* tp) {
  int n = atomic_load_explicit(&capsCount, memory_order_acquire);
  for (int i = 0; i < n; i++)
    if (capsTable[i].net == tp->net && capsTable[i].ctx == tp->ctx && capsTable[i].dev == tp->dev)
      return &capsTable[i];
  return NULL;
}

/* Out may be a local copy when the table is full or the plugin fails to answer (then host
 * memory only, what the engine assumed before ptrSupport was read). */
static struct caps capsOf(const struct ncclxTransport* tp) {
  const struct caps* c = capsFind(tp);
  if (c) return *c;
  ncclxNetProperties_t props;
  memset(&props, 0, sizeof props);
  struct caps fresh = {.net = tp->net, .ctx = tp->ctx, .dev = tp->dev, .ptrSupport = NCCLX_PTR_HOST};
  if (tp->net->getProperties(tp->ctx, tp->dev, &props) != ncclxSuccess) {
    WARN("network '%s': getProperties(device %d) failed; assuming host memory only", tp->net->name, tp->dev);
    return fresh;
  }
  fresh.ptrSupport = props.ptrSupport;
  fresh.forceFlush = props.forceFlush;
  pthread_mutex_lock(&capsLock);
  int n = atomic_load(&capsCount);
  if (!capsFind(tp) && n < CAPS_SLOTS) {
    capsTable[n] = fresh;
    atomic_store_explicit(&capsCount, n + 1, memory_order_release);
  }
  pthread_mutex_unlock(&capsLock);
  INFO(NCCLX_LOG_NET, "network '%s' device %d: ptrSupport 0x%x%s", tp->net->name, tp->dev, fresh.ptrSupport,
       fresh.forceFlush ? ", forceFlush" : "");
  return fresh;
}

int gpuNetPtrSupport(struct ncclxComm* comm, int peer, int* forceFlush) {
  if (forceFlush) *forceFlush = 0;
  if (peer == comm->rank) return NCCLX_PTR_HOST;
  const struct ncclxTransport* tp = &comm->tp[transportFor(comm, peer)];
  if (!tp->net) tp = &comm->tp[NCCLX_TP_NET];
  if (!tp->net) return NCCLX_PTR_HOST;
  struct caps c = capsOf(tp);
  if (forceFlush) *forceFlush = c.forceFlush;
  return c.ptrSupport;
}

int gpuNetTakesHost(struct ncclxComm* comm) {
  for (int t = 0; t < NCCLX_NUM_TP; t++)
    if (comm->tp[t].net && !(capsOf(&comm->tp[t]).ptrSupport & NCCLX_PTR_HOST)) return 0;
  return 1;
}

int gpuNetXfersTakeHost(struct ncclxComm* comm, const ncclxXfer* xfers, int n) {
  if (!gpuNetTakesHost(comm)) return 0;
  for (int i = 0; i < n; i++)
    if (xfers[i].comm && xfers[i].comm != comm && !gpuNetTakesHost(xfers[i].comm)) return 0;
  return 1;
}

/* ---- planning ---- */

ncclxResult_t gpuFailComm(struct ncclxComm* comm, ncclxResult_t res) {
  if (res == ncclxSuccess) return res;
  if (atomic_load(&comm->asyncError) != ncclxSuccess) return res; /* keep the first cause */
  char text[1024];
  snprintf(text, sizeof text, "%s", ncclxThreadLastError());
  /* Name the operation unless the text already does ("allreduce #7: cudaMemcpyAsync ..."). */
  const char* op = comm->curOpName;
  if (op && strncmp(text, op, strlen(op)) != 0)
    return commFail(comm, res, "%s #%llu: %s", op, (unsigned long long)comm->curOpSeq, text);
  return commFail(comm, res, "%s", text);
}

/* Every collective asks gpuNetCollCheck: a yes is remembered for the transports it was found
 * for (what it depends on: capsOf is fixed per net, ctx and dev), which saves the lookups
 * per transport on each call. A comm's network can be swapped (tests do), hence the key. */
static int hostMemOkCached(const struct ncclxComm* comm) {
  if (!comm->hostMemOk) return 0;
  for (int t = 0; t < NCCLX_NUM_TP; t++) {
    const struct ncclxTransport *now = &comm->tp[t], *then = &comm->hostMemOkFor[t];
    if (now->net != then->net || now->ctx != then->ctx || now->dev != then->dev) return 0;
  }
  return 1;
}

ncclxResult_t gpuNetCollCheck(struct ncclxComm* comm) {
  if (comm->nranks == 1 || hostMemOkCached(comm)) return ncclxSuccess;
  if (gpuNetTakesHost(comm)) {
    memcpy(comm->hostMemOkFor, comm->tp, sizeof(comm->hostMemOkFor));
    comm->hostMemOk = 1;
    return ncclxSuccess;
  }
  for (int t = 0; t < NCCLX_NUM_TP; t++) {
    const struct ncclxTransport* tp = &comm->tp[t];
    if (!tp->net) continue;
    int ptrSupport = capsOf(tp).ptrSupport;
    if (!(ptrSupport & NCCLX_PTR_HOST))
      return commFail(comm, ncclxInvalidUsage,
                      "%s #%llu: collectives move host memory (device buffers are staged through it), "
                      "but network '%s' takes only device memory (ptrSupport 0x%x has no NCCLX_PTR_HOST)",
                      comm->curOpName ? comm->curOpName : "collective", (unsigned long long)comm->curOpSeq,
                      tp->net->name, ptrSupport);
  }
  return ncclxSuccess;
}

static struct ncclxComm* commOf(struct ncclxComm* comm, const ncclxXfer* x) { return x->comm ? x->comm : comm; }

static const char* opName(const struct ncclxComm* comm) { return comm->curOpName ? comm->curOpName : "operation"; }

static ncclxResult_t refuse(struct ncclxComm* c, const ncclxXfer* x, int memKind, int ptrSupport, int cudaBuild) {
  char who[128];
  const ncclxNet_t* net = c->tp[transportFor(c, x->peer)].net;
  const char* dir = x->isSend ? "send buffer" : "receive buffer";
  const char* toFrom = x->isSend ? "to" : "from";
  commDescribeRank(c, x->peer, who, sizeof who);
  if (memKind == GPU_MEM_DEVICE && !cudaBuild)
    return commFail(c, ncclxInvalidUsage,
                    "%s #%llu: %s %p (%zu bytes %s %s) is CUDA device memory, but this libncclx was "
                    "built without CUDA (configure with -DNCCLX_CUDA=ON)",
                    opName(c), (unsigned long long)c->curOpSeq, dir, x->buf, x->bytes, toFrom, who);
  return commFail(c, ncclxInvalidUsage,
                  "%s #%llu: %s %p (%zu bytes %s %s) is %s memory, but network '%s' takes only device "
                  "memory (ptrSupport 0x%x has no NCCLX_PTR_HOST)",
                  opName(c), (unsigned long long)c->curOpSeq, dir, x->buf, x->bytes, toFrom, who,
                  memKind == GPU_MEM_DEVICE ? "staged host" : "host", net ? net->name : "?", ptrSupport);
}

ncclxResult_t gpuNetPlanXfers(struct ncclxComm* comm, const ncclxXfer* xfers, int n, int cudaBuild,
                              gpuNetXfers* out) {
  memset(out, 0, sizeof *out);
  out->plan = calloc(n > 0 ? (size_t)n : 1, 1);
  if (!out->plan) return gpuFailComm(comm, ncclxSetError(ncclxSystemError, "out of memory planning %d transfers", n));
  int driver = gpuDriverLoaded();
  for (int i = 0; i < n; i++) {
    const ncclxXfer* x = &xfers[i];
    struct ncclxComm* c = commOf(comm, x);
    int kind = driver && x->buf && x->bytes ? (int)gpuProbePointer(x->buf, NULL) : (int)GPU_MEM_HOST;
    int toSelf = x->peer == c->rank;
    gpuNetPlan plan;
    int ptrSupport = NCCLX_PTR_HOST;
    if (kind != GPU_MEM_DEVICE && (toSelf || gpuNetTakesHost(c))) {
      plan = GPU_NET_PASS; /* the common case: no per-peer lookup */
    } else {
      ptrSupport = gpuNetPtrSupport(c, x->peer, NULL);
      plan = gpuNetDecide(kind, ptrSupport, toSelf, x->redDst != NULL, cudaBuild);
    }
    if (plan == GPU_NET_REFUSE) {
      ncclxResult_t res = refuse(c, x, kind, ptrSupport, cudaBuild);
      free(out->plan);
      out->plan = NULL;
      return res;
    }
    out->plan[i] = (unsigned char)plan;
    out->nDirect += plan == GPU_NET_DIRECT;
    out->nStage += plan == GPU_NET_STAGE;
  }
  return ncclxSuccess;
}

/* ---- registration and the engine's lookup ---- */

/* Connections first (regMr needs them): every peer of the step, per communicator, as
 * xferRun would connect them, so both sides progress the same handshakes. */
static ncclxResult_t connectStep(struct ncclxComm* comm, const ncclxXfer* xfers, int n) {
  int* peers = malloc(sizeof(int) * (size_t)(2 * n + 2));
  if (!peers) return gpuFailComm(comm, ncclxSetError(ncclxSystemError, "out of memory"));
  ncclxResult_t res = ncclxSuccess;
  for (int i = 0; i < n && res == ncclxSuccess; i++) {
    struct ncclxComm* c = commOf(comm, &xfers[i]);
    int seen = 0;
    for (int j = 0; j < i; j++) seen |= commOf(comm, &xfers[j]) == c;
    if (seen) continue;
    int ns = 0, nr = 0;
    for (int j = i; j < n; j++)
      if (commOf(comm, &xfers[j]) == c) {
        if (xfers[j].isSend) peers[ns++] = xfers[j].peer;
        else peers[n + 1 + nr++] = xfers[j].peer;
      }
    res = peersEnsure(c, peers, ns, peers + n + 1, nr);
  }
  free(peers);
  return res;
}

ncclxResult_t gpuNetRegister(struct ncclxComm* comm, ncclxXfer* xfers, int n, gpuNetXfers* p) {
  if (p->nDirect == 0) return ncclxSuccess;
  p->regs = calloc((size_t)p->nDirect, sizeof(*p->regs));
  if (!p->regs) return gpuFailComm(comm, ncclxSetError(ncclxSystemError, "out of memory registering device buffers"));
  NCCLX_CHECK(connectStep(comm, xfers, n));
  for (int i = 0; i < n; i++) {
    if (p->plan[i] != GPU_NET_DIRECT) continue;
    ncclxXfer* x = &xfers[i];
    struct ncclxComm* c = commOf(comm, x);
    struct ncclxPeerConn* conn = &c->conns[x->peer];
    void* netComm = x->isSend ? conn->sendComm : conn->recvComm;
    char who[128];
    commDescribeRank(c, x->peer, who, sizeof who);
    if (!conn->net || !netComm)
      return commFail(c, ncclxInternalError, "%s #%llu: no connection %s %s after connecting", opName(c),
                      (unsigned long long)c->curOpSeq, x->isSend ? "to" : "from", who);
    int forceFlush = 0;
    (void)gpuNetPtrSupport(c, x->peer, &forceFlush);
    void* mh = NULL;
    ncclxResult_t res = conn->net->regMr(netComm, x->buf, x->bytes, NCCLX_PTR_CUDA, &mh);
    if (res != ncclxSuccess)
      return commFail(c, res, "%s #%llu: network '%s' cannot register %zu bytes of device memory at %p "
                      "(regMr type NCCLX_PTR_CUDA) to %s %s", opName(c), (unsigned long long)c->curOpSeq,
                      conn->net->name, x->bytes, x->buf, x->isSend ? "send to" : "receive from", who);
    p->regs[p->nRegs++] = (gpuNetReg){.netComm = netComm, .net = conn->net, .base = x->buf, .bytes = x->bytes,
                                      .mhandle = mh, .flush = !x->isSend && forceFlush && conn->net->iflush};
  }
  xferPublishRegs(p->regs, p->nRegs);
  p->active = 1;
  return ncclxSuccess;
}

static double nowSec(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Between polls of a flush: give up on abort or after the communicator's timeout. */
static ncclxResult_t flushBound(struct ncclxComm* comm, const gpuNetReg* r, double start) {
  if (atomic_load(&comm->abortFlag)) {
    ncclxResult_t res = commCheckHealthy(comm);
    return res != ncclxSuccess ? res : ncclxSetError(ncclxInvalidUsage, "communicator aborted");
  }
  if (comm->timeoutSec > 0 && nowSec() - start > comm->timeoutSec)
    return commFail(comm, ncclxSystemError, "%s #%llu: network '%s' did not flush %zu bytes of device memory "
                    "at %p within %.0f s ([core] timeout_s)", opName(comm), (unsigned long long)comm->curOpSeq,
                    r->net->name, r->bytes, (void*)r->base, comm->timeoutSec);
  sched_yield();
  return ncclxSuccess;
}

ncclxResult_t gpuNetFlush(struct ncclxComm* comm, gpuNetXfers* p) {
  for (int i = 0; i < p->nRegs; i++) {
    const gpuNetReg* r = &p->regs[i];
    if (!r->flush) continue;
    void* data = r->base;
    size_t size = r->bytes;
    void* mh = r->mhandle;
    void* req = NULL;
    double start = nowSec();
    for (;;) {
      ncclxResult_t res = r->net->iflush(r->netComm, 1, &data, &size, &mh, &req);
      if (res != ncclxSuccess)
        return commFail(comm, res, "%s #%llu: network '%s' failed to flush %zu bytes of device memory at %p",
                        opName(comm), (unsigned long long)comm->curOpSeq, r->net->name, r->bytes, (void*)r->base);
      if (req) break;
      NCCLX_CHECK(flushBound(comm, r, start)); /* cannot start now: retry */
    }
    for (int done = 0; !done;) {
      ncclxResult_t res = r->net->test(req, &done, NULL);
      if (res != ncclxSuccess)
        return commFail(comm, res, "%s #%llu: network '%s': flush of %zu bytes at %p failed", opName(comm),
                        (unsigned long long)comm->curOpSeq, r->net->name, r->bytes, (void*)r->base);
      if (!done) NCCLX_CHECK(flushBound(comm, r, start));
    }
  }
  return ncclxSuccess;
}

void gpuNetRelease(gpuNetXfers* p, int failed) {
  if (p->active) xferPublishRegs(NULL, 0);
  for (int i = 0; i < p->nRegs; i++) {
    if (failed) continue; /* requests may still use it: the dying connections release it */
    if (p->regs[i].net->deregMr(p->regs[i].netComm, p->regs[i].mhandle) != ncclxSuccess)
      WARN("network '%s': deregMr of %zu bytes of device memory at %p failed", p->regs[i].net->name,
           p->regs[i].bytes, (void*)p->regs[i].base);
  }
  free(p->regs);
  free(p->plan);
  memset(p, 0, sizeof *p);
}
