/* The block-copy kernel's index arithmetic (blocks.h, the code pack_kernels.cu runs) on the
 * CPU: the kernel is emulated thread by thread with the same helpers, over random layouts
 * (displacement arrays, packed, fixed slots), element sizes, buffer misalignments, empty
 * blocks and buffers too small for their counts. Checked: the result equals a plain
 * per-block memcpy with clipping, every destination byte is written exactly once, word
 * accesses are aligned for both sides, nothing is written outside the blocks, and the
 * overflow status and output displacements are right. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpu/blocks.h"

static int failures;
#define CHECK(cond, ...)                                                          \
  do {                                                                            \
    if (!(cond)) {                                                                \
      if (failures++ < 20) {                                                      \
        fprintf(stderr, "%s:%d: CHECK(%s) failed: ", __FILE__, __LINE__, #cond);  \
        fprintf(stderr, __VA_ARGS__);                                             \
        fprintf(stderr, "\n");                                                    \
      }                                                                           \
    }                                                                             \
  } while (0)

static uint64_t rngState = 0x9e3779b97f4a7c15ull;
static uint64_t rnd(void) {
  rngState ^= rngState >> 12;
  rngState ^= rngState << 25;
  rngState ^= rngState >> 27;
  return rngState * 2685821657736338717ull;
}

enum { MAXB = 12, THREADS = 37 /* grid threads of the emulation: odd on purpose */ };

/* The kernel, one emulated thread at a time; writes[] counts writes per destination byte. */
static void emulate(unsigned char* dst, const ncclxBlockLayout* dl, const unsigned char* src,
                    const ncclxBlockLayout* sl, const size_t* counts, int nb, size_t es,
                    size_t* outDispls, unsigned int* status, unsigned char* writes) {
  size_t prefix = 0;
  for (int b = 0; b < nb; b++) {
    size_t ds = blocksStart(dl, b, prefix), ss = blocksStart(sl, b, prefix);
    unsigned int flags;
    size_t n = blocksClip(counts[b], blocksRoom(dl, ds), blocksRoom(sl, ss), &flags);
    outDispls[b] = ds;
    *status |= flags;
    prefix += counts[b];
    if (!n) continue;
    unsigned char* d = dst + ds * es;
    const unsigned char* s = src + ss * es;
    size_t bytes = n * es, word = blocksWordSize((uintptr_t)d, (uintptr_t)s);
    size_t head, words, tail;
    blocksSplit((uintptr_t)d, bytes, word, &head, &words, &tail);
    CHECK(head < word && head + words * word == tail && tail <= bytes && bytes - tail < word + word,
          "split of %zu bytes: head %zu words %zu tail %zu (word %zu)", bytes, head, words, tail, word);
    CHECK(words == 0 || (((uintptr_t)(d + head) | (uintptr_t)(s + head)) & (word - 1)) == 0,
          "misaligned %zu-byte words", word);
    for (size_t tid = 0; tid < THREADS; tid++) {
      for (size_t i = tid; i < words; i += THREADS) {
        memcpy(d + head + i * word, s + head + i * word, word);
        for (size_t k = 0; k < word; k++) writes[(d - dst) + head + i * word + k]++;
      }
      for (size_t i = tid; i < head; i += THREADS) d[i] = s[i], writes[(d - dst) + i]++;
      for (size_t i = tail + tid; i < bytes; i += THREADS) d[i] = s[i], writes[(d - dst) + i]++;
    }
  }
}

static ncclxBlockLayout randomLayout(int nb, const size_t* counts, size_t* displs, size_t* bufElems) {
  ncclxBlockLayout l = {.kind = (ncclxBlockLayoutKind)(rnd() % 3)};
  size_t need = 0;
  if (l.kind == NCCLX_BLOCKS_DISPLS) {
    for (int b = nb - 1; b >= 0; b--) displs[b] = need + rnd() % 5, need = displs[b] + counts[b];
    l.displs = displs;
  } else if (l.kind == NCCLX_BLOCKS_PACKED) {
    for (int b = 0; b < nb; b++) need += counts[b];
  } else {
    l.stride = 1 + rnd() % 40;
    need = (size_t)nb * l.stride;
  }
  /* Usually big enough; sometimes too small, to exercise clipping. */
  l.capacity = rnd() % 4 ? need : need / 2;
  *bufElems = need > l.capacity ? need : l.capacity;
  return l;
}

int main(void) {
  for (int iter = 0; iter < 3000; iter++) {
    int nb = (int)(rnd() % MAXB);
    size_t es = (size_t[]){1, 2, 4, 8, 12, 16, 3}[rnd() % 7];
    size_t counts[MAXB], sd[MAXB], dd[MAXB], out[MAXB];
    for (int b = 0; b < nb; b++) counts[b] = rnd() % 3 == 0 ? 0 : rnd() % 50;
    size_t srcElems, dstElems;
    ncclxBlockLayout sl = randomLayout(nb, counts, sd, &srcElems);
    ncclxBlockLayout dl = randomLayout(nb, counts, dd, &dstElems);
    size_t srcOff = rnd() % 16, dstOff = rnd() % 16; /* misaligned bases */
    unsigned char* srcBuf = malloc(srcElems * es + 32);
    unsigned char* dstBuf = malloc(dstElems * es + 32);
    unsigned char* want = malloc(dstElems * es + 32);
    unsigned char* writes = calloc(dstElems * es + 32, 1);
    for (size_t i = 0; i < srcElems * es + 32; i++) srcBuf[i] = (unsigned char)rnd();
    memset(dstBuf, 0xee, dstElems * es + 32);
    memcpy(want, dstBuf, dstElems * es + 32);
    unsigned char* src = srcBuf + srcOff;
    unsigned char* dst = dstBuf + dstOff;

    /* Reference: a plain copy per block, clipped to the buffers and slots. */
    unsigned int wantStatus = 0;
    size_t prefix = 0;
    for (int b = 0; b < nb; b++) {
      size_t ds = dl.kind == NCCLX_BLOCKS_DISPLS ? dd[b] : dl.kind == NCCLX_BLOCKS_PACKED ? prefix : b * dl.stride;
      size_t ss = sl.kind == NCCLX_BLOCKS_DISPLS ? sd[b] : sl.kind == NCCLX_BLOCKS_PACKED ? prefix : b * sl.stride;
      size_t dmax = ds >= dl.capacity ? 0 : dl.capacity - ds, smax = ss >= sl.capacity ? 0 : sl.capacity - ss;
      if (dl.kind == NCCLX_BLOCKS_STRIDED && dmax > dl.stride) dmax = dl.stride;
      if (sl.kind == NCCLX_BLOCKS_STRIDED && smax > sl.stride) smax = sl.stride;
      size_t n = counts[b];
      if (n > dmax) n = dmax, wantStatus |= NCCLX_BLOCKS_DST_OVERFLOW;
      if (n > smax) n = smax, wantStatus |= NCCLX_BLOCKS_SRC_OVERFLOW;
      memcpy(want + dstOff + ds * es, src + ss * es, n * es);
      CHECK(n == 0 || (ds + n <= dl.capacity && ss + n <= sl.capacity), "reference overran");
      prefix += counts[b];
    }

    unsigned int status = 0;
    emulate(dst, &dl, src, &sl, counts, nb, es, out, &status, writes + dstOff);
    CHECK(memcmp(dstBuf, want, dstElems * es + 32) == 0, "iteration %d: result differs (kinds %d->%d, es %zu)",
          iter, (int)sl.kind, (int)dl.kind, es);
    CHECK(status == wantStatus, "iteration %d: status %u, want %u", iter, status, wantStatus);
    for (size_t i = 0; i < dstElems * es + 32; i++)
      if (writes[i] > 1) {
        CHECK(0, "iteration %d: byte %zu written %d times", iter, i, writes[i]);
        break;
      }
    prefix = 0;
    for (int b = 0; b < nb; b++) {
      size_t ds = dl.kind == NCCLX_BLOCKS_DISPLS ? dd[b] : dl.kind == NCCLX_BLOCKS_PACKED ? prefix : b * dl.stride;
      CHECK(out[b] == ds, "iteration %d: outDispls[%d] = %zu, want %zu", iter, b, out[b], ds);
      prefix += counts[b];
    }
    free(srcBuf), free(dstBuf), free(want), free(writes);
  }
  /* The split itself at every small size and alignment. */
  for (uintptr_t base = 0; base < 32; base++)
    for (size_t bytes = 0; bytes < 70; bytes++)
      for (size_t word = 1; word <= 16; word *= 2) {
        size_t head, words, tail;
        blocksSplit(base, bytes, word, &head, &words, &tail);
        CHECK(head <= bytes && tail == head + words * word && tail <= bytes && bytes - tail < word &&
                  (words == 0 || (base + head) % word == 0) && (head == bytes || (base + head) % word == 0),
              "split base %lu bytes %zu word %zu: %zu %zu %zu", (unsigned long)base, bytes, word, head, words, tail);
      }
  CHECK(blocksWordSize(0x1000, 0x2000) == 16 && blocksWordSize(0x1008, 0x2000) == 8 &&
            blocksWordSize(0x1004, 0x2000) == 4 && blocksWordSize(0x1001, 0x2000) == 1 &&
            blocksWordSize(0x1003, 0x2003) == 16, "word sizes");
  if (failures) return fprintf(stderr, "test_gpu_blocks: %d failure(s)\n", failures), 1;
  printf("test_gpu_blocks: block-copy index arithmetic verified on the CPU\n");
  return 0;
}
