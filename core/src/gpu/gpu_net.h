/* Device memory and the net ABI's pointer types: which transfers hand a device pointer
 * straight to a network plugin that reads device memory itself (ptrSupport has
 * NCCLX_PTR_CUDA, as GPUDirect RDMA plugins do), which are staged through pinned host
 * memory, and which must be refused.
 *
 * In every build (the decision and the refusals are the same; only a CUDA build stages or
 * passes device pointers). The decision is per transfer, from the transport that carries
 * traffic to its peer (transportFor: shared memory or the network). */
#ifndef NCCLX_GPU_NET_H
#define NCCLX_GPU_NET_H

#include <stddef.h>

#include "comm/comm.h"
#include "exec/xfer.h"

/* What happens to one transfer's buffer. */
typedef enum {
  GPU_NET_PASS = 0,   /* host (or managed) memory to a transport taking host memory: as is */
  GPU_NET_DIRECT = 1, /* device memory, plugin takes NCCLX_PTR_CUDA: the device pointer is
                       * registered with regMr(type NCCLX_PTR_CUDA) and passed as is */
  GPU_NET_STAGE = 2,  /* device memory otherwise (CUDA builds): through pinned host memory */
  GPU_NET_REFUSE = 3  /* host memory to a transport without NCCLX_PTR_HOST; device memory in
                       * a build without CUDA; staged memory for a transport without HOST */
} gpuNetPlan;

/* The decision, a pure function (unit-tested in tests/gpu/test_gpu_net.c).
 * memKind: gpuMemKind of the buffer (managed memory counts as host: the CPU can touch it);
 * ptrSupport: NCCLX_PTR_* bits of the peer's transport; toSelf: the transfer is a copy done
 * by the CPU; cpuTouches: the CPU reads or writes the buffer itself (receive-and-reduce);
 * cudaBuild: this library can stage. */
gpuNetPlan gpuNetDecide(int memKind, int ptrSupport, int toSelf, int cpuTouches, int cudaBuild);

/* NCCLX_PTR_* bits of the transport carrying comm's traffic to peer (NCCLX_PTR_HOST for
 * itself). Read from getProperties once per (plugin, context, device) and cached;
 * *forceFlush (may be NULL) gets the device's forceFlush. */
int gpuNetPtrSupport(struct ncclxComm* comm, int peer, int* forceFlush);

/* Whether every transport comm uses takes host memory (always true of the built-in ones):
 * then host buffers need no per-transfer check. Two cached lookups, no lock. */
int gpuNetTakesHost(struct ncclxComm* comm);
/* The same for every communicator xfers[0..n) use (their .comm, or comm). */
int gpuNetXfersTakeHost(struct ncclxComm* comm, const ncclxXfer* xfers, int n);
/* Collectives run on host memory (device buffers are staged): ncclxInvalidUsage, failing
 * the communicator, when a transport of comm takes only device memory. */
ncclxResult_t gpuNetCollCheck(struct ncclxComm* comm);

/* The plan of one gpuXferRun: per transfer a gpuNetPlan, and the registrations of the
 * direct ones. */
typedef xferReg gpuNetReg;

typedef struct {
  unsigned char* plan; /* n entries of gpuNetPlan */
  int nDirect, nStage;
  gpuNetReg* regs;     /* nDirect entries once registered */
  int nRegs;
  int active;          /* regs published to the progress engine on this thread */
} gpuNetXfers;

/* Classify xfers[0..n). A refused transfer fails the operation (and the communicator: the
 * peers abort) with ncclxInvalidUsage naming the buffer, its peer and the plugin. */
ncclxResult_t gpuNetPlanXfers(struct ncclxComm* comm, const ncclxXfer* xfers, int n, int cudaBuild,
                              gpuNetXfers* out);
/* Connect the direct transfers' peers, register their buffers (NCCLX_PTR_CUDA) and publish
 * the registrations to the progress engine (xferPublishRegs) until gpuNetRelease. */
ncclxResult_t gpuNetRegister(struct ncclxComm* comm, ncclxXfer* xfers, int n, gpuNetXfers* p);
/* After a successful xferRun: iflush every direct receive whose device asks for it
 * (forceFlush), bounded by the communicator's timeout and abort flag. */
ncclxResult_t gpuNetFlush(struct ncclxComm* comm, gpuNetXfers* p);
/* Unpublish and deregister (not after a failure: requests may still use the memory; the
 * failed communicator's connections release it when they close), free the plan. */
void gpuNetRelease(gpuNetXfers* p, int failed);


/* A failure inside an operation: fail the communicator so the peers abort instead of
 * waiting for this rank until their timeout (keeps the first cause). Returns res. */
ncclxResult_t gpuFailComm(struct ncclxComm* comm, ncclxResult_t res);

#endif /* NCCLX_GPU_NET_H */
