/*
 * An in-process stand-in for libibverbs.so.1, for tests only: it lets test_ib_device run the
 * net_ib plugin's own logic (handshake, CTS flow, striping, completions, error paths) on a
 * machine without RDMA hardware. It is NOT a model of a driver or of real hardware timing.
 *
 * What it emulates (one device "mock0", one port, everything inside one process):
 * - RC queue pairs with the state machine RESET -> INIT -> RTR -> RTS (-> ERR), checking the
 *   attribute masks each transition needs, the path (LID or GID must be the local port's:
 *   this is a loopback), and the peer's QP number;
 * - memory regions with lkey/rkey checks, bounds and access flags (REMOTE_WRITE needs
 *   LOCAL_WRITE; a remote write needs both the MR's and the QP's remote-write permission);
 * - SEND, RDMA WRITE and RDMA WRITE WITH IMMEDIATE, delivered asynchronously: posts queue per
 *   QP and move during later ibv_poll_cq calls, in order per QP but interleaved across QPs;
 * - a send or write with immediate that finds no posted receive is an error completion (RNR
 *   retries exhausted): the plugin promises this never happens, so the test sees it if it does;
 * - CQ overrun, send/receive queue overflow and use of a destroyed object abort the process
 *   with a message (plugin bugs);
 * - completion channels with one-shot arming (ibv_req_notify_cq) over a pipe;
 * - NCCLX_IB_MOCK_ROCE=1 makes the port RoCE (GID-routed); NCCLX_IB_MOCK_NODEV=1 hides the
 *   device; NCCLX_IB_MOCK_SILENT_LOSS=1 makes operations towards a vanished QP disappear
 *   without a completion, as if the transport were still retrying (so only the plugin's own
 *   peer-loss detection can end the wait).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <infiniband/verbs.h>

#undef ibv_query_port
#undef ibv_reg_mr

#define MOCK_LID 7
#define MOCK_MAX_QPS 4096
#define MOCK_MAX_MRS 65536
#define MOCK_QPN_BASE 0x100
#define MOCK_MAX_SGE 4

static pthread_mutex_t mockLock = PTHREAD_MUTEX_INITIALIZER;

static void die(const char* fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
static void die(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "mock_verbs: plugin bug: ");
  vfprintf(stderr, fmt, ap);
  fprintf(stderr, "\n");
  va_end(ap);
  abort();
}

static int roce(void) { return getenv("NCCLX_IB_MOCK_ROCE") && atoi(getenv("NCCLX_IB_MOCK_ROCE")); }

static void portGid(int index, union ibv_gid* gid, int* type) {
  memset(gid, 0, sizeof(*gid));
  if (roce() && index == 1) { /* RoCE v2, IPv4-mapped 10.0.0.7 */
    gid->raw[10] = gid->raw[11] = 0xff;
    gid->raw[12] = 10, gid->raw[15] = 7;
    *type = IBV_GID_TYPE_ROCE_V2;
  } else { /* fe80::7 */
    gid->raw[0] = 0xfe, gid->raw[1] = 0x80, gid->raw[15] = 7;
    *type = roce() ? IBV_GID_TYPE_ROCE_V1 : IBV_GID_TYPE_IB;
  }
}

/* ---------- objects ---------- */

typedef struct {
  struct ibv_mr mr;
  int access;
  int live;
} MockMr;

typedef struct {
  struct ibv_cq cq;
  struct ibv_wc* ring;
  int cap, head, count;
  int armed;
  int writeFd;
  int users; /* QPs attached */
} MockCq;

typedef struct {
  uint64_t wrId;
  int nsge;
  struct ibv_sge sge[MOCK_MAX_SGE];
} MockRecv;

typedef struct MockOp MockOp;
struct MockOp { /* a posted send waiting for delivery */
  MockOp* next;
  struct ibv_send_wr wr;
  struct ibv_sge sge[MOCK_MAX_SGE];
};

typedef struct {
  struct ibv_qp qp;
  int live;
  int access;
  uint32_t dest;
  int maxSend, maxRecv;
  int sendOutstanding;
  MockRecv* rq;
  int rqHead, rqCount;
  MockOp *opHead, *opTail;
} MockQp;

static MockQp* qps[MOCK_MAX_QPS];
static MockMr* mrs[MOCK_MAX_MRS];
static int nmrs;
static struct ibv_device mockDevice;
static int mockDeviceReady;

/* ---------- device, context, pd ---------- */

struct ibv_device** ibv_get_device_list(int* num) {
  struct ibv_device** list = calloc(2, sizeof(*list));
  int n = getenv("NCCLX_IB_MOCK_NODEV") ? 0 : 1;
  if (!list) return NULL;
  pthread_mutex_lock(&mockLock);
  if (!mockDeviceReady) {
    snprintf(mockDevice.name, sizeof(mockDevice.name), "mock0");
    mockDevice.node_type = IBV_NODE_CA;
    mockDevice.transport_type = IBV_TRANSPORT_IB;
    mockDeviceReady = 1;
  }
  pthread_mutex_unlock(&mockLock);
  if (n) list[0] = &mockDevice;
  if (num) *num = n;
  return list;
}

void ibv_free_device_list(struct ibv_device** list) { free(list); }

const char* ibv_get_device_name(struct ibv_device* device) { return device->name; }

static int mockPollCq(struct ibv_cq* cq, int n, struct ibv_wc* wc);
static int mockReqNotify(struct ibv_cq* cq, int solicited);
static int mockPostSend(struct ibv_qp* qp, struct ibv_send_wr* wr, struct ibv_send_wr** bad);
static int mockPostRecv(struct ibv_qp* qp, struct ibv_recv_wr* wr, struct ibv_recv_wr** bad);

struct ibv_context* ibv_open_device(struct ibv_device* device) {
  struct ibv_context* ctx = calloc(1, sizeof(*ctx));
  if (!ctx) return NULL;
  ctx->device = device;
  ctx->cmd_fd = -1;
  ctx->async_fd = -1;
  ctx->num_comp_vectors = 1;
  ctx->ops.poll_cq = mockPollCq;
  ctx->ops.req_notify_cq = mockReqNotify;
  ctx->ops.post_send = mockPostSend;
  ctx->ops.post_recv = mockPostRecv;
  pthread_mutex_init(&ctx->mutex, NULL);
  return ctx;
}

int ibv_close_device(struct ibv_context* ctx) {
  pthread_mutex_destroy(&ctx->mutex);
  free(ctx);
  return 0;
}

int ibv_query_device(struct ibv_context* ctx, struct ibv_device_attr* attr) {
  (void)ctx;
  memset(attr, 0, sizeof(*attr));
  attr->node_guid = 0x0700000000000000ull;
  attr->phys_port_cnt = 1;
  attr->max_qp = MOCK_MAX_QPS;
  attr->max_qp_wr = 16384;
  attr->max_cqe = 65536;
  attr->max_mr = MOCK_MAX_MRS;
  attr->max_sge = MOCK_MAX_SGE;
  return 0;
}

int ibv_query_port(struct ibv_context* ctx, uint8_t port, struct _compat_ibv_port_attr* compat) {
  (void)ctx;
  if (port != 1) return EINVAL;
  struct ibv_port_attr* a = (struct ibv_port_attr*)compat; /* the caller zeroed the whole struct */
  a->state = IBV_PORT_ACTIVE;
  a->max_mtu = IBV_MTU_4096;
  a->active_mtu = roce() ? IBV_MTU_1024 : IBV_MTU_4096;
  a->gid_tbl_len = 2;
  a->lid = roce() ? 0 : MOCK_LID;
  a->active_width = 2;  /* 4x */
  a->active_speed = 32; /* EDR */
  a->link_layer = roce() ? IBV_LINK_LAYER_ETHERNET : IBV_LINK_LAYER_INFINIBAND;
  return 0;
}

int _ibv_query_gid_ex(struct ibv_context* ctx, uint32_t port, uint32_t index,
                      struct ibv_gid_entry* entry, uint32_t flags, size_t size) {
  (void)ctx, (void)flags;
  if (port != 1 || size < sizeof(*entry)) return EINVAL;
  if (index >= 2) {
    errno = ENODATA;
    return ENODATA;
  }
  int type;
  memset(entry, 0, sizeof(*entry));
  portGid((int)index, &entry->gid, &type);
  entry->gid_index = index;
  entry->port_num = port;
  entry->gid_type = (uint32_t)type;
  return 0;
}

int ibv_query_gid(struct ibv_context* ctx, uint8_t port, int index, union ibv_gid* gid) {
  (void)ctx;
  int type;
  if (port != 1 || index < 0 || index >= 2) return -1;
  portGid(index, gid, &type);
  return 0;
}

struct ibv_pd* ibv_alloc_pd(struct ibv_context* ctx) {
  struct ibv_pd* pd = calloc(1, sizeof(*pd));
  if (pd) pd->context = ctx;
  return pd;
}

int ibv_dealloc_pd(struct ibv_pd* pd) {
  free(pd);
  return 0;
}

/* ---------- memory regions ---------- */

struct ibv_mr* ibv_reg_mr_iova2(struct ibv_pd* pd, void* addr, size_t length, uint64_t iova,
                                unsigned int access) {
  (void)iova;
  if ((access & (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC)) && !(access & IBV_ACCESS_LOCAL_WRITE)) {
    errno = EINVAL;
    return NULL;
  }
  if (!addr || length == 0) {
    errno = EINVAL;
    return NULL;
  }
  MockMr* m = calloc(1, sizeof(*m));
  if (!m) return NULL;
  pthread_mutex_lock(&mockLock);
  if (nmrs == MOCK_MAX_MRS) die("more than %d memory registrations (leak?)", MOCK_MAX_MRS);
  int id = nmrs++;
  mrs[id] = m;
  pthread_mutex_unlock(&mockLock);
  m->mr.context = pd->context;
  m->mr.pd = pd;
  m->mr.addr = addr;
  m->mr.length = length;
  m->mr.lkey = m->mr.rkey = 0x1000u + (uint32_t)id;
  m->access = (int)access;
  m->live = 1;
  return &m->mr;
}

struct ibv_mr* ibv_reg_mr(struct ibv_pd* pd, void* addr, size_t length, int access) {
  return ibv_reg_mr_iova2(pd, addr, length, (uintptr_t)addr, (unsigned)access);
}

int ibv_dereg_mr(struct ibv_mr* mr) {
  pthread_mutex_lock(&mockLock);
  MockMr* m = (MockMr*)mr;
  if (!m->live) die("ibv_dereg_mr of a deregistered MR");
  m->live = 0; /* kept (never reused) so that late use of the key is caught */
  pthread_mutex_unlock(&mockLock);
  return 0;
}

static MockMr* mrByKey(uint32_t key) {
  if (key < 0x1000u || key - 0x1000u >= (uint32_t)nmrs) return NULL;
  MockMr* m = mrs[key - 0x1000u];
  return m && m->live ? m : NULL;
}

static int mrCovers(const MockMr* m, uint64_t addr, uint64_t len) {
  uint64_t a = (uintptr_t)m->mr.addr;
  return addr >= a && addr + len <= a + m->mr.length && addr + len >= addr;
}

/* ---------- completion channels and CQs ---------- */

typedef struct {
  struct ibv_comp_channel ch;
  int writeFd;
} MockChannel;

struct ibv_comp_channel* ibv_create_comp_channel(struct ibv_context* ctx) {
  MockChannel* c = calloc(1, sizeof(*c));
  int fds[2];
  if (!c || pipe2(fds, O_CLOEXEC) != 0) {
    free(c);
    return NULL;
  }
  c->ch.context = ctx;
  c->ch.fd = fds[0];
  c->writeFd = fds[1];
  return &c->ch;
}

int ibv_destroy_comp_channel(struct ibv_comp_channel* ch) {
  MockChannel* c = (MockChannel*)ch;
  close(c->ch.fd);
  close(c->writeFd);
  free(c);
  return 0;
}

struct ibv_cq* ibv_create_cq(struct ibv_context* ctx, int cqe, void* cqContext,
                             struct ibv_comp_channel* channel, int vector) {
  (void)vector;
  MockCq* q = calloc(1, sizeof(*q));
  if (!q || cqe < 1 || !(q->ring = calloc((size_t)cqe, sizeof(*q->ring)))) {
    if (q) free(q);
    errno = EINVAL;
    return NULL;
  }
  q->cq.context = ctx;
  q->cq.channel = channel;
  q->cq.cq_context = cqContext;
  q->cq.cqe = cqe;
  q->cap = cqe;
  q->writeFd = channel ? ((MockChannel*)channel)->writeFd : -1;
  return &q->cq;
}

int ibv_destroy_cq(struct ibv_cq* cq) {
  MockCq* q = (MockCq*)cq;
  pthread_mutex_lock(&mockLock);
  int busy = q->users;
  pthread_mutex_unlock(&mockLock);
  if (busy) return EBUSY;
  free(q->ring);
  free(q);
  return 0;
}

static void cqPush(MockCq* q, const struct ibv_wc* wc) {
  if (q->count == q->cap) die("CQ overrun (%d entries): the CQ is too small for what was posted", q->cap);
  q->ring[(q->head + q->count++) % q->cap] = *wc;
  if (q->armed && q->writeFd >= 0) {
    q->armed = 0;
    void* p = q;
    if (write(q->writeFd, &p, sizeof(p)) != (ssize_t)sizeof(p)) die("event pipe write failed");
  }
}

static int mockReqNotify(struct ibv_cq* cq, int solicited) {
  (void)solicited;
  pthread_mutex_lock(&mockLock);
  ((MockCq*)cq)->armed = 1;
  pthread_mutex_unlock(&mockLock);
  return 0;
}

int ibv_get_cq_event(struct ibv_comp_channel* ch, struct ibv_cq** cq, void** cqContext) {
  void* p = NULL;
  ssize_t n = read(ch->fd, &p, sizeof(p));
  if (n != (ssize_t)sizeof(p)) return -1; /* errno EAGAIN on a non-blocking channel */
  MockCq* q = p;
  *cq = &q->cq;
  *cqContext = q->cq.cq_context;
  return 0;
}

void ibv_ack_cq_events(struct ibv_cq* cq, unsigned int nevents) { cq->comp_events_completed += nevents; }

/* ---------- queue pairs ---------- */

struct ibv_qp* ibv_create_qp(struct ibv_pd* pd, struct ibv_qp_init_attr* attr) {
  if (attr->qp_type != IBV_QPT_RC || !attr->send_cq || !attr->recv_cq || attr->srq ||
      attr->cap.max_send_sge > MOCK_MAX_SGE || attr->cap.max_recv_sge > MOCK_MAX_SGE) {
    errno = EINVAL;
    return NULL;
  }
  MockQp* m = calloc(1, sizeof(*m));
  if (!m || !(m->rq = calloc(attr->cap.max_recv_wr + 1, sizeof(*m->rq)))) {
    free(m);
    errno = ENOMEM;
    return NULL;
  }
  pthread_mutex_lock(&mockLock);
  int slot = -1;
  for (int i = 0; i < MOCK_MAX_QPS && slot < 0; i++)
    if (!qps[i]) slot = i;
  if (slot < 0) die("more than %d QPs", MOCK_MAX_QPS);
  qps[slot] = m;
  ((MockCq*)attr->send_cq)->users++;
  ((MockCq*)attr->recv_cq)->users++;
  pthread_mutex_unlock(&mockLock);
  m->qp.context = pd->context;
  m->qp.qp_context = attr->qp_context;
  m->qp.pd = pd;
  m->qp.send_cq = attr->send_cq;
  m->qp.recv_cq = attr->recv_cq;
  m->qp.qp_num = MOCK_QPN_BASE + (uint32_t)slot;
  m->qp.state = IBV_QPS_RESET;
  m->qp.qp_type = IBV_QPT_RC;
  m->maxSend = (int)attr->cap.max_send_wr;
  m->maxRecv = (int)attr->cap.max_recv_wr;
  m->live = 1;
  return &m->qp;
}

static MockQp* qpByNum(uint32_t num) {
  if (num < MOCK_QPN_BASE || num - MOCK_QPN_BASE >= MOCK_MAX_QPS) return NULL;
  MockQp* m = qps[num - MOCK_QPN_BASE];
  return m && m->live ? m : NULL;
}

static void flushRecvs(MockQp* m) {
  while (m->rqCount > 0) {
    struct ibv_wc wc;
    memset(&wc, 0, sizeof(wc));
    wc.wr_id = m->rq[m->rqHead].wrId;
    wc.status = IBV_WC_WR_FLUSH_ERR;
    wc.qp_num = m->qp.qp_num;
    m->rqHead = (m->rqHead + 1) % (m->maxRecv + 1);
    m->rqCount--;
    cqPush((MockCq*)m->qp.recv_cq, &wc);
  }
}

/* The send-queue slot is freed when the completion is generated (real queues free it when
 * the completion is polled; the plugin polls before it posts more, so this is close enough). */
static void sendCompletion(MockQp* m, const struct ibv_send_wr* wr, enum ibv_wc_status st) {
  m->sendOutstanding--;
  if (st == IBV_WC_SUCCESS && !(wr->send_flags & IBV_SEND_SIGNALED)) return;
  struct ibv_wc wc;
  memset(&wc, 0, sizeof(wc));
  wc.wr_id = wr->wr_id;
  wc.status = st;
  wc.qp_num = m->qp.qp_num;
  wc.opcode = wr->opcode == IBV_WR_SEND ? IBV_WC_SEND : IBV_WC_RDMA_WRITE;
  cqPush((MockCq*)m->qp.send_cq, &wc);
}

static void toError(MockQp* m) {
  m->qp.state = IBV_QPS_ERR;
  flushRecvs(m);
  while (m->opHead) { /* posted sends are flushed too */
    MockOp* op = m->opHead;
    m->opHead = op->next;
    sendCompletion(m, &op->wr, IBV_WC_WR_FLUSH_ERR);
    free(op);
  }
  m->opTail = NULL;
}

int ibv_modify_qp(struct ibv_qp* qp, struct ibv_qp_attr* attr, int mask) {
  MockQp* m = (MockQp*)qp;
  int rc = 0;
  pthread_mutex_lock(&mockLock);
  if (!m->live) die("ibv_modify_qp on a destroyed QP");
  enum ibv_qp_state from = qp->state, to = (mask & IBV_QP_STATE) ? attr->qp_state : from;
  const int initMask = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS;
  const int rtrMask = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                      IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
  const int rtsMask = IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                      IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC;
  if (to == IBV_QPS_ERR) {
    toError(m);
  } else if (from == IBV_QPS_RESET && to == IBV_QPS_INIT) {
    if ((mask & initMask) != initMask || attr->port_num != 1) rc = EINVAL;
    else m->access = (int)attr->qp_access_flags;
  } else if (from == IBV_QPS_INIT && to == IBV_QPS_RTR) {
    int pathOk;
    if (roce()) {
      union ibv_gid g;
      int type;
      portGid(attr->ah_attr.grh.sgid_index, &g, &type);
      pathOk = attr->ah_attr.is_global && attr->ah_attr.grh.sgid_index < 2 &&
               memcmp(attr->ah_attr.grh.dgid.raw, g.raw, 16) == 0;
    } else {
      pathOk = attr->ah_attr.is_global || attr->ah_attr.dlid == MOCK_LID;
    }
    if ((mask & rtrMask) != rtrMask || !pathOk || attr->ah_attr.port_num != 1 ||
        attr->path_mtu < IBV_MTU_256 || attr->path_mtu > (roce() ? IBV_MTU_1024 : IBV_MTU_4096) ||
        attr->rq_psn > 0xffffff || !qpByNum(attr->dest_qp_num))
      rc = EINVAL;
    else
      m->dest = attr->dest_qp_num;
  } else if (from == IBV_QPS_RTR && to == IBV_QPS_RTS) {
    if ((mask & rtsMask) != rtsMask || attr->timeout == 0 || attr->retry_cnt > 7 ||
        attr->rnr_retry > 7 || attr->sq_psn > 0xffffff)
      rc = EINVAL;
  } else if (from != to) {
    rc = EINVAL;
  }
  if (rc == 0) qp->state = to;
  pthread_mutex_unlock(&mockLock);
  return rc;
}

int ibv_destroy_qp(struct ibv_qp* qp) {
  MockQp* m = (MockQp*)qp;
  pthread_mutex_lock(&mockLock);
  if (!m->live) die("ibv_destroy_qp twice");
  while (m->opHead) {
    MockOp* op = m->opHead;
    m->opHead = op->next;
    free(op);
  }
  m->live = 0;
  qps[qp->qp_num - MOCK_QPN_BASE] = NULL;
  ((MockCq*)qp->send_cq)->users--;
  ((MockCq*)qp->recv_cq)->users--;
  pthread_mutex_unlock(&mockLock);
  free(m->rq);
  free(m);
  return 0;
}

static int mockPostRecv(struct ibv_qp* qp, struct ibv_recv_wr* wr, struct ibv_recv_wr** bad) {
  MockQp* m = (MockQp*)qp;
  pthread_mutex_lock(&mockLock);
  int rc = 0;
  for (; wr && rc == 0; wr = wr->next) {
    if (qp->state == IBV_QPS_RESET || wr->num_sge > MOCK_MAX_SGE) rc = EINVAL;
    else if (m->rqCount == m->maxRecv) die("receive queue of QP %u overflows (%d WRs)", qp->qp_num, m->maxRecv);
    if (rc) {
      *bad = wr;
      break;
    }
    MockRecv* r = &m->rq[(m->rqHead + m->rqCount++) % (m->maxRecv + 1)];
    r->wrId = wr->wr_id;
    r->nsge = wr->num_sge;
    if (wr->num_sge > 0) memcpy(r->sge, wr->sg_list, (size_t)wr->num_sge * sizeof(struct ibv_sge));
    if (qp->state == IBV_QPS_ERR) flushRecvs(m);
  }
  pthread_mutex_unlock(&mockLock);
  return rc;
}

static int mockPostSend(struct ibv_qp* qp, struct ibv_send_wr* wr, struct ibv_send_wr** bad) {
  MockQp* m = (MockQp*)qp;
  pthread_mutex_lock(&mockLock);
  int rc = 0;
  for (; wr; wr = wr->next) {
    int opOk = wr->opcode == IBV_WR_SEND || wr->opcode == IBV_WR_RDMA_WRITE ||
               wr->opcode == IBV_WR_RDMA_WRITE_WITH_IMM;
    if (qp->state != IBV_QPS_RTS || !opOk || wr->num_sge > MOCK_MAX_SGE || (wr->send_flags & IBV_SEND_INLINE)) {
      rc = EINVAL;
      *bad = wr;
      break;
    }
    if (m->sendOutstanding == m->maxSend) die("send queue of QP %u overflows (%d WRs)", qp->qp_num, m->maxSend);
    MockOp* op = calloc(1, sizeof(*op));
    if (!op) die("out of memory");
    op->wr = *wr;
    op->wr.next = NULL;
    if (wr->num_sge > 0) memcpy(op->sge, wr->sg_list, (size_t)wr->num_sge * sizeof(struct ibv_sge));
    op->wr.sg_list = op->sge;
    m->sendOutstanding++;
    if (m->opTail) m->opTail->next = op;
    else m->opHead = op;
    m->opTail = op;
  }
  pthread_mutex_unlock(&mockLock);
  return rc;
}

/* Gathers the local buffer of a send; the status to report when the keys are bad. */
static enum ibv_wc_status gather(const MockOp* op, uint8_t** data, size_t* len) {
  *len = 0;
  for (int i = 0; i < op->wr.num_sge; i++) *len += op->sge[i].length;
  *data = malloc(*len ? *len : 1);
  size_t off = 0;
  for (int i = 0; i < op->wr.num_sge; i++) {
    MockMr* mr = mrByKey(op->sge[i].lkey);
    if (!mr || !mrCovers(mr, op->sge[i].addr, op->sge[i].length)) return IBV_WC_LOC_PROT_ERR;
    memcpy(*data + off, (void*)(uintptr_t)op->sge[i].addr, op->sge[i].length);
    off += op->sge[i].length;
  }
  return IBV_WC_SUCCESS;
}

/* Executes the oldest posted send of m at its peer. */
static void deliver(MockQp* m) {
  MockOp* op = m->opHead;
  m->opHead = op->next;
  if (!m->opHead) m->opTail = NULL;
  MockQp* d = qpByNum(m->dest);
  uint8_t* data = NULL;
  size_t len = 0;
  enum ibv_wc_status st = gather(op, &data, &len);
  if (st == IBV_WC_SUCCESS && (!d || d->dest != m->qp.qp_num || d->qp.state < IBV_QPS_RTR ||
                               d->qp.state == IBV_QPS_ERR)) {
    if (!d && getenv("NCCLX_IB_MOCK_SILENT_LOSS")) { /* still "retrying": no completion */
      free(data);
      free(op);
      return;
    }
    st = IBV_WC_RETRY_EXC_ERR; /* nobody answers */
  }
  int isWrite = op->wr.opcode != IBV_WR_SEND;
  if (st == IBV_WC_SUCCESS && isWrite && len > 0) {
    MockMr* rmr = mrByKey(op->wr.wr.rdma.rkey);
    if (!rmr || !(rmr->access & IBV_ACCESS_REMOTE_WRITE) || !(d->access & IBV_ACCESS_REMOTE_WRITE) ||
        !mrCovers(rmr, op->wr.wr.rdma.remote_addr, len))
      st = IBV_WC_REM_ACCESS_ERR;
    else
      memcpy((void*)(uintptr_t)op->wr.wr.rdma.remote_addr, data, len);
  }
  if (st == IBV_WC_SUCCESS && op->wr.opcode != IBV_WR_RDMA_WRITE) {
    if (d->rqCount == 0) {
      st = IBV_WC_RNR_RETRY_EXC_ERR; /* the plugin posts receives first: this is a bug */
      fprintf(stderr, "mock_verbs: RNR: QP %u sent to QP %u with no receive posted\n", m->qp.qp_num, d->qp.qp_num);
    } else {
      MockRecv r = d->rq[d->rqHead];
      d->rqHead = (d->rqHead + 1) % (d->maxRecv + 1);
      d->rqCount--;
      struct ibv_wc wc;
      memset(&wc, 0, sizeof(wc));
      wc.wr_id = r.wrId;
      wc.qp_num = d->qp.qp_num;
      wc.src_qp = m->qp.qp_num;
      wc.byte_len = (uint32_t)len;
      if (isWrite) {
        wc.opcode = IBV_WC_RECV_RDMA_WITH_IMM;
        wc.wc_flags = IBV_WC_WITH_IMM;
        wc.imm_data = op->wr.imm_data;
      } else {
        wc.opcode = IBV_WC_RECV;
        size_t off = 0, room = 0;
        for (int i = 0; i < r.nsge; i++) room += r.sge[i].length;
        if (len > room) {
          wc.status = IBV_WC_LOC_LEN_ERR;
          st = IBV_WC_REM_INV_REQ_ERR;
        }
        for (int i = 0; i < r.nsge && wc.status == IBV_WC_SUCCESS && off < len; i++) {
          MockMr* mr = mrByKey(r.sge[i].lkey);
          size_t n = len - off < r.sge[i].length ? len - off : r.sge[i].length;
          if (!mr || !(mr->access & IBV_ACCESS_LOCAL_WRITE) || !mrCovers(mr, r.sge[i].addr, n)) {
            wc.status = IBV_WC_LOC_PROT_ERR;
            st = IBV_WC_REM_OP_ERR;
            break;
          }
          memcpy((void*)(uintptr_t)r.sge[i].addr, data + off, n);
          off += n;
        }
      }
      cqPush((MockCq*)d->qp.recv_cq, &wc);
      if (wc.status != IBV_WC_SUCCESS) toError(d);
    }
  }
  free(data);
  sendCompletion(m, &op->wr, st);
  free(op);
  if (st != IBV_WC_SUCCESS) toError(m);
}

static int mockPollCq(struct ibv_cq* cq, int n, struct ibv_wc* wc) {
  MockCq* q = (MockCq*)cq;
  pthread_mutex_lock(&mockLock);
  /* Move up to two posted operations of every QP: delivery lags behind posting. */
  for (int i = 0; i < MOCK_MAX_QPS; i++)
    for (int k = 0; k < 2 && qps[i] && qps[i]->opHead; k++) deliver(qps[i]);
  int got = 0;
  while (got < n && q->count > 0) {
    wc[got] = q->ring[q->head];
    q->head = (q->head + 1) % q->cap;
    q->count--;
    got++;
  }
  pthread_mutex_unlock(&mockLock);
  return got;
}

const char* ibv_wc_status_str(enum ibv_wc_status status) {
  switch (status) {
    case IBV_WC_SUCCESS: return "success";
    case IBV_WC_LOC_LEN_ERR: return "local length error";
    case IBV_WC_LOC_PROT_ERR: return "local protection error";
    case IBV_WC_WR_FLUSH_ERR: return "Work Request Flushed Error";
    case IBV_WC_REM_ACCESS_ERR: return "remote access error";
    case IBV_WC_REM_INV_REQ_ERR: return "remote invalid request error";
    case IBV_WC_REM_OP_ERR: return "remote operation error";
    case IBV_WC_RETRY_EXC_ERR: return "transport retry counter exceeded";
    case IBV_WC_RNR_RETRY_EXC_ERR: return "RNR retry counter exceeded";
    default: return "other error";
  }
}
