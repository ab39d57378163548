/* The collective suite on device buffers, N ranks forked on one machine (skipped without a
 * GPU): every collective, send/receive and in-place forms, on cudaMalloc'd buffers, for
 * several datatype x op pairs, both with the caller's thread (stream NULL, after
 * cudaDeviceSynchronize) and on a stream from ncclxStreamFromCuda with no host
 * synchronization between the CUDA work that produces inputs and the operation.
 * AllToAllvDynamic[Compact] with device buffers and counts (device counts written on the CUDA
 * stream right before the call). Rank r uses device r % ndev. Values are small integers, so
 * every datatype is exact.
 *
 * The parent never touches CUDA (a forked child cannot use a CUDA context of its parent);
 * each rank checks for a device itself and they all exit 77 without one.
 * Usage: gpu_coll [nranks] (default 2). */
#include <signal.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "gpu_test_util.h"
#include "ncclx.h"
#include "ncclx/cuda.h"
#include "util/reduce.h"

#define COUNT 4099 /* odd: no accidental alignment */

static int nranks, rank;
static ncclxComm_t comm;

/* ---- values ---- */

static void put(void* buf, size_t i, ncclxDataType_t t, double v) {
  char* p = (char*)buf + i * ncclxTypeSize(t);
  switch (t) {
    case ncclxInt8: { int8_t x = (int8_t)v; memcpy(p, &x, 1); break; }
    case ncclxUint8: { uint8_t x = (uint8_t)v; memcpy(p, &x, 1); break; }
    case ncclxInt32: { int32_t x = (int32_t)v; memcpy(p, &x, 4); break; }
    case ncclxUint32: { uint32_t x = (uint32_t)v; memcpy(p, &x, 4); break; }
    case ncclxInt64: { int64_t x = (int64_t)v; memcpy(p, &x, 8); break; }
    case ncclxUint64: { uint64_t x = (uint64_t)v; memcpy(p, &x, 8); break; }
    case ncclxFloat16: { uint16_t x = ncclxFloatToHalf((float)v); memcpy(p, &x, 2); break; }
    case ncclxBfloat16: { uint16_t x = ncclxFloatToBf16((float)v); memcpy(p, &x, 2); break; }
    case ncclxFloat32: { float x = (float)v; memcpy(p, &x, 4); break; }
    default: { double x = v; memcpy(p, &x, 8); break; }
  }
}

/* Input element i of rank r: 1..4, so sums and products of up to 8 ranks stay exact. */
static double input(int r, size_t i) { return (double)((r + (int)i) % 4 + 1); }

static double combine(ncclxRedOp_t op, size_t i) {
  double acc = input(0, i);
  for (int r = 1; r < nranks; r++) {
    double v = input(r, i);
    acc = op == ncclxProd ? acc * v : op == ncclxMax ? (v > acc ? v : acc) : op == ncclxMin ? (v < acc ? v : acc) : acc + v;
  }
  return acc;
}

/* ---- device helpers ---- */

static ncclxStream_t ns;   /* NULL or from ncclxStreamFromCuda */
static cudaStream_t cs;    /* the CUDA stream behind ns */

static void* devAlloc(size_t bytes) {
  void* p;
  CUDA_OK(cudaMalloc(&p, bytes ? bytes : 1));
  return p;
}

/* Upload on the CUDA stream; with stream NULL the host waits, as documented. */
static void upload(void* dst, const void* src, size_t bytes) {
  CUDA_OK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, cs));
  if (!ns) CUDA_OK(cudaStreamSynchronize(cs));
}

/* Download after the operation: on the CUDA stream, ordered by ncclxStreamFromCuda. */
static void download(void* dst, const void* src, size_t bytes) {
  CUDA_OK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, cs));
  CUDA_OK(cudaStreamSynchronize(cs));
}

static void expectEqual(const char* what, ncclxDataType_t t, const void* got, const void* want, size_t n) {
  size_t es = ncclxTypeSize(t);
  for (size_t i = 0; i < n; i++) {
    if (memcmp((const char*)got + i * es, (const char*)want + i * es, es) != 0) {
      CHECK(0, "rank %d: %s %s: element %zu differs (%s stream)", rank, what, ncclxTypeName(t), i,
            ns ? "CUDA" : "NULL");
      return;
    }
  }
}

#define RUN(call) CHECK((call) == ncclxSuccess, "rank %d: %s: %s", rank, #call, ncclxGetLastError(comm))

/* ---- collectives ---- */

static void testAllReduce(ncclxDataType_t t, ncclxRedOp_t op, int inPlace) {
  size_t es = ncclxTypeSize(t), bytes = COUNT * es;
  char *in = malloc(bytes), *want = malloc(bytes), *got = malloc(bytes);
  for (size_t i = 0; i < COUNT; i++) put(in, i, t, input(rank, i)), put(want, i, t, combine(op, i));
  char *dSend = devAlloc(bytes), *dRecv = inPlace ? dSend : devAlloc(bytes);
  upload(dSend, in, bytes);
  RUN(ncclxAllReduce(dSend, dRecv, COUNT, t, op, comm, ns));
  download(got, dRecv, bytes);
  expectEqual(inPlace ? "allreduce in place" : "allreduce", t, got, want, COUNT);
  CUDA_OK(cudaFree(dSend));
  if (!inPlace) CUDA_OK(cudaFree(dRecv));
  free(in), free(want), free(got);
}

static void testBroadcastReduce(ncclxDataType_t t, ncclxRedOp_t op) {
  size_t es = ncclxTypeSize(t), bytes = COUNT * es;
  int root = nranks - 1;
  char *in = malloc(bytes), *want = malloc(bytes), *got = malloc(bytes);
  char *dSend = devAlloc(bytes), *dRecv = devAlloc(bytes);
  for (size_t i = 0; i < COUNT; i++) put(in, i, t, input(rank, i)), put(want, i, t, input(root, i));
  upload(dSend, in, bytes);
  RUN(ncclxBroadcast(dSend, dRecv, COUNT, t, root, comm, ns));
  download(got, dRecv, bytes);
  expectEqual("broadcast", t, got, want, COUNT);
  for (size_t i = 0; i < COUNT; i++) put(want, i, t, combine(op, i));
  RUN(ncclxReduce(dSend, dRecv, COUNT, t, op, root, comm, ns));
  download(got, dRecv, bytes);
  if (rank == root) expectEqual("reduce", t, got, want, COUNT);
  CUDA_OK(cudaFree(dSend));
  CUDA_OK(cudaFree(dRecv));
  free(in), free(want), free(got);
}

static void testGatherScatter(ncclxDataType_t t, ncclxRedOp_t op, int inPlace) {
  size_t es = ncclxTypeSize(t), n = (size_t)nranks;
  char *in = malloc(n * COUNT * es), *want = malloc(n * COUNT * es), *got = malloc(n * COUNT * es);
  char* dBig = devAlloc(n * COUNT * es);
  char* dSmall = inPlace ? dBig + (size_t)rank * COUNT * es : devAlloc(COUNT * es);
  /* allgather: block r is rank r's input */
  for (size_t i = 0; i < COUNT; i++) put(in, i, t, input(rank, i));
  for (int r = 0; r < nranks; r++)
    for (size_t i = 0; i < COUNT; i++) put(want, r * COUNT + i, t, input(r, i));
  upload(dSmall, in, COUNT * es);
  RUN(ncclxAllGather(dSmall, dBig, COUNT, t, comm, ns));
  download(got, dBig, n * COUNT * es);
  expectEqual(inPlace ? "allgather in place" : "allgather", t, got, want, n * COUNT);
  /* reduce-scatter: element j of the full vector is input(r, j) on rank r */
  for (size_t j = 0; j < n * COUNT; j++) put(in, j, t, input(rank, j));
  for (size_t i = 0; i < COUNT; i++) put(want, i, t, combine(op, (size_t)rank * COUNT + i));
  upload(dBig, in, n * COUNT * es);
  RUN(ncclxReduceScatter(dBig, dSmall, COUNT, t, op, comm, ns));
  download(got, dSmall, COUNT * es);
  expectEqual(inPlace ? "reducescatter in place" : "reducescatter", t, got, want, COUNT);
  CUDA_OK(cudaFree(dBig));
  if (!inPlace) CUDA_OK(cudaFree(dSmall));
  free(in), free(want), free(got);
}

static void testAllToAll(ncclxDataType_t t) {
  size_t es = ncclxTypeSize(t), n = (size_t)nranks;
  char *in = malloc(n * COUNT * es), *want = malloc(n * COUNT * es), *got = malloc(n * COUNT * es);
  char *dSend = devAlloc(n * COUNT * es), *dRecv = devAlloc(n * COUNT * es);
  /* block p of rank r's send buffer holds values r*8+p.. */
  for (int p = 0; p < nranks; p++)
    for (size_t i = 0; i < COUNT; i++) {
      put(in, p * COUNT + i, t, (double)((rank * 3 + p + (int)i) % 5));
      put(want, p * COUNT + i, t, (double)((p * 3 + rank + (int)i) % 5));
    }
  upload(dSend, in, n * COUNT * es);
  RUN(ncclxAllToAll(dSend, dRecv, COUNT, t, comm, ns));
  download(got, dRecv, n * COUNT * es);
  expectEqual("alltoall", t, got, want, n * COUNT);

  /* all-to-all-v: rank r sends (r + p) % 3 * 100 elements to p, blocks in reverse order
   * with gaps; the gaps of the receive buffer must survive. */
  size_t sc[64], sd[64], rc[64], rd[64], sspan = 0, rspan = 0;
  for (int p = nranks - 1; p >= 0; p--) sc[p] = (size_t)((rank + p) % 3) * 100, sd[p] = sspan + 1, sspan += sc[p] + 2;
  for (int p = 0; p < nranks; p++) rc[p] = (size_t)((p + rank) % 3) * 100, rd[p] = rspan + 3, rspan += rc[p] + 5;
  char *vin = calloc(sspan + 1, es), *vwant = malloc((rspan + 1) * es), *vgot = malloc((rspan + 1) * es);
  char *dvs = devAlloc(sspan * es), *dvr = devAlloc(rspan * es);
  for (int p = 0; p < nranks; p++)
    for (size_t i = 0; i < sc[p]; i++) put(vin, sd[p] + i, t, (double)((rank + 2 * p + (int)i) % 7));
  for (size_t j = 0; j < rspan; j++) put(vwant, j, t, 9.0); /* gaps keep this */
  for (int p = 0; p < nranks; p++)
    for (size_t i = 0; i < rc[p]; i++) put(vwant, rd[p] + i, t, (double)((p + 2 * rank + (int)i) % 7));
  for (size_t j = 0; j < rspan; j++) put(vgot, j, t, 9.0);
  upload(dvs, vin, sspan * es);
  upload(dvr, vgot, rspan * es);
  RUN(ncclxAllToAllv(dvs, sc, sd, dvr, rc, rd, t, comm, ns));
  download(vgot, dvr, rspan * es);
  expectEqual("alltoallv", t, vgot, vwant, rspan);
  CUDA_OK(cudaFree(dSend));
  CUDA_OK(cudaFree(dRecv));
  CUDA_OK(cudaFree(dvs));
  CUDA_OK(cudaFree(dvr));
  free(in), free(want), free(got), free(vin), free(vwant), free(vgot);
}

/* AllToAllvDynamic with everything in device memory, the send counts uploaded on the CUDA
 * stream just before the call (with ncclxStreamFromCuda: no host synchronization), and the
 * compact form with device buffers and host counts. Rank r sends (r*7 + p*3) % 4 * 70
 * elements to p, plus one to itself; slot tails keep their 9s. */
#define DYN_MAX 300
static size_t dynCount(int from, int to) { return (size_t)((from * 7 + to * 3) % 4) * 70 + (from == to); }

static void testAllToAllvDynamic(ncclxDataType_t t, int compact) {
  size_t es = ncclxTypeSize(t), n = (size_t)nranks, sc[64], rc[64], rd[64], total = 0;
  for (int p = 0; p < nranks; p++) total += sc[p] = dynCount(rank, p);
  size_t recvElems = n * DYN_MAX;
  char *in = malloc(total * es + 1), *want = malloc(recvElems * es), *got = malloc(recvElems * es);
  size_t off = 0;
  for (int p = 0; p < nranks; p++)
    for (size_t i = 0; i < sc[p]; i++) put(in, off++, t, (double)((rank * 5 + p + (int)i) % 7));
  for (size_t j = 0; j < recvElems; j++) put(want, j, t, 9.0), put(got, j, t, 9.0);
  size_t pos = 0;
  for (int p = 0; p < nranks; p++) {
    size_t at = compact ? pos : (size_t)p * DYN_MAX;
    for (size_t i = 0; i < dynCount(p, rank); i++) put(want, at + i, t, (double)((p * 5 + rank + (int)i) % 7));
    pos += dynCount(p, rank);
  }
  char *dSend = devAlloc(total * es), *dRecv = devAlloc(recvElems * es);
  size_t *dCounts = devAlloc(n * sizeof(size_t)), *dRecvCounts = devAlloc(n * sizeof(size_t));
  upload(dSend, in, total * es);
  upload(dRecv, got, recvElems * es);
  if (compact) {
    RUN(ncclxAllToAllvDynamicCompact(dSend, sc, dRecv, recvElems, rc, rd, t, comm, ns));
    if (ns) CHECK(ncclxStreamSynchronize(ns) == ncclxSuccess, "rank %d: %s", rank, ncclxGetLastError(comm));
  } else {
    upload(dCounts, sc, n * sizeof(size_t));
    RUN(ncclxAllToAllvDynamic(dSend, dCounts, dRecv, DYN_MAX, dRecvCounts, t, comm, ns));
    download(rc, dRecvCounts, n * sizeof(size_t));
  }
  download(got, dRecv, recvElems * es);
  pos = 0;
  for (int p = 0; p < nranks; p++) {
    CHECK(rc[p] == dynCount(p, rank), "rank %d: dynamic recvcounts[%d] = %zu, expected %zu", rank, p, rc[p],
          dynCount(p, rank));
    if (compact) CHECK(rd[p] == pos, "rank %d: rdispls[%d] = %zu, expected %zu", rank, p, rd[p], pos);
    pos += dynCount(p, rank);
  }
  expectEqual(compact ? "alltoallv_dynamic_compact" : "alltoallv_dynamic", t, got, want, recvElems);
  CUDA_OK(cudaFree(dSend));
  CUDA_OK(cudaFree(dRecv));
  CUDA_OK(cudaFree(dCounts));
  CUDA_OK(cudaFree(dRecvCounts));
  free(in), free(want), free(got);
}

static void testSendRecv(ncclxDataType_t t) {
  size_t es = ncclxTypeSize(t), bytes = COUNT * es;
  int next = (rank + 1) % nranks, prev = (rank + nranks - 1) % nranks;
  char *in = malloc(bytes), *want = malloc(bytes), *got = malloc(bytes);
  char *dSend = devAlloc(bytes), *dRecv = devAlloc(bytes);
  for (size_t i = 0; i < COUNT; i++) put(in, i, t, input(rank, i)), put(want, i, t, input(prev, i));
  upload(dSend, in, bytes);
  RUN(ncclxGroupStart());
  RUN(ncclxSend(dSend, COUNT, t, next, comm, ns));
  RUN(ncclxRecv(dRecv, COUNT, t, prev, comm, ns));
  RUN(ncclxGroupEnd());
  download(got, dRecv, bytes);
  expectEqual("send/recv ring", t, got, want, COUNT);
  CUDA_OK(cudaFree(dSend));
  CUDA_OK(cudaFree(dRecv));
  free(in), free(want), free(got);
}

static int runRank(ncclxUniqueId id) {
  int skip = skipWithoutDevice(rank == 0 ? "gpu_coll" : NULL);
  if (skip) return skip;
  int ndev = 0;
  CUDA_OK(cudaGetDeviceCount(&ndev));
  CUDA_OK(cudaSetDevice(rank % ndev));
  if (ncclxCommInitRank(&comm, nranks, id, rank) != ncclxSuccess) {
    fprintf(stderr, "rank %d: init: %s\n", rank, ncclxGetLastError(NULL));
    return 1;
  }
  const struct { ncclxDataType_t t; ncclxRedOp_t op; } cases[] = {
      {ncclxFloat32, ncclxSum}, {ncclxBfloat16, ncclxMax}, {ncclxFloat16, ncclxSum},
      {ncclxInt32, ncclxProd},  {ncclxUint8, ncclxMin},    {ncclxFloat64, ncclxSum},
  };
  CUDA_OK(cudaStreamCreateWithFlags(&cs, cudaStreamNonBlocking));
  for (int mode = 0; mode < 2; mode++) {
    ns = NULL;
    if (mode == 1 && ncclxStreamFromCuda(cs, &ns) != ncclxSuccess) {
      CHECK(0, "rank %d: ncclxStreamFromCuda: %s", rank, ncclxGetLastError(NULL));
      break;
    }
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
      testAllReduce(cases[c].t, cases[c].op, 0);
      testAllReduce(cases[c].t, cases[c].op, 1);
      testBroadcastReduce(cases[c].t, cases[c].op);
      testGatherScatter(cases[c].t, cases[c].op, 0);
      testGatherScatter(cases[c].t, cases[c].op, 1);
    }
    testAllToAll(ncclxFloat32);
    testAllToAll(ncclxInt8);
    testSendRecv(ncclxBfloat16);
    testAllToAllvDynamic(ncclxFloat32, 0);
    testAllToAllvDynamic(ncclxBfloat16, 1);
    if (ns) {
      CHECK(ncclxStreamSynchronize(ns) == ncclxSuccess, "rank %d: stream: %s", rank, ncclxGetLastError(NULL));
      CHECK(ncclxStreamDestroy(ns) == ncclxSuccess, "rank %d: stream destroy", rank);
    }
  }
  CUDA_OK(cudaStreamDestroy(cs));
  CHECK(ncclxCommDestroy(comm) == ncclxSuccess, "rank %d: destroy", rank);
  return failures ? 1 : 0;
}

int main(int argc, char** argv) {
  nranks = argc > 1 ? atoi(argv[1]) : 2;
  if (nranks < 1 || nranks > 64) return fprintf(stderr, "usage: gpu_coll [nranks 1..64]\n"), 2;
  ncclxUniqueId id;
  if (ncclxGetUniqueId(&id) != ncclxSuccess) return fprintf(stderr, "%s\n", ncclxGetLastError(NULL)), 1;
  pid_t pids[64];
  for (int r = 0; r < nranks; r++) {
    pids[r] = fork();
    if (pids[r] < 0) return perror("fork"), 1;
    if (pids[r] == 0) {
      rank = r;
      alarm(240); /* a hang becomes a failure, not a stuck CI job */
      exit(runRank(id));
    }
  }
  int skipped = 0, failed = 0;
  for (int r = 0; r < nranks; r++) {
    int st;
    if (waitpid(pids[r], &st, 0) < 0) return perror("waitpid"), 1;
    int code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    if (code == 77) skipped++;
    else if (code != 0) failed++, fprintf(stderr, "gpu_coll: rank %d exited with %d\n", r, code);
  }
  if (skipped == nranks) return 77;
  if (failed || skipped) return 1;
  printf("gpu_coll: every collective on device buffers verified on %d ranks\n", nranks);
  return 0;
}
