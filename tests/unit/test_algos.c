/* Every collective algorithm, forced with NCCLX_ALGO, at 1..8 ranks: results against a
 * reference computed locally (each rank can compute every rank's input), for counts 0, 1, 7,
 * 1000 and 2^20+3, in place and out of place, with bit-identical allreduce results across
 * ranks. Ranks are forked processes using only the public API (ncclx.h, ncclx/tuner.h);
 * they meet at NCCLX_COMM_ID=127.0.0.1:<free port>.
 *
 * Algorithms are tested in "rounds": round k forces the k-th algorithm of every collective
 * (wrapping around), so four rounds cover all of them. NCCLX_ALGO is read once per process,
 * hence one process group per (round, rank count).
 *
 * Usage: test_algos [maxRanks]   (default 8) */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "ncclx.h"
#include "ncclx/tuner.h"

#define BIG_COUNT ((size_t)(1u << 20) + 3)
#define GROUP_DEADLINE_S 150 /* a hung group is killed and reported, never waited on forever */

static const size_t kCounts[] = {0, 1, 7, 1000, BIG_COUNT};
#define NCOUNTS (sizeof kCounts / sizeof kCounts[0])

/* ---------------- algorithm rounds ---------------- */

typedef struct {
  ncclxCollType_t coll;
  int algos[5];
  int nalgos;
} collAlgos;

static const collAlgos kAlgos[] = {
    {NCCLX_COLL_ALLREDUCE,
     {NCCLX_ALGO_RING, NCCLX_ALGO_RECURSIVE_DOUBLING, NCCLX_ALGO_RABENSEIFNER, NCCLX_ALGO_TREE,
      NCCLX_ALGO_LINEAR},
     5},
    {NCCLX_COLL_BROADCAST, {NCCLX_ALGO_TREE, NCCLX_ALGO_RING}, 2},
    {NCCLX_COLL_REDUCE, {NCCLX_ALGO_TREE}, 1},
    {NCCLX_COLL_ALLGATHER,
     {NCCLX_ALGO_RING, NCCLX_ALGO_BRUCK, NCCLX_ALGO_RECURSIVE_DOUBLING, NCCLX_ALGO_LINEAR},
     4},
    {NCCLX_COLL_REDUCESCATTER, {NCCLX_ALGO_RING, NCCLX_ALGO_PAIRWISE, NCCLX_ALGO_LINEAR}, 3},
    {NCCLX_COLL_ALLTOALL, {NCCLX_ALGO_PAIRWISE, NCCLX_ALGO_LINEAR, NCCLX_ALGO_BRUCK}, 3},
    {NCCLX_COLL_ALLTOALLV, {NCCLX_ALGO_PAIRWISE, NCCLX_ALGO_LINEAR}, 2},
};
#define NROUNDS 5 /* the most algorithms a collective has: every one runs */

static void buildAlgoEnv(int round, char* buf, size_t size) {
  size_t used = 0;
  buf[0] = '\0';
  for (size_t c = 0; c < sizeof kAlgos / sizeof kAlgos[0]; c++) {
    int algo = kAlgos[c].algos[round % kAlgos[c].nalgos];
    used += (size_t)snprintf(buf + used, size - used, "%s%s:%s", used ? "," : "",
                             ncclxCollName(kAlgos[c].coll), ncclxAlgoName(algo));
  }
}

/* ---------------- checking ---------------- */

static int gRank, gN, gRound, gErrors;
static ncclxComm_t gComm;

#define FAIL(...)                                                              \
  do {                                                                         \
    if (gErrors++ < 10) {                                                      \
      fprintf(stderr, "[round %d n=%d rank %d] ", gRound, gN, gRank);          \
      fprintf(stderr, __VA_ARGS__);                                            \
      fprintf(stderr, "\n");                                                   \
    }                                                                          \
  } while (0)

#define CALL(what, call)                                                                 \
  do {                                                                                   \
    ncclxResult_t r_ = (call);                                                           \
    if (r_ != ncclxSuccess) {                                                            \
      FAIL("%s failed: %s (%s)", what, ncclxGetErrorString(r_), ncclxGetLastError(gComm)); \
      return;                                                                            \
    }                                                                                    \
  } while (0)

static void* xmalloc(size_t bytes) {
  void* p = malloc(bytes ? bytes : 1);
  if (!p) {
    fprintf(stderr, "out of memory (%zu bytes)\n", bytes);
    _exit(3);
  }
  return p;
}

/* Small integers: sums and products of up to 8 ranks are exact in every float type. */
static int32_t smallVal(int rank, size_t i) { return (int32_t)((rank * 7 + i * 13) % 17) - 8; }
/* Full-range int32 so sums wrap. */
static uint32_t wideVal(int rank, size_t i) {
  return (uint32_t)rank * 2654435761u + (uint32_t)i * 40503u + 0x7fffff00u;
}
static unsigned char byteVal(int src, int dst, size_t i) {
  return (unsigned char)(src * 31 + dst * 7 + i * 3 + (i >> 8) + 1);
}

static uint16_t floatToBf16(float f) { /* round to nearest even; inputs here are finite */
  uint32_t x;
  memcpy(&x, &f, 4);
  x += 0x7fffu + ((x >> 16) & 1u);
  return (uint16_t)(x >> 16);
}

static void checkBytes(const char* what, size_t count, const unsigned char* got,
                       const unsigned char* want, size_t bytes) {
  if (bytes == 0 || memcmp(got, want, bytes) == 0) return;
  size_t i = 0;
  while (got[i] == want[i]) i++;
  FAIL("%s count %zu: first wrong byte %zu of %zu (got %u want %u)", what, count, i, bytes,
       got[i], want[i]);
}

/* ---------------- collectives ---------------- */

static void testAllreduce(size_t count, int inPlace) {
  /* float sum of small integers (exact) */
  float* send = xmalloc(count * sizeof(float));
  float* recv = inPlace ? send : xmalloc(count * sizeof(float));
  float* want = xmalloc(count * sizeof(float));
  for (size_t i = 0; i < count; i++) {
    send[i] = (float)smallVal(gRank, i);
    float s = 0;
    for (int r = 0; r < gN; r++) s += (float)smallVal(r, i);
    want[i] = s;
  }
  CALL("allreduce fp32 sum", ncclxAllReduce(send, recv, count, ncclxFloat32, ncclxSum, gComm, NULL));
  checkBytes(inPlace ? "allreduce fp32 sum in place" : "allreduce fp32 sum", count,
             (unsigned char*)recv, (unsigned char*)want, count * sizeof(float));
  if (!inPlace) free(recv);
  free(send);
  free(want);

  /* int32 sum with wraparound, unaligned buffers */
  char* raw = xmalloc(count * 4 + 1);
  char* rawOut = xmalloc(count * 4 + 3);
  char* s32 = raw + 1;
  char* r32 = inPlace ? s32 : rawOut + 3;
  uint32_t* w32 = xmalloc(count * 4);
  for (size_t i = 0; i < count; i++) {
    uint32_t v = wideVal(gRank, i), s = 0;
    memcpy(s32 + 4 * i, &v, 4);
    for (int r = 0; r < gN; r++) s += wideVal(r, i);
    w32[i] = s;
  }
  CALL("allreduce int32 sum", ncclxAllReduce(s32, r32, count, ncclxInt32, ncclxSum, gComm, NULL));
  checkBytes("allreduce int32 sum (unaligned)", count, (unsigned char*)r32, (unsigned char*)w32,
             count * 4);
  free(raw);
  free(rawOut);
  free(w32);

  if (count > 1000) return; /* the remaining types and ops at moderate sizes */
  /* bf16 avg, fp64 max, uint8 min, int64 prod */
  uint16_t* b16 = xmalloc(count * 2);
  uint16_t* b16want = xmalloc(count * 2);
  double* f64 = xmalloc(count * 8);
  double* f64want = xmalloc(count * 8);
  uint8_t* u8 = xmalloc(count);
  uint8_t* u8want = xmalloc(count);
  int64_t* i64 = xmalloc(count * 8);
  int64_t* i64want = xmalloc(count * 8);
  for (size_t i = 0; i < count; i++) {
    b16[i] = floatToBf16((float)smallVal(gRank, i));
    f64[i] = (double)smallVal(gRank, i) / 3.0;
    u8[i] = (uint8_t)(smallVal(gRank, i) + 8);
    i64[i] = (smallVal(gRank, i) % 3) + ((i + (size_t)gRank) % 4 == 0 ? 5 : 0);
    float s = 0;
    double mx = -1e300;
    uint8_t mn = 255;
    uint64_t pr = 1;
    for (int r = 0; r < gN; r++) {
      s += (float)smallVal(r, i);
      double d = (double)smallVal(r, i) / 3.0;
      if (d > mx) mx = d;
      uint8_t u = (uint8_t)(smallVal(r, i) + 8);
      if (u < mn) mn = u;
      pr *= (uint64_t)(int64_t)((smallVal(r, i) % 3) + ((i + (size_t)r) % 4 == 0 ? 5 : 0));
    }
    b16want[i] = floatToBf16(s * (1.0f / (float)gN));
    f64want[i] = mx;
    u8want[i] = mn;
    memcpy(&i64want[i], &pr, 8);
  }
  uint16_t* b16out = inPlace ? b16 : xmalloc(count * 2);
  CALL("allreduce bf16 avg", ncclxAllReduce(b16, b16out, count, ncclxBfloat16, ncclxAvg, gComm, NULL));
  checkBytes("allreduce bf16 avg", count, (unsigned char*)b16out, (unsigned char*)b16want, count * 2);
  CALL("allreduce fp64 max", ncclxAllReduce(f64, f64, count, ncclxFloat64, ncclxMax, gComm, NULL));
  checkBytes("allreduce fp64 max", count, (unsigned char*)f64, (unsigned char*)f64want, count * 8);
  CALL("allreduce uint8 min", ncclxAllReduce(u8, u8, count, ncclxUint8, ncclxMin, gComm, NULL));
  checkBytes("allreduce uint8 min", count, u8, u8want, count);
  CALL("allreduce int64 prod", ncclxAllReduce(i64, i64, count, ncclxInt64, ncclxProd, gComm, NULL));
  checkBytes("allreduce int64 prod", count, (unsigned char*)i64, (unsigned char*)i64want, count * 8);
  if (!inPlace) free(b16out);
  free(b16), free(b16want), free(f64), free(f64want), free(u8), free(u8want), free(i64),
      free(i64want);
}

/* Inexact float data: every rank must end with the same bits (checked via allgather of a
 * hash, allgather being checked separately). */
static void testAllreduceIdentical(size_t count) {
  float* buf = xmalloc(count * sizeof(float));
  uint64_t seed = 0x1234567ull + (uint64_t)gRank * 0x9e3779b97f4a7c15ull;
  for (size_t i = 0; i < count; i++) {
    seed = seed * 6364136223846793005ull + 1442695040888963407ull;
    buf[i] = (float)((double)(seed >> 11) / 9007199254740992.0 - 0.5) * 1000.0f;
  }
  CALL("allreduce fp32 (inexact)", ncclxAllReduce(buf, buf, count, ncclxFloat32, ncclxSum, gComm, NULL));
  uint64_t h = 1469598103934665603ull;
  const unsigned char* p = (const unsigned char*)buf;
  for (size_t i = 0; i < count * sizeof(float); i++) h = (h ^ p[i]) * 1099511628211ull;
  uint64_t* all = xmalloc(sizeof(uint64_t) * (size_t)gN);
  CALL("allgather hashes", ncclxAllGather(&h, all, 1, ncclxUint64, gComm, NULL));
  for (int r = 0; r < gN; r++)
    if (all[r] != h) FAIL("allreduce fp32 count %zu: rank %d's result differs from mine", count, r);
  free(all);
  free(buf);
}

static void testBroadcast(size_t count, int inPlace) {
  int root = (int)(count % (size_t)gN);
  unsigned char* send = xmalloc(count);
  unsigned char* recv = inPlace ? send : xmalloc(count);
  unsigned char* want = xmalloc(count);
  for (size_t i = 0; i < count; i++) {
    send[i] = gRank == root ? byteVal(root, 0, i) : 0xee;
    want[i] = byteVal(root, 0, i);
  }
  if (!inPlace) memset(recv, 0xdd, count);
  CALL("broadcast", ncclxBroadcast(send, recv, count, ncclxUint8, root, gComm, NULL));
  checkBytes(inPlace ? "broadcast in place" : "broadcast", count, recv, want, count);
  if (!inPlace) free(recv);
  free(send);
  free(want);
}

static void testReduce(size_t count, int inPlace) {
  int root = (int)((count + 1) % (size_t)gN);
  int32_t* send = xmalloc(count * 4);
  int32_t* recv = inPlace ? send : (gRank == root ? xmalloc(count * 4) : NULL);
  int32_t* want = xmalloc(count * 4);
  for (size_t i = 0; i < count; i++) {
    send[i] = smallVal(gRank, i);
    int32_t m = INT32_MIN;
    for (int r = 0; r < gN; r++)
      if (smallVal(r, i) > m) m = smallVal(r, i);
    want[i] = m;
  }
  CALL("reduce", ncclxReduce(send, recv, count, ncclxInt32, ncclxMax, root, gComm, NULL));
  if (gRank == root)
    checkBytes(inPlace ? "reduce max in place" : "reduce max", count, (unsigned char*)recv,
               (unsigned char*)want, count * 4);
  if (!inPlace) free(recv);
  free(send);
  free(want);
}

static void testAllgather(size_t count, int inPlace) {
  size_t total = count * (size_t)gN;
  unsigned char* recv = xmalloc(total + 1);
  unsigned char* send = inPlace ? recv + (size_t)gRank * count : xmalloc(count);
  unsigned char* want = xmalloc(total);
  memset(recv, 0xcc, total + 1);
  for (size_t i = 0; i < count; i++) send[i] = byteVal(gRank, 0, i);
  for (int r = 0; r < gN; r++)
    for (size_t i = 0; i < count; i++) want[(size_t)r * count + i] = byteVal(r, 0, i);
  CALL("allgather", ncclxAllGather(send, recv, count, ncclxInt8, gComm, NULL));
  checkBytes(inPlace ? "allgather in place" : "allgather", count, recv, want, total);
  if (recv[total] != 0xcc) FAIL("allgather count %zu wrote past the end", count);
  if (!inPlace) free(send);
  free(recv);
  free(want);
}

static void testReducescatter(size_t count, int inPlace) {
  size_t total = count * (size_t)gN;
  float* send = xmalloc(total * sizeof(float));
  float* recv = inPlace ? send + (size_t)gRank * count : xmalloc(count * sizeof(float));
  float* want = xmalloc(count * sizeof(float));
  for (size_t i = 0; i < total; i++) send[i] = (float)smallVal(gRank, i);
  for (size_t i = 0; i < count; i++) {
    float s = 0;
    for (int r = 0; r < gN; r++) s += (float)smallVal(r, (size_t)gRank * count + i);
    want[i] = s * (1.0f / (float)gN);
  }
  CALL("reducescatter", ncclxReduceScatter(send, recv, count, ncclxFloat32, ncclxAvg, gComm, NULL));
  checkBytes(inPlace ? "reducescatter avg in place" : "reducescatter avg", count,
             (unsigned char*)recv, (unsigned char*)want, count * sizeof(float));
  if (!inPlace) free(recv);
  free(send);
  free(want);
}

static void testAlltoall(size_t count, int inPlace) {
  size_t total = count * (size_t)gN;
  unsigned char* send = xmalloc(total);
  unsigned char* recv = inPlace ? send : xmalloc(total);
  unsigned char* want = xmalloc(total);
  for (int p = 0; p < gN; p++)
    for (size_t i = 0; i < count; i++) {
      send[(size_t)p * count + i] = byteVal(gRank, p, i);
      want[(size_t)p * count + i] = byteVal(p, gRank, i);
    }
  CALL("alltoall", ncclxAllToAll(send, recv, count, ncclxUint8, gComm, NULL));
  checkBytes(inPlace ? "alltoall in place" : "alltoall", count, recv, want, total);
  if (!inPlace) free(recv);
  free(send);
  free(want);
}

/* Elements rank src sends to dst: uneven, some zero, around `base`. */
static size_t vCount(int src, int dst, size_t base) {
  if ((src + 2 * dst) % 5 == 3) return 0;
  return base / 2 + ((size_t)src * 5 + (size_t)dst * 3) % (base + 1);
}

static void testAlltoallv(size_t base) {
  size_t sc[8], sd[8], rc[8], rd[8], stotal = 0, rtotal = 0;
  /* Send blocks stored in reverse peer order with gaps; receive blocks in order. */
  for (int p = gN - 1; p >= 0; p--) {
    sc[p] = vCount(gRank, p, base);
    sd[p] = stotal + 1;
    stotal += sc[p] + 1;
  }
  for (int p = 0; p < gN; p++) {
    rc[p] = vCount(p, gRank, base);
    rd[p] = rtotal;
    rtotal += rc[p] + 2;
  }
  int32_t* send = xmalloc(stotal * 4);
  int32_t* recv = xmalloc(rtotal * 4);
  memset(recv, 0, rtotal * 4);
  for (int p = 0; p < gN; p++)
    for (size_t i = 0; i < sc[p]; i++) send[sd[p] + i] = (int32_t)(gRank * 1000000 + p * 10000) + (int32_t)i;
  CALL("alltoallv", ncclxAllToAllv(send, sc, sd, recv, rc, rd, ncclxInt32, gComm, NULL));
  for (int p = 0; p < gN; p++)
    for (size_t i = 0; i < rc[p]; i++)
      if (recv[rd[p] + i] != (int32_t)(p * 1000000 + gRank * 10000) + (int32_t)i) {
        FAIL("alltoallv base %zu: element %zu from rank %d is %d", base, i, p, recv[rd[p] + i]);
        break;
      }
  free(send);
  free(recv);
}

static void runRank(void) {
  for (size_t c = 0; c < NCOUNTS; c++) {
    size_t count = kCounts[c];
    for (int inPlace = 0; inPlace < 2; inPlace++) {
      /* Time budget: the big count runs in place at odd rank counts, out of place at even. */
      if (count == BIG_COUNT && inPlace != gN % 2) continue;
      testAllreduce(count, inPlace);
      testBroadcast(count, inPlace);
      testReduce(count, inPlace);
      testAllgather(count, inPlace);
      /* reducescatter/alltoall move count * nranks elements: keep the big case bounded */
      size_t perRank = count == BIG_COUNT ? BIG_COUNT / (size_t)gN : count;
      testReducescatter(perRank, inPlace);
      testAlltoall(perRank, inPlace);
    }
    testAllreduceIdentical(count == BIG_COUNT ? count : count * 3 + 1);
    if (count <= 1000) testAlltoallv(count);
    CALL("barrier", ncclxBarrier(gComm, NULL));
  }
}

/* ---------------- process management ---------------- */

static int freePort(void) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  struct sockaddr_in a;
  memset(&a, 0, sizeof a);
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  int port = -1;
  if (bind(fd, (struct sockaddr*)&a, sizeof a) == 0 &&
      getsockname(fd, (struct sockaddr*)&a, &len) == 0)
    port = ntohs(a.sin_port);
  close(fd);
  return port;
}

static int childMain(int rank, int n, int round, ncclxUniqueId id, const char* algoEnv) {
  gRank = rank, gN = n, gRound = round;
  setenv("NCCLX_ALGO", algoEnv, 1);
  ncclxConfig_t config = NCCLX_CONFIG_INITIALIZER;
  config.timeoutSec = 60; /* a stuck peer becomes an error, not a hang */
  ncclxResult_t res = ncclxCommInitRankConfig(&gComm, n, id, rank, &config);
  if (res != ncclxSuccess) {
    fprintf(stderr, "[round %d n=%d rank %d] init failed: %s (%s)\n", round, n, rank,
            ncclxGetErrorString(res), ncclxGetLastError(NULL));
    return 2;
  }
  runRank();
  if (ncclxCommDestroy(gComm) != ncclxSuccess) FAIL("ncclxCommDestroy failed");
  return gErrors ? 1 : 0;
}

/* Runs one group; 0 when every rank passed, 2 when init failed everywhere (modules not
 * ready), 1 otherwise. */
static int runGroup(int n, int round) {
  char algoEnv[512], commId[64];
  buildAlgoEnv(round, algoEnv, sizeof algoEnv);
  int port = freePort();
  if (port < 0) {
    fprintf(stderr, "cannot find a free port: %s\n", strerror(errno));
    return 1;
  }
  snprintf(commId, sizeof commId, "127.0.0.1:%d", port);
  setenv("NCCLX_COMM_ID", commId, 1);
  ncclxUniqueId id;
  ncclxResult_t res = ncclxGetUniqueId(&id);
  if (res != ncclxSuccess) {
    fprintf(stderr, "ncclxGetUniqueId failed: %s (%s)\n", ncclxGetErrorString(res),
            ncclxGetLastError(NULL));
    return 2;
  }
  fflush(stdout);
  fflush(stderr);
  pid_t pids[8];
  for (int r = 0; r < n; r++) {
    pids[r] = fork();
    if (pids[r] < 0) {
      perror("fork");
      for (int k = 0; k < r; k++) kill(pids[k], SIGKILL);
      return 1;
    }
    if (pids[r] == 0) _exit(childMain(r, n, round, id, algoEnv));
  }
  int status[8], done = 0, initFailures = 0, failures = 0;
  for (int r = 0; r < n; r++) status[r] = -1;
  time_t deadline = time(NULL) + GROUP_DEADLINE_S;
  while (done < n) {
    int st;
    pid_t p = waitpid(-1, &st, WNOHANG);
    if (p > 0) {
      for (int r = 0; r < n; r++)
        if (pids[r] == p) status[r] = st;
      done++;
      continue;
    }
    if (time(NULL) > deadline) {
      fprintf(stderr, "round %d n=%d: ranks still running after %d s; killing them\n", round,
              n, GROUP_DEADLINE_S);
      for (int r = 0; r < n; r++)
        if (status[r] == -1) kill(pids[r], SIGKILL);
      while (done < n && waitpid(-1, NULL, 0) > 0) done++;
      return 1;
    }
    usleep(20000);
  }
  for (int r = 0; r < n; r++) {
    if (WIFEXITED(status[r]) && WEXITSTATUS(status[r]) == 0) continue;
    if (WIFEXITED(status[r]) && WEXITSTATUS(status[r]) == 2)
      initFailures++;
    else
      failures++;
    if (WIFSIGNALED(status[r]))
      fprintf(stderr, "round %d n=%d: rank %d killed by signal %d\n", round, n, r,
              WTERMSIG(status[r]));
  }
  if (failures) return 1;
  return initFailures ? 2 : 0;
}

int main(int argc, char** argv) {
  int maxRanks = argc > 1 ? atoi(argv[1]) : 8;
  if (maxRanks < 1 || maxRanks > 8) {
    fprintf(stderr, "usage: %s [maxRanks 1..8]\n", argv[0]);
    return 1;
  }
  /* Loopback only, and the default socket interface search must not wander off it. */
  setenv("NCCLX_NET_SOCKET_IFNAME", "lo", 0);
  int failed = 0;
  for (int round = 0; round < NROUNDS; round++) {
    for (int n = 1; n <= maxRanks; n++) {
      char algoEnv[512];
      buildAlgoEnv(round, algoEnv, sizeof algoEnv);
      time_t t0 = time(NULL);
      int res = runGroup(n, round);
      printf("round %d n=%d NCCLX_ALGO=%s: %s (%ld s)\n", round, n, algoEnv,
             res == 0 ? "ok" : res == 2 ? "INIT FAILED" : "FAILED", (long)(time(NULL) - t0));
      fflush(stdout);
      failed |= res != 0;
    }
  }
  printf("test_algos: %s\n", failed ? "FAILED" : "all passed");
  return failed;
}
