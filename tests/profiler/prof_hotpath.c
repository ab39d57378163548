/* The trace plugin's hot path alone: startEvent + stopEvent of one COLL event, as the core
 * sends them around a collective, timed in batches of 1000 (the fastest batch is reported,
 * which is the figure for an idle CPU). No communicator, no core: only the plugin's cost.
 *
 *   prof_hotpath [PLUGIN.so]     (default: the trace plugin of this build)
 *
 * tools/prof-overhead runs it. Exit 0, or 1 when the plugin cannot be loaded. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ncclx/profiler.h"

#define BATCH 1000
#define BATCHES 300

static char g_dir[] = "/tmp/ncclx-prof-hotpath-XXXXXX";

static void quietLog(ncclxLogLevel_t l, unsigned long s, const char* f, int line, const char* fmt, ...) {
  (void)l, (void)s, (void)f, (void)line, (void)fmt;
}

/* [profiler.trace] as the plugin reads it: dir (a fresh temporary directory), events = coll,
 * summary = none. */
static const char* g_keys[][2] = {{"dir", g_dir}, {"events", "coll"}, {"summary", "none"}};

static const char* get(const ncclxConfigSection_t* s, const char* key) {
  (void)s;
  for (int i = 0; i < 3; i++)
    if (!strcmp(key, g_keys[i][0])) return g_keys[i][1];
  return NULL;
}

static int entry(const ncclxConfigSection_t* s, int i, const char** k, const char** v, const char** w) {
  (void)s;
  if (i < 0 || i >= 3) return 0;
  *k = g_keys[i][0], *v = g_keys[i][1], *w = "prof_hotpath";
  return 1;
}

static ncclxResult_t noNet(void** h, int type, void* parent, int64_t id, void* data) {
  (void)type, (void)parent, (void)id, (void)data;
  if (h) *h = NULL;
  return ncclxSuccess;
}

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

int main(int argc, char** argv) {
  const char* so = argc > 1 ? argv[1] : NCCLX_TEST_TRACE_PLUGIN;
  void* dl = dlopen(so, RTLD_NOW | RTLD_LOCAL);
  const ncclxProfiler_v1_t* p = dl ? dlsym(dl, NCCLX_PROFILER_PLUGIN_SYMBOL) : NULL;
  if (!p || !mkdtemp(g_dir)) {
    fprintf(stderr, "prof_hotpath: cannot load %s: %s\n", so, dl ? "no plugin symbol" : dlerror());
    return 1;
  }
  static const ncclxConfigApi_t config = {get, entry};
  ncclxPluginEnv_t env = {NCCLX_PLUGIN_ENV_VERSION, quietLog, &config, NULL, noNet};
  ncclxProfilerCommInfo_v1_t info = {.commHash = 1, .commName = "hotpath", .rank = 0, .nranks = 2, .nhosts = 1,
                                     .hostname = "h", .pid = 1};
  int mask = 0;
  void* ctx = NULL;
  if (p->init(&ctx, &info, &mask, &env) != ncclxSuccess) {
    fprintf(stderr, "prof_hotpath: init failed\n");
    return 1;
  }
  ncclxProfilerEventDescr_v1_t d;
  memset(&d, 0, sizeof(d));
  d.type = NCCLX_PROFILE_COLL;
  d.coll.func = "allreduce";
  d.coll.datatype = "float32";
  d.coll.op = "sum";
  d.coll.algo = "ring";
  d.coll.proto = "simple";
  d.coll.count = 2;
  d.coll.bytes = 8;
  d.coll.root = -1;
  double best = 1e9;
  for (int b = 0; b < BATCHES; b++) {
    double t0 = now();
    for (int i = 0; i < BATCH; i++) {
      void* h = NULL;
      d.coll.seq++;
      p->startEvent(ctx, &h, &d);
      p->stopEvent(h);
    }
    double ns = (now() - t0) / BATCH * 1e9;
    best = ns < best ? ns : best;
  }
  p->finalize(ctx);
  printf("prof_hotpath: %s: start+stop of a COLL event: %.1f ns (fastest of %d batches of %d)\n", so, best,
         BATCHES, BATCH);
  char cmd[128];
  snprintf(cmd, sizeof(cmd), "rm -rf '%s'", g_dir);
  return system(cmd) == 0 ? 0 : 1;
}
