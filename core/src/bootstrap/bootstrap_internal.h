/* Bootstrap internals shared by the bootstrap_*.c files: wire formats, state, and helpers.
 *
 * Files, one job each:
 *   bootstrap_sock.c  time, addresses, sockets (listen, connect, send/recv with deadlines)
 *   bootstrap_id.c    unique ids, job secrets, host identity
 *   bootstrap_root.c  bootstrapInit: the rendezvous at the root, then the address all-gather
 *   bootstrap_hello.c the root's handling of each hello (checks, refusals, flood protection)
 *   bootstrap_reply.c the root's replies (Bruck partners or the whole table), and reading them
 *   bootstrap_rdv.h   what those three share
 *   bootstrap_msg.c   per-process state, incoming traffic, point-to-point send/recv
 *   bootstrap_coll.c  all-gather, barrier, abort notices
 *   bootstrap_note.c  wait notes: the latest one each rank sent us
 *   bootstrap_view.c  views (split communicators), release, stats
 *
 * Locking: root->lock guards connections, queues and counters. It is only held for
 * non-blocking work; waiters sleep in poll() on a snapshot of the descriptors with the lock
 * released, so bootstrapPollAbort never waits behind a long operation. */
#ifndef NCCLX_BOOTSTRAP_INTERNAL_H
#define NCCLX_BOOTSTRAP_INTERNAL_H

#include <netinet/in.h>
#include <pthread.h>
#include <stdint.h>
#include <sys/socket.h>

#include "bootstrap/bootstrap.h"

#define ID_MAGIC 0x4e584944u    /* "NXID": a unique id made by this file */
#define HELLO_MAGIC 0x4e58484cu /* rendezvous: rank -> root */
#define ROOT_HELLO_MAGIC 0x4e585248u /* multi-root rendezvous: root -> root, its bootstrap address */
#define TABLE_MAGIC 0x4e585443u /* rendezvous: root -> rank (v2: partner list, not the whole table) */
#define MSG_MAGIC 0x4e584d53u   /* point-to-point message header */

#define MSG_KIND_DATA 1u
#define MSG_KIND_ABORT 2u
#define MSG_KIND_NOTE 3u /* a wait note (bootstrap_note.c): unordered, the latest per source kept */

#define ROOT_TAG_SPACE 0ull    /* the view returned by bootstrapInit */
#define POLL_SLICE_MS 10       /* longest sleep between checks of deadline and abort flag */
#define JOIN_GRACE_SEC 2.0     /* a rank waits this long past its timeout for the root's verdict */
#define ABORT_BUDGET_SEC 1.0   /* total time bootstrapBroadcastAbort may take */
#define ABORT_BATCH 256        /* simultaneous connects while broadcasting an abort */
#define MAX_ABORT_TEXT 4096
#define MAX_NOTE_BYTES BOOTSTRAP_NOTE_MAX
#define OUT_CACHE_MAX 128      /* cached outgoing connections before the oldest is closed */
#define MAX_PENDING_HELLOS 512 /* unidentified connections the root keeps during init */
#define HELLO_WAIT_SEC 1.0     /* ... each for this long: a rank says hello as it connects */
#define HELLO_WAIT_TEXT "1 s"
#define LISTEN_BACKLOG 1024
#define TAG_ADDR_GATHER 0xfffff001u /* root view: the address all-gather right after the rendezvous */
#define TAG_ROOT_EXCHANGE 0xfffff002u /* multi-root: the roots' all-gather of their groups */
#define ROOTS_TAG_SPACE 0xfffffffffffff00dull /* the view over the roots during a multi-root rendezvous */

/* ---------------- wire formats ---------------- */

/* An IPv4 or IPv6 socket address in a fixed 24-byte form. */
struct wireAddr {
  uint16_t family;  /* AF_INET or AF_INET6 */
  uint16_t port;    /* network byte order */
  uint32_t scopeId; /* IPv6 link-local scope */
  uint8_t ip[16];   /* first 4 bytes for IPv4 */
};

/* idLayout.flags: an id made from "host:port" with no job identity (bootstrap_id.c): any
 * process reaching the address computes its secret, so the root admits with care. */
#define ID_FLAG_ANONYMOUS 1u
#define ANON_GRACE_SEC 0.3 /* anonymous ids: the root waits this long for duplicates */
#define CONFLICT_LINGER_SEC 1.0 /* a failed rendezvous still answers arriving ranks this long */

struct idLayout {
  uint32_t magic;
  uint32_t flags; /* ID_FLAG_* */
  uint64_t secret;
  struct wireAddr root;
};
_Static_assert(sizeof(struct idLayout) <= NCCLX_UNIQUE_ID_BYTES, "id layout must fit ncclxUniqueId");

struct helloMsg { /* rank -> root at init; magic first so garbage is refused after 4 bytes */
  uint32_t magic;
  int32_t rank;
  uint64_t secret;
  int32_t nranks;
  uint32_t reserved;
  struct wireAddr listenAddr;
};

struct tableHeader { /* root -> rank; followed by count partnerEntry, or textLen bytes of error */
  uint32_t magic;
  int32_t status; /* ncclxResult_t */
  uint64_t secret;
  int32_t nranks;
  uint32_t textLen;
  uint32_t count;
  uint32_t reserved;
};

/* The address of one rank the receiver will send to during the address all-gather. */
struct partnerEntry {
  int32_t rank;
  uint32_t reserved;
  struct wireAddr addr;
};

struct msgHeader {
  uint32_t magic;
  uint32_t kind;
  uint64_t secret;
  uint64_t tagSpace;
  uint64_t seq; /* per (src, dst) from 1; 0 = unordered (abort notices) */
  uint64_t size;
  int32_t src; /* rank in the root numbering */
  uint32_t tag;
};

/* ---------------- state ---------------- */

struct message {
  struct message* next;
  int src;
  uint32_t kind, tag;
  uint64_t tagSpace, seq;
  size_t size;
  char data[];
};

struct inConn { /* an accepted connection, read incrementally */
  int fd;
  char name[64];
  struct msgHeader hdr;
  size_t hdrGot;
  struct message* msg;
  size_t dataGot;
};

struct outConn {
  int fd;
  int busy; /* a sender owns it: messages to one peer are written one at a time */
  uint64_t lastUse;
};

struct noteEntry { /* bootstrap_note.c */
  struct noteEntry* next;
  uint64_t tagSpace;
  int src; /* root numbering */
  size_t size;
  double arrived; /* bsNow() */
  char data[MAX_NOTE_BYTES];
};

struct abortNote {
  struct abortNote* next;
  uint64_t tagSpace;
  char text[];
};

struct bootstrapRoot {
  int rank, nranks;
  uint64_t secret;
  double timeoutSec; /* <= 0: no timeout */
  int listenFd;
  struct wireAddr* addrs; /* every rank's listener; family 0 until learned */

  pthread_mutex_t lock;
  int refs;
  struct bootstrap* views; /* live views, for tag space uniqueness */

  struct inConn* in;
  int nIn, capIn;
  struct message *queueHead, *queueTail; /* delivered, not yet received */
  struct message* holdback;              /* arrived ahead of an earlier message of the same src */
  uint64_t* recvSeq;                     /* next expected seq per src */

  struct outConn* out;
  uint64_t* sendSeq; /* last seq used per dst */
  int nOutOpen;
  uint64_t useClock;

  pthread_mutex_t abortLock; /* guards aborts only; never held while doing anything else */
  struct abortNote* aborts;
  struct noteEntry* notes; /* under abortLock: the latest wait note per (tag space, source) */

  struct bootstrapStats stats; /* under lock (rendezvous fields: written before it is shared) */
  /* Rendezvous at an anonymous id: why two jobs seem to share the address ("" if not). */
  char conflict[320];
  /* Rendezvous: what the root saw of ranks that did not join (refused hellos, departures),
   * for the error that names the missing ranks. */
  char rdvNotes[512];
  int rdvDroppedSilent; /* connections dropped for saying no hello */
  int rdvConflictTold;  /* ranks told of the conflict that failed the rendezvous */
};

struct bootstrap {
  struct bootstrapRoot* root;
  int rank, nranks;
  uint64_t tagSpace;
  int* rootRanks; /* view rank -> root rank */
  struct bootstrap* nextView;
};

/* ---------------- helpers (bootstrap_sock.c) ---------------- */

double bsNow(void);
double bsDeadlineAfter(double timeoutSec);
int bsSliceUntil(double deadline, int sliceMs); /* ms to sleep: <= sliceMs, never past the deadline */
void bsSleepSec(double s);
void bsWireToSockaddr(const struct wireAddr* w, struct sockaddr_storage* ss, socklen_t* len);
int bsSockaddrToWire(const struct sockaddr* sa, struct wireAddr* w);
const char* bsAddrString(const struct wireAddr* w, char* buf, size_t size); /* "1.2.3.4:5", "[::1]:5" */
const char* bsPeerString(int fd, char* buf, size_t size);
int bsIsLoopback(const struct wireAddr* w);
/* Non-blocking listener on bindAddr (port 0: any). Returns fd or -1 (errno set). */
int bsOpenListener(const struct wireAddr* bindAddr, int reuseAddr, struct wireAddr* actual);
/* Connect before the deadline; retry: keep trying while the peer is not listening yet.
 * Returns fd, or -1 with *err set. */
int bsConnectWithin(const struct wireAddr* to, double deadline, int retry, int* attempts, int* err);
int bsSendAll(int fd, const void* data, size_t size, double deadline); /* 0 or errno */
int bsRecvAll(int fd, void* data, size_t size, double deadline);       /* 0, errno, or -1 on EOF */
void bsPickLocalAddress(struct wireAddr* w);
int bsLocalAddressToward(const struct wireAddr* to, struct wireAddr* local);

/* ---------------- ids (bootstrap_id.c) ---------------- */

int bsLoadId(const ncclxUniqueId* id, struct idLayout* l);
/* The listener bootstrapGetUniqueId keeps open for this id, or -1. */
int bsTakeKeptListener(const struct idLayout* id);

/* ---------------- state and messages (bootstrap_msg.c) ---------------- */

struct bootstrapRoot* bsRootCreate(int rank, int nranks, uint64_t secret, double timeoutSec);
void bsRootFree(struct bootstrapRoot* r);
/* With r->lock held: accept new connections and read everything available, no blocking. */
void bsProgressLocked(struct bootstrapRoot* r);
/* With r->lock held (released while sleeping): wait up to sliceMs for traffic or extraFd. */
void bsSleepLocked(struct bootstrapRoot* r, int extraFd, short extraEvents, int sliceMs);
int bsFindAbort(struct bootstrapRoot* r, uint64_t tagSpace, char* msg, size_t size);
struct message* bsTakeMatch(struct bootstrapRoot* r, int src, uint32_t tag, uint64_t tagSpace);
void bsPurgeTagSpace(struct bootstrapRoot* r, uint64_t tagSpace);
/* bootstrap_note.c: keep a wait note (takes m); drop them all, or those of a tag space. */
void bsRecordNote(struct bootstrapRoot* r, struct message* m);
void bsFreeNotes(struct bootstrapRoot* r, const uint64_t* tagSpace);
const char* bsDescribePeer(const struct bootstrap* b, int peer, char* buf, size_t size);

/* ---------------- views (bootstrap_view.c) ---------------- */

struct bootstrap* bsViewAlloc(struct bootstrapRoot* r, int rank, int nranks, uint64_t tagSpace);
void bsViewFree(struct bootstrap* b); /* a view never registered with its root */
#endif
