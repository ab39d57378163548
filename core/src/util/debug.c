/* Logging with host, pid, thread and rank on every line; thread-local last error. */
#include "util/debug.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

static pthread_once_t logOnce = PTHREAD_ONCE_INIT;
static int logLevel = NCCLX_LOG_WARN;
static unsigned long logSubsys = NCCLX_LOG_ALL;
static char logHost[64] = "?";
static pthread_mutex_t logLock = PTHREAD_MUTEX_INITIALIZER;
/* Default TLS model, TLS descriptors (core/CMakeLists.txt): initial-exec made the library
 * impossible to dlopen in a CUDA build (see there). */
static _Thread_local int logRank = -1;
atomic_int ncclxLogLevelNow = -1;
static _Thread_local char threadError[1024];

static const struct {
  const char* name;
  unsigned long bit;
} subsysNames[] = {
    {"INIT", NCCLX_LOG_INIT}, {"COLL", NCCLX_LOG_COLL},     {"P2P", NCCLX_LOG_P2P},
    {"SHM", NCCLX_LOG_SHM},   {"NET", NCCLX_LOG_NET},       {"TUNING", NCCLX_LOG_TUNING},
    {"ENV", NCCLX_LOG_ENV},   {"ALLOC", NCCLX_LOG_ALLOC},   {"BOOTSTRAP", NCCLX_LOG_BOOTSTRAP},
    {"PLUGIN", NCCLX_LOG_PLUGIN}, {"PROFILE", NCCLX_LOG_PROFILE}, {"ALL", NCCLX_LOG_ALL},
};

/* NCCLX_DEBUG_SUBSYS=INIT,NET selects; a leading ^ inverts (everything but those). */
static unsigned long parseSubsys(const char* s) {
  int invert = (*s == '^');
  if (invert) s++;
  unsigned long mask = 0;
  char buf[256];
  snprintf(buf, sizeof(buf), "%s", s);
  for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
    for (size_t i = 0; i < sizeof(subsysNames) / sizeof(subsysNames[0]); i++)
      if (strcasecmp(tok, subsysNames[i].name) == 0) mask |= subsysNames[i].bit;
  }
  return invert ? ~mask : mask;
}

static void logInit(void) {
  const char* level = getenv("NCCLX_DEBUG");
  if (level) {
    if (strcasecmp(level, "NONE") == 0) logLevel = NCCLX_LOG_NONE;
    else if (strcasecmp(level, "WARN") == 0) logLevel = NCCLX_LOG_WARN;
    else if (strcasecmp(level, "INFO") == 0) logLevel = NCCLX_LOG_INFO;
    else if (strcasecmp(level, "TRACE") == 0) logLevel = NCCLX_LOG_TRACE;
    else fprintf(stderr, "NCCLX WARN NCCLX_DEBUG=%s is not one of NONE, WARN, INFO, TRACE; using WARN\n", level);
  }
  const char* subsys = getenv("NCCLX_DEBUG_SUBSYS");
  if (subsys) logSubsys = parseSubsys(subsys);
  atomic_store_explicit(&ncclxLogLevelNow, logLevel, memory_order_relaxed);
  if (gethostname(logHost, sizeof(logHost)) != 0) snprintf(logHost, sizeof(logHost), "?");
  logHost[sizeof(logHost) - 1] = '\0';
  char* dot = strchr(logHost, '.');
  if (dot) *dot = '\0';
}

int ncclxLogEnabled(ncclxLogLevel_t level, unsigned long subsys) {
  pthread_once(&logOnce, logInit);
  if (level == NCCLX_LOG_WARN) return logLevel >= NCCLX_LOG_WARN;
  return logLevel >= (int)level && (logSubsys & subsys) != 0;
}

void ncclxLogSetRank(int rank) { logRank = rank; }

void ncclxLog(ncclxLogLevel_t level, unsigned long subsys, const char* file, int line,
              const char* fmt, ...) {
  if (!ncclxLogEnabled(level, subsys)) return;
  char msg[2048];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof(msg), fmt, ap);
  va_end(ap);
  const char* levelName = level == NCCLX_LOG_WARN ? "WARN" : level == NCCLX_LOG_INFO ? "INFO" : "TRACE";
  char rankBuf[16] = "";
  if (logRank >= 0) snprintf(rankBuf, sizeof(rankBuf), " [%d]", logRank);
  const char* base = file ? strrchr(file, '/') : NULL;
  base = base ? base + 1 : (file ? file : "?");
  pthread_mutex_lock(&logLock);
  if (level == NCCLX_LOG_TRACE)
    fprintf(stderr, "%s:%d:%ld%s NCCLX %s %s:%d %s\n", logHost, (int)getpid(),
            (long)syscall(SYS_gettid), rankBuf, levelName, base, line, msg);
  else
    fprintf(stderr, "%s:%d:%ld%s NCCLX %s %s\n", logHost, (int)getpid(), (long)syscall(SYS_gettid),
            rankBuf, levelName, msg);
  fflush(stderr);
  pthread_mutex_unlock(&logLock);
}

static atomic_ulong errorClock;
static _Thread_local unsigned long threadErrorStamp;

unsigned long ncclxErrorStampNext(void) { return atomic_fetch_add(&errorClock, 1) + 1; }
unsigned long ncclxThreadErrorStamp(void) { return threadErrorStamp; }

ncclxResult_t ncclxSetErrorV(ncclxResult_t res, const char* fmt, va_list ap) {
  vsnprintf(threadError, sizeof(threadError), fmt, ap);
  threadErrorStamp = ncclxErrorStampNext();
  WARN("%s", threadError);
  return res;
}

ncclxResult_t ncclxSetErrorQuiet(ncclxResult_t res, const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(threadError, sizeof(threadError), fmt, ap);
  va_end(ap);
  threadErrorStamp = ncclxErrorStampNext();
  return res;
}

ncclxResult_t ncclxSetError(ncclxResult_t res, const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  ncclxSetErrorV(res, fmt, ap);
  va_end(ap);
  return res;
}

const char* ncclxThreadLastError(void) { return threadError; }
void ncclxClearThreadError(void) {
  threadError[0] = '\0';
  threadErrorStamp = 0;
}
