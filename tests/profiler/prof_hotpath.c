/* The trace plugin's hot path alone: startEvent + stopEvent of one COLL event, as the core
 * sends them around a collective, timed in batches of 1000 (the fastest batch is reported,
 * which is the figure for an idle CPU). No communicator, no core: only the plugin's cost.
 *
 *   prof_hotpath [PLUGIN.so]          (default: the trace plugin of this build)
 *   prof_hotpath --dumps [PLUGIN.so]  check instead of time: one thread runs collectives
 *                                     while another keeps dumping (events = coll is the
 *                                     lockless mode: the dumps must still be whole and
 *                                     current); test profiler.lockless_dumps
 *
 * tools/prof-overhead runs it. Exit 0, or 1 when the plugin cannot be loaded or a check
 * fails. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dlfcn.h>
#include <pthread.h>
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

typedef struct {
  const ncclxProfiler_v1_t* p;
  void* ctx;
  const ncclxProfilerEventDescr_v1_t* d;
  int n;
  volatile int done;
} Writer;

static void* writeLoop(void* arg) {
  Writer* w = arg;
  ncclxProfilerEventDescr_v1_t d = *w->d;
  for (int i = 1; i <= w->n; i++) {
    void* h = NULL;
    d.coll.seq = (uint64_t)i;
    w->p->startEvent(w->ctx, &h, &d);
    w->p->stopEvent(h);
  }
  __atomic_store_n(&w->done, 1, __ATOMIC_RELEASE);
  return NULL;
}

static char* slurp(const char* path) {
  FILE* f = fopen(path, "r");
  if (!f) return NULL;
  static char buf[1 << 16];
  size_t n = fread(buf, 1, sizeof(buf) - 1, f);
  fclose(f);
  buf[n] = '\0';
  return buf;
}

/* Dumps taken while a lockless writer runs: each complete, its counters never behind the
 * previous dump's, and the last one exact. */
static int checkDumps(const ncclxProfiler_v1_t* p, void* ctx, const ncclxProfilerEventDescr_v1_t* d) {
  enum { N = 300000 };
  Writer w = {p, ctx, d, N, 0};
  pthread_t t;
  if (pthread_create(&t, NULL, writeLoop, &w) != 0) return 1;
  char path[sizeof(g_dir) + 32];
  snprintf(path, sizeof(path), "%s/dump.json", g_dir);
  unsigned long long prev = 0;
  int dumps = 0, bad = 0;
  for (int last = 0; !last && !bad;) {
    last = __atomic_load_n(&w.done, __ATOMIC_ACQUIRE);
    if (p->dump(ctx, path) != ncclxSuccess) {
      fprintf(stderr, "prof_hotpath: dump %d failed\n", dumps);
      bad = 1;
      break;
    }
    dumps++;
    const char* text = slurp(path);
    static const char kDone[] = "\"lastCompleted\": {\"coll\": ", kStarted[] = "\"lastStarted\": {\"coll\": ";
    const char* lc = text ? strstr(text, kDone) : NULL;
    const char* ls = text ? strstr(text, kStarted) : NULL;
    unsigned long long started = 0, completed = 0;
    if (!lc || !ls || !strstr(text, "\"dropped\"") || sscanf(lc + sizeof(kDone) - 1, "%llu", &completed) != 1 ||
        sscanf(ls + sizeof(kStarted) - 1, "%llu", &started) != 1) {
      fprintf(stderr, "prof_hotpath: dump %d is incomplete:\n%s\n", dumps, text ? text : "(unreadable)");
      bad = 1;
    } else if (completed < prev || started < completed || started > completed + 1) {
      fprintf(stderr, "prof_hotpath: dump %d: started %llu, completed %llu after %llu completed before\n", dumps,
              started, completed, prev);
      bad = 1;
    } else if (last && completed != N) {
      fprintf(stderr, "prof_hotpath: the final dump shows %llu of %d collectives completed\n", completed, N);
      bad = 1;
    }
    prev = completed;
  }
  pthread_join(t, NULL);
  printf("prof_hotpath: %d dumps during %d collectives: %s\n", dumps, N, bad ? "FAIL" : "PASS");
  return bad;
}

int main(int argc, char** argv) {
  int dumps = argc > 1 && !strcmp(argv[1], "--dumps");
  const char* so = argc > 1 + dumps ? argv[1 + dumps] : NCCLX_TEST_TRACE_PLUGIN;
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
  if (dumps) {
    int bad = checkDumps(p, ctx, &d);
    p->finalize(ctx);
    char cmd[128];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", g_dir);
    return system(cmd) == 0 && !bad ? 0 : 1;
  }
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
