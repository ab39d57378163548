/* Small public helpers: the version, the last error (names of enums: util/names.c). */
#include "comm/comm.h"
#include "util/debug.h"

#define API __attribute__((visibility("default")))

API ncclxResult_t ncclxGetVersion(int* version) {
  if (!version) return ncclxSetError(ncclxInvalidArgument, "ncclxGetVersion: version is NULL");
  *version = NCCLX_VERSION_CODE;
  return ncclxSuccess;
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

