/* The GPU path of a build without CUDA: host work passes straight through, device pointers
 * (recognised through the driver the application loaded, see gpu_probe.c) are refused with
 * a message that says how to get a build that takes them. */
#include "gpu/gpu.h"

#include <stdio.h>

#include "util/debug.h"
#include "gpu/gpu_net.h"
#include "ncclx/cuda.h"
#include "ncclx/net.h"

#define NCCLX_API __attribute__((visibility("default")))

ncclxResult_t gpuCheckBuffer(const char* fn, const char* what, const void* p, char* msg, size_t size) {
  if (!p || gpuProbePointer(p, NULL) != GPU_MEM_DEVICE) return ncclxSuccess;
  snprintf(msg, size, "%s: %s %p is CUDA device memory, but this libncclx was built without CUDA "
           "(configure with -DNCCLX_CUDA=ON)", fn, what, p);
  return ncclxInvalidUsage;
}

int gpuNetPtrType(const void* p) { (void)p; return NCCLX_PTR_HOST; }

ncclxResult_t gpuCollRun(struct ncclxComm* comm, const ncclxCollArgs* args) {
  NCCLX_CHECK(gpuNetCollCheck(comm));
  return collRun(comm, args);
}

/* Device buffers were refused at the call; this refuses host buffers for a plugin that
 * takes only device memory (and, defensively, device memory that got this far). */
ncclxResult_t gpuXferRun(struct ncclxComm* comm, ncclxXfer* xfers, int n) {
  if (!gpuDriverLoaded() && gpuNetXfersTakeHost(comm, xfers, n)) return xferRun(comm, xfers, n);
  gpuNetXfers plan;
  NCCLX_CHECK(gpuNetPlanXfers(comm, xfers, n, 0, &plan));
  gpuNetRelease(&plan, 0);
  return xferRun(comm, xfers, n);
}

ncclxResult_t gpuStreamEnqueue(ncclxStream_t stream, ncclxTask* task) {
  return streamEnqueue(stream, task);
}

void gpuStreamForget(ncclxStream_t stream) { (void)stream; }

int gpuStreamIsCuda(ncclxStream_t stream) { (void)stream; return 0; }

NCCLX_API ncclxResult_t ncclxCudaGetDeviceCount(int* count) {
  if (count) *count = 0;
  return ncclxSetError(ncclxInvalidUsage,
                       "ncclxCudaGetDeviceCount: this libncclx was built without CUDA "
                       "(configure with -DNCCLX_CUDA=ON)");
}

NCCLX_API ncclxResult_t ncclxStreamFromCuda(struct CUstream_st* cudaStream, ncclxStream_t* stream) {
  (void)cudaStream;
  if (stream) *stream = NULL;
  return ncclxSetError(ncclxInvalidUsage,
                       "ncclxStreamFromCuda: this libncclx was built without CUDA "
                       "(configure with -DNCCLX_CUDA=ON)");
}

/* Device copies for feature modules: unreachable, as device memory is refused at the call
 * (checkBuffer); refused all the same. */
ncclxResult_t gpuModuleDevOpen(struct ncclxComm* comm, int device, const char* what, struct ncclxModuleDev** out) {
  (void)device;
  *out = NULL;
  return commArgError(comm, ncclxInvalidUsage, "%s: device memory, but this libncclx was built without CUDA "
                      "(configure with -DNCCLX_CUDA=ON)", what);
}
ncclxResult_t gpuModuleDevPinned(struct ncclxModuleDev* d, size_t bytes, void** out) {
  (void)d, (void)bytes;
  *out = NULL;
  return ncclxInvalidUsage;
}
ncclxResult_t gpuModuleDevCopy(struct ncclxModuleDev* d, void* dst, const void* src, size_t bytes, const char* step) {
  (void)d, (void)dst, (void)src, (void)bytes, (void)step;
  return ncclxInvalidUsage;
}
ncclxResult_t gpuModuleDevCopyBlocks(struct ncclxModuleDev* d, void* dst, const void* src, const size_t* counts,
                                     int n, size_t stride, size_t elemBytes, const char* step) {
  (void)d, (void)dst, (void)src, (void)counts, (void)n, (void)stride, (void)elemBytes, (void)step;
  return ncclxInvalidUsage;
}
ncclxResult_t gpuModuleDevWait(struct ncclxModuleDev* d) {
  (void)d;
  return ncclxSuccess;
}
void gpuModuleDevClose(struct ncclxModuleDev* d) { (void)d; }
