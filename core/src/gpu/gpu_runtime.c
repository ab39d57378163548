/* CUDA build: runtime detection, CUDA error mapping, buffer checks, bounded event waits.
 *
 * The runtime is probed once, lazily, and only when something CUDA-specific happens (a
 * device pointer, ncclxStreamFromCuda, ncclxCudaGetDeviceCount): a CPU-only job on a CUDA
 * build never starts the CUDA runtime. When the probe fails (no driver, no device, as on
 * machines without a GPU) the library keeps working on host memory. */
#include "gpu/gpu_runtime.h"

#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <time.h>

#include "util/debug.h"
#include "gpu/gpu.h"
#include "ncclx/cuda.h"
#include "ncclx/net.h"

#define NCCLX_API __attribute__((visibility("default")))
#define WAIT_REPORT_SEC 60

static pthread_once_t probeOnce = PTHREAD_ONCE_INIT;
static int probeDevices;
static char probeWhy[256];

const char* gpuCudaErrorText(cudaError_t err, char* buf, size_t size) {
  snprintf(buf, size, "%s (%s)", cudaGetErrorString(err), cudaGetErrorName(err));
  return buf;
}

static void probe(void) {
  int n = 0;
  cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess) {
    char text[200];
    snprintf(probeWhy, sizeof probeWhy, "cudaGetDeviceCount: %s", gpuCudaErrorText(err, text, sizeof text));
    (void)cudaGetLastError();
    n = 0;
  } else if (n <= 0) {
    snprintf(probeWhy, sizeof probeWhy, "cudaGetDeviceCount: no CUDA device");
    n = 0;
  }
  probeDevices = n;
  INFO(NCCLX_LOG_INIT, "CUDA: %d usable device(s)%s%s", n, n ? "" : ": ", probeWhy);
}

int gpuRuntimeDevices(const char** why) {
  pthread_once(&probeOnce, probe);
  if (why) *why = probeWhy;
  return probeDevices;
}

ncclxResult_t gpuCudaError(cudaError_t err, const char* fmt, ...) {
  char context[512], text[200];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(context, sizeof context, fmt, ap);
  va_end(ap);
  (void)cudaGetLastError();
  return ncclxSetError(ncclxUnhandledCudaError, "%s: %s", context, gpuCudaErrorText(err, text, sizeof text));
}

ncclxResult_t gpuCheckBuffer(const char* fn, const char* what, const void* p, char* msg, size_t size) {
  if (!p || gpuProbePointer(p, NULL) != GPU_MEM_DEVICE) return ncclxSuccess;
  const char* why;
  if (gpuRuntimeDevices(&why) > 0) return ncclxSuccess;
  snprintf(msg, size, "%s: %s %p is CUDA device memory, but the CUDA runtime of this libncclx "
           "cannot use it (%s)", fn, what, p, why);
  return ncclxInvalidUsage;
}

int gpuNetPtrType(const void* p) {
  return p && gpuProbePointer(p, NULL) == GPU_MEM_DEVICE ? NCCLX_PTR_CUDA : NCCLX_PTR_HOST;
}

ncclxResult_t gpuDeviceEnter(int device, int* saved) {
  *saved = -1;
  if (device < 0) return ncclxSuccess;
  cudaError_t err = cudaGetDevice(saved);
  if (err != cudaSuccess) return gpuCudaError(err, "cudaGetDevice");
  if (*saved == device) return ncclxSuccess;
  err = cudaSetDevice(device);
  if (err != cudaSuccess) {
    *saved = -1;
    return gpuCudaError(err, "cudaSetDevice(%d)", device);
  }
  return ncclxSuccess;
}

void gpuDeviceRestore(int saved) {
  int now;
  if (saved >= 0 && cudaGetDevice(&now) == cudaSuccess && now != saved) (void)cudaSetDevice(saved);
}

static double secondsSince(const struct timespec* t0) {
  struct timespec now;
  clock_gettime(CLOCK_MONOTONIC, &now);
  return (double)(now.tv_sec - t0->tv_sec) + (double)(now.tv_nsec - t0->tv_nsec) * 1e-9;
}

ncclxResult_t gpuEventWait(cudaEvent_t ev, struct ncclxComm* comm, const char* what) {
  struct timespec start;
  clock_gettime(CLOCK_MONOTONIC, &start);
  double nextReport = WAIT_REPORT_SEC;
  long sleepNs = 20000;
  for (unsigned polls = 0;; polls++) {
    cudaError_t err = cudaEventQuery(ev);
    if (err == cudaSuccess) return ncclxSuccess;
    if (err != cudaErrorNotReady) return gpuCudaError(err, "%s", what);
    if (comm && atomic_load(&comm->abortFlag)) {
      ncclxResult_t res = commCheckHealthy(comm);
      return res != ncclxSuccess ? res : ncclxSetError(ncclxInvalidUsage, "%s: communicator aborted", what);
    }
    if ((polls & 63) != 63 && polls < 4096) continue; /* spin first: copies take microseconds */
    double waited = secondsSince(&start);
    if (comm && comm->timeoutSec > 0 && waited > comm->timeoutSec)
      return ncclxSetError(ncclxSystemError, "%s: not complete after %.0f s ([core] timeout_s)", what, waited);
    if (waited > nextReport) {
      WARN("%s: still waiting after %.0f s", what, waited);
      nextReport += WAIT_REPORT_SEC;
    }
    if (polls < 8192) {
      sched_yield();
    } else {
      struct timespec ts = {0, sleepNs};
      nanosleep(&ts, NULL);
      if (sleepNs < 1000000) sleepNs *= 2;
    }
  }
}

NCCLX_API ncclxResult_t ncclxCudaGetDeviceCount(int* count) {
  if (!count) return ncclxSetError(ncclxInvalidArgument, "ncclxCudaGetDeviceCount: count is NULL");
  const char* why;
  *count = gpuRuntimeDevices(&why);
  if (*count > 0) return ncclxSuccess;
  return ncclxSetError(ncclxUnhandledCudaError, "ncclxCudaGetDeviceCount: %s", why);
}
