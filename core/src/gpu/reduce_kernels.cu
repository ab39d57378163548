// Device reductions for every datatype and op (see cuda_kernels.h), built on devmath.h.
//
// One kernel per (storage type, op), grid-stride. The launcher picks one of three access
// modes from the pointers, the same for the whole grid so the branch is uniform:
//  - all three 16-byte aligned: 16-byte vector loads/stores, then a scalar tail;
//  - all aligned to the element: scalar typed accesses;
//  - otherwise (user buffers may be misaligned, as on the CPU): byte-assembled elements.
// Signed integers share the unsigned sum/prod kernels, as in reduce.c (same bits).
#include <stdint.h>
#include <string.h>

#include "gpu/cuda_kernels.h"
#include "util/devmath.h"

namespace {

constexpr int kThreads = 256;
constexpr unsigned kMaxBlocks = 4096;  // grid-stride covers the rest

enum Access { kVector16 = 0, kAligned = 1, kBytes = 2 };

#define DEVM_FUNCTOR(NAME, T, FN)                                                \
  struct NAME {                                                                  \
    typedef T Elem;                                                              \
    __device__ __forceinline__ T operator()(T a, T b) const { return FN(a, b); } \
  };
#define DEVM_FUNCTORS(TAG, T)              \
  DEVM_FUNCTOR(Sum_##TAG, T, devmSum_##TAG) \
  DEVM_FUNCTOR(Prod_##TAG, T, devmProd_##TAG) \
  DEVM_FUNCTOR(Max_##TAG, T, devmMax_##TAG) \
  DEVM_FUNCTOR(Min_##TAG, T, devmMin_##TAG)

DEVM_FUNCTORS(u8, uint8_t)
DEVM_FUNCTORS(u32, uint32_t)
DEVM_FUNCTORS(u64, uint64_t)
DEVM_FUNCTORS(f32, float)
DEVM_FUNCTORS(f64, double)
DEVM_FUNCTORS(f16, uint16_t)
DEVM_FUNCTORS(bf16, uint16_t)
DEVM_FUNCTOR(Max_i8, int8_t, devmMax_i8)
DEVM_FUNCTOR(Min_i8, int8_t, devmMin_i8)
DEVM_FUNCTOR(Max_i32, int32_t, devmMax_i32)
DEVM_FUNCTOR(Min_i32, int32_t, devmMin_i32)
DEVM_FUNCTOR(Max_i64, int64_t, devmMax_i64)
DEVM_FUNCTOR(Min_i64, int64_t, devmMin_i64)

template <typename T>
__device__ __forceinline__ T loadBytes(const unsigned char* p) {
  T v;
  memcpy(&v, p, sizeof(T));
  return v;
}

template <typename T>
__device__ __forceinline__ void storeBytes(unsigned char* p, T v) {
  memcpy(p, &v, sizeof(T));
}

template <typename Op>
__global__ void __launch_bounds__(kThreads)
    reduceKernel(void* dstv, const void* av, const void* bv, size_t n, int access) {
  typedef typename Op::Elem T;
  const Op op;
  const size_t stride = (size_t)gridDim.x * blockDim.x;
  const size_t tid = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (access == kBytes) {
    unsigned char* d = (unsigned char*)dstv;
    const unsigned char* a = (const unsigned char*)av;
    const unsigned char* b = (const unsigned char*)bv;
    for (size_t i = tid; i < n; i += stride)
      storeBytes<T>(d + i * sizeof(T), op(loadBytes<T>(a + i * sizeof(T)), loadBytes<T>(b + i * sizeof(T))));
    return;
  }
  size_t first = 0;  // first element of the scalar part
  if (access == kVector16) {
    constexpr int V = 16 / sizeof(T);
    union Pack {
      uint4 u;
      T e[V];
    };
    const size_t nvec = n / V;
    uint4* d = (uint4*)dstv;
    const uint4* a = (const uint4*)av;
    const uint4* b = (const uint4*)bv;
    for (size_t i = tid; i < nvec; i += stride) {
      Pack x, y, r;
      x.u = a[i];
      y.u = b[i];
#pragma unroll
      for (int k = 0; k < V; k++) r.e[k] = op(x.e[k], y.e[k]);
      d[i] = r.u;
    }
    first = nvec * V;
  }
  T* d = (T*)dstv;
  const T* a = (const T*)av;
  const T* b = (const T*)bv;
  for (size_t i = first + tid; i < n; i += stride) d[i] = op(a[i], b[i]);
}

int accessFor(const void* d, const void* a, const void* b, size_t elem) {
  uintptr_t bits = (uintptr_t)d | (uintptr_t)a | (uintptr_t)b;
  if ((bits & 15) == 0) return kVector16;
  if ((bits & (elem - 1)) == 0) return kAligned;
  return kBytes;
}

unsigned blocksFor(size_t work) {
  size_t blocks = (work + kThreads - 1) / kThreads;
  if (blocks < 1) blocks = 1;
  return blocks > kMaxBlocks ? kMaxBlocks : (unsigned)blocks;
}

template <typename Op>
cudaError_t launchReduce(void* d, const void* a, const void* b, size_t n, cudaStream_t s) {
  typedef typename Op::Elem T;
  int access = accessFor(d, a, b, sizeof(T));
  size_t work = access == kVector16 ? n / (16 / sizeof(T)) + 16 / sizeof(T) : n;
  reduceKernel<Op><<<blocksFor(work), kThreads, 0, s>>>(d, a, b, n, access);
  return cudaGetLastError();
}

typedef cudaError_t (*ReduceLauncher)(void*, const void*, const void*, size_t, cudaStream_t);

// Indexed by ncclxDataType_t, then ncclxRedOp_t (Avg accumulates as Sum).
#define ROW(S, P, MX, MN) {launchReduce<S>, launchReduce<P>, launchReduce<MX>, launchReduce<MN>, launchReduce<S>}
const ReduceLauncher kReduce[ncclxNumTypes][ncclxNumOps] = {
    /* ncclxInt8 */ ROW(Sum_u8, Prod_u8, Max_i8, Min_i8),
    /* ncclxUint8 */ ROW(Sum_u8, Prod_u8, Max_u8, Min_u8),
    /* ncclxInt32 */ ROW(Sum_u32, Prod_u32, Max_i32, Min_i32),
    /* ncclxUint32 */ ROW(Sum_u32, Prod_u32, Max_u32, Min_u32),
    /* ncclxInt64 */ ROW(Sum_u64, Prod_u64, Max_i64, Min_i64),
    /* ncclxUint64 */ ROW(Sum_u64, Prod_u64, Max_u64, Min_u64),
    /* ncclxFloat16 */ ROW(Sum_f16, Prod_f16, Max_f16, Min_f16),
    /* ncclxFloat32 */ ROW(Sum_f32, Prod_f32, Max_f32, Min_f32),
    /* ncclxFloat64 */ ROW(Sum_f64, Prod_f64, Max_f64, Min_f64),
    /* ncclxBfloat16 */ ROW(Sum_bf16, Prod_bf16, Max_bf16, Min_bf16),
};
static_assert(ncclxInt8 == 0 && ncclxBfloat16 == 9 && ncclxNumTypes == 10, "kReduce rows follow ncclxDataType_t");
static_assert(ncclxSum == 0 && ncclxMin == 3 && ncclxAvg == 4, "kReduce columns follow ncclxRedOp_t");

// ---- Avg finish: x / n, element by element (rare and memory-bound: no vector path) ----

#define AVG_INT(NAME, T)                                                      \
  struct NAME {                                                               \
    typedef T Elem;                                                           \
    int n;                                                                    \
    __device__ __forceinline__ T operator()(T x) const { return devm##NAME(x, n); } \
  };
AVG_INT(Avg_i8, int8_t)
AVG_INT(Avg_u8, uint8_t)
AVG_INT(Avg_i32, int32_t)
AVG_INT(Avg_u32, uint32_t)
AVG_INT(Avg_i64, int64_t)
AVG_INT(Avg_u64, uint64_t)

#define AVG_SCALE(NAME, T, S, FN)                                             \
  struct NAME {                                                               \
    typedef T Elem;                                                           \
    S scale;                                                                  \
    __device__ __forceinline__ T operator()(T x) const { return FN(x, scale); } \
  };
AVG_SCALE(AvgF32, float, float, devmAvgFinish_f32)
AVG_SCALE(AvgF64, double, double, devmAvgFinish_f64)
AVG_SCALE(AvgF16, uint16_t, float, devmAvgFinish_f16)
AVG_SCALE(AvgBf16, uint16_t, float, devmAvgFinish_bf16)

template <typename F>
__global__ void __launch_bounds__(kThreads) mapKernel(void* dstv, size_t n, F f, int aligned) {
  typedef typename F::Elem T;
  const size_t stride = (size_t)gridDim.x * blockDim.x;
  const size_t tid = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (aligned) {
    T* d = (T*)dstv;
    for (size_t i = tid; i < n; i += stride) d[i] = f(d[i]);
  } else {
    unsigned char* d = (unsigned char*)dstv;
    for (size_t i = tid; i < n; i += stride)
      storeBytes<T>(d + i * sizeof(T), f(loadBytes<T>(d + i * sizeof(T))));
  }
}

template <typename F>
cudaError_t launchMap(void* d, size_t n, F f, cudaStream_t s) {
  int aligned = ((uintptr_t)d & (sizeof(typename F::Elem) - 1)) == 0;
  mapKernel<F><<<blocksFor(n), kThreads, 0, s>>>(d, n, f, aligned);
  return cudaGetLastError();
}

}  // namespace

extern "C" cudaError_t ncclxCudaReduce(void* dst, const void* a, const void* b, size_t count,
                                       ncclxDataType_t type, ncclxRedOp_t op, cudaStream_t stream) {
  if ((unsigned)type >= ncclxNumTypes || (unsigned)op >= ncclxNumOps) return cudaErrorInvalidValue;
  if (count == 0) return cudaSuccess;
  if (!dst || !a || !b) return cudaErrorInvalidValue;
  return kReduce[type][op](dst, a, b, count, stream);
}

extern "C" cudaError_t ncclxCudaAccumulate(void* dst, const void* src, size_t count,
                                           ncclxDataType_t type, ncclxRedOp_t op,
                                           cudaStream_t stream) {
  return ncclxCudaReduce(dst, dst, src, count, type, op, stream);
}

extern "C" cudaError_t ncclxCudaAvgFinish(void* dst, size_t count, ncclxDataType_t type, int n,
                                          cudaStream_t stream) {
  if ((unsigned)type >= ncclxNumTypes || n < 1) return cudaErrorInvalidValue;
  if (count == 0 || n == 1) return cudaSuccess;  // reduce.c leaves the data alone too
  if (!dst) return cudaErrorInvalidValue;
  switch (type) {
    case ncclxInt8: return launchMap(dst, count, Avg_i8{n}, stream);
    case ncclxUint8: return launchMap(dst, count, Avg_u8{n}, stream);
    case ncclxInt32: return launchMap(dst, count, Avg_i32{n}, stream);
    case ncclxUint32: return launchMap(dst, count, Avg_u32{n}, stream);
    case ncclxInt64: return launchMap(dst, count, Avg_i64{n}, stream);
    case ncclxUint64: return launchMap(dst, count, Avg_u64{n}, stream);
    case ncclxFloat16: return launchMap(dst, count, AvgF16{devmAvgScale_f32(n)}, stream);
    case ncclxBfloat16: return launchMap(dst, count, AvgBf16{devmAvgScale_f32(n)}, stream);
    case ncclxFloat32: return launchMap(dst, count, AvgF32{devmAvgScale_f32(n)}, stream);
    case ncclxFloat64: return launchMap(dst, count, AvgF64{devmAvgScale_f64(n)}, stream);
    default: return cudaErrorInvalidValue;
  }
}
