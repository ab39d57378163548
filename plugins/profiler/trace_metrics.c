/* Per-operation metrics: count, bytes and a latency histogram per (function, size bucket),
 * reported at finalize as JSON lines and a readable table.
 *
 * The histogram has 8 buckets per power of two (12.5% resolution), so percentiles are
 * within 12.5% of the exact value and memory stays fixed however long the job runs. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "trace.h"
#include "trace_buf.h"

static int latBucket(uint64_t ns) {
  if (ns < 8) return (int)ns;
  int e = 63 - __builtin_clzll(ns);
  return (e - 2) * 8 + (int)((ns >> (e - 3)) & 7);
}

static uint64_t latBucketTop(int idx) {
  if (idx < 8) return (uint64_t)idx;
  int e = idx / 8 + 2, sub = idx % 8;
  return ((uint64_t)(8 + sub) << (e - 3)) + ((uint64_t)1 << (e - 3)) - 1;
}

static int sizeBucket(size_t bytes) {
  if (bytes <= 1) return 0;
  int b = 64 - __builtin_clzll((unsigned long long)bytes - 1);
  return b < TRACE_SIZE_BUCKETS ? b : TRACE_SIZE_BUCKETS - 1;
}

void traceMetricsAdd(TraceMetrics* m, uint8_t funcId, const char* func, size_t bytes, uint64_t ns) {
  TraceFuncStats* f = NULL;
  for (int i = 0; i < m->nfuncs && !f; i++)
    if (m->funcs[i].nameId == funcId) f = &m->funcs[i];
  if (!f) {
    if (m->nfuncs == TRACE_MAX_FUNCS) {
      m->untracked++;
      return;
    }
    f = &m->funcs[m->nfuncs++];
    f->nameId = funcId;
    snprintf(f->name, sizeof(f->name), "%s", func);
  }
  int sb = sizeBucket(bytes);
  TraceStats* s = f->bySize[sb];
  if (!s) {
    /* Once per (function, size bucket) over the whole run. */
    s = calloc(1, sizeof(*s));
    if (!s) {
      m->untracked++;
      return;
    }
    s->minNs = UINT64_MAX;
    f->bySize[sb] = s;
  }
  s->count++;
  s->bytes += bytes;
  s->sumNs += ns;
  if (ns < s->minNs) s->minNs = ns;
  if (ns > s->maxNs) s->maxNs = ns;
  s->hist[latBucket(ns)]++;
}

void traceMetricsFree(TraceMetrics* m) {
  for (int i = 0; i < m->nfuncs; i++)
    for (int b = 0; b < TRACE_SIZE_BUCKETS; b++) free(m->funcs[i].bySize[b]);
  memset(m, 0, sizeof(*m));
}

uint64_t traceStatsPercentile(const TraceStats* s, double p) {
  if (s->count == 0) return 0;
  uint64_t target = (uint64_t)(p * (double)s->count + 0.999999);
  if (target < 1) target = 1;
  uint64_t seen = 0;
  for (int i = 0; i < TRACE_LAT_BUCKETS; i++) {
    seen += s->hist[i];
    if (seen >= target) {
      uint64_t top = latBucketTop(i);
      return top < s->maxNs ? (top > s->minNs ? top : s->minNs) : s->maxNs;
    }
  }
  return s->maxNs;
}

double traceBusFactor(const char* func, int nranks) {
  double n = nranks;
  if (!strcmp(func, "allreduce")) return nranks > 1 ? 2.0 * (n - 1) / n : 0.0;
  if (!strcmp(func, "allgather") || !strcmp(func, "reducescatter") || !strcmp(func, "alltoall") ||
      !strcmp(func, "alltoallv"))
    return (n - 1) / n;
  if (!strcmp(func, "barrier")) return 0.0;
  return 1.0; /* broadcast, reduce, send, recv */
}

static void sizeRange(int b, char* out, size_t size) {
  static const char* const unit[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  if (b == 0) {
    snprintf(out, size, "<=1 B");
    return;
  }
  int u = (b >= 10 ? b / 10 : 0);
  if (u > 5) u = 5;
  snprintf(out, size, "<=%llu %s", (unsigned long long)(1ull << (b - 10 * u)), unit[u]);
}

typedef struct {
  const char* func;
  int bucket;
  const TraceStats* s;
} Row;

static int rowCompare(const void* a, const void* b) {
  const Row *x = a, *y = b;
  int c = strcmp(x->func, y->func);
  return c ? c : x->bucket - y->bucket;
}

static void summaryLine(const TraceComm* c, const char* line) {
  if (c->cfg.summary == TRACE_SUMMARY_STDERR) fprintf(stderr, "%s\n", line);
  else if (c->cfg.summary == TRACE_SUMMARY_LOG) traceLog(&c->env, NCCLX_LOG_INFO, "%s", line);
}

void traceMetricsReport(TraceComm* c) {
  const TraceMetrics* m = &c->metrics;
  Row rows[TRACE_MAX_FUNCS * TRACE_SIZE_BUCKETS];
  int n = 0;
  uint64_t calls = 0;
  for (int i = 0; i < m->nfuncs; i++)
    for (int b = 0; b < TRACE_SIZE_BUCKETS; b++)
      if (m->funcs[i].bySize[b]) {
        rows[n++] = (Row){m->funcs[i].name, b, m->funcs[i].bySize[b]};
        calls += m->funcs[i].bySize[b]->count;
      }
  qsort(rows, (size_t)n, sizeof(Row), rowCompare);

  TraceBuf b;
  tbInit(&b);
  for (int i = 0; i < n; i++) {
    const TraceStats* s = rows[i].s;
    double meanNs = (double)s->sumNs / (double)s->count;
    double algbw = s->sumNs ? (double)s->bytes / (double)s->sumNs : 0.0; /* bytes/ns = GB/s */
    uint64_t lo = rows[i].bucket == 0 ? 0 : (1ull << (rows[i].bucket - 1)) + 1;
    uint64_t hi = rows[i].bucket == 0 ? 1 : 1ull << rows[i].bucket;
    tbPrintf(&b, "{\"commHash\":\"%016llx\",\"rank\":%d,\"nranks\":%d,\"func\":\"%s\",\"sizeMin\":%llu,"
             "\"sizeMax\":%llu,\"count\":%llu,\"bytes\":%llu,",
             (unsigned long long)c->commHash, c->rank, c->nranks, rows[i].func, (unsigned long long)lo,
             (unsigned long long)hi, (unsigned long long)s->count, (unsigned long long)s->bytes);
    tbPrintf(&b, "\"latUs\":{\"min\":%.3f,\"mean\":%.3f,\"p50\":%.3f,\"p90\":%.3f,\"p99\":%.3f,\"max\":%.3f},",
             (double)s->minNs / 1e3, meanNs / 1e3, (double)traceStatsPercentile(s, 0.5) / 1e3,
             (double)traceStatsPercentile(s, 0.9) / 1e3, (double)traceStatsPercentile(s, 0.99) / 1e3,
             (double)s->maxNs / 1e3);
    tbPrintf(&b, "\"algbwGBs\":%.6f,\"busbwGBs\":%.6f}\n", algbw, algbw * traceBusFactor(rows[i].func, c->nranks));
  }
  char path[TRACE_PATH_MAX + 64];
  tracePathFor(c, "metrics", "jsonl", path, sizeof(path));
  /* A communicator that ran nothing leaves no file (an empty one reads as a crashed writer). */
  if (n > 0 && tbWriteFile(&b, path) != 0)
    traceLog(&c->env, NCCLX_LOG_WARN, "cannot write %s: %s", path, b.oom ? "out of memory" : strerror(errno));
  if (n == 0) snprintf(path, sizeof(path), "none written");
  tbFree(&b);

  if (c->cfg.summary == TRACE_SUMMARY_NONE) return;
  char line[TRACE_PATH_MAX + 256];
  snprintf(line, sizeof(line), "summary comm %016llx rank %d/%d: %llu operations (metrics in %s)",
           (unsigned long long)c->commHash, c->rank, c->nranks, (unsigned long long)calls, path);
  summaryLine(c, line);
  if (n == 0) return;
  snprintf(line, sizeof(line), "  %-14s %10s %9s %13s %10s %10s %10s %10s %10s", "op", "size", "count", "bytes",
           "p50 us", "p90 us", "p99 us", "max us", "busbw GB/s");
  summaryLine(c, line);
  for (int i = 0; i < n; i++) {
    const TraceStats* s = rows[i].s;
    char range[32];
    sizeRange(rows[i].bucket, range, sizeof(range));
    double algbw = s->sumNs ? (double)s->bytes / (double)s->sumNs : 0.0;
    snprintf(line, sizeof(line), "  %-14s %10s %9llu %13llu %10.1f %10.1f %10.1f %10.1f %10.3f", rows[i].func, range,
             (unsigned long long)s->count, (unsigned long long)s->bytes, (double)traceStatsPercentile(s, 0.5) / 1e3,
             (double)traceStatsPercentile(s, 0.9) / 1e3, (double)traceStatsPercentile(s, 0.99) / 1e3,
             (double)s->maxNs / 1e3, algbw * traceBusFactor(rows[i].func, c->nranks));
    summaryLine(c, line);
  }
}
