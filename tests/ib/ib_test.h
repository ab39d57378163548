/* Tiny assertion helpers shared by the net_ib unit tests. */
#ifndef NCCLX_IB_TEST_H
#define NCCLX_IB_TEST_H

#include <stdio.h>
#include <stdlib.h>

static int ibTestFailures;

#define CHECK(cond)                                                         \
  do {                                                                      \
    if (!(cond)) {                                                          \
      fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond); \
      ibTestFailures++;                                                     \
    }                                                                       \
  } while (0)

#define CHECK_MSG(cond, ...)                                              \
  do {                                                                    \
    if (!(cond)) {                                                        \
      fprintf(stderr, "%s:%d: check failed: %s: ", __FILE__, __LINE__, #cond); \
      fprintf(stderr, __VA_ARGS__);                                       \
      fprintf(stderr, "\n");                                              \
      ibTestFailures++;                                                   \
    }                                                                     \
  } while (0)

static inline int ibTestResult(const char* name) {
  if (ibTestFailures) {
    fprintf(stderr, "%s: %d check(s) failed\n", name, ibTestFailures);
    return 1;
  }
  printf("%s: all checks passed\n", name);
  return 0;
}

#endif
