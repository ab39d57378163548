/*
 * ncclx tuner plugin ABI, version 1.
 *
 * A tuner picks the algorithm, protocol and chunking of each collective. Export
 *
 *     const ncclxTuner_v1_t ncclxTunerPlugin_v1 = { .name = "rules",
 *                                                   .abiVersion = NCCLX_TUNER_ABI_VERSION, ... };
 *
 * as libncclx-tuner-NAME.so and set `[tuner] plugin = NAME`.
 *
 * For every collective the core fills a cost table of estimated microseconds per
 * (algorithm, protocol), with NCCLX_TUNER_IGNORE (< 0) where the pair cannot run this call
 * (wrong collective, rank count, size). getCollInfo may lower or raise any non-negative entry
 * (0 forces a choice) or set one to NCCLX_TUNER_IGNORE; it must never revive an ignored one:
 * the core re-checks and falls back to its own choice. The core picks the cheapest
 * non-negative entry. An error from getCollInfo is logged once and the default choice used.
 * The answer must be a function of the query: a communicator asks once per call shape
 * (collective, bytes, datatype, op) and reuses the choice for later calls of that shape.
 *
 * Every algorithm the tuner can pick is in the correctness suite, so a tuner can make a
 * collective slow but never wrong.
 */
#ifndef NCCLX_TUNER_H
#define NCCLX_TUNER_H

#include "plugin.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Version 1 is frozen (docs/plugin-guide.md, "ABI stability"): changes come as a new version. */
#define NCCLX_TUNER_ABI_VERSION 1
#define NCCLX_TUNER_IGNORE (-1.0f)

typedef enum {
  NCCLX_COLL_BROADCAST = 0,
  NCCLX_COLL_REDUCE = 1,
  NCCLX_COLL_ALLGATHER = 2,
  NCCLX_COLL_REDUCESCATTER = 3,
  NCCLX_COLL_ALLREDUCE = 4,
  NCCLX_COLL_ALLTOALL = 5,
  NCCLX_COLL_ALLTOALLV = 6,
  NCCLX_COLL_BARRIER = 7,
  NCCLX_NUM_COLLS = 8
} ncclxCollType_t;

/* Algorithm indices are stable ABI; new ones are appended. */
typedef enum {
  NCCLX_ALGO_RING = 0,               /* allreduce, allgather, reducescatter, broadcast */
  NCCLX_ALGO_RECURSIVE_DOUBLING = 1, /* allreduce, allgather */
  NCCLX_ALGO_RABENSEIFNER = 2,       /* allreduce: recursive halving RS + doubling AG */
  NCCLX_ALGO_TREE = 3,               /* binomial tree: broadcast, reduce, allreduce */
  NCCLX_ALGO_BRUCK = 4,              /* allgather, alltoall */
  NCCLX_ALGO_PAIRWISE = 5,           /* alltoall(v), reducescatter */
  NCCLX_ALGO_LINEAR = 6,             /* everything posted at once: alltoall(v), allgather,
                                        reducescatter, allreduce (and the LL protocol) */
  NCCLX_ALGO_HIERARCHICAL = 7,       /* intra-host then inter-host */
  NCCLX_NUM_ALGOS = 16               /* table width; unused indices stay IGNORE */
} ncclxAlgo_t;

typedef enum {
  NCCLX_PROTO_SIMPLE = 0, /* bandwidth: pipelined chunks */
  NCCLX_PROTO_LL = 1,     /* low latency: data and flag together (shared memory) */
  NCCLX_NUM_PROTOS = 4
} ncclxProto_t;

typedef struct {
  uint64_t commHash;
  int rank, nranks;
  int nhosts;          /* distinct hosts in the communicator */
  int ranksPerHostMax; /* largest number of ranks on one host */
  const char* commName;
} ncclxTunerCommInfo_v1_t;

typedef struct {
  ncclxCollType_t coll;
  size_t bytes;            /* the per-rank message size nccl-tests prints as "size" */
  ncclxDataType_t datatype;
  ncclxRedOp_t op;         /* ncclxSum for collectives without reduction */
  int nranks, nhosts;
} ncclxTunerQuery_v1_t;

typedef struct {
  const char* name;
  int abiVersion; /* NCCLX_TUNER_ABI_VERSION */
  /* Per communicator. An error here disables the plugin for that communicator. */
  ncclxResult_t (*init)(void** ctx, const ncclxTunerCommInfo_v1_t* info,
                        const ncclxPluginEnv_t* env);
  /* costTable is float[NCCLX_NUM_ALGOS][NCCLX_NUM_PROTOS], row-major, contiguous.
   * *chunkBytes and *nChannels come in as the core's defaults; leaving them or writing 0
   * keeps those. A chunk size must be the same on every rank for the same call (rules files
   * are per cluster, so they are); the core clamps it to [4 KiB, transport maximum]. */
  ncclxResult_t (*getCollInfo)(void* ctx, const ncclxTunerQuery_v1_t* query, float* costTable,
                               size_t* chunkBytes, int* nChannels);
  ncclxResult_t (*finalize)(void* ctx);
} ncclxTuner_v1_t;

typedef ncclxTuner_v1_t ncclxTuner_t;
#define NCCLX_TUNER_PLUGIN_SYMBOL "ncclxTunerPlugin_v1"

/* Optional, version 1: CommFuse's schedule for calls made with NCCLX_FUSE_AUTO (ncclx/fuse.h).
 * A tuner that wants to pin it also exports
 *
 *     const ncclxTunerFuse_v1_t ncclxTunerFuse_v1 = {.abiVersion = NCCLX_TUNER_FUSE_ABI_VERSION,
 *                                                     .getFuseSchedule = ...};
 *
 * next to ncclxTunerPlugin_v1; the core looks it up when it loads the tuner, and tuners
 * without it load as before. getFuseSchedule gets the tuner's per-communicator ctx (from
 * init). Write *algo (an ncclxFuseAlgo_t other than AUTO) and *pieces (SLICED's slices,
 * RING_P2P's pieces; 0 = 1) to pin the schedule, or leave *algo at -1 (or return an error)
 * to keep the core's choice. The answer must be the same on every rank for the same query. */
#define NCCLX_TUNER_FUSE_ABI_VERSION 1
#define NCCLX_TUNER_FUSE_SYMBOL "ncclxTunerFuse_v1"

typedef struct {
  int kind;     /* 0 all-gather + compute, 1 compute + reduce-scatter, 2 all-to-all + compute */
  size_t bytes; /* one block: count x datatype size */
  int nranks, nhosts;
} ncclxTunerFuseQuery_v1_t;

typedef struct {
  int abiVersion; /* NCCLX_TUNER_FUSE_ABI_VERSION */
  ncclxResult_t (*getFuseSchedule)(void* ctx, const ncclxTunerFuseQuery_v1_t* query, int* algo, int* pieces);
} ncclxTunerFuse_v1_t;

/* Names used in logs, profiler events, NCCLX_ALGO and rules files. */
const char* ncclxAlgoName(int algo);
const char* ncclxProtoName(int proto);
const char* ncclxCollName(int coll);

#ifdef __cplusplus
}
#endif
#endif /* NCCLX_TUNER_H */
