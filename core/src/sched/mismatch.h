/* Online detection of mismatched collectives ([core] check_mismatch, off by default).
 *
 * Before each collective every rank contributes a small record (sequence number, a hash of
 * collective, count, datatype, root and reduction op, and those fields themselves) to a
 * bootstrap all-gather. Ranks whose records differ make every rank fail the call with
 * ncclxInvalidUsage and a message naming who called what, before any data moves: a
 * mismatch then costs one failed call instead of a hang or silently mixed data. */
#ifndef NCCLX_MISMATCH_H
#define NCCLX_MISMATCH_H

#include "coll/coll.h"

/* 0 = not read yet, 1 = off, 2 = on; [core] check_mismatch is read once per process. */
extern int ncclxMismatchState;
int mismatchReadConfig(void);

/* One load and a predictable branch when off. */
static inline int mismatchEnabled(void) {
  int s = __atomic_load_n(&ncclxMismatchState, __ATOMIC_RELAXED);
  if (__builtin_expect(s == 1, 1)) return 0;
  return s == 2 || mismatchReadConfig();
}

/* The hash every rank must agree on for a call (fields that do not apply are ignored). */
uint64_t mismatchHash(const ncclxCollArgs* a);

/* Exchange and compare. ncclxSuccess when all ranks agree; ncclxInvalidUsage (sticky on the
 * communicator, the message naming the ranks and their calls) when they do not; the
 * bootstrap's error when the exchange itself fails (a rank died or never arrived). Call
 * with execLock held, before the collective's first transfer. */
ncclxResult_t mismatchCheck(struct ncclxComm* comm, const ncclxCollArgs* a, uint64_t seq);

/* For tests: forget the cached setting so the next call reads the configuration again. */
void mismatchResetConfig(void);
#endif
