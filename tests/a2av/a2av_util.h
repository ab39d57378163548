/* Shared by the tests/a2av programs: run a function as N forked ranks with a wall-clock
 * bound, and small checks. Public API only (plus tests/mp/mp_fork and mp_util). */
#ifndef A2AV_UTIL_H
#define A2AV_UTIL_H

#include <stddef.h>

#include "mp_fork.h"
#include "mp_util.h"
#include "ncclx/moe.h"

/* Forks nranks children running fn(rank, nranks, id, arg); each calls ncclxCommInitRank
 * itself. Returns 0 when every rank exited 0 within timeoutSec, 1 otherwise (naming the
 * ranks that failed, were killed or were still running). */
int a2avRunRanks(const char* what, int nranks, mpRankFn fn, void* arg, double timeoutSec);

/* ncclxCommInitRank or exit(1) with the reason. */
ncclxComm_t a2avInit(int rank, int nranks, ncclxUniqueId id);

/* "rank R: FAIL: <message>" on stderr; returns 1 (count it as one problem). */
int a2avFail(int rank, const char* fmt, ...) __attribute__((format(printf, 2, 3)));

/* Integer argument of argv[i], or exit(2) naming it. */
int a2avArgInt(const char* s, const char* what);
#endif
