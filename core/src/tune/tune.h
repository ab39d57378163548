/* Choosing an algorithm and protocol per call: the default alpha-beta cost model, then the
 * tuner plugin (if any), then the NCCLX_ALGO override, masked by what can run. */
#ifndef NCCLX_TUNE_H
#define NCCLX_TUNE_H

#include "coll/coll.h"

/* Per-communicator tuner plugin setup/teardown (no-op when no plugin is configured). */
void tuneCommInit(struct ncclxComm* comm);
void tuneCommFinalize(struct ncclxComm* comm);
/* Sets args->algo, args->proto and args->chunkBytes. Never fails: falls back to the
 * default choice. */
void tuneSelect(struct ncclxComm* comm, ncclxCollArgs* args);
/* The nccl-tests "size" of a call, which the tuner and profiler see as bytes. */
size_t tuneCallBytes(const struct ncclxComm* comm, const ncclxCollArgs* args);

/* Hooks for ncclx-perf --calibrate and --tune only. They are exported from libncclx.so
 * (the tool links the shared library) but are not public API: no public header declares
 * them (tools/perf_hooks.h repeats these prototypes) and they may change with the tool.
 *
 * Whether the tuner may pick algo for coll on comm (collAlgoSupportedOn). */
int ncclxTuneToolAlgoSupported(ncclxComm_t comm, int coll, int algo);
/* Forces algo for every later call of coll in this process, over NCCLX_ALGO and any tuner
 * (-1 clears); an algorithm the tuner may not pick for a call is ignored for that call.
 * 0, or -1 for an index out of range. */
int ncclxTuneToolForceAlgo(int coll, int algo);
/* The communicator's host count, the link the model charges (NCCLX_TP_SHM/NET), per peer
 * the transport that carries its traffic (nranks entries), and the name of its tuner plugin
 * (NULL: the default tuner). Any pointer may be NULL. 0, or -1 for a bad handle. */
int ncclxTuneToolCommTopo(ncclxComm_t comm, int* nhosts, int* modelTransport,
                          int* peerTransport, const char** tunerName);
/* dst += src with the core's reduction kernel (sum), for measuring gamma. */
void ncclxTuneToolReduce(void* dst, const void* src, size_t count, ncclxDataType_t type);
#endif
