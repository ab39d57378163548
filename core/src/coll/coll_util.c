/* Small helpers shared by the collective algorithms (declared in coll.h). */
#include <stdint.h>

#include "coll/coll.h"
#include "util/debug.h"
#include "util/reduce.h"
#include "exec/xfer.h"

ncclxResult_t collSendRecv(struct ncclxComm* comm, int sendPeer, const void* sendBuf, size_t sendBytes,
                           int recvPeer, void* recvBuf, size_t recvBytes) {
  if (sendBytes == 0) sendPeer = -1;
  if (recvBytes == 0) recvPeer = -1;
  if (sendPeer < 0 && recvPeer < 0) return ncclxSuccess;
  return xferSendRecv(comm, sendPeer, sendBuf, sendBytes, recvPeer, recvBuf, recvBytes);
}

int collRangesOverlap(const void* a, size_t alen, const void* b, size_t blen) {
  uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;
  return alen && blen && x < y + blen && y < x + alen;
}

int collRootCopyAlongside(const struct ncclxComm* comm, const void* send, const void* recv,
                          size_t bytes) {
  return send != recv && !collRangesOverlap(send, bytes, recv, bytes) && commRanksOwnCpus(comm);
}

size_t collPieceBytes(const struct ncclxComm* comm) {
  return comm->chunkBytes ? comm->chunkBytes : (size_t)1 << 20;
}

size_t collPieceElems(const struct ncclxComm* comm, size_t typeSize) {
  size_t n = collPieceBytes(comm) / typeSize;
  return n ? n : 1;
}

ncclxResult_t collScratch(struct ncclxComm* comm, const char* what, size_t bytes, char** out) {
  *out = commScratch(comm, bytes ? bytes : 1);
  if (*out) return ncclxSuccess;
  return commFail(comm, ncclxSystemError, "%s: cannot allocate %zu bytes of scratch", what, bytes);
}

size_t collLinearWindowElems(const struct ncclxComm* comm, size_t typeSize, size_t count) {
  size_t win = collPieceElems(comm, typeSize) / (size_t)comm->nranks;
  if (win > count) win = count;
  return win ? win : 1;
}

ncclxResult_t collLinearReduceWindow(struct ncclxComm* comm, ncclxXfer* xfers, const char* src,
                                     size_t stride, char* scratch, char* dst, size_t len,
                                     const ncclxCollArgs* a) {
  size_t bytes = len * ncclxTypeSize(a->datatype);
  NCCLX_CHECK(alltoallLinearWindow(comm, xfers, src, stride, scratch, bytes, bytes));
  ncclxReduce2(dst, scratch, scratch + bytes, len, a->datatype, a->op);
  for (int s = 2; s < comm->nranks; s++)
    ncclxReduce2(dst, dst, scratch + (size_t)s * bytes, len, a->datatype, a->op);
  return ncclxSuccess;
}
