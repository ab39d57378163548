/* The shared-memory transport's plugin table, configuration, device and properties.
 * The protocol is described in net_shm.h; connections live in shm_conn.c, the data path in
 * shm_data.c and the operating-system helpers in shm_os.c. */
#include "transport/shm/net_shm.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "transport/shm/shm_internal.h"
#include "ncclx/config_value.h"

#ifdef NCCLX_NET_SHM_STANDALONE
#define SHM_PLUGIN_SYMBOL ncclxNetPlugin_v1
#define SHM_EXPORT __attribute__((visibility("default")))
#else
#define SHM_PLUGIN_SYMBOL ncclxNetShm
#define SHM_EXPORT
#endif

static const char* const shmKnownKeys[] = {"buffer_bytes", "slots", "single_copy", "cma_chunk_bytes",
                                           "nontemporal"};

static void warnUnknownKeys(const ncclxPluginEnv_t* env) {
  if (!env->config->entry) return;
  for (int i = 0;; i++) {
    const char *k = NULL, *v = NULL, *w = NULL;
    if (!env->config->entry(env->section, i, &k, &v, &w)) break;
    if (!k) continue;
    int known = 0;
    for (size_t j = 0; j < sizeof(shmKnownKeys) / sizeof(shmKnownKeys[0]); j++)
      known |= strcasecmp(k, shmKnownKeys[j]) == 0;
    if (!known)
      env->log(NCCLX_LOG_WARN, NCCLX_LOG_SHM | NCCLX_LOG_ENV, __FILE__, __LINE__,
               "NET/SHM: ignoring unknown key '%s' (%s); known keys: buffer_bytes, slots, "
               "single_copy, cma_chunk_bytes, nontemporal",
               k, w ? w : "?");
  }
}

/* Where a key's value came from, for error messages. */
static const char* configWhere(const ncclxPluginEnv_t* env, const char* key) {
  for (int i = 0; env->config->entry; i++) {
    const char *k = NULL, *v = NULL, *w = NULL;
    if (!env->config->entry(env->section, i, &k, &v, &w)) break;
    if (k && strcasecmp(k, key) == 0 && w) return w;
  }
  return "environment";
}

static ncclxResult_t badKey(const ncclxPluginEnv_t* env, const char* key, const char* value,
                            const char* expected) {
  env->log(NCCLX_LOG_WARN, NCCLX_LOG_SHM | NCCLX_LOG_ENV, __FILE__, __LINE__,
           "NET/SHM: %s = '%s' (%s): expected %s", key, value, configWhere(env, key), expected);
  return ncclxInvalidUsage;
}

/* Values of single_copy (SHM_PREF_* order) and nontemporal (NCCLX_NT_* order, copy_nt.h). */
static const char* const copyModes[] = {"auto", "cma", "none"};
static const char* const ntModes[] = {"auto", "always", "never"};

/* Index of v among names (any case), or -1. */
static int choiceIndex(const char* v, const char* const* names, int n) {
  for (int i = 0; i < n; i++)
    if (strcasecmp(v, names[i]) == 0) return i;
  return -1;
}

static ncclxResult_t readConfig(const ncclxPluginEnv_t* env, shmCtx* ctx) {
  const ncclxConfigApi_t* cfg = env->config;
  const char* v;
  ctx->bufferBytes = SHM_DEFAULT_BUFFER_BYTES;
  ctx->nslots = SHM_DEFAULT_SLOTS;
  ctx->pref = SHM_PREF_AUTO;
  ctx->cmaChunk = SHM_DEFAULT_CMA_CHUNK;
  if ((v = cfg->get(env->section, "buffer_bytes")) != NULL &&
      (ncclxParseSize(v, &ctx->bufferBytes) || ctx->bufferBytes < ((size_t)64 << 10) ||
       ctx->bufferBytes > ((size_t)1 << 30)))
    return badKey(env, "buffer_bytes", v, "a size from 64K to 1G, e.g. 1M");
  size_t slots = 0;
  if ((v = cfg->get(env->section, "slots")) != NULL) {
    if (ncclxParseSize(v, &slots) || slots < 4 || slots > 4096 || (slots & (slots - 1)))
      return badKey(env, "slots", v, "a power of two from 4 to 4096");
    ctx->nslots = (uint32_t)slots;
  }
  if (ctx->bufferBytes / ctx->nslots < SHM_MIN_SLOT_PAYLOAD) {
    env->log(NCCLX_LOG_WARN, NCCLX_LOG_SHM | NCCLX_LOG_ENV, __FILE__, __LINE__,
             "NET/SHM: buffer_bytes %zu split into %u slots leaves %zu bytes per slot; "
             "at least %zu are needed (raise buffer_bytes or lower slots)",
             ctx->bufferBytes, ctx->nslots, ctx->bufferBytes / ctx->nslots, SHM_MIN_SLOT_PAYLOAD);
    return ncclxInvalidUsage;
  }
  if ((v = cfg->get(env->section, "single_copy")) != NULL &&
      (ctx->pref = choiceIndex(v, copyModes, 3)) < 0)
    return badKey(env, "single_copy", v, "auto, cma or none");
  ctx->nontemporal = NCCLX_NT_AUTO;
  if ((v = cfg->get(env->section, "nontemporal")) != NULL &&
      (ctx->nontemporal = choiceIndex(v, ntModes, 3)) < 0)
    return badKey(env, "nontemporal", v, "auto, always or never");
  if ((v = cfg->get(env->section, "cma_chunk_bytes")) != NULL &&
      (ncclxParseSize(v, &ctx->cmaChunk) || ctx->cmaChunk < 4096 || ctx->cmaChunk > ((size_t)1 << 30)))
    return badKey(env, "cma_chunk_bytes", v, "a size from 4K to 1G, e.g. 1M");
  return ncclxSuccess;
}

/* Reading our own memory fails only when the kernel lacks CMA (ENOSYS) or a seccomp
 * profile forbids it; ptrace rules between processes are probed per connection. */
static int cmaSelfTest(void) {
  static const char probe[] = "ncclx-shm";
  char got[sizeof(probe)];
  ssize_t n = shmCmaRead(getpid(), got, (uint64_t)(uintptr_t)probe, sizeof(probe));
  if (n < 0) return (int)-n;
  return (n == (ssize_t)sizeof(probe) && memcmp(got, probe, sizeof(probe)) == 0) ? 0 : EIO;
}

static ncclxResult_t shmInit(void** ctxOut, const ncclxPluginEnv_t* env) {
  if (!ctxOut || !env || !env->log || !env->config || !env->config->get) return ncclxInternalError;
  *ctxOut = NULL;
  warnUnknownKeys(env);
  shmCtx* ctx = calloc(1, sizeof(*ctx));
  if (!ctx) return ncclxSystemError;
  ctx->log = env->log;
  ncclxResult_t res = readConfig(env, ctx);
  if (res != ncclxSuccess) {
    free(ctx);
    return res;
  }
  ctx->cmaLocalErr = cmaSelfTest();
  if (ctx->cmaLocalErr && ctx->pref == SHM_PREF_CMA) {
    SHM_WARN(ctx,
             "single_copy = cma but process_vm_readv does not work here (%s); set "
             "single_copy = auto or none",
             strerror(ctx->cmaLocalErr));
    free(ctx);
    return ncclxInvalidUsage;
  }
  if (ctx->cmaLocalErr) ctx->pref = SHM_PREF_NONE; /* no need to probe every connection */
  shmCleanStale(ctx);
  size_t payload = (ctx->bufferBytes / ctx->nslots) & ~(size_t)(SHM_LINE - 1);
  SHM_INFO(ctx,
           "%u slots of %zu bytes per connection (%zu bytes of shared memory each), "
           "single_copy = %s%s%s, nontemporal = %s",
           ctx->nslots, payload, shmConnBytes(ctx->nslots, payload), copyModes[ctx->pref],
           ctx->cmaLocalErr ? ": process_vm_readv unavailable: " : "",
           ctx->cmaLocalErr ? strerror(ctx->cmaLocalErr) : "", ntModes[ctx->nontemporal]);
  *ctxOut = ctx;
  return ncclxSuccess;
}

static ncclxResult_t shmDevices(void* ctx, int* ndev) {
  if (!ctx || !ndev) return ncclxInternalError;
  *ndev = 1;
  return ncclxSuccess;
}

static ncclxResult_t shmGetProperties(void* vctx, int dev, ncclxNetProperties_v1_t* props) {
  shmCtx* ctx = vctx;
  if (!ctx || !props) return ncclxInternalError;
  if (dev != 0) {
    SHM_WARN(ctx, "getProperties: device %d does not exist (1 device)", dev);
    return ncclxInternalError;
  }
  memset(props, 0, sizeof(*props));
  props->name = "shm";
  props->pciPath = NULL;
  props->guid = 0x6e63636c78736d68ull; /* one "port": the host's memory */
  props->ptrSupport = NCCLX_PTR_HOST;
  props->regIsGlobal = 1;
  props->speedMbps = 80000; /* ~10 GB/s, a memcpy of DRAM-resident data */
  props->port = 1;
  props->latencyUs = 0.3f;
  props->maxComms = 65536;
  props->maxRecvs = 1;
  props->maxMessageBytes = SHM_MAX_MESSAGE;
  props->forceFlush = 0;
  return ncclxSuccess;
}

static ncclxResult_t shmFinalize(void* ctx) {
  if (!ctx) return ncclxInternalError;
  free(ctx);
  return ncclxSuccess;
}

static char shmMrToken; /* host memory needs no registration: every handle is this one */

static ncclxResult_t shmRegMr(void* comm, void* data, size_t size, int type, void** mhandle) {
  uint32_t kind = comm ? *(const uint32_t*)comm : 0;
  if (!mhandle || (kind != SHM_KIND_SEND && kind != SHM_KIND_RECV)) return ncclxInternalError;
  *mhandle = NULL;
  if (type != NCCLX_PTR_HOST) {
    SHM_WARN(((shmComm*)comm)->ctx,
             "regMr: pointer type %d of %p (%zu bytes) is not "
             "supported: shared memory moves host memory only",
             type, data, size);
    return ncclxInvalidArgument;
  }
  *mhandle = &shmMrToken;
  return ncclxSuccess;
}

static ncclxResult_t shmDeregMr(void* comm, void* mhandle) {
  uint32_t kind = comm ? *(const uint32_t*)comm : 0;
  if (kind != SHM_KIND_SEND && kind != SHM_KIND_RECV) return ncclxInternalError;
  return (mhandle == NULL || mhandle == &shmMrToken) ? ncclxSuccess : ncclxInternalError;
}

/* comm as a send or receive comm, a sender's attach state brought up to date; NULL when it
 * is neither. For the test hooks below. */
static shmComm* hookComm(void* comm) {
  uint32_t kind = comm ? *(const uint32_t*)comm : 0;
  if (kind != SHM_KIND_SEND && kind != SHM_KIND_RECV) return NULL;
  shmComm* c = comm;
  if (kind == SHM_KIND_SEND && !c->attached) shmCheckAttached(c);
  return c;
}

int ncclxShmCommMode(void* comm) {
  shmComm* c = hookComm(comm);
  return c ? c->mode : -1;
}

int ncclxShmCommMapped(void* comm) {
  shmComm* c = hookComm(comm);
  return c ? c->mapOk : -1;
}

long long ncclxShmCommMappedMessages(void* comm) {
  shmComm* c = hookComm(comm);
  return c ? (long long)c->mappedMessages : -1;
}

void ncclxShmSendKind(void* sendComm, int kind) {
  shmComm* c = sendComm;
  if (c && c->kind == SHM_KIND_SEND) c->nextSendKind = kind;
}

void ncclxShmSharedCpus(void* sendComm, int shared) {
  shmComm* c = sendComm;
  if (!c || c->kind != SHM_KIND_SEND) return;
  c->sharedCpus = shared != 0;
}

void ncclxShmPreferCopy(void* sendComm, int prefer) {
  shmComm* c = sendComm;
  if (!c || c->kind != SHM_KIND_SEND) return;
  c->coreSingleCopy = prefer == 0;
  if (c->ctx->pref != SHM_PREF_AUTO) return;
  c->preferCopy = prefer != 0;
  if (atomic_exchange(&c->ctx->loggedPrefer, 1 + c->preferCopy) != 1 + c->preferCopy)
    SHM_INFO(c->ctx, "single_copy = auto: large messages by %s (the core's choice for this host's ranks and CPUs)",
             c->preferCopy ? "double copy through the slots" : "single copy (CMA) where it works");
}

SHM_EXPORT const ncclxNet_v1_t SHM_PLUGIN_SYMBOL = {
    .name = "shm",
    .abiVersion = NCCLX_NET_ABI_VERSION,
    .init = shmInit,
    .devices = shmDevices,
    .getProperties = shmGetProperties,
    .listen = shmListen,
    .connect = shmConnect,
    .accept = shmAccept,
    .regMr = shmRegMr,
    .deregMr = shmDeregMr,
    .isend = shmIsend,
    .irecv = shmIrecv,
    .iflush = NULL,
    .test = shmTest,
    .closeSend = shmCloseSend,
    .closeRecv = shmCloseRecv,
    .closeListen = shmCloseListen,
    .finalize = shmFinalize,
    .getPollFd = shmGetPollFd,
};
