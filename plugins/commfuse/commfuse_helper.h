/* CommFuse progress helpers: a thread that runs one communication job at a time while the
 * thread that handed it over computes.
 *
 * Helpers are pooled process-wide (a fused call borrows one and returns it), so a call
 * costs condition-variable handshakes (one job per call for RING_P2P, one per step for the
 * other schedules), not a thread creation. An idle helper
 * sleeps on its condition variable, and a waiting caller sleeps too: spinning briefly
 * before sleeping, on either side, made a step 2-4x slower on a 2-core machine (the
 * spinner holds the core that another rank's thread needs), so neither side spins.
 * The pool forgets its threads in a forked child (they do not exist there). */
#ifndef NCCLX_COMMFUSE_HELPER_H
#define NCCLX_COMMFUSE_HELPER_H

#include <stddef.h>

#include "ncclx.h"

struct fuseHelper;
typedef ncclxResult_t (*fuseJobFn)(void* arg);

/* Borrow an idle helper (creating one if none is idle). */
ncclxResult_t fuseHelperAcquire(struct fuseHelper** out);
/* Return it to the pool; no job may be running. */
void fuseHelperRelease(struct fuseHelper* h);
/* Run fn(arg) on the helper; at most one job at a time per helper. */
void fuseHelperStart(struct fuseHelper* h, fuseJobFn fn, void* arg);
/* Whether a started job has not been waited for yet. */
int fuseHelperBusy(const struct fuseHelper* h);
/* Wait for the job to end and return its result; on failure, the helper thread's error
 * message goes into err. Waits at most boundSec (<= 0: no bound) and then returns
 * ncclxInProgress with the job still running: the caller decides how to stop it. */
ncclxResult_t fuseHelperWait(struct fuseHelper* h, double boundSec, char* err, size_t errSize);
#endif
