/* The device kernels and CUDA stream ordering, on a real GPU (skipped without one):
 *  - ncclxCudaReduce / ncclxCudaAccumulate / ncclxCudaAvgFinish for every datatype and op,
 *    in all three access modes (16-byte vectors, aligned scalars, misaligned bytes) and in
 *    place, against reduce.c on the CPU (bit for bit; NaNs made by arithmetic match any NaN);
 *  - ncclxCudaCopyBlocks: all-to-all-v packing and unpacking with counts and displacements
 *    in device memory written on the stream just before (no host synchronization), odd
 *    element sizes, empty blocks, fixed slots with clipping and the overflow status;
 *  - ncclxStreamFromCuda: an allreduce on device buffers sees the CUDA work issued before
 *    it, and CUDA work issued after it sees its result. */
#include <stdint.h>
#include <string.h>

#include "gpu/cuda_kernels.h"
#include "gpu_test_util.h"
#include "ncclx.h"
#include "ncclx/cuda.h"
#include "util/reduce.h"

static uint64_t rngState = 0x853c49e6748fea9bull;
static uint64_t rnd(void) {
  rngState ^= rngState >> 12;
  rngState ^= rngState << 25;
  rngState ^= rngState >> 27;
  return rngState * 2685821657736338717ull;
}

static void fillRandom(unsigned char* p, size_t bytes) {
  for (size_t i = 0; i < bytes; i++) p[i] = (unsigned char)(rnd() >> 56);
}

static int isNan(const unsigned char* p, ncclxDataType_t t) {
  uint64_t v = 0;
  memcpy(&v, p, ncclxTypeSize(t));
  switch (t) {
    case ncclxFloat16: return (v & 0x7c00u) == 0x7c00u && (v & 0x3ffu);
    case ncclxBfloat16: return (v & 0x7f80u) == 0x7f80u && (v & 0x7fu);
    case ncclxFloat32: return (v & 0x7fffffffu) > 0x7f800000u;
    case ncclxFloat64: return (v & 0x7fffffffffffffffull) > 0x7ff0000000000000ull;
    default: return 0;
  }
}

static int sameElems(const unsigned char* x, const unsigned char* y, size_t n, ncclxDataType_t t,
                     int arithmetic, size_t* firstBad) {
  size_t es = ncclxTypeSize(t);
  for (size_t i = 0; i < n; i++) {
    if (memcmp(x + i * es, y + i * es, es) == 0) continue;
    if (arithmetic && isNan(x + i * es, t) && isNan(y + i * es, t)) continue;
    *firstBad = i;
    return 0;
  }
  return 1;
}

/* ---------------- reductions ---------------- */

static void testReduce(cudaStream_t s) {
  enum { N = 100003 };
  const ncclxRedOp_t ops[] = {ncclxSum, ncclxProd, ncclxMax, ncclxMin, ncclxAvg};
  unsigned char *a = malloc(N * 8 + 64), *b = malloc(N * 8 + 64), *ref = malloc(N * 8 + 64),
                *got = malloc(N * 8 + 64);
  unsigned char *da, *db, *dd;
  CUDA_OK(cudaMalloc((void**)&da, N * 8 + 64));
  CUDA_OK(cudaMalloc((void**)&db, N * 8 + 64));
  CUDA_OK(cudaMalloc((void**)&dd, N * 8 + 64));
  for (int t = 0; t < ncclxNumTypes; t++) {
    size_t es = ncclxTypeSize((ncclxDataType_t)t);
    /* Offsets: 16-byte aligned (vector path), one element (scalar path unless es = 16),
     * one byte (misaligned path for es > 1). */
    size_t offsets[3] = {0, es, 1};
    for (int oi = 0; oi < (es > 1 ? 3 : 2); oi++) {
      size_t off = offsets[oi];
      for (size_t k = 0; k < sizeof ops / sizeof ops[0]; k++) {
        ncclxRedOp_t op = ops[k];
        int arith = op == ncclxSum || op == ncclxProd || op == ncclxAvg;
        fillRandom(a, N * es);
        fillRandom(b, N * es);
        ncclxReduce2(ref, a, b, N, (ncclxDataType_t)t, op);
        CUDA_OK(cudaMemcpyAsync(da + off, a, N * es, cudaMemcpyHostToDevice, s));
        CUDA_OK(cudaMemcpyAsync(db + off, b, N * es, cudaMemcpyHostToDevice, s));
        CUDA_OK(ncclxCudaReduce(dd + off, da + off, db + off, N, (ncclxDataType_t)t, op, s));
        CUDA_OK(cudaMemcpyAsync(got, dd + off, N * es, cudaMemcpyDeviceToHost, s));
        CUDA_OK(cudaStreamSynchronize(s));
        size_t bad = 0;
        CHECK(sameElems(ref, got, N, (ncclxDataType_t)t, arith, &bad), "reduce %s %s offset %zu: element %zu differs",
              ncclxTypeName((ncclxDataType_t)t), ncclxOpName(op), off, bad);
        /* The CommFuse accumulate step, in place: da op= db. */
        CUDA_OK(ncclxCudaAccumulate(da + off, db + off, N, (ncclxDataType_t)t, op, s));
        CUDA_OK(cudaMemcpyAsync(got, da + off, N * es, cudaMemcpyDeviceToHost, s));
        CUDA_OK(cudaStreamSynchronize(s));
        CHECK(sameElems(ref, got, N, (ncclxDataType_t)t, arith, &bad), "accumulate %s %s offset %zu: element %zu differs",
              ncclxTypeName((ncclxDataType_t)t), ncclxOpName(op), off, bad);
      }
      /* Avg finish on whatever the last sum left, for a few rank counts. */
      static const int ns[] = {2, 3, 1000};
      for (size_t k = 0; k < 3; k++) {
        fillRandom(a, N * es);
        memcpy(ref, a, N * es);
        ncclxAvgFinish(ref, N, (ncclxDataType_t)t, ns[k]);
        CUDA_OK(cudaMemcpyAsync(da + off, a, N * es, cudaMemcpyHostToDevice, s));
        CUDA_OK(ncclxCudaAvgFinish(da + off, N, (ncclxDataType_t)t, ns[k], s));
        CUDA_OK(cudaMemcpyAsync(got, da + off, N * es, cudaMemcpyDeviceToHost, s));
        CUDA_OK(cudaStreamSynchronize(s));
        size_t bad = 0;
        CHECK(sameElems(ref, got, N, (ncclxDataType_t)t, 1, &bad), "avg finish %s n=%d offset %zu: element %zu differs",
              ncclxTypeName((ncclxDataType_t)t), ns[k], off, bad);
      }
    }
  }
  CHECK(ncclxCudaReduce(dd, da, db, 4, (ncclxDataType_t)99, ncclxSum, s) == cudaErrorInvalidValue, "bad type accepted");
  CHECK(ncclxCudaReduce(dd, da, db, 4, ncclxInt8, (ncclxRedOp_t)99, s) == cudaErrorInvalidValue, "bad op accepted");
  CHECK(ncclxCudaReduce(dd, da, db, 0, ncclxInt8, ncclxSum, s) == cudaSuccess, "count 0");
  CUDA_OK(cudaFree(da));
  CUDA_OK(cudaFree(db));
  CUDA_OK(cudaFree(dd));
  free(a), free(b), free(ref), free(got);
}

/* ---------------- block copies ---------------- */

static void testCopyBlocks(cudaStream_t s) {
  enum { NB = 7 };
  const size_t counts[NB] = {0, 5, 1000, 1, 0, 33333, 7};
  const size_t elemSizes[] = {1, 2, 4, 8, 12, 16};
  size_t total = 0, displs[NB], packedDispls[NB];
  for (int b = 0; b < NB; b++) packedDispls[b] = total, total += counts[b];
  /* Sparse source layout: blocks in reverse order with gaps. */
  size_t span = 0;
  for (int b = NB - 1; b >= 0; b--) displs[b] = span + 3, span += counts[b] + 3 + (size_t)b;

  size_t *dCounts, *dDispls, *dOut;
  unsigned int* dStatus;
  CUDA_OK(cudaMalloc((void**)&dCounts, sizeof counts));
  CUDA_OK(cudaMalloc((void**)&dDispls, sizeof displs));
  CUDA_OK(cudaMalloc((void**)&dOut, sizeof displs));
  CUDA_OK(cudaMalloc((void**)&dStatus, sizeof(unsigned int)));
  for (size_t k = 0; k < sizeof elemSizes / sizeof elemSizes[0]; k++) {
    size_t es = elemSizes[k];
    unsigned char* src = malloc(span * es);
    unsigned char* want = malloc(total * es);
    unsigned char* got = malloc(span * es + 64);
    unsigned char *dSrc, *dPacked, *dBack;
    fillRandom(src, span * es);
    for (int b = 0; b < NB; b++) memcpy(want + packedDispls[b] * es, src + displs[b] * es, counts[b] * es);
    CUDA_OK(cudaMalloc((void**)&dSrc, span * es));
    CUDA_OK(cudaMalloc((void**)&dPacked, total * es + 1));
    CUDA_OK(cudaMalloc((void**)&dBack, span * es));
    /* Counts and displacements reach the device on the stream, right before the kernel. */
    CUDA_OK(cudaMemcpyAsync(dSrc, src, span * es, cudaMemcpyHostToDevice, s));
    CUDA_OK(cudaMemcpyAsync(dCounts, counts, sizeof counts, cudaMemcpyHostToDevice, s));
    CUDA_OK(cudaMemcpyAsync(dDispls, displs, sizeof displs, cudaMemcpyHostToDevice, s));
    CUDA_OK(cudaMemsetAsync(dStatus, 0, sizeof(unsigned int), s));
    ncclxBlockLayout sparse = {.kind = NCCLX_BLOCKS_DISPLS, .displs = dDispls, .capacity = span};
    ncclxBlockLayout packed = {.kind = NCCLX_BLOCKS_PACKED, .capacity = total};
    /* Pack (odd byte offset of the packed buffer when es allows: the unaligned copy path). */
    unsigned char* dPack = dPacked + (es == 1 ? 1 : 0);
    CUDA_OK(ncclxCudaCopyBlocks(dPack, packed, dSrc, sparse, dCounts, NB, es, dOut, dStatus, s));
    size_t outDispls[NB];
    unsigned int status = 99;
    CUDA_OK(cudaMemcpyAsync(got, dPack, total * es, cudaMemcpyDeviceToHost, s));
    CUDA_OK(cudaMemcpyAsync(outDispls, dOut, sizeof outDispls, cudaMemcpyDeviceToHost, s));
    CUDA_OK(cudaMemcpyAsync(&status, dStatus, sizeof status, cudaMemcpyDeviceToHost, s));
    CUDA_OK(cudaStreamSynchronize(s));
    CHECK(memcmp(got, want, total * es) == 0, "pack, element size %zu", es);
    CHECK(memcmp(outDispls, packedDispls, sizeof outDispls) == 0, "packed displacements, element size %zu", es);
    CHECK(status == 0, "status %u after an in-bounds pack", status);
    /* Unpack back into the sparse layout. */
    CUDA_OK(cudaMemsetAsync(dBack, 0, span * es, s));
    CUDA_OK(ncclxCudaCopyBlocks(dBack, sparse, dPack, packed, dCounts, NB, es, NULL, NULL, s));
    CUDA_OK(cudaMemcpyAsync(got, dBack, span * es, cudaMemcpyDeviceToHost, s));
    CUDA_OK(cudaStreamSynchronize(s));
    for (int b = 0; b < NB; b++)
      CHECK(memcmp(got + displs[b] * es, src + displs[b] * es, counts[b] * es) == 0, "unpack block %d, es %zu", b, es);
    /* Fixed slots of 1000 elements (AllToAllvDynamic's maxRecvCount): block 5 does not fit
     * and is clipped; the byte after every slot stays untouched. */
    const size_t slot = 1000;
    unsigned char* dSlots;
    CUDA_OK(cudaMalloc((void**)&dSlots, NB * slot * es));
    CUDA_OK(cudaMemsetAsync(dSlots, 0xab, NB * slot * es, s));
    CUDA_OK(cudaMemsetAsync(dStatus, 0, sizeof(unsigned int), s));
    ncclxBlockLayout slots = {.kind = NCCLX_BLOCKS_STRIDED, .stride = slot, .capacity = NB * slot};
    CUDA_OK(ncclxCudaCopyBlocks(dSlots, slots, dPack, packed, dCounts, NB, es, NULL, dStatus, s));
    unsigned char* slotsHost = malloc(NB * slot * es);
    CUDA_OK(cudaMemcpyAsync(slotsHost, dSlots, NB * slot * es, cudaMemcpyDeviceToHost, s));
    CUDA_OK(cudaMemcpyAsync(&status, dStatus, sizeof status, cudaMemcpyDeviceToHost, s));
    CUDA_OK(cudaStreamSynchronize(s));
    CHECK(status == NCCLX_BLOCKS_DST_OVERFLOW, "slot overflow status %u", status);
    for (int b = 0; b < NB; b++) {
      size_t n = counts[b] < slot ? counts[b] : slot;
      CHECK(memcmp(slotsHost + b * slot * es, want + packedDispls[b] * es, n * es) == 0, "slot %d, es %zu", b, es);
      if (n < slot) CHECK(slotsHost[(b * slot + n) * es] == 0xab, "slot %d overrun, es %zu", b, es);
    }
    free(slotsHost);
    CUDA_OK(cudaFree(dSlots));
    CUDA_OK(cudaFree(dSrc));
    CUDA_OK(cudaFree(dPacked));
    CUDA_OK(cudaFree(dBack));
    free(src), free(want), free(got);
  }
  ncclxBlockLayout bad = {.kind = (ncclxBlockLayoutKind)7};
  ncclxBlockLayout packed = {.kind = NCCLX_BLOCKS_PACKED, .capacity = 1};
  CHECK(ncclxCudaCopyBlocks(dOut, bad, dOut, packed, dCounts, 1, 1, NULL, NULL, s) == cudaErrorInvalidValue,
        "bad layout accepted");
  CUDA_OK(cudaFree(dCounts));
  CUDA_OK(cudaFree(dDispls));
  CUDA_OK(cudaFree(dOut));
  CUDA_OK(cudaFree(dStatus));
}

/* ---------------- stream ordering ---------------- */

static void testStreamOrdering(cudaStream_t cs) {
  enum { N = 1 << 22 };
  ncclxUniqueId id;
  ncclxComm_t comm;
  if (ncclxGetUniqueId(&id) != ncclxSuccess || ncclxCommInitRank(&comm, 1, id, 0) != ncclxSuccess) {
    CHECK(0, "1-rank communicator: %s", ncclxGetLastError(NULL));
    return;
  }
  ncclxStream_t ns;
  ncclxResult_t res = ncclxStreamFromCuda(cs, &ns);
  CHECK(res == ncclxSuccess, "ncclxStreamFromCuda: %s", ncclxGetLastError(NULL));
  if (res != ncclxSuccess) return;
  float *dSend, *dRecv, *dBusy;
  float* host = malloc(N * sizeof(float));
  CUDA_OK(cudaMalloc((void**)&dSend, N * sizeof(float)));
  CUDA_OK(cudaMalloc((void**)&dRecv, N * sizeof(float)));
  CUDA_OK(cudaMalloc((void**)&dBusy, N * sizeof(float)));
  for (int round = 1; round <= 3; round++) {
    /* Keep the GPU busy, then write the input: the allreduce must wait for both. */
    for (int k = 0; k < 20; k++) CUDA_OK(ncclxCudaAccumulate(dBusy, dBusy, N, ncclxFloat32, ncclxSum, cs));
    CUDA_OK(cudaMemsetAsync(dSend, round, N * sizeof(float), cs)); /* bytes `round`: one float value */
    CUDA_OK(cudaMemsetAsync(dRecv, 0, N * sizeof(float), cs));
    res = ncclxAllReduce(dSend, dRecv, N, ncclxFloat32, ncclxSum, comm, ns);
    CHECK(res == ncclxSuccess, "allreduce on device buffers: %s", ncclxGetLastError(comm));
    /* Issued after the call: must see the result without any host synchronization. */
    CUDA_OK(cudaMemcpyAsync(host, dRecv, N * sizeof(float), cudaMemcpyDeviceToHost, cs));
    CUDA_OK(cudaStreamSynchronize(cs));
    float want;
    unsigned char pattern[4] = {(unsigned char)round, (unsigned char)round, (unsigned char)round, (unsigned char)round};
    memcpy(&want, pattern, sizeof want);
    size_t bad = 0;
    while (bad < N && memcmp(&host[bad], &want, sizeof want) == 0) bad++;
    CHECK(bad == N, "round %d: element %zu is %g, want %g", round, bad, bad < N ? host[bad] : 0.0, want);
  }
  CHECK(ncclxStreamSynchronize(ns) == ncclxSuccess, "stream error: %s", ncclxGetLastError(NULL));
  CHECK(ncclxStreamDestroy(ns) == ncclxSuccess, "destroy stream");
  CHECK(ncclxCommDestroy(comm) == ncclxSuccess, "destroy comm");
  CUDA_OK(cudaFree(dSend));
  CUDA_OK(cudaFree(dRecv));
  CUDA_OK(cudaFree(dBusy));
  free(host);
}

int main(void) {
  int skip = skipWithoutDevice("gpu_device");
  if (skip) return skip;
  cudaStream_t s;
  CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  testReduce(s);
  testCopyBlocks(s);
  testStreamOrdering(s);
  CUDA_OK(cudaStreamDestroy(s));
  if (failures) {
    fprintf(stderr, "gpu_device: %d failure(s)\n", failures);
    return 1;
  }
  printf("gpu_device: kernels and CUDA stream ordering verified on the device\n");
  return 0;
}
