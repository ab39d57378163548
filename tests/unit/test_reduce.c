/* Reduction kernels (reduce.h): every datatype x op against a scalar reference, fp16/bf16
 * conversions (exact values, ties, Inf/NaN, subnormals; against the compiler's _Float16
 * where available), misaligned and aliased buffers, integer wraparound, Avg finish. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/reduce.h"

static int failures;
#define CHECK(cond, ...)                                              \
  do {                                                                \
    if (!(cond)) {                                                    \
      if (failures++ < 30) {                                          \
        fprintf(stderr, "%s:%d: CHECK(%s) failed: ", __FILE__, __LINE__, #cond); \
        fprintf(stderr, __VA_ARGS__);                                 \
        fprintf(stderr, "\n");                                        \
      }                                                               \
    }                                                                 \
  } while (0)

static uint64_t rngState = 0x9e3779b97f4a7c15ull;
static uint64_t rnd(void) { /* xorshift64*: reproducible */
  rngState ^= rngState >> 12;
  rngState ^= rngState << 25;
  rngState ^= rngState >> 27;
  return rngState * 2685821657736338717ull;
}

static float bitsToFloat(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}
static uint32_t floatToBits(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}

/* ---------------- conversions ---------------- */

/* Independent bf16 reference: pick the nearer of the two neighbours in double, ties to even. */
static uint16_t refFloatToBf16(float f) {
  uint32_t x = floatToBits(f);
  if (isnan(f)) return 0; /* caller handles NaN */
  uint32_t down = x & 0xffff0000u;
  uint32_t up = down + 0x10000u; /* next magnitude (may be Inf) */
  double dd = fabs((double)bitsToFloat(down) - (double)f);
  double du;
  if ((up & 0x7f800000u) == 0x7f800000u) /* Inf: treat as 2^128 for the distance */
    du = fabs(ldexp(1.0, 128) - fabs((double)f));
  else
    du = fabs((double)bitsToFloat(up) - (double)f);
  if (dd < du) return (uint16_t)(down >> 16);
  if (du < dd) return (uint16_t)(up >> 16);
  return (uint16_t)(((down >> 16) & 1u) ? (up >> 16) : (down >> 16));
}

static void testExactConversions(void) {
  struct { uint16_t h; float f; } halfs[] = {
      {0x0000, 0.0f},         {0x3c00, 1.0f},          {0xc000, -2.0f},
      {0x7bff, 65504.0f},     {0x0001, 0x1p-24f},      {0x03ff, 1023 * 0x1p-24f},
      {0x0400, 0x1p-14f},     {0x3555, 0.333251953125f}, {0xfbff, -65504.0f},
      {0x8001, -0x1p-24f},
  };
  for (size_t i = 0; i < sizeof halfs / sizeof halfs[0]; i++) {
    CHECK(ncclxHalfToFloat(halfs[i].h) == halfs[i].f, "half %04x -> %g", halfs[i].h,
          ncclxHalfToFloat(halfs[i].h));
    CHECK(ncclxFloatToHalf(halfs[i].f) == halfs[i].h, "float %g -> half %04x", halfs[i].f,
          ncclxFloatToHalf(halfs[i].f));
  }
  CHECK(ncclxFloatToHalf(-0.0f) == 0x8000, "-0");
  CHECK(floatToBits(ncclxHalfToFloat(0x8000)) == 0x80000000u, "half -0 -> float -0");
  CHECK(isinf(ncclxHalfToFloat(0x7c00)) && ncclxHalfToFloat(0x7c00) > 0, "+inf");
  CHECK(isinf(ncclxHalfToFloat(0xfc00)) && ncclxHalfToFloat(0xfc00) < 0, "-inf");
  CHECK(isnan(ncclxHalfToFloat(0x7e00)) && isnan(ncclxHalfToFloat(0x7c01)), "nan");
  CHECK(ncclxFloatToHalf(INFINITY) == 0x7c00 && ncclxFloatToHalf(-INFINITY) == 0xfc00, "inf");
  uint16_t hn = ncclxFloatToHalf(NAN);
  CHECK((hn & 0x7c00) == 0x7c00 && (hn & 0x3ff) != 0, "nan -> %04x", hn);
  /* Signalling NaN with payload only in the low float bits must stay NaN. */
  hn = ncclxFloatToHalf(bitsToFloat(0x7f800001u));
  CHECK((hn & 0x7c00) == 0x7c00 && (hn & 0x3ff) != 0, "snan -> %04x", hn);
  /* Overflow boundary: 65520 is the tie between 65504 and 2^16 -> rounds to Inf (even). */
  CHECK(ncclxFloatToHalf(65519.996f) == 0x7bff, "just below 65520");
  CHECK(ncclxFloatToHalf(65520.0f) == 0x7c00, "65520 -> inf");
  CHECK(ncclxFloatToHalf(1e10f) == 0x7c00, "big -> inf");
  /* Ties to even in the normal range. */
  CHECK(ncclxFloatToHalf(1.0f + 0x1p-11f) == 0x3c00, "1+2^-11 -> 1");
  CHECK(ncclxFloatToHalf(1.0f + 3 * 0x1p-11f) == 0x3c02, "1+3*2^-11 -> 1+2^-9");
  CHECK(ncclxFloatToHalf(1.0f + 0x1p-11f + 0x1p-20f) == 0x3c01, "just above a tie rounds up");
  /* Subnormal range: 2^-25 is the tie between 0 and 2^-24 (-> 0); a hair above rounds up. */
  CHECK(ncclxFloatToHalf(0x1p-25f) == 0x0000, "2^-25 -> 0");
  CHECK(ncclxFloatToHalf(0x1p-25f * 1.0000001f) == 0x0001, "above 2^-25 -> min subnormal");
  CHECK(ncclxFloatToHalf(3 * 0x1p-25f) == 0x0002, "1.5 ulp tie -> 2 (even)");
  CHECK(ncclxFloatToHalf(5 * 0x1p-25f) == 0x0002, "2.5 ulp tie -> 2 (even)");
  CHECK(ncclxFloatToHalf(0x1p-14f - 0x1p-26f) == 0x0400, "rounds up into the min normal");
  CHECK(ncclxFloatToHalf(1e-30f) == 0x0000 && ncclxFloatToHalf(-1e-30f) == 0x8000, "tiny");

  /* bf16 */
  CHECK(ncclxBf16ToFloat(0x3f80) == 1.0f && ncclxBf16ToFloat(0xc000) == -2.0f, "bf16 exact");
  CHECK(ncclxFloatToBf16(1.0f) == 0x3f80, "bf16 1");
  CHECK(ncclxFloatToBf16(1.0f + 0x1p-8f) == 0x3f80, "bf16 tie -> even (down)");
  CHECK(ncclxFloatToBf16(1.0f + 3 * 0x1p-8f) == 0x3f82, "bf16 tie -> even (up)");
  CHECK(ncclxFloatToBf16(bitsToFloat(0x7f7fffffu)) == 0x7f80, "FLT_MAX -> inf");
  CHECK(ncclxFloatToBf16(INFINITY) == 0x7f80 && ncclxFloatToBf16(-INFINITY) == 0xff80, "inf");
  uint16_t bn = ncclxFloatToBf16(bitsToFloat(0x7f800001u));
  CHECK((bn & 0x7f80) == 0x7f80 && (bn & 0x7f) != 0, "bf16 snan -> %04x", bn);
  CHECK(ncclxFloatToBf16(bitsToFloat(0x00000001u)) == 0x0000, "min float subnormal -> 0");
  CHECK(ncclxFloatToBf16(bitsToFloat(0x00008000u)) == 0x0000, "subnormal tie -> even 0");
  CHECK(ncclxFloatToBf16(bitsToFloat(0x00018000u)) == 0x0002, "subnormal tie -> even 2");
}

static void testHalfRoundTripAll(void) {
  for (uint32_t h = 0; h < 0x10000u; h++) {
    float f = ncclxHalfToFloat((uint16_t)h);
    if ((h & 0x7c00u) == 0x7c00u && (h & 0x3ffu)) {
      CHECK(isnan(f), "half %04x should be NaN", h);
      continue;
    }
    CHECK(ncclxFloatToHalf(f) == h, "half %04x round trip -> %04x", h, ncclxFloatToHalf(f));
#ifdef __FLT16_MAX__
    _Float16 r;
    uint16_t hh = (uint16_t)h;
    memcpy(&r, &hh, 2);
    CHECK(floatToBits((float)r) == floatToBits(f), "half %04x: %a vs compiler %a", h, f, (float)r);
#endif
  }
  for (uint32_t b = 0; b < 0x10000u; b++) {
    float f = ncclxBf16ToFloat((uint16_t)b);
    if (isnan(f)) continue;
    CHECK(ncclxFloatToBf16(f) == b, "bf16 %04x round trip", b);
  }
}

/* float -> 16-bit against independent references, over every exponent/upper-mantissa pattern
 * with low bits chosen around the rounding points, plus random bit patterns. */
static void testFloatTo16Sweep(void) {
  static const uint32_t halfLow[] = {0, 1, 0xfff, 0x1000, 0x1001, 0x1fff};
  static const uint32_t bfLow[] = {0, 1, 0x7fff, 0x8000, 0x8001, 0xffff};
  for (uint32_t hi = 0; hi < (1u << 19); hi++) {
    for (int k = 0; k < 6; k++) {
#ifdef __FLT16_MAX__
      float f = bitsToFloat((hi << 13) | halfLow[k]);
      if (!isnan(f)) {
        _Float16 r = (_Float16)f;
        uint16_t want;
        memcpy(&want, &r, 2);
        uint16_t got = ncclxFloatToHalf(f);
        CHECK(got == want, "float %a -> half %04x, compiler says %04x", f, got, want);
      }
#else
      (void)halfLow;
#endif
      float g = bitsToFloat(((hi << 13) & 0xffff0000u) | bfLow[k]);
      if (!isnan(g)) {
        uint16_t got = ncclxFloatToBf16(g), want = refFloatToBf16(g);
        CHECK(got == want, "float %a -> bf16 %04x, want %04x", g, got, want);
      }
    }
  }
  for (int i = 0; i < (1 << 21); i++) {
    float f = bitsToFloat((uint32_t)rnd());
    if (isnan(f)) continue;
#ifdef __FLT16_MAX__
    _Float16 r = (_Float16)f;
    uint16_t want;
    memcpy(&want, &r, 2);
    CHECK(ncclxFloatToHalf(f) == want, "random float %a -> half", f);
#endif
    CHECK(ncclxFloatToBf16(f) == refFloatToBf16(f), "random float %a -> bf16", f);
  }
}

/* ---------------- kernels ---------------- */

static const ncclxDataType_t allTypes[] = {ncclxInt8,    ncclxUint8,   ncclxInt32, ncclxUint32,
                                           ncclxInt64,   ncclxUint64,  ncclxFloat16,
                                           ncclxFloat32, ncclxFloat64, ncclxBfloat16};
static const ncclxRedOp_t allOps[] = {ncclxSum, ncclxProd, ncclxMax, ncclxMin, ncclxAvg};

static size_t tsize(ncclxDataType_t t) {
  switch (t) {
    case ncclxInt8: case ncclxUint8: return 1;
    case ncclxFloat16: case ncclxBfloat16: return 2;
    case ncclxInt32: case ncclxUint32: case ncclxFloat32: return 4;
    default: return 8;
  }
}

static double fmaxNan(double a, double b) { return (isnan(a) || isnan(b)) ? NAN : (a > b ? a : b); }
static double fminNan(double a, double b) { return (isnan(a) || isnan(b)) ? NAN : (a < b ? a : b); }

/* One element of a op b, written the slow obvious way. Integer sum/prod: compute in uint64
 * and keep the low bytes (two's complement wrap). */
static void refElem(ncclxDataType_t t, ncclxRedOp_t op, const void* pa, const void* pb, void* out) {
  if (op == ncclxAvg) op = ncclxSum;
  size_t sz = tsize(t);
  if (t == ncclxFloat32 || t == ncclxFloat64 || t == ncclxFloat16 || t == ncclxBfloat16) {
    double a, b;
    if (t == ncclxFloat32) { float x, y; memcpy(&x, pa, 4); memcpy(&y, pb, 4); a = x; b = y; }
    else if (t == ncclxFloat64) { memcpy(&a, pa, 8); memcpy(&b, pb, 8); }
    else {
      uint16_t x, y;
      memcpy(&x, pa, 2);
      memcpy(&y, pb, 2);
      a = t == ncclxFloat16 ? ncclxHalfToFloat(x) : ncclxBf16ToFloat(x);
      b = t == ncclxFloat16 ? ncclxHalfToFloat(y) : ncclxBf16ToFloat(y);
    }
    double r;
    if (t == ncclxFloat64) {
      r = op == ncclxSum ? a + b : op == ncclxProd ? a * b : op == ncclxMax ? fmaxNan(a, b) : fminNan(a, b);
      memcpy(out, &r, 8);
      return;
    }
    /* fp32 (and the fp32 compute of 16-bit types): round each op to float. */
    float fa = (float)a, fb = (float)b, fr;
    fr = op == ncclxSum ? fa + fb : op == ncclxProd ? fa * fb
                                  : (float)(op == ncclxMax ? fmaxNan(fa, fb) : fminNan(fa, fb));
    if (t == ncclxFloat32) { memcpy(out, &fr, 4); return; }
    uint16_t h = t == ncclxFloat16 ? ncclxFloatToHalf(fr) : ncclxFloatToBf16(fr);
    memcpy(out, &h, 2);
    return;
  }
  int isSigned = t == ncclxInt8 || t == ncclxInt32 || t == ncclxInt64;
  uint64_t ua = 0, ub = 0;
  memcpy(&ua, pa, sz); /* little endian: the low bytes */
  memcpy(&ub, pb, sz);
  int64_t sa = 0, sb = 0;
  if (isSigned) { /* sign-extend */
    int shift = (int)(64 - 8 * sz);
    sa = (int64_t)(ua << shift) >> shift;
    sb = (int64_t)(ub << shift) >> shift;
  }
  uint64_t r;
  switch (op) {
    case ncclxSum: r = ua + ub; break;
    case ncclxProd: r = ua * ub; break;
    case ncclxMax: r = isSigned ? (sa > sb ? ua : ub) : (ua > ub ? ua : ub); break;
    default: r = isSigned ? (sa < sb ? ua : ub) : (ua < ub ? ua : ub); break;
  }
  memcpy(out, &r, sz);
}

static void fillRandom(ncclxDataType_t t, ncclxRedOp_t op, unsigned char* p, size_t n) {
  size_t sz = tsize(t);
  for (size_t i = 0; i < n; i++) {
    unsigned char* e = p + i * sz;
    uint64_t bits = rnd();
    if (t == ncclxFloat32) {
      float f = (float)((int64_t)(bits % 20001) - 10000) / 64.0f;
      if (op == ncclxProd) f = 0.5f + (float)(bits % 1000) / 700.0f;
      if (bits % 97 == 0) f = NAN;
      if (bits % 89 == 0) f = -INFINITY;
      if (bits % 83 == 0) f = -0.0f;
      memcpy(e, &f, 4);
    } else if (t == ncclxFloat64) {
      double d = (double)((int64_t)(bits % 2000001) - 1000000) / 1024.0;
      if (bits % 97 == 0) d = NAN;
      if (bits % 89 == 0) d = INFINITY;
      memcpy(e, &d, 8);
    } else if (t == ncclxFloat16 || t == ncclxBfloat16) {
      float f = (float)((int64_t)(bits % 4001) - 2000) / 16.0f;
      if (op == ncclxProd) f = (float)((int64_t)(bits % 61) - 30) / 8.0f;
      if (bits % 97 == 0) f = NAN;
      uint16_t h = t == ncclxFloat16 ? ncclxFloatToHalf(f) : ncclxFloatToBf16(f);
      if (bits % 101 == 0) h = (uint16_t)(bits >> 20); /* any bit pattern, subnormals too */
      memcpy(e, &h, 2);
    } else {
      memcpy(e, &bits, sz); /* full range integers: sums and products wrap */
    }
  }
}

static int sameElem(ncclxDataType_t t, const void* x, const void* y) {
  if (t == ncclxFloat32) {
    float a, b;
    memcpy(&a, x, 4);
    memcpy(&b, y, 4);
    if (isnan(a) && isnan(b)) return 1;
  } else if (t == ncclxFloat64) {
    double a, b;
    memcpy(&a, x, 8);
    memcpy(&b, y, 8);
    if (isnan(a) && isnan(b)) return 1;
  } else if (t == ncclxFloat16 || t == ncclxBfloat16) {
    uint16_t a, b;
    memcpy(&a, x, 2);
    memcpy(&b, y, 2);
    uint16_t expMask = t == ncclxFloat16 ? 0x7c00 : 0x7f80;
    uint16_t manMask = t == ncclxFloat16 ? 0x03ff : 0x007f;
    if ((a & expMask) == expMask && (a & manMask) && (b & expMask) == expMask && (b & manMask))
      return 1;
  }
  return memcmp(x, y, tsize(t)) == 0;
}

/* alias: 0 = separate dst, 1 = dst is a, 2 = dst is b; off* misalign each pointer. */
static void checkKernel(ncclxDataType_t t, ncclxRedOp_t op, size_t n, int alias, size_t offD,
                        size_t offA, size_t offB) {
  size_t sz = tsize(t), bytes = n * sz;
  unsigned char* A = malloc(bytes + 16);
  unsigned char* B = malloc(bytes + 16);
  unsigned char* D = malloc(bytes + 16);
  unsigned char* want = malloc(bytes + 1);
  if (!A || !B || !D || !want) { fprintf(stderr, "out of memory\n"); exit(1); }
  unsigned char *a = A + offA, *b = B + offB, *d = D + offD;
  fillRandom(t, op, a, n);
  fillRandom(t, op, b, n);
  memset(D, 0xa5, bytes + 16);
  for (size_t i = 0; i < n; i++) refElem(t, op, a + i * sz, b + i * sz, want + i * sz);
  const unsigned char* guardSrc = NULL;
  if (alias == 1) d = a;
  if (alias == 2) d = b;
  if (alias == 0) guardSrc = D;
  ncclxReduce2(d, a, b, n, t, op);
  size_t bad = 0;
  for (size_t i = 0; i < n; i++)
    if (!sameElem(t, d + i * sz, want + i * sz)) bad++;
  CHECK(bad == 0, "%s %s n=%zu alias=%d off=%zu/%zu/%zu: %zu wrong elements", ncclxTypeName(t),
        ncclxOpName(op), n, alias, offD, offA, offB, bad);
  if (guardSrc) { /* bytes around dst untouched */
    for (size_t i = 0; i < offD; i++) CHECK(D[i] == 0xa5, "wrote before dst");
    for (size_t i = offD + bytes; i < bytes + 16; i++) CHECK(D[i] == 0xa5, "wrote past dst");
  }
  /* ReduceInPlace is dst = dst op src. */
  if (alias == 0) {
    fillRandom(t, op, a, n);
    for (size_t i = 0; i < n; i++) refElem(t, op, a + i * sz, b + i * sz, want + i * sz);
    ncclxReduceInPlace(a, b, n, t, op);
    bad = 0;
    for (size_t i = 0; i < n; i++)
      if (!sameElem(t, a + i * sz, want + i * sz)) bad++;
    CHECK(bad == 0, "InPlace %s %s n=%zu: %zu wrong", ncclxTypeName(t), ncclxOpName(op), n, bad);
  }
  free(A);
  free(B);
  free(D);
  free(want);
}

static void testAllKernels(void) {
  static const size_t counts[] = {0, 1, 3, 7, 16, 17, 63, 1000, 4099};
  for (size_t ti = 0; ti < sizeof allTypes / sizeof allTypes[0]; ti++)
    for (size_t oi = 0; oi < sizeof allOps / sizeof allOps[0]; oi++)
      for (size_t ci = 0; ci < sizeof counts / sizeof counts[0]; ci++) {
        ncclxDataType_t t = allTypes[ti];
        ncclxRedOp_t op = allOps[oi];
        size_t n = counts[ci];
        checkKernel(t, op, n, 0, 0, 0, 0);
        checkKernel(t, op, n, 0, 1, 3, 5); /* all misaligned */
        checkKernel(t, op, n, 0, 0, 0, 1); /* one misaligned */
        checkKernel(t, op, n, 1, 0, 0, 0);
        checkKernel(t, op, n, 2, 0, 0, 0);
        checkKernel(t, op, n, 1, 0, 1, 2);
      }
}

static void testWraparound(void) {
  int8_t a8 = 127, b8 = 1, r8;
  ncclxReduce2(&r8, &a8, &b8, 1, ncclxInt8, ncclxSum);
  CHECK(r8 == -128, "int8 127+1 = %d", r8);
  a8 = -128; b8 = -1;
  ncclxReduce2(&r8, &a8, &b8, 1, ncclxInt8, ncclxProd);
  CHECK(r8 == -128, "int8 -128*-1 = %d", r8);
  uint8_t u8a = 255, u8b = 1, u8r;
  ncclxReduce2(&u8r, &u8a, &u8b, 1, ncclxUint8, ncclxSum);
  CHECK(u8r == 0, "uint8 255+1 = %u", u8r);
  int32_t a32 = INT32_MAX, b32 = 1, r32;
  ncclxReduce2(&r32, &a32, &b32, 1, ncclxInt32, ncclxSum);
  CHECK(r32 == INT32_MIN, "int32 max+1");
  a32 = 65536; b32 = 65536;
  ncclxReduce2(&r32, &a32, &b32, 1, ncclxInt32, ncclxProd);
  CHECK(r32 == 0, "int32 2^16*2^16 = %d", r32);
  uint32_t u32a = 0xffffffffu, u32b = 0xffffffffu, u32r;
  ncclxReduce2(&u32r, &u32a, &u32b, 1, ncclxUint32, ncclxProd);
  CHECK(u32r == 1, "uint32 (2^32-1)^2 = %u", u32r);
  int64_t a64 = INT64_MAX, b64 = 1, r64;
  ncclxReduce2(&r64, &a64, &b64, 1, ncclxInt64, ncclxSum);
  CHECK(r64 == INT64_MIN, "int64 max+1");
  a64 = INT64_MIN; b64 = -1;
  ncclxReduce2(&r64, &a64, &b64, 1, ncclxInt64, ncclxProd);
  CHECK(r64 == INT64_MIN, "int64 min*-1");
  uint64_t u64a = UINT64_MAX, u64b = 2, u64r;
  ncclxReduce2(&u64r, &u64a, &u64b, 1, ncclxUint64, ncclxSum);
  CHECK(u64r == 1, "uint64 max+2");
  /* Signed max/min compare as signed, unsigned as unsigned. */
  a8 = -1; b8 = 1;
  ncclxReduce2(&r8, &a8, &b8, 1, ncclxInt8, ncclxMax);
  CHECK(r8 == 1, "int8 max(-1,1)");
  u8a = 0xff; u8b = 1;
  ncclxReduce2(&u8r, &u8a, &u8b, 1, ncclxUint8, ncclxMax);
  CHECK(u8r == 0xff, "uint8 max(255,1)");
  a64 = INT64_MIN; b64 = 0;
  ncclxReduce2(&r64, &a64, &b64, 1, ncclxInt64, ncclxMin);
  CHECK(r64 == INT64_MIN, "int64 min");
  /* fp16 overflow to Inf in a sum. */
  uint16_t h1 = 0x7bff, h2 = 0x7bff, hr; /* 65504 + 65504 */
  ncclxReduce2(&hr, &h1, &h2, 1, ncclxFloat16, ncclxSum);
  CHECK(hr == 0x7c00, "fp16 overflow -> %04x", hr);
  /* Float NaN propagates from either side for max/min. */
  float fa = NAN, fb = 1.0f, fr;
  ncclxReduce2(&fr, &fa, &fb, 1, ncclxFloat32, ncclxMax);
  CHECK(isnan(fr), "max(NaN,1)");
  ncclxReduce2(&fr, &fb, &fa, 1, ncclxFloat32, ncclxMin);
  CHECK(isnan(fr), "min(1,NaN)");
}

static void testAvg(void) {
  int8_t i8[] = {-7, 7, 127, -128};
  ncclxAvgFinish(i8, 4, ncclxInt8, 2);
  CHECK(i8[0] == -3 && i8[1] == 3 && i8[2] == 63 && i8[3] == -64, "int8 avg truncates");
  int8_t big[] = {-128, 127};
  ncclxAvgFinish(big, 2, ncclxInt8, 200); /* n beyond int8 range */
  CHECK(big[0] == 0 && big[1] == 0, "int8 avg by 200: %d %d", big[0], big[1]);
  int8_t one[] = {100};
  ncclxAvgFinish(one, 1, ncclxInt8, 1);
  CHECK(one[0] == 100, "avg by 1");
  uint64_t u64[] = {UINT64_MAX, 10};
  ncclxAvgFinish(u64, 2, ncclxUint64, 3);
  CHECK(u64[0] == UINT64_MAX / 3 && u64[1] == 3, "uint64 avg");
  int64_t i64[] = {INT64_MIN, -10};
  ncclxAvgFinish(i64, 2, ncclxInt64, 4);
  CHECK(i64[0] == INT64_MIN / 4 && i64[1] == -2, "int64 avg");
  uint32_t u32[] = {0xffffffffu};
  ncclxAvgFinish(u32, 1, ncclxUint32, 2);
  CHECK(u32[0] == 0x7fffffffu, "uint32 avg %u", u32[0]);
  float f[] = {3.0f, 1.0f, -6.0f};
  ncclxAvgFinish(f, 3, ncclxFloat32, 3);
  CHECK(f[0] == 3.0f * (1.0f / 3.0f) && f[2] == -6.0f * (1.0f / 3.0f), "fp32 avg");
  double d[] = {10.0};
  ncclxAvgFinish(d, 1, ncclxFloat64, 4);
  CHECK(d[0] == 2.5, "fp64 avg");
  uint16_t h[] = {ncclxFloatToHalf(6.0f), ncclxFloatToHalf(-1.0f)};
  ncclxAvgFinish(h, 2, ncclxFloat16, 4);
  CHECK(ncclxHalfToFloat(h[0]) == 1.5f && ncclxHalfToFloat(h[1]) == -0.25f, "fp16 avg");
  uint16_t bf[] = {ncclxFloatToBf16(6.0f)};
  ncclxAvgFinish(bf, 1, ncclxBfloat16, 4);
  CHECK(ncclxBf16ToFloat(bf[0]) == 1.5f, "bf16 avg");
  /* Misaligned avg buffer. */
  unsigned char raw[1 + 3 * 4];
  float src[3] = {8.0f, 4.0f, 2.0f};
  memcpy(raw + 1, src, sizeof src);
  ncclxAvgFinish(raw + 1, 3, ncclxFloat32, 2);
  memcpy(src, raw + 1, sizeof src);
  CHECK(src[0] == 4.0f && src[1] == 2.0f && src[2] == 1.0f, "misaligned avg");
}

int main(void) {
  testExactConversions();
  testHalfRoundTripAll();
  testFloatTo16Sweep();
  testAllKernels();
  testWraparound();
  testAvg();
  if (failures) {
    fprintf(stderr, "test_reduce: %d failures\n", failures);
    return 1;
  }
  printf("test_reduce: all passed\n");
  return 0;
}
