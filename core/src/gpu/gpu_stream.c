/* CUDA build: ncclx streams ordered with CUDA streams (ncclxStreamFromCuda).
 *
 * An ncclx stream from ncclxStreamFromCuda is an ordinary CPU stream (stream.c) plus a
 * binding to a cudaStream_t. Every operation queued on it through gpuStreamEnqueue is
 * wrapped so that:
 *  - before: an event recorded on the CUDA stream at the call marks the CUDA work issued so
 *    far; the wrapped task waits for it on the ncclx worker thread before running;
 *  - after: the binding owns a 32-bit counter in pinned, device-mapped host memory. Each
 *    operation gets the next sequence number, and the CUDA stream is made to wait on the GPU
 *    until the counter reaches it (cuStreamWaitValue32, from the driver through
 *    cudaGetDriverEntryPointByVersion); the worker writes the number when the operation is
 *    done, failed or not. No host thread blocks for the CUDA stream. Where stream memory
 *    operations are unavailable, a host function (cudaLaunchHostFunc) polls the counter
 *    instead; it calls no CUDA API, as host functions must not.
 * Tasks run in queue order, so the counter only grows. Counters are never freed or reset
 * (a CUDA stream may still wait on one after its ncclx stream is gone): a slot is reused
 * only by a later binding, which continues from the value the slot holds, so an old
 * pending wait is satisfied by any later value. The comparison is cyclic (CUDA's GEQ is
 * (int32_t)(*addr - value) >= 0), so wraparound is harmless. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>

#include "util/debug.h"
#include "gpu/gpu.h"
#include "gpu/gpu_runtime.h"
#include "ncclx/cuda.h"

#define NCCLX_API __attribute__((visibility("default")))
#define FLAG_PAGE_SLOTS 1024
#define WAIT_REPORT_SEC 60

/* ---- counters in pinned, device-mapped memory ---- */

struct flagSlot {
  _Atomic uint32_t* host;
  unsigned long long dev; /* device address of host */
  struct flagSlot* nextFree;
};

static pthread_mutex_t slotLock = PTHREAD_MUTEX_INITIALIZER;
static struct flagSlot* freeSlots;

static ncclxResult_t slotGet(struct flagSlot** out) {
  *out = NULL;
  pthread_mutex_lock(&slotLock);
  ncclxResult_t res = ncclxSuccess;
  if (!freeSlots) {
    void* page = NULL;
    void* dev = NULL;
    struct flagSlot* slots = calloc(FLAG_PAGE_SLOTS, sizeof(*slots));
    cudaError_t err = cudaHostAlloc(&page, FLAG_PAGE_SLOTS * sizeof(uint32_t),
                                    cudaHostAllocMapped | cudaHostAllocPortable);
    if (err == cudaSuccess) err = cudaHostGetDevicePointer(&dev, page, 0);
    if (!slots || err != cudaSuccess) {
      res = slots ? gpuCudaError(err, "pinned counter page for CUDA stream ordering")
                  : ncclxSetError(ncclxSystemError, "out of memory");
      if (page) (void)cudaFreeHost(page);
      free(slots);
    } else {
      for (int i = 0; i < FLAG_PAGE_SLOTS; i++) {
        slots[i].host = (_Atomic uint32_t*)page + i;
        atomic_store(slots[i].host, 0);
        slots[i].dev = (unsigned long long)(uintptr_t)dev + (unsigned long long)i * sizeof(uint32_t);
        slots[i].nextFree = i + 1 < FLAG_PAGE_SLOTS ? &slots[i + 1] : NULL;
      }
      freeSlots = slots; /* the page and the slot array live as long as the process */
    }
  }
  if (freeSlots) {
    *out = freeSlots;
    freeSlots = freeSlots->nextFree;
  }
  pthread_mutex_unlock(&slotLock);
  return res;
}

static void slotPut(struct flagSlot* s) {
  pthread_mutex_lock(&slotLock);
  s->nextFree = freeSlots;
  freeSlots = s;
  pthread_mutex_unlock(&slotLock);
}

/* ---- GPU-side wait: stream memory operation, or a host function ---- */

/* CUresult cuStreamWaitValue32(CUstream, CUdeviceptr, cuuint32_t, unsigned int) */
typedef int (*streamWaitValue32Fn)(cudaStream_t stream, unsigned long long addr, uint32_t value,
                                   unsigned int flags);
#define CU_STREAM_WAIT_VALUE_GEQ_ 0x0

static pthread_once_t waitFnOnce = PTHREAD_ONCE_INIT;
static streamWaitValue32Fn waitValueFn;

/* The driver function through the runtime, so libncclx need not link libcuda. */
static void lookupWaitFn(void) {
  void* fn = NULL;
  cudaError_t err = cudaErrorNotSupported;
#if CUDART_VERSION >= 12050
  enum cudaDriverEntryPointQueryResult status = cudaDriverEntryPointSymbolNotFound;
  err = cudaGetDriverEntryPointByVersion("cuStreamWaitValue32", &fn, 12000, cudaEnableDefault, &status);
  if (status != cudaDriverEntryPointSuccess) fn = NULL;
#elif CUDART_VERSION >= 12000
  enum cudaDriverEntryPointQueryResult status = cudaDriverEntryPointSymbolNotFound;
  err = cudaGetDriverEntryPoint("cuStreamWaitValue32", &fn, cudaEnableDefault, &status);
  if (status != cudaDriverEntryPointSuccess) fn = NULL;
#endif
  if (err == cudaSuccess && fn) {
    waitValueFn = (streamWaitValue32Fn)fn;
  } else {
    (void)cudaGetLastError();
    INFO(NCCLX_LOG_INIT, "CUDA: cuStreamWaitValue32 unavailable: CUDA streams wait for ncclx in host functions");
  }
}

/* The device a CUDA stream belongs to (the current one for the legacy and per-thread
 * default streams). */
static cudaError_t streamDevice(cudaStream_t s, int* device) {
#if CUDART_VERSION >= 12080
  return cudaStreamGetDevice(s, device);
#else
  (void)s; /* older runtimes cannot tell: the caller's current device, as documented */
  return cudaGetDevice(device);
#endif
}

/* ---- bindings ---- */

struct binding {
  ncclxStream_t stream;
  cudaStream_t cuda;
  int device;
  struct flagSlot* slot;
  pthread_mutex_t lock;  /* one enqueue at a time: sequence numbers follow queue order */
  uint32_t issued;       /* last sequence number handed out */
  int useHostFn;         /* stream memory operations unavailable or refused */
  atomic_int refs;       /* the registry, plus every queued task and pending host wait */
  struct binding* next;
};

static pthread_mutex_t registryLock = PTHREAD_MUTEX_INITIALIZER;
static struct binding* bindings;

static void bindingRelease(struct binding* b) {
  if (atomic_fetch_sub(&b->refs, 1) != 1) return;
  slotPut(b->slot);
  pthread_mutex_destroy(&b->lock);
  free(b);
}

static struct binding* bindingFind(ncclxStream_t stream) {
  if (!stream) return NULL;
  pthread_mutex_lock(&registryLock);
  struct binding* b = bindings;
  while (b && b->stream != stream) b = b->next;
  if (b) atomic_fetch_add(&b->refs, 1);
  pthread_mutex_unlock(&registryLock);
  return b;
}

int gpuStreamIsCuda(ncclxStream_t stream) {
  struct binding* b = bindingFind(stream);
  if (!b) return 0;
  bindingRelease(b);
  return 1;
}

void gpuStreamForget(ncclxStream_t stream) {
  pthread_mutex_lock(&registryLock);
  struct binding** it = &bindings;
  while (*it && (*it)->stream != stream) it = &(*it)->next;
  struct binding* b = *it;
  if (b) *it = b->next;
  pthread_mutex_unlock(&registryLock);
  if (b) bindingRelease(b);
}

/* ---- the wrapped task ---- */

struct orderedTask {
  ncclxTask base;
  ncclxTask* inner;
  struct binding* binding;
  cudaEvent_t ready; /* recorded on the CUDA stream at the call */
  uint32_t seq;
};

static ncclxResult_t orderedRun(ncclxTask* t) {
  struct orderedTask* ot = (struct orderedTask*)t;
  struct binding* b = ot->binding;
  int saved;
  ncclxResult_t res = gpuDeviceEnter(b->device, &saved);
  if (res == ncclxSuccess) res = gpuEventWait(ot->ready, NULL, "ncclx stream waiting for its CUDA stream");
  if (res == ncclxSuccess) res = ot->inner->run(ot->inner);
  gpuDeviceRestore(saved);
  /* Done, failed or not: the CUDA stream must go on (the error is the ncclx stream's). */
  atomic_store_explicit(b->slot->host, ot->seq, memory_order_release);
  return res;
}

static void orderedRelease(ncclxTask* t) {
  struct orderedTask* ot = (struct orderedTask*)t;
  if (ot->inner->release) ot->inner->release(ot->inner);
  if (ot->ready) (void)cudaEventDestroy(ot->ready);
  bindingRelease(ot->binding);
  free(ot);
}

struct hostWait {
  struct binding* binding;
  uint32_t seq;
};

/* Runs on a CUDA driver thread: no CUDA calls here. */
static void hostWaitFn(void* arg) {
  struct hostWait* w = arg;
  struct timespec start, now, nap = {0, 20000};
  clock_gettime(CLOCK_MONOTONIC, &start);
  long nextReport = WAIT_REPORT_SEC;
  while ((int32_t)(atomic_load_explicit(w->binding->slot->host, memory_order_acquire) - w->seq) < 0) {
    nanosleep(&nap, NULL);
    if (nap.tv_nsec < 1000000) nap.tv_nsec *= 2;
    clock_gettime(CLOCK_MONOTONIC, &now);
    if (now.tv_sec - start.tv_sec >= nextReport) {
      WARN("CUDA stream %p: still waiting for ncclx operation %u after %ld s", (void*)w->binding->cuda,
           w->seq, (long)(now.tv_sec - start.tv_sec));
      nextReport += WAIT_REPORT_SEC;
    }
  }
  bindingRelease(w->binding);
  free(w);
}

/* Make the CUDA stream wait for sequence number seq. Caller holds b->lock. */
static ncclxResult_t cudaWaitFor(struct binding* b, uint32_t seq) {
  if (!b->useHostFn) {
    int rc = waitValueFn(b->cuda, b->slot->dev, seq, CU_STREAM_WAIT_VALUE_GEQ_);
    if (rc == 0) return ncclxSuccess;
    WARN("CUDA stream %p: cuStreamWaitValue32 failed (CUresult %d); using host functions instead",
         (void*)b->cuda, rc);
    b->useHostFn = 1;
  }
  struct hostWait* w = malloc(sizeof(*w));
  if (!w) return ncclxSetError(ncclxSystemError, "out of memory");
  w->binding = b;
  w->seq = seq;
  atomic_fetch_add(&b->refs, 1);
  cudaError_t err = cudaLaunchHostFunc(b->cuda, hostWaitFn, w);
  if (err != cudaSuccess) {
    atomic_fetch_sub(&b->refs, 1); /* the caller still holds a reference: never the last */
    free(w);
    return gpuCudaError(err, "cudaLaunchHostFunc on CUDA stream %p", (void*)b->cuda);
  }
  return ncclxSuccess;
}

ncclxResult_t gpuStreamEnqueue(ncclxStream_t stream, ncclxTask* task) {
  struct binding* b = bindingFind(stream);
  if (!b) return streamEnqueue(stream, task);

  struct orderedTask* ot = calloc(1, sizeof(*ot));
  if (!ot) {
    if (task->release) task->release(task);
    bindingRelease(b);
    return ncclxSetError(ncclxSystemError, "out of memory queueing an operation");
  }
  ot->base.run = orderedRun;
  ot->base.release = orderedRelease;
  ot->inner = task;
  ot->binding = b;
  atomic_fetch_add(&b->refs, 1); /* the task's; bindingFind's is ours until the end */

  pthread_mutex_lock(&b->lock);
  int saved;
  ncclxResult_t res = gpuDeviceEnter(b->device, &saved);
  if (res == ncclxSuccess) {
    cudaError_t err = cudaEventCreateWithFlags(&ot->ready, cudaEventDisableTiming);
    if (err == cudaSuccess) err = cudaEventRecord(ot->ready, b->cuda);
    if (err != cudaSuccess) res = gpuCudaError(err, "recording an event on CUDA stream %p", (void*)b->cuda);
  }
  if (res != ncclxSuccess) {
    orderedRelease(&ot->base);
  } else {
    uint32_t seq = ot->seq = ++b->issued;
    res = streamEnqueue(stream, &ot->base); /* owns ot from here, even on failure */
    /* Only a queued task will signal seq, so only then may the CUDA stream wait for it. */
    if (res == ncclxSuccess) res = cudaWaitFor(b, seq);
  }
  gpuDeviceRestore(saved);
  pthread_mutex_unlock(&b->lock);
  bindingRelease(b);
  return res;
}

/* ---- public ---- */

NCCLX_API ncclxResult_t ncclxStreamFromCuda(struct CUstream_st* cudaStream, ncclxStream_t* stream) {
  if (!stream) return ncclxSetError(ncclxInvalidArgument, "ncclxStreamFromCuda: stream is NULL");
  *stream = NULL;
  const char* why;
  if (gpuRuntimeDevices(&why) == 0)
    return ncclxSetError(ncclxUnhandledCudaError, "ncclxStreamFromCuda: %s", why);
  cudaStream_t cs = (cudaStream_t)cudaStream;
  cudaError_t err = cudaStreamQuery(cs);
  if (err != cudaSuccess && err != cudaErrorNotReady)
    return gpuCudaError(err, "ncclxStreamFromCuda: CUDA stream %p is not usable (cudaStreamQuery)", (void*)cs);
  int device = -1;
  if ((err = streamDevice(cs, &device)) != cudaSuccess)
    return gpuCudaError(err, "ncclxStreamFromCuda: device of CUDA stream %p", (void*)cs);
  pthread_once(&waitFnOnce, lookupWaitFn);
  streamSetDestroyHook(gpuStreamForget); /* the binding goes with its stream */

  struct binding* b = calloc(1, sizeof(*b));
  if (!b) return ncclxSetError(ncclxSystemError, "ncclxStreamFromCuda: out of memory");
  ncclxResult_t res = slotGet(&b->slot);
  if (res != ncclxSuccess) {
    free(b);
    return res;
  }
  b->cuda = cs;
  b->device = device;
  b->issued = atomic_load(b->slot->host); /* continue from what the slot holds */
  b->useHostFn = waitValueFn == NULL;
  atomic_init(&b->refs, 1);
  pthread_mutex_init(&b->lock, NULL);
  res = ncclxStreamCreate(&b->stream);
  if (res != ncclxSuccess) {
    bindingRelease(b);
    return res;
  }
  pthread_mutex_lock(&registryLock);
  b->next = bindings;
  bindings = b;
  pthread_mutex_unlock(&registryLock);
  *stream = b->stream;
  INFO(NCCLX_LOG_INIT, "ncclx stream %p ordered with CUDA stream %p on device %d (%s)", (void*)b->stream,
       (void*)cs, device, b->useHostFn ? "host-function waits" : "stream memory waits");
  return ncclxSuccess;
}
