/* copyNonTemporal (copy_nt.h): the same bytes as memcpy for every destination and source
 * alignment within 64 bytes and sizes around the 16-byte head, the 64-byte loop and the
 * tail, and nothing written outside the destination. copyToShared's choice: two slow plain
 * copies in a row (not one, not two apart) switch to NCCLX_NT_COPIES non-temporal ones, each
 * large copy using one up until none is left; every mode copies the right bytes. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/copy_nt.h"

#define GUARD 64
#define MAX_BYTES (70 * 1024)

static int sharedCopyChoice(void) {
  int failures = 0;
#define EXPECT(cond)                                                    \
  do {                                                                  \
    if (!(cond)) failures++, fprintf(stderr, "copyToShared: %s\n", #cond); \
  } while (0)
  const size_t len = (size_t)1 << 20;
  const uint64_t slowNs = len, fastNs = len / 10; /* 1 and 10 bytes per ns */
  ncclxSharedCopy s = {0, 0};
  sharedCopyRecord(&s, len, slowNs);
  EXPECT(s.ntLeft == 0 && s.slowRun == 1); /* one slow copy may be a preemption */
  sharedCopyRecord(&s, len, fastNs);
  EXPECT(s.ntLeft == 0 && s.slowRun == 0);
  sharedCopyRecord(&s, len, slowNs); /* slow, fast, slow: not two in a row */
  EXPECT(s.ntLeft == 0 && s.slowRun == 1);
  sharedCopyRecord(&s, len, slowNs);
  EXPECT(s.ntLeft == NCCLX_NT_COPIES && s.slowRun == 0);
  /* Each non-temporal copy uses one up; copies below NCCLX_COPY_NT_MIN are plain and do not. */
  static unsigned char a[(size_t)64 << 10], b[sizeof a];
  for (size_t i = 0; i < sizeof a; i++) a[i] = (unsigned char)(i * 7 + 1);
  copyToShared(&s, NCCLX_NT_AUTO, b, a, sizeof a);
  EXPECT(s.ntLeft == NCCLX_NT_COPIES - 1 && memcmp(a, b, sizeof a) == 0);
  copyToShared(&s, NCCLX_NT_AUTO, b, a, 100);
  EXPECT(s.ntLeft == NCCLX_NT_COPIES - 1);
  for (uint32_t i = 1; i < NCCLX_NT_COPIES; i++) copyToShared(&s, NCCLX_NT_AUTO, b, a, sizeof a);
  EXPECT(s.ntLeft == 0 && memcmp(a, b, sizeof a) == 0);
  for (int mode = NCCLX_NT_AUTO; mode <= NCCLX_NT_NEVER; mode++) {
    ncclxSharedCopy t = {0, 0};
    memset(b, 0, sizeof b);
    copyToShared(&t, mode, b, a, sizeof a);
    EXPECT(memcmp(a, b, sizeof a) == 0);
  }
#undef EXPECT
  return failures;
}

int main(void) {
  static const size_t sizes[] = {0, 1, 15, 16, 17, 63, 64, 65, 79, 127, 128, 129, 1000, 4096,
                                 16383, 16384, 65536, 65536 + 37, MAX_BYTES};
  unsigned char* src = malloc(MAX_BYTES + 2 * GUARD);
  unsigned char* dst = malloc(MAX_BYTES + 2 * GUARD);
  if (!src || !dst) return fprintf(stderr, "out of memory\n"), 1;
  for (size_t i = 0; i < MAX_BYTES + 2 * GUARD; i++) src[i] = (unsigned char)(i * 131 + 7);
  int failures = 0, cases = 0;
  for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++)
    for (size_t dOff = 0; dOff < GUARD; dOff += 5)
      for (size_t sOff = 0; sOff < GUARD; sOff += 13) {
        size_t n = sizes[s];
        memset(dst, 0xA5, MAX_BYTES + 2 * GUARD);
        copyNonTemporal(dst + dOff, src + sOff, n);
        cases++;
        int bad = memcmp(dst + dOff, src + sOff, n) != 0;
        for (size_t i = 0; i < dOff && !bad; i++) bad = dst[i] != 0xA5;
        for (size_t i = dOff + n; i < dOff + n + GUARD && !bad; i++) bad = dst[i] != 0xA5;
        if (bad && failures++ < 10)
          fprintf(stderr, "copyNonTemporal: %zu bytes, destination offset %zu, source offset %zu: "
                  "wrong bytes or a write outside the destination\n", n, dOff, sOff);
      }
  free(src);
  free(dst);
  int choice = sharedCopyChoice();
  failures += choice;
  printf("test_copy_nt: %d cases, %d failed; copyToShared's choice: %d failed\n", cases, failures - choice, choice);
  return failures ? 1 : 0;
}
