/* The plugin's view of one communicator as JSON ("ncclx-profiler-dump-1"): what ncclxCommDump
 * writes to PATH.profiler, and what the watchdog and SIGUSR1 write to dir/dump-*.json.
 * Built under the communicator's lock, or from a snapshot no lockless writer changed
 * (trace.h), and written after it. */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "trace.h"
#include "trace_buf.h"

/* A difference of two clock reads; a read racing the clock's recalibration may be a hair early. */
static double ms(uint64_t ns) { return (int64_t)ns < 0 ? 0.0 : (double)ns / 1e6; }

/* r's times are stamps (trace_clock.h); `now` is in nanoseconds. */
static void putOp(TraceBuf* b, const TraceComm* c, const TraceClockSnap* clock, const TraceRecord* r, uint64_t now,
                  int inflight) {
  uint64_t startNs = traceSnapNs(clock, r->startNs), endNs = traceSnapNs(clock, r->endNs);
  int coll = r->type == NCCLX_PROFILE_COLL;
  tbPrintf(b, "{\"kind\": \"%s\", \"seq\": %llu, \"func\": ", coll ? "coll" : "p2p", (unsigned long long)r->seq);
  const TraceNames* n = &c->names;
  tbString(b, traceNameText(n, r->func));
  tbPrintf(b, ", \"count\": %zu, \"bytes\": %zu, \"dtype\": ", r->count, r->bytes);
  tbString(b, traceNameText(n, r->dtype));
  if (coll) {
    tbPrintf(b, ", \"op\": ");
    tbString(b, traceNameText(n, r->op));
    tbPrintf(b, ", \"root\": %d, \"algo\": ", r->root);
    tbString(b, traceNameText(n, r->algo));
    tbPrintf(b, ", \"proto\": ");
    tbString(b, traceNameText(n, r->proto));
  } else {
    tbPrintf(b, ", \"peer\": %d", r->peer);
  }
  double startReal = (double)((int64_t)startNs + c->realOffsetNs) / 1e9;
  if (inflight)
    tbPrintf(b, ", \"start\": %.6f, \"ageMs\": %.3f, \"state\": \"%s\"}", startReal, ms(now - startNs),
             r->failed ? "failed" : "running");
  else
    tbPrintf(b, ", \"start\": %.6f, \"durMs\": %.3f, \"status\": \"%s\"}", startReal, ms(endNs - startNs),
             r->failed ? "failed" : "ok");
}

static void putDir(TraceBuf* b, const char* name, const TracePeerDir* d) {
  tbPrintf(b, "\"%s\": {\"expected\": %llu, \"posted\": %llu, \"done\": %llu}", name,
           (unsigned long long)d->expected, (unsigned long long)d->posted, (unsigned long long)d->done);
}

static void build(TraceBuf* b, TraceComm* c, const char* reason) {
  TraceClockSnap clock;
  traceClockSnap(&clock);
  uint64_t now = traceSnapNs(&clock, traceStamp());
  struct timespec rt;
  clock_gettime(CLOCK_REALTIME, &rt);
  char events[64];
  traceMaskString(c->cfg.mask, events, sizeof(events));
  tbPrintf(b, "{\n  \"format\": \"ncclx-profiler-dump-1\",\n  \"reason\": ");
  tbString(b, reason);
  tbPrintf(b, ",\n  \"time\": %.6f,\n  \"commHash\": \"%016llx\",\n  \"commName\": ",
           (double)rt.tv_sec + 1e-9 * (double)rt.tv_nsec, (unsigned long long)c->commHash);
  tbString(b, c->commName);
  tbPrintf(b, ",\n  \"rank\": %d,\n  \"nranks\": %d,\n  \"nhosts\": %d,\n  \"host\": ", c->rank, c->nranks, c->nhosts);
  tbString(b, c->host);
  tbPrintf(b, ",\n  \"pid\": %d,\n  \"events\": \"%s\",\n", c->pid, events);
  tbPrintf(b, "  \"lastStarted\": {\"coll\": %llu, \"p2p\": %llu},\n", (unsigned long long)c->collStarted,
           (unsigned long long)c->p2pStarted);
  tbPrintf(b, "  \"lastCompleted\": {\"coll\": %llu, \"p2p\": %llu},\n", (unsigned long long)c->collDone,
           (unsigned long long)c->p2pDone);
  tbPrintf(b, "  \"lastFailed\": {\"coll\": %llu, \"p2p\": %llu},\n  \"error\": ", (unsigned long long)c->collFailed,
           (unsigned long long)c->p2pFailed);
  tbString(b, c->lastError[0] ? c->lastError : NULL);
  tbPrintf(b, ",\n  \"idleMs\": %.3f,\n  \"inflight\": [", c->opsInFlight ? ms(now - traceSnapNs(&clock, c->lastProgress)) : 0.0);
  int n = 0;
  for (int i = 0; i < TRACE_POOL_EVENTS; i++) {
    const TraceEvent* e = &c->pool[i];
    if (!e->inUse || (e->rec.type != NCCLX_PROFILE_COLL && e->rec.type != NCCLX_PROFILE_P2P)) continue;
    tbPrintf(b, "%s\n    ", n++ ? "," : "");
    putOp(b, c, &clock, &e->rec, now, 1);
  }
  tbPrintf(b, "%s],\n  \"peersOp\": ", n ? "\n  " : "");
  /* Per-peer counters belong to the last operation started (running, failed or done). */
  if (c->epoch) {
    tbPrintf(b, "{\"kind\": \"%s\", \"seq\": %llu, \"func\": ",
             c->epochType == NCCLX_PROFILE_COLL ? "coll" : "p2p", (unsigned long long)c->epochSeq);
    tbString(b, traceNameText(&c->names, c->epochFunc));
    tbPrintf(b, "}");
  } else {
    tbPrintf(b, "null");
  }
  tbPrintf(b, ",\n  \"peers\": [");
  n = 0;
  for (int p = 0; p < c->nranks; p++) {
    const TracePeer* tp = &c->peers[p];
    if (tp->epoch != c->epoch || c->epoch == 0) continue;
    tbPrintf(b, "%s\n    {\"peer\": %d, ", n++ ? "," : "", p);
    putDir(b, "send", &tp->send);
    tbPrintf(b, ", ");
    putDir(b, "recv", &tp->recv);
    tbPrintf(b, "}");
  }
  tbPrintf(b, "%s],\n  \"recent\": [", n ? "\n  " : "");
  uint64_t first = c->nrecent > TRACE_RECENT ? c->nrecent - TRACE_RECENT : 0;
  for (uint64_t i = first; i < c->nrecent; i++) {
    tbPrintf(b, "%s\n    ", i > first ? "," : "");
    putOp(b, c, &clock, &c->recent[i % TRACE_RECENT], now, 0);
  }
  tbPrintf(b, "%s],\n  \"dropped\": {\"events\": %llu, \"records\": %llu}\n}\n", c->nrecent > first ? "\n  " : "",
           (unsigned long long)c->droppedEvents, (unsigned long long)c->droppedRecords);
}

int traceDumpWrite(TraceComm* c, const char* path, const char* reason) {
  TraceBuf b;
  tbInit(&b);
  uint64_t seq = traceReadBegin(c);
  for (int attempt = 0;; attempt++) {
    b.len = 0;
    build(&b, c, reason);
    if (!traceReadRetry(c, &seq, attempt)) break;
  }
  traceReadEnd(c);
  int rc = tbWriteFile(&b, path);
  if (rc != 0)
    traceLog(&c->env, NCCLX_LOG_WARN, "cannot write dump %s: %s", path, b.oom ? "out of memory" : strerror(errno));
  tbFree(&b);
  return rc;
}
