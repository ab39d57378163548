/*
 * Reading ncclx.ini values the way the core does, for the core and for plugins (header only:
 * plugins must not call into libncclx). Every size key of the core and of our plugins goes
 * through ncclxParseSize, so "64K" means the same everywhere.
 */
#ifndef NCCLX_CONFIG_VALUE_H
#define NCCLX_CONFIG_VALUE_H

#include <ctype.h>
#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

/* A byte count: digits, optionally a K, M or G suffix (1024-based) and then B or iB ("4M",
 * "64 KiB", "100B"), white space allowed before, around the suffix and after (environment
 * values arrive untrimmed). No sign, nothing else. 0 and *out set, or -1 (out untouched) for
 * anything else or a value beyond SIZE_MAX. */
static inline int ncclxParseSize(const char* s, size_t* out) {
  if (s == NULL) return -1;
  while (isspace((unsigned char)*s)) s++;
  if (!isdigit((unsigned char)*s)) return -1;
  errno = 0;
  char* end = NULL;
  unsigned long long v = strtoull(s, &end, 10);
  if (errno != 0) return -1;
  while (isspace((unsigned char)*end)) end++;
  unsigned shift = 0;
  switch (toupper((unsigned char)*end)) {
    case 'K': shift = 10; end++; break;
    case 'M': shift = 20; end++; break;
    case 'G': shift = 30; end++; break;
    default: break;
  }
  if (shift && toupper((unsigned char)*end) == 'I' && toupper((unsigned char)end[1]) == 'B') end += 2;
  else if (toupper((unsigned char)*end) == 'B') end++;
  while (isspace((unsigned char)*end)) end++;
  if (*end != '\0' || v > (unsigned long long)(SIZE_MAX >> shift)) return -1;
  *out = (size_t)(v << shift);
  return 0;
}

#endif /* NCCLX_CONFIG_VALUE_H */
