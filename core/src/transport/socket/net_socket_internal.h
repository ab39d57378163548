/*
 * Private header of the built-in TCP socket network (plugin name "socket"), shared by
 *   net_socket.c         the ops table, devices, properties, registration, poll fds, finalize
 *   net_socket_config.c  [net.socket] keys, interface choice, init
 *   net_socket_conn.c    listen / connect / accept and the hello handshake
 *   net_socket_data.c    comm life cycle, isend / irecv / test over the sockets
 *   net_socket_util.c    small helpers: time, randomness, addresses, socket options, epoll
 *
 * Self-contained on purpose: it uses only libc, the public ncclx headers and env->log, so the
 * same files build into the core (symbol ncclxNetSocket) or, with
 * -DNCCLX_NET_SOCKET_STANDALONE, into libncclx-net-socket.so (symbol ncclxNetPlugin_v1).
 *
 * Wire protocol (little-endian):
 * - A connection is `nsocks` TCP sockets. Each starts with a hello {magic, socket index,
 *   nsocks, nonce, connection id}; the listener keeps a socket only when magic and nonce match
 *   the handle it issued, and groups sockets by connection id until all nsocks arrived.
 * - Message number `seq` has a 16-byte header {size, tag, check} on socket seq % nsocks (the
 *   "lead"), so a stream of small messages spreads over all sockets. Messages above
 *   SOCK_STRIPE_MIN are cut into nsocks page-aligned parts, part j on socket (lead + j) %
 *   nsocks; smaller ones travel whole after the header. Every socket is thus an ordered
 *   stream that both sides can walk independently once the header of a message is known.
 * - The check word (a constant xor seq) catches a stream that got out of step.
 *
 * Data moves with sendmsg/readv straight between user buffers and the kernel; the receiver
 * reads [rest of current segment][64 KiB staging] in one readv, so small messages cost one
 * syscall and large ones are not copied twice.
 */
#ifndef NCCLX_NET_SOCKET_INTERNAL_H
#define NCCLX_NET_SOCKET_INTERNAL_H

#include <arpa/inet.h>
#include <endian.h>
#include <errno.h>
#include <ifaddrs.h>
#include <limits.h>
#include <net/if.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/epoll.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "ncclx/net.h"
#ifndef NCCLX_NET_SOCKET_STANDALONE
#include "transport/socket/net_socket.h"
#endif

#ifdef NCCLX_NET_SOCKET_STANDALONE
#define SOCK_PLUGIN_SYMBOL ncclxNetPlugin_v1
#define SOCK_EXPORT __attribute__((visibility("default")))
#else
#define SOCK_PLUGIN_SYMBOL ncclxNetSocket
#define SOCK_EXPORT
#endif

/* Functions shared between the net_socket*.c files: hidden, so neither libncclx.so nor the
 * standalone plugin exports them. */
#define SOCK_INTERNAL __attribute__((visibility("hidden")))

#define SOCK_MAX_SOCKS 16
#define SOCK_DEFAULT_SOCKS 2
#define SOCK_DEFAULT_BUF_BYTES ((size_t)4 << 20)
#define SOCK_QUEUE NCCLX_NET_MAX_REQUESTS
#define SOCK_STRIPE_MIN ((size_t)256 << 10)
#define SOCK_STRIPE_ALIGN ((size_t)4096)
#define SOCK_STAGE_BYTES ((size_t)64 << 10)
#define SOCK_MAX_IOV 64
#define SOCK_MAX_MESSAGE ((size_t)1 << 30)
#define SOCK_HELLO_TIMEOUT_NS (10ull * 1000000000ull)
#define SOCK_GROUP_TIMEOUT_NS (30ull * 1000000000ull)
#define SOCK_STALE_CONNECT_NS (120ull * 1000000000ull)
#define SOCK_MAX_UNIDENTIFIED 256
#define SOCK_ADDR_STR 64

#define SOCK_HANDLE_MAGIC 0x4b53584eu /* "NXSK" */
#define SOCK_HELLO_MAGIC 0x4853584eu  /* "NXSH" */
#define SOCK_HDR_CHECK 0x6d73676eu
#define SOCK_KIND_LISTEN 0x4c4b534eu
#define SOCK_KIND_SEND 0x534b534eu
#define SOCK_KIND_RECV 0x524b534eu
#define SOCK_REQ_MAGIC 0x514b534eu

#define SOCK_LOG(ctx, level, ...) (ctx)->log((level), NCCLX_LOG_NET, __FILE__, __LINE__, __VA_ARGS__)
#define SOCK_WARN(ctx, ...) SOCK_LOG(ctx, NCCLX_LOG_WARN, "NET/Socket: " __VA_ARGS__)
#define SOCK_INFO(ctx, ...) SOCK_LOG(ctx, NCCLX_LOG_INFO, "NET/Socket: " __VA_ARGS__)

/* ------------------------------------------------------------------------------------------
 * Types
 * ------------------------------------------------------------------------------------------ */

typedef union {
  struct sockaddr sa;
  struct sockaddr_in in4;
  struct sockaddr_in6 in6;
} sockAddr;

/* What listen() hands out and connect() consumes (same byte layout on both hosts). */
typedef struct {
  uint32_t magic;
  uint16_t nsocks;
  uint16_t reserved;
  uint64_t nonce;
  sockAddr addr;
} sockHandle;
_Static_assert(sizeof(sockHandle) <= NCCLX_NET_HANDLE_MAXSIZE, "socket handle too large");

typedef struct {
  uint32_t magic;
  uint16_t index;
  uint16_t nsocks;
  uint64_t nonce;
  uint64_t connId;
} sockHello;
_Static_assert(sizeof(sockHello) == 24, "hello must have no padding");

typedef struct {
  uint64_t size;
  uint32_t tag;
  uint32_t check;
} sockWireHdr;
_Static_assert(sizeof(sockWireHdr) == 16, "header must have no padding");
#define SOCK_HDR_BYTES sizeof(sockWireHdr)

typedef struct sockPendingConnect sockPendingConnect;

typedef struct {
  ncclxLogger_t log;
  char ifname[IF_NAMESIZE + 1];
  char* pciPath;
  sockAddr addr; /* interface address, port 0 */
  int nsocks;
  size_t bufBytes; /* 0: leave socket buffers to kernel autotuning */
  int speedMbps;
  float latencyUs;
  uint64_t guid;
  pthread_mutex_t lock; /* guards `pending` */
  sockPendingConnect* pending;
} sockCtx;

/* First member of every comm, so a void* comm can be checked and traced back to its ctx. */
typedef struct {
  uint32_t kind;
  sockCtx* ctx;
} sockCommHead;

enum { SOCK_REQ_FREE = 0, SOCK_REQ_POSTED, SOCK_REQ_COMPLETE };

struct sockComm;
typedef struct {
  uint32_t magic;
  int state;
  struct sockComm* comm;
  uint64_t seq;
  char* data;
  size_t size;    /* send: message bytes; receive: capacity */
  size_t msgSize; /* bytes of the message (receive: valid once hdrKnown) */
  int hdrKnown;
  int socksLeft;  /* sockets whose part of this message is not done yet */
  int tag;        /* receive: the tag posted; a signed one is checked (net.h) */
  int* tagOut;    /* receive: where a differing signed tag is reported */
  sockWireHdr hdr;
} sockReq;

/* A send or receive connection. Per socket, cur/off are the message (seq) it is working on
 * and the bytes of that message's part already moved. */
typedef struct sockComm {
  sockCommHead head;
  int nsocks;
  int fds[SOCK_MAX_SOCKS];
  uint64_t cur[SOCK_MAX_SOCKS];
  size_t off[SOCK_MAX_SOCKS];
  char* stage[SOCK_MAX_SOCKS];
  size_t stageBeg[SOCK_MAX_SOCKS], stageEnd[SOCK_MAX_SOCKS];
  int epfd;
  unsigned epMask; /* send: sockets currently registered for EPOLLOUT */
  uint64_t first, next; /* oldest unreleased and next message numbers */
  ncclxResult_t err;
  char peer[SOCK_ADDR_STR];
  sockReq reqs[SOCK_QUEUE];
} sockComm;

/* A socket accepted by the listener that has not proven itself yet. */
typedef struct {
  int fd;
  uint64_t t0;
  size_t got;
  sockHello hello;
  char peer[SOCK_ADDR_STR];
} sockIncoming;

/* Sockets of one connection id that passed the hello check. */
typedef struct {
  uint64_t connId;
  uint64_t t0;
  int count;
  int fds[SOCK_MAX_SOCKS];
  char peer[SOCK_ADDR_STR];
} sockGroup;

typedef struct {
  sockCommHead head;
  int fd;
  int epfd;
  int nsocks;
  uint64_t nonce;
  char addr[SOCK_ADDR_STR];
  sockIncoming* inc;
  int ninc, capInc;
  sockGroup* groups;
  int ngroups, capGroups;
} sockListenComm;

struct sockPendingConnect {
  sockPendingConnect* next;
  sockHandle handle;
  void** owner; /* the caller's *sendComm slot: identifies this connect across calls */
  uint64_t lastTouch;
  uint64_t connId;
  int nsocks;
  int fds[SOCK_MAX_SOCKS];
  int step[SOCK_MAX_SOCKS]; /* 0 connecting, 1 writing hello, 2 done */
  size_t helloOff[SOCK_MAX_SOCKS];
  sockHello hello[SOCK_MAX_SOCKS];
  char peer[SOCK_ADDR_STR];
};

/* net_socket_util.c */
SOCK_INTERNAL uint64_t sockNowNs(void);
SOCK_INTERNAL uint64_t sockRandom64(void);
SOCK_INTERNAL socklen_t sockAddrLen(const sockAddr* a);
SOCK_INTERNAL void sockAddrFormat(const sockAddr* a, char* buf, size_t len);
SOCK_INTERNAL int sockErrnoIsRemote(int e);
SOCK_INTERNAL void sockSetNoDelay(int fd);
SOCK_INTERNAL void sockSetBuffers(const sockCtx* ctx, int fd);
SOCK_INTERNAL int sockCommKind(const void* comm);
SOCK_INTERNAL void sockPollAdd(int epfd, int fd);
SOCK_INTERNAL void sockPollDel(int epfd, int fd);

/* net_socket_config.c */
SOCK_INTERNAL ncclxResult_t sockInit(void** ctxOut, const ncclxPluginEnv_t* env);

/* net_socket_conn.c */
SOCK_INTERNAL ncclxResult_t sockListen(void* vctx, int dev, void* handle, void** listenComm);
SOCK_INTERNAL ncclxResult_t sockConnect(void* vctx, int dev, const void* handle, void** sendComm);
SOCK_INTERNAL ncclxResult_t sockAccept(void* listenComm, void** recvComm);
SOCK_INTERNAL ncclxResult_t sockCloseListen(void* listenComm);
SOCK_INTERNAL ncclxResult_t sockListenPollFd(sockListenComm* lc, int* fd);
SOCK_INTERNAL void sockPendingFree(sockPendingConnect* p);

/* net_socket_data.c */
SOCK_INTERNAL sockComm* sockCommCreate(sockCtx* ctx, uint32_t kind, int nsocks, const int* fds,
                                       const char* peer);
SOCK_INTERNAL ncclxResult_t sockIsend(void* sendComm, void* data, size_t size, int tag,
                                      void* mhandle, void* phandle, void** request);
SOCK_INTERNAL ncclxResult_t sockIrecv(void* recvComm, int n, void** data, size_t* sizes,
                                      int* tags, void** mhandles, void** phandles, void** request);
SOCK_INTERNAL ncclxResult_t sockTest(void* request, int* done, size_t* sizes);
SOCK_INTERNAL ncclxResult_t sockCloseSend(void* sendComm);
SOCK_INTERNAL ncclxResult_t sockCloseRecv(void* recvComm);
SOCK_INTERNAL ncclxResult_t sockCommPollFd(sockComm* c, int* fd);

#endif /* NCCLX_NET_SOCKET_INTERNAL_H */
