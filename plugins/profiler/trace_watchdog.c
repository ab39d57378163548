/* The watchdog: an operation in flight with no transfer progress for watchdog_timeout_ms
 * gets one dump (dir/dump-<hash>-rank<R>.json) and one warning naming the operation and the
 * peers that still owe bytes. It observes only; the core's own timeout ([core] timeout_s)
 * decides when the operation fails. */
#include <stdio.h>
#include <string.h>

#include "trace.h"

/* "rank 1 (recv 0 of 4096 B, send 0 of 4096 B), rank 3 (...)" for the current operation. */
static void owingPeers(const TraceComm* c, char* out, size_t size) {
  size_t len = 0;
  int n = 0;
  out[0] = '\0';
  for (int p = 0; p < c->nranks && len + 160 < size; p++) {
    const TracePeer* tp = &c->peers[p];
    if (tp->epoch != c->epoch) continue;
    const TracePeerDir* d[2] = {&tp->recv, &tp->send};
    char parts[128] = "";
    size_t pl = 0;
    for (int k = 0; k < 2; k++)
      if (d[k]->done < d[k]->expected)
        pl += (size_t)snprintf(parts + pl, sizeof(parts) - pl, "%s%s %llu of %llu B%s", pl ? ", " : "",
                               k == 0 ? "recv" : "send", (unsigned long long)d[k]->done,
                               (unsigned long long)d[k]->expected, d[k]->posted ? "" : " not posted");
    if (pl) len += (size_t)snprintf(out + len, size - len, "%srank %d (%s)", n++ ? ", " : "", p, parts);
  }
  if (n == 0)
    snprintf(out, size, (c->cfg.mask & NCCLX_PROFILE_STEP) ? "none recorded"
                                                           : "unknown (add 'step' to [profiler.trace] events)");
}

/* What the watchdog reports when c's operation is stuck; 0 when it is not. Called between
 * traceReadBegin and traceReadRetry (may run again on a fresh snapshot). */
static int stuckOp(const TraceComm* c, const TraceClockSnap* clock, uint64_t nowNs, char* op, size_t opSize,
                   char* peers, size_t peersSize, double* idleMs) {
  op[0] = peers[0] = '\0';
  if (c->opsInFlight == 0 || c->watchdogKey == c->epoch) return 0;
  /* The hot path may have stamped progress after the caller read the clock. */
  uint64_t lastNs = traceSnapNs(clock, c->lastProgress);
  *idleMs = nowNs > lastNs ? (double)(nowNs - lastNs) / 1e6 : 0.0;
  if (*idleMs <= (double)c->cfg.watchdogMs) return 0;
  for (int i = 0; i < TRACE_POOL_EVENTS; i++) {
    const TraceRecord* r = &c->pool[i].rec;
    if (!c->pool[i].inUse || (r->type != NCCLX_PROFILE_COLL && r->type != NCCLX_PROFILE_P2P)) continue;
    if (r->type == NCCLX_PROFILE_COLL)
      snprintf(op, opSize, "%s #%llu (%zu bytes)", traceNameText(&c->names, r->func), (unsigned long long)r->seq, r->bytes);
    else
      snprintf(op, opSize, "%s #%llu %s rank %d (%zu bytes)", traceNameText(&c->names, r->func), (unsigned long long)r->seq,
               r->isSend ? "to" : "from", r->peer, r->bytes);
    break;
  }
  owingPeers(c, peers, peersSize);
  return 1;
}

void traceWatchdogCheck(TraceComm* c, uint64_t now) {
  if (c->cfg.watchdogMs <= 0) return;
  char op[96], peers[768];
  double idleMs = 0.0;
  TraceClockSnap clock; /* taken before the lock: it may refine the calibration */
  traceClockSnap(&clock);
  uint64_t nowNs = traceSnapNs(&clock, now);
  int stuck = 0;
  uint64_t seq = traceReadBegin(c);
  for (int attempt = 0;; attempt++) {
    stuck = stuckOp(c, &clock, nowNs, op, sizeof(op), peers, sizeof(peers), &idleMs);
    if (!traceReadRetry(c, &seq, attempt)) break;
  }
  if (stuck) c->watchdogKey = c->epoch; /* one dump per stuck operation */
  traceReadEnd(c);
  if (!stuck) return;

  char path[TRACE_PATH_MAX + 64];
  tracePathFor(c, "dump", "json", path, sizeof(path));
  int written = traceDumpWrite(c, path, "watchdog") == 0;
  traceLog(&c->env, NCCLX_LOG_WARN,
           "watchdog: comm %016llx rank %d: %s has made no progress for %.0f ms; waiting on: %s; %s%s",
           (unsigned long long)c->commHash, c->rank, op[0] ? op : "an operation", idleMs, peers,
           written ? "state dumped to " : "state could not be dumped", written ? path : "");
}
