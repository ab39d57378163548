/* Transport selection and the process-wide shared-memory transport instance. */
#include "transport/transport.h"

#include <pthread.h>
#include <string.h>

#include "config/config.h"
#include "util/debug.h"
#include "transport/shm/net_shm.h"

/* The shared-memory transport is built in; like the network it is initialized once per
 * process and shared by every communicator. */
static pthread_mutex_t shmLock = PTHREAD_MUTEX_INITIALIZER;
static int shmRefs;
static void* shmCtx;

static ncclxResult_t shmAcquire(void** ctx) {
  ncclxResult_t res = ncclxSuccess;
  pthread_mutex_lock(&shmLock);
  if (shmRefs == 0) {
    ncclxPluginEnv_t env;
    ncclxPluginEnvFill(&env, "net.shm");
    res = ncclxNetShm.init(&shmCtx, &env);
  }
  if (res == ncclxSuccess) {
    shmRefs++;
    *ctx = shmCtx;
  }
  pthread_mutex_unlock(&shmLock);
  return res;
}

static void shmRelease(void) {
  pthread_mutex_lock(&shmLock);
  if (shmRefs > 0 && --shmRefs == 0) {
    ncclxNetShm.finalize(shmCtx);
    shmCtx = NULL;
  }
  pthread_mutex_unlock(&shmLock);
}

static ncclxResult_t maxMessage(struct ncclxTransport* tp, size_t* out) {
  ncclxNetProperties_t props;
  memset(&props, 0, sizeof(props));
  NCCLX_CHECK(tp->net->getProperties(tp->ctx, tp->dev, &props));
  size_t m = props.maxMessageBytes ? props.maxMessageBytes : (size_t)1 << 30;
  if (m < *out) *out = m;
  return ncclxSuccess;
}

ncclxResult_t transportsOpen(struct ncclxComm* comm) {
  ncclxNetInstance_t inst;
  NCCLX_CHECK(ncclxNetAcquire(&ncclxNetSocket, &inst));
  struct ncclxTransport* net = &comm->tp[NCCLX_TP_NET];
  net->net = inst.net;
  net->ctx = inst.ctx;
  long dev = 0;
  NCCLX_CHECK(ncclxConfigGetInt("net", "device", 0, 0, NCCLX_NET_DEVICE_MAX, &dev));
  if (dev >= inst.ndev)
    return ncclxSetError(ncclxInvalidUsage, "[net] device = %ld but network '%s' has %d device(s)",
                         dev, inst.net->name, inst.ndev);
  net->dev = (int)dev;
  comm->maxMessageBytes = (size_t)1 << 40;
  NCCLX_CHECK(maxMessage(net, &comm->maxMessageBytes));

  int useShm = 1;
  NCCLX_CHECK(ncclxConfigGetBool("core", "shm", 1, &useShm));
  if (useShm) {
    void* ctx = NULL;
    ncclxResult_t res = shmAcquire(&ctx);
    if (res != ncclxSuccess) {
      /* A broken shared-memory setup (no /dev/shm, say) costs speed, not correctness. */
      WARN("shared-memory transport unavailable (%s); same-host peers use the network '%s'",
           ncclxGetErrorString(res), inst.net->name);
    } else {
      struct ncclxTransport* shm = &comm->tp[NCCLX_TP_SHM];
      shm->net = &ncclxNetShm;
      shm->ctx = ctx;
      shm->dev = 0;
      NCCLX_CHECK(maxMessage(shm, &comm->maxMessageBytes));
    }
  }
  if (comm->chunkBytes > comm->maxMessageBytes) comm->chunkBytes = comm->maxMessageBytes;
  return ncclxSuccess;
}

void transportsClose(struct ncclxComm* comm) {
  if (comm->tp[NCCLX_TP_SHM].net) shmRelease();
  if (comm->tp[NCCLX_TP_NET].net) ncclxNetRelease();
  memset(comm->tp, 0, sizeof(comm->tp));
}

int transportFor(const struct ncclxComm* comm, int peer) {
  const struct ncclxPeerInfo *me = &comm->peerInfo[comm->rank], *p = &comm->peerInfo[peer];
  if (me->shmEnabled && p->shmEnabled && me->hostHash == p->hostHash &&
      strcmp(me->hostname, p->hostname) == 0)
    return NCCLX_TP_SHM;
  return NCCLX_TP_NET;
}
