/* UNIT TEST OF OUR LOGIC, NOT A GPU TEST: which transfers hand a device pointer straight to a
 * network plugin (ptrSupport with NCCLX_PTR_CUDA), which are staged or refused, and how
 * failures are reported. No GPU, no CUDA driver: "device memory" is host memory that the
 * stand-in driver (mock_libcuda.c, loaded as libcuda.so.1) calls device memory, and the
 * "GPUDirect plugin" is the built-in socket network behind a wrapper that advertises other
 * ptrSupport bits and records what the core passes it. What a real plugin does with a real
 * device pointer is not tested here (docs/gpu.md).
 *
 *  - gpuNetDecide: the decision table;
 *  - 2 forked ranks over the socket network on lo (shared memory off):
 *    host buffers with a CUDA-capable plugin: no registration, NULL mhandles;
 *    (CUDA build) device buffers with a CUDA-capable plugin: the device pointer itself goes
 *      to isend/irecv, chunk by chunk, with the mhandle of one regMr(type NCCLX_PTR_CUDA),
 *      deregistered afterwards, the receive flushed once (forceFlush), data intact;
 *    device buffers with a host-only plugin: staging, which fails here with
 *      ncclxUnhandledCudaError and the CUDA error string (CUDA build: no driver) or is refused
 *      with ncclxInvalidUsage (build without CUDA); the peer fails with ncclxRemoteError
 *      instead of waiting, and both communicators abort cleanly;
 *    host buffers with a plugin that takes only device memory: ncclxInvalidUsage naming the
 *      buffer, for send/recv and for collectives;
 *  - (CUDA build) CUDA error mapping: ncclxUnhandledCudaError with the CUDA error string. */
#include <dlfcn.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "comm/comm.h"
#include "gpu/gpu.h"
#include "gpu/gpu_net.h"
#include "ncclx.h"
#include "ncclx/cuda.h"
#include "ncclx/net.h"
#ifdef NCCLX_HAVE_CUDA
#include "gpu/gpu_runtime.h"
#define CUDA_BUILD 1
#else
#define CUDA_BUILD 0
#endif

static int failures, myRank = -1;
/* Pipes between the two forked ranks (see barrier): toPeer[r] carries rank r's bytes. */
static int toPeer[2][2];
#define CHECK(cond, ...)                                                                 \
  do {                                                                                   \
    if (!(cond)) {                                                                       \
      failures++;                                                                        \
      fprintf(stderr, "rank %d: %s:%d: CHECK(%s) failed: ", myRank, __FILE__, __LINE__, #cond); \
      fprintf(stderr, __VA_ARGS__);                                                      \
      fprintf(stderr, "\n");                                                             \
    }                                                                                    \
  } while (0)

/* ---- the decision table ---- */

static void checkDecide(void) {
  enum { H = NCCLX_PTR_HOST, C = NCCLX_PTR_CUDA, D = NCCLX_PTR_DMABUF };
  const struct {
    int kind, ptr, self, cpu, cuda;
    gpuNetPlan want;
    const char* what;
  } rows[] = {
      {GPU_MEM_HOST, H, 0, 0, 1, GPU_NET_PASS, "host memory, host transport"},
      {GPU_MEM_HOST, H | C, 0, 0, 1, GPU_NET_PASS, "host memory, CUDA-capable transport"},
      {GPU_MEM_HOST, C, 0, 0, 1, GPU_NET_REFUSE, "host memory, device-only transport"},
      {GPU_MEM_HOST, C, 1, 0, 1, GPU_NET_PASS, "host memory to self (a CPU copy)"},
      {GPU_MEM_MANAGED, H, 0, 0, 1, GPU_NET_PASS, "managed memory is CPU memory too"},
      {GPU_MEM_MANAGED, C, 0, 0, 1, GPU_NET_REFUSE, "managed memory, device-only transport"},
      {GPU_MEM_DEVICE, H | C, 0, 0, 1, GPU_NET_DIRECT, "device memory, CUDA-capable transport"},
      {GPU_MEM_DEVICE, C, 0, 0, 1, GPU_NET_DIRECT, "device memory, device-only transport"},
      {GPU_MEM_DEVICE, H, 0, 0, 1, GPU_NET_STAGE, "device memory, host transport"},
      {GPU_MEM_DEVICE, H | D, 0, 0, 1, GPU_NET_STAGE, "DMA-BUF alone is not NCCLX_PTR_CUDA"},
      {GPU_MEM_DEVICE, H | C, 1, 0, 1, GPU_NET_STAGE, "device memory to self (the CPU copies)"},
      {GPU_MEM_DEVICE, H | C, 0, 1, 1, GPU_NET_STAGE, "receive-and-reduce (the CPU reduces)"},
      {GPU_MEM_DEVICE, C, 0, 1, 1, GPU_NET_REFUSE, "CPU must touch it, transport takes no host memory"},
      {GPU_MEM_DEVICE, H | C, 0, 0, 0, GPU_NET_REFUSE, "device memory, build without CUDA"},
      {GPU_MEM_DEVICE, H, 0, 0, 0, GPU_NET_REFUSE, "device memory, build without CUDA, host transport"},
      {GPU_MEM_HOST, H, 0, 0, 0, GPU_NET_PASS, "host memory, build without CUDA"},
  };
  for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
    gpuNetPlan got = gpuNetDecide(rows[i].kind, rows[i].ptr, rows[i].self, rows[i].cpu, rows[i].cuda);
    CHECK(got == rows[i].want, "%s: plan %d, expected %d", rows[i].what, (int)got, (int)rows[i].want);
  }
}

/* ---- a wrapper around the socket network ---- */

static const ncclxNet_t* realNet;
enum { WRAP_HOST_CUDA, WRAP_HOST, WRAP_CUDA_ONLY, NUM_WRAPS };
static ncclxNet_t wraps[NUM_WRAPS]; /* distinct tables: the core caches properties per plugin */
static char regToken, flushToken;

static struct {
  char* watch; /* the "device" buffer */
  size_t watchBytes;
  int regs, regType, regBad, deregs, deregBad, flushes, flushBad;
  int watchedWithMh, watchedWrongMh, otherWithMh, otherNoMh;
} W;

static ncclxResult_t props(void* ctx, int dev, ncclxNetProperties_t* p, int ptrSupport, int forceFlush) {
  ncclxResult_t res = realNet->getProperties(ctx, dev, p);
  p->ptrSupport = ptrSupport;
  p->forceFlush = forceFlush;
  return res;
}
static ncclxResult_t propsHostCuda(void* ctx, int dev, ncclxNetProperties_t* p) {
  return props(ctx, dev, p, NCCLX_PTR_HOST | NCCLX_PTR_CUDA, 1);
}
static ncclxResult_t propsHost(void* ctx, int dev, ncclxNetProperties_t* p) { return props(ctx, dev, p, NCCLX_PTR_HOST, 0); }
static ncclxResult_t propsCudaOnly(void* ctx, int dev, ncclxNetProperties_t* p) { return props(ctx, dev, p, NCCLX_PTR_CUDA, 0); }

static ncclxResult_t wRegMr(void* comm, void* data, size_t size, int type, void** mh) {
  (void)comm;
  W.regs++;
  W.regType = type;
  W.regBad += data != W.watch || size > W.watchBytes;
  *mh = &regToken;
  return ncclxSuccess;
}
static ncclxResult_t wDeregMr(void* comm, void* mh) {
  (void)comm;
  W.deregs++;
  W.deregBad += mh != &regToken;
  return ncclxSuccess;
}
static void note(const void* data, size_t size, const void* mh) {
  const char* p = data;
  if (W.watch && p >= W.watch && p + size <= W.watch + W.watchBytes) {
    if (mh == &regToken) W.watchedWithMh++;
    else W.watchedWrongMh++;
  } else if (mh) {
    W.otherWithMh++;
  } else {
    W.otherNoMh++;
  }
}
/* Counted once posted (a busy transport returns no request and the core retries). */
static ncclxResult_t wIsend(void* sendComm, void* data, size_t size, int tag, void* mh, void* ph, void** req) {
  ncclxResult_t res = realNet->isend(sendComm, data, size, tag, NULL, ph, req);
  if (res == ncclxSuccess && *req) note(data, size, mh);
  return res;
}
static ncclxResult_t wIrecv(void* recvComm, int n, void** data, size_t* sizes, int* tags, void** mhs, void** phs,
                            void** req) {
  ncclxResult_t res = realNet->irecv(recvComm, n, data, sizes, tags, NULL, phs, req);
  if (res == ncclxSuccess && *req) note(data[0], sizes[0], mhs ? mhs[0] : NULL);
  return res;
}
static ncclxResult_t wIflush(void* recvComm, int n, void** data, size_t* sizes, void** mhs, void** req) {
  (void)recvComm;
  W.flushes++;
  W.flushBad += n != 1 || data[0] != W.watch || sizes[0] != W.watchBytes || mhs[0] != &regToken;
  *req = &flushToken;
  return ncclxSuccess;
}
static ncclxResult_t wTest(void* req, int* done, size_t* sizes) {
  if (req == &flushToken) return *done = 1, ncclxSuccess;
  return realNet->test(req, done, sizes);
}

static void install(struct ncclxComm* c, const ncclxNet_t* net) {
  if (!realNet) {
    realNet = c->tp[NCCLX_TP_NET].net;
    ncclxResult_t (*getProps[NUM_WRAPS])(void*, int, ncclxNetProperties_t*) = {propsHostCuda, propsHost, propsCudaOnly};
    for (int k = 0; k < NUM_WRAPS; k++) {
      wraps[k] = *realNet;
      wraps[k].getProperties = getProps[k];
      wraps[k].regMr = wRegMr;
      wraps[k].deregMr = wDeregMr;
      wraps[k].isend = wIsend;
      wraps[k].irecv = wIrecv;
      wraps[k].iflush = wIflush;
      wraps[k].test = wTest;
    }
  }
  const ncclxNet_t* old = c->tp[NCCLX_TP_NET].net;
  c->tp[NCCLX_TP_NET].net = net;
  for (int p = 0; p < c->nranks; p++)
    if (c->conns[p].net == old) c->conns[p].net = net;
}

/* One send/receive step through the GPU path, as enqueue.c runs it. */
static ncclxResult_t step(struct ncclxComm* c, int isSend, void* buf, size_t bytes) {
  static unsigned long long seq;
  ncclxXfer x = {.peer = 1 - c->rank, .isSend = isSend, .buf = buf, .bytes = bytes, .chunk = 64 << 10};
  pthread_mutex_lock(&c->execLock);
  c->curOpName = "send/recv";
  c->curOpSeq = ++seq;
  ncclxResult_t res = gpuXferRun(c, &x, 1);
  c->curOpName = NULL;
  pthread_mutex_unlock(&c->execLock);
  return res;
}

static void fill(unsigned char* p, size_t n, unsigned seed) {
  for (size_t i = 0; i < n; i++) p[i] = (unsigned char)(i * 131 + seed);
}
static int same(const unsigned char* p, size_t n, unsigned seed) {
  for (size_t i = 0; i < n; i++)
    if (p[i] != (unsigned char)(i * 131 + seed)) return 0;
  return 1;
}

/* Sends complete into socket buffers: without this a rank could run ahead into the next
 * scenario (and its failure) while its peer still receives. The all-reduce alone is not
 * enough: a rank that has the peer's data leaves it while the peer still waits for its own,
 * and the failure the first rank then provokes on purpose reaches the peer as an abort notice
 * inside the all-reduce (seen once in CI: "barrier: rank 0 reports: send/recv #4 ..."). So
 * each rank also tells the other through a pipe that its all-reduce is over, and waits to be
 * told the same. */
static void barrier(struct ncclxComm* c) {
  float x = 1.0f;
  CHECK(ncclxAllReduce(&x, &x, 1, ncclxFloat32, ncclxSum, c, NULL) == ncclxSuccess && x == 2.0f, "barrier: %s",
        ncclxGetLastError(c));
  char done = 1;
  CHECK(write(toPeer[c->rank][1], &done, 1) == 1 && read(toPeer[1 - c->rank][0], &done, 1) == 1,
        "barrier: the pipe to the other rank broke");
}

static struct ncclxComm* initComm(ncclxUniqueId id, int rank) {
  ncclxComm_t comm = NULL;
  if (ncclxCommInitRank(&comm, 2, id, rank) != ncclxSuccess) {
    fprintf(stderr, "rank %d: init: %s\n", rank, ncclxGetLastError(NULL));
    exit(1);
  }
  if (((struct ncclxComm*)comm)->tp[NCCLX_TP_SHM].net) {
    fprintf(stderr, "rank %d: shared memory is on despite NCCLX_CORE_SHM=0\n", rank);
    exit(1);
  }
  /* Connect both ways with the real network first: the acceptor matches an incoming
   * connection against the transport it listened with, which the wrapper is not. */
  barrier((struct ncclxComm*)comm);
  return (struct ncclxComm*)comm;
}

/* Put the real network back before the communicator closes its connections. */
static void finish(struct ncclxComm* c, int abort) {
  install(c, realNet);
  ncclxResult_t res = abort ? ncclxCommAbort(c) : ncclxCommDestroy(c);
  CHECK(res == ncclxSuccess, "%s: %d", abort ? "abort" : "destroy", (int)res);
}

#define BYTES ((200u << 10) + 100) /* 4 chunks of 64 KiB */


static void hostWithCudaPlugin(struct ncclxComm* c) {
  unsigned char* buf = malloc(BYTES);
  memset(&W, 0, sizeof W);
  install(c, &wraps[WRAP_HOST_CUDA]);
  if (c->rank == 0) fill(buf, BYTES, 7);
  ncclxResult_t res = step(c, c->rank == 0, buf, BYTES);
  CHECK(res == ncclxSuccess, "host step: %s", ncclxGetLastError(c));
  if (c->rank == 1) CHECK(same(buf, BYTES, 7), "host data");
  CHECK(W.regs == 0 && W.otherWithMh == 0 && W.otherNoMh == 4, "host memory: regs %d, with mh %d, without %d",
        W.regs, W.otherWithMh, W.otherNoMh);
  free(buf);
}

static void deviceWithCudaPlugin(struct ncclxComm* c, unsigned char* dev) {
  memset(&W, 0, sizeof W);
  W.watch = (char*)dev, W.watchBytes = BYTES;
  install(c, &wraps[WRAP_HOST_CUDA]);
  if (c->rank == 0) fill(dev, BYTES, 11);
  else memset(dev, 0, BYTES);
  ncclxResult_t res = step(c, c->rank == 0, dev, BYTES);
  CHECK(res == ncclxSuccess, "direct step: %s", ncclxGetLastError(c));
  if (c->rank == 1) CHECK(same(dev, BYTES, 11), "direct data");
  CHECK(W.regs == 1 && W.regType == NCCLX_PTR_CUDA && W.regBad == 0, "regMr: %d calls, type %d, bad %d", W.regs,
        W.regType, W.regBad);
  CHECK(W.watchedWithMh == 4 && W.watchedWrongMh == 0 && W.otherWithMh == 0 && W.otherNoMh == 0,
        "device pointer passed directly: with mh %d, wrong mh %d, elsewhere %d/%d", W.watchedWithMh,
        W.watchedWrongMh, W.otherWithMh, W.otherNoMh);
  CHECK(W.deregs == 1 && W.deregBad == 0, "deregMr: %d, bad %d", W.deregs, W.deregBad);
  CHECK(W.flushes == (c->rank == 1) && W.flushBad == 0, "iflush: %d, bad %d", W.flushes, W.flushBad);
}

/* Rank 0 sends "device" memory through a host-only plugin: staging, which cannot work here. */
static void deviceWithHostPlugin(struct ncclxComm* c, unsigned char* dev) {
  unsigned char* host = malloc(BYTES);
  install(c, &wraps[WRAP_HOST]);
  ncclxResult_t res = step(c, c->rank == 0, c->rank == 0 ? dev : host, BYTES);
  const char* msg = ncclxGetLastError(c);
  if (c->rank == 0) {
#ifdef NCCLX_HAVE_CUDA
    CHECK(res == ncclxUnhandledCudaError, "staging without a driver: %d (%s)", (int)res, msg);
    CHECK(strstr(msg, "(cudaError") != NULL, "CUDA error string missing: %s", msg);
#else
    CHECK(res == ncclxInvalidUsage, "device memory without CUDA: %d (%s)", (int)res, msg);
    CHECK(strstr(msg, "send buffer") && strstr(msg, "built without CUDA"), "message: %s", msg);
#endif
  } else {
    CHECK(res == ncclxRemoteError, "peer of the failed rank: %d (%s)", (int)res, msg);
    CHECK(strstr(msg, "rank 0") != NULL, "peer's message does not name rank 0: %s", msg);
  }
  ncclxResult_t async = ncclxSuccess;
  CHECK(ncclxCommGetAsyncError(c, &async) == ncclxSuccess && async != ncclxSuccess, "no async error");
  printf("rank %d: %s\n", c->rank, msg);
  free(host);
}

static void hostWithDeviceOnlyPlugin(struct ncclxComm* c, int collective) {
  unsigned char buf[256] = {0};
  install(c, &wraps[WRAP_CUDA_ONLY]);
  ncclxResult_t res = collective ? ncclxAllReduce(buf, buf, 64, ncclxFloat32, ncclxSum, c, NULL)
                                 : step(c, c->rank == 0, buf, sizeof buf);
  const char* msg = ncclxGetLastError(c);
  CHECK(res == ncclxInvalidUsage, "%s: %d (%s)", collective ? "allreduce" : "send/recv", (int)res, msg);
  CHECK(strstr(msg, "takes only device memory") && strstr(msg, "NCCLX_PTR_HOST"), "message: %s", msg);
  if (!collective) CHECK(strstr(msg, c->rank == 0 ? "send buffer" : "receive buffer") != NULL, "names: %s", msg);
  printf("rank %d: %s\n", c->rank, msg);
}

static int runRank(const ncclxUniqueId* ids, int rank) {
  myRank = rank;
  /* Start (and fail) the CUDA runtime before the stand-in driver is loaded, as an
   * application without a GPU would find it. */
  int ndev = 0, haveMock = 1;
#ifdef NCCLX_HAVE_CUDA
  if (ncclxCudaGetDeviceCount(&ndev) != ncclxSuccess) ndev = 0;
#endif
  void* real = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  if (real || ndev > 0) {
    haveMock = 0; /* a real driver answers for libcuda.so.1: no stand-in possible */
    if (real) dlclose(real);
  }
  unsigned char* dev = malloc(BYTES);
  if (haveMock) {
    void* mock = dlopen(MOCK_LIBCUDA_PATH, RTLD_NOW | RTLD_GLOBAL);
    void (*setRanges)(const void*, size_t, const void*, size_t) =
        mock ? (void (*)(const void*, size_t, const void*, size_t))dlsym(mock, "mockCudaSetRanges") : NULL;
    if (!setRanges) return fprintf(stderr, "rank %d: stand-in driver: %s\n", rank, dlerror()), 1;
    setRanges(dev, BYTES, NULL, 0);
    CHECK(gpuProbePointer(dev, NULL) == GPU_MEM_DEVICE, "stand-in driver not consulted");
  }
#ifdef NCCLX_HAVE_CUDA
  if (rank == 0) {
    ncclxResult_t res = gpuCudaError(cudaErrorIllegalAddress, "allreduce #7: cudaMemcpyAsync device to host");
    const char* msg = ncclxGetLastError(NULL);
    CHECK(res == ncclxUnhandledCudaError, "gpuCudaError: %d", (int)res);
    CHECK(strcmp(msg, "allreduce #7: cudaMemcpyAsync device to host: an illegal memory access was encountered "
                      "(cudaErrorIllegalAddress)") == 0, "message: %s", msg);
  }
#endif

  struct ncclxComm* c = initComm(ids[0], rank);
  hostWithCudaPlugin(c);
  barrier(c);
  if (haveMock && CUDA_BUILD) {
    deviceWithCudaPlugin(c, dev);
    barrier(c);
  }
  if (haveMock) {
    deviceWithHostPlugin(c, dev);
    finish(c, 1);
  } else {
    finish(c, 0);
  }
  c = initComm(ids[1], rank);
  hostWithDeviceOnlyPlugin(c, 0);
  finish(c, 1);
  c = initComm(ids[2], rank);
  hostWithDeviceOnlyPlugin(c, 1);
  finish(c, 1);
  free(dev);
  if (!haveMock) printf("rank %d: a CUDA driver is present: stand-in driver checks not run\n", rank);
  return failures ? 1 : 0;
}

int main(void) {
  setenv("NCCLX_CORE_SHM", "0", 1); /* every peer over the (wrapped) network; before any config read */
  checkDecide();
  if (failures) return 1;
  ncclxUniqueId ids[3];
  for (int i = 0; i < 3; i++)
    if (ncclxGetUniqueId(&ids[i]) != ncclxSuccess) return fprintf(stderr, "unique id failed\n"), 1;
  for (int r = 0; r < 2; r++)
    if (pipe(toPeer[r]) != 0) return perror("pipe"), 1;
  pid_t pids[2];
  for (int r = 0; r < 2; r++) {
    if ((pids[r] = fork()) < 0) return perror("fork"), 1;
    if (pids[r] == 0) {
      alarm(90); /* a hang is a failure */
      exit(runRank(ids, r));
    }
  }
  int failed = 0;
  for (int r = 0; r < 2; r++) {
    int st;
    if (waitpid(pids[r], &st, 0) < 0 || !WIFEXITED(st) || WEXITSTATUS(st) != 0) failed = 1;
  }
  if (failed) return fprintf(stderr, "test_gpu_net (%s): a rank failed\n", CUDA_BUILD ? "CUDA build" : "no CUDA"), 1;
  printf("test_gpu_net (%s, unit test of the decision logic with a stand-in driver and a wrapped socket "
         "network, NOT a GPU test): passed\n", CUDA_BUILD ? "CUDA build" : "build without CUDA");
  return 0;
}
