/* Device kernels of the GPU path, callable from C. Every launcher is asynchronous on
 * `stream` and returns the launch's cudaError_t (cudaErrorInvalidValue for a bad datatype,
 * op or layout); errors inside the kernel surface at the next synchronization, as in CUDA.
 * The element arithmetic is devmath.h, the same code the CPU tests check. */
#ifndef NCCLX_CUDA_KERNELS_H
#define NCCLX_CUDA_KERNELS_H

#include <stddef.h>

#include <cuda_runtime_api.h>

#include "ncclx.h"

#ifdef __cplusplus
extern "C" {
#endif

/* dst[i] = a[i] op b[i] for count elements (Avg accumulates as Sum: finish with
 * ncclxCudaAvgFinish). dst may alias a or b exactly. Any alignment works; 16-byte aligned
 * buffers get 16-byte loads and stores. */
cudaError_t ncclxCudaReduce(void* dst, const void* a, const void* b, size_t count,
                            ncclxDataType_t type, ncclxRedOp_t op, cudaStream_t stream);

/* The CommFuse accumulate step: dst[i] = dst[i] op src[i] (dst += src for Sum). */
cudaError_t ncclxCudaAccumulate(void* dst, const void* src, size_t count, ncclxDataType_t type,
                                ncclxRedOp_t op, cudaStream_t stream);

/* Finish an Avg over n contributions: dst[i] /= n, exactly as reduce.c does it. */
cudaError_t ncclxCudaAvgFinish(void* dst, size_t count, ncclxDataType_t type, int n,
                               cudaStream_t stream);

/* ---- Block copies for all-to-all-v packing, with counts in device memory ----
 *
 * A buffer holds nblocks blocks (one per peer). Where block b starts, in elements: */
typedef enum {
  NCCLX_BLOCKS_DISPLS = 0,  /* at displs[b], an array in device memory */
  NCCLX_BLOCKS_PACKED = 1,  /* right after block b-1: the prefix sum of counts[0..b) */
  NCCLX_BLOCKS_STRIDED = 2  /* at b * stride (fixed slots, e.g. maxRecvCount) */
} ncclxBlockLayoutKind;

typedef struct {
  ncclxBlockLayoutKind kind;
  const size_t* displs; /* DISPLS only */
  size_t stride;        /* STRIDED only: elements per slot; also each block's capacity */
  size_t capacity;      /* elements in the whole buffer; blocks are clipped to it */
} ncclxBlockLayout;

/* Bits of the optional status word: which side clipped a block that did not fit. */
#define NCCLX_BLOCKS_DST_OVERFLOW 0x1u
#define NCCLX_BLOCKS_SRC_OVERFLOW 0x2u

/* For every block b: copy counts[b] elements of elemSize bytes from src (laid out per
 * srcLayout) to dst (per dstLayout). counts, displacement arrays, outDispls and status are
 * device (or managed) memory, read and written by the kernel: no host synchronization, so
 * counts may be produced by earlier work on the same stream.
 * A block that would overrun a buffer (beyond capacity, or beyond its STRIDED slot) is
 * clipped, never written out of bounds, and the matching NCCLX_BLOCKS_*_OVERFLOW bit is
 * OR-ed into *status (if not NULL). outDispls (if not NULL, nblocks entries) receives where
 * each block starts in dst: the displacements of a compact layout. */
cudaError_t ncclxCudaCopyBlocks(void* dst, ncclxBlockLayout dstLayout, const void* src,
                                ncclxBlockLayout srcLayout, const size_t* counts, int nblocks,
                                size_t elemSize, size_t* outDispls, unsigned int* status,
                                cudaStream_t stream);

#ifdef __cplusplus
}
#endif
#endif /* NCCLX_CUDA_KERNELS_H */
