/* ncclx-perf test data: element types, fill patterns whose reductions are exact in every
 * datatype, and the checks that count wrong elements. Included by ncclx-perf.c only.
 *
 * Every value the tool stores is a small non-negative integer, so sums, products, maxima and
 * minima computed in double on the host equal what any correct library must produce, in any
 * reduction order. Patterns repeat with a short period, so the expected value of a reduction
 * is a table lookup instead of an O(nranks) recomputation per element. */
#ifndef NCCLX_PERF_DATA_H
#define NCCLX_PERF_DATA_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ncclx.h"

typedef struct {
  const char* name;  /* as printed and as given to -d */
  const char* alias; /* nccl-tests spelling, also accepted by -d */
  ncclxDataType_t type;
  size_t size;
  double exactMax; /* largest accumulated magnitude this tool lets a sum reach */
  double eps;      /* unit roundoff for floating types, 0 for integers */
} PerfType;

/* int8 and uint8 both stop at 127: then the poison byte 0xFF is never a valid result. */
static const PerfType perfTypes[] = {
    {"float", "float32", ncclxFloat32, 4, 16777216.0, 0x1p-24},
    {"double", "float64", ncclxFloat64, 8, 9007199254740992.0, 0x1p-53},
    {"half", "float16", ncclxFloat16, 2, 2048.0, 0x1p-11},
    {"bfloat16", "bf16", ncclxBfloat16, 2, 256.0, 0x1p-8},
    {"int8", "char", ncclxInt8, 1, 127.0, 0},
    {"uint8", "uchar", ncclxUint8, 1, 127.0, 0},
    {"int32", "int", ncclxInt32, 4, 2147483647.0, 0},
    {"uint32", "uint", ncclxUint32, 4, 2147483647.0, 0},
    {"int64", "long", ncclxInt64, 8, 9007199254740992.0, 0},
    {"uint64", "ulong", ncclxUint64, 8, 9007199254740992.0, 0},
};
#define PERF_NUM_TYPES (sizeof(perfTypes) / sizeof(perfTypes[0]))

static const PerfType* perfTypeByName(const char* name) {
  for (size_t i = 0; i < PERF_NUM_TYPES; i++)
    if (strcmp(name, perfTypes[i].name) == 0 || strcmp(name, perfTypes[i].alias) == 0)
      return &perfTypes[i];
  return NULL;
}

/* ---- binary16 / bfloat16 without compiler support ---- */
/* Exact for every value binary16 represents in its normal range (all this tool stores). */
static uint16_t perfHalfFromDouble(double v) {
  float f = (float)v;
  uint32_t b;
  memcpy(&b, &f, sizeof b);
  uint16_t sign = (uint16_t)((b >> 16) & 0x8000u);
  uint32_t mag = b & 0x7fffffffu;
  if (mag == 0) return sign;
  int exp = (int)(mag >> 23) - 127 + 15;
  if (exp >= 31) return (uint16_t)(sign | 0x7c00u);
  if (exp <= 0) return sign; /* below the normal range: never stored by this tool */
  return (uint16_t)(sign | (uint16_t)(exp << 10) | (uint16_t)((mag >> 13) & 0x3ffu));
}

/* Decodes every bit pattern, so garbage results compare as wrong instead of misbehaving. */
static double perfHalfToDouble(uint16_t h) {
  int exp = (h >> 10) & 0x1f;
  int mant = h & 0x3ff;
  double v;
  if (exp == 0) v = ldexp((double)mant, -24);
  else if (exp == 31) v = mant ? NAN : INFINITY;
  else v = ldexp((double)(mant + 1024), exp - 25);
  return (h & 0x8000u) ? -v : v;
}

static uint16_t perfBf16FromDouble(double v) {
  float f = (float)v;
  uint32_t b;
  memcpy(&b, &f, sizeof b);
  return (uint16_t)(b >> 16); /* truncation is exact for the small integers stored */
}

static double perfBf16ToDouble(uint16_t h) {
  uint32_t b = (uint32_t)h << 16;
  float f;
  memcpy(&f, &b, sizeof f);
  return f;
}

/* v must be representable in t (a small non-negative integer). */
static void perfStore(void* buf, size_t i, ncclxDataType_t t, double v) {
  switch (t) {
    case ncclxInt8: ((int8_t*)buf)[i] = (int8_t)v; break;
    case ncclxUint8: ((uint8_t*)buf)[i] = (uint8_t)v; break;
    case ncclxInt32: ((int32_t*)buf)[i] = (int32_t)v; break;
    case ncclxUint32: ((uint32_t*)buf)[i] = (uint32_t)v; break;
    case ncclxInt64: ((int64_t*)buf)[i] = (int64_t)v; break;
    case ncclxUint64: ((uint64_t*)buf)[i] = (uint64_t)v; break;
    case ncclxFloat16: ((uint16_t*)buf)[i] = perfHalfFromDouble(v); break;
    case ncclxBfloat16: ((uint16_t*)buf)[i] = perfBf16FromDouble(v); break;
    case ncclxFloat32: ((float*)buf)[i] = (float)v; break;
    case ncclxFloat64: ((double*)buf)[i] = v; break;
    default: break;
  }
}

static double perfLoad(const void* buf, size_t i, ncclxDataType_t t) {
  switch (t) {
    case ncclxInt8: return ((const int8_t*)buf)[i];
    case ncclxUint8: return ((const uint8_t*)buf)[i];
    case ncclxInt32: return ((const int32_t*)buf)[i];
    case ncclxUint32: return ((const uint32_t*)buf)[i];
    case ncclxInt64: return (double)((const int64_t*)buf)[i];
    case ncclxUint64: return (double)((const uint64_t*)buf)[i];
    case ncclxFloat16: return perfHalfToDouble(((const uint16_t*)buf)[i]);
    case ncclxBfloat16: return perfBf16ToDouble(((const uint16_t*)buf)[i]);
    case ncclxFloat32: return ((const float*)buf)[i];
    case ncclxFloat64: return ((const double*)buf)[i];
    default: return NAN;
  }
}

/* ---- patterns ---- */
enum { PERF_PAT_PLAIN, PERF_PAT_SUM, PERF_PAT_PROD };

typedef struct {
  int kind;
  size_t period; /* value(rank, j) depends on j only through j % period */
} PerfPattern;

/* PLAIN (data movement, max, min): values 0..100 that differ between ranks, so data from
 * the wrong source or offset shows up. SUM (sum, avg): period k chosen so nranks*(k-1) stays
 * exact in the type. PROD: one rank in nranks+1 contributes 2, the others 1, so products are
 * 1 or 2 and still vary with the position. */
static PerfPattern perfPatternFor(int isReduction, ncclxRedOp_t op, const PerfType* t,
                                  int nranks) {
  PerfPattern p = {PERF_PAT_PLAIN, 101};
  if (!isReduction || op == ncclxMax || op == ncclxMin) return p;
  if (op == ncclxProd) {
    p.kind = PERF_PAT_PROD;
    p.period = (size_t)nranks + 1;
    return p;
  }
  double k = floor(t->exactMax / nranks) + 1;
  p.kind = PERF_PAT_SUM;
  p.period = k > 101 ? 101 : (size_t)k;
  return p;
}

static double perfGen(const PerfPattern* p, int rank, size_t j) {
  size_t m = j % p->period, r = (size_t)rank % p->period;
  switch (p->kind) {
    case PERF_PAT_SUM: return (double)((r + m) % p->period);
    case PERF_PAT_PROD: return (r + m) % p->period == 0 ? 2.0 : 1.0;
    default: return (double)(((size_t)rank % 101 * 37 + m * 13) % 101);
  }
}

/* buf[i] = value(rank, base + i) for i < count. */
static void perfFill(void* buf, size_t count, const PerfType* t, const PerfPattern* p, int rank,
                     size_t base) {
  for (size_t i = 0; i < count; i++) perfStore(buf, i, t->type, perfGen(p, rank, base + i));
}

/* What a check needs to know. table[m] is the reduction over all ranks at j % period == m. */
typedef struct {
  const PerfType* type;
  PerfPattern pat;
  int nranks;
  int approx; /* avg on a floating type: the library may pre-multiply by 1/n */
  double* table;
} PerfCheck;

/* Returns 0 on success, -1 when out of memory. */
static int perfCheckInit(PerfCheck* c, const PerfType* t, int isReduction, ncclxRedOp_t op,
                         int nranks) {
  c->type = t;
  c->pat = perfPatternFor(isReduction, op, t, nranks);
  c->nranks = nranks;
  c->approx = isReduction && op == ncclxAvg && t->eps > 0;
  c->table = NULL;
  if (!isReduction) return 0;
  c->table = malloc(c->pat.period * sizeof(double));
  if (!c->table) return -1;
  for (size_t m = 0; m < c->pat.period; m++) {
    double acc = perfGen(&c->pat, 0, m);
    for (int r = 1; r < nranks; r++) {
      double v = perfGen(&c->pat, r, m);
      switch (op) {
        case ncclxProd: acc *= v; break;
        case ncclxMax: acc = v > acc ? v : acc; break;
        case ncclxMin: acc = v < acc ? v : acc; break;
        default: acc += v; break;
      }
    }
    if (op == ncclxAvg) acc = t->eps > 0 ? acc / nranks : floor(acc / nranks);
    c->table[m] = acc;
  }
  return 0;
}

static void perfCheckFree(PerfCheck* c) {
  free(c->table);
  c->table = NULL;
}

static int perfMatches(const PerfCheck* c, double got, double want) {
  if (!c->approx) return got == want;
  /* Rounding of n pre-multiplied terms plus the sum: (n + 2) ulps, relative. NaN fails. */
  return fabs(got - want) <= (c->nranks + 2) * c->type->eps * 2 * fabs(want);
}

/* Wrong elements of a reduction result: buf[i] should be the reduction at index base + i. */
static size_t perfWrongReduced(const PerfCheck* c, const void* buf, size_t count, size_t base) {
  size_t wrong = 0;
  for (size_t i = 0; i < count; i++) {
    double want = c->table[(base + i) % c->pat.period];
    if (!perfMatches(c, perfLoad(buf, i, c->type->type), want)) wrong++;
  }
  return wrong;
}

/* Wrong elements of a copy: buf[i] should be rank src's value at index base + i. */
static size_t perfWrongCopied(const PerfCheck* c, const void* buf, size_t count, int src,
                              size_t base) {
  size_t wrong = 0;
  for (size_t i = 0; i < count; i++)
    if (perfLoad(buf, i, c->type->type) != perfGen(&c->pat, src, base + i)) wrong++;
  return wrong;
}

#endif
