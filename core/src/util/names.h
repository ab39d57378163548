/* Sizes of the public data types, for every layer (their names: util/names.c). */
#ifndef NCCLX_UTIL_NAMES_H
#define NCCLX_UTIL_NAMES_H

#include <stddef.h>

#include "ncclx.h"

/* ncclxTypeSize (0 for an invalid type) without the PLT call that a public symbol costs
 * inside the library: a small call asked for it four times. */
static inline size_t dataTypeSize(ncclxDataType_t t) {
  switch (t) {
    case ncclxInt8: case ncclxUint8: return 1;
    case ncclxFloat16: case ncclxBfloat16: return 2;
    case ncclxInt32: case ncclxUint32: case ncclxFloat32: return 4;
    case ncclxInt64: case ncclxUint64: case ncclxFloat64: return 8;
    default: return 0;
  }
}

#endif
