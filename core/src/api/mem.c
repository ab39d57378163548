/* Memory the transports can use without extra copies, and buffer registration. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm.h"
#include "util/debug.h"
#include "transport/shm/net_shm.h"

#define API __attribute__((visibility("default")))
#define REG_MAGIC 0x6e6378726567ull

struct ncclxRegistration {
  uint64_t magic;
  struct ncclxComm* comm;
  void* buff;
  size_t size;
};

/* Allocations below a page come from posix_memalign: remember them, so that ncclxMemFree can
 * refuse a pointer it did not hand out instead of freeing the caller's own buffer. Few
 * buffers live at once; a list is enough. */
static pthread_mutex_t smallLock = PTHREAD_MUTEX_INITIALIZER;
static void** smallPtrs;
static size_t smallCount, smallCap;

static int smallRemember(void* p) {
  pthread_mutex_lock(&smallLock);
  int ok = 1;
  if (smallCount == smallCap) {
    size_t cap = smallCap ? smallCap * 2 : 64;
    void** grown = realloc(smallPtrs, cap * sizeof(*grown));
    if (grown) smallPtrs = grown, smallCap = cap;
    else ok = 0;
  }
  if (ok) smallPtrs[smallCount++] = p;
  pthread_mutex_unlock(&smallLock);
  return ok;
}

static int smallForget(void* p) {
  pthread_mutex_lock(&smallLock);
  int found = 0;
  for (size_t i = smallCount; i-- > 0 && !found;)
    if (smallPtrs[i] == p) smallPtrs[i] = smallPtrs[--smallCount], found = 1;
  pthread_mutex_unlock(&smallLock);
  return found;
}

API ncclxResult_t ncclxMemAlloc(void** ptr, size_t size) {
  if (!ptr) return ncclxSetError(ncclxInvalidArgument, "ncclxMemAlloc: ptr is NULL");
  *ptr = NULL;
  if (size == 0) return ncclxSetError(ncclxInvalidArgument, "ncclxMemAlloc: size is 0");
  /* Buffers of a page or more live in shared memory a same-host peer can map, so the shm
   * transport moves a message out of them with one copy (shm_mem.c); ordinary memory when
   * that is refused.
   * Page alignment lets a transport map or register either whole. */
  if (size >= NCCLX_SHM_MAPPED_MIN && (*ptr = ncclxShmMemAlloc(size)) != NULL) return ncclxSuccess;
  if (posix_memalign(ptr, 4096, size) != 0 || !smallRemember(*ptr)) {
    free(*ptr);
    *ptr = NULL;
    return ncclxSetError(ncclxSystemError, "ncclxMemAlloc: cannot allocate %zu bytes", size);
  }
  return ncclxSuccess;
}

API ncclxResult_t ncclxMemFree(void* ptr) {
  if (!ptr || ncclxShmMemFree(ptr)) return ncclxSuccess;
  if (smallForget(ptr)) {
    free(ptr);
    return ncclxSuccess;
  }
  return ncclxSetError(ncclxInvalidArgument,
                       "ncclxMemFree: %p was not returned by ncclxMemAlloc, or was freed already; "
                       "left alone (free your own buffers with free())", ptr);
}

API ncclxResult_t ncclxCommRegister(const ncclxComm_t comm, void* buff, size_t size, void** handle) {
  NCCLX_CHECK(commCheckHandle(comm));
  if (!handle) return ncclxSetError(ncclxInvalidArgument, "ncclxCommRegister: handle is NULL");
  *handle = NULL;
  if (!buff || size == 0)
    return ncclxSetError(ncclxInvalidArgument, "ncclxCommRegister: buffer %p of %zu bytes is empty", buff, size);
  struct ncclxRegistration* reg = malloc(sizeof(*reg));
  if (!reg) return ncclxSetError(ncclxSystemError, "out of memory");
  *reg = (struct ncclxRegistration){REG_MAGIC, comm, buff, size};
  *handle = reg;
  return ncclxSuccess;
}

API ncclxResult_t ncclxCommDeregister(const ncclxComm_t comm, void* handle) {
  NCCLX_CHECK(commCheckHandle(comm));
  struct ncclxRegistration* reg = handle;
  if (!reg || reg->magic != REG_MAGIC || reg->comm != comm)
    return ncclxSetError(ncclxInvalidArgument, "ncclxCommDeregister: %p is not a registration of this communicator", handle);
  reg->magic = 0;
  free(reg);
  return ncclxSuccess;
}
