/* Choosing an algorithm and protocol per call: the default alpha-beta cost model, then the
 * tuner plugin (if any), then the NCCLX_ALGO override, masked by what can run. */
#ifndef NCCLX_TUNE_H
#define NCCLX_TUNE_H

#include "coll.h"

/* Per-communicator tuner plugin setup/teardown (no-op when no plugin is configured). */
void tuneCommInit(struct ncclxComm* comm);
void tuneCommFinalize(struct ncclxComm* comm);
/* Sets args->algo, args->proto and args->chunkBytes. Never fails: falls back to the
 * default choice. */
void tuneSelect(struct ncclxComm* comm, ncclxCollArgs* args);
/* The nccl-tests "size" of a call, which the tuner and profiler see as bytes. */
size_t tuneCallBytes(const struct ncclxComm* comm, const ncclxCollArgs* args);
#endif
