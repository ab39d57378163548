/*
 * ncclx: collective communication for large-scale training and inference.
 *
 * The API has NCCL's shape with an `ncclx` prefix, so porting NCCL code is a rename.
 * Every call returns an ncclxResult_t; ncclxGetLastError() gives the human message.
 */
#ifndef NCCLX_H
#define NCCLX_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define NCCLX_MAJOR 0
#define NCCLX_MINOR 1
#define NCCLX_PATCH 0
#define NCCLX_VERSION_CODE (NCCLX_MAJOR * 10000 + NCCLX_MINOR * 100 + NCCLX_PATCH)

/* Same values as NCCL's ncclResult_t. */
typedef enum {
  ncclxSuccess = 0,
  ncclxUnhandledCudaError = 1,
  ncclxSystemError = 2,
  ncclxInternalError = 3,
  ncclxInvalidArgument = 4,
  ncclxInvalidUsage = 5,
  ncclxRemoteError = 6,
  ncclxInProgress = 7,
  ncclxNumResults = 8
} ncclxResult_t;

typedef enum {
  ncclxInt8 = 0,
  ncclxUint8 = 1,
  ncclxInt32 = 2,
  ncclxUint32 = 3,
  ncclxInt64 = 4,
  ncclxUint64 = 5,
  ncclxFloat16 = 6,
  ncclxFloat32 = 7,
  ncclxFloat64 = 8,
  ncclxBfloat16 = 9,
  ncclxNumTypes = 10
} ncclxDataType_t;

typedef enum {
  ncclxSum = 0,
  ncclxProd = 1,
  ncclxMax = 2,
  ncclxMin = 3,
  ncclxAvg = 4,
  ncclxNumOps = 5
} ncclxRedOp_t;

#define NCCLX_UNIQUE_ID_BYTES 128
/* Plain old data: broadcast it with MPI or any launcher. */
typedef struct {
  char internal[NCCLX_UNIQUE_ID_BYTES];
} ncclxUniqueId;

typedef struct ncclxComm* ncclxComm_t;
typedef struct ncclxStream* ncclxStream_t;
typedef struct ncclxEvent* ncclxEvent_t;

/* Passing color NCCLX_SPLIT_NOCOLOR to ncclxCommSplit opts the rank out (newcomm = NULL). */
#define NCCLX_SPLIT_NOCOLOR (-1)

#define NCCLX_CONFIG_UNDEF_INT (-2147483647 - 1)
typedef struct {
  size_t size;          /* sizeof(ncclxConfig_t); set by NCCLX_CONFIG_INITIALIZER */
  unsigned int magic;   /* NCCLX_CONFIG_MAGIC */
  unsigned int version; /* NCCLX_VERSION_CODE */
  int blocking;         /* reserved: init is always blocking today */
  int timeoutSec;       /* overrides [core] timeout_s; UNDEF keeps the INI value */
  int lazyConnect;      /* overrides [core] lazy_connect (0/1); UNDEF keeps the INI value */
  const char* commName; /* shown in logs and profiler events; may be NULL */
} ncclxConfig_t;

#define NCCLX_CONFIG_MAGIC 0x6e63786cu
#define NCCLX_CONFIG_INITIALIZER                                                   \
  {                                                                                \
    sizeof(ncclxConfig_t), NCCLX_CONFIG_MAGIC, NCCLX_VERSION_CODE,                 \
        NCCLX_CONFIG_UNDEF_INT, NCCLX_CONFIG_UNDEF_INT, NCCLX_CONFIG_UNDEF_INT, NULL \
  }

/* ---- Library and errors ---- */
ncclxResult_t ncclxGetVersion(int* version);
const char* ncclxGetErrorString(ncclxResult_t result);
/* Message of the last failure on comm, or of the calling thread when comm is NULL
 * (e.g. after a failed init). Never NULL; "" when there was none. */
const char* ncclxGetLastError(ncclxComm_t comm);

/* ---- Communicators ---- */
/* Honours NCCLX_COMM_ID=host:port: then the id names that address and rank 0 listens there. */
ncclxResult_t ncclxGetUniqueId(ncclxUniqueId* uniqueId);
ncclxResult_t ncclxCommInitRank(ncclxComm_t* comm, int nranks, ncclxUniqueId commId, int rank);
ncclxResult_t ncclxCommInitRankConfig(ncclxComm_t* comm, int nranks, ncclxUniqueId commId,
                                      int rank, ncclxConfig_t* config);
/* Multi-root init for large jobs (docs/init.md): nIds unique ids, 1 <= nIds <= nranks, the same
 * list in the same order on every rank. The ranks form nIds contiguous groups; rank r joins at
 * ids[floor(r * nIds / nranks)], and the first rank of group g, ceil(g * nranks / nIds), is its
 * root: it must create ids[g] with ncclxGetUniqueId (or run on the host:port it names). No rank
 * then handles more than O(nranks / nIds + log nranks) bootstrap messages; nIds = 1 is
 * ncclxCommInitRankConfig. config may be NULL. */
ncclxResult_t ncclxCommInitRankScalable(ncclxComm_t* comm, int nranks, int rank, int nIds,
                                        const ncclxUniqueId* ids, ncclxConfig_t* config);
/* Rank and size from Open MPI, PMI, Slurm or torchrun variables; rendezvous at NCCLX_COMM_ID. */
ncclxResult_t ncclxCommInitFromEnv(ncclxComm_t* comm);
ncclxResult_t ncclxCommSplit(ncclxComm_t comm, int color, int key, ncclxComm_t* newcomm,
                             ncclxConfig_t* config);
/* Split fast path (NCCLX's splitGroupRanks): only the members call it, all with the same
 * list ranks[0..nranks-1] of parent ranks (the caller included, no duplicates); member i
 * becomes rank i of newcomm. No exchange with the parent's other ranks. */
ncclxResult_t ncclxCommSplitGroup(ncclxComm_t comm, const int* ranks, int nranks, ncclxComm_t* newcomm,
                                  ncclxConfig_t* config);
ncclxResult_t ncclxCommFinalize(ncclxComm_t comm);
ncclxResult_t ncclxCommDestroy(ncclxComm_t comm);
/* Write the communicator's state (current operation, sequence numbers, per-peer progress;
 * the profiler plugin's view as well when one is loaded) to `path` for offline analysis
 * (tools/ncclx-analyze). Safe from any thread, also while an operation is stuck. */
ncclxResult_t ncclxCommDump(ncclxComm_t comm, const char* path);
/* Safe from any thread while operations are in flight: they fail, nothing hangs. */
ncclxResult_t ncclxCommAbort(ncclxComm_t comm);
ncclxResult_t ncclxCommGetAsyncError(ncclxComm_t comm, ncclxResult_t* asyncError);
ncclxResult_t ncclxCommCount(const ncclxComm_t comm, int* count);
ncclxResult_t ncclxCommUserRank(const ncclxComm_t comm, int* rank);

/* ---- Collectives ---- (stream NULL: runs on the calling thread and returns when done) */
ncclxResult_t ncclxAllReduce(const void* sendbuff, void* recvbuff, size_t count,
                             ncclxDataType_t datatype, ncclxRedOp_t op, ncclxComm_t comm,
                             ncclxStream_t stream);
ncclxResult_t ncclxBroadcast(const void* sendbuff, void* recvbuff, size_t count,
                             ncclxDataType_t datatype, int root, ncclxComm_t comm,
                             ncclxStream_t stream);
ncclxResult_t ncclxReduce(const void* sendbuff, void* recvbuff, size_t count,
                          ncclxDataType_t datatype, ncclxRedOp_t op, int root, ncclxComm_t comm,
                          ncclxStream_t stream);
ncclxResult_t ncclxAllGather(const void* sendbuff, void* recvbuff, size_t sendcount,
                             ncclxDataType_t datatype, ncclxComm_t comm, ncclxStream_t stream);
ncclxResult_t ncclxReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount,
                                 ncclxDataType_t datatype, ncclxRedOp_t op, ncclxComm_t comm,
                                 ncclxStream_t stream);
/* count elements go to each peer: sendbuff and recvbuff hold nranks*count elements. */
ncclxResult_t ncclxAllToAll(const void* sendbuff, void* recvbuff, size_t count,
                            ncclxDataType_t datatype, ncclxComm_t comm, ncclxStream_t stream);
/* Counts and displacements are in elements, nranks entries each; read when the call is made. */
ncclxResult_t ncclxAllToAllv(const void* sendbuff, const size_t sendcounts[],
                             const size_t sdispls[], void* recvbuff, const size_t recvcounts[],
                             const size_t rdispls[], ncclxDataType_t datatype, ncclxComm_t comm,
                             ncclxStream_t stream);
ncclxResult_t ncclxSend(const void* sendbuff, size_t count, ncclxDataType_t datatype, int peer,
                        ncclxComm_t comm, ncclxStream_t stream);
ncclxResult_t ncclxRecv(void* recvbuff, size_t count, ncclxDataType_t datatype, int peer,
                        ncclxComm_t comm, ncclxStream_t stream);
ncclxResult_t ncclxBarrier(ncclxComm_t comm, ncclxStream_t stream);

/* Operations between Start and End are issued together at End (send/recv pairs cannot
 * deadlock on each other). Groups nest; only the outermost End issues. */
ncclxResult_t ncclxGroupStart(void);
ncclxResult_t ncclxGroupEnd(void);

/* ---- Streams and events: in-order asynchronous execution on the CPU ---- */
ncclxResult_t ncclxStreamCreate(ncclxStream_t* stream);
ncclxResult_t ncclxStreamDestroy(ncclxStream_t stream);
/* Returns the first error of any operation queued since the last synchronize. */
ncclxResult_t ncclxStreamSynchronize(ncclxStream_t stream);
/* ncclxSuccess when everything queued is done, ncclxInProgress otherwise. */
ncclxResult_t ncclxStreamQuery(ncclxStream_t stream);
typedef void (*ncclxHostFn_t)(void* userData);
ncclxResult_t ncclxLaunchHostFunc(ncclxStream_t stream, ncclxHostFn_t fn, void* userData);
ncclxResult_t ncclxEventCreate(ncclxEvent_t* event);
ncclxResult_t ncclxEventRecord(ncclxEvent_t event, ncclxStream_t stream);
ncclxResult_t ncclxEventSynchronize(ncclxEvent_t event);
ncclxResult_t ncclxEventDestroy(ncclxEvent_t event);
ncclxResult_t ncclxStreamWaitEvent(ncclxStream_t stream, ncclxEvent_t event);

/* ---- Memory ---- */
/* Page-aligned memory the transports can use without extra copies. */
ncclxResult_t ncclxMemAlloc(void** ptr, size_t size);
ncclxResult_t ncclxMemFree(void* ptr);
ncclxResult_t ncclxCommRegister(const ncclxComm_t comm, void* buff, size_t size, void** handle);
ncclxResult_t ncclxCommDeregister(const ncclxComm_t comm, void* handle);

/* ---- Helpers ---- */
/* Bytes per element of a datatype, 0 for an invalid one. */
size_t ncclxTypeSize(ncclxDataType_t datatype);
const char* ncclxTypeName(ncclxDataType_t datatype);
const char* ncclxOpName(ncclxRedOp_t op);

#ifdef __cplusplus
}
#endif

#include "ncclx/moe.h" /* AllToAllvDynamic and MoE dispatch/combine */
#endif /* NCCLX_H */
