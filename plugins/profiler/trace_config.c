/* [profiler.trace]: every key is checked; a bad value names its key and where it was set
 * (file:line or the environment variable), an unknown key is a warning. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "trace.h"

static const char* const knownKeys =
    "dir, events, trace, metrics, watchdog_timeout_ms, signal, flush_ms, buffer_events, summary";

static const struct {
  const char* name;
  int bit;
} eventNames[] = {
    {"group", NCCLX_PROFILE_GROUP}, {"coll", NCCLX_PROFILE_COLL}, {"p2p", NCCLX_PROFILE_P2P},
    {"step", NCCLX_PROFILE_STEP},   {"net", NCCLX_PROFILE_NET},   {"all", NCCLX_PROFILE_ALL},
};

void traceMaskString(int mask, char* out, size_t size) {
  size_t len = 0;
  out[0] = '\0';
  for (size_t i = 0; i + 1 < sizeof(eventNames) / sizeof(eventNames[0]); i++)
    if ((mask & eventNames[i].bit) && len < size)
      len += (size_t)snprintf(out + len, size - len, "%s%s", len ? "," : "", eventNames[i].name);
  if (!out[0]) snprintf(out, size, "none");
}

static int parseBool(const char* v, int* out) {
  static const char* const yes[] = {"1", "true", "yes", "on"};
  static const char* const no[] = {"0", "false", "no", "off"};
  for (int i = 0; i < 4; i++) {
    if (!strcasecmp(v, yes[i])) return *out = 1, 0;
    if (!strcasecmp(v, no[i])) return *out = 0, 0;
  }
  return -1;
}

static int parseLong(const char* v, long min, long max, long* out) {
  char* end;
  errno = 0;
  long l = strtol(v, &end, 10);
  while (*end == ' ' || *end == '\t') end++;
  if (errno || end == v || *end || l < min || l > max) return -1;
  *out = l;
  return 0;
}

/* "coll,p2p step|net": separators are commas, spaces and '|'. */
static int parseEvents(const char* v, int* mask, char* bad, size_t badSize) {
  int m = 0;
  char tmp[256];
  snprintf(tmp, sizeof(tmp), "%s", v);
  for (char *save = NULL, *tok = strtok_r(tmp, ", |\t", &save); tok; tok = strtok_r(NULL, ", |\t", &save)) {
    size_t i = 0, n = sizeof(eventNames) / sizeof(eventNames[0]);
    while (i < n && strcasecmp(tok, eventNames[i].name)) i++;
    if (i == n) {
      snprintf(bad, badSize, "%s", tok);
      return -1;
    }
    m |= eventNames[i].bit;
  }
  if (!m && strcasecmp(v, "none")) {
    snprintf(bad, badSize, "(empty)");
    return -1;
  }
  *mask = m;
  return 0;
}

static int setKey(TraceConfig* cfg, const ncclxPluginEnv_t* env, const char* key,
                  const char* value, const char* where) {
  int b;
  long l;
  char bad[64];
#define BAD(what)                                                                          \
  do {                                                                                     \
    traceLog(env, NCCLX_LOG_WARN, "%s: [profiler.trace] %s = '%s': %s", where, key, value, \
             what);                                                                        \
    return -1;                                                                             \
  } while (0)
  if (!strcasecmp(key, "dir")) {
    if (!*value) BAD("empty directory name");
    if (strlen(value) >= sizeof(cfg->dir) - 64) BAD("path too long");
    snprintf(cfg->dir, sizeof(cfg->dir), "%s", value);
  } else if (!strcasecmp(key, "events")) {
    if (parseEvents(value, &cfg->mask, bad, sizeof(bad)) != 0) {
      char why[160];
      snprintf(why, sizeof(why), "unknown event '%s' (known: group, coll, p2p, step, net, all, none)", bad);
      BAD(why);
    }
  } else if (!strcasecmp(key, "trace") || !strcasecmp(key, "metrics") || !strcasecmp(key, "signal")) {
    if (parseBool(value, &b) != 0) BAD("not a boolean (true/false, 1/0, yes/no, on/off)");
    *(!strcasecmp(key, "trace") ? &cfg->trace : !strcasecmp(key, "metrics") ? &cfg->metrics : &cfg->signal) = b;
  } else if (!strcasecmp(key, "watchdog_timeout_ms")) {
    if (parseLong(value, 0, 86400000L, &l) != 0) BAD("not an integer in [0, 86400000] (0 = off)");
    cfg->watchdogMs = l;
  } else if (!strcasecmp(key, "flush_ms")) {
    if (parseLong(value, 1, 60000L, &l) != 0) BAD("not an integer in [1, 60000]");
    cfg->flushMs = l;
  } else if (!strcasecmp(key, "buffer_events")) {
    if (parseLong(value, 64, 1L << 22, &l) != 0) BAD("not an integer in [64, 4194304]");
    cfg->bufferEvents = l;
  } else if (!strcasecmp(key, "summary")) {
    if (!strcasecmp(value, "log")) cfg->summary = TRACE_SUMMARY_LOG;
    else if (!strcasecmp(value, "stderr")) cfg->summary = TRACE_SUMMARY_STDERR;
    else if (!strcasecmp(value, "none")) cfg->summary = TRACE_SUMMARY_NONE;
    else BAD("not one of log, stderr, none");
  } else {
    traceLog(env, NCCLX_LOG_WARN, "%s: unknown key '%s' in [profiler.trace] ignored (known: %s)",
             where, key, knownKeys);
  }
#undef BAD
  return 0;
}

ncclxResult_t traceConfigLoad(TraceConfig* cfg, const ncclxPluginEnv_t* env) {
  memset(cfg, 0, sizeof(*cfg));
  snprintf(cfg->dir, sizeof(cfg->dir), "./ncclx-trace");
  cfg->mask = NCCLX_PROFILE_COLL | NCCLX_PROFILE_P2P;
  cfg->trace = cfg->metrics = cfg->signal = 1;
  cfg->watchdogMs = 60000;
  cfg->flushMs = 100;
  cfg->bufferEvents = 8192;
  cfg->summary = TRACE_SUMMARY_LOG;
  int errors = 0;
  const char *key, *value, *where;
  for (int i = 0; env->config->entry(env->section, i, &key, &value, &where); i++)
    if (key && value) errors += setKey(cfg, env, key, value, where ? where : "?") != 0;
  return errors ? ncclxInvalidUsage : ncclxSuccess;
}
