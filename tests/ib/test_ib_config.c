/* [net.ib] parsing: defaults, accepted values, and refusals that name key, value and where
 * the value came from (file:line from the section entries, or the environment variable). */
#include <string.h>
#include <strings.h>

#include "ib_config.h"
#include "ib_test.h"

/* A fake section: keys from a "file" (with file:line) and from the "environment". */
typedef struct {
  const char* key;
  const char* value;
  const char* where;
} fakeEntry;

struct ncclxConfigSection {
  fakeEntry file[16];
  int nfile;
  fakeEntry env[8]; /* overrides: what get() returns first */
  int nenv;
};

static const char* fakeGet(const ncclxConfigSection_t* s, const char* key) {
  for (int i = 0; i < s->nenv; i++)
    if (strcasecmp(s->env[i].key, key) == 0) return s->env[i].value;
  for (int i = 0; i < s->nfile; i++)
    if (strcasecmp(s->file[i].key, key) == 0) return s->file[i].value;
  return NULL;
}

static int fakeEntryAt(const ncclxConfigSection_t* s, int index, const char** key,
                       const char** value, const char** where) {
  if (index < 0 || index >= s->nfile) return 0;
  *key = s->file[index].key;
  *value = s->file[index].value;
  *where = s->file[index].where;
  return 1;
}

static const ncclxConfigApi_t fakeApi = {fakeGet, fakeEntryAt};

static void fileKey(ncclxConfigSection_t* s, const char* key, const char* value, const char* where) {
  s->file[s->nfile++] = (fakeEntry){key, value, where};
}

static void testDefaults(void) {
  ncclxConfigSection_t s = {0};
  ibConfig cfg;
  char err[512];
  CHECK(ibConfigLoad(&fakeApi, &s, &cfg, err, sizeof(err)) == ncclxSuccess);
  CHECK(cfg.gidIndex == -1 && cfg.port == 0 && cfg.trafficClass == 0 && cfg.sl == 0);
  CHECK(cfg.timeout == 20 && cfg.retryCnt == 7 && cfg.qpsPerConn == 1 && cfg.mrCacheIdle == 0);
  CHECK(cfg.hca[0] == '\0' && cfg.hcaFilter.n == 0 && cfg.oobIfname[0] == '\0');
}

static void testValid(void) {
  ncclxConfigSection_t s = {0};
  fileKey(&s, "hca", "mlx5_0:1,^mlx5_2", "ncclx.ini:3");
  fileKey(&s, "GID_INDEX", " 3 ", "ncclx.ini:4"); /* keys are case-insensitive, blanks trimmed */
  fileKey(&s, "port", "2", "ncclx.ini:5");
  fileKey(&s, "traffic_class", "106", "ncclx.ini:6");
  fileKey(&s, "sl", "15", "ncclx.ini:7");
  fileKey(&s, "timeout", "1", "ncclx.ini:8");
  fileKey(&s, "retry_cnt", "0", "ncclx.ini:9");
  fileKey(&s, "qps_per_conn", "8", "ncclx.ini:10");
  fileKey(&s, "mr_cache_idle", "4096", "ncclx.ini:11");
  fileKey(&s, "oob_ifname", "eth0", "ncclx.ini:12");
  ibConfig cfg;
  char err[512] = "";
  CHECK_MSG(ibConfigLoad(&fakeApi, &s, &cfg, err, sizeof(err)) == ncclxSuccess, "%s", err);
  CHECK(strcmp(cfg.hca, "mlx5_0:1,^mlx5_2") == 0 && cfg.hcaFilter.n == 2);
  CHECK(cfg.gidIndex == 3 && cfg.port == 2 && cfg.trafficClass == 106 && cfg.sl == 15);
  CHECK(cfg.timeout == 1 && cfg.retryCnt == 0 && cfg.qpsPerConn == 8 && cfg.mrCacheIdle == 4096);
  CHECK(strcmp(cfg.oobIfname, "eth0") == 0);
  /* An empty value means the default. */
  ncclxConfigSection_t e = {0};
  fileKey(&e, "timeout", "", "ncclx.ini:2");
  fileKey(&e, "hca", "", "ncclx.ini:3");
  CHECK(ibConfigLoad(&fakeApi, &e, &cfg, err, sizeof(err)) == ncclxSuccess && cfg.timeout == 20);
}

/* One bad value: refused with InvalidUsage, the message names key, value and where. */
static void expectRefused(const char* key, const char* value, const char* where, int fromEnv,
                          const char* alsoMentions) {
  ncclxConfigSection_t s = {0};
  if (fromEnv)
    s.env[s.nenv++] = (fakeEntry){key, value, NULL};
  else
    fileKey(&s, key, value, where);
  ibConfig cfg;
  char err[512] = "";
  ncclxResult_t res = ibConfigLoad(&fakeApi, &s, &cfg, err, sizeof(err));
  CHECK_MSG(res == ncclxInvalidUsage, "%s = '%s' gave %d", key, value, (int)res);
  CHECK_MSG(strstr(err, key) != NULL, "message '%s' lacks the key", err);
  char quoted[128];
  snprintf(quoted, sizeof(quoted), "'%s'", value);
  CHECK_MSG(strstr(err, quoted) != NULL, "message '%s' lacks the value", err);
  CHECK_MSG(strstr(err, where) != NULL, "message '%s' lacks '%s'", err, where);
  if (alsoMentions) CHECK_MSG(strstr(err, alsoMentions) != NULL, "message '%s' lacks '%s'", err, alsoMentions);
}

static void testRefusals(void) {
  expectRefused("timeout", "0", "ncclx.ini:7", 0, "1 to 31");
  expectRefused("timeout", "32", "ncclx.ini:7", 0, NULL);
  expectRefused("timeout", "4s", "ncclx.ini:7", 0, NULL);
  expectRefused("retry_cnt", "8", "ncclx.ini:2", 0, "0 to 7");
  expectRefused("retry_cnt", "-1", "ncclx.ini:2", 0, NULL);
  expectRefused("sl", "16", "a.ini:9", 0, "0 to 15");
  expectRefused("traffic_class", "256", "a.ini:1", 0, NULL);
  expectRefused("gid_index", "-2", "a.ini:1", 0, NULL);
  expectRefused("gid_index", "abc", "a.ini:1", 0, NULL);
  expectRefused("port", "256", "a.ini:1", 0, NULL);
  expectRefused("qps_per_conn", "0", "a.ini:1", 0, NULL);
  expectRefused("qps_per_conn", "9", "a.ini:1", 0, "1 to 8");
  expectRefused("mr_cache_idle", "99999", "a.ini:1", 0, NULL);
  expectRefused("qps_per_conn", "99999999999999999999", "a.ini:1", 0, NULL); /* overflow */
  expectRefused("oob_ifname", "eth 0", "a.ini:1", 0, NULL);
  expectRefused("hca", "mlx5_0,,mlx5_1", "a.ini:4", 0, "empty");
  expectRefused("hca", "mlx5_0:0", "a.ini:4", 0, "port");
  expectRefused("hca", "mlx5_0:x", "a.ini:4", 0, "port");
  expectRefused("hca", "^", "a.ini:4", 0, NULL);
  expectRefused("hca", "mlx5/0", "a.ini:4", 0, "not allowed");
  /* From the environment: the variable is named. */
  expectRefused("timeout", "0", "env NCCLX_NET_IB_TIMEOUT", 1, NULL);
  expectRefused("qps_per_conn", "x", "env NCCLX_NET_IB_QPS_PER_CONN", 1, NULL);

  /* The environment overrides a good file value with a bad one: blame the variable. */
  ncclxConfigSection_t s = {0};
  fileKey(&s, "sl", "3", "ncclx.ini:5");
  s.env[s.nenv++] = (fakeEntry){"sl", "99", NULL};
  ibConfig cfg;
  char err[512] = "";
  CHECK(ibConfigLoad(&fakeApi, &s, &cfg, err, sizeof(err)) == ncclxInvalidUsage);
  CHECK_MSG(strstr(err, "env NCCLX_NET_IB_SL") != NULL && strstr(err, "ncclx.ini:5") == NULL, "%s", err);
}

static int nwarn;
static char lastWarn[512];
static void collect(void* arg, const char* message) {
  (void)arg;
  nwarn++;
  snprintf(lastWarn, sizeof(lastWarn), "%s", message);
}

static void testUnknownKeys(void) {
  ncclxConfigSection_t s = {0};
  fileKey(&s, "timeout", "10", "x.ini:2");
  fileKey(&s, "timout", "10", "x.ini:3");
  fileKey(&s, "QPS_PER_CONN", "2", "x.ini:4");
  ibConfigUnknownKeys(&fakeApi, &s, collect, NULL);
  CHECK(nwarn == 1);
  CHECK(strstr(lastWarn, "'timout'") && strstr(lastWarn, "x.ini:3") && strstr(lastWarn, "timeout"));
}

int main(void) {
  testDefaults();
  testValid();
  testRefusals();
  testUnknownKeys();
  return ibTestResult("test_ib_config");
}
