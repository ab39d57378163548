/* Loads feature modules (at communicator init, or a call's first use): [modules] <key> = on (default: the module built with
 * ncclx), off, a name (libncclx-module-<name>.so) or a path. A module that cannot be used is
 * tried once; every later call of its family fails with the same sentence. */
#include "module/module.h"

#include <dlfcn.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "comm/comm.h"
#include "config/config.h"
#include "plugin/plugin_loader.h"
#include "util/debug.h"

struct knownModule {
  const char* key;    /* [modules] key and default file name */
  const char* family; /* the family of public calls it implements */
  const char* label;  /* for sentences */
  const char* env;    /* the key's environment override */
};

static const struct knownModule known[MODULE_COUNT] = {
    [MODULE_COMMFUSE] = {"commfuse", NCCLX_MODULE_FAMILY_FUSE, "CommFuse", "NCCLX_MODULES_COMMFUSE"},
    [MODULE_MOE] = {"moe", NCCLX_MODULE_FAMILY_MOE, "AllToAllvDynamic/MoE", "NCCLX_MODULES_MOE"},
};

_Static_assert(MODULE_COUNT <= NCCLX_MODULE_SLOTS, "every module needs a state slot in struct ncclxComm");

static struct {
  int tried;
  const ncclxModule_v1_t* module;
  const void* table;
  char why[1024]; /* why it is not available */
} loaded[MODULE_COUNT];
static pthread_mutex_t loadLock = PTHREAD_MUTEX_INITIALIZER;

static int isOff(const char* v) {
  return !strcasecmp(v, "off") || !strcasecmp(v, "none") || !strcasecmp(v, "0") || !strcasecmp(v, "false") ||
         !strcasecmp(v, "no");
}

static int isOn(const char* v) {
  return !strcasecmp(v, "on") || !strcasecmp(v, "1") || !strcasecmp(v, "true") || !strcasecmp(v, "yes");
}

/* Why a module struct cannot be used, or NULL. */
static const char* validate(const ncclxModule_v1_t* m) {
  static _Thread_local char why[128];
  if (!m->name || !m->name[0]) return "its name is NULL or empty";
  if (m->abiVersion != NCCLX_MODULE_ABI_VERSION) {
    snprintf(why, sizeof(why), "built for module ABI v%d, this ncclx speaks v%d", m->abiVersion,
             NCCLX_MODULE_ABI_VERSION);
    return why;
  }
  if (!m->init) return "required operation init is NULL";
  if (!m->family) return "required operation family is NULL";
  return NULL;
}

static void load(moduleId id) {
  const struct knownModule* k = &known[id];
  char* why = loaded[id].why;
  size_t whySize = sizeof(loaded[id].why);
  if (ncclxConfigLoad() != ncclxSuccess) {
    snprintf(why, whySize, "the configuration is invalid: %s", ncclxThreadLastError());
    return;
  }
  const char* value = ncclxConfigGet("modules", k->key);
  if (!value) value = "on";
  if (isOff(value)) {
    snprintf(why, whySize, "it is switched off ([modules] %s = %s)", k->key, value);
    return;
  }
  const char* name = isOn(value) ? k->key : value;
  char path[PATH_MAX], err[768];
  void* dl = ncclxPluginOpen("module", name, path, sizeof(path), err, sizeof(err));
  if (!dl) {
    snprintf(why, whySize, "%.300s cannot be loaded ([modules] %s = %.100s): %.500s", path, k->key, value, err);
    return;
  }
  const ncclxModule_v1_t* m = dlsym(dl, NCCLX_MODULE_SYMBOL);
  const char* bad = m ? validate(m) : "it does not export " NCCLX_MODULE_SYMBOL;
  ncclxResult_t res = ncclxSuccess;
  if (!bad && (res = m->init(moduleCoreTable(), (int)id)) != ncclxSuccess) bad = ncclxThreadLastError();
  const void* table = bad ? NULL : m->family(k->family);
  if (!bad && !table) bad = "it does not implement the family of calls it replaces";
  if (bad) {
    snprintf(why, whySize, "%.300s was refused ([modules] %s = %.100s): %.500s", path, k->key, value, bad);
    dlclose(dl);
    return;
  }
  loaded[id].module = m;
  __atomic_store_n(&loaded[id].table, table, __ATOMIC_RELEASE); /* loaded for the life of the process */
  INFO(NCCLX_LOG_INIT | NCCLX_LOG_PLUGIN, "module %s: %s loaded from %s", k->key, m->name, path);
}

const void* moduleFamilyQuiet(moduleId id) {
  if ((unsigned)id >= MODULE_COUNT) return NULL;
  /* Every call of a family asks: once loaded, no lock. */
  const void* ready = __atomic_load_n(&loaded[id].table, __ATOMIC_ACQUIRE);
  if (ready) return ready;
  pthread_mutex_lock(&loadLock);
  if (!loaded[id].tried) {
    loaded[id].tried = 1;
    load(id);
    if (!loaded[id].table) WARN("module %s: %s; its calls will fail", known[id].key, loaded[id].why);
  }
  const void* table = loaded[id].table;
  pthread_mutex_unlock(&loadLock);
  return table;
}

const void* moduleFamily(moduleId id, const char* fn) {
  const void* table = moduleFamilyQuiet(id);
  if (!table)
    ncclxSetError(ncclxInvalidUsage, "%s: the %s module is not available: %s (set [modules] %s in ncclx.ini or %s)",
                  fn, known[id].label, loaded[id].why, known[id].key, known[id].env);
  return table;
}

static const char* settingOf(moduleId id) {
  const char* v = ncclxConfigGet("modules", known[id].key);
  return v ? v : "on";
}

/* Whether a module that is not switched off loaded (loading it now: at communicator init, so
 * that a rank whose module cannot load fails init with every other rank, instead of failing
 * alone at the first call while its peers wait in it). */
static int loadedNow(moduleId id) {
  if (isOff(settingOf(id))) return 0;
  return moduleFamilyQuiet(id) != NULL;
}

uint64_t moduleConfigHash(void) {
  uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a over "key=value:loaded;" of every module */
  for (int id = 0; id < MODULE_COUNT; id++) {
    char item[256];
    snprintf(item, sizeof(item), "%s=%s:%d;", known[id].key, settingOf((moduleId)id), loadedNow((moduleId)id));
    for (const char* c = item; *c; c++) h = (h ^ (unsigned char)*c) * 0x100000001b3ull;
  }
  return h;
}

void moduleConfigDescribe(char* buf, size_t size) {
  size_t len = 0;
  buf[0] = '\0';
  for (int id = 0; id < MODULE_COUNT && len < size; id++) {
    const char* setting = settingOf((moduleId)id);
    int off = isOff(setting), ok = !off && loadedNow((moduleId)id);
    len += (size_t)snprintf(buf + len, size - len, "%s%s = %s%s%.300s%s", id ? ", " : "", known[id].key, setting,
                            off || ok ? "" : " (not loaded: ", off || ok ? "" : loaded[id].why, off || ok ? "" : ")");
  }
}

void moduleCommDestroy(struct ncclxComm* comm) {
  for (int id = 0; id < MODULE_COUNT; id++) {
    void* state = comm->moduleState[id];
    comm->moduleState[id] = NULL;
    /* Set only by a loaded module, and modules are never unloaded. */
    if (state && loaded[id].module && loaded[id].module->commDestroy) loaded[id].module->commDestroy(comm, state);
  }
}
