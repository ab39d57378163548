/*
 * Internals of the libfabric network plugin (libncclx-net-ofi.so, plugin name "ofi").
 *
 * Design
 * - One device per distinct libfabric domain of the chosen provider. A device owns
 *   `endpoints` FI_EP_RDM endpoints (1 by default) bound to one completion queue and one
 *   address vector; every listen, send and receive comm on that device shares them. Control
 *   messages use endpoint 0; data message k of a connection goes from the sender's endpoint
 *   k % n to the receiver's endpoint k % n (n agreed at connect), so requests in flight spread
 *   over n provider connections. A device mutex serializes all libfabric calls on it (we
 *   open the domain with FI_THREAD_DOMAIN), so comms may be used from different threads.
 * - Everything is tagged messaging. The 64-bit tag says what a message is (OFI_KIND_*) and
 *   for data carries the receiver-assigned connection id and a per-connection sequence
 *   number, so message k of a connection can only land in receive k of that connection:
 *   ordering holds whatever the provider's ordering guarantees, and connections never
 *   match each other's messages.
 * - Clear-to-send mode (default for shm, see ofi_data.c): data goes only into receives the
 *   receiver has announced, so the provider never buffers unexpected data and never sees a
 *   receive smaller than its message.
 * - Connection setup is a request/reply on control tags (ofi_conn.c): connect() sends
 *   {its endpoint addresses, the listener's nonce, a pending id}; the listener checks the
 *   nonce, assigns a connection id and replies with it and its own endpoint addresses (or a
 *   refusal: wrong nonce, no such listener). Both happen inside completion processing, so a
 *   connect finishes as soon as the listener's process drives its completion queue.
 * - Every libfabric operation is an ofiOp embedded in an ofiObj (a comm, a pending connect,
 *   a control send, the device itself for its probe and connect receives). The object is
 *   freed only when libfabric no longer owns any of its operations; a comm closed with
 *   operations in flight waits on the device's object list until they complete, or until
 *   finalize closes the endpoint.
 * - A peer that dies does not always produce a libfabric error (a posted receive has no
 *   connection to fail). Comms waiting without progress check their peer (ofi_data.c):
 *   same host -> is the process still there; other host -> a probe message whose send
 *   fails when the peer's endpoint is gone.
 * - Connected mode (d->msgMode, `endpoint_type = msg`, the default for the tcp provider):
 *   no RDM endpoints and no tags. Each listen comm owns a passive endpoint, each send and
 *   receive comm one connected FI_EP_MSG endpoint (ofi_msg.c); connection requests carry
 *   the nonce in their connection data and events arrive on the device's event queue. Data
 *   are untagged messages matched in posting order, which the connection keeps; a peer
 *   that closes or dies ends the connection (an FI_SHUTDOWN event, errors on its
 *   operations). Everything else (completion queue, requests, objects, registration) is
 *   shared with the RDM mode.
 */
#ifndef NCCLX_NET_OFI_INTERNAL_H
#define NCCLX_NET_OFI_INTERNAL_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_eq.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_tagged.h>

#include "ncclx/net.h"

#define OFI_LOG(ctx, level, ...) \
  (ctx)->log((level), NCCLX_LOG_NET, __FILE__, __LINE__, "NET/OFI: " __VA_ARGS__)
#define OFI_WARN(ctx, ...) OFI_LOG(ctx, NCCLX_LOG_WARN, __VA_ARGS__)
#define OFI_INFO(ctx, ...) OFI_LOG(ctx, NCCLX_LOG_INFO, __VA_ARGS__)
#define OFI_TRACE(ctx, ...) OFI_LOG(ctx, NCCLX_LOG_TRACE, __VA_ARGS__)

#define OFI_MAX_ADDR 88  /* endpoint address bytes carried in a handle */
#define OFI_MAX_EPS 8    /* endpoints per device (`endpoints` in [net.ofi]) */
#define OFI_CTRL_RECVS 8 /* connect receives a device keeps posted (more wait in the provider) */
#define OFI_MAX_MESSAGE ((size_t)1 << 30)
#define OFI_CLOSE_WAIT_NS (200ull * 1000000ull) /* close() waits this long for cancels */
#define OFI_STALE_CONNECT_NS (120ull * 1000000000ull)
#define OFI_MSG_IDLE_EVENTS_NS (50ull * 1000000ull) /* waiting this long: read the events */
#define OFI_MSG_EVENTS_EVERY_NS 20000ull /* progress reads events at most this often */

/* ---- tag layout: bits 60..61 kind. Data kind: bit 59 clear-to-send, bit 58 refusal,
 *      32..57 connection id, 0..31 sequence number. ---- */
enum { OFI_KIND_DATA = 0, OFI_KIND_CONNECT = 1, OFI_KIND_REPLY = 2, OFI_KIND_PROBE = 3 };
#define OFI_TAG_KIND(k) ((uint64_t)(k) << 60)
#define OFI_CONN_ID_MASK 0x03ffffffu
#define OFI_TAG_CTS (1ull << 59)    /* receiver -> sender: "message seq may come, N bytes" */
#define OFI_TAG_REFUSE (1ull << 58) /* sender -> receiver: "message seq does not fit" */
#define OFI_DATA_TAG(connId, seq) \
  (OFI_TAG_KIND(OFI_KIND_DATA) | ((uint64_t)((connId)&OFI_CONN_ID_MASK) << 32) | (uint32_t)(seq))
#define OFI_CTRL_TAG(kind, id) (OFI_TAG_KIND(kind) | (uint32_t)(id))
#define OFI_CTRL_ID_IGNORE 0xffffffffull /* a receive for a control kind's every id */
#define OFI_PROBE_IGNORE ((1ull << 60) - 1)

#define OFI_HANDLE_MAGIC 0x464f584eu  /* "NXOF" */
/* Version 2 (endpoint address lists): version-1 peers fail the magic check. */
#define OFI_CONNECT_MAGIC 0x32434f4eu /* "NOC2" */
#define OFI_REPLY_MAGIC 0x32524f4eu   /* "NOR2" */

/* Who a process is, so a peer on the same host can be checked for being alive. */
typedef struct {
  uint64_t hostHash;  /* boot id and pid namespace: equal means "same host, same pid space" */
  uint64_t startTime; /* process start time in clock ticks (guards against pid reuse) */
  uint32_t pid;
  uint32_t reserved;
} ofiIdentity;

/* What listen() hands out (NCCLX_NET_HANDLE_MAXSIZE bytes). */
typedef struct {
  uint32_t magic;
  uint16_t addrLen;
  uint16_t reserved;
  uint32_t listenId;
  uint32_t pid;
  uint64_t nonce;
  uint64_t hostHash;
  uint64_t startTime;
  uint8_t addr[OFI_MAX_ADDR];
} ofiHandle;
_Static_assert(sizeof(ofiHandle) <= NCCLX_NET_HANDLE_MAXSIZE, "ofi handle too large");

/* Sender -> listener, tag CONNECT|listenId. */
typedef struct {
  uint32_t magic;
  uint16_t addrLen;
  uint16_t neps;      /* the sender's endpoints; their addresses follow, endpoint 0 first */
  uint32_t listenId;
  uint32_t pendingId; /* the reply goes to tag REPLY|pendingId; also the sender's id for
                         clear-to-send messages of this connection */
  uint64_t nonce;
  ofiIdentity who;
  uint8_t addr[OFI_MAX_EPS * OFI_MAX_ADDR];
} ofiConnectMsg;

enum { OFI_REPLY_OK = 0, OFI_REPLY_BAD_NONCE = 1, OFI_REPLY_FAILED = 2, OFI_REPLY_NO_LISTENER = 3 };

/* Listener -> sender, tag REPLY|pendingId. */
typedef struct {
  uint32_t magic;
  uint32_t status;
  uint32_t connId;
  uint32_t pendingId;
  ofiIdentity who;
  uint16_t addrLen;
  uint16_t neps; /* endpoints the connection uses: min of both sides; the listener's follow */
  uint32_t reserved;
  uint8_t addr[OFI_MAX_EPS * OFI_MAX_ADDR];
} ofiReplyMsg;

typedef struct ofiCtx ofiCtx;
typedef struct ofiDevice ofiDevice;
typedef struct ofiObj ofiObj;
typedef struct ofiOp ofiOp;

/* Completion callback: err is 0 or a positive FI_E* code, msg the provider's text. */
typedef void (*ofiOpDone)(ofiOp* op, size_t len, int err, const char* msg);

struct ofiOp {
  struct fi_context2 fctx; /* first: libfabric hands &fctx back as op_context */
  ofiObj* owner;
  ofiOpDone done;
  int posted;            /* libfabric owns it until its completion is read */
  struct ofiMrEntry* mr; /* registration taken for this operation, dropped at completion */
  uint64_t ctag;         /* tag of the completed message (receives) */
  struct fid_ep* ep;     /* the endpoint it was posted on (for fi_cancel) */
};

enum {
  OFI_OBJ_LISTEN = 0x4c4f584eu,
  OFI_OBJ_SEND = 0x534f584eu,
  OFI_OBJ_RECV = 0x524f584eu,
  OFI_OBJ_PENDING = 0x504f584eu,
  OFI_OBJ_CTRL = 0x434f584fu,
  OFI_OBJ_DEVICE = 0x444f584eu,
};

/* Anything that owns operations. `released`: its owner is done with it; it is freed (by
 * destroy) as soon as liveOps reaches 0. All objects of a device are on its list.
 * Completion callbacks run for released objects too (to drop registrations); they must not
 * start new work for them. destroy only frees memory: it never touches other objects. */
struct ofiObj {
  uint32_t kind;
  ofiDevice* dev;
  int liveOps;
  int released;
  void (*destroy)(ofiObj* obj);
  ofiObj *prev, *next;
};

/* Registered memory (FI_MR_LOCAL providers). refs: regMr handles plus operations using it. */
typedef struct ofiMrEntry {
  uintptr_t base;
  size_t len;
  struct fid_mr* mr;
  void* desc;
  int refs;
} ofiMrEntry;

typedef struct {
  uint8_t addr[OFI_MAX_ADDR];
  size_t len;
  fi_addr_t fa;
} ofiPeerAddr;

/* A receive for connect messages to any listener of the device (ofi_conn.c). */
typedef struct {
  ofiOp op;
  ofiConnectMsg msg;
} ofiCtrlRecv;

struct ofiDevice {
  ofiObj self; /* owner of the device-level receives: probes and connect messages */
  ofiCtx* ctx;
  int index;
  int opened; /* 1 open, 0 not yet, -1 opening failed */
  struct fi_info* info;
  struct fid_fabric* fabric;
  struct fid_domain* domain;
  struct fid_av* av;
  struct fid_cq* cq;
  struct fid_ep* eps[OFI_MAX_EPS]; /* endpoint 0 also carries control messages */
  int neps;
  pthread_mutex_t lock;
  uint8_t addrs[OFI_MAX_EPS][OFI_MAX_ADDR];
  size_t addrLen; /* of every endpoint's address (same provider, same format) */
  char name[64];
  char addrStr[128];
  char* pciPath;
  uint64_t guid;
  int speedMbps;
  float latencyUs;
  size_t maxMsg;
  int cqFd;         /* wait fd of the completion queue, or -1 */
  int pollFdWanted; /* someone sleeps on cqFd: arm it (fi_trywait) when idle */
  int clearToSend;  /* receivers announce each receive before data may come (ofi_data.c) */
  int mrLocal;      /* we must pass registered descriptors */
  int mrEndpoint;   /* registrations are bound to the endpoint */
  int mrProvKey;
  int msgMode;          /* connected FI_EP_MSG endpoints per comm instead of shared RDM ones */
  struct fid_eq* eq;    /* msgMode: connection events of every endpoint of the device */
  int cmBusy;           /* msgMode: connects and accepts waiting for an event */
  uint64_t lastEventsNs; /* msgMode: last read of the event queue */
  struct fid_pep** closedPeps; /* msgMode: passive endpoints of closed listeners (see ofi_msg.c) */
  int nclosedPeps, capClosedPeps;
  uint64_t nextMrKey;
  ofiMrEntry** mrs;
  int nmrs, capMrs;
  ofiPeerAddr* peers;
  int npeers, capPeers;
  uint32_t nextListenId, nextConnId, nextPendingId;
  ofiObj* objs;                   /* every live object of this device */
  struct ofiCtrlSend* replyQueue; /* listener replies waiting for the provider (ofi_conn.c) */
  struct ofiReq* deferred;        /* data operations waiting for the provider (ofi_data.c) */
  int inProgress;                 /* ofiProgress is running: callbacks must not re-enter it */
  ofiOp probeRecv;
  int probeRecvNeeded;
  /* RDM: connect messages for every listener, closed and unknown ones included, land here,
   * so that a stale handle is refused instead of waiting unmatched in the provider. */
  ofiCtrlRecv connectRecvs[OFI_CTRL_RECVS];
  int connectRecvsNeeded;
  int connectRecvsWarned; /* a post failed for another reason than FI_EAGAIN: said once */
  char probeBuf[16];
};

struct ofiCtx {
  ncclxLogger_t log;
  char provider[128];
  int ndev;
  ofiDevice* devs;
  ofiIdentity self;
  int livenessMs;  /* 0: never check peers */
  int probeOnly;   /* check peers with probe messages even on this host */
  int mrForce;     /* register even when the provider does not ask for it */
  int clearToSend; /* -1 auto (on for providers known to need it), 0 off, 1 on */
  int pollFd;      /* open completion queues with a wait fd: 1, 0, or -1 = by provider */
  int endpoints;   /* endpoints per device: 1..OFI_MAX_EPS */
  int epType;      /* OFI_EP_AUTO, OFI_EP_RDM or OFI_EP_MSG (`endpoint_type`) */
  size_t rxmEagerLimit; /* FI_OFI_RXM_EAGER_LIMIT to set when unset; 0: leave libfabric's */
  ncclxProfilerCallback_t profiler; /* env->profiler: NET events per request (NULL: none) */
};

enum { OFI_EP_AUTO = 0, OFI_EP_RDM = 1, OFI_EP_MSG = 2 };

/* Data request: one isend or irecv. */
enum { OFI_REQ_FREE = 0, OFI_REQ_POSTED, OFI_REQ_DONE, OFI_REQ_FAILED, OFI_REQ_ABANDONED };
#define OFI_REQ_MAGIC 0x514f584eu

typedef struct ofiComm ofiComm;
typedef struct ofiReq {
  ofiOp op;  /* the message itself, or the refusal that replaces it (first member) */
  ofiOp cop; /* clear-to-send mode: the receive's announcement, sent or received */
  uint32_t magic;
  int state;
  ofiComm* comm;
  void* buf;
  void* mhandle;
  size_t size; /* send: message bytes; receive: capacity */
  size_t got;
  uint32_t seq;
  int deferred; /* waiting on the device's deferred list to post: 0, OFI_POST_MSG or OFI_POST_CTS */
  int refused;  /* send: the receive is too small, a refusal goes instead of the message */
  ncclxResult_t err;
  uint64_t cts; /* clear-to-send payload: the receive's capacity */
  struct ofiReq* nextDeferred;
  void* profEvent; /* NET profiler event from post to completion, or NULL */
} ofiReq;
enum { OFI_POST_MSG = 1, OFI_POST_CTS = 2 };

/* A send or receive connection. */
struct ofiComm {
  ofiObj obj;
  fi_addr_t peer;                 /* the peer's endpoint 0: control, clear-to-send, probes */
  fi_addr_t dataPeer[OFI_MAX_EPS]; /* send comm: message k goes to dataPeer[k % neps] */
  int neps;                        /* endpoints this connection's data spreads over */
  uint64_t posted[OFI_MAX_EPS];    /* messages (or receives) posted per endpoint: TRACE at close */
  uint32_t connId; /* receiver-assigned: tags of messages (unique on the receiver's endpoint) */
  uint32_t ctsId;  /* sender-assigned: tags of clear-to-send messages (unique on the sender's) */
  uint32_t seq;
  struct fid_ep* ep;    /* msgMode: this connection's endpoint (closed with the comm) */
  int connected;        /* msgMode: FI_CONNECTED seen (a receive comm is accepted then) */
  int cmWaiting;        /* msgMode: counted in d->cmBusy until its event arrives */
  int peerClosed;       /* msgMode: FI_E* once the connection ended (FI_SHUTDOWN, an error) */
  uint64_t lastEventCheckNs; /* msgMode: last look at the event queue while waiting */
  int closing;          /* close() is cancelling: FI_ECANCELED is ours, not the peer's */
  struct ofiListenComm* acceptedBy; /* msgMode: listener to hand it to once connected */
  ofiIdentity peerId;
  char peerName[128];
  ncclxResult_t err;
  int inflight;            /* requests posted and not completed */
  uint64_t lastActivityNs; /* last post into an idle comm, or last completion */
  uint64_t lastCheckNs;
  ofiOp probe;
  char probeBuf[8];
  ofiReq reqs[NCCLX_NET_MAX_REQUESTS];
};

typedef struct ofiListenComm ofiListenComm;

struct ofiListenComm {
  ofiObj obj;
  struct fid_pep* pep; /* msgMode: the passive endpoint connection requests arrive at */
  uint32_t listenId;
  uint64_t nonce;
  ofiComm** ready; /* accepted, not yet handed to the caller */
  int nready, capReady;
};

/* Connected mode: what fi_connect and fi_accept/fi_reject carry (connection data). */
#define OFI_MSG_CONNECT_MAGIC 0x314d4f4eu /* "NOM1" */
#define OFI_MSG_REPLY_MAGIC 0x31524d4eu   /* "NMR1" */
typedef struct {
  uint32_t magic;
  uint32_t listenId;
  uint64_t nonce;
  ofiIdentity who;
} ofiMsgConnData;
typedef struct {
  uint32_t magic;
  uint32_t status; /* OFI_REPLY_OK or OFI_REPLY_BAD_NONCE */
  ofiIdentity who;
} ofiMsgReplyData;

/* A connect in progress, found again across connect() calls by its handle. */
typedef struct ofiPending {
  ofiObj obj;
  ofiHandle handle;
  void** owner; /* the caller's *sendComm slot */
  uint64_t startNs, lastTouchNs, lastCheckNs;
  fi_addr_t peer;
  uint32_t pendingId;
  int sendPosted, sendDone, replyDone;
  int failErr; /* FI_E* of a failed step, 0 if none */
  char failMsg[384];
  ofiOp sendOp, replyOp;
  size_t replyLen;
  ofiConnectMsg msg;
  ofiReplyMsg reply;
  struct fid_ep* ep;        /* msgMode: the connecting endpoint, handed to the send comm */
  int cmWaiting;            /* msgMode: counted in d->cmBusy until its event arrives */
  ofiMsgReplyData accepted; /* msgMode: the listener's answer (FI_CONNECTED) */
  char peerName[128];
  struct ofiPending* next;
} ofiPending;

/* ---- ofi_device.c ---- */
uint64_t ofiNowNs(void);
uint64_t ofiRandom64(void);
uint64_t ofiHash(uint64_t h, const void* data, size_t len);
/* Describe a device from its fi_info; nothing is opened yet. */
ncclxResult_t ofiDeviceSetup(ofiCtx* ctx, ofiDevice* d, const struct fi_info* info);
/* Open fabric, domain, queues and endpoint on first use (each costs memory and a listening
 * socket with some providers). Device lock held. */
ncclxResult_t ofiDeviceEnsureOpen(ofiDevice* d);
void ofiDeviceClose(ofiDevice* d);
/* Reads and dispatches completions; returns how many. Device lock held. */
int ofiProgress(ofiDevice* d);
/* After a progress pass that found nothing: arm the wait fd if someone sleeps on it. */
void ofiArmPollFd(ofiDevice* d);
void ofiObjInit(ofiObj* obj, uint32_t kind, ofiDevice* d, void (*destroy)(ofiObj*));
/* The owner is done with obj: free now, or when its last operation completes. */
void ofiObjRelease(ofiObj* obj);
void ofiOpPosted(ofiOp* op, ofiObj* owner, ofiOpDone done);
/* Post a tagged send (peer = destination) or receive (peer = FI_ADDR_UNSPEC, ignore bits) of
 * op on endpoint ep of d. buf is registered for the duration of the operation when the
 * provider needs it and mhandle is NULL. Returns 0, -FI_EAGAIN (try again later) or another
 * -FI_E* code. */
ssize_t ofiPostTagged(ofiDevice* d, int ep, ofiOp* op, ofiObj* owner, ofiOpDone done, int send,
                      void* buf, size_t len, void* mhandle, fi_addr_t peer, uint64_t tag,
                      uint64_t ignore);
/* The same, untagged, on a connected endpoint (msgMode): messages match receives in order. */
ssize_t ofiPostMsg(ofiDevice* d, struct fid_ep* ep, ofiOp* op, ofiObj* owner, ofiOpDone done,
                   int send, void* buf, size_t len, void* mhandle);
/* Ask libfabric to cancel a posted operation (it completes with FI_ECANCELED if it can). */
void ofiCancel(ofiDevice* d, ofiOp* op);
/* Address-vector entry for a peer endpoint address (inserted once per device). */
ncclxResult_t ofiPeerInsert(ofiDevice* d, const void* addr, size_t len, fi_addr_t* fa);
void ofiFormatAddr(ofiDevice* d, const void* addr, size_t len, char* out, size_t size);
/* Error from a failed libfabric call or completion: peer-side failures are RemoteError. */
ncclxResult_t ofiErrClass(int fiErr);

/* ---- ofi_host.c ---- */
void ofiIdentityOfSelf(ofiIdentity* id);
/* 1 alive, 0 gone, -1 cannot tell (another host or pid space). */
int ofiPeerAlive(const ofiIdentity* self, const ofiIdentity* peer);
/* "ip:port" of an IPv4/IPv6 socket address; 0 when addr is not one. */
int ofiFormatSockaddr(const void* addr, size_t len, char* out, size_t size);

/* ---- ofi_conn.c ---- */
ncclxResult_t ofiListen(void* ctx, int dev, void* handle, void** listenComm);
ncclxResult_t ofiConnect(void* ctx, int dev, const void* handle, void** sendComm);
ncclxResult_t ofiAccept(void* listenComm, void** recvComm);
ncclxResult_t ofiCloseListen(void* listenComm);
/* Post listener replies that met FI_EAGAIN. Lock held. */
void ofiRetryReplies(ofiDevice* d);
/* RDM: (re)post the device's connect receives; 0 when none could be posted. Lock held. */
int ofiPostConnectRecvs(ofiDevice* d);
/* Finalize: forget pending connects of ctx's devices (device close frees them). */
void ofiPendingForget(ofiCtx* ctx);
/* A connection the listener made: accept() hands it out. 0, or -1 when out of memory. */
int ofiListenPushReady(ofiListenComm* lc, ofiComm* c);

/* ---- ofi_msg.c (msgMode) ---- */
/* Open the listener's passive endpoint and put its address in h. Lock held. */
ncclxResult_t ofiMsgListen(ofiListenComm* lc, ofiHandle* h);
/* Close the listener's passive endpoint and drop the connections it has not handed out. */
void ofiMsgCloseListen(ofiListenComm* lc);
/* Open p's endpoint and send its connection request to the handle's listener. Lock held. */
ncclxResult_t ofiMsgConnectStart(ofiPending* p);
/* Read the device's connection events (requests, established, shut down, failed). */
void ofiMsgEvents(ofiDevice* d);
/* Close an endpoint of a connection (NULL: nothing). */
void ofiMsgEpClose(ofiDevice* d, struct fid_ep* ep);
/* Device close: the passive endpoints closed listeners left open. */
void ofiMsgClosePeps(ofiDevice* d);

/* ---- ofi_data.c ---- */
/* peers[0..neps-1]: the peer's endpoint addresses in d's address vector, endpoint 0 first. */
ofiComm* ofiCommCreate(ofiDevice* d, uint32_t kind, const fi_addr_t* peers, int neps,
                       uint32_t connId, uint32_t ctsId, const ofiIdentity* peerId,
                       const char* peerName);
ncclxResult_t ofiIsend(void* sendComm, void* data, size_t size, int tag, void* mhandle,
                       void* phandle, void** request);
ncclxResult_t ofiIrecv(void* recvComm, int n, void** data, size_t* sizes, int* tags,
                       void** mhandles, void** phandles, void** request);
ncclxResult_t ofiTest(void* request, int* done, size_t* sizes);
ncclxResult_t ofiCloseSend(void* sendComm);
ncclxResult_t ofiCloseRecv(void* recvComm);
ncclxResult_t ofiGetPollFd(void* comm, int* fd);
/* Post data operations that met FI_EAGAIN. Lock held. */
void ofiRetryDeferred(ofiDevice* d);
/* Cancel what can be cancelled, wait (bounded) for the rest so that no receive writes
 * into the caller's buffers after close returns, then release. Lock held. */
void ofiCommClose(ofiComm* c);

/* ---- ofi_mr.c ---- */
ncclxResult_t ofiRegMr(void* comm, void* data, size_t size, int type, void** mhandle);
ncclxResult_t ofiDeregMr(void* comm, void* mhandle);
/* Descriptor for [data, data+size) given the caller's mhandle (may be NULL). *held is set
 * when an internal registration was taken that ofiMrPut must drop. Lock held. */
ncclxResult_t ofiMrDesc(ofiDevice* d, void* mhandle, void* data, size_t size, void** desc,
                        ofiMrEntry** held);
void ofiMrPut(ofiDevice* d, ofiMrEntry* e);
void ofiMrCloseAll(ofiDevice* d);

#endif /* NCCLX_NET_OFI_INTERNAL_H */
