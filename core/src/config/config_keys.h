/* What config.c checks values against: the value syntax (integers, booleans) and the core's
 * known keys with their types and ranges (config_keys.c). */
#ifndef NCCLX_CONFIG_KEYS_H
#define NCCLX_CONFIG_KEYS_H

#include <stddef.h>

/* KEY_TEXT: any value (a host identity may hold commas, which KEY_NAME refuses). */
typedef enum { KEY_INT, KEY_BOOL, KEY_SIZE, KEY_PATH_LIST, KEY_NAME_LIST, KEY_NAME, KEY_LEVEL, KEY_TEXT } KeyType;

typedef struct {
  const char* section;
  const char* key;
  KeyType type;
  long long min, max; /* KEY_INT, KEY_SIZE */
} KnownKey;

int parseLong(const char* s, long* out);
int parseBool(const char* s, int* out);
int isCoreSection(const char* section);
const KnownKey* findKnownKey(const char* section, const char* key);
void knownKeysOf(const char* section, char* buf, size_t size);
int validateValue(const KnownKey* k, const char* value, char* msg, size_t size);
/* The i-th known key, NULL past the last. */
const KnownKey* configKnownKey(size_t i);

#endif
