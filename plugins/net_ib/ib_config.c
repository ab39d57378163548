/* [net.ib] parsing (see ib_config.h and docs/net-ib.md for the keys). */
#include "ib_config.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

static const char* const knownKeys[] = {"hca",     "gid_index", "port",         "traffic_class",
                                        "sl",      "timeout",   "retry_cnt",    "qps_per_conn",
                                        "mr_cache_idle", "oob_ifname"};
#define NKNOWN (sizeof(knownKeys) / sizeof(knownKeys[0]))

void ibConfigDefaults(ibConfig* cfg) {
  memset(cfg, 0, sizeof(*cfg));
  cfg->gidIndex = -1;
  cfg->port = 0;
  cfg->trafficClass = 0;
  cfg->sl = 0;
  cfg->timeout = 20; /* ~4 s per try: long enough for a congested fabric, short enough to fail */
  cfg->retryCnt = 7;
  cfg->qpsPerConn = 1;
  cfg->mrCacheIdle = 0;
}

void ibConfigWhere(const ncclxConfigApi_t* api, const ncclxConfigSection_t* section,
                   const char* key, const char* value, char* out, size_t len) {
  for (int i = 0; api->entry; i++) {
    const char *k = NULL, *v = NULL, *w = NULL;
    if (!api->entry(section, i, &k, &v, &w)) break;
    if (k && strcasecmp(k, key) == 0 && v && value && strcmp(v, value) == 0 && w) {
      snprintf(out, len, "%s", w);
      return;
    }
  }
  /* Not from the file (or the environment overrides the file): name the variable. */
  char var[96];
  snprintf(var, sizeof(var), "NCCLX_NET_IB_%s", key);
  for (char* c = var; *c; c++) *c = isalnum((unsigned char)*c) ? (char)toupper((unsigned char)*c) : '_';
  snprintf(out, len, "env %s", var);
}

void ibConfigUnknownKeys(const ncclxConfigApi_t* api, const ncclxConfigSection_t* section,
                         void (*warn)(void* arg, const char* message), void* arg) {
  for (int i = 0; api->entry; i++) {
    const char *k = NULL, *v = NULL, *w = NULL;
    if (!api->entry(section, i, &k, &v, &w)) break;
    if (!k) continue;
    int known = 0;
    for (size_t j = 0; j < NKNOWN; j++) known |= strcasecmp(k, knownKeys[j]) == 0;
    if (known) continue;
    char msg[512];
    snprintf(msg, sizeof(msg),
             "[net.ib] ignoring unknown key '%s' (%s); known keys: hca, gid_index, port, "
             "traffic_class, sl, timeout, retry_cnt, qps_per_conn, mr_cache_idle, oob_ifname",
             k, w ? w : "?");
    warn(arg, msg);
  }
}

/* Strict decimal integer with optional blanks around it. */
static int parseInt(const char* s, long* out) {
  while (*s == ' ' || *s == '\t') s++;
  if (*s == '\0') return -1;
  char* end = NULL;
  errno = 0;
  long v = strtol(s, &end, 10);
  if (errno != 0 || end == s) return -1;
  while (*end == ' ' || *end == '\t') end++;
  if (*end != '\0') return -1;
  *out = v;
  return 0;
}

typedef struct {
  const char* key;
  int* dst;
  long lo, hi;
  const char* hint; /* appended to the range in the message */
} intKey;

static ncclxResult_t refuse(const ncclxConfigApi_t* api, const ncclxConfigSection_t* section,
                            const char* key, const char* value, const char* expected, char* err,
                            size_t errLen) {
  char where[160];
  ibConfigWhere(api, section, key, value, where, sizeof(where));
  snprintf(err, errLen, "[net.ib] %s = '%s' (%s): %s", key, value, where, expected);
  return ncclxInvalidUsage;
}

ncclxResult_t ibConfigLoad(const ncclxConfigApi_t* api, const ncclxConfigSection_t* section,
                           ibConfig* cfg, char* err, size_t errLen) {
  ibConfigDefaults(cfg);
  if (err && errLen) err[0] = '\0';
  if (!api || !api->get) {
    snprintf(err, errLen, "[net.ib] no configuration accessor");
    return ncclxInternalError;
  }
  const intKey ints[] = {
      {"gid_index", &cfg->gidIndex, -1, 255, " (-1 = automatic)"},
      {"port", &cfg->port, 0, 255, " (0 = any port)"},
      {"traffic_class", &cfg->trafficClass, 0, 255, ""},
      {"sl", &cfg->sl, 0, 15, ""},
      {"timeout", &cfg->timeout, 1, 31, " (4.096 us * 2^timeout per try; 0 would wait forever)"},
      {"retry_cnt", &cfg->retryCnt, 0, 7, ""},
      {"qps_per_conn", &cfg->qpsPerConn, 1, IB_MAX_QPS, ""},
      {"mr_cache_idle", &cfg->mrCacheIdle, 0, 4096, " (0 = deregister as soon as unused)"},
  };
  for (size_t i = 0; i < sizeof(ints) / sizeof(ints[0]); i++) {
    const char* v = api->get(section, ints[i].key);
    if (v == NULL || v[strspn(v, " \t")] == '\0') continue; /* unset or empty: the default */
    long x = 0;
    if (parseInt(v, &x) != 0 || x < ints[i].lo || x > ints[i].hi) {
      char expected[160];
      snprintf(expected, sizeof(expected), "expected an integer from %ld to %ld%s", ints[i].lo,
               ints[i].hi, ints[i].hint);
      return refuse(api, section, ints[i].key, v, expected, err, errLen);
    }
    *ints[i].dst = (int)x;
  }

  const char* v = api->get(section, "oob_ifname");
  if (v && *v) {
    size_t n = strlen(v);
    if (n >= sizeof(cfg->oobIfname) || strpbrk(v, " \t/:") != NULL)
      return refuse(api, section, "oob_ifname", v, "expected a network interface name such as eth0",
                    err, errLen);
    memcpy(cfg->oobIfname, v, n + 1);
  }

  v = api->get(section, "hca");
  if (v && *v) {
    if (strlen(v) >= sizeof(cfg->hca))
      return refuse(api, section, "hca", v, "longer than 255 characters", err, errLen);
    snprintf(cfg->hca, sizeof(cfg->hca), "%s", v);
    char why[200];
    if (ibHcaParse(v, &cfg->hcaFilter, why, sizeof(why)) != 0) {
      char expected[320];
      snprintf(expected, sizeof(expected), "%s (expected a list like 'mlx5_0:1,^mlx5_2' or 'mlx5_*')",
               why);
      return refuse(api, section, "hca", v, expected, err, errLen);
    }
  }
  return ncclxSuccess;
}
