/* ncclxAllToAllvDynamic[Compact] on device memory (the GPU path, docs/gpu.md), through the
 * core's device operations (ncclx/module.h): this file has no CUDA of its own.
 *
 * alltoallv_dynamic_api.c validates a call, then asks dynDeviceSubmit whether the call is
 * the GPU path's: some buffer or count array is device memory, or the stream is ordered with
 * a CUDA stream. Device memory that cannot be used (a build without CUDA, a machine whose
 * CUDA runtime does not start) is refused here, at the call, naming the argument.
 *
 * The call is queued with CUDA ordering (enqueueDevice): it executes after the CUDA work
 * issued before it on the bound CUDA stream, so counts a kernel wrote into device memory are
 * read then, by the ncclx stream, and the caller never synchronizes. Executing:
 *   1. device send counts are copied to pinned host memory (the exchange's headers need
 *      them on the CPU: the transports move host memory);
 *   2. the send data, sum(counts) elements, is copied to pinned memory;
 *   3. the host exchange runs on the pinned copies (the same engine, called with stream
 *      NULL on this thread), receiving into a pinned image of recvbuff and pinned counts;
 *   4. the received blocks go back: for fixed slots (maxRecvCount) the core's block copy
 *      (devCopyBlocks) reads the pinned image and the pinned counts directly and copies only
 *      each slot's filled part; compact blocks are contiguous, one copy. Device count arrays
 *      get their values by one copy each.
 * Copies run on the internal copy stream of the buffers' device and are waited for with the
 * communicator's timeout and abort flag. A CUDA failure fails the communicator with
 * ncclxUnhandledCudaError and the CUDA error string, so the peers abort instead of waiting
 * for this rank. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alltoallv_dynamic.h"
#include "moe_module.h"

enum { ARG_SENDBUFF, ARG_SENDCOUNTS, ARG_RECVBUFF, ARG_RECVCOUNTS, ARG_RDISPLS, NUM_ARGS };
static const char* const argNames[NUM_ARGS] = {"sendbuff", "sendcounts", "recvbuff", "recvcounts", "rdispls"};

typedef struct {
  ncclxComm_t comm;
  int nranks;
  const char* fn;
  const void* sendbuff;
  const size_t* sendcounts;
  void* recvbuff;
  size_t maxRecv;
  size_t* recvcounts;
  size_t* rdispls;
  ncclxDataType_t datatype;
  int compact;
  int onDevice[NUM_ARGS];
  int device; /* of the first device argument, -1 when none */
} devTask;

static ncclxResult_t hostExchange(devTask* t, const void* send, const size_t* counts, void* recv,
                                  size_t* recvcounts, size_t* rdispls) {
  return t->compact ? moeAllToAllvDynamicCompact(send, counts, recv, t->maxRecv, recvcounts, rdispls, t->datatype,
                                                 t->comm, NULL)
                    : moeAllToAllvDynamic(send, counts, recv, t->maxRecv, recvcounts, t->datatype, t->comm, NULL);
}

/* Steps 1-4 of the header comment, with the device current. */
static ncclxResult_t stagedExchange(devTask* t, ncclxModuleDev_t* dev) {
  int n = t->nranks;
  size_t elem = moeCore->typeSize(t->datatype);
  /* Pinned counts: send, receive, displacements. */
  size_t* sendCounts;
  NCCLX_CHECK(moeCore->devPinned(dev, 3 * (size_t)n * sizeof(size_t), (void**)&sendCounts));
  size_t* recvCounts = sendCounts + n;
  size_t* displs = recvCounts + n;
  if (t->onDevice[ARG_SENDCOUNTS]) {
    NCCLX_CHECK(moeCore->devCopy(dev, sendCounts, t->sendcounts, (size_t)n * sizeof(size_t),
                                 "cudaMemcpyAsync sendcounts to host"));
    NCCLX_CHECK(moeCore->devWait(dev));
  } else {
    memcpy(sendCounts, t->sendcounts, (size_t)n * sizeof(size_t));
  }
  size_t sum = 0, limit = (SIZE_MAX / 4) / elem;
  for (int p = 0; p < n; p++) {
    if (sendCounts[p] > limit - sum)
      return moeCore->fail(t->comm, ncclxInvalidArgument,
                           "%s: sendcounts[%d] = %zu: the send counts add up to more than fits in memory", t->fn, p,
                           sendCounts[p]);
    sum += sendCounts[p];
  }
  size_t sendBytes = t->onDevice[ARG_SENDBUFF] ? sum * elem : 0;
  size_t recvBytes = t->onDevice[ARG_RECVBUFF] ? t->maxRecv * (t->compact ? 1 : (size_t)n) * elem : 0;
  char* sendHost;
  NCCLX_CHECK(moeCore->devPinned(dev, sendBytes + recvBytes + 256, (void**)&sendHost));
  char* recvHost = sendHost + (sendBytes + 255) / 256 * 256;
  NCCLX_CHECK(moeCore->devCopy(dev, sendHost, t->sendbuff, sendBytes, "cudaMemcpyAsync sendbuff to host"));
  NCCLX_CHECK(moeCore->devWait(dev));

  NCCLX_CHECK(hostExchange(t, t->onDevice[ARG_SENDBUFF] ? sendHost : t->sendbuff, sendCounts,
                           t->onDevice[ARG_RECVBUFF] ? recvHost : t->recvbuff, recvCounts, displs));

  if (t->onDevice[ARG_RECVBUFF] && t->compact) {
    size_t total = 0;
    for (int p = 0; p < n; p++) total += recvCounts[p];
    NCCLX_CHECK(moeCore->devCopy(dev, t->recvbuff, recvHost, total * elem, "cudaMemcpyAsync recvbuff to device"));
  } else if (t->onDevice[ARG_RECVBUFF]) {
    NCCLX_CHECK(moeCore->devCopyBlocks(dev, t->recvbuff, recvHost, recvCounts, n, t->maxRecv, elem,
                                       "block-copy kernel into recvbuff"));
  }
  size_t countBytes = (size_t)n * sizeof(size_t);
  if (t->onDevice[ARG_RECVCOUNTS])
    NCCLX_CHECK(moeCore->devCopy(dev, t->recvcounts, recvCounts, countBytes, "cudaMemcpyAsync recvcounts to device"));
  else
    memcpy(t->recvcounts, recvCounts, countBytes);
  if (t->compact && t->onDevice[ARG_RDISPLS])
    NCCLX_CHECK(moeCore->devCopy(dev, t->rdispls, displs, countBytes, "cudaMemcpyAsync rdispls to device"));
  else if (t->compact)
    memcpy(t->rdispls, displs, countBytes);
  return moeCore->devWait(dev);
}

static ncclxResult_t devRun(void* arg) {
  devTask* t = arg;
  if (t->device < 0) /* host arguments, CUDA-ordered stream: ordering was all it needed */
    return hostExchange(t, t->sendbuff, t->sendcounts, t->recvbuff, t->recvcounts, t->rdispls);
  char what[96];
  snprintf(what, sizeof what, "%s (device buffers)", t->fn);
  ncclxModuleDev_t* dev = NULL;
  ncclxResult_t res = moeCore->devOpen(t->comm, t->device, what, &dev);
  if (res == ncclxSuccess) res = stagedExchange(t, dev);
  moeCore->devClose(dev);
  return res;
}

ncclxResult_t dynDeviceSubmit(const char* fn, const void* sendbuff, const size_t* sendcounts, void* recvbuff,
                              size_t maxRecv, size_t* recvcounts, size_t* rdispls, ncclxDataType_t datatype,
                              ncclxComm_t comm, ncclxStream_t stream, int compact, int* taken) {
  *taken = 0;
  const void* args[NUM_ARGS] = {sendbuff, sendcounts, recvbuff, recvcounts, compact ? rdispls : NULL};
  int onDevice[NUM_ARGS] = {0}, any = 0, device = -1;
  for (int k = 0; k < NUM_ARGS; k++) {
    char msg[512];
    ncclxResult_t res = moeCore->checkBuffer(fn, argNames[k], args[k], msg, sizeof msg);
    if (res != ncclxSuccess) {
      *taken = 1;
      return moeCore->argError(comm, res, "%s", msg);
    }
    int d = moeCore->memDevice(args[k]);
    onDevice[k] = d >= 0;
    if (d >= 0 && device < 0) device = d;
    any |= onDevice[k];
  }
  if (!any && !moeCore->streamIsDevice(stream)) return ncclxSuccess;
  *taken = 1;
  devTask* t = calloc(1, sizeof(*t));
  if (!t) return moeCore->argError(comm, ncclxSystemError, "%s: out of memory", fn);
  ncclxModuleCommInfo_v1_t info;
  moeCore->commInfo(comm, &info);
  *t = (devTask){.comm = comm, .nranks = info.nranks, .fn = fn, .sendbuff = sendbuff, .sendcounts = sendcounts,
                 .recvbuff = recvbuff, .maxRecv = maxRecv, .recvcounts = recvcounts, .rdispls = rdispls,
                 .datatype = datatype, .compact = compact, .device = device};
  memcpy(t->onDevice, onDevice, sizeof(onDevice));
  return moeCore->enqueueDevice(comm, stream, devRun, free, t);
}
