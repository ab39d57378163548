/* One rule's text to a Rule:
 *   collective, min bytes, max bytes, algorithm, protocol, chunk, channels, hosts, ranks
 * Every error names the field and the offending text, so the caller only adds file:line. */
#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "rules.h"
#include "ncclx/config_value.h"

static const char* const fieldNames[RULES_NUM_FIELDS] = {
    "collective", "min bytes", "max bytes", "algorithm", "protocol",
    "chunk size", "channels",  "hosts",     "ranks"};

static char* trim(char* s) {
  while (isspace((unsigned char)*s)) s++;
  size_t n = strlen(s);
  while (n && isspace((unsigned char)s[n - 1])) s[--n] = '\0';
  return s;
}

char* rulesStripComment(char* line) {
  char* hash = strchr(line, '#');
  if (hash) *hash = '\0';
  return trim(line);
}

static int isAny(const char* s) { return strcasecmp(s, "any") == 0; }

/* A positive count or "any" (-> RULES_ANY); 0 as well when allowZero (chunk, channels). */
static int parseCount(const char* s, int allowZero, int max, int* out) {
  if (isAny(s)) {
    *out = allowZero ? 0 : RULES_ANY;
    return 0;
  }
  if (!isdigit((unsigned char)*s)) return -1;
  errno = 0;
  char* end;
  long v = strtol(s, &end, 10);
  if (errno == ERANGE || *end != '\0' || v > max || (v == 0 && !allowZero)) return -1;
  *out = (int)v;
  return 0;
}

/* Splits text at commas into exactly RULES_NUM_FIELDS trimmed, non-empty fields. */
static int splitFields(char* text, char* fields[RULES_NUM_FIELDS], char* err, size_t errSize) {
  int n = 0;
  for (char* p = text;; n++) {
    char* comma = strchr(p, ',');
    if (comma) *comma = '\0';
    if (n < RULES_NUM_FIELDS) fields[n] = trim(p);
    if (!comma) break;
    p = comma + 1;
  }
  n++;
  if (n != RULES_NUM_FIELDS) {
    snprintf(err, errSize,
             "%d field(s), expected %d: collective, min bytes, max bytes, algorithm, protocol, "
             "chunk size, channels, hosts, ranks",
             n, RULES_NUM_FIELDS);
    return -1;
  }
  for (int i = 0; i < RULES_NUM_FIELDS; i++)
    if (fields[i][0] == '\0') {
      snprintf(err, errSize, "field %d (%s) is empty", i + 1, fieldNames[i]);
      return -1;
    }
  return 0;
}

static int badName(char* err, size_t errSize, int field, const char* what, const char* value,
                   void (*listFn)(char*, size_t), const char* extra) {
  char valid[256];
  listFn(valid, sizeof(valid));
  snprintf(err, errSize, "field %d: unknown %s '%s' (valid: %s%s)", field + 1, what, value, valid,
           extra);
  return -1;
}

static int parseBytes(const char* s, int field, size_t anyValue, size_t* out, char* err,
                      size_t errSize) {
  if (isAny(s)) {
    *out = anyValue;
    return 0;
  }
  if (ncclxParseSize(s, out) == 0) return 0;
  snprintf(err, errSize, "field %d (%s): '%s' is not a size (bytes, or a number with K, M or G; or any)",
           field + 1, fieldNames[field], s);
  return -1;
}

int rulesParse(const char* text, Rule* r, char* err, size_t errSize) {
  char buf[1024];
  if (strlen(text) >= sizeof(buf)) {
    snprintf(err, errSize, "rule longer than %zu characters", sizeof(buf) - 1);
    return -1;
  }
  strcpy(buf, text);
  char* f[RULES_NUM_FIELDS];
  if (splitFields(buf, f, err, errSize) != 0) return -1;

  if ((r->coll = rulesLookupColl(f[0])) < 0)
    return badName(err, errSize, 0, "collective", f[0], rulesListColls, "");
  if (parseBytes(f[1], 1, 0, &r->minBytes, err, errSize) != 0) return -1;
  if (parseBytes(f[2], 2, SIZE_MAX, &r->maxBytes, err, errSize) != 0) return -1;
  if (r->minBytes > r->maxBytes) {
    snprintf(err, errSize, "min bytes %s (%zu) is larger than max bytes %s (%zu)", f[1],
             r->minBytes, f[2], r->maxBytes);
    return -1;
  }
  if ((r->algo = rulesLookupAlgo(f[3])) < 0)
    return badName(err, errSize, 3, "algorithm", f[3], rulesListAlgos, "");
  if (isAny(f[4])) r->proto = RULES_PROTO_ANY;
  else if ((r->proto = rulesLookupProto(f[4])) < 0)
    return badName(err, errSize, 4, "protocol", f[4], rulesListProtos, ", any");

  if (isAny(f[5]) || strcmp(f[5], "0") == 0) {
    r->chunkBytes = 0;
  } else if (ncclxParseSize(f[5], &r->chunkBytes) != 0 || r->chunkBytes < RULES_CHUNK_MIN ||
             r->chunkBytes > RULES_CHUNK_MAX) {
    snprintf(err, errSize, "field 6 (chunk size): '%s' is not 0, any or a size in [4K, 1G]", f[5]);
    return -1;
  }
  if (parseCount(f[6], 1, RULES_CHANNELS_MAX, &r->nChannels) != 0) {
    snprintf(err, errSize, "field 7 (channels): '%s' is not 0, any or a number in [1, %d]", f[6],
             RULES_CHANNELS_MAX);
    return -1;
  }
  for (int i = 7; i < 9; i++) {
    int* dst = i == 7 ? &r->nhosts : &r->nranks;
    if (parseCount(f[i], 0, INT_MAX, dst) != 0) {
      snprintf(err, errSize, "field %d (%s): '%s' is not any or a number >= 1", i + 1,
               fieldNames[i], f[i]);
      return -1;
    }
  }
  return 0;
}
