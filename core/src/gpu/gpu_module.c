/* Device copies for feature modules (ncclx/module.h: devOpen ... devClose), CUDA build: one
 * operation's copies on the internal copy stream of its device, waited for with the
 * communicator's timeout and abort flag, through pinned host memory that is freed at the end
 * unless a copy may still be running (then it is abandoned, never reused). */
#include <stdio.h>
#include <stdlib.h>

#include "gpu/cuda_kernels.h"
#include "gpu/gpu.h"
#include "gpu/gpu_net.h"
#include "gpu/gpu_runtime.h"
#include "util/debug.h"

#define DEV_PINNED_MAX 4

struct ncclxModuleDev {
  struct ncclxComm* comm;
  char what[96];
  int saved; /* the device current before devOpen */
  cudaStream_t stream;
  cudaEvent_t event;
  int inFlight; /* copies queued and not waited for */
  struct gpuPinned* pinned[DEV_PINNED_MAX];
  int npinned;
};

static ncclxResult_t cudaFailed(struct ncclxModuleDev* d, cudaError_t err, const char* step) {
  return gpuFailComm(d->comm, gpuCudaError(err, "%s: %s", d->what, step));
}

ncclxResult_t gpuModuleDevOpen(struct ncclxComm* comm, int device, const char* what, struct ncclxModuleDev** out) {
  *out = NULL;
  struct ncclxModuleDev* d = calloc(1, sizeof(*d));
  if (!d) return commFail(comm, ncclxSystemError, "%s: out of memory", what);
  d->comm = comm;
  snprintf(d->what, sizeof(d->what), "%s", what);
  ncclxResult_t res = gpuFailComm(comm, gpuDeviceEnter(device, &d->saved));
  if (res != ncclxSuccess) {
    free(d);
    return res;
  }
  *out = d;
  NCCLX_CHECK(gpuFailComm(comm, gpuCopyStream(device, &d->stream)));
  cudaError_t err = cudaEventCreateWithFlags(&d->event, cudaEventDisableTiming);
  if (err != cudaSuccess) {
    d->event = NULL;
    return cudaFailed(d, err, "cudaEventCreateWithFlags");
  }
  return ncclxSuccess;
}

ncclxResult_t gpuModuleDevPinned(struct ncclxModuleDev* d, size_t bytes, void** out) {
  *out = NULL;
  if (d->npinned == DEV_PINNED_MAX)
    return commFail(d->comm, ncclxInternalError, "%s: more than %d pinned buffers", d->what, DEV_PINNED_MAX);
  struct gpuPinned* b = NULL;
  NCCLX_CHECK(gpuFailComm(d->comm, gpuPinnedGet(bytes ? bytes : 1, &b)));
  d->pinned[d->npinned++] = b;
  *out = b->p;
  return ncclxSuccess;
}

ncclxResult_t gpuModuleDevCopy(struct ncclxModuleDev* d, void* dst, const void* src, size_t bytes, const char* step) {
  if (!bytes) return ncclxSuccess;
  cudaError_t err = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, d->stream);
  if (err != cudaSuccess) return cudaFailed(d, err, step);
  d->inFlight = 1;
  return ncclxSuccess;
}

/* The kernel reads src and counts in pinned memory through their device addresses (the same
 * under unified addressing, but asked rather than assumed). */
ncclxResult_t gpuModuleDevCopyBlocks(struct ncclxModuleDev* d, void* dst, const void* src, const size_t* counts,
                                     int n, size_t stride, size_t elemBytes, const char* step) {
  void *srcDev, *countsDev;
  cudaError_t err = cudaHostGetDevicePointer(&srcDev, (void*)src, 0);
  if (err == cudaSuccess) err = cudaHostGetDevicePointer(&countsDev, (void*)counts, 0);
  if (err != cudaSuccess) return cudaFailed(d, err, "cudaHostGetDevicePointer");
  ncclxBlockLayout slots = {.kind = NCCLX_BLOCKS_STRIDED, .stride = stride, .capacity = stride * (size_t)n};
  err = ncclxCudaCopyBlocks(dst, slots, srcDev, slots, (const size_t*)countsDev, n, elemBytes, NULL, NULL, d->stream);
  if (err != cudaSuccess) return cudaFailed(d, err, step);
  d->inFlight = 1;
  return ncclxSuccess;
}

ncclxResult_t gpuModuleDevWait(struct ncclxModuleDev* d) {
  if (!d->inFlight) return ncclxSuccess;
  cudaError_t err = cudaEventRecord(d->event, d->stream);
  if (err != cudaSuccess) return cudaFailed(d, err, "cudaEventRecord");
  NCCLX_CHECK(gpuFailComm(d->comm, gpuEventWait(d->event, d->comm, d->what)));
  d->inFlight = 0;
  return ncclxSuccess;
}

void gpuModuleDevClose(struct ncclxModuleDev* d) {
  if (!d) return;
  if (d->inFlight) WARN("%s: abandoning pinned staging buffers: a copy may still be running", d->what);
  else
    for (int i = 0; i < d->npinned; i++) gpuPinnedPut(d->pinned[i]);
  if (d->event) (void)cudaEventDestroy(d->event);
  gpuDeviceRestore(d->saved);
  free(d);
}
