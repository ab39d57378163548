/* Small public helpers: version, error strings, type and op names. */
#include "coll/coll.h"
#include "comm/comm.h"
#include "util/debug.h"

#define API __attribute__((visibility("default")))

API ncclxResult_t ncclxGetVersion(int* version) {
  if (!version) return ncclxSetError(ncclxInvalidArgument, "ncclxGetVersion: version is NULL");
  *version = NCCLX_VERSION_CODE;
  return ncclxSuccess;
}

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

/* The newer of the communicator's last failure and this thread's last error: a call that
 * failed before touching the communicator (a bad argument of a split, say) records only the
 * thread's, and the caller asks the communicator. */
API const char* ncclxGetLastError(ncclxComm_t comm) {
  if (!comm || comm->magic != NCCLX_COMM_MAGIC || !comm->lastError[0]) return ncclxThreadLastError();
  pthread_mutex_lock(&comm->errLock);
  int commNewer = comm->lastErrorStamp >= ncclxThreadErrorStamp();
  pthread_mutex_unlock(&comm->errLock);
  return commNewer ? comm->lastError : ncclxThreadLastError();
}

API size_t ncclxTypeSize(ncclxDataType_t t) { return collTypeSize(t); }

API const char* ncclxTypeName(ncclxDataType_t t) {
  static const char* names[] = {"int8", "uint8", "int32", "uint32", "int64",
                                "uint64", "float16", "float32", "float64", "bfloat16"};
  return (unsigned)t < ncclxNumTypes ? names[t] : "invalid-type";
}

API const char* ncclxOpName(ncclxRedOp_t op) {
  static const char* names[] = {"sum", "prod", "max", "min", "avg"};
  return (unsigned)op < ncclxNumOps ? names[op] : "invalid-op";
}
