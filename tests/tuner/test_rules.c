/* Unit test of the rules tuner: dlopens the built libncclx-tuner-rules.so (path from CMake,
 * or argv[1]) and drives init/getCollInfo/finalize through a stub environment: a logger
 * that records every message and a config section held in memory. Rules files are written
 * to a fresh directory under /tmp.
 *
 * It also checks the plugin's private copy of the name tables against the core's
 * (rules_names.c is compiled into this program; the core comes from ncclx_internal). */
#include <dlfcn.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ncclx/tuner.h"
#include "rules.h"

#ifndef NCCLX_TEST_RULES_PLUGIN
#define NCCLX_TEST_RULES_PLUGIN ""
#endif

static int failures;
#define CHECK(cond)                                                   \
  do {                                                                \
    if (!(cond)) {                                                    \
      fprintf(stderr, "FAIL %s:%d: %s\n", __FILE__, __LINE__, #cond); \
      failures++;                                                     \
    }                                                                 \
  } while (0)
#define CHECK_LOG(needle)                                                                  \
  do {                                                                                     \
    if (!strstr(logText, (needle))) {                                                      \
      fprintf(stderr, "FAIL %s:%d: '%s' not in the log:\n%s\n", __FILE__, __LINE__, (needle), \
              logText);                                                                    \
      failures++;                                                                          \
    }                                                                                      \
  } while (0)
#define CHECK_NOT_LOG(needle)                                                                  \
  do {                                                                                         \
    if (strstr(logText, (needle))) {                                                           \
      fprintf(stderr, "FAIL %s:%d: '%s' unexpectedly in the log:\n%s\n", __FILE__, __LINE__, \
              (needle), logText);                                                              \
      failures++;                                                                              \
    }                                                                                          \
  } while (0)

/* ---------------- stub environment ---------------- */

static char logText[1 << 16];
static int logInfoLines, logTraceLines, logWarnLines;

static void resetLog(void) {
  logText[0] = '\0';
  logInfoLines = logTraceLines = logWarnLines = 0;
}

__attribute__((format(printf, 5, 6))) static void stubLog(ncclxLogLevel_t level,
                                                          unsigned long subsys,
                                                          const char* file, int line,
                                                          const char* fmt, ...) {
  (void)file, (void)line;
  if (level == NCCLX_LOG_INFO) logInfoLines++;
  if (level == NCCLX_LOG_TRACE) logTraceLines++;
  if (level == NCCLX_LOG_WARN) logWarnLines++;
  /* Messages about tuning decisions must be in the TUNING subsystem. */
  if (level != NCCLX_LOG_WARN && !(subsys & NCCLX_LOG_TUNING)) {
    fprintf(stderr, "FAIL: message outside NCCLX_LOG_TUNING: %s\n", fmt);
    failures++;
  }
  size_t start = strlen(logText), len = start;
  const char* tag = level == NCCLX_LOG_WARN ? "WARN" : level == NCCLX_LOG_INFO ? "INFO" : "TRACE";
  snprintf(logText + len, sizeof(logText) - len, "%s ", tag);
  len = strlen(logText);
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(logText + len, sizeof(logText) - len, fmt, ap);
  va_end(ap);
  len = strlen(logText);
  snprintf(logText + len, sizeof(logText) - len, "\n");
  if (getenv("TEST_RULES_VERBOSE")) fprintf(stderr, "  log: %s", logText + start);
}

#define MAX_KEYS 16
struct ncclxConfigSection {
  int n;
  const char* keys[MAX_KEYS];
  const char* values[MAX_KEYS];
  const char* wheres[MAX_KEYS];
};

static const char* stubGet(const ncclxConfigSection_t* s, const char* key) {
  for (int i = 0; i < s->n; i++)
    if (strcmp(s->keys[i], key) == 0) return s->values[i];
  return NULL;
}

static int stubEntry(const ncclxConfigSection_t* s, int index, const char** key,
                     const char** value, const char** where) {
  if (index < 0 || index >= s->n) return 0;
  *key = s->keys[index];
  *value = s->values[index];
  *where = s->wheres[index];
  return 1;
}

static const ncclxConfigApi_t stubConfig = {.get = stubGet, .entry = stubEntry};
static ncclxConfigSection_t section;

static ncclxResult_t noProfiler(void** e, int t, void* p, int64_t id, void* d) {
  (void)t, (void)p, (void)id, (void)d;
  *e = NULL;
  return ncclxSuccess;
}

/* Keys are set in order; `where` mimics the core's "file:line". */
static void setKey(const char* key, const char* value) {
  static char whereBuf[MAX_KEYS][64];
  int i = section.n++;
  snprintf(whereBuf[i], sizeof(whereBuf[i]), "test.ini:%d", 10 + i);
  section.keys[i] = key;
  section.values[i] = value;
  section.wheres[i] = whereBuf[i];
}

/* ---------------- plugin ---------------- */

static const ncclxTuner_v1_t* tuner;
static char tmpDir[] = "/tmp/ncclx-test-tuner-XXXXXX";

static const char* writeFile(const char* name, const char* text) {
  static char path[4][512];
  static int next;
  char* p = path[next++ % 4];
  snprintf(p, 512, "%s/%s", tmpDir, name);
  FILE* f = fopen(p, "w");
  if (!f) {
    perror(p);
    exit(1);
  }
  fputs(text, f);
  fclose(f);
  return p;
}

/* init with the section as set up so far; clears the section afterwards. */
static ncclxResult_t initPlugin(void** ctx) {
  ncclxPluginEnv_t env = {.version = NCCLX_PLUGIN_ENV_VERSION, .log = stubLog,
                          .config = &stubConfig, .section = &section, .profiler = noProfiler};
  ncclxTunerCommInfo_v1_t info = {.commHash = 1, .rank = 0, .nranks = 4, .nhosts = 1,
                                  .ranksPerHostMax = 4, .commName = "test"};
  resetLog();
  *ctx = NULL;
  ncclxResult_t res = tuner->init(ctx, &info, &env);
  /* The env lives on this stack, like the core's: the plugin must have copied it. */
  memset(&env, 0xA5, sizeof(env));
  memset(&section, 0, sizeof(section));
  return res;
}

/* A table like the core's: SIMPLE costs for the given algorithms, everything else IGNORE. */
typedef struct {
  float t[NCCLX_NUM_ALGOS * NCCLX_NUM_PROTOS];
  size_t chunk;
  int channels;
} Call;

#define COST(call, a, p) ((call)->t[(a) * NCCLX_NUM_PROTOS + (p)])

static void fillTable(Call* c) {
  for (int i = 0; i < NCCLX_NUM_ALGOS * NCCLX_NUM_PROTOS; i++) c->t[i] = NCCLX_TUNER_IGNORE;
  COST(c, NCCLX_ALGO_RING, NCCLX_PROTO_SIMPLE) = 50.0f;
  COST(c, NCCLX_ALGO_RECURSIVE_DOUBLING, NCCLX_PROTO_SIMPLE) = 30.0f;
  COST(c, NCCLX_ALGO_TREE, NCCLX_PROTO_SIMPLE) = 40.0f;
  COST(c, NCCLX_ALGO_TREE, NCCLX_PROTO_LL) = 20.0f;
  c->chunk = 12345; /* sentinels: must come back unchanged unless a rule sets them */
  c->channels = 7;
}

static Call query(void* ctx, ncclxCollType_t coll, size_t bytes, int nranks, int nhosts) {
  Call c;
  fillTable(&c);
  ncclxTunerQuery_v1_t q = {.coll = coll, .bytes = bytes, .datatype = ncclxFloat32,
                            .op = ncclxSum, .nranks = nranks, .nhosts = nhosts};
  CHECK(tuner->getCollInfo(ctx, &q, c.t, &c.chunk, &c.channels) == ncclxSuccess);
  return c;
}

/* The (algo, proto) the core would pick from the table: the cheapest non-negative entry. */
static int chosen(const Call* c, int* proto) {
  int best = -1;
  for (int i = 0; i < NCCLX_NUM_ALGOS * NCCLX_NUM_PROTOS; i++)
    if (c->t[i] >= 0 && (best < 0 || c->t[i] < c->t[best])) best = i;
  if (proto) *proto = best < 0 ? -1 : best % NCCLX_NUM_PROTOS;
  return best < 0 ? -1 : best / NCCLX_NUM_PROTOS;
}

static int unchanged(const Call* c) {
  Call ref;
  fillTable(&ref);
  return memcmp(ref.t, c->t, sizeof(ref.t)) == 0 && c->chunk == 12345 && c->channels == 7;
}

/* ---------------- tests ---------------- */

static void testMatchAndBoundaries(void) {
  setKey("rule1", "allreduce, 1K, 64K, ring, simple, 0, 0, any, any");
  void* ctx;
  CHECK(initPlugin(&ctx) == ncclxSuccess);
  CHECK_LOG("1 rule(s)");
  int proto;
  Call c = query(ctx, NCCLX_COLL_ALLREDUCE, 4096, 4, 1);
  CHECK(chosen(&c, &proto) == NCCLX_ALGO_RING && proto == NCCLX_PROTO_SIMPLE);
  CHECK(COST(&c, NCCLX_ALGO_RING, NCCLX_PROTO_SIMPLE) == 0.0f);
  CHECK(COST(&c, NCCLX_ALGO_TREE, NCCLX_PROTO_SIMPLE) == 40.0f); /* others left alone */
  CHECK(c.chunk == 12345 && c.channels == 7);                     /* 0 = core default */
  /* Both bounds are inclusive. */
  CHECK(chosen((c = query(ctx, NCCLX_COLL_ALLREDUCE, 1024, 4, 1), &c), NULL) == NCCLX_ALGO_RING);
  CHECK(chosen((c = query(ctx, NCCLX_COLL_ALLREDUCE, 65536, 4, 1), &c), NULL) == NCCLX_ALGO_RING);
  c = query(ctx, NCCLX_COLL_ALLREDUCE, 1023, 4, 1);
  CHECK(unchanged(&c));
  c = query(ctx, NCCLX_COLL_ALLREDUCE, 65537, 4, 1);
  CHECK(unchanged(&c));
  /* Another collective: no match. */
  c = query(ctx, NCCLX_COLL_ALLGATHER, 4096, 4, 1);
  CHECK(unchanged(&c));
  /* The first match is logged at INFO with the rule's location, later ones at TRACE. */
  CHECK_LOG("INFO tuner rules: rule test.ini:10 (rule1) matches allreduce 4096 bytes");
  CHECK_LOG("ring/simple");
  CHECK(logInfoLines == 2 && logTraceLines == 2); /* "1 rule(s)" + first match */
  CHECK(tuner->finalize(ctx) == ncclxSuccess);
}

static void testWildcardsHostsRanks(void) {
  setKey("rule1", "ALLREDUCE, any, any, Tree, SIMPLE, any, any, 2, any"); /* names: any case */
  setKey("rule2", "allreduce, any, any, recursive_doubling, simple, 0, 0, any, 8");
  void* ctx;
  CHECK(initPlugin(&ctx) == ncclxSuccess);
  Call c = query(ctx, NCCLX_COLL_ALLREDUCE, 0, 4, 2);
  CHECK(chosen(&c, NULL) == NCCLX_ALGO_TREE);
  c = query(ctx, NCCLX_COLL_ALLREDUCE, SIZE_MAX, 16, 2);
  CHECK(chosen(&c, NULL) == NCCLX_ALGO_TREE);
  c = query(ctx, NCCLX_COLL_ALLREDUCE, 100, 8, 1);
  CHECK(chosen(&c, NULL) == NCCLX_ALGO_RECURSIVE_DOUBLING && COST(&c, 1, 0) == 0.0f);
  c = query(ctx, NCCLX_COLL_ALLREDUCE, 100, 4, 1);
  CHECK(unchanged(&c));
  CHECK(tuner->finalize(ctx) == ncclxSuccess);
}

static void testFirstMatchWinsAndOrder(void) {
  /* Keys are ordered by their number (rule2 before rule10), whatever their order in the
   * section; the file's rules come after every key. */
  const char* path = writeFile("order.rules",
                               "# comment line\n"
                               "\n"
                               "   allreduce, any, any, ring, simple, 0, 0, any, any  # all sizes\n"
                               "allgather, any, any, bruck, simple, 0, 0, any, any\n");
  setKey("rule10", "allreduce, 0, 1M, tree, simple, 0, 0, any, any");
  setKey("file", path);
  setKey("rule2", "allreduce, 0, 1K, recursive_doubling, simple, 0, 0, any, any");
  void* ctx;
  CHECK(initPlugin(&ctx) == ncclxSuccess);
  CHECK_LOG("4 rule(s): 2 from [tuner.rules] keys, 2 from");
  Call c = query(ctx, NCCLX_COLL_ALLREDUCE, 512, 4, 1);
  CHECK(chosen(&c, NULL) == NCCLX_ALGO_RECURSIVE_DOUBLING);
  c = query(ctx, NCCLX_COLL_ALLREDUCE, 4096, 4, 1);
  CHECK(chosen(&c, NULL) == NCCLX_ALGO_TREE);
  c = query(ctx, NCCLX_COLL_ALLREDUCE, 2 << 20, 4, 1);
  CHECK(chosen(&c, NULL) == NCCLX_ALGO_RING);
  CHECK_LOG("order.rules:3 matches allreduce 2097152 bytes");
  CHECK(tuner->finalize(ctx) == ncclxSuccess);
}

static void testIgnoreNeverRevived(void) {
  setKey("rule1", "allgather, any, any, bruck, simple, 1M, 4, any, any");  /* IGNORE in table */
  setKey("rule2", "allreduce, any, any, ring, ll, 64K, 2, any, any");      /* ring/ll IGNORE */
  setKey("rule3", "alltoall, any, any, hierarchical, any, 0, 0, any, any"); /* no proto runs */
  void* ctx;
  CHECK(initPlugin(&ctx) == ncclxSuccess);
  Call c = query(ctx, NCCLX_COLL_ALLGATHER, 100, 4, 1);
  CHECK(unchanged(&c)); /* neither the entry nor chunk/channels: the rule did not apply */
  CHECK(COST(&c, NCCLX_ALGO_BRUCK, NCCLX_PROTO_SIMPLE) < 0);
  c = query(ctx, NCCLX_COLL_ALLREDUCE, 0, 4, 1);
  CHECK(unchanged(&c));
  c = query(ctx, NCCLX_COLL_ALLTOALL, 100, 4, 1);
  CHECK(unchanged(&c));
  CHECK_LOG("bruck/simple cannot run this call; default choice kept");
  CHECK_LOG("ring/ll cannot run this call");
  CHECK_LOG("hierarchical/any cannot run this call");
  CHECK(tuner->finalize(ctx) == ncclxSuccess);
}

static void testChunkChannelsAndAnyProto(void) {
  setKey("rule1", "allreduce, any, any, tree, any, 1M, 4, any, any");
  setKey("rule2", "broadcast, any, any, ring, simple, 4K, any, any, any");
  void* ctx;
  CHECK(initPlugin(&ctx) == ncclxSuccess);
  int proto;
  Call c = query(ctx, NCCLX_COLL_ALLREDUCE, 100, 4, 1);
  /* "any" protocol: tree's cheapest runnable one, LL (20) over SIMPLE (40). */
  CHECK(chosen(&c, &proto) == NCCLX_ALGO_TREE && proto == NCCLX_PROTO_LL);
  CHECK(COST(&c, NCCLX_ALGO_TREE, NCCLX_PROTO_LL) == 0.0f);
  CHECK(COST(&c, NCCLX_ALGO_TREE, NCCLX_PROTO_SIMPLE) == 40.0f);
  CHECK(c.chunk == (1u << 20) && c.channels == 4);
  c = query(ctx, NCCLX_COLL_BROADCAST, 100, 4, 1);
  CHECK(chosen(&c, NULL) == NCCLX_ALGO_RING && c.chunk == 4096 && c.channels == 7);
  CHECK(tuner->finalize(ctx) == ncclxSuccess);
}

static void testTieBreak(void) {
  /* On one rank the core's model gives ring 0 us: a rule for tree must still win. */
  setKey("rule1", "allreduce, any, any, tree, simple, 0, 0, any, any");
  void* ctx;
  CHECK(initPlugin(&ctx) == ncclxSuccess);
  Call c;
  fillTable(&c);
  COST(&c, NCCLX_ALGO_RING, NCCLX_PROTO_SIMPLE) = 0.0f;
  ncclxTunerQuery_v1_t q = {.coll = NCCLX_COLL_ALLREDUCE, .bytes = 8, .nranks = 1, .nhosts = 1};
  CHECK(tuner->getCollInfo(ctx, &q, c.t, &c.chunk, &c.channels) == ncclxSuccess);
  CHECK(chosen(&c, NULL) == NCCLX_ALGO_TREE);
  CHECK(COST(&c, NCCLX_ALGO_RING, NCCLX_PROTO_SIMPLE) > 0.0f);
  CHECK(tuner->finalize(ctx) == ncclxSuccess);
}

/* A rules file whose only bad line is `line`: init fails and the message names file:2. */
static void expectBadLine(const char* line, const char* reason) {
  char text[4096];
  snprintf(text, sizeof(text), "allreduce, any, any, ring, simple, 0, 0, any, any\n%s\n", line);
  const char* path = writeFile("bad.rules", text);
  setKey("file", path);
  void* ctx;
  CHECK(initPlugin(&ctx) == ncclxInvalidUsage);
  CHECK(ctx == NULL);
  char where[600];
  snprintf(where, sizeof(where), "%s:2: invalid rule", path);
  CHECK_LOG(where);
  CHECK_LOG(reason);
  CHECK_LOG("the rules tuner is not used");
}

static void testBadLines(void) {
  expectBadLine("allreduce, any, any, rign, simple, 0, 0, any, any",
                "field 4: unknown algorithm 'rign' (valid: ring, recursive_doubling, "
                "rabenseifner, tree, bruck, pairwise, linear, hierarchical)");
  expectBadLine("allreduc, any, any, ring, simple, 0, 0, any, any",
                "unknown collective 'allreduc' (valid: broadcast, reduce, allgather");
  expectBadLine("allreduce, any, any, ring, ll128, 0, 0, any, any",
                "unknown protocol 'll128' (valid: simple, ll, any)");
  expectBadLine("allreduce, 64K, 1K, ring, simple, 0, 0, any, any",
                "min bytes 64K (65536) is larger than max bytes 1K (1024)");
  expectBadLine("allreduce, 0, 64K, ring, simple, 0, 0, any",
                "8 field(s), expected 9");
  expectBadLine("allreduce, 0, 64K, ring, simple, 0, 0, any, any, 1",
                "10 field(s), expected 9");
  expectBadLine("allreduce, 0, 12Q, ring, simple, 0, 0, any, any",
                "field 3 (max bytes): '12Q' is not a size");
  expectBadLine("allreduce, -1, 1K, ring, simple, 0, 0, any, any",
                "field 2 (min bytes): '-1' is not a size");
  expectBadLine("allreduce, 0, 99999999999999999999999, ring, simple, 0, 0, any, any",
                "is not a size");
  expectBadLine("allreduce, 0, 20000000000G, ring, simple, 0, 0, any, any", "is not a size");
  expectBadLine("allreduce, 0, 1K, ring, simple, 1K, 0, any, any",
                "field 6 (chunk size): '1K' is not 0, any or a size in [4K, 1G]");
  expectBadLine("allreduce, 0, 1K, ring, simple, 0, 65, any, any",
                "field 7 (channels): '65' is not 0, any or a number in [1, 64]");
  expectBadLine("allreduce, 0, 1K, ring, simple, 0, 0, 0, any",
                "field 8 (hosts): '0' is not any or a number >= 1");
  expectBadLine("allreduce, 0, 1K, ring, simple, 0, 0, any, 4x",
                "field 9 (ranks): '4x' is not any or a number >= 1");
  expectBadLine("allreduce, 0, , ring, simple, 0, 0, any, any", "field 3 (max bytes) is empty");

  /* Every bad line is reported, not just the first. */
  const char* path = writeFile("two-bad.rules",
                               "allreduce, 0, 1K, ring, simple, 0, 0, any, any\n"
                               "allgather, 0, 1K, bogus, simple, 0, 0, any, any\n"
                               "# fine\n"
                               "alltoall, 9, 8, linear, simple, 0, 0, any, any\n");
  setKey("file", path);
  void* ctx;
  CHECK(initPlugin(&ctx) == ncclxInvalidUsage);
  CHECK_LOG("two-bad.rules:2: invalid rule");
  CHECK_LOG("two-bad.rules:4: invalid rule");
  CHECK_LOG("2 error(s) in [tuner.rules]");

  /* A bad ini key names the ini's file:line and the key. */
  setKey("rule1", "allreduce, any, any, ring, simple, 0, 0, any");
  CHECK(initPlugin(&ctx) == ncclxInvalidUsage);
  CHECK_LOG("test.ini:10 (rule1): invalid rule 'allreduce, any, any, ring, simple, 0, 0, any'");

  /* A key that looks like a rule but is not rule<N> is an error; other keys warn only. */
  setKey("rule_1", "allreduce, any, any, ring, simple, 0, 0, any, any");
  CHECK(initPlugin(&ctx) == ncclxInvalidUsage);
  CHECK_LOG("test.ini:10: invalid key 'rule_1'");
  setKey("rule1", "allreduce, any, any, ring, simple, 0, 0, any, any");
  setKey("max-size", "4");
  CHECK(initPlugin(&ctx) == ncclxSuccess);
  CHECK_LOG("test.ini:11: unknown key 'max-size' in [tuner.rules] ignored (known: file, rule<N>)");
  CHECK(tuner->finalize(ctx) == ncclxSuccess);
}

static void testMissingFileAndEmpty(void) {
  char path[600];
  snprintf(path, sizeof(path), "%s/does-not-exist.rules", tmpDir);
  setKey("file", path);
  void* ctx;
  CHECK(initPlugin(&ctx) == ncclxInvalidUsage);
  char msg[800];
  snprintf(msg, sizeof(msg), "test.ini:10: [tuner.rules] file = '%s': cannot open: No such file", path);
  CHECK_LOG(msg);

  /* No rules at all: loads (nothing to do), with a warning that says so. */
  setKey("file", writeFile("empty.rules", "# nothing yet\n\n"));
  CHECK(initPlugin(&ctx) == ncclxSuccess);
  CHECK_LOG("WARN tuner rules: no rules");
  Call c = query(ctx, NCCLX_COLL_ALLREDUCE, 100, 4, 1);
  CHECK(unchanged(&c));
  CHECK(tuner->finalize(ctx) == ncclxSuccess);

  /* An empty rule value switches that rule off (e.g. NCCLX_TUNER_RULES_RULE1= for a run). */
  setKey("rule1", "");
  setKey("rule2", "allreduce, any, any, tree, simple, 0, 0, any, any");
  CHECK(initPlugin(&ctx) == ncclxSuccess);
  CHECK_LOG("(rule1): empty, rule disabled");
  CHECK(chosen((c = query(ctx, NCCLX_COLL_ALLREDUCE, 100, 4, 1), &c), NULL) == NCCLX_ALGO_TREE);
  CHECK(tuner->finalize(ctx) == ncclxSuccess);
}

static void testShadowWarning(void) {
  const char* path = writeFile("shadow.rules",
                               "allreduce, 0, 1M, ring, simple, 0, 0, any, any\n"
                               "allreduce, 1K, 64K, tree, simple, 0, 0, 2, 8\n"   /* shadowed */
                               "allreduce, 1K, 2M, tree, simple, 0, 0, any, any\n" /* not */
                               "allgather, 0, 1K, ring, simple, 0, 0, 1, any\n"
                               "allgather, 0, 1K, bruck, simple, 0, 0, any, any\n"); /* not */
  setKey("file", path);
  void* ctx;
  CHECK(initPlugin(&ctx) == ncclxSuccess);
  char msg[800];
  snprintf(msg, sizeof(msg), "WARN tuner rules: %s:2: rule never used: the earlier rule at %s:1",
           path, path);
  CHECK_LOG(msg);
  CHECK(logWarnLines == 1);
  CHECK(tuner->finalize(ctx) == ncclxSuccess);
}

static void testRobustness(void) {
  /* Bad arguments never crash; getCollInfo always succeeds. */
  ncclxTunerQuery_v1_t q = {.coll = NCCLX_COLL_ALLREDUCE, .bytes = 8, .nranks = 2, .nhosts = 1};
  Call c;
  fillTable(&c);
  CHECK(tuner->getCollInfo(NULL, &q, c.t, &c.chunk, &c.channels) == ncclxSuccess);
  CHECK(unchanged(&c));
  CHECK(tuner->finalize(NULL) == ncclxSuccess);
  void* ctx = NULL;
  ncclxTunerCommInfo_v1_t info = {.nranks = 1};
  CHECK(tuner->init(&ctx, &info, NULL) == ncclxInvalidArgument);
  /* A very long line is an error, not an overflow. */
  char line[3000];
  memset(line, 'a', sizeof(line) - 1);
  line[sizeof(line) - 1] = '\0';
  expectBadLine(line, "rule longer than");
}

/* The plugin's copy of the names must match the core's, index by index. */
static void testNamesMatchCore(void) {
  for (int i = 0; i < NCCLX_NUM_COLLS; i++) CHECK(strcmp(rulesCollName(i), ncclxCollName(i)) == 0);
  for (int i = 0; i < NCCLX_NUM_ALGOS; i++) {
    const char* mine = rulesAlgoName(i);
    CHECK(strcmp(mine ? mine : "unknown", ncclxAlgoName(i)) == 0);
  }
  for (int i = 0; i < NCCLX_NUM_PROTOS; i++) {
    const char* mine = rulesProtoName(i);
    CHECK(strcmp(mine ? mine : "unknown", ncclxProtoName(i)) == 0);
  }
}

int main(int argc, char** argv) {
  const char* path = argc > 1 ? argv[1] : NCCLX_TEST_RULES_PLUGIN;
  if (!path[0]) {
    fprintf(stderr, "usage: %s path/to/libncclx-tuner-rules.so\n", argv[0]);
    return 2;
  }
  void* dl = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!dl) {
    fprintf(stderr, "FAIL: dlopen %s: %s\n", path, dlerror());
    return 1;
  }
  tuner = dlsym(dl, NCCLX_TUNER_PLUGIN_SYMBOL);
  if (!tuner || strcmp(tuner->name, "rules") != 0 || tuner->abiVersion != NCCLX_TUNER_ABI_VERSION) {
    fprintf(stderr, "FAIL: %s: no valid %s\n", path, NCCLX_TUNER_PLUGIN_SYMBOL);
    return 1;
  }
  if (!mkdtemp(tmpDir)) {
    perror("mkdtemp");
    return 1;
  }

  testNamesMatchCore();
  testMatchAndBoundaries();
  testWildcardsHostsRanks();
  testFirstMatchWinsAndOrder();
  testIgnoreNeverRevived();
  testChunkChannelsAndAnyProto();
  testTieBreak();
  testBadLines();
  testMissingFileAndEmpty();
  testShadowWarning();
  testRobustness();

  char cmd[600];
  snprintf(cmd, sizeof(cmd), "rm -rf '%s'", tmpDir);
  if (system(cmd) != 0) fprintf(stderr, "note: could not remove %s\n", tmpDir);
  dlclose(dl);
  if (failures) {
    fprintf(stderr, "%d check(s) failed\n", failures);
    return 1;
  }
  printf("tuner rules: all checks passed\n");
  return 0;
}
