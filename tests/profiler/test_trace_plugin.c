/* Drives libncclx-profiler-trace.so through a stub environment, without the core:
 *   - bad settings fail init with the key and where named; unknown keys only warn;
 *     an unwritable dir fails init;
 *   - two communicators on two threads (with a third thread dumping concurrently) produce
 *     binary spools while they live and, at finalize, traces that are valid JSON, metrics
 *     lines and dumps with the right sequence numbers;
 *   - a ring smaller than the burst still keeps every record (batches written inline);
 *   - the watchdog dumps a stuck op once and names the peer that owes bytes;
 *   - SIGUSR1 dumps every communicator and still calls the application's handler, which is
 *     restored when the last communicator finalizes. */
#include <dlfcn.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ncclx/profiler.h"

static const ncclxProfiler_v1_t* P;
static int failures;

#define CHECK(cond, ...)                                \
  do {                                                  \
    if (!(cond)) {                                      \
      fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__); \
      fprintf(stderr, __VA_ARGS__);                     \
      fprintf(stderr, "\n");                            \
      failures++;                                       \
    }                                                   \
  } while (0)

/* ---------------------------------------------------------------- stub environment */

static pthread_mutex_t logLock = PTHREAD_MUTEX_INITIALIZER;
static char logText[1 << 16];

static void stubLog(ncclxLogLevel_t level, unsigned long subsys, const char* file, int line, const char* fmt, ...) {
  (void)subsys, (void)file, (void)line;
  char msg[2048];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof(msg), fmt, ap);
  va_end(ap);
  pthread_mutex_lock(&logLock);
  size_t len = strlen(logText);
  snprintf(logText + len, sizeof(logText) - len, "%s\n", msg);
  pthread_mutex_unlock(&logLock);
  fprintf(stderr, "[%s] %s\n", level == NCCLX_LOG_WARN ? "WARN" : "INFO", msg);
}

static int logHas(const char* s) {
  pthread_mutex_lock(&logLock);
  int has = strstr(logText, s) != NULL;
  pthread_mutex_unlock(&logLock);
  return has;
}

static void logClear(void) {
  pthread_mutex_lock(&logLock);
  logText[0] = '\0';
  pthread_mutex_unlock(&logLock);
}

#define MAX_KEYS 16
struct ncclxConfigSection {
  int n;
  const char* key[MAX_KEYS];
  const char* value[MAX_KEYS];
};

static const char* stubGet(const ncclxConfigSection_t* s, const char* key) {
  for (int i = 0; i < s->n; i++)
    if (!strcasecmp(s->key[i], key)) return s->value[i];
  return NULL;
}

static int stubEntry(const ncclxConfigSection_t* s, int index, const char** key, const char** value, const char** where) {
  if (index < 0 || index >= s->n) return 0;
  static char whereBuf[MAX_KEYS][32];
  snprintf(whereBuf[index], sizeof(whereBuf[index]), "test.ini:%d", index + 1);
  *key = s->key[index];
  *value = s->value[index];
  *where = whereBuf[index];
  return 1;
}

static const ncclxConfigApi_t stubConfig = {stubGet, stubEntry};

static ncclxResult_t stubProfilerCb(void** h, int type, void* parent, int64_t id, void* data) {
  (void)type, (void)parent, (void)id, (void)data;
  if (h) *h = NULL;
  return ncclxSuccess;
}

static void setKey(struct ncclxConfigSection* s, const char* k, const char* v) {
  s->key[s->n] = k;
  s->value[s->n] = v;
  s->n++;
}

static ncclxResult_t initComm(void** ctx, struct ncclxConfigSection* sec, uint64_t hash, int rank, int nranks) {
  ncclxPluginEnv_t env = {NCCLX_PLUGIN_ENV_VERSION, stubLog, &stubConfig, sec, stubProfilerCb};
  ncclxProfilerCommInfo_v1_t info = {hash, "testcomm", rank, nranks, 1, "testhost", (int)getpid()};
  static int mask;
  ncclxResult_t res = P->init(ctx, &info, &mask, &env);
  memset(&env, 0xa5, sizeof(env)); /* the plugin must have copied what it keeps */
  return res;
}

/* ---------------------------------------------------------------- helpers */

static char* readFile(const char* path) {
  FILE* f = fopen(path, "r");
  if (!f) return NULL;
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  char* s = malloc((size_t)n + 1);
  size_t got = fread(s, 1, (size_t)n, f);
  s[got] = '\0';
  fclose(f);
  return s;
}

static int countOf(const char* hay, const char* needle) {
  int n = 0;
  for (const char* p = hay; (p = strstr(p, needle)) != NULL; p++) n++;
  return n;
}

static int waitFile(const char* path, const char* needle, double sec) {
  for (int i = 0; i < (int)(sec * 100); i++) {
    char* s = readFile(path);
    int ok = s && (!needle || strstr(s, needle));
    free(s);
    if (ok) return 1;
    usleep(10000);
  }
  return 0;
}

static int pythonJsonOk(const char* path) {
  if (system("python3 -c 'import json' >/dev/null 2>&1") != 0) return 1; /* no python: skip this check */
  char cmd[1200];
  snprintf(cmd, sizeof(cmd), "python3 -c 'import json,sys; json.load(open(sys.argv[1]))' '%s'", path);
  return system(cmd) == 0;
}

/* One collective with one send and one receive STEP to `peer`, all completing. */
static void oneColl(void* ctx, uint64_t seq, int peer, size_t bytes) {
  ncclxProfilerEventDescr_v1_t d;
  memset(&d, 0, sizeof(d));
  d.type = NCCLX_PROFILE_COLL;
  d.coll.seq = seq;
  d.coll.func = "allreduce";
  d.coll.count = bytes / 4;
  d.coll.bytes = bytes;
  d.coll.root = -1;
  d.coll.datatype = "float32";
  d.coll.op = "sum";
  d.coll.algo = "ring";
  d.coll.proto = "simple";
  void* coll = NULL;
  P->startEvent(ctx, &coll, &d);
  for (int dir = 0; dir < 2; dir++) {
    ncclxProfilerEventDescr_v1_t s;
    memset(&s, 0, sizeof(s));
    s.type = NCCLX_PROFILE_STEP;
    s.parent = coll;
    s.step.peer = peer;
    s.step.isSend = dir == 0;
    s.step.bytes = bytes;
    s.step.transport = "shm";
    void* step = NULL;
    P->startEvent(ctx, &step, &s);
    ncclxProfilerStateArgs_v1_t a = {0};
    P->recordEventState(step, NCCLX_PROFILE_STATE_POSTED, &a);
    a.bytes = bytes / 2;
    P->recordEventState(step, NCCLX_PROFILE_STATE_PROGRESS, &a);
    a.bytes = bytes;
    P->recordEventState(step, NCCLX_PROFILE_STATE_PROGRESS, &a);
    P->stopEvent(step);
  }
  P->stopEvent(coll);
}

typedef struct {
  void* ctx;
  int peer, n;
} Driver;

static void* drive(void* p) {
  Driver* d = p;
  for (int i = 1; i <= d->n; i++) oneColl(d->ctx, (uint64_t)i, d->peer, 4096);
  return NULL;
}

typedef struct {
  const char* dir;
  void* ctx;
  volatile int stop;
} Dumper;

static void* dumpLoop(void* p) {
  Dumper* d = p;
  char path[1100];
  snprintf(path, sizeof(path), "%s/concurrent.json.profiler", d->dir);
  while (!d->stop) P->dump(d->ctx, path);
  return NULL;
}

static volatile sig_atomic_t appHandlerCalls;
static void appHandler(int sig) {
  (void)sig;
  appHandlerCalls++;
}

/* ---------------------------------------------------------------- tests */

static void testBadSettings(const char* dir) {
  struct ncclxConfigSection s = {0};
  void* ctx = NULL;
  setKey(&s, "dir", dir);
  setKey(&s, "events", "coll,bogus");
  logClear();
  CHECK(initComm(&ctx, &s, 1, 0, 1) != ncclxSuccess, "events=coll,bogus accepted");
  CHECK(ctx == NULL, "ctx set on failure");
  CHECK(logHas("test.ini:2") && logHas("events") && logHas("bogus"), "error does not name key, where and value");

  struct ncclxConfigSection t = {0};
  setKey(&t, "dir", "/proc/ncclx-no-such-dir/trace");
  logClear();
  CHECK(initComm(&ctx, &t, 1, 0, 1) != ncclxSuccess, "unwritable dir accepted");
  CHECK(logHas("/proc/ncclx-no-such-dir"), "error does not name the directory");

  struct ncclxConfigSection u = {0};
  setKey(&u, "dir", dir);
  setKey(&u, "watchdog_timeout_ms", "-5");
  logClear();
  CHECK(initComm(&ctx, &u, 1, 0, 1) != ncclxSuccess, "watchdog_timeout_ms=-5 accepted");
  CHECK(logHas("watchdog_timeout_ms"), "error does not name watchdog_timeout_ms");

  struct ncclxConfigSection v = {0};
  setKey(&v, "dir", dir);
  setKey(&v, "colour", "blue");
  setKey(&v, "trace", "false");
  logClear();
  CHECK(initComm(&ctx, &v, 7, 0, 1) == ncclxSuccess, "an unknown key failed init");
  CHECK(logHas("unknown key 'colour'"), "no warning for an unknown key");
  if (ctx) P->finalize(ctx);
}

static void testRun(const char* dir) {
  struct sigaction app;
  memset(&app, 0, sizeof(app));
  app.sa_handler = appHandler;
  sigaction(SIGUSR1, &app, NULL);

  struct ncclxConfigSection s = {0};
  setKey(&s, "dir", dir);
  setKey(&s, "events", "coll,p2p,step");
  setKey(&s, "watchdog_timeout_ms", "300");
  setKey(&s, "flush_ms", "20");
  setKey(&s, "buffer_events", "64"); /* far below one burst: batches are written inline */
  setKey(&s, "summary", "log");
  void* a = NULL;
  void* b = NULL;
  CHECK(initComm(&a, &s, 0xaaaa, 0, 2) == ncclxSuccess && a, "init of comm A failed");
  CHECK(initComm(&b, &s, 0xbbbb, 1, 2) == ncclxSuccess && b, "init of comm B failed");
  if (!a || !b) return;

  /* Two comms driven at once while a third thread keeps dumping A. */
  enum { N = 500 };
  Driver da = {a, 1, N}, db = {b, 0, N};
  pthread_t ta, tb, td;
  Dumper dumper = {dir, a, 0};
  pthread_create(&td, NULL, dumpLoop, &dumper);
  pthread_create(&ta, NULL, drive, &da);
  pthread_create(&tb, NULL, drive, &db);
  pthread_join(ta, NULL);
  pthread_join(tb, NULL);
  dumper.stop = 1;
  pthread_join(td, NULL);

  char path[1200];
  snprintf(path, sizeof(path), "%s/a.json.profiler", dir);
  CHECK(P->dump(a, path) == ncclxSuccess, "dump failed");
  char* text = readFile(path);
  CHECK(text && strstr(text, "\"lastCompleted\": {\"coll\": 500"), "dump does not show #500 completed");
  CHECK(text && strstr(text, "\"format\": \"ncclx-profiler-dump-1\""), "dump format missing");
  CHECK(pythonJsonOk(path), "dump is not valid JSON");
  free(text);

  /* A stuck collective on A: the watchdog dumps once and names peer 1. */
  logClear();
  ncclxProfilerEventDescr_v1_t d;
  memset(&d, 0, sizeof(d));
  d.type = NCCLX_PROFILE_COLL;
  d.coll.seq = N + 1;
  d.coll.func = "allreduce";
  d.coll.bytes = 4096;
  d.coll.root = -1;
  void* coll = NULL;
  P->startEvent(a, &coll, &d);
  ncclxProfilerEventDescr_v1_t st;
  memset(&st, 0, sizeof(st));
  st.type = NCCLX_PROFILE_STEP;
  st.parent = coll;
  st.step.peer = 1;
  st.step.bytes = 4096;
  void* step = NULL;
  P->startEvent(a, &step, &st);
  ncclxProfilerStateArgs_v1_t args = {0};
  P->recordEventState(step, NCCLX_PROFILE_STATE_POSTED, &args);
  snprintf(path, sizeof(path), "%s/dump-000000000000aaaa-rank0.json", dir);
  CHECK(waitFile(path, "\"reason\": \"watchdog\"", 3.0), "no watchdog dump in %s", path);
  CHECK(logHas("allreduce #501") && logHas("rank 1 (recv 0 of 4096 B"), "watchdog warning lacks op or peer");
  usleep(400000);
  CHECK(countOf(logText, "watchdog:") == 1, "the watchdog reported one stuck op %d times", countOf(logText, "watchdog:"));
  args.result = ncclxRemoteError;
  args.message = "peer went away";
  P->recordEventState(step, NCCLX_PROFILE_STATE_FAILED, &args);
  P->stopEvent(step);
  P->recordEventState(coll, NCCLX_PROFILE_STATE_FAILED, &args);
  P->stopEvent(coll);

  /* SIGUSR1: both comms dump, the application's handler still runs. */
  unlink(path);
  raise(SIGUSR1);
  CHECK(waitFile(path, "\"reason\": \"SIGUSR1\"", 3.0), "no SIGUSR1 dump of comm A");
  snprintf(path, sizeof(path), "%s/dump-000000000000bbbb-rank1.json", dir);
  CHECK(waitFile(path, "\"reason\": \"SIGUSR1\"", 3.0), "no SIGUSR1 dump of comm B");
  CHECK(appHandlerCalls == 1, "the application's SIGUSR1 handler ran %d times", (int)appHandlerCalls);
  text = readFile(path);
  CHECK(text && strstr(text, "\"error\": null"), "comm B shows an error");
  free(text);
  snprintf(path, sizeof(path), "%s/dump-000000000000aaaa-rank0.json", dir);
  text = readFile(path);
  CHECK(text && strstr(text, "\"error\": \"peer went away\"") && strstr(text, "\"lastFailed\": {\"coll\": 501"),
        "comm A's dump lacks the failure");
  free(text);

  /* While the comm lives its records are spooled in binary form (dumps flush the ring). */
  snprintf(path, sizeof(path), "%s/trace-000000000000aaaa-rank0.spool", dir);
  struct stat sb;
  CHECK(stat(path, &sb) == 0 && sb.st_size > (off_t)(N * 65), "spool of comm A missing or short");

  logClear();
  P->finalize(a);
  P->finalize(b);
  CHECK(stat(path, &sb) != 0, "the spool of comm A is still there after finalize");
  CHECK(logHas("summary comm 000000000000aaaa rank 0/2: 500 operations"), "no summary for comm A");
  struct sigaction now;
  sigaction(SIGUSR1, NULL, &now);
  CHECK(now.sa_handler == appHandler, "SIGUSR1 handler not restored at the last finalize");

  snprintf(path, sizeof(path), "%s/trace-000000000000aaaa-rank0.json", dir);
  text = readFile(path);
  CHECK(text && countOf(text, "\"cat\":\"coll\"") == N + 1, "trace A has %d collectives, expected %d",
        text ? countOf(text, "\"cat\":\"coll\"") : -1, N + 1);
  CHECK(text && countOf(text, "\"cat\":\"step\"") == 2 * N + 1, "trace A has %d steps", text ? countOf(text, "\"cat\":\"step\"") : -1);
  CHECK(text && strstr(text, "\"status\":\"failed\""), "the failed collective is not marked");
  size_t len = text ? strlen(text) : 0;
  CHECK(len > 3 && !strcmp(text + len - 3, "\n]\n"), "trace A is not closed");
  free(text);
  CHECK(pythonJsonOk(path), "trace A is not valid JSON");
  snprintf(path, sizeof(path), "%s/metrics-000000000000bbbb-rank1.jsonl", dir);
  text = readFile(path);
  CHECK(text && strstr(text, "\"func\":\"allreduce\"") && strstr(text, "\"count\":500"), "metrics B wrong");
  CHECK(text && strstr(text, "\"busbwGBs\""), "metrics B lacks busbw");
  free(text);
}

int main(int argc, char** argv) {
  const char* so = argc > 1 ? argv[1] : NCCLX_TEST_TRACE_PLUGIN;
  void* dl = dlopen(so, RTLD_NOW | RTLD_LOCAL);
  if (!dl) {
    fprintf(stderr, "cannot load %s: %s\n", so, dlerror());
    return 1;
  }
  P = dlsym(dl, NCCLX_PROFILER_PLUGIN_SYMBOL);
  if (!P || P->abiVersion != NCCLX_PROFILER_ABI_VERSION || !P->dump) {
    fprintf(stderr, "bad plugin struct in %s\n", so);
    return 1;
  }
  char dir[] = "/tmp/ncclx-trace-test-XXXXXX";
  if (!mkdtemp(dir)) return 1;
  testBadSettings(dir);
  testRun(dir);
  char cmd[256];
  if (!failures) {
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
  } else {
    fprintf(stderr, "files kept in %s\n", dir);
  }
  dlclose(dl);
  printf("%s (%d failures)\n", failures ? "FAIL" : "PASS", failures);
  return failures ? 1 : 0;
}
