/* Element-wise reductions for every datatype and op. fp16 and bf16 are computed in fp32
 * and rounded to nearest even. Integer arithmetic wraps (computed unsigned: no UB). */
#ifndef NCCLX_REDUCE_H
#define NCCLX_REDUCE_H

#include <stddef.h>

#include "ncclx.h"

/* dst[i] = dst[i] op src[i] for count elements. Avg accumulates as Sum. */
void ncclxReduceInPlace(void* dst, const void* src, size_t count, ncclxDataType_t type,
                        ncclxRedOp_t op);
/* dst[i] = a[i] op b[i]; dst may alias a or b. */
void ncclxReduce2(void* dst, const void* a, const void* b, size_t count, ncclxDataType_t type,
                  ncclxRedOp_t op);
/* Finish an Avg: dst[i] /= n (integer types: truncating division; floats: multiply by 1/n
 * in fp32/fp64). */
void ncclxAvgFinish(void* dst, size_t count, ncclxDataType_t type, int n);

/* fp16 / bf16 conversions, shared with tests. */
float ncclxHalfToFloat(uint16_t h);
uint16_t ncclxFloatToHalf(float f);
float ncclxBf16ToFloat(uint16_t b);
uint16_t ncclxFloatToBf16(float f);
#endif
