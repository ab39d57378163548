/* Barrier by dissemination: in round k every rank signals rank r+2^k and waits for rank
 * r-2^k. After ceil(log2 n) rounds each rank has transitively heard from all others, so
 * nobody leaves before everyone has arrived. One-byte messages (a zero-byte message is
 * legal too, but a byte keeps every transport on its ordinary path). */
#include "coll/coll.h"
#include "util/debug.h"
#include "exec/xfer.h"

ncclxResult_t barrierDissemination(struct ncclxComm* comm, const ncclxCollArgs* a) {
  (void)a;
  int n = comm->nranks, r = comm->rank;
  for (int k = 1; k < n; k <<= 1) {
    unsigned char out = 1, in = 0;
    NCCLX_CHECK(xferSendRecv(comm, (r + k) % n, &out, 1, (r - k + n) % n, &in, 1));
  }
  return ncclxSuccess;
}
