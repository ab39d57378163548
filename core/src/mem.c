/* Memory the transports can use without extra copies, and buffer registration. */
#include <stdlib.h>
#include <string.h>

#include "comm.h"
#include "debug.h"
#include "net_shm.h"

#define API __attribute__((visibility("default")))
#define REG_MAGIC 0x6e6378726567ull

struct ncclxRegistration {
  uint64_t magic;
  struct ncclxComm* comm;
  void* buff;
  size_t size;
};

API ncclxResult_t ncclxMemAlloc(void** ptr, size_t size) {
  if (!ptr) return ncclxSetError(ncclxInvalidArgument, "ncclxMemAlloc: ptr is NULL");
  *ptr = NULL;
  if (size == 0) return ncclxSetError(ncclxInvalidArgument, "ncclxMemAlloc: size is 0");
  /* Buffers of a page or more live in shared memory a same-host peer can map, so the shm
   * transport moves a message out of them with one copy (shm_mem.c); ordinary memory when
   * that is refused.
   * Page alignment lets a transport map or register either whole. */
  if (size >= NCCLX_SHM_MAPPED_MIN && (*ptr = ncclxShmMemAlloc(size)) != NULL) return ncclxSuccess;
  if (posix_memalign(ptr, 4096, size) != 0)
    return ncclxSetError(ncclxSystemError, "ncclxMemAlloc: cannot allocate %zu bytes", size);
  return ncclxSuccess;
}

API ncclxResult_t ncclxMemFree(void* ptr) {
  if (!ncclxShmMemFree(ptr)) free(ptr);
  return ncclxSuccess;
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
