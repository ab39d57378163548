/* The binary spool a communicator's trace records go to while it runs:
 *
 *   "NCCLXTR1\n"
 *   one JSON line: commHash, commName, rank, nranks, nhosts, host, pid, realOffsetNs
 *   entries: 'N' id len text[len]    a name id used by later records
 *            'R' TraceRecord (64 B)  one finished event, little-endian
 *
 * Appending a batch is a copy and one write(), so the background thread costs the ranks
 * almost nothing; the JSON trace is produced from the spool at finalize. A name is defined
 * before the first record that uses it, so any prefix of the file can be decoded. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "trace.h"
#include "trace_buf.h"

static void writeOut(TraceComm* c, TraceBuf* b) {
  if (c->traceBroken || b->len == 0) return;
  if (b->oom || tbWriteFd(c->spoolFd, b) != 0) {
    c->traceBroken = 1;
    traceLog(&c->env, NCCLX_LOG_WARN, "cannot write %s (%s); tracing stops for comm %016llx rank %d",
             c->spoolPath, b->oom ? "out of memory" : strerror(errno), (unsigned long long)c->commHash, c->rank);
  }
  b->len = 0;
}

int traceFileOpen(TraceComm* c) {
  tracePathFor(c, "trace", "spool", c->spoolPath, sizeof(c->spoolPath));
  c->spoolFd = open(c->spoolPath, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_APPEND, 0644);
  if (c->spoolFd < 0) {
    traceLog(&c->env, NCCLX_LOG_WARN, "cannot create %s: %s", c->spoolPath, strerror(errno));
    return -1;
  }
  TraceBuf* b = c->outBuf;
  b->len = 0;
  tbPrintf(b, "NCCLXTR1\n{\"format\":\"ncclx-spool-1\",\"commHash\":\"%016llx\",\"commName\":",
           (unsigned long long)c->commHash);
  tbString(b, c->commName);
  tbPrintf(b, ",\"rank\":%d,\"nranks\":%d,\"nhosts\":%d,\"host\":", c->rank, c->nranks, c->nhosts);
  tbString(b, c->host);
  tbPrintf(b, ",\"pid\":%d,\"realOffsetNs\":%lld,\"recordBytes\":%zu}\n", c->pid, (long long)c->realOffsetNs,
           sizeof(TraceRecord));
  writeOut(c, b);
  if (c->traceBroken) {
    close(c->spoolFd);
    c->spoolFd = -1;
    return -1;
  }
  return 0;
}

static char* defineName(TraceComm* c, char* p, uint8_t id) {
  if (id >= TRACE_NAMES || (c->namesSpooled >> id & 1)) return p;
  c->namesSpooled |= 1ull << id;
  const TraceName* n = &c->names.names[id];
  p[0] = 'N';
  p[1] = (char)id;
  p[2] = (char)n->len;
  memcpy(p + 3, n->text, n->len);
  return p + 3 + n->len;
}

/* A finished operation into the metrics (stamps already converted). */
static void addMetrics(TraceComm* c, const TraceRecord* r) {
  if ((r->type != NCCLX_PROFILE_COLL && r->type != NCCLX_PROFILE_P2P) || r->failed) return;
  traceMetricsAdd(&c->metrics, r->func, traceNameText(&c->names, r->func), r->bytes,
                  r->endNs > r->startNs ? r->endNs - r->startNs : 0);
}

void traceDrain(TraceComm* c) {
  if (!c->ring) return;
  pthread_mutex_lock(&c->fileLock);
  uint64_t tail = c->ringTail; /* only consumers (under fileLock) store it */
  uint64_t head = __atomic_load_n(&c->ringHead, __ATOMIC_ACQUIRE);
  int spool = c->cfg.trace && c->spoolFd >= 0 && !c->traceBroken;
  TraceBuf* b = c->outBuf;
  b->len = 0;
  TraceClockSnap clock;
  traceClockSnap(&clock);
  for (uint64_t i = tail; i < head; i++) {
    TraceRecord r = c->ring[i & c->ringMask];
    r.startNs = traceSnapNs(&clock, r.startNs);
    r.endNs = traceSnapNs(&clock, r.endNs);
    if (c->cfg.metrics) addMetrics(c, &r);
    if (!spool) continue;
    /* Room for the record and up to five name definitions. */
    char* p = tbSpace(b, 1 + sizeof(r) + 5 * (3 + sizeof(c->names.names[0].text)));
    if (!p) {
      spool = 0; /* out of memory: writeOut reports it and stops the trace */
      continue;
    }
    p = defineName(c, p, r.func);
    p = defineName(c, p, r.dtype);
    p = defineName(c, p, r.op);
    p = defineName(c, p, r.algo);
    p = defineName(c, p, r.proto);
    *p++ = 'R';
    memcpy(p, &r, sizeof(r));
    b->len = (size_t)(p + sizeof(r) - b->p);
  }
  /* The slots are free again only once copied. */
  __atomic_store_n(&c->ringTail, head, __ATOMIC_RELEASE);
  if (c->cfg.trace && c->spoolFd >= 0) writeOut(c, b);
  pthread_mutex_unlock(&c->fileLock);
}

void traceFileClose(TraceComm* c) {
  pthread_mutex_lock(&c->fileLock);
  int fd = c->spoolFd;
  c->spoolFd = -1;
  pthread_mutex_unlock(&c->fileLock);
  if (fd < 0) return;
  close(fd);
  if (!c->traceBroken) traceJsonFromSpool(c);
}
