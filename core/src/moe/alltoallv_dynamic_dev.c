/* ncclxAllToAllvDynamic[Compact] on device memory (the GPU path, docs/gpu.md).
 *
 * alltoallv_dynamic.c validates a call, then asks gpuA2avDynamicSubmit whether the call is
 * the GPU path's: some buffer or count array is device memory, or the stream is ordered with
 * a CUDA stream. Device memory that cannot be used (a build without CUDA, a machine whose
 * CUDA runtime does not start) is refused here, at the call, naming the argument.
 *
 * A CUDA build queues the call with CUDA ordering (gpuStreamEnqueue): it executes after the
 * CUDA work issued before it on the bound CUDA stream, so counts a kernel wrote into device
 * memory are read then, by the ncclx stream, and the caller never synchronizes. Executing:
 *   1. device send counts are copied to pinned host memory (the exchange's headers need
 *      them on the CPU: the transports move host memory);
 *   2. the send data, sum(counts) elements, is copied to pinned memory;
 *   3. the host exchange runs on the pinned copies (the same engine, called with stream
 *      NULL on this thread), receiving into a pinned image of recvbuff and pinned counts;
 *   4. the received blocks go back: for fixed slots (maxRecvCount) the block-copy kernel
 *      (pack_kernels.cu) reads the pinned image and the pinned counts directly (mapped host
 *      memory) and copies only each slot's filled part; compact blocks are contiguous, one
 *      copy. Device count arrays get their values by one copy each.
 * Copies and the kernel run on the internal non-blocking copy stream of the buffers' device
 * and are waited for with the communicator's timeout and abort flag. A CUDA failure fails
 * the communicator with ncclxUnhandledCudaError and the CUDA error string, so the peers
 * abort instead of waiting for this rank. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moe/alltoallv_dynamic.h"
#include "util/debug.h"
#include "gpu/gpu.h"
#include "ncclx/moe.h"

enum { ARG_SENDBUFF, ARG_SENDCOUNTS, ARG_RECVBUFF, ARG_RECVCOUNTS, ARG_RDISPLS, NUM_ARGS };
static const char* const argNames[NUM_ARGS] = {"sendbuff", "sendcounts", "recvbuff", "recvcounts", "rdispls"};

#ifdef NCCLX_HAVE_CUDA

#include "gpu/cuda_kernels.h"
#include "gpu/gpu_net.h"
#include "gpu/gpu_runtime.h"

typedef struct {
  ncclxTask base;
  struct ncclxComm* comm;
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

/* One op's copies: the copy stream, an event to wait on, and whether a copy may still be
 * running into or out of the pinned buffers (then they are abandoned, never reused). */
typedef struct {
  struct ncclxComm* comm;
  const char* what;
  cudaStream_t stream;
  cudaEvent_t event;
  int inFlight;
} devCopies;

static ncclxResult_t cudaFailed(devCopies* c, cudaError_t err, const char* step) {
  return gpuFailComm(c->comm, gpuCudaError(err, "%s: %s", c->what, step));
}

static ncclxResult_t copyAsync(devCopies* c, void* dst, const void* src, size_t bytes, const char* step) {
  if (!bytes) return ncclxSuccess;
  cudaError_t err = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, c->stream);
  if (err != cudaSuccess) return cudaFailed(c, err, step);
  c->inFlight = 1;
  return ncclxSuccess;
}

static ncclxResult_t waitCopies(devCopies* c) {
  if (!c->inFlight) return ncclxSuccess;
  cudaError_t err = cudaEventRecord(c->event, c->stream);
  if (err != cudaSuccess) return cudaFailed(c, err, "cudaEventRecord");
  ncclxResult_t res = gpuEventWait(c->event, c->comm, c->what);
  if (res != ncclxSuccess) return gpuFailComm(c->comm, res);
  c->inFlight = 0;
  return ncclxSuccess;
}

/* Device address of pinned host memory, for the kernel (the same address under unified
 * addressing, but asked rather than assumed). */
static ncclxResult_t mapped(devCopies* c, void* host, void** dev) {
  cudaError_t err = cudaHostGetDevicePointer(dev, host, 0);
  return err == cudaSuccess ? ncclxSuccess : cudaFailed(c, err, "cudaHostGetDevicePointer");
}

static ncclxResult_t hostExchange(devTask* t, const void* send, const size_t* counts, void* recv,
                                  size_t* recvcounts, size_t* rdispls) {
  return t->compact
             ? ncclxAllToAllvDynamicCompact(send, counts, recv, t->maxRecv, recvcounts, rdispls, t->datatype,
                                            t->comm, NULL)
             : ncclxAllToAllvDynamic(send, counts, recv, t->maxRecv, recvcounts, t->datatype, t->comm, NULL);
}

/* Steps 1-4 of the header comment, with the device current and the copies set up. */
static ncclxResult_t stagedExchange(devTask* t, devCopies* c, struct gpuPinned** meta, struct gpuPinned** data) {
  int n = t->comm->nranks;
  size_t elem = ncclxTypeSize(t->datatype);
  /* Pinned counts: send, receive, displacements. */
  NCCLX_CHECK(gpuFailComm(t->comm, gpuPinnedGet(3 * (size_t)n * sizeof(size_t), meta)));
  size_t* sendCounts = (size_t*)(*meta)->p;
  size_t* recvCounts = sendCounts + n;
  size_t* displs = recvCounts + n;
  if (t->onDevice[ARG_SENDCOUNTS]) {
    NCCLX_CHECK(copyAsync(c, sendCounts, t->sendcounts, (size_t)n * sizeof(size_t), "cudaMemcpyAsync sendcounts to host"));
    NCCLX_CHECK(waitCopies(c));
  } else {
    memcpy(sendCounts, t->sendcounts, (size_t)n * sizeof(size_t));
  }
  size_t sum = 0, limit = (SIZE_MAX / 4) / elem;
  for (int p = 0; p < n; p++) {
    if (sendCounts[p] > limit - sum)
      return commFail(t->comm, ncclxInvalidArgument, "%s: sendcounts[%d] = %zu: the send counts add up to more "
                      "than fits in memory", t->fn, p, sendCounts[p]);
    sum += sendCounts[p];
  }
  size_t sendBytes = t->onDevice[ARG_SENDBUFF] ? sum * elem : 0;
  size_t recvBytes = t->onDevice[ARG_RECVBUFF] ? t->maxRecv * (t->compact ? 1 : (size_t)n) * elem : 0;
  NCCLX_CHECK(gpuFailComm(t->comm, gpuPinnedGet(sendBytes + recvBytes + 256, data)));
  char* sendHost = (*data)->p;
  char* recvHost = sendHost + (sendBytes + 255) / 256 * 256;
  NCCLX_CHECK(copyAsync(c, sendHost, t->sendbuff, sendBytes, "cudaMemcpyAsync sendbuff to host"));
  NCCLX_CHECK(waitCopies(c));

  NCCLX_CHECK(hostExchange(t, t->onDevice[ARG_SENDBUFF] ? sendHost : t->sendbuff, sendCounts,
                           t->onDevice[ARG_RECVBUFF] ? recvHost : t->recvbuff, recvCounts, displs));

  if (t->onDevice[ARG_RECVBUFF] && t->compact) {
    size_t total = 0;
    for (int p = 0; p < n; p++) total += recvCounts[p];
    NCCLX_CHECK(copyAsync(c, t->recvbuff, recvHost, total * elem, "cudaMemcpyAsync recvbuff to device"));
  } else if (t->onDevice[ARG_RECVBUFF]) {
    void *src, *counts;
    NCCLX_CHECK(mapped(c, recvHost, &src));
    NCCLX_CHECK(mapped(c, recvCounts, &counts));
    ncclxBlockLayout slots = {.kind = NCCLX_BLOCKS_STRIDED, .stride = t->maxRecv, .capacity = t->maxRecv * (size_t)n};
    cudaError_t err = ncclxCudaCopyBlocks(t->recvbuff, slots, src, slots, (const size_t*)counts, n, elem, NULL, NULL,
                                          c->stream);
    if (err != cudaSuccess) return cudaFailed(c, err, "block-copy kernel into recvbuff");
    c->inFlight = 1;
  }
  size_t countBytes = (size_t)n * sizeof(size_t);
  if (t->onDevice[ARG_RECVCOUNTS])
    NCCLX_CHECK(copyAsync(c, t->recvcounts, recvCounts, countBytes, "cudaMemcpyAsync recvcounts to device"));
  else
    memcpy(t->recvcounts, recvCounts, countBytes);
  if (t->compact && t->onDevice[ARG_RDISPLS])
    NCCLX_CHECK(copyAsync(c, t->rdispls, displs, countBytes, "cudaMemcpyAsync rdispls to device"));
  else if (t->compact)
    memcpy(t->rdispls, displs, countBytes);
  return waitCopies(c);
}

static ncclxResult_t devRun(ncclxTask* task) {
  devTask* t = (devTask*)task;
  if (t->device < 0) /* host arguments, CUDA-ordered stream: ordering was all it needed */
    return hostExchange(t, t->sendbuff, t->sendcounts, t->recvbuff, t->recvcounts, t->rdispls);
  char what[96];
  snprintf(what, sizeof what, "%s (device buffers)", t->fn);
  devCopies c = {.comm = t->comm, .what = what};
  struct gpuPinned *meta = NULL, *data = NULL;
  int saved;
  ncclxResult_t res = gpuFailComm(t->comm, gpuDeviceEnter(t->device, &saved));
  if (res == ncclxSuccess) res = gpuFailComm(t->comm, gpuCopyStream(t->device, &c.stream));
  if (res == ncclxSuccess) {
    cudaError_t err = cudaEventCreateWithFlags(&c.event, cudaEventDisableTiming);
    if (err != cudaSuccess) c.event = NULL, res = cudaFailed(&c, err, "cudaEventCreateWithFlags");
  }
  if (res == ncclxSuccess) res = stagedExchange(t, &c, &meta, &data);
  if (c.inFlight) {
    WARN("%s: abandoning pinned staging buffers: a copy may still be running", what);
  } else {
    gpuPinnedPut(meta);
    gpuPinnedPut(data);
  }
  if (c.event) (void)cudaEventDestroy(c.event);
  gpuDeviceRestore(saved);
  return res;
}

static void devRelease(ncclxTask* task) {
  devTask* t = (devTask*)task;
  commRelease(t->comm);
  free(t);
}

static ncclxResult_t devQueue(const char* fn, const void* const* args, const int* onDevice, size_t maxRecv,
                              ncclxDataType_t datatype, struct ncclxComm* comm, ncclxStream_t stream, int compact) {
  devTask* t = calloc(1, sizeof(*t));
  if (!t) return commArgError(comm, ncclxSystemError, "%s: out of memory", fn);
  t->base.run = devRun;
  t->base.release = devRelease;
  t->comm = comm;
  t->fn = fn;
  t->sendbuff = args[ARG_SENDBUFF];
  t->sendcounts = args[ARG_SENDCOUNTS];
  t->recvbuff = (void*)args[ARG_RECVBUFF];
  t->recvcounts = (size_t*)args[ARG_RECVCOUNTS];
  t->rdispls = (size_t*)args[ARG_RDISPLS];
  t->maxRecv = maxRecv;
  t->datatype = datatype;
  t->compact = compact;
  t->device = -1;
  for (int k = 0; k < NUM_ARGS; k++) {
    t->onDevice[k] = onDevice[k];
    if (onDevice[k] && t->device < 0) (void)gpuProbePointer(args[k], &t->device);
  }
  commRetain(comm);
  return gpuStreamEnqueue(stream, &t->base);
}

#endif /* NCCLX_HAVE_CUDA */

ncclxResult_t gpuA2avDynamicSubmit(const char* fn, const void* sendbuff, const size_t* sendcounts,
                                   void* recvbuff, size_t maxRecv, size_t* recvcounts, size_t* rdispls,
                                   ncclxDataType_t datatype, struct ncclxComm* comm, ncclxStream_t stream,
                                   int compact, int* taken) {
  *taken = 0;
  int cudaOrdered = gpuStreamIsCuda(stream);
  if (!cudaOrdered && !gpuDriverLoaded()) return ncclxSuccess; /* no driver, no device memory */
  const void* args[NUM_ARGS] = {sendbuff, sendcounts, recvbuff, recvcounts, compact ? rdispls : NULL};
  int onDevice[NUM_ARGS] = {0}, any = 0;
  for (int k = 0; k < NUM_ARGS; k++) {
    char msg[512];
    ncclxResult_t res = gpuCheckBuffer(fn, argNames[k], args[k], msg, sizeof msg);
    if (res != ncclxSuccess) {
      *taken = 1;
      return commArgError(comm, res, "%s", msg);
    }
    onDevice[k] = args[k] && gpuProbePointer(args[k], NULL) == GPU_MEM_DEVICE;
    any |= onDevice[k];
  }
  if (!any && !cudaOrdered) return ncclxSuccess;
#ifdef NCCLX_HAVE_CUDA
  *taken = 1;
  return devQueue(fn, args, onDevice, maxRecv, datatype, comm, stream, compact);
#else
  (void)maxRecv, (void)datatype; /* unreachable: device memory was refused, no stream is CUDA's */
  return ncclxSuccess;
#endif
}
