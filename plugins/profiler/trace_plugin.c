/* The profiler ABI entry points of the "trace" plugin. startEvent, stopEvent and
 * recordEventState are the hot path: a counter read, the communicator's spinlock (none when
 * it records operations only, see trace.h) and a few copies into preallocated memory;
 * metrics, time conversion and formatting happen when the background thread drains the
 * record ring, and no I/O unless the ring is full. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "trace.h"
#include "trace_buf.h"

/* Bounded copy; the core's names are short static strings. */
static inline void copyName(char* dst, size_t size, const char* src) {
  size_t i = 0;
  if (src)
    for (; i + 1 < size && src[i]; i++) dst[i] = src[i];
  dst[i] = '\0';
}

static int64_t realOffsetNs(void) {
  struct timespec rt;
  clock_gettime(CLOCK_REALTIME, &rt);
  uint64_t mono = traceMonoNs();
  return (int64_t)((uint64_t)rt.tv_sec * 1000000000ull + (uint64_t)rt.tv_nsec) - (int64_t)mono;
}

static void commFree(TraceComm* c) {
  if (!c) return;
  free(c->pool);
  free(c->ring);
  free(c->peers);
  free(c->trackEnd);
  if (c->outBuf) tbFree(c->outBuf);
  free(c->outBuf);
  traceMetricsFree(&c->metrics);
  free(c);
}

static ncclxResult_t commAlloc(TraceComm* c) {
  size_t ring = 64;
  while (ring < (size_t)c->cfg.bufferEvents) ring *= 2; /* a mask, not a division, per record */
  c->ringMask = ring - 1;
  c->pool = calloc(TRACE_POOL_EVENTS, sizeof(*c->pool));
  int buffered = c->cfg.trace || c->cfg.metrics;
  /* Cache-line aligned: a record is one line, so the writer and the draining thread share
   * a line only when they touch the same record. */
  c->ring = buffered ? aligned_alloc(64, ring * sizeof(*c->ring)) : NULL;
  if (c->ring) memset(c->ring, 0, ring * sizeof(*c->ring));
  c->peers = calloc((size_t)c->nranks, sizeof(*c->peers));
  c->trackEnd = calloc(4 * (size_t)c->nranks + 2, sizeof(*c->trackEnd)); /* see trace_output.c */
  c->outBuf = calloc(1, sizeof(TraceBuf));
  if (!c->pool || !c->peers || !c->trackEnd || !c->outBuf || (buffered && !c->ring))
    return ncclxSystemError;
  for (int i = TRACE_POOL_EVENTS - 1; i >= 0; i--) {
    c->pool[i].comm = c;
    c->pool[i].nextFree = c->freeList;
    c->freeList = &c->pool[i];
  }
  return ncclxSuccess;
}

static ncclxResult_t traceInit(void** ctx, const ncclxProfilerCommInfo_v1_t* info, int* mask,
                               const ncclxPluginEnv_t* env) {
  if (!ctx || !info || !mask || !env || env->version < 1 || !env->log || !env->config)
    return ncclxInvalidArgument;
  *ctx = NULL;
  if (info->nranks < 1 || info->rank < 0 || info->rank >= info->nranks) {
    traceLog(env, NCCLX_LOG_WARN, "rank %d of %d is not a valid rank", info->rank, info->nranks);
    return ncclxInvalidArgument;
  }
  TraceComm* c = calloc(1, sizeof(*c));
  if (!c) return ncclxSystemError;
  c->env = *env;
  c->commHash = info->commHash;
  c->rank = info->rank;
  c->nranks = info->nranks;
  c->nhosts = info->nhosts;
  c->pid = info->pid;
  c->spoolFd = -1;
  copyName(c->commName, sizeof(c->commName), info->commName);
  copyName(c->host, sizeof(c->host), info->hostname ? info->hostname : "?");
  traceClockInit();
  c->realOffsetNs = realOffsetNs();
  traceNamesInit(&c->names);
  if (traceConfigLoad(&c->cfg, env) != ncclxSuccess) {
    traceLog(env, NCCLX_LOG_WARN, "disabled for comm %016llx rank %d: fix the [profiler.trace] settings above",
             (unsigned long long)c->commHash, c->rank);
    commFree(c);
    return ncclxInvalidUsage;
  }
  c->lockless = !(c->cfg.mask & (NCCLX_PROFILE_STEP | NCCLX_PROFILE_NET | NCCLX_PROFILE_GROUP));
  c->accept = c->cfg.mask | NCCLX_PROFILE_COLL | NCCLX_PROFILE_P2P;
  char why[TRACE_PATH_MAX + 128];
  if (traceMakeDir(c->cfg.dir, why, sizeof(why)) != 0) {
    traceLog(env, NCCLX_LOG_WARN, "[profiler.trace] dir = '%s': %s; disabled for comm %016llx rank %d",
             c->cfg.dir, why, (unsigned long long)c->commHash, c->rank);
    commFree(c);
    return ncclxSystemError;
  }
  if (commAlloc(c) != ncclxSuccess) {
    traceLog(env, NCCLX_LOG_WARN, "out of memory for %ld buffered events and %d peers", c->cfg.bufferEvents,
             c->nranks);
    commFree(c);
    return ncclxSystemError;
  }
  pthread_mutex_init(&c->fileLock, NULL);
  if ((c->cfg.trace && traceFileOpen(c) != 0) || traceGlobalAdd(c) != 0) {
    traceFileClose(c);
    pthread_mutex_destroy(&c->fileLock);
    commFree(c);
    return ncclxSystemError;
  }
  __atomic_store_n(mask, c->cfg.mask, __ATOMIC_RELAXED);
  char events[64];
  traceMaskString(c->cfg.mask, events, sizeof(events));
  traceLog(env, NCCLX_LOG_INFO, "comm %016llx rank %d/%d: events %s, trace %s, metrics %s, watchdog %ld ms, dir %s",
           (unsigned long long)c->commHash, c->rank, c->nranks, events, c->cfg.trace ? "on" : "off",
           c->cfg.metrics ? "on" : "off", c->cfg.watchdogMs, c->cfg.dir);
  *ctx = c;
  return ncclxSuccess;
}

/* The per-peer counters belong to the operation in flight: reset lazily by epoch. */
static TracePeerDir* peerDir(TraceComm* c, int peer, int isSend, int touch) {
  if (peer < 0 || peer >= c->nranks) return NULL;
  TracePeer* p = &c->peers[peer];
  if (p->epoch != c->epoch) {
    if (!touch) return NULL;
    memset(p, 0, sizeof(*p));
    p->epoch = c->epoch;
  }
  return isSend ? &p->send : &p->recv;
}

static void topLevelStart(TraceComm* c, const TraceRecord* r, uint64_t now) {
  if (c->opsInFlight++ == 0) {
    c->epoch++;
    c->epochType = r->type;
    c->epochFunc = r->func;
    c->epochSeq = r->seq;
  }
  c->lastProgress = now;
}

/* The handle as one of this communicator's open events, or NULL (the core passes back
 * what startEvent returned; anything else is ignored rather than dereferenced). */
static const TraceEvent* ownEvent(const TraceComm* c, const void* handle) {
  const TraceEvent* e = handle;
  if (!e || e < c->pool || e >= c->pool + TRACE_POOL_EVENTS || !e->inUse) return NULL;
  return e;
}

static ncclxResult_t traceStart(void* ctx, void** eHandle, const ncclxProfilerEventDescr_v1_t* d) {
  if (!eHandle) return ncclxInvalidArgument;
  *eHandle = NULL;
  TraceComm* c = ctx;
  if (!c || !d) return ncclxInvalidArgument;
  /* The activation mask is process-wide: drop the types this communicator was not set up
   * for (operations always count: they are the parents the core sends with any type). A
   * lockless communicator must never see a step, net or group event. */
  if (!(d->type & c->accept)) return ncclxSuccess;
  uint64_t now = traceStamp();
  traceWriteBegin(c);
  TraceEvent* e = c->freeList;
  if (!e) {
    c->droppedEvents++;
    traceWriteEnd(c);
    return ncclxSuccess;
  }
  c->freeList = e->nextFree;
  e->inUse = 1;
  e->done = 0;
  e->posted = 0;
  TraceRecord* r = &e->rec;
  memset(r, 0, sizeof(*r));
  r->type = d->type;
  r->startNs = now;
  r->peer = r->root = -1;
  switch (d->type) {
    case NCCLX_PROFILE_COLL:
      r->seq = d->coll.seq;
      r->count = d->coll.count;
      r->bytes = d->coll.bytes;
      r->root = d->coll.root;
      r->func = traceNameIdAt(&c->names, 0, d->coll.func);
      r->dtype = traceNameIdAt(&c->names, 1, d->coll.datatype);
      r->op = traceNameIdAt(&c->names, 2, d->coll.op);
      r->algo = traceNameIdAt(&c->names, 3, d->coll.algo);
      r->proto = traceNameIdAt(&c->names, 4, d->coll.proto);
      if (r->seq > c->collStarted) c->collStarted = r->seq;
      topLevelStart(c, r, now);
      break;
    case NCCLX_PROFILE_P2P:
      r->seq = d->p2p.seq;
      r->count = d->p2p.count;
      r->bytes = d->p2p.bytes;
      r->peer = d->p2p.peer;
      r->isSend = d->p2p.func && d->p2p.func[0] == 'S';
      r->func = traceNameIdAt(&c->names, 5, d->p2p.func);
      r->dtype = traceNameIdAt(&c->names, 1, d->p2p.datatype);
      if (r->seq > c->p2pStarted) c->p2pStarted = r->seq;
      topLevelStart(c, r, now);
      break;
    case NCCLX_PROFILE_STEP: {
      const TraceEvent* parent = ownEvent(c, d->parent);
      if (parent) {
        r->seq = parent->rec.seq;
        r->func = parent->rec.func;
      }
      r->peer = d->step.peer;
      r->isSend = (uint8_t)(d->step.isSend != 0);
      r->bytes = d->step.bytes;
      r->step = d->step.step;
      r->algo = traceNameIdAt(&c->names, 6, d->step.transport);
      TracePeerDir* pd = peerDir(c, r->peer, r->isSend, 1);
      if (pd) pd->expected += r->bytes;
      c->lastProgress = now;
      break;
    }
    case NCCLX_PROFILE_GROUP:
      r->func = traceNameId(&c->names, "group");
      r->count = (size_t)d->group.depth;
      break;
    case NCCLX_PROFILE_NET: {
      const TraceEvent* parent = ownEvent(c, d->parent);
      r->count = (uint64_t)d->net.pluginId;
      if (parent) {
        const TraceRecord* pr = &parent->rec;
        r->parent = (uint8_t)pr->type;
        r->seq = pr->seq;
        r->func = pr->func;
        if (pr->type == NCCLX_PROFILE_STEP || pr->type == NCCLX_PROFILE_P2P) {
          r->peer = pr->peer;
          r->isSend = pr->isSend;
        }
        if (pr->type == NCCLX_PROFILE_STEP) r->bytes = pr->bytes, r->step = pr->step;
      }
      c->lastProgress = now;
      break;
    }
    default:
      r->func = traceNameId(&c->names, "?");
      break;
  }
  traceWriteEnd(c);
  *eHandle = e;
  return ncclxSuccess;
}

static ncclxResult_t traceState(void* eHandle, ncclxProfilerState_t state,
                                const ncclxProfilerStateArgs_v1_t* args) {
  TraceEvent* e = eHandle;
  if (!e || !args) return ncclxSuccess;
  TraceComm* c = e->comm;
  uint64_t now = traceStamp();
  traceWriteBegin(c);
  TraceRecord* r = &e->rec;
  if (r->type == NCCLX_PROFILE_STEP && (state == NCCLX_PROFILE_STATE_POSTED || state == NCCLX_PROFILE_STATE_PROGRESS)) {
    TracePeerDir* pd = peerDir(c, r->peer, r->isSend, 0);
    if (state == NCCLX_PROFILE_STATE_POSTED && !e->posted) {
      e->posted = 1;
      if (pd) pd->posted += r->bytes;
    } else if (state == NCCLX_PROFILE_STATE_PROGRESS && args->bytes > e->done) {
      if (pd) pd->done += args->bytes - e->done;
      e->done = args->bytes;
    }
    c->lastProgress = now;
  } else if (r->type == NCCLX_PROFILE_NET && state == NCCLX_PROFILE_STATE_PROGRESS) {
    c->lastProgress = now;
  } else if (state == NCCLX_PROFILE_STATE_FAILED) {
    r->failed = 1;
    if (args->message && args->message[0]) copyName(c->lastError, sizeof(c->lastError), args->message);
    if (r->type == NCCLX_PROFILE_COLL) c->collFailed = r->seq;
    if (r->type == NCCLX_PROFILE_P2P) c->p2pFailed = r->seq;
  }
  traceWriteEnd(c);
  return ncclxSuccess;
}

/* Queue a finished record for the drain (inside traceWriteBegin/End; may drop and retake
 * the lock). */
static void pushRecord(TraceComm* c, const TraceRecord* r, uint64_t endStamp) {
  uint64_t cap = c->ringMask + 1;
  uint64_t head = c->ringHead; /* only the writer stores it */
  if (head - __atomic_load_n(&c->ringTail, __ATOMIC_ACQUIRE) >= cap) {
    /* The background thread fell behind: drain here rather than lose records (a drain takes
     * fileLock, which comes before the lock in the lock order; a lockless writer holds no
     * lock, and readers never wait for fileLock while they wait for it). */
    if (c->lockless) {
      traceDrain(c);
    } else {
      traceUnlock(c);
      traceDrain(c);
      traceLock(c);
    }
    head = c->ringHead;
    if (head - __atomic_load_n(&c->ringTail, __ATOMIC_ACQUIRE) >= cap) {
      c->droppedRecords++;
      return;
    }
  }
  TraceRecord* slot = &c->ring[head & c->ringMask];
  *slot = *r;
  slot->endNs = endStamp;
  __atomic_store_n(&c->ringHead, head + 1, __ATOMIC_RELEASE);
  if (head + 1 - __atomic_load_n(&c->ringTail, __ATOMIC_RELAXED) == cap / 2) traceGlobalWake();
}

static ncclxResult_t traceStop(void* eHandle) {
  TraceEvent* e = eHandle;
  if (!e) return ncclxSuccess;
  TraceComm* c = e->comm;
  uint64_t now = traceStamp();
  traceWriteBegin(c);
  TraceRecord* r = &e->rec;
  /* endNs goes into the copies only: storing it into *r just before copying *r would make
   * the copy wait for that store (a store-forwarding stall). */
  if (r->type == NCCLX_PROFILE_COLL || r->type == NCCLX_PROFILE_P2P) {
    if (c->opsInFlight > 0) c->opsInFlight--;
    if (!r->failed) {
      uint64_t* last = r->type == NCCLX_PROFILE_COLL ? &c->collDone : &c->p2pDone;
      if (r->seq > *last) *last = r->seq;
    }
    TraceRecord* done = &c->recent[c->nrecent++ % TRACE_RECENT];
    *done = *r;
    done->endNs = now;
  } else if (r->type == NCCLX_PROFILE_STEP || r->type == NCCLX_PROFILE_NET) {
    c->lastProgress = now;
  }
  if (c->ring) pushRecord(c, r, now); /* metrics and the trace come from the ring */
  e->inUse = 0;
  e->nextFree = c->freeList;
  c->freeList = e;
  traceWriteEnd(c);
  return ncclxSuccess;
}

static ncclxResult_t traceFinalize(void* ctx) {
  TraceComm* c = ctx;
  if (!c) return ncclxSuccess;
  traceGlobalRemove(c); /* from here on no other thread looks at c */
  traceDrain(c);
  traceFileClose(c);
  if (c->cfg.metrics) traceMetricsReport(c);
  if (c->droppedEvents || c->droppedRecords)
    traceLog(&c->env, NCCLX_LOG_WARN,
             "comm %016llx rank %d: %llu events dropped (more than %d open at once), %llu trace records "
             "dropped (raise buffer_events)",
             (unsigned long long)c->commHash, c->rank, (unsigned long long)c->droppedEvents,
             TRACE_POOL_EVENTS, (unsigned long long)c->droppedRecords);
  pthread_mutex_destroy(&c->fileLock);
  commFree(c);
  return ncclxSuccess;
}

static ncclxResult_t traceDump(void* ctx, const char* path) {
  TraceComm* c = ctx;
  if (!c || !path) return ncclxInvalidArgument;
  traceDrain(c); /* the trace on disk then matches the dump */
  return traceDumpWrite(c, path, "ncclxCommDump") == 0 ? ncclxSuccess : ncclxSystemError;
}

__attribute__((visibility("default"))) const ncclxProfiler_v1_t ncclxProfilerPlugin_v1 = {
    .name = "trace",
    .abiVersion = NCCLX_PROFILER_ABI_VERSION,
    .init = traceInit,
    .startEvent = traceStart,
    .stopEvent = traceStop,
    .recordEventState = traceState,
    .finalize = traceFinalize,
    .dump = traceDump,
};
