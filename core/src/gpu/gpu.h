/* The GPU path as the rest of the core sees it.
 *
 * The same functions exist in every build. Built with CUDA (NCCLX_HAVE_CUDA), they stage
 * device buffers through pinned host memory and order operations on CUDA streams. Built
 * without, they pass host work straight through and refuse device pointers with
 * ncclxInvalidUsage. Host buffers cost one cheap check per call in both (no CUDA call, no
 * CUDA initialization: see gpuProbePointer). */
#ifndef NCCLX_GPU_H
#define NCCLX_GPU_H

#include "coll/coll.h"
#include "exec/stream.h"
#include "exec/xfer.h"

typedef enum { GPU_MEM_HOST = 0, GPU_MEM_DEVICE = 1, GPU_MEM_MANAGED = 2 } gpuMemKind;

/* What the CUDA driver already loaded in this process says about p. Device memory cannot
 * exist without the driver, so when libcuda.so.1 is not loaded the answer is "host" and
 * nothing is loaded or initialized to find out. *device (may be NULL) gets the device
 * ordinal for device and managed memory, -1 otherwise. */
gpuMemKind gpuProbePointer(const void* p, int* device);
/* Whether the CUDA driver is loaded in this process at all. Without it every pointer is
 * host memory, so a call checks this once instead of probing each of its buffers. */
int gpuDriverLoaded(void);

/* Call-time check of a user buffer (NULL passes): ncclxInvalidUsage when p is device
 * memory this build or machine cannot use, with msg set to a sentence naming fn, what
 * ("sendbuff") and the reason. Records no error itself: the caller reports msg its way. */
ncclxResult_t gpuCheckBuffer(const char* fn, const char* what, const void* p, char* msg, size_t size);

/* Net ABI pointer type of p for regMr: NCCLX_PTR_CUDA for device memory, else
 * NCCLX_PTR_HOST. */
int gpuNetPtrType(const void* p);

/* Execution (stream thread or caller, comm->execLock held). Like collRun / xferRun; device
 * buffers are copied to pinned host memory first and results copied back. A CUDA failure
 * fails the communicator (commFail: the peers abort too) with ncclxUnhandledCudaError and
 * the CUDA error string. */
ncclxResult_t gpuCollRun(struct ncclxComm* comm, const ncclxCollArgs* args);
ncclxResult_t gpuXferRun(struct ncclxComm* comm, ncclxXfer* xfers, int n);

/* streamEnqueue, plus CUDA ordering when stream was made by ncclxStreamFromCuda: the task
 * runs after the CUDA work issued on that CUDA stream before this call, and CUDA work issued
 * after this call waits for the task. Takes ownership of task in every case. */
ncclxResult_t gpuStreamEnqueue(ncclxStream_t stream, ncclxTask* task);
/* ncclxStreamDestroy calls this first: drop stream's CUDA binding, if any (tasks already
 * queued keep what they need). */
void gpuStreamForget(ncclxStream_t stream);
/* Whether stream was made by ncclxStreamFromCuda (0 in a build without CUDA). */
int gpuStreamIsCuda(ncclxStream_t stream);

/* Device copies for feature modules (ncclx/module.h, devOpen ... devClose): gpu_module.c in
 * a CUDA build; without CUDA devOpen refuses (no device memory gets that far). */
struct ncclxModuleDev;
ncclxResult_t gpuModuleDevOpen(struct ncclxComm* comm, int device, const char* what, struct ncclxModuleDev** out);
ncclxResult_t gpuModuleDevPinned(struct ncclxModuleDev* d, size_t bytes, void** out);
ncclxResult_t gpuModuleDevCopy(struct ncclxModuleDev* d, void* dst, const void* src, size_t bytes, const char* step);
ncclxResult_t gpuModuleDevCopyBlocks(struct ncclxModuleDev* d, void* dst, const void* src, const size_t* counts,
                                     int n, size_t stride, size_t elemBytes, const char* step);
ncclxResult_t gpuModuleDevWait(struct ncclxModuleDev* d);
void gpuModuleDevClose(struct ncclxModuleDev* d);

#endif /* NCCLX_GPU_H */
