/* Copying into shared memory that another core reads next, with non-temporal stores.
 *
 * A plain copy first takes every destination line for itself (a read for ownership), and
 * the reader of the previous round still holds those lines: on this VM, for stretches of
 * seconds to minutes, taking lines back from the other core costs so much that copying into
 * a shared-memory slot ran at ~2 GB/s instead of ~25 GB/s (2-rank all-to-all of 2 MiB: 700 us
 * instead of 95, in half of the runs; Open MPI, which copies once through the kernel, was
 * never hit). Non-temporal stores write whole lines to memory without taking them first:
 * 37-58 us per MiB through the slots in either state, where a plain copy took 34-43 us per
 * MiB in the good state and 250-560 in the bad one (docs/performance.md, session 7). The
 * reader then reads from memory instead of the writer's cache, which costs small copies
 * more than it saves (callers use it from NCCLX_COPY_NT_MIN bytes on) and large ones up to
 * 1.4x in the good state: the shared-memory transport switches to it only while its plain
 * copies are slow (copyToSlot in shm_data.c).
 *
 * Header only: the shared-memory transport stays self-contained. SSE2 is part of x86-64, so
 * no CPU dispatch is needed; elsewhere it is memcpy. */
#ifndef NCCLX_COPY_NT_H
#define NCCLX_COPY_NT_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

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

#endif
