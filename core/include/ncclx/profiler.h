/*
 * ncclx profiler plugin ABI, version 1.
 *
 * A profiler receives the core's events and turns them into traces, metrics and fault
 * reports. Export
 *
 *     const ncclxProfiler_v1_t ncclxProfilerPlugin_v1 = { .name = "trace",
 *                                                         .abiVersion = NCCLX_PROFILER_ABI_VERSION, ... };
 *
 * as libncclx-profiler-NAME.so and set `[profiler] plugin = NAME`.
 *
 * Events nest: GROUP > COLL | P2P > STEP > NET. The core emits an event only when its bit is
 * in the activation mask, and always emits the parents of an emitted event. The plugin sets
 * the mask in init and may change it at any time (the core reads it atomically at each
 * event site, so switching tracing on in a running job is one store).
 *
 * startEvent may set *eHandle = NULL to drop the event; the core then sends no stop or state
 * for it. Errors from anything but init are ignored. With no plugin loaded each event site
 * costs one predictable branch.
 */
#ifndef NCCLX_PROFILER_H
#define NCCLX_PROFILER_H

#include "plugin.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Version 1 is frozen (docs/plugin-guide.md, "ABI stability"): changes come as a new version. */
#define NCCLX_PROFILER_ABI_VERSION 1

/* Event type bits (activation mask). */
#define NCCLX_PROFILE_GROUP 0x1
#define NCCLX_PROFILE_COLL 0x2
#define NCCLX_PROFILE_P2P 0x4
#define NCCLX_PROFILE_STEP 0x8 /* one transfer to or from one peer inside an op */
#define NCCLX_PROFILE_NET 0x10 /* events a net plugin reports through env->profiler */
#define NCCLX_PROFILE_ALL 0x1f

typedef enum {
  NCCLX_PROFILE_STATE_POSTED = 1,   /* STEP: request handed to the transport */
  NCCLX_PROFILE_STATE_PROGRESS = 2, /* STEP/NET: bytes moved so far (args->bytes) */
  NCCLX_PROFILE_STATE_WAITING = 3,  /* COLL/P2P: blocked on a peer (args->peer) */
  NCCLX_PROFILE_STATE_FAILED = 4    /* any: the op failed (args->result, args->message) */
} ncclxProfilerState_t;

typedef struct {
  uint64_t commHash;
  const char* commName; /* may be NULL */
  int rank, nranks;
  int nhosts;
  const char* hostname;
  int pid;
} ncclxProfilerCommInfo_v1_t;

typedef struct {
  int type;        /* one NCCLX_PROFILE_* bit */
  void* parent;    /* eHandle of the parent event, NULL at the top */
  int rank;
  union {
    struct {
      int depth;   /* 1 for an implicit group around a single call */
    } group;
    struct {
      uint64_t seq;         /* per-communicator collective sequence number, from 1 */
      const char* func;     /* "AllReduce", ... */
      const void* sendbuff;
      void* recvbuff;
      size_t count;
      size_t bytes;         /* the nccl-tests "size" of this call */
      int root;             /* -1 when none */
      const char* datatype; /* "float32", ... */
      const char* op;       /* "sum", ... or NULL */
      const char* algo;
      const char* proto;
      void* stream;         /* NULL for calls run on the caller's thread */
    } coll;
    struct {
      uint64_t seq;     /* per-communicator p2p sequence number, from 1 */
      const char* func; /* "Send" or "Recv" */
      void* buff;
      size_t count;
      size_t bytes;
      const char* datatype;
      int peer;
    } p2p;
    struct {
      int peer;
      int isSend;
      size_t bytes;
      int step;              /* index within the op */
      const char* transport; /* "socket", "shm", "ofi", ... */
    } step;
    struct {
      int64_t pluginId; /* chosen by the net plugin */
      void* data;       /* plugin-defined payload */
    } net;
  };
} ncclxProfilerEventDescr_v1_t;

typedef struct {
  size_t bytes;           /* PROGRESS */
  int peer;               /* WAITING */
  ncclxResult_t result;   /* FAILED */
  const char* message;    /* FAILED */
  void* netData;          /* NET updates */
} ncclxProfilerStateArgs_v1_t;

typedef struct {
  const char* name;
  int abiVersion; /* NCCLX_PROFILER_ABI_VERSION */
  /* Per communicator. *activationMask is shared by all communicators of the process. An error
   * disables the plugin for this communicator; the job runs on. */
  ncclxResult_t (*init)(void** ctx, const ncclxProfilerCommInfo_v1_t* info, int* activationMask,
                        const ncclxPluginEnv_t* env);
  ncclxResult_t (*startEvent)(void* ctx, void** eHandle, const ncclxProfilerEventDescr_v1_t* descr);
  ncclxResult_t (*stopEvent)(void* eHandle);
  ncclxResult_t (*recordEventState)(void* eHandle, ncclxProfilerState_t state,
                                    const ncclxProfilerStateArgs_v1_t* args);
  ncclxResult_t (*finalize)(void* ctx);
  /* Optional: write this communicator's state as the plugin knows it (in-flight operations,
   * per-peer progress) to `path`; called by ncclxCommDump. */
  ncclxResult_t (*dump)(void* ctx, const char* path);
} ncclxProfiler_v1_t;

typedef ncclxProfiler_v1_t ncclxProfiler_t;
#define NCCLX_PROFILER_PLUGIN_SYMBOL "ncclxProfilerPlugin_v1"

/* Net plugin callback types (env->profiler's `type` argument). The calling convention is at
 * ncclxProfilerCallback_t in plugin.h: parentHandle may be NULL, STOP takes &eHandle and sets
 * it to NULL, and a NULL eHandle from START makes UPDATE and STOP no-ops. */
#define NCCLX_PROFILER_NET_START 0
#define NCCLX_PROFILER_NET_STOP 1
#define NCCLX_PROFILER_NET_UPDATE 2

#ifdef __cplusplus
}
#endif
#endif /* NCCLX_PROFILER_H */
