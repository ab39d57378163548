/* A stand-in for the CUDA driver (built as libcuda.so.1, with that soname) that only knows
 * cuPointerGetAttribute: test_gpu_probe.c loads it to play "an application that uses CUDA"
 * on machines without a driver. Address ranges set by mockCudaSetRanges are reported as
 * device memory on device 3 and as managed memory; everything else is unknown to it
 * (CUDA_ERROR_INVALID_VALUE), as real host memory is. */
#include <stdint.h>
#include <string.h>

static uintptr_t devBase, devEnd, managedBase, managedEnd;

__attribute__((visibility("default"))) void mockCudaSetRanges(const void* dev, size_t devBytes,
                                                              const void* managed, size_t managedBytes) {
  devBase = (uintptr_t)dev, devEnd = devBase + devBytes;
  managedBase = (uintptr_t)managed, managedEnd = managedBase + managedBytes;
}

enum { SUCCESS = 0, INVALID_VALUE = 1, MEMORY_TYPE = 2, IS_MANAGED = 8, DEVICE_ORDINAL = 9 };

__attribute__((visibility("default"))) int cuPointerGetAttribute(void* data, int attribute,
                                                                 unsigned long long ptr) {
  int isDev = ptr >= devBase && ptr < devEnd;
  int isManaged = ptr >= managedBase && ptr < managedEnd;
  if (!isDev && !isManaged) return INVALID_VALUE;
  unsigned int u;
  switch (attribute) {
    case MEMORY_TYPE: u = isDev ? 2u /* DEVICE */ : 4u /* UNIFIED */; break;
    case IS_MANAGED: u = isManaged; break;
    case DEVICE_ORDINAL: u = 3; break;
    default: return INVALID_VALUE;
  }
  memcpy(data, &u, sizeof u);
  return SUCCESS;
}
