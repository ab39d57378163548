/* The GPU path of a build without CUDA: host work passes straight through, device pointers
 * (recognised through the driver the application loaded, see gpu_probe.c) are refused with
 * a message that says how to get a build that takes them. */
#include "gpu.h"

#include <stdio.h>

#include "debug.h"
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
  return collRun(comm, args);
}

ncclxResult_t gpuXferRun(struct ncclxComm* comm, ncclxXfer* xfers, int n) {
  return xferRun(comm, xfers, n);
}

ncclxResult_t gpuStreamEnqueue(ncclxStream_t stream, ncclxTask* task) {
  return streamEnqueue(stream, task);
}

void gpuStreamForget(ncclxStream_t stream) { (void)stream; }

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
