/* The call a rank is running, as its messages sign it: written by the progress engine
 * (exec/xfer.c) into every message tag, kept in the communicator (xferSigKind,
 * xferSigBytes), and sent in wait notes (comm/waitnote.c). */
#ifndef NCCLX_CALL_SIG_H
#define NCCLX_CALL_SIG_H

#include <stddef.h>

#include "ncclx/module.h"
#include "ncclx/tuner.h"

/* Message signatures (net.h, "Signed tags"): every message carries the running call's kind
 * and its size per rank, so ranks that disagree on the call, its count or its datatype fail
 * where the data lands, naming both calls, instead of completing with the wrong data.
 * Same-size differences (int32 for float32, max for sum) are not seen: [core]
 * check_mismatch compares whole calls. */
enum {
  XFER_SIG_P2P = 0,         /* send/recv and the core's own exchanges: each transfer's size */
  XFER_SIG_COLL = 1,        /* + ncclxCollType_t */
  XFER_SIG_MODULE = 1 + NCCLX_NUM_COLLS, /* + a feature module's call kind (ncclx/module.h) */
  XFER_SIG_KINDS = 16
};
_Static_assert(XFER_SIG_MODULE + NCCLX_MODULE_CALL_KINDS <= XFER_SIG_KINDS, "signature kinds must fit 4 bits");
#define XFER_SIG_PER_TRANSFER ((size_t)-1)
/* A signature: the call's kind in bits 26-29, its bytes below (exact under 64 MiB, folded
 * above so that sizes 64 MiB apart still differ). */
#define XFER_SIG_BYTES_BITS 26
#define XFER_SIG_BYTES_MASK (((size_t)1 << XFER_SIG_BYTES_BITS) - 1)

#endif
