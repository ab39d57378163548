/* Copying into shared memory that another core reads next, with non-temporal stores.
 *
 * A plain copy first takes every destination line for itself (a read for ownership), and
 * the reader of the previous round still holds those lines: on this VM, for stretches of
 * seconds to minutes, taking lines back from the other core costs so much that copying into
 * a shared-memory slot ran at ~2 GB/s instead of ~25 GB/s (2-rank all-to-all of 2 MiB: 700 us
 * instead of 95, in half of the runs; Open MPI, which copies once through the kernel, was
 * never hit). Non-temporal stores write whole lines to memory without taking them first:
 * 37-58 us per MiB through the slots in either state, where a plain copy took 34-43 us per
 * MiB in the good state and 250-560 in the bad one (docs/performance-history.md, session 7). The
 * reader then reads from memory instead of the writer's cache, which costs small copies
 * more than it saves (callers use it from NCCLX_COPY_NT_MIN bytes on) and large ones up to
 * 1.4x in the good state: so writers switch to it only while their plain copies are slow.
 *
 * copyToShared makes that choice for a writer of shared memory: plain copies while they run
 * fast, non-temporal ones for a while after two slow plain copies in a row. The
 * shared-memory transport's slots and the LL board's bulk area both use it.
 *
 * Header only: the shared-memory transport stays self-contained. SSE2 is part of x86-64, so
 * no CPU dispatch is needed; elsewhere it is memcpy. clock_gettime needs POSIX.1b
 * declarations: the build defines _GNU_SOURCE for every file. */
#ifndef NCCLX_COPY_NT_H
#define NCCLX_COPY_NT_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#if defined(__x86_64__)
#include <emmintrin.h>
#endif

#define NCCLX_COPY_NT_MIN ((size_t)16 << 10)

/* memcpy, then a store fence: a flag stored after it (release) is seen after the data. */
static inline void copyNonTemporal(void* dst, const void* src, size_t n) {
#if defined(__x86_64__)
  char* d = dst;
  const char* s = src;
  size_t head = (size_t)(-(uintptr_t)d & 15u); /* movntdq needs a 16-byte aligned target */
  if (head > n) head = n;
  memcpy(d, s, head);
  d += head, s += head, n -= head;
  for (; n >= 64; n -= 64, d += 64, s += 64) {
    __m128i a = _mm_loadu_si128((const __m128i*)s), b = _mm_loadu_si128((const __m128i*)(s + 16));
    __m128i c = _mm_loadu_si128((const __m128i*)(s + 32)), e = _mm_loadu_si128((const __m128i*)(s + 48));
    _mm_stream_si128((__m128i*)d, a);
    _mm_stream_si128((__m128i*)(d + 16), b);
    _mm_stream_si128((__m128i*)(d + 32), c);
    _mm_stream_si128((__m128i*)(d + 48), e);
  }
  memcpy(d, s, n);
  _mm_sfence(); /* non-temporal stores are not ordered by a release store */
#else
  memcpy(dst, src, n);
#endif
}

/* How copyToShared copies: [net.shm] nontemporal = auto | always | never. */
enum { NCCLX_NT_AUTO = 0, NCCLX_NT_ALWAYS = 1, NCCLX_NT_NEVER = 2 };

/* Two slow plain copies in a row (one alone may be a preemption) turn the next
 * NCCLX_NT_COPIES large copies into non-temporal ones, which are as fast in either state but
 * leave the reader to read from memory (up to 1.4x slower than a plain copy at its best).
 * Then a plain copy is tried again: the slow stretches end. Plain copies under ~3 GB/s are
 * slow (~25 at best). */
#define NCCLX_NT_COPIES 256u
#define NCCLX_SLOW_COPY_BYTES_PER_NS 3

/* One writer's state (not shared: each rank keeps its own per slot ring or board). */
typedef struct {
  uint32_t ntLeft;  /* copies left to make with non-temporal stores */
  uint32_t slowRun; /* slow plain copies in a row */
} ncclxSharedCopy;

/* Records a plain copy of len bytes that took ns. */
static inline void sharedCopyRecord(ncclxSharedCopy* s, size_t len, uint64_t ns) {
  s->slowRun = ns * NCCLX_SLOW_COPY_BYTES_PER_NS > len ? s->slowRun + 1 : 0;
  if (s->slowRun >= 2) {
    s->ntLeft = NCCLX_NT_COPIES;
    s->slowRun = 0;
  }
}

static inline uint64_t sharedCopyNowNs(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* Copies len bytes into shared memory another core reads next (mode: NCCLX_NT_*). Copies
 * under NCCLX_COPY_NT_MIN are always plain. */
static inline void copyToShared(ncclxSharedCopy* s, int mode, void* dst, const void* src, size_t len) {
  if (len < NCCLX_COPY_NT_MIN || mode == NCCLX_NT_NEVER) {
    memcpy(dst, src, len);
  } else if (s->ntLeft > 0 || mode == NCCLX_NT_ALWAYS) {
    s->ntLeft -= s->ntLeft > 0;
    copyNonTemporal(dst, src, len);
  } else {
    uint64_t start = sharedCopyNowNs();
    memcpy(dst, src, len);
    sharedCopyRecord(s, len, sharedCopyNowNs() - start);
  }
}

#endif
