/*
 * What every ncclx plugin (net, tuner, profiler) receives from the core.
 *
 * A plugin is a shared object that exports one const struct per ABI it implements
 * (ncclxNetPlugin_v1, ncclxTunerPlugin_v1, ncclxProfilerPlugin_v1). Each struct starts
 * with the plugin's name and the ABI version it was compiled against; the loader refuses a
 * struct whose version it does not know, or whose required operations are NULL.
 *
 * Plugins are loaded with RTLD_NOW|RTLD_LOCAL: they must not call into libncclx. All they
 * get from the core is this environment.
 */
#ifndef NCCLX_PLUGIN_H
#define NCCLX_PLUGIN_H

#include <stddef.h>
#include <stdint.h>

#include "../ncclx.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Version 1 is frozen (docs/plugin-guide.md, "ABI stability"): changes come as a new version. */
#define NCCLX_PLUGIN_ENV_VERSION 1

typedef enum {
  NCCLX_LOG_NONE = 0,
  NCCLX_LOG_WARN = 2,
  NCCLX_LOG_INFO = 3,
  NCCLX_LOG_TRACE = 5
} ncclxLogLevel_t;

/* Subsystem bits for the logger (NCCLX_DEBUG_SUBSYS=INIT,NET,... selects them). */
#define NCCLX_LOG_INIT 0x1u
#define NCCLX_LOG_COLL 0x2u
#define NCCLX_LOG_P2P 0x4u
#define NCCLX_LOG_SHM 0x8u
#define NCCLX_LOG_NET 0x10u
#define NCCLX_LOG_TUNING 0x40u
#define NCCLX_LOG_ENV 0x80u
#define NCCLX_LOG_ALLOC 0x100u
#define NCCLX_LOG_BOOTSTRAP 0x1000u
#define NCCLX_LOG_PLUGIN 0x2000u
#define NCCLX_LOG_PROFILE 0x4000u
#define NCCLX_LOG_ALL 0xffffffffu

/* printf-style logger; the core adds host, pid, thread and rank to each line (plugins prefix
 * their own name, e.g. "tuner rules: ..."). */
typedef void (*ncclxLogger_t)(ncclxLogLevel_t level, unsigned long subsys, const char* file,
                              int line, const char* fmt, ...)
    __attribute__((format(printf, 5, 6)));

/* Read-only view of one ncclx.ini section (e.g. "net.ofi") with environment overrides
 * (NCCLX_NET_OFI_<KEY>) already applied. */
typedef struct ncclxConfigSection ncclxConfigSection_t;

typedef struct {
  /* Value of key, or NULL when it is set nowhere. */
  const char* (*get)(const ncclxConfigSection_t* section, const char* key);
  /* Iterate keys set in the file for this section: index 0, 1, ... until it returns 0.
   * `where` is "file:line" (or "env NAME"), for messages about a bad or unknown key. */
  int (*entry)(const ncclxConfigSection_t* section, int index, const char** key,
               const char** value, const char** where);
} ncclxConfigApi_t;

/* Profiler callback a net plugin may call to report its own events (see profiler.h):
 * type NCCLX_PROFILER_NET_START / _UPDATE / _STOP. parentHandle is the phandle the core gave
 * isend/irecv, or NULL (the event then hangs under the running operation). STOP takes the
 * address of the handle START returned and sets it to NULL. With no profiler taking NET
 * events, or from a thread that runs no operation, START sets *eHandle = NULL and a later
 * UPDATE or STOP with it is a no-op: call it unconditionally, from within isend, irecv and
 * test (that is how the core knows the communicator an event belongs to). */
typedef ncclxResult_t (*ncclxProfilerCallback_t)(void** eHandle, int type, void* parentHandle,
                                                 int64_t pluginId, void* extData);

/* Valid only during the init call that receives it: a plugin copies what it keeps (the
 * function pointers and the section pointer themselves stay valid until finalize). */
typedef struct {
  int version;                          /* NCCLX_PLUGIN_ENV_VERSION */
  ncclxLogger_t log;                    /* never NULL */
  const ncclxConfigApi_t* config;       /* never NULL */
  const ncclxConfigSection_t* section;  /* the plugin's own section; may hold no keys */
  ncclxProfilerCallback_t profiler;     /* never NULL (a no-op when no profiler is loaded) */
} ncclxPluginEnv_t;

#ifdef __cplusplus
}
#endif
#endif /* NCCLX_PLUGIN_H */
