/* The default tuner's alpha-beta-gamma cost model: its constants per transport (built-in,
 * or read from the calibration file `[tuner] model = PATH` that `ncclx-perf --calibrate`
 * writes) and the estimated time of every (collective, algorithm). See docs/tuning.md. */
#ifndef NCCLX_TUNE_MODEL_H
#define NCCLX_TUNE_MODEL_H

#include <stddef.h>

#include "comm/comm.h"
#include "ncclx/tuner.h"

/* One transport: a message of s bytes costs alphaUs + s * betaUsPerByte. */
typedef struct {
  double alphaUs;
  double betaUsPerByte;
} TuneLink;

typedef struct {
  TuneLink link[NCCLX_NUM_TP]; /* by NCCLX_TP_NET, NCCLX_TP_SHM */
  double gammaUsPerByte;       /* local reduction of s bytes into s bytes */
  char source[256];            /* "built-in" or the file it came from */
} TuneModel;

/* The built-in constants (measured on the development machine, see docs/tuning.md). */
void tuneModelDefaults(TuneModel* m);
/* Reads a calibration file: "key = value" lines, '#' or ';' comments, blank lines. Keys:
 * shm.alpha_us, shm.beta_us_per_byte, net.alpha_us, net.beta_us_per_byte,
 * gamma_us_per_byte; a key missing from the file keeps its built-in value. Every problem is
 * logged at WARN as "path:line: ..."; any problem rejects the whole file. Returns 0 with *m
 * filled (defaults + the file), or -1 with *m = the built-in defaults. */
int tuneModelRead(const char* path, TuneModel* m);
/* The model of this process: [tuner] model when set (read once), else the built-in one. */
const TuneModel* tuneModelGet(void);
/* Tests: forget the process model so the next tuneModelGet reads the config again (not
 * while collectives run). */
void tuneModelReset(void);
/* Changes with every tuneModelReset: part of the key of anything cached from the model. */
unsigned tuneModelGeneration(void);

/* Which link the model charges for the steps of a call on comm: shared memory when every
 * rank is on one host and shared memory is on, else the network (several hosts: the
 * inter-host steps set the pace of ring and tree alike). */
int tuneModelTransport(const struct ncclxComm* comm);

/* Estimated microseconds of (coll, algo) moving S bytes (the nccl-tests size) on p ranks
 * with pipeline chunks of `chunk` bytes over link tp; < 0 when the model has no entry.
 * Hierarchical algorithms are costed by collHierModelCost (coll_hier.h), which needs the
 * communicator's host layout; tune.c calls it with both links of the model. sharedCpus:
 * the host has fewer CPUs than ranks (commRanksOwnCpus() is false). */
double tuneModelCost(const TuneModel* m, int tp, ncclxCollType_t coll, int algo, int p,
                     double S, double chunk, int sharedCpus);
#endif
