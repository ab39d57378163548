// Block copies for all-to-all-v and AllToAllvDynamic packing (see cuda_kernels.h).
//
// Counts and displacements live in device memory and are read by the kernel, so a count
// produced by an earlier kernel on the same stream needs no host round trip. Grid: y picks
// the block (peer), x splits one block's bytes. A PACKED layout needs the prefix sum of the
// counts before block b; each CTA computes it with a block-wide reduction, which for the
// peer counts of a communicator (up to thousands) costs far less than a separate scan
// kernel and its scratch buffer.
#include <stdint.h>

#include "gpu/blocks.h"
#include "gpu/cuda_kernels.h"

namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;

__device__ __forceinline__ unsigned long long warpSum(unsigned long long v) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) v += __shfl_down_sync(0xffffffffu, v, off);
  return v;
}

// Sum of counts[0..b) across the CTA; every thread gets the result.
__device__ size_t prefixBefore(const size_t* counts, int b) {
  __shared__ unsigned long long partial[kWarps];
  unsigned long long mine = 0;
  for (int i = threadIdx.x; i < b; i += blockDim.x) mine += counts[i];
  mine = warpSum(mine);
  if ((threadIdx.x & 31) == 0) partial[threadIdx.x >> 5] = mine;
  __syncthreads();
  unsigned long long total = 0;
#pragma unroll
  for (int w = 0; w < kWarps; w++) total += partial[w];
  __syncthreads();  // partial[] is reused by the next block of the loop
  return (size_t)total;
}

// Copies `bytes` with W-byte words (source and destination agree modulo W): a byte head
// up to the first aligned destination address, words, a byte tail (see blocks.h).
template <typename W>
__device__ __forceinline__ void copyWords(unsigned char* d, const unsigned char* s, size_t bytes,
                                          size_t tid, size_t nthreads) {
  size_t head, words, tailStart;
  blocksSplit((uintptr_t)d, bytes, sizeof(W), &head, &words, &tailStart);
  W* dw = (W*)(d + head);
  const W* sw = (const W*)(s + head);
  for (size_t i = tid; i < words; i += nthreads) dw[i] = sw[i];
  for (size_t i = tid; i < head; i += nthreads) d[i] = s[i];
  for (size_t i = tailStart + tid; i < bytes; i += nthreads) d[i] = s[i];
}

__device__ void copySpan(unsigned char* d, const unsigned char* s, size_t bytes) {
  const size_t nthreads = (size_t)gridDim.x * blockDim.x;
  const size_t tid = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  switch (blocksWordSize((uintptr_t)d, (uintptr_t)s)) {
    case 16: copyWords<uint4>(d, s, bytes, tid, nthreads); break;
    case 8: copyWords<uint2>(d, s, bytes, tid, nthreads); break;
    case 4: copyWords<uint32_t>(d, s, bytes, tid, nthreads); break;
    default: copyWords<unsigned char>(d, s, bytes, tid, nthreads); break;
  }
}

__global__ void __launch_bounds__(kThreads)
    copyBlocksKernel(unsigned char* dst, ncclxBlockLayout dl, const unsigned char* src,
                     ncclxBlockLayout sl, const size_t* counts, int nblocks, size_t elemSize,
                     size_t* outDispls, unsigned int* status, int needPrefix) {
  for (int b = blockIdx.y; b < nblocks; b += gridDim.y) {
    size_t prefix = needPrefix ? prefixBefore(counts, b) : 0;
    size_t dstStart = blocksStart(&dl, b, prefix), srcStart = blocksStart(&sl, b, prefix);
    unsigned int flags;
    size_t n = blocksClip(counts[b], blocksRoom(&dl, dstStart), blocksRoom(&sl, srcStart), &flags);
    if (blockIdx.x == 0 && threadIdx.x == 0) {
      if (outDispls) outDispls[b] = dstStart;
      if (flags && status) atomicOr(status, flags);
    }
    if (n) copySpan(dst + dstStart * elemSize, src + srcStart * elemSize, n * elemSize);
  }
}

int validLayout(const ncclxBlockLayout& l) {
  switch (l.kind) {
    case NCCLX_BLOCKS_DISPLS: return l.displs != nullptr;
    case NCCLX_BLOCKS_PACKED: return 1;
    case NCCLX_BLOCKS_STRIDED: return 1;
    default: return 0;
  }
}

}  // namespace

extern "C" cudaError_t ncclxCudaCopyBlocks(void* dst, ncclxBlockLayout dstLayout, const void* src,
                                           ncclxBlockLayout srcLayout, const size_t* counts,
                                           int nblocks, size_t elemSize, size_t* outDispls,
                                           unsigned int* status, cudaStream_t stream) {
  if (nblocks < 0 || elemSize == 0 || !validLayout(dstLayout) || !validLayout(srcLayout))
    return cudaErrorInvalidValue;
  if (nblocks == 0) return cudaSuccess;
  if (!dst || !src || !counts) return cudaErrorInvalidValue;
  // Capacities are in elements; a capacity whose byte size overflows is a caller bug.
  if (dstLayout.capacity > SIZE_MAX / elemSize || srcLayout.capacity > SIZE_MAX / elemSize)
    return cudaErrorInvalidValue;
  // Counts are unknown on the host: aim at ~1024 CTAs in all, at least one per block and at
  // most 32 per block, which saturates copy bandwidth for a handful of large blocks.
  unsigned gy = nblocks > 65535 ? 65535u : (unsigned)nblocks;
  unsigned gx = 1024u / gy;
  gx = gx < 1 ? 1 : gx > 32 ? 32 : gx;
  int needPrefix = dstLayout.kind == NCCLX_BLOCKS_PACKED || srcLayout.kind == NCCLX_BLOCKS_PACKED;
  copyBlocksKernel<<<dim3(gx, gy), kThreads, 0, stream>>>(
      (unsigned char*)dst, dstLayout, (const unsigned char*)src, srcLayout, counts, nblocks,
      elemSize, outDispls, status, needPrefix);
  return cudaGetLastError();
}
