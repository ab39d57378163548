/*
 * ncclx network plugin ABI, version 1.
 *
 * A network plugin moves bytes between processes, usually on different hosts. Export:
 *
 *     const ncclxNet_v1_t ncclxNetPlugin_v1 = { .name = "mynet",
 *                                               .abiVersion = NCCLX_NET_ABI_VERSION, ... };
 *
 * and build it as libncclx-net-mynet.so; `[net] plugin = mynet` in ncclx.ini loads it.
 * docs/plugin-guide.md walks through a complete plugin; tools/ncclx-net-check tests one.
 *
 * Model
 * - Connections are one-way. The receiver calls listen() and gets an opaque handle of at most
 *   NCCLX_NET_HANDLE_MAXSIZE bytes, which the core ships to the sender out of band. The sender
 *   calls connect(handle) -> sendComm, the receiver accept(listenComm) -> recvComm.
 * - Nothing may block. connect() and accept() return ncclxSuccess with *comm still NULL when
 *   not done yet; the core calls them again. isend()/irecv() may return *request == NULL
 *   ("cannot start now"); the core retries. test() reports progress and drives it.
 * - Order: messages on one connection match receives in the order both were posted. The tag
 *   of a send selects which buffer of a grouped receive (n > 1) it fills; it never reorders.
 * - Signed tags: the core sends every message with a tag that has NCCLX_NET_TAG_SIGNED set and
 *   a signature of the running call below it (which collective, and its size per rank), and
 *   posts each receive with the signature it expects. Ranks that disagree on the call, its
 *   count or its datatype exchange messages that may still be equal in size (whole pipeline
 *   chunks): only the signature tells. A transport that carries the tag compares a signed
 *   receive tag with the tag that arrived; when they differ it writes the arrived tag into
 *   tags[i] (the core keeps that int valid until the request completes) and fails the
 *   receive with ncclxInvalidUsage, and the core fails every rank naming both calls. Tags
 *   without the bit are never compared. The built-in shm and socket networks check; a
 *   plugin that does not leaves the check to message sizes, which catch a mismatch only
 *   where a message's size differs.
 * - A receive may be larger than the matching send (test() reports the real size); a send
 *   larger than its receive is an error (ncclxRemoteError on at least the receiver).
 * - Each comm must accept NCCLX_NET_MAX_REQUESTS requests in flight. Once test() reports
 *   done (or an error), the core never passes that request again: the plugin frees it.
 * - Buffers belong to the caller and must stay untouched until test() reports done.
 * - Threads: calls on one comm come from one thread at a time; different comms (and init,
 *   listen, connect, accept of other comms) may be used concurrently from other threads.
 * - Errors: ncclxSystemError for local network or OS failures, ncclxRemoteError when the peer
 *   is gone or sent something invalid, ncclxInvalidUsage for bad configuration,
 *   ncclxInternalError when the core broke these rules. Log the details through env->log.
 * - Optional operations are NULL. Required: everything not marked optional.
 */
#ifndef NCCLX_NET_H
#define NCCLX_NET_H

#include "plugin.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Signed tags (see "Signed tags" above): the bit; the core's signature is below it. */
#define NCCLX_NET_TAG_SIGNED (1 << 30)

/* Version 1 is frozen (docs/plugin-guide.md, "ABI stability"): changes come as a new version. */
#define NCCLX_NET_ABI_VERSION 1
#define NCCLX_NET_HANDLE_MAXSIZE 128
#define NCCLX_NET_MAX_REQUESTS 32

/* Pointer types: ptrSupport bits and the `type` argument of regMr. */
#define NCCLX_PTR_HOST 0x1
#define NCCLX_PTR_CUDA 0x2
#define NCCLX_PTR_DMABUF 0x4

typedef struct {
  const char* name;      /* device name for logs, e.g. "mlx5_0" or "eth0" */
  const char* pciPath;   /* sysfs path of the PCI device, or NULL for a virtual device */
  uint64_t guid;         /* devices sharing a guid are one port */
  int ptrSupport;        /* NCCLX_PTR_* bits this device can send from and receive into */
  int regIsGlobal;       /* 1: registrations are cached across comms, repeat regMr is cheap */
  int speedMbps;         /* port speed, e.g. 100000 for 100 Gb/s */
  int port;              /* port number, with guid */
  float latencyUs;       /* one-way latency estimate; 0 = unknown */
  int maxComms;          /* comms this device can hold at once */
  int maxRecvs;          /* largest n for grouped irecv (>= 1) */
  size_t maxMessageBytes;/* largest single isend/irecv; the core splits bigger transfers */
  int forceFlush;        /* 1: the core calls iflush after every receive into device memory */
} ncclxNetProperties_v1_t;

typedef struct {
  const char* name; /* "socket", "ofi", "ib", ...: what [net] plugin matches */
  int abiVersion;   /* NCCLX_NET_ABI_VERSION at compile time */

  /* Once per process (the core reference-counts). Return ncclxInvalidUsage when the
   * configuration is wrong, ncclxSystemError when the hardware or library is missing. */
  ncclxResult_t (*init)(void** ctx, const ncclxPluginEnv_t* env);
  ncclxResult_t (*devices)(void* ctx, int* ndev);
  /* dev is 0..ndev-1 here and in listen and connect; any other index: return
   * ncclxInvalidArgument, with a log line naming it and ndev (the core never passes one). */
  ncclxResult_t (*getProperties)(void* ctx, int dev, ncclxNetProperties_v1_t* props);

  /* Receiver side. handle points to NCCLX_NET_HANDLE_MAXSIZE bytes to fill. */
  ncclxResult_t (*listen)(void* ctx, int dev, void* handle, void** listenComm);
  /* Sender side: non-blocking, call again while *sendComm is NULL. The core passes the
   * same sendComm slot (same address, still NULL) and the same handle on every retry of one
   * connect, so a plugin may key its pending state by the slot. The core gives up on a
   * connect only by failing the communicator, and no call says so: it just stops calling.
   * Its memory may later hold the slot of another connect, so a pending entry found under a
   * slot with a different handle is an abandoned one (drop it and start anew), and what is
   * still pending at finalize is freed there. */
  ncclxResult_t (*connect)(void* ctx, int dev, const void* handle, void** sendComm);
  /* Non-blocking, call again while *recvComm is NULL. One listenComm accepts many senders;
   * a sender whose handle does not match (a stranger, an old job) is refused and logged. */
  ncclxResult_t (*accept)(void* listenComm, void** recvComm);

  /* Registration; comm is a sendComm or a recvComm. type is one NCCLX_PTR_* value. */
  ncclxResult_t (*regMr)(void* comm, void* data, size_t size, int type, void** mhandle);
  ncclxResult_t (*deregMr)(void* comm, void* mhandle);

  /* mhandle may be NULL for host memory when the plugin does not need registration.
   * phandle is the core's profiler handle for this transfer: pass it to env->profiler as
   * parentHandle (it may be NULL; see ncclxProfilerCallback_t in plugin.h for START/STOP). */
  ncclxResult_t (*isend)(void* sendComm, void* data, size_t size, int tag, void* mhandle,
                         void* phandle, void** request);
  ncclxResult_t (*irecv)(void* recvComm, int n, void** data, size_t* sizes, int* tags,
                         void** mhandles, void** phandles, void** request);
  /* Optional: make received device memory visible to the GPU. */
  ncclxResult_t (*iflush)(void* recvComm, int n, void** data, size_t* sizes, void** mhandles,
                          void** request);
  /* *done = 1 when complete; then sizes[i] (if sizes != NULL) holds the bytes received, or
   * for a send the bytes sent (its size: the core does not read it). */
  ncclxResult_t (*test)(void* request, int* done, size_t* sizes);

  ncclxResult_t (*closeSend)(void* sendComm);
  ncclxResult_t (*closeRecv)(void* recvComm);
  ncclxResult_t (*closeListen)(void* listenComm);
  /* Last call, once the reference count drops to zero. */
  ncclxResult_t (*finalize)(void* ctx);

  /* Optional: a file descriptor that becomes readable when comm may have progress to
   * report, so the core can sleep in poll() instead of spinning on oversubscribed hosts.
   * The core polls every fd for POLLIN only, send comms' too: a send comm's fd must become
   * readable when a send may complete (the peer acknowledged, say), never merely writable.
   * *fd = -1 means "none for this comm" (the core then waits on it with short sleeps). */
  ncclxResult_t (*getPollFd)(void* comm, int* fd);
} ncclxNet_v1_t;

typedef ncclxNet_v1_t ncclxNet_t;
typedef ncclxNetProperties_v1_t ncclxNetProperties_t;
#define NCCLX_NET_PLUGIN_SYMBOL "ncclxNetPlugin_v1"

#ifdef __cplusplus
}
#endif
#endif /* NCCLX_NET_H */
