/* Every message of the plugin starts with "tuner rules: " so it can be told from the core's. */
#include <stdarg.h>
#include <stdio.h>

#include "rules.h"

void rulesLog(const ncclxPluginEnv_t* env, ncclxLogLevel_t level, unsigned long subsys,
              const char* fmt, ...) {
  char msg[1536];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof(msg), fmt, ap);
  va_end(ap);
  env->log(level, subsys, __FILE__, __LINE__, "tuner rules: %s", msg);
}
