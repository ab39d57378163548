/* Loads libncclx-net-ib.so the way the core does and checks it end to end.
 *
 * Without hardware (this is verified everywhere): the library loads with RTLD_NOW|RTLD_LOCAL,
 * exports a struct the core's validator accepts, refuses a bad [net.ib] value with
 * ncclxInvalidUsage naming the key, and, when ibv_get_device_list finds no device, refuses
 * init with ncclxSystemError and the log line "no RDMA device found". The test then reports
 * "skipped: no RDMA device" (exit 77): the transfer part was NOT run.
 *
 * With an RDMA device: loopback connections on device 0 move messages of many sizes (one and
 * four QPs per connection, registered and unregistered buffers, 32 in flight), the poll fd
 * wakes up for a completion, and a wrong nonce, a garbage handle, a too-large send and a
 * vanished peer fail the way net.h says.
 *
 * tests/ib also runs this program over mock_verbs.c (an in-process stand-in for libibverbs,
 * via LD_LIBRARY_PATH): that exercises the plugin's logic, not a driver or hardware.
 * NCCLX_IB_TEST_EXPECT_NODEV=1: the no-device path must be taken, and then exit 0. */
#include <dlfcn.h>
#include <infiniband/verbs.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <string.h>
#include <strings.h>

#include "ib_handle.h"
#include "ib_oob.h"
#include "ib_test.h"
#include "ncclx/net.h"
#include "ncclx/profiler.h"
#include "plugin/plugin_loader.h" /* ncclxNetValidate: the core's own acceptance check */

#ifndef NCCLX_IB_PLUGIN_PATH
#error "NCCLX_IB_PLUGIN_PATH must name libncclx-net-ib.so"
#endif

#define DEADLINE_NS (20ull * 1000000000ull)

/* ---------- a fake plugin environment ---------- */

static char logText[1 << 16];
static size_t logLen;
static pthread_mutex_t logLock = PTHREAD_MUTEX_INITIALIZER;

static void testLog(ncclxLogLevel_t level, unsigned long subsys, const char* file, int line,
                    const char* fmt, ...) {
  (void)subsys, (void)file, (void)line;
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof(msg), fmt, ap);
  va_end(ap);
  pthread_mutex_lock(&logLock);
  int n = snprintf(logText + logLen, sizeof(logText) - logLen, "%s\n", msg);
  if (n > 0 && logLen + (size_t)n < sizeof(logText)) logLen += (size_t)n;
  pthread_mutex_unlock(&logLock);
  if (level <= NCCLX_LOG_WARN || getenv("IB_TEST_VERBOSE")) fprintf(stderr, "[plugin] %s\n", msg);
}

static void logClear(void) {
  logLen = 0;
  logText[0] = '\0';
}

struct ncclxConfigSection {
  const char* keys[8];
  const char* values[8];
  int n;
};

static const char* cfgGet(const ncclxConfigSection_t* s, const char* key) {
  for (int i = 0; i < s->n; i++)
    if (strcasecmp(s->keys[i], key) == 0) return s->values[i];
  return NULL;
}

static int cfgEntry(const ncclxConfigSection_t* s, int i, const char** k, const char** v, const char** w) {
  if (i < 0 || i >= s->n) return 0;
  *k = s->keys[i];
  *v = s->values[i];
  *w = "test.ini:1";
  return 1;
}

static const ncclxConfigApi_t cfgApi = {cfgGet, cfgEntry};
static int profStarts, profStops;

static ncclxResult_t testProfiler(void** eHandle, int type, void* parent, int64_t pluginId, void* ext) {
  (void)parent, (void)ext;
  if (type == NCCLX_PROFILER_NET_START) {
    profStarts++;
    *eHandle = (void*)(intptr_t)pluginId;
  } else if (type == NCCLX_PROFILER_NET_STOP) {
    profStops++;
  }
  return ncclxSuccess;
}

static ncclxPluginEnv_t makeEnv(ncclxConfigSection_t* section) {
  ncclxPluginEnv_t env = {NCCLX_PLUGIN_ENV_VERSION, testLog, &cfgApi, section, testProfiler};
  return env;
}

/* ---------- loopback helpers (run only with a device) ---------- */

static const ncclxNet_t* net;

static int connectPair(void* ctx, void** s, void** r, void** lc) {
  char handle[NCCLX_NET_HANDLE_MAXSIZE];
  *s = *r = *lc = NULL;
  if (net->listen(ctx, 0, handle, lc) != ncclxSuccess) return -1;
  uint64_t t0 = ibNowNs();
  while ((!*s || !*r) && ibNowNs() - t0 < DEADLINE_NS) {
    if (!*s && net->connect(ctx, 0, handle, s) != ncclxSuccess) return -1;
    if (!*r && net->accept(*lc, r) != ncclxSuccess) return -1;
  }
  return (*s && *r) ? 0 : -1;
}

/* Completes a request or fails; returns the test() result. */
static ncclxResult_t waitReq(void* req, size_t* size) {
  uint64_t t0 = ibNowNs();
  while (ibNowNs() - t0 < DEADLINE_NS) {
    int done = 0;
    ncclxResult_t res = net->test(req, &done, size);
    if (res != ncclxSuccess || done) return res;
  }
  return ncclxInternalError;
}

static void* postRecv(void* r, void* buf, size_t cap, void* mh) {
  void* req = NULL;
  size_t sizes[1] = {cap};
  void* data[1] = {buf};
  int tags[1] = {0};
  void* mhs[1] = {mh};
  void* ph[1] = {(void*)1};
  uint64_t t0 = ibNowNs();
  while (!req && ibNowNs() - t0 < DEADLINE_NS)
    if (net->irecv(r, 1, data, sizes, tags, mhs, ph, &req) != ncclxSuccess) return NULL;
  return req;
}

static void* postSend(void* s, void* buf, size_t size, void* mh, ncclxResult_t* res) {
  void* req = NULL;
  *res = ncclxSuccess;
  uint64_t t0 = ibNowNs();
  while (!req && *res == ncclxSuccess && ibNowNs() - t0 < DEADLINE_NS)
    *res = net->isend(s, buf, size, 7, mh, (void*)1, &req);
  return req;
}

static void fill(uint8_t* p, size_t n, unsigned seed) {
  for (size_t i = 0; i < n; i++) p[i] = (uint8_t)(i * 2654435761u + seed);
}

static void transfers(void* ctx, const char* label) {
  void *s, *r, *lc;
  CHECK_MSG(connectPair(ctx, &s, &r, &lc) == 0, "%s: connect", label);
  if (!s || !r) return;
  int fd = -1;
  CHECK(net->getPollFd(s, &fd) == ncclxSuccess && fd >= 0);
  CHECK(net->getPollFd(r, &fd) == ncclxSuccess && fd >= 0);
  CHECK(net->getPollFd(lc, &fd) == ncclxSuccess && fd >= 0);

  const size_t sizes[] = {0, 1, 127, 4096, 65535, 65536, 65537, 300000, (1 << 20) + 3, 8 << 20};
  size_t maxSize = 8 << 20;
  uint8_t* src = malloc(maxSize);
  uint8_t* dst = malloc(maxSize + 64);
  for (int registered = 0; registered < 2; registered++) {
    void *smh = NULL, *rmh = NULL;
    if (registered) {
      CHECK(net->regMr(s, src, maxSize, NCCLX_PTR_HOST, &smh) == ncclxSuccess);
      CHECK(net->regMr(r, dst, maxSize + 64, NCCLX_PTR_HOST, &rmh) == ncclxSuccess);
    }
    for (size_t k = 0; k < sizeof(sizes) / sizeof(sizes[0]); k++) {
      fill(src, sizes[k], (unsigned)k);
      memset(dst, 0xee, sizes[k] + 64);
      void* rreq = postRecv(r, dst, sizes[k] + 64, rmh); /* receive larger than the send */
      ncclxResult_t res;
      void* sreq = postSend(s, src, sizes[k], smh, &res);
      CHECK_MSG(rreq && sreq, "%s: post %zu bytes (%d)", label, sizes[k], (int)res);
      if (!rreq || !sreq) break;
      size_t got = 0, sent = 0;
      CHECK(waitReq(sreq, &sent) == ncclxSuccess && sent == sizes[k]);
      CHECK(waitReq(rreq, &got) == ncclxSuccess);
      CHECK_MSG(got == sizes[k], "%s: received %zu of %zu bytes", label, got, sizes[k]);
      CHECK_MSG(memcmp(src, dst, sizes[k]) == 0, "%s: data of %zu bytes differs", label, sizes[k]);
      CHECK(dst[sizes[k]] == 0xee); /* nothing beyond the message */
    }
    if (registered) {
      CHECK(net->deregMr(s, smh) == ncclxSuccess && net->deregMr(r, rmh) == ncclxSuccess);
    }
  }

  /* The receive comm's poll fd becomes readable when the data has arrived. */
  int rfd = -1;
  CHECK(net->getPollFd(r, &rfd) == ncclxSuccess && rfd >= 0);
  void* wreq = postRecv(r, dst, 64, NULL);
  ncclxResult_t wres;
  void* wsend = postSend(s, src, 64, NULL, &wres);
  CHECK(wreq && wsend);
  if (wsend) CHECK(waitReq(wsend, NULL) == ncclxSuccess);
  struct pollfd pfd = {.fd = rfd, .events = POLLIN};
  CHECK_MSG(poll(&pfd, 1, 5000) == 1 && (pfd.revents & POLLIN), "%s: poll fd did not wake up", label);
  if (wreq) CHECK(waitReq(wreq, NULL) == ncclxSuccess);

  /* NCCLX_NET_MAX_REQUESTS in flight each way. */
  enum { N = NCCLX_NET_MAX_REQUESTS, CHUNK = 4096 };
  void *rreq[N], *sreq[N];
  for (int i = 0; i < N; i++) {
    fill(src + i * CHUNK, CHUNK, 100u + (unsigned)i);
    rreq[i] = postRecv(r, dst + i * CHUNK, CHUNK, NULL);
  }
  for (int i = 0; i < N; i++) {
    ncclxResult_t res;
    sreq[i] = postSend(s, src + i * CHUNK, CHUNK, NULL, &res);
    CHECK(sreq[i] != NULL);
  }
  for (int i = 0; i < N; i++) {
    size_t got = 0;
    if (sreq[i]) CHECK(waitReq(sreq[i], NULL) == ncclxSuccess);
    if (rreq[i]) CHECK(waitReq(rreq[i], &got) == ncclxSuccess && got == CHUNK);
  }
  CHECK(memcmp(src, dst, (size_t)N * CHUNK) == 0);
  void* mh = NULL;
  CHECK(net->regMr(s, src, 64, NCCLX_PTR_CUDA, &mh) == ncclxInvalidArgument && mh == NULL);
  CHECK(net->closeSend(s) == ncclxSuccess && net->closeRecv(r) == ncclxSuccess);
  CHECK(net->closeListen(lc) == ncclxSuccess);
  free(src);
  free(dst);
}

static void failures(void* ctx) {
  char handle[NCCLX_NET_HANDLE_MAXSIZE];
  void *lc = NULL, *s = NULL, *r = NULL;
  /* Garbage handle: refused at once. */
  memset(handle, 0x5a, sizeof(handle));
  CHECK(net->connect(ctx, 0, handle, &s) == ncclxInternalError && s == NULL);

  /* Wrong nonce: the listener refuses, the sender fails with a remote error. */
  CHECK(net->listen(ctx, 0, handle, &lc) == ncclxSuccess);
  ibListenInfo li;
  CHECK(ibHandleDecode(handle, sizeof(handle), &li) == NULL);
  li.nonce ^= 1;
  char forged[NCCLX_NET_HANDLE_MAXSIZE] = {0};
  CHECK(ibHandleEncode(&li, forged, sizeof(forged)) == IB_HANDLE_BYTES);
  logClear();
  ncclxResult_t res = ncclxSuccess;
  uint64_t t0 = ibNowNs();
  while (res == ncclxSuccess && ibNowNs() - t0 < DEADLINE_NS) {
    res = net->connect(ctx, 0, forged, &s);
    CHECK(net->accept(lc, &r) == ncclxSuccess && r == NULL);
  }
  CHECK(res == ncclxRemoteError && s == NULL);
  CHECK_MSG(strstr(logText, "wrong nonce") != NULL, "%s", logText);

  /* A send larger than the receive: an error on both sides. */
  void* ls = NULL;
  CHECK(connectPair(ctx, &s, &r, &ls) == 0);
  if (s && r) {
    char small[16], big[1000];
    memset(big, 1, sizeof(big));
    void* rreq = postRecv(r, small, sizeof(small), NULL);
    CHECK(rreq != NULL);
    void* sreq = postSend(s, big, sizeof(big), NULL, &res);
    CHECK(sreq == NULL && res == ncclxRemoteError);
    if (rreq) CHECK(waitReq(rreq, NULL) == ncclxRemoteError);
    net->closeSend(s);
    net->closeRecv(r);
  }
  net->closeListen(ls);
  /* The peer closes with a receive pending: the receive fails instead of hanging. */
  CHECK(connectPair(ctx, &s, &r, &ls) == 0);
  if (s && r) {
    char buf[64];
    void* rreq = postRecv(r, buf, sizeof(buf), NULL);
    logClear();
    CHECK(net->closeSend(s) == ncclxSuccess);
    if (rreq) CHECK(waitReq(rreq, NULL) == ncclxRemoteError);
    if (getenv("NCCLX_IB_MOCK_SILENT_LOSS")) /* only the side channel could tell */
      CHECK_MSG(strstr(logText, "the peer closed the connection") != NULL, "%s", logText);
    net->closeRecv(r);
  }
  net->closeListen(ls);
  net->closeListen(lc);
}

int main(void) {
  void* dl = dlopen(NCCLX_IB_PLUGIN_PATH, RTLD_NOW | RTLD_LOCAL);
  if (!dl) {
    fprintf(stderr, "cannot load %s: %s\n", NCCLX_IB_PLUGIN_PATH, dlerror());
    return 1;
  }
  net = dlsym(dl, NCCLX_NET_PLUGIN_SYMBOL);
  CHECK(net != NULL);
  if (!net) return 1;
  const char* bad = ncclxNetValidate(net);
  CHECK_MSG(bad == NULL, "the core's validator refuses the plugin: %s", bad);
  CHECK(strcmp(net->name, "ib") == 0 && net->abiVersion == NCCLX_NET_ABI_VERSION);

  /* A bad key is refused before any device is looked at. */
  ncclxConfigSection_t badCfg = {{"timeout"}, {"0"}, 1};
  ncclxPluginEnv_t env = makeEnv(&badCfg);
  void* ctx = NULL;
  logClear();
  CHECK(net->init(&ctx, &env) == ncclxInvalidUsage && ctx == NULL);
  CHECK_MSG(strstr(logText, "timeout = '0' (test.ini:1)") != NULL, "%s", logText);

  int nhw = 0; /* what the test itself sees decides between "skip" and "must work" */
  struct ibv_device** list = ibv_get_device_list(&nhw);
  if (list) ibv_free_device_list(list);

  ncclxConfigSection_t none = {{NULL}, {NULL}, 0};
  env = makeEnv(&none);
  logClear();
  ncclxResult_t res = net->init(&ctx, &env);
  if (nhw <= 0) {
    CHECK_MSG(res == ncclxSystemError && ctx == NULL, "init without a device returned %d", (int)res);
    CHECK_MSG(strstr(logText, "no RDMA device found") != NULL, "log: %s", logText);
    if (ibTestFailures || getenv("NCCLX_IB_TEST_EXPECT_NODEV")) return ibTestResult("test_ib_device");
    printf("skipped: no RDMA device (the plugin loads, passes validation, refuses bad config, "
           "and refuses init with ncclxSystemError + 'no RDMA device found'; no transfer ran)\n");
    return 77;
  }
  CHECK_MSG(!getenv("NCCLX_IB_TEST_EXPECT_NODEV"), "a device was found");
  if (res == ncclxSystemError && strstr(logText, "no usable port")) {
    printf("skipped: %d RDMA device(s) but no active port; no transfer ran\n", nhw);
    return 77;
  }
  CHECK_MSG(res == ncclxSuccess && ctx, "init failed with %d: %s", (int)res, logText);
  if (res != ncclxSuccess) return ibTestResult("test_ib_device");

  /* Configuration that excludes every port, or names a missing interface: usage errors. */
  void* other = NULL;
  ncclxConfigSection_t noPort = {{"hca"}, {"nosuchhca*"}, 1};
  ncclxPluginEnv_t env2 = makeEnv(&noPort);
  logClear();
  CHECK(net->init(&other, &env2) == ncclxInvalidUsage && other == NULL);
  CHECK_MSG(strstr(logText, "nosuchhca*") && strstr(logText, "no usable port"), "%s", logText);
  ncclxConfigSection_t badIf = {{"oob_ifname"}, {"nosuchif0"}, 1};
  env2 = makeEnv(&badIf);
  logClear();
  CHECK(net->init(&other, &env2) == ncclxInvalidUsage && other == NULL);
  CHECK_MSG(strstr(logText, "oob_ifname = 'nosuchif0' (test.ini:1)") != NULL, "%s", logText);
  int ndev = 0;
  ncclxNetProperties_t props;
  CHECK(net->devices(ctx, &ndev) == ncclxSuccess && ndev >= 1);
  CHECK(net->getProperties(ctx, 0, &props) == ncclxSuccess && props.name && props.maxRecvs == 1 &&
        props.ptrSupport == NCCLX_PTR_HOST && props.maxMessageBytes == ((size_t)1 << 30));
  CHECK(net->getProperties(ctx, ndev, &props) == ncclxInternalError);
  printf("device 0: %s port %d, %d Mb/s\n", props.name, props.port, props.speedMbps);
  transfers(ctx, "1 QP");
  failures(ctx);
  CHECK(net->finalize(ctx) == ncclxSuccess);
  CHECK(profStarts > 0 && profStarts == profStops);

  ncclxConfigSection_t four = {{"qps_per_conn"}, {"4"}, 1};
  env = makeEnv(&four);
  CHECK(net->init(&ctx, &env) == ncclxSuccess);
  if (ctx) {
    transfers(ctx, "4 QPs");
    CHECK(net->finalize(ctx) == ncclxSuccess);
  }
  dlclose(dl);
  return ibTestResult("test_ib_device");
}
