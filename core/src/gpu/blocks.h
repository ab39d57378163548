/* Index arithmetic of the block-copy kernel (pack_kernels.cu), as __host__ __device__
 * functions so the CPU tests run the very same code (tests/gpu/test_gpu_blocks.c): where a
 * block starts, how much of it fits, and how a copy splits into a byte head, aligned words
 * and a byte tail. */
#ifndef NCCLX_BLOCKS_H
#define NCCLX_BLOCKS_H

#include <stddef.h>
#include <stdint.h>

#include "gpu/cuda_kernels.h"
#include "util/devmath.h" /* DEVM_FN */

/* Element offset of block b; prefix is the sum of counts[0..b) (used by PACKED only). */
DEVM_FN size_t blocksStart(const ncclxBlockLayout* l, int b, size_t prefix) {
  switch (l->kind) {
    case NCCLX_BLOCKS_DISPLS: return l->displs[b];
    case NCCLX_BLOCKS_PACKED: return prefix;
    default: return (size_t)b * l->stride;
  }
}

/* Elements a block starting at `start` may hold without leaving the buffer or its slot. */
DEVM_FN size_t blocksRoom(const ncclxBlockLayout* l, size_t start) {
  size_t room = start < l->capacity ? l->capacity - start : 0;
  if (l->kind == NCCLX_BLOCKS_STRIDED && l->stride < room) room = l->stride;
  return room;
}

/* count clipped to both rooms; *flags gets the NCCLX_BLOCKS_*_OVERFLOW bits. */
DEVM_FN size_t blocksClip(size_t count, size_t dstRoom, size_t srcRoom, unsigned int* flags) {
  *flags = 0;
  if (count > dstRoom) count = dstRoom, *flags |= NCCLX_BLOCKS_DST_OVERFLOW;
  if (count > srcRoom) count = srcRoom, *flags |= NCCLX_BLOCKS_SRC_OVERFLOW;
  return count;
}

/* Widest word (16, 8, 4 or 1 bytes) both addresses can use after a common byte head: they
 * must agree modulo the word size. */
DEVM_FN size_t blocksWordSize(uintptr_t dst, uintptr_t src) {
  uintptr_t skew = dst ^ src;
  return (skew & 15) == 0 ? 16 : (skew & 7) == 0 ? 8 : (skew & 3) == 0 ? 4 : 1;
}

/* Split a copy of `bytes` to dst into head bytes (until dst is word-aligned), whole words,
 * and the remaining tail bytes (from *tailStart). */
DEVM_FN void blocksSplit(uintptr_t dst, size_t bytes, size_t word, size_t* head, size_t* words,
                         size_t* tailStart) {
  size_t h = (word - (dst & (word - 1))) & (word - 1);
  if (h > bytes) h = bytes;
  *head = h;
  *words = (bytes - h) / word;
  *tailStart = h + *words * word;
}

#endif /* NCCLX_BLOCKS_H */
