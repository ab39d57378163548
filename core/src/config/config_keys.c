/* The core's known ncclx.ini keys (types, ranges) and the value syntax they are checked with. */
#include "config/config_keys.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "config/config.h"
#include "ncclx/config_value.h"

/* ---------- value syntax ---------- */

int parseLong(const char* s, long* out) {
  if (s == NULL || *s == '\0') return 0;
  errno = 0;
  char* end = NULL;
  long v = strtol(s, &end, 10);
  if (errno != 0 || end == s) return 0;
  while (isspace((unsigned char)*end)) end++;
  if (*end != '\0') return 0;
  *out = v;
  return 1;
}

int parseBool(const char* s, int* out) {
  static const char* yes[] = {"true", "1", "yes", "on"};
  static const char* no[] = {"false", "0", "no", "off"};
  if (s == NULL) return 0;
  for (size_t i = 0; i < sizeof(yes) / sizeof(yes[0]); i++) {
    if (strcasecmp(s, yes[i]) == 0) return *out = 1, 1;
    if (strcasecmp(s, no[i]) == 0) return *out = 0, 1;
  }
  return 0;
}

/* ---------- the known core keys ---------- */



static const KnownKey knownKeys[] = {
    {"core", "timeout_s", KEY_INT, 0, 100000000},
    {"core", "lazy_connect", KEY_BOOL, 0, 0},
    {"core", "chunk_bytes", KEY_SIZE, 4096, 1LL << 30},
    {"core", "shm", KEY_BOOL, 0, 0},
    {"core", "host_id", KEY_TEXT, 0, 0},
    {"core", "plugin_path", KEY_PATH_LIST, 0, 0},
    {"core", "check_mismatch", KEY_BOOL, 0, 0},
    {"core", "ll_max_bytes", KEY_SIZE, 0, 16384},
    {"core", "fuse_auto_explore", KEY_BOOL, 0, 0},
    {"net", "plugin", KEY_NAME_LIST, 0, 0},
    {"net", "device", KEY_INT, 0, NCCLX_NET_DEVICE_MAX},
    {"tuner", "plugin", KEY_NAME, 0, 0},
    {"tuner", "model", KEY_PATH_LIST, 0, 0},
    {"profiler", "plugin", KEY_NAME, 0, 0},
    {"debug", "level", KEY_LEVEL, 0, 0},
    {"modules", "commfuse", KEY_NAME, 0, 0},
    {"modules", "moe", KEY_NAME, 0, 0},
};
#define NUM_KNOWN_KEYS (sizeof(knownKeys) / sizeof(knownKeys[0]))

const KnownKey* configKnownKey(size_t i) { return i < NUM_KNOWN_KEYS ? &knownKeys[i] : NULL; }
static const char* coreSections[] = {"core", "net", "tuner", "profiler", "debug", "modules"};

int isCoreSection(const char* section) {
  for (size_t i = 0; i < sizeof(coreSections) / sizeof(coreSections[0]); i++)
    if (strcasecmp(section, coreSections[i]) == 0) return 1;
  return 0;
}

const KnownKey* findKnownKey(const char* section, const char* key) {
  for (size_t i = 0; i < NUM_KNOWN_KEYS; i++)
    if (strcasecmp(knownKeys[i].section, section) == 0 && strcasecmp(knownKeys[i].key, key) == 0)
      return &knownKeys[i];
  return NULL;
}

void knownKeysOf(const char* section, char* buf, size_t size) {
  buf[0] = '\0';
  for (size_t i = 0; i < NUM_KNOWN_KEYS; i++) {
    if (strcasecmp(knownKeys[i].section, section) != 0) continue;
    size_t len = strlen(buf);
    snprintf(buf + len, size - len, "%s%s", len ? ", " : "", knownKeys[i].key);
  }
}

/* Checks one value of a known key; on failure writes why into msg. */
int validateValue(const KnownKey* k, const char* value, char* msg, size_t size) {
  long l;
  int b;
  size_t sz;
  switch (k->type) {
    case KEY_INT:
      if (!parseLong(value, &l)) return snprintf(msg, size, "not an integer"), 0;
      if (l < k->min || l > k->max)
        return snprintf(msg, size, "out of range [%lld, %lld]", k->min, k->max), 0;
      return 1;
    case KEY_BOOL:
      if (!parseBool(value, &b))
        return snprintf(msg, size, "not a boolean (true/false, 1/0, yes/no, on/off)"), 0;
      return 1;
    case KEY_SIZE:
      if (ncclxParseSize(value, &sz) != 0)
        return snprintf(msg, size, "not a size (bytes, or a number with K, M or G)"), 0;
      if ((unsigned long long)sz < (unsigned long long)k->min ||
          (unsigned long long)sz > (unsigned long long)k->max)
        return snprintf(msg, size, "out of range [%lld, %lld] bytes", k->min, k->max), 0;
      return 1;
    case KEY_LEVEL:
      if (strcasecmp(value, "NONE") && strcasecmp(value, "WARN") && strcasecmp(value, "INFO") &&
          strcasecmp(value, "TRACE"))
        return snprintf(msg, size, "not one of NONE, WARN, INFO, TRACE"), 0;
      return 1;
    case KEY_NAME:
      if (strchr(value, ',') != NULL)
        return snprintf(msg, size, "takes one plugin name (or none), not a list"), 0;
      return 1;
    case KEY_NAME_LIST: {
      /* Every comma-separated item must be non-blank. */
      const char* p = value;
      for (;;) {
        const char* comma = strchr(p, ',');
        const char* end = comma ? comma : p + strlen(p);
        int blank = 1;
        for (const char* q = p; q < end; q++)
          if (!isspace((unsigned char)*q)) blank = 0;
        if (blank) return snprintf(msg, size, "empty name in the comma-separated list"), 0;
        if (comma == NULL) return 1;
        p = comma + 1;
      }
    }
    case KEY_PATH_LIST:
    case KEY_TEXT:
      return 1;
  }
  return 1;
}
