/* ncclx.ini: located, parsed with inih, overridden by NCCLX_<SECTION>_<KEY> variables.
 * Search order: $NCCLX_CONF_FILE, ./ncclx.ini, ~/.ncclx.ini, /etc/ncclx.ini; none found
 * means built-in defaults. Loaded once per process, on first use. */
#ifndef NCCLX_CONFIG_H
#define NCCLX_CONFIG_H

#include <stddef.h>

#include "ncclx/plugin.h"

/* Parse the file (once). Syntax errors and bad values of core keys fail with
 * ncclxInvalidUsage and a message naming file, line and key; unknown keys in core sections
 * are warnings. Plugin sections ([net.*], [tuner.*], [profiler.*]) are left to plugins. */
ncclxResult_t ncclxConfigLoad(void);
/* Path of the file in use, or "(built-in defaults)". */
const char* ncclxConfigSource(void);

/* The largest `[net] device` index: checked when the file loads and when it is read. */
#define NCCLX_NET_DEVICE_MAX (1 << 20)

/* Raw lookups: environment override first, then the file, then NULL. */
const char* ncclxConfigGet(const char* section, const char* key);
/* Typed lookups with the default when unset; a malformed value is an error naming where it
 * came from. */
ncclxResult_t ncclxConfigGetInt(const char* section, const char* key, long def, long min,
                                long max, long* out);
ncclxResult_t ncclxConfigGetBool(const char* section, const char* key, int def, int* out);
ncclxResult_t ncclxConfigGetSize(const char* section, const char* key, size_t def, size_t* out); /* accepts K/M/G */

/* For plugins: a handle on one section and the accessor table. Never NULL. */
const ncclxConfigSection_t* ncclxConfigSection(const char* section);
extern const ncclxConfigApi_t ncclxConfigApi;

/* Tests: forget the parsed file so the next ncclxConfigLoad re-reads it. */
void ncclxConfigReset(void);
#endif
