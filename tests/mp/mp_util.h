/* Helpers shared by the multi-process tests: deterministic values, element access for every
 * datatype (written independently of the library, so the tests are a second opinion),
 * guarded buffers, timing and fatal-call reporting. Public API only. */
#ifndef MP_UTIL_H
#define MP_UTIL_H

#include <stddef.h>
#include <stdint.h>

#include "ncclx.h"

/* Deterministic 64-bit mix of four inputs: the same on every rank for the same inputs. */
uint64_t mpHash(uint64_t a, uint64_t b, uint64_t c, uint64_t d);
double mpNow(void); /* monotonic seconds */

size_t mpTypeSize(ncclxDataType_t t);
const char* mpTypeName(ncclxDataType_t t);
const char* mpOpName(ncclxRedOp_t op);
int mpIsFloat(ncclxDataType_t t);
int mpIsSigned(ncclxDataType_t t); /* floats count as signed */

/* Element idx of buf as a double and back. Unaligned-safe (memcpy). Values used by the
 * tests are integers below 2^53, or floats representable in the type. */
double mpGet(const void* buf, size_t idx, ncclxDataType_t t);
void mpSet(void* buf, size_t idx, ncclxDataType_t t, double v);

uint16_t mpFloatToHalf(float f);
float mpHalfToFloat(uint16_t h);
uint16_t mpFloatToBf16(float f);
float mpBf16ToFloat(uint16_t b);

/* A buffer of `bytes` starting `offset` bytes after a malloc'd base (ncclxMemAlloc'd with
 * MP_MEMALLOC=1), with guard bytes before and after filled with MP_SENTINEL, so stray
 * writes are caught. */
#define MP_SENTINEL 0xA5
#define MP_GUARD 64
typedef struct {
  unsigned char* base;
  unsigned char* ptr;
  size_t bytes, offset;
  int memAlloc; /* base came from ncclxMemAlloc */
} mpBuf;
void mpBufAlloc(mpBuf* b, size_t bytes, size_t offset);
void mpBufFree(mpBuf* b);
void mpBufFillSentinel(mpBuf* b); /* the whole buffer, guards included */
/* 0 when the guards are intact, else the number of damaged bytes. */
size_t mpBufGuardDamage(const mpBuf* b);

/* Case-insensitive substring test. */
int mpContainsCI(const char* hay, const char* needle);

/* Abort the process (non-zero exit) when a call fails, naming rank, call and message. */
void mpFailCall(int rank, const char* expr, ncclxResult_t res, ncclxComm_t comm,
                const char* file, int line);
#define MP_CALL(rank, comm, expr)                                             \
  do {                                                                       \
    ncclxResult_t mp_res_ = (expr);                                          \
    if (mp_res_ != ncclxSuccess) mpFailCall((rank), #expr, mp_res_, (comm), __FILE__, __LINE__); \
  } while (0)

/* Rank and size as the launcher gave them (Open MPI variables), -1 when absent. */
int mpEnvInt(const char* name);
#endif
