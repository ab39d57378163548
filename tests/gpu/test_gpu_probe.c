/* Device-pointer detection and the errors for device memory that cannot be used, in the
 * build under test (with or without CUDA), on a machine without a CUDA driver:
 *  - without a driver in the process, every pointer is host memory and no CUDA runtime is
 *    started by collectives on host buffers;
 *  - the public CUDA entry points answer "built without CUDA" (ncclxInvalidUsage) or the
 *    CUDA error string (ncclxUnhandledCudaError) as documented;
 *  - with a stand-in driver (mock_libcuda.c, loaded as libcuda.so.1) that calls some
 *    addresses device memory: the probe classifies them, and a collective or send given one
 *    fails at the call with ncclxInvalidUsage and a message naming the buffer and the
 *    reason, on the communicator too, which stays usable for host buffers; the same for
 *    every buffer and count array of AllToAllvDynamic[Compact]. */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpu/gpu.h"
#include "ncclx.h"
#include "ncclx/cuda.h"
#include "ncclx/moe.h"
#include "ncclx/net.h"

static int failures;
#define CHECK(cond, ...)                                                         \
  do {                                                                           \
    if (!(cond)) {                                                               \
      failures++;                                                                \
      fprintf(stderr, "%s:%d: CHECK(%s) failed: ", __FILE__, __LINE__, #cond);   \
      fprintf(stderr, __VA_ARGS__);                                              \
      fprintf(stderr, "\n");                                                     \
    }                                                                            \
  } while (0)

#ifdef NCCLX_HAVE_CUDA
#define BUILD "CUDA build"
#define DEVICE_REASON "cannot use it (cudaGetDeviceCount"
#else
#define BUILD "build without CUDA"
#define DEVICE_REASON "built without CUDA"
#endif

static void checkPublicEntryPoints(void) {
  int n = -1;
  ncclxResult_t res = ncclxCudaGetDeviceCount(&n);
  const char* msg = ncclxGetLastError(NULL);
#ifdef NCCLX_HAVE_CUDA
  if (res == ncclxSuccess) {
    printf("note: %d CUDA device(s) here; the no-device checks below are skipped\n", n);
    return;
  }
  CHECK(res == ncclxUnhandledCudaError && n == 0, "ncclxCudaGetDeviceCount: %d, count %d", (int)res, n);
  CHECK(strstr(msg, "cudaGetDeviceCount: ") != NULL, "message: %s", msg);
#else
  CHECK(res == ncclxInvalidUsage && n == 0, "ncclxCudaGetDeviceCount: %d, count %d", (int)res, n);
  CHECK(strstr(msg, "built without CUDA") != NULL, "message: %s", msg);
#endif
  ncclxStream_t s = (ncclxStream_t)0x1;
  res = ncclxStreamFromCuda(NULL, &s);
  msg = ncclxGetLastError(NULL);
  CHECK(s == NULL, "stream not cleared on failure");
#ifdef NCCLX_HAVE_CUDA
  CHECK(res == ncclxUnhandledCudaError, "ncclxStreamFromCuda: %d", (int)res);
  CHECK(strstr(msg, "ncclxStreamFromCuda: cudaGetDeviceCount: ") != NULL, "message: %s", msg);
#else
  CHECK(res == ncclxInvalidUsage, "ncclxStreamFromCuda: %d", (int)res);
  CHECK(strstr(msg, "built without CUDA") != NULL, "message: %s", msg);
#endif
  CHECK(ncclxStreamFromCuda(NULL, NULL) != ncclxSuccess, "NULL out pointer accepted");
}

/* A one-rank communicator: the call-time checks are the same at any size. */
static ncclxComm_t oneRankComm(void) {
  ncclxUniqueId id;
  ncclxComm_t comm = NULL;
  if (ncclxGetUniqueId(&id) != ncclxSuccess || ncclxCommInitRank(&comm, 1, id, 0) != ncclxSuccess) {
    fprintf(stderr, "cannot create a 1-rank communicator: %s\n", ncclxGetLastError(NULL));
    exit(1);
  }
  return comm;
}

int main(void) {
  static char fakeDevice[4096], fakeManaged[4096];
  float host[64], out[64];
  for (int i = 0; i < 64; i++) host[i] = (float)i;

  /* No driver loaded: everything is host memory. */
  int dev = 7;
  CHECK(gpuProbePointer(fakeDevice, &dev) == GPU_MEM_HOST && dev == -1, "no driver: not host");
  char msg[512] = "";
  CHECK(gpuCheckBuffer("test", "sendbuff", fakeDevice, msg, sizeof msg) == ncclxSuccess, "no driver: %s", msg);
  checkPublicEntryPoints();

  /* The stand-in only works where no real driver is loaded (a real one would answer for
   * "libcuda.so.1"); on GPU machines gpu.device and gpu.coll cover the real thing. */
  void* realDriver = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  if (realDriver) {
    dlclose(realDriver);
    printf("test_gpu_probe (%s): a real CUDA driver is loaded: stand-in driver checks not run\n", BUILD);
    return failures ? 1 : 0;
  }
  const char* mockPath = MOCK_LIBCUDA_PATH;
  void* mock = dlopen(mockPath, RTLD_NOW | RTLD_GLOBAL);
  if (!mock) {
    fprintf(stderr, "cannot load the stand-in driver %s: %s\n", mockPath, dlerror());
    return 1;
  }
  void (*setRanges)(const void*, size_t, const void*, size_t) =
      (void (*)(const void*, size_t, const void*, size_t))dlsym(mock, "mockCudaSetRanges");
  if (!setRanges) return fprintf(stderr, "mock without mockCudaSetRanges\n"), 1;
  setRanges(fakeDevice, sizeof fakeDevice, fakeManaged, sizeof fakeManaged);

  /* The probe through the stand-in driver. */
  CHECK(gpuProbePointer(fakeDevice + 100, &dev) == GPU_MEM_DEVICE && dev == 3, "device pointer: dev %d", dev);
  CHECK(gpuProbePointer(fakeManaged, &dev) == GPU_MEM_MANAGED && dev == 3, "managed pointer");
  CHECK(gpuProbePointer(host, &dev) == GPU_MEM_HOST && dev == -1, "host pointer");
  CHECK(gpuProbePointer(NULL, NULL) == GPU_MEM_HOST, "NULL");
#ifdef NCCLX_HAVE_CUDA
  CHECK(gpuNetPtrType(fakeDevice) == NCCLX_PTR_CUDA && gpuNetPtrType(host) == NCCLX_PTR_HOST, "net ptr type");
#else
  CHECK(gpuNetPtrType(fakeDevice) == NCCLX_PTR_HOST, "net ptr type without CUDA");
#endif

  /* Call-time checks. */
  int haveDevices = 0;
#ifdef NCCLX_HAVE_CUDA
  haveDevices = ncclxCudaGetDeviceCount(&dev) == ncclxSuccess;
#endif
  if (!haveDevices) {
    ncclxResult_t res = gpuCheckBuffer("ncclxAllReduce", "sendbuff", fakeDevice, msg, sizeof msg);
    CHECK(res == ncclxInvalidUsage, "device buffer accepted (%d)", (int)res);
    CHECK(strstr(msg, "ncclxAllReduce: sendbuff") && strstr(msg, "is CUDA device memory") &&
              strstr(msg, DEVICE_REASON), "message: %s", msg);
  }
  CHECK(gpuCheckBuffer("f", "recvbuff", fakeManaged, msg, sizeof msg) == ncclxSuccess, "managed refused");
  CHECK(gpuCheckBuffer("f", "recvbuff", host, msg, sizeof msg) == ncclxSuccess, "host refused");
  CHECK(gpuCheckBuffer("f", "recvbuff", NULL, msg, sizeof msg) == ncclxSuccess, "NULL refused");

  /* Through the public API: refused at the call, recorded on the communicator, which keeps
   * working for host buffers. */
  ncclxComm_t comm = oneRankComm();
  if (!haveDevices) {
    ncclxResult_t res = ncclxAllReduce(fakeDevice, out, 16, ncclxFloat32, ncclxSum, comm, NULL);
    const char* text = ncclxGetLastError(comm);
    CHECK(res == ncclxInvalidUsage, "allreduce from device memory: %d", (int)res);
    CHECK(strstr(text, "sendbuff") && strstr(text, DEVICE_REASON), "comm message: %s", text);
    res = ncclxAllGather(host, fakeDevice, 16, ncclxFloat32, comm, NULL);
    text = ncclxGetLastError(comm);
    CHECK(res == ncclxInvalidUsage && strstr(text, "recvbuff"), "allgather into device memory: %d %s", (int)res, text);
    res = ncclxSend(fakeDevice, 4, ncclxFloat32, 0, comm, NULL);
    CHECK(res == ncclxInvalidUsage, "send from device memory: %d", (int)res);
    /* AllToAllvDynamic: every buffer and count array is checked, and named. */
    size_t counts[1] = {4}, got[1] = {0};
    res = ncclxAllToAllvDynamic(host, (const size_t*)(void*)fakeDevice, out, 16, got, ncclxFloat32, comm, NULL);
    text = ncclxGetLastError(comm);
    CHECK(res == ncclxInvalidUsage && strstr(text, "ncclxAllToAllvDynamic: sendcounts") && strstr(text, DEVICE_REASON),
          "device sendcounts: %d %s", (int)res, text);
    res = ncclxAllToAllvDynamic(fakeDevice, counts, out, 16, got, ncclxFloat32, comm, NULL);
    text = ncclxGetLastError(comm);
    CHECK(res == ncclxInvalidUsage && strstr(text, ": sendbuff"), "device sendbuff: %d %s", (int)res, text);
    res = ncclxAllToAllvDynamic(host, counts, out, 16, (size_t*)(void*)fakeDevice, ncclxFloat32, comm, NULL);
    text = ncclxGetLastError(comm);
    CHECK(res == ncclxInvalidUsage && strstr(text, ": recvcounts"), "device recvcounts: %d %s", (int)res, text);
    res = ncclxAllToAllvDynamicCompact(host, counts, out, 16, got, (size_t*)(void*)fakeDevice, ncclxFloat32, comm,
                                       NULL);
    text = ncclxGetLastError(comm);
    CHECK(res == ncclxInvalidUsage && strstr(text, "ncclxAllToAllvDynamicCompact: rdispls"), "device rdispls: %d %s",
          (int)res, text);
    res = ncclxAllToAllvDynamic(host, counts, fakeDevice, 16, got, ncclxFloat32, comm, NULL);
    text = ncclxGetLastError(comm);
    CHECK(res == ncclxInvalidUsage && strstr(text, ": recvbuff"), "device recvbuff: %d %s", (int)res, text);
  }
  {
    size_t counts[1] = {5}, got[1] = {0};
    memset(out, 0, sizeof out);
    CHECK(ncclxAllToAllvDynamic(host, counts, out, 16, got, ncclxFloat32, comm, NULL) == ncclxSuccess,
          "host AllToAllvDynamic after the refusals: %s", ncclxGetLastError(comm));
    CHECK(got[0] == 5 && memcmp(out, host, 5 * sizeof(float)) == 0, "1-rank AllToAllvDynamic result");
  }
  {
    /* The MoE helpers compute on the CPU: device buffers are refused in every build. */
    ncclxMoeConfig_t cfg = {.size = sizeof cfg, .nExperts = 1, .topk = 1, .hidden = 4,
                            .datatype = ncclxFloat32, .maxTokens = 4, .maxRecvTokens = 4};
    ncclxMoe_t moe = NULL;
    int32_t ids[4] = {0, 0, 0, 0};
    size_t expertCounts[1] = {0};
    CHECK(ncclxMoeCreate(&moe, &cfg, comm) == ncclxSuccess, "moe create: %s", ncclxGetLastError(comm));
    ncclxResult_t res = ncclxMoeDispatch(moe, fakeDevice, 4, ids, out, expertCounts, NULL);
    const char* text = ncclxGetLastError(comm);
    CHECK(res == ncclxInvalidUsage && strstr(text, "ncclxMoeDispatch: tokens is CUDA device memory"),
          "moe dispatch from device memory: %d %s", (int)res, text);
    CHECK(ncclxMoeDispatch(moe, host, 4, ids, out, expertCounts, NULL) == ncclxSuccess,
          "host moe dispatch after the refusal: %s", ncclxGetLastError(comm));
    res = ncclxMoeCombine(moe, out, (const float*)(void*)fakeDevice, out + 16, NULL);
    text = ncclxGetLastError(comm);
    CHECK(res == ncclxInvalidUsage && strstr(text, "ncclxMoeCombine: weights"), "moe combine weights: %d %s",
          (int)res, text);
    CHECK(ncclxMoeDestroy(moe) == ncclxSuccess, "moe destroy");
  }
  memset(out, 0, sizeof out);
  CHECK(ncclxAllReduce(host, out, 64, ncclxFloat32, ncclxSum, comm, NULL) == ncclxSuccess,
        "host allreduce after the refusals: %s", ncclxGetLastError(comm));
  CHECK(memcmp(host, out, sizeof out) == 0, "1-rank allreduce result");
  CHECK(ncclxCommDestroy(comm) == ncclxSuccess, "destroy");

  if (failures) {
    fprintf(stderr, "test_gpu_probe (%s): %d failure(s)\n", BUILD, failures);
    return 1;
  }
  printf("test_gpu_probe (%s): device pointers recognised and refused as documented\n", BUILD);
  return 0;
}
