/* The names of the public enums, as logs, errors, profiler events, NCCLX_ALGO and tuner
 * rules files spell them: tables at the bottom of the core, so every layer may print them. */
#include "ncclx.h"
#include "ncclx/tuner.h"
#include "util/names.h"

#define API __attribute__((visibility("default")))

API const char* ncclxGetErrorString(ncclxResult_t result) {
  switch (result) {
    case ncclxSuccess: return "no error";
    case ncclxUnhandledCudaError: return "unhandled cuda error";
    case ncclxSystemError: return "unhandled system error (network, memory, OS)";
    case ncclxInternalError: return "internal error (a bug in ncclx or a plugin)";
    case ncclxInvalidArgument: return "invalid argument";
    case ncclxInvalidUsage: return "invalid usage";
    case ncclxRemoteError: return "another rank failed, exited or reported an error, or the network failed";
    case ncclxInProgress: return "operation in progress";
    default: return "unknown result code";
  }
}

static const char* const algoNames[NCCLX_NUM_ALGOS] = {
    [NCCLX_ALGO_RING] = "ring",
    [NCCLX_ALGO_RECURSIVE_DOUBLING] = "recursive_doubling",
    [NCCLX_ALGO_RABENSEIFNER] = "rabenseifner",
    [NCCLX_ALGO_TREE] = "tree",
    [NCCLX_ALGO_BRUCK] = "bruck",
    [NCCLX_ALGO_PAIRWISE] = "pairwise",
    [NCCLX_ALGO_LINEAR] = "linear",
    [NCCLX_ALGO_HIERARCHICAL] = "hierarchical",
};

static const char* const protoNames[NCCLX_NUM_PROTOS] = {
    [NCCLX_PROTO_SIMPLE] = "simple",
    [NCCLX_PROTO_LL] = "ll",
};

static const char* const collNames[NCCLX_NUM_COLLS] = {
    [NCCLX_COLL_BROADCAST] = "broadcast",         [NCCLX_COLL_REDUCE] = "reduce",
    [NCCLX_COLL_ALLGATHER] = "allgather",         [NCCLX_COLL_REDUCESCATTER] = "reducescatter",
    [NCCLX_COLL_ALLREDUCE] = "allreduce",         [NCCLX_COLL_ALLTOALL] = "alltoall",
    [NCCLX_COLL_ALLTOALLV] = "alltoallv",         [NCCLX_COLL_BARRIER] = "barrier",
};

/* "unknown" rather than NULL for indices without a name: these go straight into printf. */
API const char* ncclxAlgoName(int algo) {
  if (algo < 0 || algo >= NCCLX_NUM_ALGOS || !algoNames[algo]) return "unknown";
  return algoNames[algo];
}

API const char* ncclxProtoName(int proto) {
  if (proto < 0 || proto >= NCCLX_NUM_PROTOS || !protoNames[proto]) return "unknown";
  return protoNames[proto];
}

API const char* ncclxCollName(int coll) {
  if (coll < 0 || coll >= NCCLX_NUM_COLLS) return "unknown";
  return collNames[coll];
}

API const char* ncclxTypeName(ncclxDataType_t t) {
  static const char* names[] = {"int8", "uint8", "int32", "uint32", "int64",
                                "uint64", "float16", "float32", "float64", "bfloat16"};
  return (unsigned)t < ncclxNumTypes ? names[t] : "invalid-type";
}

API const char* ncclxOpName(ncclxRedOp_t op) {
  static const char* names[] = {"sum", "prod", "max", "min", "avg"};
  return (unsigned)op < ncclxNumOps ? names[op] : "invalid-op";
}

API size_t ncclxTypeSize(ncclxDataType_t t) { return dataTypeSize(t); }
