/* Finds, dlopens and validates net, tuner and profiler plugins named in ncclx.ini.
 * NAME -> libncclx-<type>-NAME.so on [core] plugin_path, then the system library path;
 * a NAME containing '/' is a path used as is; "none" disables the type. A refused plugin is
 * logged with the reason (missing file, missing symbol, wrong ABI version, NULL required
 * operation, init failure, no devices) and the next candidate is tried. */
#ifndef NCCLX_PLUGIN_LOADER_H
#define NCCLX_PLUGIN_LOADER_H

#include "ncclx/net.h"
#include "ncclx/profiler.h"
#include "ncclx/tuner.h"

/* The process-wide network: first of `[net] plugin` that loads, initializes and has a
 * device, else the built-in socket network. Reference counted. */
typedef struct {
  const ncclxNet_t* net;
  void* ctx;
  int ndev;
} ncclxNetInstance_t;
ncclxResult_t ncclxNetAcquire(const ncclxNet_t* builtin, ncclxNetInstance_t* out);
void ncclxNetRelease(void);

/* Tuner and profiler: *out = NULL when none is configured or it was refused. */
ncclxResult_t ncclxTunerAcquire(const ncclxTuner_t** out);
void ncclxTunerRelease(void);
/* The loaded tuner's optional CommFuse entry (tuner.h), or NULL: absent, another ABI
 * version, or tuner is not the loaded one. */
const ncclxTunerFuse_v1_t* pluginTunerFuse(const ncclxTuner_t* tuner);
ncclxResult_t ncclxProfilerAcquire(const ncclxProfiler_t** out);
void ncclxProfilerRelease(void);

/* dlopen plugin NAME of TYPE ("net", "module", ...): libncclx-TYPE-NAME.so on [core]
 * plugin_path, the build tree, the install dir, then the system path; a NAME with '/' is a
 * path. NULL with why set (what was tried) when it cannot be opened; path gets the file. */
void* ncclxPluginOpen(const char* type, const char* name, char* path, size_t pathSize, char* why, size_t whySize);

/* Environment handed to a plugin's init for its section ("net.ofi", "tuner.rules", ...). */
void ncclxPluginEnvFill(ncclxPluginEnv_t* env, const char* section);
/* Where the env's profiler callback sends network plugins' events (the profiler layer's
 * entry, prof.c); without one they are no-ops. */
void ncclxPluginSetNetProfiler(ncclxProfilerCallback_t sink);

/* Validation shared with tools/ncclx-net-check: NULL when fine, else why it is refused. */
const char* ncclxNetValidate(const ncclxNet_t* net);
const char* ncclxTunerValidate(const ncclxTuner_t* tuner);
const char* ncclxProfilerValidate(const ncclxProfiler_t* prof);
#endif
