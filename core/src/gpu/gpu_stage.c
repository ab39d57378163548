/* CUDA build: running collectives and send/receive on device buffers by staging them
 * through pinned host memory, for transports that move host memory (all built-in ones).
 *
 * Per operation: copy the device bytes the operation reads into a pinned buffer
 * (cudaMemcpyAsync on an internal non-blocking stream of the buffer's device, then a bounded
 * wait on an event), run the host algorithm on the pinned copy, copy the bytes it wrote
 * back. Ordering with the user's CUDA work is done before we get here: by the event wait of
 * a stream from ncclxStreamFromCuda (gpu_stream.c), or by the caller for other streams. The
 * internal stream is non-blocking so it never waits behind the legacy default stream,
 * which may itself be waiting for this very operation.
 *
 * Pinned buffers are pooled (cudaMallocHost costs milliseconds): up to POOL_KEEP_BYTES stay
 * cached. A buffer whose copy may still be running (timeout, abort) is abandoned, not
 * reused. */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/debug.h"
#include "gpu/gpu.h"
#include "gpu/gpu_extent.h"
#include "gpu/gpu_net.h"
#include "gpu/gpu_runtime.h"

#define POOL_KEEP_BYTES ((size_t)256 << 20)
#define POOL_MIN_BYTES ((size_t)64 << 10)
#define REGION_ALIGN 256

/* ---- pinned buffer pool ---- */

static pthread_mutex_t poolLock = PTHREAD_MUTEX_INITIALIZER;
static struct gpuPinned* pool;
static size_t pooledBytes;

ncclxResult_t gpuPinnedGet(size_t bytes, struct gpuPinned** out) {
  *out = NULL;
  pthread_mutex_lock(&poolLock);
  struct gpuPinned **best = NULL;
  for (struct gpuPinned** it = &pool; *it; it = &(*it)->next)
    if ((*it)->size >= bytes && (!best || (*it)->size < (*best)->size)) best = it;
  if (best) {
    *out = *best;
    *best = (*out)->next;
    pooledBytes -= (*out)->size;
  }
  pthread_mutex_unlock(&poolLock);
  if (*out) return ncclxSuccess;

  size_t size = POOL_MIN_BYTES;
  while (size < bytes && size <= SIZE_MAX / 2) size *= 2;
  if (size < bytes) size = bytes;
  struct gpuPinned* b = calloc(1, sizeof(*b));
  if (!b) return ncclxSetError(ncclxSystemError, "out of memory for a staging buffer");
  cudaError_t err = cudaMallocHost((void**)&b->p, size);
  if (err != cudaSuccess) {
    free(b);
    return gpuCudaError(err, "cudaMallocHost(%zu bytes) for staging device buffers", size);
  }
  b->size = size;
  *out = b;
  return ncclxSuccess;
}

void gpuPinnedPut(struct gpuPinned* b) {
  if (!b) return;
  pthread_mutex_lock(&poolLock);
  int keep = pooledBytes + b->size <= POOL_KEEP_BYTES;
  if (keep) {
    b->next = pool;
    pool = b;
    pooledBytes += b->size;
  }
  pthread_mutex_unlock(&poolLock);
  if (!keep) {
    (void)cudaFreeHost(b->p);
    free(b);
  }
}

/* ---- internal copy streams, one per device ---- */

static pthread_mutex_t streamLock = PTHREAD_MUTEX_INITIALIZER;
static cudaStream_t* copyStreams; /* indexed by device, created on first use */
static int copyStreamCount;

ncclxResult_t gpuCopyStream(int device, cudaStream_t* out) {
  const char* why;
  int ndev = gpuRuntimeDevices(&why);
  if (device < 0 || device >= ndev)
    return ncclxSetError(ncclxInvalidUsage, "device %d is not a usable CUDA device (%d found%s%s)",
                         device, ndev, ndev ? "" : ": ", why);
  ncclxResult_t res = ncclxSuccess;
  pthread_mutex_lock(&streamLock);
  if (!copyStreams) {
    copyStreams = calloc((size_t)ndev, sizeof(*copyStreams));
    copyStreamCount = copyStreams ? ndev : 0;
  }
  if (device >= copyStreamCount) {
    res = ncclxSetError(ncclxSystemError, "out of memory for CUDA copy streams");
  } else if (!copyStreams[device]) {
    cudaError_t err = cudaStreamCreateWithFlags(&copyStreams[device], cudaStreamNonBlocking);
    if (err != cudaSuccess) {
      copyStreams[device] = NULL;
      res = gpuCudaError(err, "cudaStreamCreateWithFlags on device %d", device);
    }
  }
  if (res == ncclxSuccess) *out = copyStreams[device];
  pthread_mutex_unlock(&streamLock);
  return res;
}

/* ---- staging ---- */

/* A range of user memory on the device and where its copy lives in the pinned buffer. */
struct region {
  char* user;
  size_t bytes;
  int in, out; /* copy to host before / back to the device after */
  size_t offset;
};

struct staging {
  struct ncclxComm* comm;
  const char* what; /* "allreduce #7", for messages */
  struct region* regions;
  int n;
  int saved;        /* device current before we switched */
  cudaStream_t stream;
  cudaEvent_t event;
  struct gpuPinned* host;
  int inFlight;     /* a copy may still be running: the pinned buffer must not be reused */
};

static char* hostOf(const struct staging* st, int i) { return st->host->p + st->regions[i].offset; }

/* Enter the device, get the stream, event and one pinned buffer for all regions. */
static ncclxResult_t stagingBegin(struct staging* st, int device) {
  ncclxResult_t res = gpuDeviceEnter(device, &st->saved);
  if (res != ncclxSuccess) return res;
  if (device < 0 && cudaGetDevice(&device) != cudaSuccess) device = 0;
  NCCLX_CHECK(gpuCopyStream(device, &st->stream));
  cudaError_t err = cudaEventCreateWithFlags(&st->event, cudaEventDisableTiming);
  if (err != cudaSuccess) {
    st->event = NULL;
    return gpuCudaError(err, "cudaEventCreateWithFlags");
  }
  size_t total = 0;
  for (int i = 0; i < st->n; i++) {
    st->regions[i].offset = total;
    total += (st->regions[i].bytes + REGION_ALIGN - 1) / REGION_ALIGN * REGION_ALIGN;
  }
  return gpuPinnedGet(total ? total : 1, &st->host);
}

/* Copy every region flagged `in` (toHost) or `out` (back to the device), then wait. */
static ncclxResult_t stagingCopy(struct staging* st, int toHost) {
  for (int i = 0; i < st->n; i++) {
    struct region* r = &st->regions[i];
    if (!r->bytes || !(toHost ? r->in : r->out)) continue;
    void* dst = toHost ? (void*)hostOf(st, i) : (void*)r->user;
    const void* src = toHost ? (const void*)r->user : (const void*)hostOf(st, i);
    cudaError_t err = cudaMemcpyAsync(dst, src, r->bytes, cudaMemcpyDefault, st->stream);
    if (err != cudaSuccess) /* inFlight stays set if earlier copies of this batch may run */
      return gpuCudaError(err, "%s: cudaMemcpyAsync %s (%p, %zu bytes)", st->what,
                          toHost ? "device to host" : "host to device", (void*)r->user, r->bytes);
    st->inFlight = 1;
  }
  if (!st->inFlight) return ncclxSuccess;
  cudaError_t err = cudaEventRecord(st->event, st->stream);
  if (err != cudaSuccess) return gpuCudaError(err, "%s: cudaEventRecord", st->what);
  ncclxResult_t res = gpuEventWait(st->event, st->comm, st->what);
  if (res == ncclxSuccess) st->inFlight = 0;
  return res;
}

static void stagingEnd(struct staging* st) {
  if (st->host) {
    if (st->inFlight) {
      WARN("%s: abandoning a %zu-byte pinned staging buffer: a copy into it may still be running",
           st->what, st->host->size);
    } else {
      gpuPinnedPut(st->host);
    }
  }
  if (st->event) (void)cudaEventDestroy(st->event);
  gpuDeviceRestore(st->saved);
}

/* Device kind and ordinal of [p, p+bytes), or host when empty. */
static int isDevice(const void* p, size_t bytes, int* device) {
  *device = -1;
  return p && bytes && gpuProbePointer(p, device) == GPU_MEM_DEVICE;
}

static int overlaps(const char* a, size_t an, const char* b, size_t bn) {
  return a < b + bn && b < a + an;
}

ncclxResult_t gpuCollRun(struct ncclxComm* comm, const ncclxCollArgs* args) {
  NCCLX_CHECK(gpuNetCollCheck(comm));
  if (args->hostBuffers || !gpuDriverLoaded()) return collRun(comm, args);
  gpuCollExtent e;
  gpuCollExtents(args, comm->nranks, comm->rank, &e);
  char* send = (char*)args->sendbuff;
  char* recv = (char*)args->recvbuff;
  int sendDev, recvDev;
  int sendOnDevice = isDevice(send, e.sendBytes, &sendDev);
  int recvOnDevice = isDevice(recv, e.recvBytes, &recvDev);
  if (!sendOnDevice && !recvOnDevice) return collRun(comm, args);

  char what[96];
  snprintf(what, sizeof what, "%s #%llu", ncclxCollName(args->coll), (unsigned long long)comm->curOpSeq);
  struct region regions[2];
  struct staging st = {.comm = comm, .what = what, .regions = regions, .saved = -1};
  int sendRegion = -1, recvRegion = -1;
  if (sendOnDevice && recvOnDevice && overlaps(send, e.sendBytes, recv, e.recvBytes)) {
    /* In place (or partly): one region over both, staged in and out whole. */
    char* lo = send < recv ? send : recv;
    char* hi = send + e.sendBytes > recv + e.recvBytes ? send + e.sendBytes : recv + e.recvBytes;
    regions[st.n] = (struct region){.user = lo, .bytes = (size_t)(hi - lo), .in = 1, .out = 1};
    sendRegion = recvRegion = st.n++;
  } else {
    if (sendOnDevice) {
      regions[st.n] = (struct region){.user = send, .bytes = e.sendBytes, .in = 1, .out = 0};
      sendRegion = st.n++;
    }
    if (recvOnDevice) {
      regions[st.n] = (struct region){.user = recv, .bytes = e.recvBytes, .in = e.recvIsInput, .out = 1};
      recvRegion = st.n++;
    }
  }

  /* Staging failures fail the communicator (gpuFailComm: the peers abort instead of waiting
   * for this rank); the algorithm's own result is passed as is. */
  ncclxResult_t res = stagingBegin(&st, sendOnDevice ? sendDev : recvDev);
  if (res == ncclxSuccess) res = stagingCopy(&st, 1);
  if (res != ncclxSuccess) {
    stagingEnd(&st);
    return gpuFailComm(comm, res);
  }
  ncclxCollArgs staged = *args;
  if (sendRegion >= 0) staged.sendbuff = hostOf(&st, sendRegion) + (send - regions[sendRegion].user);
  if (recvRegion >= 0) staged.recvbuff = hostOf(&st, recvRegion) + (recv - regions[recvRegion].user);
  /* In place with one side unused on this rank (broadcast off the root, reduce off the
   * root): keep the two pointers equal, as the algorithm may test for it. */
  if (send == recv && (sendRegion < 0) != (recvRegion < 0))
    staged.sendbuff = staged.recvbuff = sendRegion >= 0 ? (void*)staged.sendbuff : staged.recvbuff;
  res = collRun(comm, &staged);
  if (res == ncclxSuccess) res = gpuFailComm(comm, stagingCopy(&st, 0));
  stagingEnd(&st);
  return res;
}

/* Send/receive: per transfer (gpu_net.c), device buffers go to a plugin that reads device
 * memory directly as they are (registered as NCCLX_PTR_CUDA), or through pinned host memory
 * for every other transport, transfers to self and receive-and-reduce. */
ncclxResult_t gpuXferRun(struct ncclxComm* comm, ncclxXfer* xfers, int n) {
  if (!gpuDriverLoaded() && gpuNetXfersTakeHost(comm, xfers, n))
    return xferRun(comm, xfers, n); /* no device memory can exist: the common case */
  gpuNetXfers plan;
  NCCLX_CHECK(gpuNetPlanXfers(comm, xfers, n, 1, &plan));
  if (plan.nDirect == 0 && plan.nStage == 0) {
    gpuNetRelease(&plan, 0);
    return xferRun(comm, xfers, n);
  }
  struct region* regions = calloc(plan.nStage ? (size_t)plan.nStage : 1, sizeof(*regions));
  int* index = calloc(plan.nStage ? (size_t)plan.nStage : 1, sizeof(*index)); /* region -> transfer */
  if (!regions || !index) {
    free(regions), free(index);
    gpuNetRelease(&plan, 0);
    return gpuFailComm(comm, ncclxSetError(ncclxSystemError, "out of memory staging %d device transfers", plan.nStage));
  }
  struct staging st = {.comm = comm, .what = "send/recv", .regions = regions, .saved = -1};
  int device = -1;
  for (int i = 0; i < n; i++) {
    int dev;
    if (plan.plan[i] != GPU_NET_STAGE || !isDevice(xfers[i].buf, xfers[i].bytes, &dev)) continue;
    if (device < 0) device = dev;
    regions[st.n] = (struct region){.user = xfers[i].buf, .bytes = xfers[i].bytes,
                                    .in = xfers[i].isSend, .out = !xfers[i].isSend};
    index[st.n++] = i;
  }
  ncclxResult_t res = gpuNetRegister(comm, xfers, n, &plan);
  int staging = st.n > 0 && res == ncclxSuccess;
  if (staging) {
    res = stagingBegin(&st, device);
    if (res == ncclxSuccess) res = stagingCopy(&st, 1);
    if (res != ncclxSuccess) res = gpuFailComm(comm, res);
  }
  int ran = 0;
  if (res == ncclxSuccess) {
    for (int k = 0; k < st.n; k++) xfers[index[k]].buf = hostOf(&st, k);
    res = xferRun(comm, xfers, n);
    ran = 1;
    for (int k = 0; k < st.n; k++) xfers[index[k]].buf = regions[k].user;
    if (res == ncclxSuccess) res = gpuNetFlush(comm, &plan);
    if (res == ncclxSuccess && staging) res = gpuFailComm(comm, stagingCopy(&st, 0));
  }
  if (staging) stagingEnd(&st);
  gpuNetRelease(&plan, ran && res != ncclxSuccess);
  free(regions), free(index);
  return res;
}
