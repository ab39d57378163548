/* The exported plugin table and its process-wide part: configuration ([net.ofi]), provider
 * discovery with fi_getinfo, devices and their properties, finalize. */
#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "ofi_internal.h"
#include "ncclx/config_value.h"

#define OFI_DEFAULT_PROVIDER "tcp"
#define OFI_DEFAULT_LIVENESS_MS 1000
#define OFI_MAX_DEVICES 16
#define OFI_DEFAULT_ENDPOINTS 1

#define OFI_DEFAULT_RXM_EAGER ((size_t)64 << 10)
static const char* const ofiKnownKeys[] = {"provider",      "domain",          "liveness_ms",
                                           "liveness",      "mr_local",        "poll_fd",
                                           "clear_to_send", "rxm_eager_limit", "endpoints",
                                           "endpoint_type"};
#define OFI_KNOWN_KEYS                                                                    \
  "provider, domain, liveness_ms, liveness, mr_local, poll_fd, clear_to_send, rxm_eager_limit, " \
  "endpoints, endpoint_type"

/* ------------------------------------------------------------------------------------------
 * Configuration
 * ------------------------------------------------------------------------------------------ */

/* Where a key's value came from ("file:line" or "env NAME"), for error messages. */
static const char* configWhere(const ncclxPluginEnv_t* env, const char* key) {
  for (int i = 0; env->config->entry; i++) {
    const char *k = NULL, *v = NULL, *w = NULL;
    if (!env->config->entry(env->section, i, &k, &v, &w)) break;
    if (k && strcasecmp(k, key) == 0 && w) return w;
  }
  return "environment";
}

static void warnUnknownKeys(const ncclxPluginEnv_t* env) {
  for (int i = 0; env->config->entry; i++) {
    const char *k = NULL, *v = NULL, *w = NULL;
    if (!env->config->entry(env->section, i, &k, &v, &w)) break;
    if (!k) continue;
    int known = 0;
    for (size_t j = 0; j < sizeof(ofiKnownKeys) / sizeof(ofiKnownKeys[0]); j++)
      known |= strcasecmp(k, ofiKnownKeys[j]) == 0;
    if (!known)
      env->log(NCCLX_LOG_WARN, NCCLX_LOG_NET | NCCLX_LOG_ENV, __FILE__, __LINE__,
               "NET/OFI: ignoring unknown key '%s' (%s); known keys: " OFI_KNOWN_KEYS, k,
               w ? w : "?");
  }
}

static const char* configGet(const ncclxPluginEnv_t* env, const char* key) {
  const char* v = env->config->get(env->section, key);
  return v && *v ? v : NULL; /* "key =" means the default */
}

static ncclxResult_t badValue(const ncclxPluginEnv_t* env, const char* key, const char* value,
                              const char* expected) {
  env->log(NCCLX_LOG_WARN, NCCLX_LOG_NET | NCCLX_LOG_ENV, __FILE__, __LINE__,
           "NET/OFI: %s = '%s' (%s): expected %s", key, value, configWhere(env, key), expected);
  return ncclxInvalidUsage;
}

static int parseBool(const char* s, int* out) {
  static const char* const yes[] = {"1", "true", "yes", "on"};
  static const char* const no[] = {"0", "false", "no", "off"};
  for (int i = 0; i < 4; i++) {
    if (strcasecmp(s, yes[i]) == 0) return *out = 1, 0;
    if (strcasecmp(s, no[i]) == 0) return *out = 0, 0;
  }
  return -1;
}

static ncclxResult_t readConfig(const ncclxPluginEnv_t* env, ofiCtx* ctx, const char** domain) {
  warnUnknownKeys(env);
  const char* v = configGet(env, "provider");
  if (v && (strlen(v) >= sizeof(ctx->provider) || strpbrk(v, " \t,")))
    return badValue(env, "provider", v,
                    "one libfabric provider name such as tcp;ofi_rxm, shm, "
                    "verbs or efa (no blanks or commas)");
  snprintf(ctx->provider, sizeof(ctx->provider), "%s", v ? v : OFI_DEFAULT_PROVIDER);

  *domain = configGet(env, "domain");

  ctx->livenessMs = OFI_DEFAULT_LIVENESS_MS;
  if ((v = configGet(env, "liveness_ms"))) {
    char* end = NULL;
    errno = 0;
    long ms = strtol(v, &end, 10);
    if (errno || end == v || *end || ms < 0 || ms > 3600000)
      return badValue(env, "liveness_ms", v, "0 (never check peers) or milliseconds up to 3600000");
    ctx->livenessMs = (int)ms;
  }

  ctx->probeOnly = 0;
  if ((v = configGet(env, "liveness"))) {
    if (strcasecmp(v, "probe") == 0)
      ctx->probeOnly = 1;
    else if (strcasecmp(v, "auto") != 0)
      return badValue(env, "liveness", v, "auto or probe");
  }

  ctx->mrForce = 0;
  if ((v = configGet(env, "mr_local"))) {
    if (strcasecmp(v, "always") == 0)
      ctx->mrForce = 1;
    else if (strcasecmp(v, "auto") != 0)
      return badValue(env, "mr_local", v, "auto or always");
  }

  ctx->clearToSend = -1;
  if ((v = configGet(env, "clear_to_send")) && strcasecmp(v, "auto") != 0 &&
      parseBool(v, &ctx->clearToSend) != 0)
    return badValue(env, "clear_to_send", v, "auto, true or false");

  ctx->pollFd = -1;
  if ((v = configGet(env, "poll_fd")) && strcasecmp(v, "auto") != 0 && parseBool(v, &ctx->pollFd) != 0)
    return badValue(env, "poll_fd", v, "auto, true or false");

  ctx->endpoints = OFI_DEFAULT_ENDPOINTS;
  if ((v = configGet(env, "endpoints"))) {
    char* end = NULL;
    errno = 0;
    long n = strtol(v, &end, 10);
    if (errno || end == v || *end || n < 1 || n > OFI_MAX_EPS)
      return badValue(env, "endpoints", v, "1 to 8 endpoints per device");
    ctx->endpoints = (int)n;
  }

  ctx->epType = OFI_EP_AUTO;
  if ((v = configGet(env, "endpoint_type"))) {
    if (strcasecmp(v, "msg") == 0)
      ctx->epType = OFI_EP_MSG;
    else if (strcasecmp(v, "rdm") == 0)
      ctx->epType = OFI_EP_RDM;
    else if (strcasecmp(v, "auto") != 0)
      return badValue(env, "endpoint_type", v, "auto, msg (connected endpoints) or rdm (reliable datagrams)");
  }

  ctx->rxmEagerLimit = OFI_DEFAULT_RXM_EAGER;
  if ((v = configGet(env, "rxm_eager_limit"))) {
    size_t b = 0;
    if (ncclxParseSize(v, &b) != 0 || b > ((size_t)1 << 30))
      return badValue(env, "rxm_eager_limit", v, "0 (libfabric's default) or a size up to 1G, e.g. 64K");
    ctx->rxmEagerLimit = b;
  }
  return ncclxSuccess;
}

/* ofi_rxm sends messages above its eager limit (16 KiB by default) with segmentation or
 * rendezvous, which made 32 KiB messages 2-3x slower than 16 KiB ones over tcp here. Raising
 * the limit alone keeps its bounce buffers at their size (no memory growth, measured). It is
 * read when libfabric initializes its providers, so it is set before our first fi_getinfo and
 * never over the user's own FI_OFI_RXM_EAGER_LIMIT. */
/* Not set: FI_OFI_RXM_ENABLE_PASSTHRU=1 (tcp's own RDM endpoints under rxm) was 2-3.5x faster
 * from 128 KiB to 8 MiB between two emulated hosts, but in 1.17 a receive no longer sees the
 * REFUSE bit of the tag it matched (a refusal completes as an empty message) and the 4-rank
 * communicator-isolation test hangs in about half of the runs (a receive posted after its
 * message arrived never completes; upstream fixed such a hang after 1.17, docs/net-ofi.md). */
static int wantsMsgEndpoints(const ofiCtx* ctx) {
  return ctx->epType == OFI_EP_MSG || (ctx->epType == OFI_EP_AUTO && strcasecmp(ctx->provider, "tcp") == 0);
}

/* The tcp provider copies a send that does not fit in the socket into a staging buffer of
 * its own and completes it at once; closing the endpoint then drops those bytes (its close
 * discards the buffer). A connected send comm is closed right after its last completion, so
 * in connected mode a send completes only once the kernel has it (staging off), unless the
 * user set FI_TCP_STAGING_SBUF_SIZE. Measured between two emulated hosts (6 alternating
 * rounds): no difference beyond the run-to-run spread at any size. */
static void setTcpStaging(const ofiCtx* ctx) {
  if (!wantsMsgEndpoints(ctx) || getenv("FI_TCP_STAGING_SBUF_SIZE")) return;
  setenv("FI_TCP_STAGING_SBUF_SIZE", "0", 0);
}

static void setRxmEagerLimit(const ofiCtx* ctx) {
  if (ctx->rxmEagerLimit == 0 || getenv("FI_OFI_RXM_EAGER_LIMIT")) return;
  /* Over tcp only: rxm over verbs needs the limit equal to its buffer size. */
  if (strncasecmp(ctx->provider, "tcp", 3) != 0) return;
  char value[32];
  snprintf(value, sizeof(value), "%zu", ctx->rxmEagerLimit);
  setenv("FI_OFI_RXM_EAGER_LIMIT", value, 0);
}

/* ------------------------------------------------------------------------------------------
 * Provider discovery
 * ------------------------------------------------------------------------------------------ */

static struct fi_info* makeHints(const char* provider, int mrLocal, int msg) {
  struct fi_info* hints = fi_allocinfo();
  if (!hints) return NULL;
  hints->caps = msg ? FI_MSG : FI_TAGGED;
  hints->mode = FI_CONTEXT | FI_CONTEXT2; /* every operation starts with a fi_context2 */
  hints->ep_attr->type = msg ? FI_EP_MSG : FI_EP_RDM;
  hints->domain_attr->threading = FI_THREAD_DOMAIN; /* we serialize per device */
  /* Connected tcp: progress only when we read the queues, no provider thread competing for
   * the CPUs (RDM keeps the provider's default, which rxm made manual already). */
  if (msg) {
    hints->domain_attr->data_progress = FI_PROGRESS_MANUAL;
    hints->domain_attr->control_progress = FI_PROGRESS_MANUAL;
  }
  hints->domain_attr->mr_mode = FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY;
  /* Connected mode registers per domain: registrations bound to an endpoint would need one
   * per connection. */
  if (mrLocal) hints->domain_attr->mr_mode |= FI_MR_LOCAL | (msg ? 0 : FI_MR_ENDPOINT);
  hints->fabric_attr->prov_name = strdup(provider);
  if (!hints->fabric_attr->prov_name) {
    fi_freeinfo(hints);
    return NULL;
  }
  return hints;
}

/* Prefer providers that register memory themselves (they cache it with memory-change
 * monitors); fall back to doing it ourselves when only FI_MR_LOCAL variants exist. */
static int getInfoOfType(ofiCtx* ctx, int msg, struct fi_info** list) {
  int ret = -FI_ENOMEM;
  for (int mrLocal = ctx->mrForce; mrLocal <= 1; mrLocal++) {
    struct fi_info* hints = makeHints(ctx->provider, mrLocal, msg);
    if (!hints) return -FI_ENOMEM;
    ret = fi_getinfo(FI_VERSION(FI_MAJOR_VERSION, FI_MINOR_VERSION), NULL, NULL, 0, hints, list);
    fi_freeinfo(hints);
    if (ret != -FI_ENODATA) break;
  }
  return ret;
}

/* `endpoint_type = auto` means connected endpoints for the tcp provider named alone (its
 * native endpoint: 2-4x faster here than ofi_rxm's reliable datagrams over it, see
 * docs/net-ofi.md) and reliable datagrams for everything else, including "tcp;ofi_rxm". */
static int getInfo(ofiCtx* ctx, struct fi_info** list) {
  int msg = wantsMsgEndpoints(ctx);
  int ret = getInfoOfType(ctx, msg, list);
  if (ret == -FI_ENODATA && msg && ctx->epType == OFI_EP_AUTO) ret = getInfoOfType(ctx, 0, list);
  return ret;
}

/* ------------------------------------------------------------------------------------------
 * init / devices / properties / finalize
 * ------------------------------------------------------------------------------------------ */

static ncclxResult_t ofiFinalize(void* vctx);

static ncclxResult_t openDevices(ofiCtx* ctx, struct fi_info* list, const char* domain,
                                 const ncclxPluginEnv_t* env) {
  const struct fi_info* picked[OFI_MAX_DEVICES];
  int npicked = 0;
  char seen[512] = "";
  for (const struct fi_info* it = list; it && npicked < OFI_MAX_DEVICES; it = it->next) {
    const char* name = it->domain_attr && it->domain_attr->name ? it->domain_attr->name : "?";
    int dup = 0;
    for (int i = 0; i < npicked; i++) dup |= strcmp(picked[i]->domain_attr->name, name) == 0;
    if (dup) continue;
    if (!strstr(seen, name) && strlen(seen) + strlen(name) + 3 < sizeof(seen)) {
      if (seen[0]) strcat(seen, ", ");
      strcat(seen, name);
    }
    if (domain && strcmp(domain, name) != 0) continue;
    picked[npicked++] = it;
  }
  if (npicked == 0) {
    env->log(NCCLX_LOG_WARN, NCCLX_LOG_NET | NCCLX_LOG_ENV, __FILE__, __LINE__,
             "NET/OFI: domain = '%s' (%s): provider '%s' has no such domain (it has: %s)",
             domain ? domain : "", configWhere(env, "domain"), ctx->provider, seen);
    return ncclxInvalidUsage;
  }
  ctx->devs = calloc((size_t)npicked, sizeof(*ctx->devs));
  if (!ctx->devs) return ncclxSystemError;
  for (int i = 0; i < npicked; i++) {
    ncclxResult_t res = ofiDeviceSetup(ctx, &ctx->devs[i], picked[i]);
    if (res != ncclxSuccess) return res;
    ctx->devs[i].index = i;
    ctx->ndev++;
  }
  /* Device 0 (the core's default) opens now, so that a provider that lists domains but
   * cannot open them is refused at init and the core falls back; others open on first use. */
  ofiDevice* d0 = &ctx->devs[0];
  pthread_mutex_lock(&d0->lock);
  ncclxResult_t res = ofiDeviceEnsureOpen(d0);
  pthread_mutex_unlock(&d0->lock);
  return res;
}

static ncclxResult_t ofiInit(void** ctxOut, const ncclxPluginEnv_t* env) {
  if (!ctxOut || !env || !env->log || !env->config || !env->config->get) return ncclxInternalError;
  *ctxOut = NULL;
  ofiCtx* ctx = calloc(1, sizeof(*ctx));
  if (!ctx) return ncclxSystemError;
  ctx->log = env->log;
  ctx->profiler = env->profiler;
  const char* domain = NULL;
  ncclxResult_t res = readConfig(env, ctx, &domain);
  if (res != ncclxSuccess) {
    free(ctx);
    return res;
  }
  ofiIdentityOfSelf(&ctx->self);
  /* Keep libfabric loaded when the core unloads this plugin: libfabric does not promise a
   * clean re-initialization after its destructor ran, and it keeps global state. */
  static int pinned;
  if (!pinned) {
    Dl_info info;
    if (dladdr((void*)fi_getinfo, &info) && info.dli_fname)
      pinned = dlopen(info.dli_fname, RTLD_NOW | RTLD_NOLOAD | RTLD_NODELETE) != NULL;
  }

  setRxmEagerLimit(ctx);
  setTcpStaging(ctx);
  struct fi_info* list = NULL;
  int ret = getInfo(ctx, &list);
  if (ret == -FI_ENODATA && ctx->epType == OFI_EP_MSG && getInfoOfType(ctx, 0, &list) == 0) {
    fi_freeinfo(list);
    OFI_WARN(ctx,
             "endpoint_type = msg (%s): provider '%s' has no connected (FI_EP_MSG) endpoints; "
             "use endpoint_type = rdm or auto",
             configWhere(env, "endpoint_type"), ctx->provider);
    free(ctx);
    return ncclxInvalidUsage;
  }
  if (ret != 0) {
    OFI_WARN(ctx,
             "libfabric provider '%s' (%s) not available: %s (libfabric %u.%u; `fi_info "
             "-l` lists the installed providers)",
             ctx->provider,
             configGet(env, "provider") ? configWhere(env, "provider") : "the default",
             fi_strerror(-ret), FI_MAJOR(fi_version()), FI_MINOR(fi_version()));
    free(ctx);
    return ncclxSystemError;
  }
  res = openDevices(ctx, list, domain, env);
  fi_freeinfo(list);
  if (res != ncclxSuccess) {
    ofiFinalize(ctx);
    return res;
  }

  char devs[768] = "";
  size_t o = 0;
  for (int i = 0; i < ctx->ndev && o < sizeof(devs) - 1; i++)
    o += (size_t)snprintf(devs + o, sizeof(devs) - o, "%s%d: %s %s", i ? ", " : "", i,
                          ctx->devs[i].name, ctx->devs[i].addrStr);
  const ofiDevice* d0 = &ctx->devs[0];
  char epDescription[96];
  if (d0->msgMode)
    snprintf(epDescription, sizeof(epDescription), "connected endpoints (FI_EP_MSG), one per connection");
  else
    snprintf(epDescription, sizeof(epDescription), "%d reliable-datagram endpoint(s) per device", d0->neps);
  if (d0->msgMode && ctx->endpoints > 1)
    OFI_INFO(ctx, "endpoints = %d has no effect with connected endpoints (one per connection)",
             ctx->endpoints);
  OFI_INFO(ctx,
           "provider %s (libfabric %u.%u), %d device(s): %s; %s; "
           "memory registration %s; clear-to-send %s; completion wait fd %s; peer liveness "
           "checks %s%d ms",
           d0->info->fabric_attr->prov_name, FI_MAJOR(fi_version()), FI_MINOR(fi_version()),
           ctx->ndev, devs, epDescription, d0->mrLocal ? "by the plugin (FI_MR_LOCAL)" : "by the provider",
           d0->clearToSend ? "on" : "off", d0->cqFd >= 0 ? "yes" : "no",
           ctx->livenessMs ? "every " : "off, ", ctx->livenessMs);
  *ctxOut = ctx;
  return ncclxSuccess;
}

static ncclxResult_t ofiDevices(void* vctx, int* ndev) {
  ofiCtx* ctx = vctx;
  if (!ctx || !ndev) return ncclxInternalError;
  *ndev = ctx->ndev;
  return ncclxSuccess;
}

static ncclxResult_t ofiGetProperties(void* vctx, int dev, ncclxNetProperties_v1_t* props) {
  ofiCtx* ctx = vctx;
  if (!ctx || !props) return ncclxInternalError;
  if (dev < 0 || dev >= ctx->ndev) {
    OFI_WARN(ctx, "getProperties: device %d does not exist (%d devices)", dev, ctx->ndev);
    return ncclxInternalError;
  }
  const ofiDevice* d = &ctx->devs[dev];
  memset(props, 0, sizeof(*props));
  props->name = d->name;
  props->pciPath = d->pciPath;
  props->guid = d->guid;
  props->ptrSupport = NCCLX_PTR_HOST; /* device memory (FI_HMEM) is not implemented */
  props->regIsGlobal = 1;
  props->speedMbps = d->speedMbps;
  props->port = 1;
  props->latencyUs = d->latencyUs;
  props->maxComms = 1 << 20;
  props->maxRecvs = 1;
  props->maxMessageBytes = d->maxMsg;
  props->forceFlush = 0;
  return ncclxSuccess;
}

static ncclxResult_t ofiFinalize(void* vctx) {
  ofiCtx* ctx = vctx;
  if (!ctx) return ncclxInternalError;
  ofiPendingForget(ctx);
  for (int i = 0; i < ctx->ndev; i++) ofiDeviceClose(&ctx->devs[i]);
  free(ctx->devs);
  free(ctx);
  return ncclxSuccess;
}

__attribute__((visibility("default"))) const ncclxNet_v1_t ncclxNetPlugin_v1 = {
    .name = "ofi",
    .abiVersion = NCCLX_NET_ABI_VERSION,
    .init = ofiInit,
    .devices = ofiDevices,
    .getProperties = ofiGetProperties,
    .listen = ofiListen,
    .connect = ofiConnect,
    .accept = ofiAccept,
    .regMr = ofiRegMr,
    .deregMr = ofiDeregMr,
    .isend = ofiIsend,
    .irecv = ofiIrecv,
    .iflush = NULL,
    .test = ofiTest,
    .closeSend = ofiCloseSend,
    .closeRecv = ofiCloseRecv,
    .closeListen = ofiCloseListen,
    .finalize = ofiFinalize,
    .getPollFd = ofiGetPollFd,
};
