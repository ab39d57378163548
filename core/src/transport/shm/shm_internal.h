/* Internals of the shared-memory transport (net_shm.c and shm_*.c): shared-memory layouts,
 * comm and request structures, and the helpers the files share. Nothing here is used by the
 * rest of the core; see net_shm.h for the public side and the protocol description.
 *
 * Self-contained like a plugin: only libc, the public ncclx headers and env->log. */
#ifndef NCCLX_SHM_INTERNAL_H
#define NCCLX_SHM_INTERNAL_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "util/copy_nt.h"
#include "transport/shm/shm_mem.h"
#include "ncclx/net.h"

#define SHM_LINE 64
#define SHM_PAGE 4096
#define SHM_VERSION 2 /* 2: peer-mapped messages (SHM_MSG_MAPPED) */
#define SHM_NAME_MAX 40 /* "/ncclx-<pid>-<16 hex>" and NUL */
#define SHM_PATH_MAX 64 /* doorbell FIFO paths */
#define SHM_MAILBOXES 64
#define SHM_QUEUE 64 /* requests per comm; >= NCCLX_NET_MAX_REQUESTS */
#define SHM_TINY_BYTES 32
#define SHM_PROBE_BYTES 16
#define SHM_DIR "/dev/shm"
#define SHM_PREFIX "ncclx-"

/* Defaults and limits of the [net.shm] keys. */
#define SHM_DEFAULT_BUFFER_BYTES ((size_t)1 << 20)
/* 16 slots of 64 KiB: against 64 of 16 KiB, 1.1-2.8x busbw at 16-64 KiB and up to 1.8x for
 * 4-rank allgather at 256 KiB-4 MiB (ncclx-perf A/B, medians of 5): fewer fragment flags, and
 * small messages cycle through 16 regions of the ring instead of 64 (fewer lines and pages). */
#define SHM_DEFAULT_SLOTS 16
#define SHM_DEFAULT_CMA_CHUNK ((size_t)1 << 20)
#define SHM_MIN_SLOT_PAYLOAD ((size_t)1024)
#define SHM_MAX_MESSAGE ((size_t)1 << 30)
#define SHM_MAX_MAPPED ((uint64_t)1 << 40) /* largest peer-mapped allocation */
/* With a CPU per rank, messages from this size that lie in an ncclxMemAlloc allocation go
 * mapped even when a slot could hold them: one copy by the receiver instead of two, and
 * the lines stay in one cache until the receiver pulls them. 2 ranks, alternating runs,
 * medians (us, slots / mapped): all-gather 64 KiB 4.38 / 1.72, broadcast 64 KiB 5.00 /
 * 1.83, reduce-scatter 16 KiB 1.87 / 0.71, all-to-all 32 KiB 3.32 / 1.08; 4 KiB messages
 * gained too (broadcast 8 KiB in 2 pieces: 0.98 / 0.50). */
#define SHM_MAPPED_MIN_BYTES ((size_t)4096)
/* Where ranks share CPUs, the sends of an exchange (ncclxShmSendKind) go mapped from this
 * size: 4 ranks on 2 CPUs, linear all-to-all, alternating runs, medians (us, slots / mapped):
 * 32 KiB (8 KiB blocks) 8.14 / 6.16, 256 KiB 50.5 / 16.1; 8 ranks, 128 KiB 72 / 30, 512 KiB
 * 316 / 184. From 4 KiB it was slower (4 ranks, 16 KiB: 6.07 / 7.95). */
#define SHM_EXCHANGE_MAPPED_MIN ((size_t)8192)
/* ... and those in ordinary memory go by process_vm_readv from this size, where the receiver's
 * mode allows it: a system call per message costs more below. 4 ranks on 2 CPUs, ordinary
 * buffers, linear all-to-all, alternating runs (us, slots / CMA / Open MPI): 128 KiB (32 KiB
 * blocks) 23.0 / 19.4; 512 KiB 123 / 74 / 74; 64 KiB (16 KiB blocks) 12.4 / 14.6. */
#define SHM_EXCHANGE_CMA_MIN ((size_t)32768)
/* With a CPU per rank and process_vm_readv fast here (the core asked for single copy: every
 * rank has a CPU and CMA ran at half memcpy's speed or more on every host), a
 * collective's messages from ordinary memory go by process_vm_readv from this size, as the
 * ones in ncclxMemAlloc memory go mapped: one copy instead of two. 2 ranks, ordinary buffers,
 * alternating runs (us, slots / CMA from 8 KiB / Open MPI): all-to-all 32 KiB 2.66 / 2.00 /
 * 3.10, 128 KiB 8.35 / 4.76 / 5.38; all-gather 64 KiB 4.66 / 3.16 / 3.86; broadcast 64 KiB 4.74
 * / 3.18 / 3.75; reduce-scatter 128 KiB 9.33 / 5.23; all-reduce 64 KiB 8.87 / 5.28. From 16
 * or 32 KiB instead, 16-32 KiB calls gained less or nothing. */
#define SHM_COLL_CMA_MIN ((size_t)8192)

/* Progress heuristics. */
#define SHM_ARM_IDLE 128                      /* idle test() calls before arming the doorbell */
#define SHM_ARM_NS (50ull * 1000ull)          /* ... and idle time */
#define SHM_PEER_CHECK_NS (5ull * 1000000ull) /* liveness check period while idle */
#define SHM_CMA_BUDGET ((size_t)4 << 20)      /* bytes one test() copies before returning */

#define SHM_HANDLE_MAGIC 0x4d48534eu /* "NSHM" */
#define SHM_LISTEN_MAGIC 0x4e5453494c4d4853ull
#define SHM_CONN_MAGIC 0x4e4e4f434d4d4853ull
#define SHM_KIND_LISTEN 0x4c4d4853u
#define SHM_KIND_SEND 0x534d4853u
#define SHM_KIND_RECV 0x524d4853u
#define SHM_REQ_MAGIC 0x514d4853u

enum { SHM_PREF_AUTO = 0, SHM_PREF_CMA = 1, SHM_PREF_NONE = 2 };
enum { SHM_MODE_UNKNOWN = 0, SHM_MODE_CMA = 1, SHM_MODE_COPY = 2 };
enum { SHM_BOX_FREE = 0, SHM_BOX_CLAIMED = 1, SHM_BOX_POSTED = 2 };
enum {
  SHM_RECV_PENDING = 0,
  SHM_RECV_ATTACHED = 1,
  SHM_RECV_REFUSED = 2,
  SHM_RECV_CLOSED = 3,
  SHM_RECV_FAILED = 4
};
enum { SHM_MSG_INLINE = 1, SHM_MSG_CMA = 2, SHM_MSG_FRAG_FIRST = 3, SHM_MSG_FRAG_NEXT = 4, SHM_MSG_MAPPED = 5 };
#define SHM_MSG_LAST SHM_MSG_MAPPED
enum { SHM_STATUS_OK = 0, SHM_STATUS_TOO_BIG = 1, SHM_STATUS_FAILED = 2 };

/* What listen() hands out (at most NCCLX_NET_HANDLE_MAXSIZE bytes). */
typedef struct {
  uint32_t magic;
  uint32_t version;
  int32_t pid; /* the listener */
  uint32_t reserved;
  uint64_t nonce;
  char name[SHM_NAME_MAX]; /* the listen segment */
} shmHandle;
_Static_assert(sizeof(shmHandle) <= NCCLX_NET_HANDLE_MAXSIZE, "shm handle too large");

/* ---- Listen segment: a header and mailboxes where senders drop their segment's name. ---- */
typedef struct {
  _Atomic uint32_t state; /* SHM_BOX_* */
  int32_t pid;            /* the sender */
  uint64_t nonce;         /* the listen nonce, as the sender's handle has it */
  char name[SHM_NAME_MAX];
  char pad[8];
} shmMailbox;
_Static_assert(sizeof(shmMailbox) == SHM_LINE, "mailbox is one cache line");

typedef struct {
  uint64_t magic;
  uint32_t version;
  int32_t pid;
  uint64_t nonce;
  _Atomic uint32_t closed;
  uint32_t nbox;
  _Alignas(SHM_LINE) shmMailbox box[SHM_MAILBOXES];
} shmListenSeg;

/* ---- Connection segment, created by the sender: header, slot headers, payloads. ---- */

/* Line A of a slot: written by the sender. */
typedef struct {
  _Atomic uint64_t full; /* seq + 1 once use number `seq` of this slot is published */
  uint64_t size;         /* the whole message's size, in every slot of it */
  uint64_t addr;         /* SHM_MSG_CMA, SHM_MSG_MAPPED: where the message is in the sender */
  int32_t tag;
  uint32_t kind;                /* SHM_MSG_* */
  uint8_t tiny[SHM_TINY_BYTES]; /* inline messages this small skip the payload area; an
                                   SHM_MSG_MAPPED message's shmMemRef */
} shmSlotSend;
_Static_assert(sizeof(shmSlotSend) == SHM_LINE, "slot line A is one cache line");

/* Line B of a slot: written by the receiver. */
typedef struct {
  _Atomic uint64_t done;   /* seq + 1 once consumed; for SHM_MSG_CMA the sender's ack */
  _Atomic uint32_t status; /* SHM_STATUS_*, valid with done */
  char pad[SHM_LINE - 12];
} shmSlotRecv;
_Static_assert(sizeof(shmSlotRecv) == SHM_LINE, "slot line B is one cache line");

typedef struct {
  shmSlotSend s;
  shmSlotRecv r;
} shmSlot;

typedef struct {
  /* Written by the sender before it posts the mailbox; read-only afterwards. */
  uint64_t magic;
  uint32_t version;
  uint32_t nslots;
  uint64_t payloadBytes; /* per slot */
  uint64_t nonce;        /* the listen nonce: a segment of another job never matches */
  int32_t senderPid;
  int32_t senderPref; /* SHM_PREF_* from the sender's single_copy */
  uint64_t probeAddr; /* SHM_PROBE_BYTES in the sender equal to probe[]: the CMA test */
  uint8_t probe[SHM_PROBE_BYTES];
  int32_t mapProbeFd;  /* the sender's probe allocation (shmMemProbe): the mapping test; */
  uint32_t reserved;   /* -1 when the sender has none */
  uint64_t mapProbeId;
  char bellRecv[SHM_PATH_MAX]; /* FIFO the sender rings to wake the receiver */
  char bellSend[SHM_PATH_MAX]; /* FIFO the receiver rings to wake the sender */
  /* Written by the receiver. */
  _Alignas(SHM_LINE) _Atomic uint32_t recvState; /* SHM_RECV_* */
  uint32_t mode;                                 /* SHM_MODE_*, valid once ATTACHED */
  int32_t recvPid;
  uint32_t mapOk; /* the receiver maps the sender's ncclxMemAlloc buffers; valid once ATTACHED */
  /* Written by the sender. */
  _Alignas(SHM_LINE) _Atomic uint32_t sendClosed;
  /* Sleeping flags: set by the side going to sleep, cleared by the side that rings it. */
  _Alignas(SHM_LINE) _Atomic uint32_t recvSleeping;
  _Alignas(SHM_LINE) _Atomic uint32_t sendSleeping;
} shmConnHdr;
_Static_assert(sizeof(shmConnHdr) <= SHM_PAGE, "connection header fits a page");

/* Byte offsets inside a connection segment. */
static inline size_t shmSlotsOffset(void) { return SHM_PAGE; }
static inline size_t shmPayloadOffset(uint32_t nslots) {
  size_t end = SHM_PAGE + (size_t)nslots * sizeof(shmSlot);
  return (end + SHM_PAGE - 1) & ~(size_t)(SHM_PAGE - 1);
}
static inline size_t shmConnBytes(uint32_t nslots, size_t payloadBytes) {
  return shmPayloadOffset(nslots) + (size_t)nslots * payloadBytes;
}

/* ---- Process-local objects. ---- */
typedef struct {
  ncclxLogger_t log;
  size_t bufferBytes; /* payload area per connection */
  uint32_t nslots;
  int pref;              /* SHM_PREF_* */
  int nontemporal;       /* NCCLX_NT_* (copy_nt.h) */
  size_t cmaChunk;       /* bytes per process_vm_readv call */
  int cmaLocalErr;       /* errno of the self-test at init, 0 when CMA works in this process */
  atomic_int loggedMode; /* last mode announced at INFO, to log each change once */
  atomic_int loggedPrefer; /* 1 + the last ncclxShmPreferCopy choice announced, likewise */
} shmCtx;

enum { SHM_REQ_FREE = 0, SHM_REQ_POSTED, SHM_REQ_WAIT_ACK, SHM_REQ_DONE };

typedef struct shmComm shmComm;

_Static_assert(sizeof(shmMemRef) <= SHM_TINY_BYTES, "a mapped message's reference fits the slot line");


typedef struct {
  uint32_t magic;
  int state; /* SHM_REQ_* */
  shmComm* comm;
  char* data;
  size_t size;     /* send: message size; recv: buffer size */
  size_t off;      /* bytes published (send) or received (recv) so far */
  size_t got;      /* recv: the message's real size, once its first slot is seen */
  uint64_t ackSeq; /* send, SHM_MSG_CMA: the slot use whose `done` acks it */
  int started;     /* recv: SHM_MSG_* of the message's first slot once seen */
  int mapFailed;   /* recv, SHM_MSG_MAPPED: mapping failed, process_vm_readv reads the rest */
  int sendKind;    /* send: NCCLX_SHM_SEND_* the core said for it (mappedMinOf) */
  int tag;
  int* tagOut;     /* recv: where a differing signed tag is reported (net.h) */
} shmReq;

struct shmComm {
  uint32_t kind; /* SHM_KIND_*: first, so a void* can be checked */
  shmCtx* ctx;
  shmConnHdr* hdr;
  size_t mapBytes;
  shmSlot* slots;
  char* payload;
  size_t payloadBytes;
  uint32_t nslots;
  uint64_t mask;
  int mode;
  int mapOk;               /* SHM_MSG_MAPPED possible on this connection (both sides agree) */
  uint64_t mappedMessages; /* sent or received as SHM_MSG_MAPPED (test hook) */
  _Atomic uint32_t* mySleeping;
  _Atomic uint32_t* peerSleeping;
  int bellWait; /* FIFO we sleep on */
  int bellRing; /* FIFO that wakes the peer */
  int pidfd;    /* the peer's, or -1 */
  int epfd;     /* bellWait + pidfd, for getPollFd; -1 until asked */
  pid_t peerPid;
  uint64_t seq;                 /* send: next slot use to publish; recv: next to consume */
  uint64_t freeLimit;           /* send: slot uses below this are known free */
  uint64_t first, next, cursor; /* request ring: oldest live, next to post, next to progress */
  ncclxResult_t err;
  unsigned idle;
  uint64_t idleStartNs;
  int armed;
  uint64_t lastCheckNs;
  /* Receiver only. */
  shmMapCache maps; /* the sender's allocations */
  int mapFallback; /* a mapping failed and CMA read the message instead (logged once) */
  /* Sender only. */
  int attached;
  int preferCopy; /* single_copy = auto and the core asked for double copy (ncclxShmPreferCopy) */
  int coreSingleCopy; /* the core asked for single copy, whatever single_copy says (SHM_COLL_CMA_MIN) */
  int sharedCpus;   /* the host's ranks share CPUs (ncclxShmSharedCpus) */
  int nextSendKind; /* NCCLX_SHM_SEND_* of the next message posted (ncclxShmSendKind) */
  struct {
    uint64_t ids[SHM_MAP_CACHE], used[SHM_MAP_CACHE], clock; /* used 0: empty */
  } mirror; /* allocations the receiver probably has mapped (shm_data.c, mirrorTouch) */
  ncclxSharedCopy slotCopy; /* plain or non-temporal copies into the slots (copyToSlot) */
  shmListenSeg* listen; /* kept until the receiver attaches, to notice a closed listener */
  char name[SHM_NAME_MAX];
  uint8_t probe[SHM_PROBE_BYTES]; /* what the receiver's CMA test reads */
  shmReq reqs[SHM_QUEUE];
};

typedef struct {
  uint32_t kind;
  shmCtx* ctx;
  shmListenSeg* seg;
  uint64_t nonce;
  unsigned nextBox;
  char name[SHM_NAME_MAX];
} shmListenComm;

#define SHM_LOG(ctx, level, ...) \
  (ctx)->log((level), NCCLX_LOG_SHM | NCCLX_LOG_NET, __FILE__, __LINE__, __VA_ARGS__)
#define SHM_WARN(ctx, ...) SHM_LOG(ctx, NCCLX_LOG_WARN, "NET/SHM: " __VA_ARGS__)
#define SHM_INFO(ctx, ...) SHM_LOG(ctx, NCCLX_LOG_INFO, "NET/SHM: " __VA_ARGS__)
#define SHM_TRACE(ctx, ...) SHM_LOG(ctx, NCCLX_LOG_TRACE, "NET/SHM: " __VA_ARGS__)

/* ---- shm_os.c: operating-system helpers. ---- */
uint64_t shmNowNs(void);
uint64_t shmRandom64(void);
/* A fresh segment name "/ncclx-<pid>-<hex>" and its path under /dev/shm. */
void shmNewName(char name[SHM_NAME_MAX]);
/* Create (O_EXCL) and map a zero-filled segment; returns 0 or an errno. */
int shmSegCreate(const char* name, size_t bytes, void** ptr);
/* Map an existing segment of at least minBytes; *bytes gets its real size. 0 or an errno. */
int shmSegOpen(const char* name, size_t minBytes, void** ptr, size_t* bytes);
/* Doorbells: FIFOs opened O_RDWR|O_NONBLOCK, so neither side ever blocks on them. */
int shmBellCreate(const char* path, int* fd);
int shmBellOpen(const char* path, int* fd);
void shmBellRing(int fd);
void shmBellDrain(int fd);
/* A pidfd for pid, or -1 when the kernel has none. */
int shmPidOpen(pid_t pid);
/* 1 while pid runs (a zombie counts as gone), 0 once it has exited. */
int shmPeerAlive(pid_t pid, int pidfd);
/* Remove /dev/shm/ncclx-<pid>-* objects whose creator pid no longer exists. */
int shmCleanStale(shmCtx* ctx);
/* process_vm_readv of len bytes: bytes copied (may be short), or -errno. */
ssize_t shmCmaRead(pid_t pid, void* local, uint64_t remote, size_t len);


/* ---- shm_conn.c: connection setup and teardown. ---- */
ncclxResult_t shmListen(void* ctx, int dev, void* handle, void** listenComm);
ncclxResult_t shmConnect(void* ctx, int dev, const void* handle, void** sendComm);
ncclxResult_t shmAccept(void* listenComm, void** recvComm);
ncclxResult_t shmCloseSend(void* sendComm);
ncclxResult_t shmCloseRecv(void* recvComm);
ncclxResult_t shmCloseListen(void* listenComm);
/* Sender: notices the receiver attaching (or refusing); returns the comm's error state. */
ncclxResult_t shmCheckAttached(shmComm* c);
/* "pid N": who the peer is, for messages. */
const char* shmPeerName(const shmComm* c, char* buf, size_t len);

/* ---- shm_data.c: data path. ---- */
ncclxResult_t shmIsend(void* sendComm, void* data, size_t size, int tag, void* mhandle, void* phandle,
                       void** request);
ncclxResult_t shmIrecv(void* recvComm, int n, void** data, size_t* sizes, int* tags, void** mhandles,
                       void** phandles, void** request);
ncclxResult_t shmTest(void* request, int* done, size_t* sizes);
ncclxResult_t shmGetPollFd(void* comm, int* fd);
/* Marks c failed with err (sticky), tells the peer, and logs why at WARN. */
ncclxResult_t shmFail(shmComm* c, ncclxResult_t err, const char* fmt, ...)
    __attribute__((format(printf, 3, 4)));

#endif
