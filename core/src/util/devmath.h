/* Element arithmetic shared by the CPU and the GPU: fp16/bf16 <-> fp32 conversions and
 * sum/prod/max/min/avg-finish for every datatype, one definition compiled by both gcc and
 * nvcc so the CPU unit tests check the exact code the device kernels run.
 *
 * The results are bit-identical to reduce.c (tests/gpu/test_devmath.c checks every
 * datatype and op against it), except for the payload of a NaN produced by arithmetic:
 * NaN + NaN keeps whichever operand the compiler put first on the CPU, and GPUs return the
 * canonical NaN; it is a NaN everywhere. Otherwise:
 *  - integer sum/prod wrap: they are defined on the unsigned type only, and signed datatypes
 *    use the unsigned function on the same bits (two's complement makes them identical);
 *  - float max/min propagate NaN from either operand; for +0 vs -0 they return b;
 *  - fp16/bf16 compute in fp32 and round to nearest even; conversions keep NaN payloads
 *    (quieted), so the hardware conversion intrinsics (which canonicalize) are not used;
 *  - the fp16 subnormal rounding relies on IEEE fp32 addition with subnormals: never build
 *    device code that includes this with --use_fast_math or -ftz=true.
 * Plain C sees `static inline` functions; nvcc sees `__host__ __device__` ones. */
#ifndef NCCLX_DEVMATH_H
#define NCCLX_DEVMATH_H

#include <stdint.h>
#include <string.h>

#ifdef __CUDACC__
#define DEVM_FN static inline __host__ __device__
#else
#define DEVM_FN static inline
#endif

/* ---- bit casts ---- */

DEVM_FN uint32_t devmFloatBits(float f) {
#ifdef __CUDA_ARCH__
  return __float_as_uint(f);
#else
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
#endif
}

DEVM_FN float devmBitsFloat(uint32_t u) {
#ifdef __CUDA_ARCH__
  return __uint_as_float(u);
#else
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
#endif
}

/* ---- fp16 / bf16 <-> fp32 (branch-free: every case computed, then selected) ---- */

DEVM_FN float devmHalfToFloat(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  uint32_t normal = ((exp + 127u - 15u) << 23) | (mant << 13);
  uint32_t infNan = 0x7f800000u | (mant << 13);                  /* NaN keeps its payload */
  uint32_t subnormal = devmFloatBits((float)mant * 0x1p-24f);   /* exact in fp32 (0 too) */
  uint32_t mag = exp == 0 ? subnormal : exp == 31 ? infNan : normal;
  return devmBitsFloat(sign | mag);
}

DEVM_FN uint16_t devmFloatToHalf(float f) {
  uint32_t x = devmFloatBits(f);
  uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t a = x & 0x7fffffffu;
  /* Normal half: rebias the exponent, round to nearest even at bit 13 (a carry into the
   * exponent is correct, up to Inf). Unsigned wraparound for small `a` is harmless: that
   * case is replaced by the subnormal one below. */
  uint32_t n = a - ((127u - 15u) << 23);
  n += 0xfffu + ((n >> 13) & 1u);
  uint32_t h = n >> 13;
  /* Below 2^-14: adding 0.5f puts the value on a grid of 2^-24 (the half subnormal unit)
   * and the FPU rounds it to nearest even; the low mantissa bits are then the half's. */
  uint32_t sub = devmFloatBits(devmBitsFloat(a) + 0.5f) - 0x3f000000u;
  h = a < 0x38800000u ? sub : h;
  h = a >= 0x477ff000u ? 0x7c00u : h;                          /* >= 65520 rounds to Inf */
  h = a > 0x7f800000u ? 0x7e00u | ((a >> 13) & 0x3ffu) : h;     /* quiet NaN */
  return (uint16_t)(sign | h);
}

DEVM_FN float devmBf16ToFloat(uint16_t b) { return devmBitsFloat((uint32_t)b << 16); }

DEVM_FN uint16_t devmFloatToBf16(float f) {
  uint32_t x = devmFloatBits(f);
  uint32_t r = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16; /* nearest even; overflow gives Inf */
  uint32_t nan = (x >> 16) | 0x40u;                     /* quiet NaN */
  return (uint16_t)((x & 0x7fffffffu) > 0x7f800000u ? nan : r);
}

/* ---- integer ops ----
 * Suffix = storage type: u8/u32/u64 (sum, prod, max, min), i8/i32/i64 (max, min; their
 * sum and prod are the unsigned ones). The casts to U keep uint8_t products, which are
 * promoted to int, wrapping like the wider ones. */
#define DEVM_UINT_OPS(TAG, U)                                                       \
  DEVM_FN U devmSum_##TAG(U a, U b) { return (U)((U)a + (U)b); }                    \
  DEVM_FN U devmProd_##TAG(U a, U b) { return (U)((U)a * (U)b); }                   \
  DEVM_FN U devmMax_##TAG(U a, U b) { return a > b ? a : b; }                       \
  DEVM_FN U devmMin_##TAG(U a, U b) { return a < b ? a : b; }
#define DEVM_SINT_OPS(TAG, S)                                                       \
  DEVM_FN S devmMax_##TAG(S a, S b) { return a > b ? a : b; }                       \
  DEVM_FN S devmMin_##TAG(S a, S b) { return a < b ? a : b; }

DEVM_UINT_OPS(u8, uint8_t)
DEVM_UINT_OPS(u32, uint32_t)
DEVM_UINT_OPS(u64, uint64_t)
DEVM_SINT_OPS(i8, int8_t)
DEVM_SINT_OPS(i32, int32_t)
DEVM_SINT_OPS(i64, int64_t)

/* ---- floating-point ops (x != x is NaN: NaN wins from either side) ---- */
#define DEVM_FLOAT_OPS(TAG, T)                                                      \
  DEVM_FN T devmSum_##TAG(T a, T b) { return a + b; }                               \
  DEVM_FN T devmProd_##TAG(T a, T b) { return a * b; }                              \
  DEVM_FN T devmMax_##TAG(T a, T b) { return (a > b || a != a) ? a : b; }           \
  DEVM_FN T devmMin_##TAG(T a, T b) { return (a < b || a != a) ? a : b; }

DEVM_FLOAT_OPS(f32, float)
DEVM_FLOAT_OPS(f64, double)

/* 16-bit floats travel as their bits (uint16_t): widen, compute in fp32, round back. */
#define DEVM_HALF_OPS(TAG, TOF, FROMF)                                                         \
  DEVM_FN uint16_t devmSum_##TAG(uint16_t a, uint16_t b) { return FROMF(devmSum_f32(TOF(a), TOF(b))); }   \
  DEVM_FN uint16_t devmProd_##TAG(uint16_t a, uint16_t b) { return FROMF(devmProd_f32(TOF(a), TOF(b))); } \
  DEVM_FN uint16_t devmMax_##TAG(uint16_t a, uint16_t b) { return FROMF(devmMax_f32(TOF(a), TOF(b))); }   \
  DEVM_FN uint16_t devmMin_##TAG(uint16_t a, uint16_t b) { return FROMF(devmMin_f32(TOF(a), TOF(b))); }

DEVM_HALF_OPS(f16, devmHalfToFloat, devmFloatToHalf)
DEVM_HALF_OPS(bf16, devmBf16ToFloat, devmFloatToBf16)

/* ---- Avg finish: x / n ----
 * Integers divide (truncating) in a type wide enough for both x and n; floats multiply by
 * a precomputed scale 1/n (devmAvgScale_*), as reduce.c does. */
DEVM_FN uint8_t devmAvg_u8(uint8_t x, int n) { return (uint8_t)((int64_t)x / (int64_t)n); }
DEVM_FN int8_t devmAvg_i8(int8_t x, int n) { return (int8_t)((int64_t)x / (int64_t)n); }
DEVM_FN uint32_t devmAvg_u32(uint32_t x, int n) { return (uint32_t)((int64_t)x / (int64_t)n); }
DEVM_FN int32_t devmAvg_i32(int32_t x, int n) { return (int32_t)((int64_t)x / (int64_t)n); }
DEVM_FN uint64_t devmAvg_u64(uint64_t x, int n) { return x / (uint64_t)n; }
DEVM_FN int64_t devmAvg_i64(int64_t x, int n) { return x / (int64_t)n; }

DEVM_FN float devmAvgScale_f32(int n) { return 1.0f / (float)n; }
DEVM_FN double devmAvgScale_f64(int n) { return 1.0 / (double)n; }
DEVM_FN float devmAvgFinish_f32(float x, float scale) { return x * scale; }
DEVM_FN double devmAvgFinish_f64(double x, double scale) { return x * scale; }
DEVM_FN uint16_t devmAvgFinish_f16(uint16_t x, float scale) {
  return devmFloatToHalf(devmHalfToFloat(x) * scale);
}
DEVM_FN uint16_t devmAvgFinish_bf16(uint16_t x, float scale) {
  return devmFloatToBf16(devmBf16ToFloat(x) * scale);
}

#endif /* NCCLX_DEVMATH_H */
