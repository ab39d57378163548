/* A communicator's life below its lifecycle (api/comm_lifecycle.c): references, the execution lock
 * and its scratch memory, for every layer that holds or uses a communicator. */
#include <stdlib.h>

#include "comm/comm.h"

void* commScratch(struct ncclxComm* comm, size_t bytes) {
  if (bytes <= comm->scratchSize) return comm->scratch;
  size_t size = bytes < 4096 ? 4096 : bytes;
  void* p = NULL;
  if (posix_memalign(&p, 64, size) != 0) return NULL;
  free(comm->scratch);
  comm->scratch = p;
  comm->scratchSize = size;
  return p;
}

void commRetain(struct ncclxComm* comm) { atomic_fetch_add(&comm->refs, 1); }

void commRelease(struct ncclxComm* comm) {
  if (atomic_fetch_sub(&comm->refs, 1) != 1) return;
  pthread_mutex_destroy(&comm->connLock);
  pthread_mutex_destroy(&comm->execLock);
  pthread_mutex_destroy(&comm->errLock);
  pthread_mutex_destroy(&comm->liveLock);
  comm->magic = 0;
  free(comm);
}

int commExecLock(struct ncclxComm* comm) {
  if (pthread_mutex_trylock(&comm->execLock) == 0) return 0;
  commRetain(comm);
  pthread_mutex_lock(&comm->execLock);
  return 1;
}

void commExecUnlock(struct ncclxComm* comm, int ref) {
  pthread_mutex_unlock(&comm->execLock);
  if (ref) commRelease(comm);
}
