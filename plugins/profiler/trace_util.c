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

#define PAUSE_NS 50000000ull /* a lockless writer waits for a reader at most 50 ms */
#define READ_TRIES 8

static uint64_t monoNs(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
}

static void relax(int i) {
  if (i >= 200) sched_yield();
#if defined(__x86_64__) || defined(__i386__)
  else __builtin_ia32_pause();
#elif defined(__aarch64__)
  else __asm__ volatile("yield");
#endif
}

void traceWriterPause(TraceComm* c) {
  uint64_t t0 = monoNs();
  for (int i = 0; __atomic_load_n(&c->readerWaiting, __ATOMIC_RELAXED); i++) {
    if ((i & 63) == 63 && monoNs() - t0 > PAUSE_NS) return; /* the reader retries instead */
    relax(i);
  }
}

/* The writers' count once even (a writer between events), or the last seen after 50 ms. */
static uint64_t evenSeq(TraceComm* c) {
  uint64_t t0 = monoNs(), s;
  for (int i = 0; (s = __atomic_load_n(&c->wseq, __ATOMIC_ACQUIRE)) & 1; i++) {
    if ((i & 63) == 63 && monoNs() - t0 > PAUSE_NS) break;
    relax(i);
  }
  return s;
}

uint64_t traceReadBegin(TraceComm* c) {
  traceLock(c);
  if (!c->lockless) return 0;
  __atomic_store_n(&c->readerWaiting, 1, __ATOMIC_RELAXED);
  return evenSeq(c);
}

int traceReadRetry(TraceComm* c, uint64_t* seq, int attempt) {
  if (!c->lockless) return 0;
  __atomic_thread_fence(__ATOMIC_ACQUIRE); /* the snapshot's reads happen before this check */
  if (__atomic_load_n(&c->wseq, __ATOMIC_RELAXED) == *seq || attempt + 1 >= READ_TRIES) return 0;
  *seq = evenSeq(c);
  return 1;
}

void traceReadEnd(TraceComm* c) {
  if (c->lockless) __atomic_store_n(&c->readerWaiting, 0, __ATOMIC_RELAXED);
  traceUnlock(c);
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
