/* The "trace" profiler plugin (libncclx-profiler-trace.so): Chrome traces, metrics, per
 * communicator state for fault localization, and a watchdog. Types shared by its files.
 *
 * Threads: a communicator's events arrive from one thread at a time (the core serializes
 * operations per communicator), while the watchdog thread and ncclxCommDump read its state
 * concurrently; everything a reader may see lives under TraceComm.lock (a spinlock: taking
 * and releasing it uncontended costs ~2 ns, a tenth of the two counter reads an operation
 * needs). The hot path (start/stop/state) reads the time as a raw counter stamp, copies a
 * few fields into preallocated memory and never allocates, formats or does I/O unless the
 * record ring is full: finished events go into a preallocated ring that the background
 * thread turns into spool records and metrics every flush_ms. Lock order: the global list,
 * then fileLock, then lock. */
#ifndef NCCLX_PROFILER_TRACE_H
#define NCCLX_PROFILER_TRACE_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "ncclx/profiler.h"
#include "trace_clock.h"

#define TRACE_PATH_MAX 4096
#define TRACE_RECENT 64       /* completed operations kept for dumps and mismatch checks */
#define TRACE_POOL_EVENTS 1024 /* open events per communicator (ops + their transfers) */

/* ---------------------------------------------------------------- configuration */

enum { TRACE_SUMMARY_LOG, TRACE_SUMMARY_STDERR, TRACE_SUMMARY_NONE };

typedef struct {
  char dir[TRACE_PATH_MAX];
  int mask;          /* NCCLX_PROFILE_* bits from `events` */
  int trace;         /* write the Chrome trace */
  int metrics;       /* write metrics JSON lines and the summary */
  int signal;        /* dump every communicator on SIGUSR1 */
  long watchdogMs;   /* 0 = off */
  long flushMs;      /* how often buffered trace records are written */
  long bufferEvents; /* ring capacity in records */
  int summary;       /* TRACE_SUMMARY_* */
} TraceConfig;

/* Reads [profiler.trace]; every bad value is logged with its key and where it was set.
 * Returns ncclxInvalidUsage when any value is bad. */
ncclxResult_t traceConfigLoad(TraceConfig* cfg, const ncclxPluginEnv_t* env);
/* "coll,p2p,step" for a mask. */
void traceMaskString(int mask, char* out, size_t size);

/* ---------------------------------------------------------------- names */

#define TRACE_NAMES 64       /* distinct names per communicator (ids 0 and 1 are reserved) */
#define TRACE_NAME_SLOTS 128 /* open-addressing table by string address */

typedef struct {
  const char* ptr; /* the core's string: interned by address */
  uint8_t len;
  char text[31];   /* JSON-safe copy */
} TraceName;

typedef struct {
  TraceName names[TRACE_NAMES];
  uint8_t bySlot[TRACE_NAME_SLOTS];
  int n;
  const char* lastPtr[8]; /* per call site: the last string seen and its id */
  uint8_t lastId[8];
} TraceNames;

_Static_assert(TRACE_NAMES <= 64, "the spool marks defined names in a 64-bit mask");
void traceNamesInit(TraceNames* t);
/* Id of a name (0 for NULL, 1 when the table is full); call with the communicator's lock. */
uint8_t traceNameId(TraceNames* t, const char* s);
/* The same, remembering the last answer for call site `site` (0..7): a training loop passes
 * the same strings call after call. */
static inline uint8_t traceNameIdAt(TraceNames* t, int site, const char* s) {
  if (s == t->lastPtr[site] && s) return t->lastId[site];
  uint8_t id = traceNameId(t, s);
  t->lastPtr[site] = s;
  t->lastId[site] = id;
  return id;
}
static inline const char* traceNameText(const TraceNames* t, uint8_t id) { return t->names[id].text; }

/* ---------------------------------------------------------------- records */

/* One finished event, as written to the trace. STEP records carry their parent's func and
 * seq so that a transfer can be read without its operation; NET records (a network plugin's
 * own events) carry their operation's func and seq, their STEP's peer, direction, bytes and
 * index when nested under one, and the plugin's id in `count`. The layout is also the spool
 * file's record format (64 bytes, little-endian; tools/ncclx-analyze decodes it). */
typedef struct {
  uint64_t seq;
  uint64_t startNs, endNs; /* CLOCK_MONOTONIC in the spool; raw stamps (trace_clock.h) in memory */
  uint64_t bytes, count;
  int type;  /* NCCLX_PROFILE_* */
  int peer;  /* P2P and STEP; -1 otherwise */
  int root;  /* COLL; -1 when none */
  int step;  /* STEP: index within the operation's step */
  uint8_t isSend, failed;
  /* TraceNames ids */
  uint8_t func;
  uint8_t dtype;
  uint8_t op;
  uint8_t algo; /* STEP: the transport */
  uint8_t proto;
  uint8_t parent; /* NET: NCCLX_PROFILE_* type of the parent event, 0 when none */
} TraceRecord;
_Static_assert(sizeof(TraceRecord) == 64, "TraceRecord is the spool's record format");

/* An event between start and stop; its address is the handle given to the core. */
typedef struct TraceEvent {
  struct TraceComm* comm;
  struct TraceEvent* nextFree;
  int inUse;
  size_t done;   /* STEP: bytes done so far */
  int posted;    /* STEP: the transport has the request */
  TraceRecord rec;
} TraceEvent;

/* ---------------------------------------------------------------- metrics */

#define TRACE_LAT_BUCKETS 512 /* 8 per power of two of nanoseconds */
#define TRACE_SIZE_BUCKETS 48 /* bucket b holds sizes in (2^(b-1), 2^b]; 0 holds 0 bytes */
#define TRACE_MAX_FUNCS 16

typedef struct {
  uint64_t count, bytes, sumNs, minNs, maxNs;
  uint32_t hist[TRACE_LAT_BUCKETS];
} TraceStats;

typedef struct {
  uint8_t nameId;
  char name[32];
  TraceStats* bySize[TRACE_SIZE_BUCKETS]; /* allocated on the first call of that size */
} TraceFuncStats;

typedef struct {
  TraceFuncStats funcs[TRACE_MAX_FUNCS];
  int nfuncs;
  uint64_t untracked; /* calls of functions beyond TRACE_MAX_FUNCS */
} TraceMetrics;

void traceMetricsAdd(TraceMetrics* m, uint8_t funcId, const char* func, size_t bytes, uint64_t ns);
void traceMetricsFree(TraceMetrics* m);
/* JSON lines to `path` and the readable summary (per cfg->summary); call at finalize. */
void traceMetricsReport(struct TraceComm* c);
/* Nanoseconds at percentile p (0..1) of a histogram (upper edge of the bucket, capped at max). */
uint64_t traceStatsPercentile(const TraceStats* s, double p);
/* nccl-tests bus bandwidth factor for a collective name ("allreduce": 2(n-1)/n, ...). */
double traceBusFactor(const char* func, int nranks);

/* ---------------------------------------------------------------- communicator */

typedef struct {
  uint64_t expected, posted, done;
} TracePeerDir;

typedef struct {
  uint64_t epoch; /* == TraceComm.epoch when touched by the current operation */
  TracePeerDir send, recv;
} TracePeer;

typedef struct TraceComm {
  TraceConfig cfg;
  ncclxPluginEnv_t env; /* copied: the core's env lives on its stack during init */
  uint64_t commHash;
  char commName[64];
  char host[64];
  int rank, nranks, nhosts, pid;
  int64_t realOffsetNs; /* CLOCK_REALTIME - CLOCK_MONOTONIC at init */
  TraceNames names;     /* appended under `lock`; entries never change once written */

  /* Lockless writing, for communicators that record operations only (events = coll, p2p):
   * then every event comes from the thread running the communicator's operation, which the
   * core serializes, so writers skip `lock` and mark their changes in `wseq` (odd while
   * writing); readers still take `lock` against each other and retry a snapshot that
   * overlapped a change. With step, net or group events on, writers take `lock`. */
  int lockless;
  int accept; /* event types recorded: the configured ones and the operations (their parents) */
  uint64_t wseq;
  int readerWaiting; /* a reader asks lockless writers to hold off (bounded) */

  int lock; /* traceLock: everything below, down to `fileLock` */
  TraceEvent* pool;
  TraceEvent* freeList;
  uint64_t droppedEvents;
  /* Finished records for the spool and the metrics (allocated when either is on): one
   * producer (the thread holding `lock`), one consumer (the thread holding `fileLock`); head
   * and tail are published with release/acquire, so the consumer copies records out without
   * taking `lock`. */
  TraceRecord* ring;
  uint64_t ringHead, ringTail; /* produced, consumed; ring index = n & ringMask */
  uint64_t ringMask;           /* capacity - 1: buffer_events rounded up to a power of two */
  uint64_t droppedRecords;
  int opsInFlight;
  uint64_t epoch; /* bumps when an operation starts with nothing else in flight */
  /* The operation that started the epoch (its per-peer counters): a few fields, not a copy
   * of the record (a copy would reread stores still in flight and stall the hot path). */
  int epochType;
  uint8_t epochFunc;
  uint64_t epochSeq;
  TracePeer* peers;
  uint64_t lastProgress; /* stamp (trace_clock.h) */
  uint64_t collStarted, collDone, p2pStarted, p2pDone; /* seq numbers */
  uint64_t nrecent; /* here, not after recent[]: on a cache line the hot path touches anyway */
  uint64_t collFailed, p2pFailed;                      /* seq of the last failure */
  char lastError[512];
  TraceRecord recent[TRACE_RECENT]; /* completed top-level ops, oldest overwritten */
  uint64_t watchdogKey; /* epoch already reported stuck (one dump per stuck op) */

  pthread_mutex_t fileLock; /* the spool file, the ring's consumer side, outBuf, metrics */
  TraceMetrics metrics;     /* fed from the ring by traceDrain */
  int spoolFd;
  int traceBroken;       /* a write failed: the trace is off for this communicator */
  uint64_t namesSpooled; /* bit per name id already defined in the spool (TRACE_NAMES <= 64) */
  char spoolPath[TRACE_PATH_MAX];
  void* outBuf;          /* TraceBuf reused by every drain and the JSON conversion */
  /* JSON conversion at finalize (one thread): */
  uint64_t traceEvents; /* lines written after the header */
  uint64_t* trackEnd;   /* per track: end of its last slice (ns), 0 = not named yet */

  struct TraceComm* next; /* in the process-wide list */
} TraceComm;

/* The communicator lock: a spinlock, because the hot path takes it twice per operation and
 * every holder only copies a few fields (dumps build their text under it, rarely). Waiters
 * spin briefly, then yield the CPU until it is free. */
void traceLockWait(int* lock);
static inline void traceLock(TraceComm* c) {
  while (__atomic_exchange_n(&c->lock, 1, __ATOMIC_ACQUIRE)) traceLockWait(&c->lock);
}
static inline void traceUnlock(TraceComm* c) { __atomic_store_n(&c->lock, 0, __ATOMIC_RELEASE); }

/* Writers (the hot path): the lock, or for a lockless communicator the sequence counter. */
void traceWriterPause(TraceComm* c);
static inline void traceWriteBegin(TraceComm* c) {
  if (!c->lockless) {
    traceLock(c);
    return;
  }
  if (__builtin_expect(__atomic_load_n(&c->readerWaiting, __ATOMIC_RELAXED), 0)) traceWriterPause(c);
  __atomic_store_n(&c->wseq, __atomic_load_n(&c->wseq, __ATOMIC_RELAXED) + 1, __ATOMIC_RELAXED);
  __atomic_thread_fence(__ATOMIC_RELEASE); /* the odd count is visible before any change */
}
static inline void traceWriteEnd(TraceComm* c) {
  if (!c->lockless) {
    traceUnlock(c);
    return;
  }
  __atomic_store_n(&c->wseq, __atomic_load_n(&c->wseq, __ATOMIC_RELAXED) + 1, __ATOMIC_RELEASE);
}

/* Readers (dumps, the watchdog):
 *
 *   uint64_t seq = traceReadBegin(c);
 *   for (int attempt = 0;; attempt++) { read...; if (!traceReadRetry(c, &seq, attempt)) break; }
 *   traceReadEnd(c);
 *
 * Begin takes `lock` and, for a lockless communicator, asks its writer to pause and waits
 * (bounded) until it is between events. Retry says whether the snapshot overlapped a write;
 * after a few tries it keeps the last one. */
uint64_t traceReadBegin(TraceComm* c);
int traceReadRetry(TraceComm* c, uint64_t* seq, int attempt);
void traceReadEnd(TraceComm* c);

/* "profiler trace: ..." through the core's logger. */
void traceLog(const ncclxPluginEnv_t* env, ncclxLogLevel_t level, const char* fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* mkdir -p; 0, or -1 with the failing path and reason in `why`. */
int traceMakeDir(const char* dir, char* why, size_t whySize);

/* ---------------------------------------------------------------- output */

/* While the communicator lives, finished records go to a binary spool file
 * (trace-<hash>-rank<R>.spool: fixed-size records, a few bytes of copying each, so the
 * background thread barely competes with the ranks for the CPU); at finalize the spool
 * becomes the Chrome trace (trace-<hash>-rank<R>.json) and is removed. A rank that dies
 * leaves its spool, which tools/ncclx-analyze reads and `merge` converts. */
/* Creates the spool and writes its header; -1 with a logged reason on failure. */
int traceFileOpen(TraceComm* c);
/* Consumes every buffered record: adds finished operations to the metrics and appends the
 * records to the spool (the background thread, a full ring, dumps, finalize). */
void traceDrain(TraceComm* c);
/* Closes the spool and converts it to the JSON trace. */
void traceFileClose(TraceComm* c);
/* The JSON conversion (trace_output.c); 0 or -1 (logged, the spool is kept). */
int traceJsonFromSpool(TraceComm* c);
/* "dir/<prefix>-<hash>-rank<R>.<ext>" */
void tracePathFor(const TraceComm* c, const char* prefix, const char* ext, char* out, size_t size);

/* The communicator's state as JSON (the ncclxCommDump, watchdog and SIGUSR1 format).
 * `reason` goes into the file. Returns 0, or -1 when the file cannot be written. */
int traceDumpWrite(TraceComm* c, const char* path, const char* reason);

/* ---------------------------------------------------------------- process-wide */

/* Registers a communicator: starts the watchdog thread and the SIGUSR1 handler with the
 * first one. Returns 0 or -1 (logged). */
int traceGlobalAdd(TraceComm* c);
/* Unregisters; the last one stops and joins the thread and restores SIGUSR1. */
void traceGlobalRemove(TraceComm* c);
/* Asks the writer thread to drain soon (the ring is half full). Async-signal-safe. */
void traceGlobalWake(void);
/* Watchdog check of one communicator; runs on the watchdog thread (`now` is a stamp). */
void traceWatchdogCheck(TraceComm* c, uint64_t now);

#endif
