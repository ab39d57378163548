/*
 * ncclx CUDA interoperability. Include after ncclx.h; no CUDA header is needed (a
 * cudaStream_t is a `struct CUstream_st*`, so it converts as is).
 *
 * Every libncclx exports these functions. A build without CUDA answers ncclxInvalidUsage
 * ("built without CUDA"); a CUDA build on a machine without a usable device answers
 * ncclxUnhandledCudaError with the CUDA error string (ncclxGetLastError(NULL)).
 * Device buffers are accepted by every collective, send and receive of a CUDA build; see
 * docs/gpu.md for what runs where and what has been verified on which hardware.
 */
#ifndef NCCLX_CUDA_H
#define NCCLX_CUDA_H

#include "../ncclx.h"

#ifdef __cplusplus
extern "C" {
#endif

struct CUstream_st;

/* Number of usable CUDA devices (cudaGetDeviceCount, probed once per process). */
ncclxResult_t ncclxCudaGetDeviceCount(int* count);

/* An ncclx stream ordered with a CUDA stream: an operation queued on *stream runs after the
 * CUDA work issued on cudaStream before the call, and CUDA work issued on cudaStream after
 * the call runs after the operation (it waits on the GPU, the host does not block).
 * cudaStream may be NULL (the legacy default stream) or cudaStreamPerThread; it must
 * outlive *stream (its device is the current one at this call for those two, and with CUDA
 * runtimes before 12.8). Destroy *stream with ncclxStreamDestroy.
 * Other streams (NULL, ncclxStreamCreate) also take device buffers, but do not order with
 * CUDA: the buffers must be ready (their CUDA work synchronized) when the operation runs. */
ncclxResult_t ncclxStreamFromCuda(struct CUstream_st* cudaStream, ncclxStream_t* stream);

#ifdef __cplusplus
}
#endif
#endif /* NCCLX_CUDA_H */
