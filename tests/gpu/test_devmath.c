/* devmath.h (the arithmetic the CUDA kernels run) against reduce.c (the CPU path), bit for
 * bit: every fp16 and bf16 value through both conversions, a sweep of fp32 values through
 * the narrowing ones, and every datatype x op (Avg finish included) over random values plus
 * the awkward ones (NaN with payloads, +-0, +-Inf, subnormals, extremes, wraparound).
 * Built as plain C: this is the CPU half of the GPU path's tests and runs everywhere. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/devmath.h"
#include "util/reduce.h"

static int failures;
#define CHECK(cond, ...)                                                           \
  do {                                                                             \
    if (!(cond)) {                                                                 \
      if (failures++ < 30) {                                                       \
        fprintf(stderr, "%s:%d: CHECK(%s) failed: ", __FILE__, __LINE__, #cond);   \
        fprintf(stderr, __VA_ARGS__);                                              \
        fprintf(stderr, "\n");                                                     \
      }                                                                            \
    }                                                                              \
  } while (0)

static uint64_t rngState = 0x2545f4914f6cdd1dull;
static uint64_t rnd(void) { /* xorshift64*: reproducible */
  rngState ^= rngState >> 12;
  rngState ^= rngState << 25;
  rngState ^= rngState >> 27;
  return rngState * 2685821657736338717ull;
}

static uint32_t bitsOf(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}
static float floatOf(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}

/* ---------------- conversions ---------------- */

static void testWidening(void) {
  for (uint32_t h = 0; h <= 0xffffu; h++) {
    uint32_t dev = bitsOf(devmHalfToFloat((uint16_t)h)), cpu = bitsOf(ncclxHalfToFloat((uint16_t)h));
    CHECK(dev == cpu, "half %04x -> float: devmath %08x, reduce.c %08x", h, dev, cpu);
    dev = bitsOf(devmBf16ToFloat((uint16_t)h));
    cpu = bitsOf(ncclxBf16ToFloat((uint16_t)h));
    CHECK(dev == cpu, "bf16 %04x -> float: devmath %08x, reduce.c %08x", h, dev, cpu);
  }
}

static void checkNarrowing(uint32_t x) {
  float f = floatOf(x);
  uint16_t dev = devmFloatToHalf(f), cpu = ncclxFloatToHalf(f);
  CHECK(dev == cpu, "float %08x -> half: devmath %04x, reduce.c %04x", x, dev, cpu);
  dev = devmFloatToBf16(f);
  cpu = ncclxFloatToBf16(f);
  CHECK(dev == cpu, "float %08x -> bf16: devmath %04x, reduce.c %04x", x, dev, cpu);
}

static void testNarrowing(void) {
  /* Every 251st bit pattern covers all exponents and signs (NaNs included) ... */
  for (uint64_t x = 0; x <= 0xffffffffull; x += 251) checkNarrowing((uint32_t)x);
  /* ... and around each exponent the rounding boundaries of both formats: exact, one ulp
   * either side of the halfway points, all sticky-bit patterns that decide ties. */
  static const uint32_t low[] = {0,      1,      0xfff,  0x1000, 0x1001, 0x1fff,
                                 0x7fff, 0x8000, 0x8001, 0xffff, 0x2000, 0x3000};
  for (uint32_t sign = 0; sign < 2; sign++)
    for (uint32_t exp = 0; exp < 256; exp++)
      for (uint32_t k = 0; k < 64; k++)
        for (size_t i = 0; i < sizeof low / sizeof low[0]; i++) {
          uint32_t mantHigh = (uint32_t)(rnd() & 0x7f0000u);
          if (k == 0) mantHigh = 0;
          if (k == 1) mantHigh = 0x7f0000u;
          checkNarrowing(sign << 31 | exp << 23 | mantHigh | ((low[i] + k * 0x2000u) & 0xffffu));
        }
}

/* ---------------- reductions ---------------- */

static const ncclxDataType_t allTypes[] = {ncclxInt8,    ncclxUint8,   ncclxInt32, ncclxUint32,
                                           ncclxInt64,   ncclxUint64,  ncclxFloat16,
                                           ncclxFloat32, ncclxFloat64, ncclxBfloat16};

/* Element-wise loop over devmath functions: what the device kernels do per element. */
#define LOOP2(T, FN)                                  \
  for (size_t i = 0; i < n; i++) {                    \
    T x, y, r;                                        \
    memcpy(&x, a + i * sizeof(T), sizeof(T));         \
    memcpy(&y, b + i * sizeof(T), sizeof(T));         \
    r = FN(x, y);                                     \
    memcpy(d + i * sizeof(T), &r, sizeof(T));         \
  }                                                   \
  return 1

/* Signed integers: sum/prod are the unsigned functions on the same bits. */
#define INT_ROW(S, U, STAG, UTAG)                     \
  switch (op) {                                       \
    case ncclxSum:                                    \
    case ncclxAvg: LOOP2(U, devmSum_##UTAG);          \
    case ncclxProd: LOOP2(U, devmProd_##UTAG);        \
    case ncclxMax: LOOP2(S, devmMax_##STAG);          \
    case ncclxMin: LOOP2(S, devmMin_##STAG);          \
    default: return 0;                                \
  }
#define FLOAT_ROW(T, TAG)                             \
  switch (op) {                                       \
    case ncclxSum:                                    \
    case ncclxAvg: LOOP2(T, devmSum_##TAG);           \
    case ncclxProd: LOOP2(T, devmProd_##TAG);         \
    case ncclxMax: LOOP2(T, devmMax_##TAG);           \
    case ncclxMin: LOOP2(T, devmMin_##TAG);           \
    default: return 0;                                \
  }

static int devmReduce(char* d, const char* a, const char* b, size_t n, ncclxDataType_t t,
                      ncclxRedOp_t op) {
  switch (t) {
    case ncclxInt8: INT_ROW(int8_t, uint8_t, i8, u8)
    case ncclxUint8: INT_ROW(uint8_t, uint8_t, u8, u8)
    case ncclxInt32: INT_ROW(int32_t, uint32_t, i32, u32)
    case ncclxUint32: INT_ROW(uint32_t, uint32_t, u32, u32)
    case ncclxInt64: INT_ROW(int64_t, uint64_t, i64, u64)
    case ncclxUint64: INT_ROW(uint64_t, uint64_t, u64, u64)
    case ncclxFloat16: FLOAT_ROW(uint16_t, f16)
    case ncclxBfloat16: FLOAT_ROW(uint16_t, bf16)
    case ncclxFloat32: FLOAT_ROW(float, f32)
    case ncclxFloat64: FLOAT_ROW(double, f64)
    default: return 0;
  }
}

#define LOOP1(T, EXPR)                                \
  for (size_t i = 0; i < count; i++) {                \
    T x;                                              \
    memcpy(&x, d + i * sizeof(T), sizeof(T));         \
    x = EXPR;                                         \
    memcpy(d + i * sizeof(T), &x, sizeof(T));         \
  }                                                   \
  return 1

static int devmAvgFinish(char* d, size_t count, ncclxDataType_t t, int n) {
  if (n <= 1) return 1; /* reduce.c leaves the data alone too */
  switch (t) {
    case ncclxInt8: LOOP1(int8_t, devmAvg_i8(x, n));
    case ncclxUint8: LOOP1(uint8_t, devmAvg_u8(x, n));
    case ncclxInt32: LOOP1(int32_t, devmAvg_i32(x, n));
    case ncclxUint32: LOOP1(uint32_t, devmAvg_u32(x, n));
    case ncclxInt64: LOOP1(int64_t, devmAvg_i64(x, n));
    case ncclxUint64: LOOP1(uint64_t, devmAvg_u64(x, n));
    case ncclxFloat16: LOOP1(uint16_t, devmAvgFinish_f16(x, devmAvgScale_f32(n)));
    case ncclxBfloat16: LOOP1(uint16_t, devmAvgFinish_bf16(x, devmAvgScale_f32(n)));
    case ncclxFloat32: LOOP1(float, devmAvgFinish_f32(x, devmAvgScale_f32(n)));
    case ncclxFloat64: LOOP1(double, devmAvgFinish_f64(x, devmAvgScale_f64(n)));
    default: return 0;
  }
}

/* Awkward values of each width, as bit patterns. */
static const uint16_t special16[] = {0x0000, 0x8000, 0x7c00, 0xfc00, 0x7e00, 0x7c01, 0xfe55,
                                     0x0001, 0x83ff, 0x0400, 0x7bff, 0xfbff, 0x3c00, 0x7f80,
                                     0xff80, 0x7fc0, 0x7f81, 0x0080, 0x007f, 0x3f80};
static const uint32_t special32[] = {0x00000000, 0x80000000, 0x7f800000, 0xff800000, 0x7fc00000,
                                     0x7f800001, 0xffc12345, 0x00000001, 0x807fffff, 0x00800000,
                                     0x7f7fffff, 0xff7fffff, 0x3f800000, 0x477fe000, 0x477ff000,
                                     0x33000000, 0x33000001, 0x387fe000, 0x80000001, 0x7fffffff};
static const uint64_t special64[] = {0x0000000000000000ull, 0x8000000000000000ull,
                                     0x7ff0000000000000ull, 0xfff0000000000000ull,
                                     0x7ff8000000000000ull, 0x7ff0000000000001ull,
                                     0x0000000000000001ull, 0x7fefffffffffffffull,
                                     0x3ff0000000000000ull, 0xffffffffffffffffull,
                                     0x7fffffffffffffffull, 0x000fffffffffffffull};

/* Element i of a test input: random bits, a small "nice" number, or an awkward value. */
static void fillValue(char* p, size_t size, ncclxDataType_t t) {
  uint64_t r = rnd(), kind = rnd() % 8;
  if (kind == 0) { /* awkward */
    if (size == 1) r = (uint64_t)(int64_t)(int8_t)(r % 2 ? 0x80 : 0x7f);
    else if (size == 2) r = special16[r % (sizeof special16 / sizeof special16[0])];
    else if (size == 4) r = special32[r % (sizeof special32 / sizeof special32[0])];
    else r = special64[r % (sizeof special64 / sizeof special64[0])];
  } else if (kind < 4) { /* small values: sums and products stay exact and comparable */
    int v = (int)(r % 33) - 16;
    if (t == ncclxFloat32) {
      float f = (float)v * 0.25f;
      memcpy(p, &f, 4);
      return;
    }
    if (t == ncclxFloat64) {
      double f = (double)v * 0.25;
      memcpy(p, &f, 8);
      return;
    }
    if (t == ncclxFloat16) r = ncclxFloatToHalf((float)v * 0.25f);
    else if (t == ncclxBfloat16) r = ncclxFloatToBf16((float)v * 0.25f);
    else r = (uint64_t)(int64_t)v;
  }
  memcpy(p, &r, size); /* little-endian: the low bytes */
}

static const char* typeName(ncclxDataType_t t) { return ncclxTypeName(t); }

static int isNanBits(const char* p, ncclxDataType_t t) {
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

/* Equal bits; except that a NaN made by arithmetic (sum, prod, avg) matches any NaN: which
 * operand's payload survives NaN + NaN depends on the compiler's operand order on the CPU,
 * and GPUs return the canonical NaN. Max and min select an operand, so they match exactly. */
static int sameResult(const char* x, const char* y, ncclxDataType_t t, ncclxRedOp_t op) {
  if (memcmp(x, y, ncclxTypeSize(t)) == 0) return 1;
  return (op == ncclxSum || op == ncclxProd || op == ncclxAvg) && isNanBits(x, t) && isNanBits(y, t);
}

static void testReductions(void) {
  enum { N = 4099 }; /* odd: no size or alignment coincidence hides a bug */
  const ncclxRedOp_t ops[] = {ncclxSum, ncclxProd, ncclxMax, ncclxMin, ncclxAvg};
  for (size_t ti = 0; ti < sizeof allTypes / sizeof allTypes[0]; ti++) {
    ncclxDataType_t t = allTypes[ti];
    size_t es = ncclxTypeSize(t);
    char* a = malloc(N * es);
    char* b = malloc(N * es);
    char* ref = malloc(N * es);
    char* dev = malloc(N * es);
    if (!a || !b || !ref || !dev) {
      fprintf(stderr, "out of memory\n");
      exit(1);
    }
    for (size_t oi = 0; oi < sizeof ops / sizeof ops[0]; oi++) {
      ncclxRedOp_t op = ops[oi];
      for (size_t i = 0; i < N; i++) {
        fillValue(a + i * es, es, t);
        fillValue(b + i * es, es, t);
      }
      ncclxReduce2(ref, a, b, N, t, op);
      CHECK(devmReduce(dev, a, b, N, t, op), "no devmath function for %s %s", typeName(t), ncclxOpName(op));
      for (size_t i = 0; i < N; i++) {
        if (!sameResult(ref + i * es, dev + i * es, t, op)) {
          uint64_t x = 0, y = 0, r = 0, v = 0;
          memcpy(&x, a + i * es, es), memcpy(&y, b + i * es, es);
          memcpy(&r, ref + i * es, es), memcpy(&v, dev + i * es, es);
          CHECK(0, "%s %s element %zu: a=%llx b=%llx reduce.c=%llx devmath=%llx", typeName(t),
                ncclxOpName(op), i, (unsigned long long)x, (unsigned long long)y,
                (unsigned long long)r, (unsigned long long)v);
        }
      }
      if (op != ncclxAvg) continue;
      /* Avg finish on the sums, for rank counts that make int8 division and fp scales
       * interesting (n above INT8_MAX too). */
      static const int ns[] = {1, 2, 3, 7, 8, 255, 1000};
      for (size_t k = 0; k < sizeof ns / sizeof ns[0]; k++) {
        memcpy(dev, ref, N * es);
        char* cpu = b; /* b is free now */
        memcpy(cpu, ref, N * es);
        ncclxAvgFinish(cpu, N, t, ns[k]);
        CHECK(devmAvgFinish(dev, N, t, ns[k]), "no avg finish for %s", typeName(t));
        for (size_t i = 0; i < N; i++) {
          if (!sameResult(cpu + i * es, dev + i * es, t, ncclxAvg)) {
            uint64_t x = 0, r = 0, v = 0;
            memcpy(&x, ref + i * es, es), memcpy(&r, cpu + i * es, es), memcpy(&v, dev + i * es, es);
            CHECK(0, "%s avg finish n=%d element %zu: x=%llx reduce.c=%llx devmath=%llx",
                  typeName(t), ns[k], i, (unsigned long long)x, (unsigned long long)r,
                  (unsigned long long)v);
          }
        }
      }
    }
    free(a), free(b), free(ref), free(dev);
  }
}

/* A few values checked against known answers, so the test would notice if reduce.c and
 * devmath drifted together. */
static void testKnownValues(void) {
  CHECK(devmSum_u8(200, 100) == 44, "u8 wrap");
  CHECK(devmProd_u8(16, 16) == 0, "u8 prod wrap");
  CHECK(devmMax_i8(-128, 127) == 127 && devmMin_i8(-128, 127) == -128, "i8 max/min");
  CHECK(devmProd_u64(1ull << 63, 2) == 0, "u64 prod wrap");
  CHECK(devmSum_f16(0x3c00, 0x3c00) == 0x4000, "1+1=2 in half");
  CHECK(devmSum_f16(0x7bff, 0x7bff) == 0x7c00, "65504+65504 = inf in half");
  CHECK(devmSum_bf16(0x3f80, 0x3f80) == 0x4000, "1+1=2 in bf16");
  CHECK(devmMax_f16(0x7e00, 0x3c00) == 0x7e00 && devmMax_f16(0x3c00, 0x7e00) == 0x7e00, "NaN wins in max");
  CHECK(devmMin_f32(1.0f, 2.0f) == 1.0f && devmMax_f64(-1.0, -2.0) == -1.0, "f32/f64 min/max");
  CHECK(devmAvg_i8(-128, 255) == 0 && devmAvg_u8(255, 2) == 127, "int avg");
  CHECK(devmFloatToHalf(0x1p-25f) == 0x0000 && devmFloatToHalf(0x1.8p-25f) == 0x0001, "half subnormal ties");
}

int main(void) {
  testKnownValues();
  testWidening();
  testNarrowing();
  testReductions();
  if (failures) {
    fprintf(stderr, "test_devmath: %d failure(s)\n", failures);
    return 1;
  }
  printf("test_devmath: devmath.h matches reduce.c for every datatype and op\n");
  return 0;
}
