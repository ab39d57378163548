/* Clock, logging, directories and file names for the trace plugin. */
#include <errno.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "trace.h"

void traceLockWait(int* lock) {
  for (int i = 0; __atomic_load_n(lock, __ATOMIC_RELAXED); i++) {
    if (i >= 200) sched_yield();
#if defined(__x86_64__) || defined(__i386__)
    else __builtin_ia32_pause();
#elif defined(__aarch64__)
    else __asm__ volatile("yield");
#endif
  }
}

void traceLog(const ncclxPluginEnv_t* env, ncclxLogLevel_t level, const char* fmt, ...) {
  char msg[1536];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof(msg), fmt, ap);
  va_end(ap);
  env->log(level, NCCLX_LOG_PROFILE, __FILE__, __LINE__, "profiler trace: %s", msg);
}

static int makeOne(const char* path, char* why, size_t whySize) {
  if (mkdir(path, 0755) == 0 || errno == EEXIST) {
    struct stat st;
    if (stat(path, &st) == 0 && S_ISDIR(st.st_mode)) return 0;
    snprintf(why, whySize, "%s exists and is not a directory", path);
    return -1;
  }
  snprintf(why, whySize, "cannot create %s: %s", path, strerror(errno));
  return -1;
}

int traceMakeDir(const char* dir, char* why, size_t whySize) {
  char path[TRACE_PATH_MAX];
  if ((size_t)snprintf(path, sizeof(path), "%s", dir) >= sizeof(path)) {
    snprintf(why, whySize, "directory name too long");
    return -1;
  }
  for (char* p = path + 1; *p; p++) {
    if (*p != '/') continue;
    *p = '\0';
    int rc = makeOne(path, why, whySize);
    *p = '/';
    if (rc != 0) return -1;
  }
  if (makeOne(path, why, whySize) != 0) return -1;
  if (access(path, W_OK | X_OK) != 0) {
    snprintf(why, whySize, "%s is not writable: %s", path, strerror(errno));
    return -1;
  }
  return 0;
}

void tracePathFor(const TraceComm* c, const char* prefix, const char* ext, char* out, size_t size) {
  snprintf(out, size, "%s/%s-%016llx-rank%d.%s", c->cfg.dir, prefix, (unsigned long long)c->commHash,
           c->rank, ext);
}
