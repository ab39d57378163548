/* Logging and error messages. NCCLX_DEBUG=WARN|INFO|TRACE, NCCLX_DEBUG_SUBSYS=INIT,NET,... */
#ifndef NCCLX_DEBUG_H
#define NCCLX_DEBUG_H

#include <stdarg.h>
#include <stdatomic.h>

#include "ncclx/plugin.h"

/* The logger handed to plugins; also what the macros below call. Lines look like
 * "host:pid:tid [rank] NCCLX WARN message". */
void ncclxLog(ncclxLogLevel_t level, unsigned long subsys, const char* file, int line,
              const char* fmt, ...) __attribute__((format(printf, 5, 6)));
/* Rank shown in this thread's log lines (-1: none). Set at API entry and in stream threads. */
void ncclxLogSetRank(int rank);
int ncclxLogEnabled(ncclxLogLevel_t level, unsigned long subsys);

/* The NCCLX_DEBUG level once read (-1 before): INFO and TRACE lines below it cost one load and
 * a branch, with their arguments not even evaluated (small calls have TRACE lines). */
extern atomic_int ncclxLogLevelNow;
static inline int ncclxLogMayPrint(int level) {
  int now = atomic_load_explicit(&ncclxLogLevelNow, memory_order_relaxed);
  return now < 0 || now >= level;
}

#define WARN(...) ncclxLog(NCCLX_LOG_WARN, NCCLX_LOG_ALL, __FILE__, __LINE__, __VA_ARGS__)
#define INFO(subsys, ...) \
  (ncclxLogMayPrint(NCCLX_LOG_INFO) ? ncclxLog(NCCLX_LOG_INFO, (subsys), __FILE__, __LINE__, __VA_ARGS__) : (void)0)
#define TRACE(subsys, ...) \
  (ncclxLogMayPrint(NCCLX_LOG_TRACE) ? ncclxLog(NCCLX_LOG_TRACE, (subsys), __FILE__, __LINE__, __VA_ARGS__) : (void)0)

/* The calling thread's last error message (what ncclxGetLastError(NULL) returns).
 * ncclxSetError also logs it at WARN. Both return `res` so callers can write
 * `return ncclxSetError(ncclxInvalidArgument, "count %zu too large", n);` */
ncclxResult_t ncclxSetError(ncclxResult_t res, const char* fmt, ...) __attribute__((format(printf, 2, 3)));
ncclxResult_t ncclxSetErrorV(ncclxResult_t res, const char* fmt, va_list ap);
/* The same without the WARN line: a part of a sentence its caller completes and reports. */
ncclxResult_t ncclxSetErrorQuiet(ncclxResult_t res, const char* fmt, ...) __attribute__((format(printf, 2, 3)));
const char* ncclxThreadLastError(void);
void ncclxClearThreadError(void);
/* Errors are stamped from one process-wide clock, so ncclxGetLastError(comm) can tell which
 * of the communicator's last failure and the calling thread's last error is newer. */
unsigned long ncclxErrorStampNext(void);
unsigned long ncclxThreadErrorStamp(void); /* 0: none since the last clear */

#define NCCLX_CHECK(call)                         \
  do {                                            \
    ncclxResult_t ncclx_res_ = (call);            \
    if (ncclx_res_ != ncclxSuccess) return ncclx_res_; \
  } while (0)

#endif
