/* CUDA runtime helpers shared by the glue of a CUDA build (not used without CUDA). */
#ifndef NCCLX_GPU_RUNTIME_H
#define NCCLX_GPU_RUNTIME_H

#include <cuda_runtime_api.h>

#include "comm/comm.h"
#include "ncclx.h"

/* Usable devices, probed once per process with cudaGetDeviceCount; 0 when there are none
 * or the runtime cannot start (no driver, driver too old...). *why (may be NULL) then says
 * so, e.g. "cudaGetDeviceCount: CUDA driver version is insufficient for CUDA runtime
 * version (cudaErrorInsufficientDriver)"; "" when devices exist. */
int gpuRuntimeDevices(const char** why);

/* Record a CUDA failure as the thread's last error: "<context>: <CUDA error string>
 * (<error name>)", and return ncclxUnhandledCudaError. Clears the runtime's non-sticky
 * last-error state so the next call does not report it again. */
ncclxResult_t gpuCudaError(cudaError_t err, const char* fmt, ...) __attribute__((format(printf, 2, 3)));
/* The same text into buf, for callers that record it elsewhere (commFail). */
const char* gpuCudaErrorText(cudaError_t err, char* buf, size_t size);

/* Wait for ev (spin, yield, then sleep). With comm, the wait fails with ncclxSystemError
 * after comm->timeoutSec (when set) and returns the sticky error when comm is aborted; the
 * caller then must assume the DMA may still run. Without comm (waiting for user work of
 * unknown length) it waits as long as it takes and logs every 60 s that it still does.
 * A CUDA error (the work failed) returns ncclxUnhandledCudaError. */
ncclxResult_t gpuEventWait(cudaEvent_t ev, struct ncclxComm* comm, const char* what);

/* Make `device` current on this thread, remembering the previous one in *saved;
 * gpuDeviceRestore(saved) puts it back. device < 0 keeps the current one. */
ncclxResult_t gpuDeviceEnter(int device, int* saved);
void gpuDeviceRestore(int saved);

/* Pinned host memory (cudaMallocHost), pooled: up to 256 MiB stay cached. A buffer a copy
 * may still be writing (timeout, abort) must be abandoned, never put back. Pinned memory is
 * mapped for the devices too (unified addressing): kernels may read it at p. */
struct gpuPinned {
  char* p;
  size_t size;
  struct gpuPinned* next;
};
ncclxResult_t gpuPinnedGet(size_t bytes, struct gpuPinned** out);
void gpuPinnedPut(struct gpuPinned* b);

/* The internal non-blocking copy stream of `device` (current on this thread), created on
 * first use: it never waits behind the legacy default stream. */
ncclxResult_t gpuCopyStream(int device, cudaStream_t* out);

#endif /* NCCLX_GPU_RUNTIME_H */
