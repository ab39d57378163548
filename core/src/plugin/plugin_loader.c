/* Finds, dlopens, validates and reference-counts the net, tuner and profiler plugins.
 *
 * Acquire/Release pairs: each Acquire that hands out a plugin (net, or a non-NULL tuner or
 * profiler) takes one reference, which one Release returns. A NULL tuner or profiler takes
 * none, so nothing is released for it. */
#include "plugin/plugin_loader.h"

#include <ctype.h>
#include <dlfcn.h>
#include <limits.h>
#include <link.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "config/config.h"
#include "util/debug.h"

#ifndef NCCLX_PLUGIN_DIR_BUILD
#define NCCLX_PLUGIN_DIR_BUILD ""
#endif
#ifndef NCCLX_PLUGIN_DIR_INSTALL
#define NCCLX_PLUGIN_DIR_INSTALL ""
#endif

#define REASON_MAX 2048
#define BUILTIN_NET_NAME "socket"

static pthread_mutex_t loaderLock = PTHREAD_MUTEX_INITIALIZER;

/* ---------- validation ---------- */

static _Thread_local char validateReason[256];

/* Every ABI struct starts with name and abiVersion; only after both check out may the rest of
 * the struct be read with this version's layout. */
static const char* checkHeader(const char* kind, const char* name, int abiVersion, int expected) {
  if (name == NULL || name[0] == '\0') return "its name is NULL or empty";
  if (abiVersion != expected) {
    snprintf(validateReason, sizeof(validateReason), "built for %s ABI v%d, this ncclx speaks v%d",
             kind, abiVersion, expected);
    return validateReason;
  }
  return NULL;
}

static const char* nullOp(const char* op) {
  snprintf(validateReason, sizeof(validateReason), "required operation %s is NULL", op);
  return validateReason;
}

#define REQUIRE_OP(s, op) \
  if ((s)->op == NULL) return nullOp(#op)

const char* ncclxNetValidate(const ncclxNet_t* net) {
  if (net == NULL) return "the plugin struct is NULL";
  const char* why = checkHeader("net", net->name, net->abiVersion, NCCLX_NET_ABI_VERSION);
  if (why) return why;
  REQUIRE_OP(net, init);
  REQUIRE_OP(net, devices);
  REQUIRE_OP(net, getProperties);
  REQUIRE_OP(net, listen);
  REQUIRE_OP(net, connect);
  REQUIRE_OP(net, accept);
  REQUIRE_OP(net, regMr);
  REQUIRE_OP(net, deregMr);
  REQUIRE_OP(net, isend);
  REQUIRE_OP(net, irecv);
  REQUIRE_OP(net, test);
  REQUIRE_OP(net, closeSend);
  REQUIRE_OP(net, closeRecv);
  REQUIRE_OP(net, closeListen);
  REQUIRE_OP(net, finalize);
  return NULL; /* iflush and getPollFd are optional */
}

const char* ncclxTunerValidate(const ncclxTuner_t* tuner) {
  if (tuner == NULL) return "the plugin struct is NULL";
  const char* why = checkHeader("tuner", tuner->name, tuner->abiVersion, NCCLX_TUNER_ABI_VERSION);
  if (why) return why;
  REQUIRE_OP(tuner, init);
  REQUIRE_OP(tuner, getCollInfo);
  REQUIRE_OP(tuner, finalize);
  return NULL;
}

const char* ncclxProfilerValidate(const ncclxProfiler_t* prof) {
  if (prof == NULL) return "the plugin struct is NULL";
  const char* why = checkHeader("profiler", prof->name, prof->abiVersion, NCCLX_PROFILER_ABI_VERSION);
  if (why) return why;
  REQUIRE_OP(prof, init);
  REQUIRE_OP(prof, startEvent);
  REQUIRE_OP(prof, stopEvent);
  REQUIRE_OP(prof, recordEventState);
  REQUIRE_OP(prof, finalize);
  return NULL;
}

/* ---------- environment for plugins ---------- */

/* Network plugins' own profiler events go to the profiler layer (prof.c registers its entry
 * before it starts a profiler); until then there is no profiler, and an event is a no-op. */
static ncclxProfilerCallback_t netEventSink;

void ncclxPluginSetNetProfiler(ncclxProfilerCallback_t sink) { __atomic_store_n(&netEventSink, sink, __ATOMIC_RELEASE); }

static ncclxResult_t netEvent(void** eHandle, int type, void* parentHandle, int64_t pluginId, void* extData) {
  ncclxProfilerCallback_t sink = __atomic_load_n(&netEventSink, __ATOMIC_ACQUIRE);
  if (sink) return sink(eHandle, type, parentHandle, pluginId, extData);
  /* What the profiler layer answers when no profiler takes NET events. */
  if (eHandle == NULL) return ncclxInvalidArgument;
  if (type == NCCLX_PROFILER_NET_START) *eHandle = NULL;
  else if (type != NCCLX_PROFILER_NET_STOP && type != NCCLX_PROFILER_NET_UPDATE) return ncclxInvalidArgument;
  return ncclxSuccess;
}

void ncclxPluginEnvFill(ncclxPluginEnv_t* env, const char* section) {
  env->version = NCCLX_PLUGIN_ENV_VERSION;
  env->log = ncclxLog;
  env->config = &ncclxConfigApi;
  env->section = ncclxConfigSection(section ? section : "");
  env->profiler = netEvent;
}

/* ---------- finding and opening a shared object ---------- */

static const char* resultName(ncclxResult_t r) {
  switch (r) {
    case ncclxSuccess: return "ncclxSuccess";
    case ncclxUnhandledCudaError: return "ncclxUnhandledCudaError";
    case ncclxSystemError: return "ncclxSystemError";
    case ncclxInternalError: return "ncclxInternalError";
    case ncclxInvalidArgument: return "ncclxInvalidArgument";
    case ncclxInvalidUsage: return "ncclxInvalidUsage";
    case ncclxRemoteError: return "ncclxRemoteError";
    case ncclxInProgress: return "ncclxInProgress";
    default: return "unknown error";
  }
}

static void appendf(char* buf, size_t size, const char* fmt, ...) __attribute__((format(printf, 3, 4)));
static void appendf(char* buf, size_t size, const char* fmt, ...) {
  size_t len = strlen(buf);
  if (len + 1 >= size) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf + len, size - len, fmt, ap);
  va_end(ap);
}

static void* dlopenOrWhy(const char* path, char* why, size_t whySize) {
  dlerror();
  void* dl = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (dl == NULL) {
    const char* err = dlerror();
    snprintf(why, whySize, "%s", err ? err : "dlopen failed");
  }
  return dl;
}

/* The file a handle came from (for the log line), falling back to what was asked for. */
static void loadedPath(void* dl, const char* asked, char* out, size_t size) {
  struct link_map* map = NULL;
  if (dlinfo(dl, RTLD_DI_LINKMAP, &map) == 0 && map && map->l_name && map->l_name[0])
    snprintf(out, size, "%s", map->l_name);
  else
    snprintf(out, size, "%s", asked);
}

/* The folder libncclx itself was loaded from, + "/ncclx": where an install (at any prefix,
 * moved or not) keeps its plugins and modules. "" if unknown. */
static void ownPluginDir(char* out, size_t size) {
  Dl_info info;
  out[0] = '\0';
  if (!dladdr((void*)ownPluginDir, &info) || !info.dli_fname || !strchr(info.dli_fname, '/')) return;
  const char* slash = strrchr(info.dli_fname, '/');
  snprintf(out, size, "%.*s/ncclx", (int)(slash - info.dli_fname), info.dli_fname);
}

/* Opens plugin NAME of a type ("net", "tuner", "profiler", "module"). NAME with a '/' is a
 * path; otherwise libncclx-TYPE-NAME.so is looked for in [core] plugin_path, next to the
 * library (LIBDIR/ncclx), the build tree, the install dir, then the system library path.
 * NULL with *why set when it cannot be opened. */
static void* openPlugin(const char* type, const char* name, char* path, size_t pathSize,
                        char* why, size_t whySize) {
  why[0] = '\0';
  if (strchr(name, '/') != NULL) {
    snprintf(path, pathSize, "%s", name);
    return dlopenOrWhy(name, why, whySize);
  }
  char file[NAME_MAX + 1];
  if ((size_t)snprintf(file, sizeof(file), "libncclx-%s-%s.so", type, name) >= sizeof(file)) {
    snprintf(why, whySize, "plugin name too long");
    return NULL;
  }
  char tried[REASON_MAX] = "";
  const char* configured = ncclxConfigGet("core", "plugin_path");
  char dirs[8192], own[1024];
  ownPluginDir(own, sizeof(own));
  snprintf(dirs, sizeof(dirs), "%s:%s:%s:%s", configured ? configured : "", own, NCCLX_PLUGIN_DIR_BUILD,
           NCCLX_PLUGIN_DIR_INSTALL);
  for (char *save = NULL, *dir = strtok_r(dirs, ":", &save); dir; dir = strtok_r(NULL, ":", &save)) {
    if ((size_t)snprintf(path, pathSize, "%s/%s", dir, file) >= pathSize) continue;
    if (access(path, F_OK) != 0) {
      appendf(tried, sizeof(tried), "%s, ", path);
      continue;
    }
    /* The file is there: if it does not load (bad ELF, missing dependency), say so rather
     * than silently picking a same-named file further down the path. */
    return dlopenOrWhy(path, why, whySize);
  }
  snprintf(path, pathSize, "%s", file);
  void* dl = dlopenOrWhy(file, why, whySize);
  if (dl == NULL) {
    char err[512];
    snprintf(err, sizeof(err), "%s", why);
    snprintf(why, whySize, "not found; tried %sthen %s on the system library path (%s)", tried,
             file, err);
  }
  return dl;
}

void* ncclxPluginOpen(const char* type, const char* name, char* path, size_t pathSize, char* why, size_t whySize) {
  return openPlugin(type, name, path, pathSize, why, whySize);
}

/* dlopen + dlsym; NULL with *why set when either fails. */
static const void* openSymbol(const char* type, const char* name, const char* symbol, void** dl,
                              char* path, size_t pathSize, char* why, size_t whySize) {
  *dl = openPlugin(type, name, path, pathSize, why, whySize);
  if (*dl == NULL) return NULL;
  char real[PATH_MAX];
  loadedPath(*dl, path, real, sizeof(real));
  snprintf(path, pathSize, "%s", real);
  dlerror();
  const void* sym = dlsym(*dl, symbol);
  if (sym == NULL) {
    snprintf(why, whySize, "no exported symbol %s (is it built with -fvisibility=hidden and not marked visible?)",
             symbol);
    dlclose(*dl);
    *dl = NULL;
  }
  return sym;
}

/* ---------- network ---------- */

static struct {
  int refs;
  ncclxNetInstance_t inst;
  void* dl;                /* NULL for the built-in */
  const ncclxNet_t* builtin; /* the transport layer's socket network (ncclxNetAcquire) */
  ncclxResult_t builtinErr; /* why the built-in was refused, for the final error code */
  ncclxPluginEnv_t env;    /* kept for safety only: plugin.h tells plugins to copy it */
} netState;

/* init + devices on a validated net; on failure everything is undone and *why says why. */
static int netStart(const ncclxNet_t* net, char* why, size_t whySize) {
  char section[128];
  snprintf(section, sizeof(section), "net.%s", net->name);
  ncclxPluginEnvFill(&netState.env, section);
  void* ctx = NULL;
  ncclxClearThreadError();
  ncclxResult_t res = net->init(&ctx, &netState.env);
  if (net == netState.builtin) netState.builtinErr = res;
  if (res != ncclxSuccess) {
    const char* detail = ncclxThreadLastError();
    snprintf(why, whySize, "init failed with %s%s%s", resultName(res), detail[0] ? ": " : "", detail);
    return 0;
  }
  int ndev = 0;
  res = net->devices(ctx, &ndev);
  if (res != ncclxSuccess || ndev <= 0) {
    if (res != ncclxSuccess)
      snprintf(why, whySize, "devices() failed with %s", resultName(res));
    else
      snprintf(why, whySize, "it found no devices (%d)", ndev);
    net->finalize(ctx);
    return 0;
  }
  netState.inst.net = net;
  netState.inst.ctx = ctx;
  netState.inst.ndev = ndev;
  return 1;
}

/* Tries one name from [net] plugin. 1 = loaded; 0 = refused (logged). */
static int netTry(const char* name, int* triedBuiltin) {
  char why[REASON_MAX], path[PATH_MAX];
  if (strcasecmp(name, BUILTIN_NET_NAME) == 0) {
    *triedBuiltin = 1;
    if (netStart(netState.builtin, why, sizeof(why))) {
      INFO(NCCLX_LOG_PLUGIN | NCCLX_LOG_NET, "net: using the built-in socket network, %d device(s)",
           netState.inst.ndev);
      return 1;
    }
    WARN("net: built-in socket network refused: %s", why);
    return 0;
  }
  void* dl = NULL;
  const ncclxNet_t* net = openSymbol("net", name, NCCLX_NET_PLUGIN_SYMBOL, &dl, path, sizeof(path),
                                     why, sizeof(why));
  if (net != NULL) {
    const char* bad = ncclxNetValidate(net);
    if (bad != NULL) snprintf(why, sizeof(why), "%s", bad);
    else if (netStart(net, why, sizeof(why))) {
      netState.dl = dl;
      INFO(NCCLX_LOG_PLUGIN | NCCLX_LOG_NET, "net: using plugin '%s' from %s, %d device(s)",
           net->name, path, netState.inst.ndev);
      return 1;
    }
  }
  WARN("net: plugin '%s' refused: %s: %s", name, path, why);
  if (dl) dlclose(dl);
  return 0;
}

ncclxResult_t ncclxNetAcquire(const ncclxNet_t* builtin, ncclxNetInstance_t* out) {
  if (out == NULL || builtin == NULL)
    return ncclxSetError(ncclxInvalidArgument, "ncclxNetAcquire: %s is NULL", out ? "builtin" : "out");
  NCCLX_CHECK(ncclxConfigLoad());
  pthread_mutex_lock(&loaderLock);
  netState.builtin = builtin;
  if (netState.refs > 0) {
    netState.refs++;
    *out = netState.inst;
    pthread_mutex_unlock(&loaderLock);
    return ncclxSuccess;
  }
  const char* list = ncclxConfigGet("net", "plugin");
  if (list == NULL || list[0] == '\0') list = BUILTIN_NET_NAME;
  char names[1024];
  snprintf(names, sizeof(names), "%s", list);
  int loaded = 0, triedBuiltin = 0;
  netState.builtinErr = ncclxSuccess;
  for (char *save = NULL, *tok = strtok_r(names, ",", &save); tok && !loaded; tok = strtok_r(NULL, ",", &save)) {
    while (isspace((unsigned char)*tok)) tok++;
    char* end = tok + strlen(tok);
    while (end > tok && isspace((unsigned char)end[-1])) *--end = '\0';
    if (*tok != '\0') loaded = netTry(tok, &triedBuiltin);
  }
  if (!loaded && !triedBuiltin) {
    WARN("net: no plugin of '[net] plugin = %s' could be used; falling back to the built-in socket network",
         list);
    loaded = netTry(BUILTIN_NET_NAME, &triedBuiltin);
  }
  if (!loaded) {
    pthread_mutex_unlock(&loaderLock);
    /* A configuration mistake (e.g. a bad [net.socket] key) is the user's to fix: say so. */
    ncclxResult_t res = netState.builtinErr == ncclxInvalidUsage ? ncclxInvalidUsage : ncclxSystemError;
    return ncclxSetError(res, "net: no usable network ([net] plugin = %s); see the warnings above", list);
  }
  netState.refs = 1;
  *out = netState.inst;
  pthread_mutex_unlock(&loaderLock);
  return ncclxSuccess;
}

void ncclxNetRelease(void) {
  pthread_mutex_lock(&loaderLock);
  if (netState.refs <= 0) {
    pthread_mutex_unlock(&loaderLock);
    WARN("net: ncclxNetRelease called more often than ncclxNetAcquire");
    return;
  }
  if (--netState.refs == 0) {
    const ncclxNet_t* net = netState.inst.net;
    ncclxResult_t res = net->finalize(netState.inst.ctx);
    if (res != ncclxSuccess) WARN("net: %s finalize failed with %s", net->name, resultName(res));
    INFO(NCCLX_LOG_PLUGIN | NCCLX_LOG_NET, "net: %s released", net->name);
    if (netState.dl) dlclose(netState.dl);
    netState.dl = NULL;
    memset(&netState.inst, 0, sizeof(netState.inst));
  }
  pthread_mutex_unlock(&loaderLock);
}

/* ---------- tuner and profiler ---------- */

typedef struct {
  const char* type;   /* "tuner" or "profiler", also the ini section */
  const char* symbol;
  const char* (*validate)(const void* plugin);
  int refs;           /* > 0 only while plugin is loaded */
  const void* plugin;
  void* dl;
} OptionalPlugin;

static const char* validateTuner(const void* p) { return ncclxTunerValidate(p); }
static const char* validateProfiler(const void* p) { return ncclxProfilerValidate(p); }

static OptionalPlugin tunerState = {"tuner", NCCLX_TUNER_PLUGIN_SYMBOL, validateTuner, 0, NULL, NULL};
static OptionalPlugin profilerState = {"profiler", NCCLX_PROFILER_PLUGIN_SYMBOL, validateProfiler, 0,
                                       NULL, NULL};

static ncclxResult_t optionalAcquire(OptionalPlugin* st, const void** out) {
  *out = NULL;
  NCCLX_CHECK(ncclxConfigLoad());
  pthread_mutex_lock(&loaderLock);
  if (st->refs > 0) {
    st->refs++;
    *out = st->plugin;
    pthread_mutex_unlock(&loaderLock);
    return ncclxSuccess;
  }
  const char* cfg = ncclxConfigGet(st->type, "plugin");
  char name[PATH_MAX];
  snprintf(name, sizeof(name), "%s", cfg ? cfg : "");
  char* p = name;
  while (isspace((unsigned char)*p)) p++;
  memmove(name, p, strlen(p) + 1);
  for (size_t n = strlen(name); n > 0 && isspace((unsigned char)name[n - 1]);) name[--n] = '\0';
  if (name[0] == '\0' || strcasecmp(name, "none") == 0) {
    INFO(NCCLX_LOG_PLUGIN, "%s: none configured", st->type);
    pthread_mutex_unlock(&loaderLock);
    return ncclxSuccess;
  }
  char why[REASON_MAX], path[PATH_MAX];
  void* dl = NULL;
  const void* plugin = openSymbol(st->type, name, st->symbol, &dl, path, sizeof(path), why, sizeof(why));
  if (plugin != NULL) {
    const char* bad = st->validate(plugin);
    if (bad == NULL) {
      st->refs = 1;
      st->plugin = plugin;
      st->dl = dl;
      /* name is the struct's first member in every ABI version */
      INFO(NCCLX_LOG_PLUGIN, "%s: using plugin '%s' from %s", st->type, *(const char* const*)plugin, path);
      *out = plugin;
      pthread_mutex_unlock(&loaderLock);
      return ncclxSuccess;
    }
    snprintf(why, sizeof(why), "%s", bad);
  }
  WARN("%s: plugin '%s' refused: %s: %s; running without a %s", st->type, name, path, why, st->type);
  if (dl) dlclose(dl);
  pthread_mutex_unlock(&loaderLock);
  return ncclxSuccess;
}

static void optionalRelease(OptionalPlugin* st) {
  pthread_mutex_lock(&loaderLock);
  if (st->refs <= 0) {
    pthread_mutex_unlock(&loaderLock);
    WARN("%s: release called more often than acquire", st->type);
    return;
  }
  if (--st->refs == 0) {
    if (st->dl) dlclose(st->dl);
    st->dl = NULL;
    st->plugin = NULL;
  }
  pthread_mutex_unlock(&loaderLock);
}

ncclxResult_t ncclxTunerAcquire(const ncclxTuner_t** out) {
  if (out == NULL) return ncclxSetError(ncclxInvalidArgument, "ncclxTunerAcquire: out is NULL");
  const void* p = NULL;
  ncclxResult_t res = optionalAcquire(&tunerState, &p);
  *out = p;
  return res;
}
void ncclxTunerRelease(void) { optionalRelease(&tunerState); }

const ncclxTunerFuse_v1_t* pluginTunerFuse(const ncclxTuner_t* tuner) {
  if (!tuner) return NULL;
  pthread_mutex_lock(&loaderLock);
  const ncclxTunerFuse_v1_t* fuse = NULL;
  if (tunerState.refs > 0 && tunerState.plugin == tuner && tunerState.dl) {
    fuse = dlsym(tunerState.dl, NCCLX_TUNER_FUSE_SYMBOL);
    if (fuse && fuse->abiVersion != NCCLX_TUNER_FUSE_ABI_VERSION) {
      WARN("tuner '%s': %s has ABI version %d, this core reads %d: ignored", tuner->name, NCCLX_TUNER_FUSE_SYMBOL,
           fuse->abiVersion, NCCLX_TUNER_FUSE_ABI_VERSION);
      fuse = NULL;
    }
  }
  pthread_mutex_unlock(&loaderLock);
  return fuse;
}

ncclxResult_t ncclxProfilerAcquire(const ncclxProfiler_t** out) {
  if (out == NULL) return ncclxSetError(ncclxInvalidArgument, "ncclxProfilerAcquire: out is NULL");
  const void* p = NULL;
  ncclxResult_t res = optionalAcquire(&profilerState, &p);
  *out = p;
  return res;
}
void ncclxProfilerRelease(void) { optionalRelease(&profilerState); }
