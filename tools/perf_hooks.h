/* The core's hooks for ncclx-perf --calibrate and --tune: exported from libncclx.so but not
 * public API, so no public header has them. These prototypes repeat core/src/tune.h (the
 * tuner unit test includes both, so the compiler checks that they agree). */
#ifndef NCCLX_PERF_HOOKS_H
#define NCCLX_PERF_HOOKS_H

#include <stddef.h>

#include "ncclx.h"

/* Transport indices of the core (core/src/comm.h NCCLX_TP_*). */
#define PERF_TP_NET 0
#define PERF_TP_SHM 1

int ncclxTuneToolAlgoSupported(ncclxComm_t comm, int coll, int algo);
int ncclxTuneToolForceAlgo(int coll, int algo);
int ncclxTuneToolCommTopo(ncclxComm_t comm, int* nhosts, int* modelTransport,
                          int* peerTransport, const char** tunerName);
void ncclxTuneToolReduce(void* dst, const void* src, size_t count, ncclxDataType_t type);

#endif
