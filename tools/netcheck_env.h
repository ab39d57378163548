/* ncclx-net-check: the environment a tested plugin receives (ncclxPluginEnv_t) without the
 * ncclx core: a logger on stderr and a config section made of the -o KEY=VALUE options.
 * Environment variables (NCCLX_NET_<NAME>_*) are deliberately not read, so that what was
 * tested is exactly what the command line says. */
#ifndef NCCLX_NETCHECK_ENV_H
#define NCCLX_NETCHECK_ENV_H

#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "ncclx/net.h"

#define NETCHECK_MAX_OPTIONS 32

struct ncclxConfigSection {
  int n;
  char key[NETCHECK_MAX_OPTIONS][64];
  char value[NETCHECK_MAX_OPTIONS][192];
  char where[NETCHECK_MAX_OPTIONS][96];
};

static struct ncclxConfigSection netcheckSection;
static int netcheckLogLevel = NCCLX_LOG_WARN;
static const char* netcheckRole = "main";
static unsigned netcheckWarnings; /* WARN lines logged, printed or not: refusals must log */

/* -o KEY=VALUE; 0 on success, -1 with a message on stderr. */
static inline int netcheckAddOption(const char* arg) {
  const char* eq = strchr(arg, '=');
  struct ncclxConfigSection* s = &netcheckSection;
  if (!eq || eq == arg || (size_t)(eq - arg) >= sizeof(s->key[0]) ||
      strlen(eq + 1) >= sizeof(s->value[0])) {
    fprintf(stderr, "ncclx-net-check: -o '%s': expected KEY=VALUE (key < 64, value < 192 chars)\n",
            arg);
    return -1;
  }
  int i = 0;
  while (i < s->n && strncasecmp(s->key[i], arg, (size_t)(eq - arg)) != 0) i++;
  if (i == s->n) {
    if (s->n == NETCHECK_MAX_OPTIONS) {
      fprintf(stderr, "ncclx-net-check: more than %d -o options\n", NETCHECK_MAX_OPTIONS);
      return -1;
    }
    s->n++;
  }
  snprintf(s->key[i], sizeof(s->key[i]), "%.*s", (int)(eq - arg), arg);
  snprintf(s->value[i], sizeof(s->value[i]), "%s", eq + 1);
  snprintf(s->where[i], sizeof(s->where[i]), "command line -o %.*s", (int)(eq - arg), arg);
  return 0;
}

static inline const char* netcheckGet(const ncclxConfigSection_t* s, const char* key) {
  if (!s || !key) return NULL;
  for (int i = 0; i < s->n; i++)
    if (strcasecmp(s->key[i], key) == 0) return s->value[i];
  return NULL;
}

static inline int netcheckEntry(const ncclxConfigSection_t* s, int index, const char** key,
                                const char** value, const char** where) {
  if (!s || index < 0 || index >= s->n) return 0;
  if (key) *key = s->key[index];
  if (value) *value = s->value[index];
  if (where) *where = s->where[index];
  return 1;
}

static const ncclxConfigApi_t netcheckConfigApi = {netcheckGet, netcheckEntry};

static inline void netcheckLog(ncclxLogLevel_t level, unsigned long subsys, const char* file,
                               int line, const char* fmt, ...)
    __attribute__((format(printf, 5, 6)));
static inline void netcheckLog(ncclxLogLevel_t level, unsigned long subsys, const char* file,
                               int line, const char* fmt, ...) {
  (void)subsys;
  if (level == NCCLX_LOG_WARN) netcheckWarnings++;
  if (level == NCCLX_LOG_NONE || (int)level > netcheckLogLevel) return;
  const char* name = level == NCCLX_LOG_WARN ? "WARN" : level == NCCLX_LOG_INFO ? "INFO" : "TRACE";
  const char* base = file ? strrchr(file, '/') : NULL;
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof(msg), fmt, ap);
  va_end(ap);
  /* One write per line so lines of concurrent processes do not interleave. */
  char out[1280];
  int n = snprintf(out, sizeof(out), "[%s %d] %s %s:%d %s\n", netcheckRole, (int)getpid(), name,
                   base ? base + 1 : (file ? file : "?"), line, msg);
  if (n > 0) {
    ssize_t w = write(STDERR_FILENO, out, (size_t)n < sizeof(out) ? (size_t)n : sizeof(out) - 1);
    (void)w;
  }
}

static inline ncclxResult_t netcheckProfiler(void** eHandle, int type, void* parentHandle,
                                             int64_t pluginId, void* extData) {
  (void)type, (void)parentHandle, (void)pluginId, (void)extData;
  if (eHandle) *eHandle = NULL;
  return ncclxSuccess;
}

static inline void netcheckEnvFill(ncclxPluginEnv_t* env) {
  env->version = NCCLX_PLUGIN_ENV_VERSION;
  env->log = netcheckLog;
  env->config = &netcheckConfigApi;
  env->section = &netcheckSection;
  env->profiler = netcheckProfiler;
}

#endif /* NCCLX_NETCHECK_ENV_H */
