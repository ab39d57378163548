#include "mp_util.h"

#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

/* One mixing round over distinct odd multiples: cheap enough for millions of elements per
 * case, and well spread for test data. */
uint64_t mpHash(uint64_t a, uint64_t b, uint64_t c, uint64_t d) {
  return mix64(a * 0x9e3779b97f4a7c15ull ^ b * 0xc2b2ae3d27d4eb4full ^ c * 0x165667b19e3779f9ull ^
               d * 0xd6e8feb86659fd93ull);
}

double mpNow(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

size_t mpTypeSize(ncclxDataType_t t) {
  switch (t) {
    case ncclxInt8: case ncclxUint8: return 1;
    case ncclxFloat16: case ncclxBfloat16: return 2;
    case ncclxInt32: case ncclxUint32: case ncclxFloat32: return 4;
    case ncclxInt64: case ncclxUint64: case ncclxFloat64: return 8;
    default: return 0;
  }
}

const char* mpTypeName(ncclxDataType_t t) {
  static const char* names[] = {"int8",  "uint8",   "int32",   "uint32",  "int64",
                                "uint64", "float16", "float32", "float64", "bfloat16"};
  return (unsigned)t < ncclxNumTypes ? names[t] : "?";
}

const char* mpOpName(ncclxRedOp_t op) {
  static const char* names[] = {"sum", "prod", "max", "min", "avg"};
  return (unsigned)op < ncclxNumOps ? names[op] : "-";
}

int mpIsFloat(ncclxDataType_t t) {
  return t == ncclxFloat16 || t == ncclxFloat32 || t == ncclxFloat64 || t == ncclxBfloat16;
}

int mpIsSigned(ncclxDataType_t t) {
  return t != ncclxUint8 && t != ncclxUint32 && t != ncclxUint64;
}

/* IEEE binary16, round to nearest even; written from the format definition. */
uint16_t mpFloatToHalf(float f) {
  uint32_t x;
  memcpy(&x, &f, sizeof x);
  uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
  uint32_t absx = x & 0x7fffffffu;
  if (absx >= 0x7f800000u) return (uint16_t)(sign | 0x7c00u | (absx > 0x7f800000u ? 0x200u : 0u));
  int e = (int)(absx >> 23) - 127 + 15;
  uint32_t mant = absx & 0x7fffffu;
  if (e >= 31) return (uint16_t)(sign | 0x7c00u);
  if (e <= 0) { /* subnormal half (or zero) */
    if (e < -10) return sign;
    mant |= 0x800000u;
    int shift = 14 - e;
    uint32_t h = mant >> shift, rem = mant & ((1u << shift) - 1u), halfway = 1u << (shift - 1);
    if (rem > halfway || (rem == halfway && (h & 1u))) h++;
    return (uint16_t)(sign | h);
  }
  uint32_t h = ((uint32_t)e << 10) | (mant >> 13), rem = mant & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) h++; /* a carry may reach inf: correct */
  return (uint16_t)(sign | h);
}

float mpHalfToFloat(uint16_t h) {
  int e = (h >> 10) & 0x1f;
  uint32_t m = h & 0x3ffu;
  float v;
  if (e == 0) {
    v = ldexpf((float)m, -24);
  } else if (e == 31) {
    v = m ? NAN : INFINITY;
  } else {
    uint32_t x = ((uint32_t)(e - 15 + 127) << 23) | (m << 13);
    memcpy(&v, &x, sizeof v);
  }
  return (h & 0x8000u) ? -v : v;
}

uint16_t mpFloatToBf16(float f) {
  uint32_t x;
  memcpy(&x, &f, sizeof x);
  if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40u); /* quiet NaN */
  x += 0x7fffu + ((x >> 16) & 1u);
  return (uint16_t)(x >> 16);
}

float mpBf16ToFloat(uint16_t b) {
  uint32_t x = (uint32_t)b << 16;
  float v;
  memcpy(&v, &x, sizeof v);
  return v;
}

#define LOAD(T)                                   \
  do {                                            \
    T v_;                                         \
    memcpy(&v_, p, sizeof v_);                    \
    return (double)v_;                            \
  } while (0)
#define STORE(T, val)                             \
  do {                                            \
    T v_ = (T)(val);                              \
    memcpy(p, &v_, sizeof v_);                    \
    return;                                       \
  } while (0)

double mpGet(const void* buf, size_t idx, ncclxDataType_t t) {
  const unsigned char* p = (const unsigned char*)buf + idx * mpTypeSize(t);
  switch (t) {
    case ncclxInt8: LOAD(int8_t);
    case ncclxUint8: LOAD(uint8_t);
    case ncclxInt32: LOAD(int32_t);
    case ncclxUint32: LOAD(uint32_t);
    case ncclxInt64: LOAD(int64_t);
    case ncclxUint64: LOAD(uint64_t);
    case ncclxFloat32: LOAD(float);
    case ncclxFloat64: LOAD(double);
    case ncclxFloat16: {
      uint16_t h;
      memcpy(&h, p, 2);
      return mpHalfToFloat(h);
    }
    case ncclxBfloat16: {
      uint16_t h;
      memcpy(&h, p, 2);
      return mpBf16ToFloat(h);
    }
    default: return NAN;
  }
}

void mpSet(void* buf, size_t idx, ncclxDataType_t t, double v) {
  unsigned char* p = (unsigned char*)buf + idx * mpTypeSize(t);
  switch (t) {
    case ncclxInt8: STORE(int8_t, (int64_t)v);
    case ncclxUint8: STORE(uint8_t, (uint64_t)v);
    case ncclxInt32: STORE(int32_t, (int64_t)v);
    case ncclxUint32: STORE(uint32_t, (uint64_t)v);
    case ncclxInt64: STORE(int64_t, v);
    case ncclxUint64: STORE(uint64_t, v);
    case ncclxFloat32: STORE(float, v);
    case ncclxFloat64: STORE(double, v);
    case ncclxFloat16: STORE(uint16_t, mpFloatToHalf((float)v));
    case ncclxBfloat16: STORE(uint16_t, mpFloatToBf16((float)v));
    default: return;
  }
}

/* MP_MEMALLOC=1: buffers from ncclxMemAlloc, whose large allocations same-host peers map
 * (single copy by the receiver, shm_mem.c), so messages start at every offset into them. */
static int useMemAlloc(void) {
  const char* v = getenv("MP_MEMALLOC");
  return v && strcmp(v, "1") == 0;
}

void mpBufAlloc(mpBuf* b, size_t bytes, size_t offset) {
  size_t total = MP_GUARD + offset + bytes + MP_GUARD;
  /* 64-byte aligned base, so `offset` alone decides the alignment the library sees. */
  b->base = NULL;
  b->memAlloc = useMemAlloc();
  if (b->memAlloc) {
    void* p = NULL;
    if (ncclxMemAlloc(&p, total) == ncclxSuccess) b->base = p;
  } else {
    b->base = aligned_alloc(64, (total + 63) / 64 * 64);
  }
  if (!b->base) {
    fprintf(stderr, "mp: out of memory allocating %zu bytes\n", total);
    exit(2);
  }
  b->ptr = b->base + MP_GUARD + offset;
  b->bytes = bytes;
  b->offset = offset;
  mpBufFillSentinel(b);
}

void mpBufFree(mpBuf* b) {
  if (b->memAlloc) ncclxMemFree(b->base);
  else free(b->base);
  b->base = b->ptr = NULL;
}

void mpBufFillSentinel(mpBuf* b) {
  memset(b->base, MP_SENTINEL, MP_GUARD + b->offset + b->bytes + MP_GUARD);
}

size_t mpBufGuardDamage(const mpBuf* b) {
  size_t bad = 0;
  for (unsigned char* q = b->base; q < b->ptr; q++) bad += *q != MP_SENTINEL;
  for (unsigned char* q = b->ptr + b->bytes; q < b->ptr + b->bytes + MP_GUARD; q++)
    bad += *q != MP_SENTINEL;
  return bad;
}

int mpContainsCI(const char* hay, const char* needle) {
  if (!hay || !needle) return 0;
  size_t n = strlen(needle);
  for (; *hay; hay++) {
    size_t i = 0;
    while (i < n && hay[i] && tolower((unsigned char)hay[i]) == tolower((unsigned char)needle[i])) i++;
    if (i == n) return 1;
  }
  return n == 0;
}

void mpFailCall(int rank, const char* expr, ncclxResult_t res, ncclxComm_t comm, const char* file,
                int line) {
  fprintf(stderr, "rank %d: FAILED %s at %s:%d -> %d (%s): %s\n", rank, expr, file, line, (int)res,
          ncclxGetErrorString(res), ncclxGetLastError(comm));
  fflush(stderr);
  fflush(stdout);
  exit(1);
}

int mpEnvInt(const char* name) {
  const char* s = getenv(name);
  if (!s || !*s) return -1;
  char* end;
  long v = strtol(s, &end, 10);
  return *end ? -1 : (int)v;
}
