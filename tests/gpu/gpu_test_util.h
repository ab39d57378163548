/* Shared bits of the device tests: checks, the skip rule, CUDA error checks. */
#ifndef NCCLX_GPU_TEST_UTIL_H
#define NCCLX_GPU_TEST_UTIL_H

#include <stdio.h>
#include <stdlib.h>

#include <cuda_runtime_api.h>

static int failures;
#define CHECK(cond, ...)                                                             \
  do {                                                                               \
    if (!(cond)) {                                                                   \
      if (failures++ < 40) {                                                         \
        fprintf(stderr, "%s:%d: CHECK(%s) failed: ", __FILE__, __LINE__, #cond);     \
        fprintf(stderr, __VA_ARGS__);                                                \
        fprintf(stderr, "\n");                                                       \
      }                                                                              \
    }                                                                                \
  } while (0)

/* A CUDA call that must work once a device exists: failing is a test failure, not a skip. */
#define CUDA_OK(call)                                                                \
  do {                                                                               \
    cudaError_t e_ = (call);                                                         \
    if (e_ != cudaSuccess) {                                                         \
      fprintf(stderr, "%s:%d: %s: %s (%s)\n", __FILE__, __LINE__, #call,             \
              cudaGetErrorString(e_), cudaGetErrorName(e_));                         \
      exit(1);                                                                       \
    }                                                                                \
  } while (0)

/* 0 when devices exist; otherwise prints the skip line CTest shows (unless prog is NULL)
 * and returns 77. */
static inline int skipWithoutDevice(const char* prog) {
  int n = 0;
  cudaError_t err = cudaGetDeviceCount(&n);
  if (err == cudaSuccess && n > 0) return 0;
  if (prog)
    printf("%s: skipped: no CUDA device (cudaGetDeviceCount: %s)\n", prog,
           err != cudaSuccess ? cudaGetErrorString(err) : "0 devices");
  return 77;
}

#endif
