/* The plugin loader against fake plugins: each refusal reason shows up in the log, a list is
 * walked in order, the built-in socket network is the last resort, and the net is reference
 * counted (one init, one finalize). [net] plugin is overridden with NCCLX_NET_PLUGIN. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "config/config.h"
#include "util/debug.h"
#include "plugin/plugin_loader.h"
#include "transport/socket/net_socket.h" /* the built-in network */

#ifndef NCCLX_TEST_FAKE_PLUGIN_DIR
#error "NCCLX_TEST_FAKE_PLUGIN_DIR must name the directory of the fake plugins"
#endif
#define FAKE_DIR NCCLX_TEST_FAKE_PLUGIN_DIR

static int failures;
#define CHECK(cond)                                                   \
  do {                                                                \
    if (!(cond)) {                                                    \
      fprintf(stderr, "FAIL %s:%d: %s\n", __FILE__, __LINE__, #cond); \
      failures++;                                                     \
    }                                                                 \
  } while (0)
#define CHECK_LOG(needle) CHECK_IN(captured, needle)
#define CHECK_IN(hay, needle)                                                                   \
  do {                                                                                          \
    if (strstr((hay), (needle)) == NULL) {                                                      \
      fprintf(stderr, "FAIL %s:%d: log lacks '%s'\n", __FILE__, __LINE__, (needle));            \
      failures++;                                                                               \
    }                                                                                           \
  } while (0)
#define CHECK_NOT_LOG(needle)                                                                   \
  do {                                                                                          \
    if (strstr(captured, (needle)) != NULL) {                                                   \
      fprintf(stderr, "FAIL %s:%d: log unexpectedly has '%s'\n", __FILE__, __LINE__, (needle)); \
      failures++;                                                                               \
    }                                                                                           \
  } while (0)

static char tmpDir[] = "/tmp/ncclx-test-loader-XXXXXX";

/* ---- stderr capture: the log goes there ---- */
static int savedStderr = -1;
static char capturePath[600];
static char captured[1 << 16];

static void captureStart(void) {
  fflush(stderr);
  FILE* f = fopen(capturePath, "w");
  if (f == NULL) exit(1);
  savedStderr = dup(2);
  dup2(fileno(f), 2);
  fclose(f);
}

static void captureEnd(void) {
  fflush(stderr);
  dup2(savedStderr, 2);
  close(savedStderr);
  FILE* f = fopen(capturePath, "r");
  size_t n = f ? fread(captured, 1, sizeof(captured) - 1, f) : 0;
  captured[n] = '\0';
  if (f) fclose(f);
  fputs(captured, stderr);
}

static int countOf(const char* hay, const char* needle) {
  int n = 0;
  for (const char* p = strstr(hay, needle); p; p = strstr(p + 1, needle)) n++;
  return n;
}

/* Acquires the net with [net] plugin = list; returns the plugin's name ("" on failure). */
static const char* acquireWith(const char* list, ncclxNetInstance_t* inst) {
  static char name[64];
  setenv("NCCLX_NET_PLUGIN", list, 1);
  memset(inst, 0, sizeof(*inst));
  captureStart();
  ncclxResult_t res = ncclxNetAcquire(&ncclxNetSocket, inst);
  captureEnd();
  snprintf(name, sizeof(name), "%s", res == ncclxSuccess && inst->net ? inst->net->name : "");
  return name;
}

static void expectFallback(const char* list, const char* reason) {
  ncclxNetInstance_t inst;
  fprintf(stderr, "--- [net] plugin = %s\n", list);
  CHECK(strcmp(acquireWith(list, &inst), "socket") == 0);
  CHECK(inst.ndev > 0 && inst.ctx != NULL);
  CHECK_LOG(reason);
  CHECK_LOG("falling back to the built-in socket network");
  ncclxNetRelease();
}

static void testNetRefusals(void) {
  expectFallback("fakegood", "net: plugin 'fakegood' refused: " FAKE_DIR "/libncclx-net-fakegood.so: it found no devices (0)");
  CHECK_LOG("fake net fakegood: finalize"); /* initialized, then undone */
  expectFallback("nosym", "libncclx-net-nosym.so: no exported symbol ncclxNetPlugin_v1");
  expectFallback("badabi", "libncclx-net-badabi.so: built for net ABI v99, this ncclx speaks v1");
  expectFallback("nullop", "libncclx-net-nullop.so: required operation isend is NULL");
  expectFallback("initfail", "libncclx-net-initfail.so: init failed with ncclxSystemError");
  CHECK_LOG("fake net initfail: init fails on purpose");
  expectFallback("missing", "net: plugin 'missing' refused: libncclx-net-missing.so: not found; tried "
                            "/nonexistent-dir/libncclx-net-missing.so, " FAKE_DIR "/libncclx-net-missing.so, ");
  CHECK_LOG("then libncclx-net-missing.so on the system library path");
  /* A name with '/' is used as a path. */
  expectFallback(FAKE_DIR "/libncclx-net-badabi.so", "built for net ABI v99");
  expectFallback("/nonexistent/libfoo.so", "net: plugin '/nonexistent/libfoo.so' refused: /nonexistent/libfoo.so: ");
}

static void testNetList(void) {
  ncclxNetInstance_t inst;
  fprintf(stderr, "--- list ending in socket\n");
  CHECK(strcmp(acquireWith(" nosym , badabi,socket", &inst), "socket") == 0);
  const char* a = strstr(captured, "plugin 'nosym' refused");
  const char* b = strstr(captured, "plugin 'badabi' refused");
  CHECK(a != NULL && b != NULL && a < b);
  CHECK_LOG("net: using the built-in socket network");
  CHECK_NOT_LOG("falling back"); /* socket was asked for: no fallback warning */
  ncclxNetRelease();

  fprintf(stderr, "--- list without socket\n");
  CHECK(strcmp(acquireWith("nullop,initfail", &inst), "socket") == 0);
  CHECK_LOG("required operation isend is NULL");
  CHECK_LOG("init failed");
  CHECK_LOG("no plugin of '[net] plugin = nullop,initfail' could be used; falling back");
  ncclxNetRelease();

  /* The first good one wins; later ones are not even opened. */
  setenv("NCCLX_NET_FAKEGOOD_NDEV", "3", 1);
  fprintf(stderr, "--- good plugin first\n");
  CHECK(strcmp(acquireWith("badabi,fakegood,nosym", &inst), "fakegood") == 0);
  CHECK(inst.ndev == 3);
  CHECK_LOG("net: using plugin 'fakegood' from " FAKE_DIR "/libncclx-net-fakegood.so, 3 device(s)");
  CHECK_NOT_LOG("'nosym'");
  captureStart();
  ncclxNetRelease();
  captureEnd();
  CHECK_LOG("fake net fakegood: finalize");
  unsetenv("NCCLX_NET_FAKEGOOD_NDEV");
}

/* When even the built-in network refuses (here: a bad [net.socket] key), Acquire fails; a
 * configuration mistake comes back as ncclxInvalidUsage. */
static void testNoNetwork(void) {
  fprintf(stderr, "--- the built-in network refuses too\n");
  setenv("NCCLX_NET_SOCKET_NSOCKS", "99", 1);
  setenv("NCCLX_NET_PLUGIN", "badabi", 1);
  ncclxNetInstance_t inst;
  memset(&inst, 0, sizeof(inst));
  captureStart();
  ncclxResult_t res = ncclxNetAcquire(&ncclxNetSocket, &inst);
  captureEnd();
  CHECK(res == ncclxInvalidUsage);
  CHECK(inst.net == NULL);
  CHECK_LOG("net: built-in socket network refused: init failed with ncclxInvalidUsage");
  CHECK_LOG("net: no usable network ([net] plugin = badabi)");
  unsetenv("NCCLX_NET_SOCKET_NSOCKS");
  /* Nothing is held after a failed acquire: the next one starts afresh. */
  CHECK(strcmp(acquireWith("socket", &inst), "socket") == 0);
  ncclxNetRelease();
}

static void testNetRefcount(void) {
  setenv("NCCLX_NET_FAKEGOOD_NDEV", "1", 1);
  ncclxNetInstance_t a, b;
  fprintf(stderr, "--- refcount\n");
  CHECK(strcmp(acquireWith("fakegood", &a), "fakegood") == 0);
  CHECK_LOG("fake net fakegood: init with 1 devices");
  CHECK(strcmp(acquireWith("socket", &b), "fakegood") == 0); /* held: config not re-read */
  CHECK(a.ctx == b.ctx && a.net == b.net);
  CHECK_NOT_LOG("init with"); /* no second init */
  captureStart();
  ncclxNetRelease();
  captureEnd();
  CHECK_NOT_LOG("finalize");
  captureStart();
  ncclxNetRelease();
  ncclxNetRelease(); /* one too many: a warning, nothing else */
  captureEnd();
  CHECK(countOf(captured, "fake net fakegood: finalize") == 1);
  CHECK_LOG("ncclxNetRelease called more often than ncclxNetAcquire");
  unsetenv("NCCLX_NET_FAKEGOOD_NDEV");
}

static void testTunerProfiler(void) {
  const ncclxTuner_t* t = NULL;
  const ncclxProfiler_t* p = NULL;

  unsetenv("NCCLX_TUNER_PLUGIN");
  /* A NULL answer holds nothing: no release follows it. */
  CHECK(ncclxTunerAcquire(&t) == ncclxSuccess && t == NULL); /* the file says nothing */
  setenv("NCCLX_TUNER_PLUGIN", "none", 1);
  CHECK(ncclxTunerAcquire(&t) == ncclxSuccess && t == NULL);

  setenv("NCCLX_TUNER_PLUGIN", "fake", 1);
  captureStart();
  CHECK(ncclxTunerAcquire(&t) == ncclxSuccess && t != NULL && strcmp(t->name, "fake") == 0);
  const ncclxTuner_t* t2 = NULL;
  CHECK(ncclxTunerAcquire(&t2) == ncclxSuccess && t2 == t);
  captureEnd();
  CHECK_LOG("tuner: using plugin 'fake' from " FAKE_DIR "/libncclx-tuner-fake.so");
  CHECK(countOf(captured, "tuner: using plugin") == 1);
  ncclxTunerRelease();
  ncclxTunerRelease();
  captureStart();
  ncclxTunerRelease(); /* one too many */
  captureEnd();
  CHECK_LOG("tuner: release called more often than acquire");

  setenv("NCCLX_TUNER_PLUGIN", "badabi", 1);
  captureStart();
  CHECK(ncclxTunerAcquire(&t) == ncclxSuccess && t == NULL);
  captureEnd();
  CHECK_LOG("tuner: plugin 'badabi' refused: " FAKE_DIR "/libncclx-tuner-badabi.so: built for tuner ABI v99, this ncclx speaks v1; running without a tuner");

  setenv("NCCLX_TUNER_PLUGIN", "absent", 1);
  captureStart();
  CHECK(ncclxTunerAcquire(&t) == ncclxSuccess && t == NULL);
  captureEnd();
  CHECK_LOG("tuner: plugin 'absent' refused: libncclx-tuner-absent.so: not found; tried /nonexistent-dir/libncclx-tuner-absent.so, " FAKE_DIR);
  unsetenv("NCCLX_TUNER_PLUGIN");

  setenv("NCCLX_PROFILER_PLUGIN", FAKE_DIR "/libncclx-profiler-fake.so", 1);
  captureStart();
  CHECK(ncclxProfilerAcquire(&p) == ncclxSuccess && p != NULL && strcmp(p->name, "fake") == 0);
  captureEnd();
  CHECK_LOG("profiler: using plugin 'fake' from " FAKE_DIR "/libncclx-profiler-fake.so");
  ncclxProfilerRelease();

  setenv("NCCLX_PROFILER_PLUGIN", "badabi", 1);
  captureStart();
  CHECK(ncclxProfilerAcquire(&p) == ncclxSuccess && p == NULL);
  captureEnd();
  CHECK_LOG("built for profiler ABI v2, this ncclx speaks v1");
  unsetenv("NCCLX_PROFILER_PLUGIN");
}

static void testValidateAndEnv(void) {
  /* Validation of a hand-made struct, as tools/ncclx-net-check would do. */
  ncclxNet_t net;
  memset(&net, 0, sizeof(net));
  CHECK(strstr(ncclxNetValidate(&net), "name") != NULL);
  net.name = "x";
  net.abiVersion = 7;
  CHECK(strcmp(ncclxNetValidate(&net), "built for net ABI v7, this ncclx speaks v1") == 0);
  net.abiVersion = NCCLX_NET_ABI_VERSION;
  CHECK(strcmp(ncclxNetValidate(&net), "required operation init is NULL") == 0);
  CHECK(ncclxNetValidate(&ncclxNetSocket) == NULL);
  ncclxTuner_t tuner = {.name = "t", .abiVersion = NCCLX_TUNER_ABI_VERSION};
  CHECK(strcmp(ncclxTunerValidate(&tuner), "required operation init is NULL") == 0);
  CHECK(ncclxProfilerValidate(NULL) != NULL);

  /* The environment a plugin gets: its own section with env overrides, a logger, a no-op
   * profiler callback. */
  setenv("NCCLX_TUNER_RULES_FILE", "/x/rules.txt", 1);
  ncclxPluginEnv_t env;
  memset(&env, 0, sizeof(env));
  ncclxPluginEnvFill(&env, "tuner.rules");
  CHECK(env.version == NCCLX_PLUGIN_ENV_VERSION);
  CHECK(env.log != NULL && env.config == &ncclxConfigApi && env.section != NULL);
  const char* v = env.config->get(env.section, "file");
  CHECK(v != NULL && strcmp(v, "/x/rules.txt") == 0);
  const char *k = NULL, *val = NULL, *where = NULL;
  CHECK(env.config->entry(env.section, 0, &k, &val, &where) == 1);
  CHECK(k && strcmp(k, "file") == 0 && where && strcmp(where, "env NCCLX_TUNER_RULES_FILE") == 0);
  void* handle = (void*)&env;
  CHECK(env.profiler(&handle, NCCLX_PROFILER_NET_START, NULL, 1, NULL) == ncclxSuccess && handle == NULL);
  unsetenv("NCCLX_TUNER_RULES_FILE");
}

int main(void) {
  if (access(FAKE_DIR "/libncclx-net-fakegood.so", R_OK) != 0) {
    fprintf(stderr, "fake plugins are missing from %s (build the test_plugin_loader target)\n", FAKE_DIR);
    return 1;
  }
  if (mkdtemp(tmpDir) == NULL) {
    perror("mkdtemp");
    return 1;
  }
  snprintf(capturePath, sizeof(capturePath), "%s/stderr.txt", tmpDir);
  /* The fakes are found through [core] plugin_path in this file. */
  char ini[600];
  snprintf(ini, sizeof(ini), "%s/ncclx.ini", tmpDir);
  FILE* f = fopen(ini, "w");
  if (f == NULL) return 1;
  fprintf(f, "[core]\nplugin_path = /nonexistent-dir:%s\n[net]\nplugin = socket\n", FAKE_DIR);
  fclose(f);
  setenv("NCCLX_CONF_FILE", ini, 1);
  const char* clear[] = {"NCCLX_CORE_PLUGIN_PATH", "NCCLX_NET_PLUGIN", "NCCLX_TUNER_PLUGIN",
                         "NCCLX_PROFILER_PLUGIN", "NCCLX_NET_FAKEGOOD_NDEV",
                         "NCCLX_NET_SOCKET_NSOCKS", "NCCLX_NET_SOCKET_IFNAME",
                         "NCCLX_NET_SOCKET_BUFFER_BYTES"};
  for (size_t i = 0; i < sizeof(clear) / sizeof(clear[0]); i++) unsetenv(clear[i]);
  setenv("NCCLX_DEBUG", "INFO", 1); /* read once, at the first log line */
  setenv("NCCLX_DEBUG_SUBSYS", "PLUGIN,NET,INIT", 1);
  ncclxConfigReset();
  if (ncclxConfigLoad() != ncclxSuccess) {
    fprintf(stderr, "cannot load %s: %s\n", ini, ncclxThreadLastError());
    return 1;
  }

  testNetRefusals();
  testNetList();
  testNetRefcount();
  testNoNetwork();
  testTunerProfiler();
  testValidateAndEnv();

  unlink(capturePath);
  unlink(ini);
  rmdir(tmpDir);
  if (failures) {
    fprintf(stderr, "%d checks failed\n", failures);
    return 1;
  }
  printf("all plugin loader checks passed\n");
  return 0;
}
