/* The per-rank Chrome trace (Trace Event Format, JSON array form, one event per line),
 * written from the binary spool at finalize (see trace_spool.c for why).
 *
 * Tracks (tid): 0 = operations, 1 + 2*peer = sends to peer, 2 + 2*peer = receives from it;
 * network plugin events: 1 + 2*nranks + 2*peer (+1 for receives) per peer and direction,
 * 1 + 4*nranks for those with no peer.
 * Slices on one track must not partly overlap for the viewers, so a slice starts no earlier
 * than the previous one on its track ended (transfers to one peer complete in order);
 * the true start is kept in args.start_us. args.status is "failed" for a failed event and
 * absent otherwise. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "trace.h"
#include "trace_buf.h"

/* Hand-made formatting: snprintf per field costs microseconds per record, and the writer
 * shares the CPUs with ranks that spin. Every append writes into space reserved up front. */
#define RECORD_MAX 1024 /* bytes of JSON per record, at most (names are short and bounded) */

static inline char* putLit(char* p, const char* s, size_t n) {
  memcpy(p, s, n);
  return p + n;
}
#define LIT(p, s) putLit((p), (s), sizeof(s) - 1)

static const char digitPairs[201] =
    "00010203040506070809101112131415161718192021222324252627282930313233343536373839"
    "40414243444546474849505152535455565758596061626364656667686970717273747576777879"
    "8081828384858687888990919293949596979899";

/* Two digits per division: timestamps have 16 of them. */
static inline char* putU64(char* p, uint64_t v) {
  char tmp[20];
  int n = 20;
  while (v >= 100) {
    unsigned d = (unsigned)(v % 100) * 2;
    v /= 100;
    tmp[--n] = digitPairs[d + 1];
    tmp[--n] = digitPairs[d];
  }
  if (v >= 10) {
    tmp[--n] = digitPairs[v * 2 + 1];
    tmp[--n] = digitPairs[v * 2];
  } else {
    tmp[--n] = (char)('0' + v);
  }
  memcpy(p, tmp + n, (size_t)(20 - n));
  return p + (20 - n);
}

static inline char* putInt(char* p, int v) {
  if (v < 0) {
    *p++ = '-';
    return putU64(p, (uint64_t)(-(int64_t)v));
  }
  return putU64(p, (uint64_t)v);
}

static inline char* putHex(char* p, uint64_t v) {
  char tmp[16];
  int n = 16;
  do {
    tmp[--n] = "0123456789abcdef"[v & 15];
    v >>= 4;
  } while (v);
  memcpy(p, tmp + n, (size_t)(16 - n));
  return p + (16 - n);
}

/* Nanoseconds as microseconds with three decimals. */
static inline char* putUs(char* p, uint64_t ns) {
  p = putU64(p, ns / 1000);
  unsigned f = (unsigned)(ns % 1000);
  p[0] = '.';
  p[1] = (char)('0' + f / 100);
  p[2] = (char)('0' + f / 10 % 10);
  p[3] = (char)('0' + f % 10);
  return p + 4;
}

/* An interned name, unquoted (made JSON-safe when interned) or quoted. */
static inline char* putChars(char* p, const TraceNames* t, uint8_t id) {
  return putLit(p, t->names[id].text, t->names[id].len);
}

static inline char* putName(char* p, const TraceNames* t, uint8_t id) {
  *p++ = '"';
  p = putChars(p, t, id);
  *p++ = '"';
  return p;
}
#define NAME(p, id) putName((p), &c->names, (id))

static uint64_t toReal(const TraceComm* c, uint64_t monoNs) { return (uint64_t)((int64_t)monoNs + c->realOffsetNs); }

static int trackOf(const TraceComm* c, const TraceRecord* r) {
  int hasPeer = r->peer >= 0 && r->peer < c->nranks;
  if (r->type == NCCLX_PROFILE_NET)
    return hasPeer ? 1 + 2 * c->nranks + 2 * r->peer + (r->isSend ? 0 : 1) : 1 + 4 * c->nranks;
  if (r->type != NCCLX_PROFILE_STEP || !hasPeer) return 0;
  return 1 + 2 * r->peer + (r->isSend ? 0 : 1);
}

static char* putTrackName(TraceComm* c, char* p, int tid, int peer, int isSend) {
  int net = tid > 2 * c->nranks;
  if (c->traceEvents++) p = LIT(p, ",\n");
  p = LIT(p, "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":");
  p = putInt(p, c->rank);
  p = LIT(p, ",\"tid\":");
  p = putInt(p, tid);
  if (tid == 0) {
    p = LIT(p, ",\"args\":{\"name\":\"operations\"}}");
  } else if (tid == 1 + 4 * c->nranks) {
    p = LIT(p, ",\"args\":{\"name\":\"net plugin\"}}");
  } else if (net) {
    p = isSend ? LIT(p, ",\"args\":{\"name\":\"net send to peer ") : LIT(p, ",\"args\":{\"name\":\"net recv from peer ");
    p = putInt(p, peer);
    p = LIT(p, "\"}}");
  } else {
    p = isSend ? LIT(p, ",\"args\":{\"name\":\"send to peer ") : LIT(p, ",\"args\":{\"name\":\"recv from peer ");
    p = putInt(p, peer);
    p = LIT(p, "\"}}");
  }
  p = LIT(p, ",\n{\"name\":\"thread_sort_index\",\"ph\":\"M\",\"pid\":");
  p = putInt(p, c->rank);
  p = LIT(p, ",\"tid\":");
  p = putInt(p, tid);
  p = LIT(p, ",\"args\":{\"sort_index\":");
  p = putInt(p, tid);
  return LIT(p, "}}");
}

static char* putRecord(TraceComm* c, char* p, const TraceRecord* r) {
  int tid = trackOf(c, r);
  if (!c->trackEnd[tid]) p = putTrackName(c, p, tid, r->peer, r->isSend);
  uint64_t start = r->startNs, end = r->endNs > r->startNs ? r->endNs : r->startNs;
  if (start < c->trackEnd[tid]) start = c->trackEnd[tid] < end ? c->trackEnd[tid] : end;
  c->trackEnd[tid] = end > 1 ? end : 1;
  if (c->traceEvents++) p = LIT(p, ",\n");
  p = LIT(p, "{\"name\":\"");
  switch (r->type) {
    case NCCLX_PROFILE_COLL:
      p = putChars(p, &c->names, r->func);
      p = LIT(p, " #");
      p = putU64(p, r->seq);
      p = LIT(p, "\",\"cat\":\"coll\"");
      break;
    case NCCLX_PROFILE_P2P:
      p = putChars(p, &c->names, r->func);
      p = LIT(p, " #");
      p = putU64(p, r->seq);
      p = r->isSend ? LIT(p, " to ") : LIT(p, " from ");
      p = putInt(p, r->peer);
      p = LIT(p, "\",\"cat\":\"p2p\"");
      break;
    case NCCLX_PROFILE_STEP:
      p = r->isSend ? LIT(p, "send ") : LIT(p, "recv ");
      p = putU64(p, r->bytes);
      p = LIT(p, " B\",\"cat\":\"step\"");
      break;
    case NCCLX_PROFILE_NET:
      p = LIT(p, "net 0x");
      p = putHex(p, r->count);
      p = LIT(p, "\",\"cat\":\"net\"");
      break;
    default:
      p = putChars(p, &c->names, r->func);
      p = LIT(p, "\",\"cat\":");
      p = NAME(p, r->func);
      break;
  }
  p = LIT(p, ",\"ph\":\"X\",\"pid\":");
  p = putInt(p, c->rank);
  p = LIT(p, ",\"tid\":");
  p = putInt(p, tid);
  p = LIT(p, ",\"ts\":");
  p = putUs(p, toReal(c, start));
  p = LIT(p, ",\"dur\":");
  p = putUs(p, end - start);
  p = LIT(p, ",\"args\":{");
  switch (r->type) {
    case NCCLX_PROFILE_COLL:
      p = LIT(p, "\"seq\":");
      p = putU64(p, r->seq);
      p = LIT(p, ",\"count\":");
      p = putU64(p, r->count);
      p = LIT(p, ",\"bytes\":");
      p = putU64(p, r->bytes);
      p = LIT(p, ",\"dtype\":");
      p = NAME(p, r->dtype);
      p = LIT(p, ",\"op\":");
      p = NAME(p, r->op);
      p = LIT(p, ",\"root\":");
      p = putInt(p, r->root);
      p = LIT(p, ",\"algo\":");
      p = NAME(p, r->algo);
      p = LIT(p, ",\"proto\":");
      p = NAME(p, r->proto);
      break;
    case NCCLX_PROFILE_P2P:
      p = LIT(p, "\"seq\":");
      p = putU64(p, r->seq);
      p = LIT(p, ",\"peer\":");
      p = putInt(p, r->peer);
      p = LIT(p, ",\"count\":");
      p = putU64(p, r->count);
      p = LIT(p, ",\"bytes\":");
      p = putU64(p, r->bytes);
      p = LIT(p, ",\"dtype\":");
      p = NAME(p, r->dtype);
      break;
    case NCCLX_PROFILE_STEP:
      p = LIT(p, "\"op\":");
      p = NAME(p, r->func);
      p = LIT(p, ",\"seq\":");
      p = putU64(p, r->seq);
      p = LIT(p, ",\"peer\":");
      p = putInt(p, r->peer);
      p = r->isSend ? LIT(p, ",\"dir\":\"send\"") : LIT(p, ",\"dir\":\"recv\"");
      p = LIT(p, ",\"bytes\":");
      p = putU64(p, r->bytes);
      p = LIT(p, ",\"step\":");
      p = putInt(p, r->step);
      p = LIT(p, ",\"transport\":");
      p = NAME(p, r->algo);
      break;
    case NCCLX_PROFILE_NET:
      p = LIT(p, "\"plugin_id\":");
      p = putU64(p, r->count);
      p = LIT(p, ",\"parent\":");
      p = r->parent == NCCLX_PROFILE_STEP ? LIT(p, "\"step\"")
          : r->parent == NCCLX_PROFILE_COLL ? LIT(p, "\"coll\"")
          : r->parent == NCCLX_PROFILE_P2P ? LIT(p, "\"p2p\"") : LIT(p, "null");
      if (r->parent) {
        p = LIT(p, ",\"op\":");
        p = NAME(p, r->func);
        p = LIT(p, ",\"seq\":");
        p = putU64(p, r->seq);
      }
      if (r->peer >= 0) {
        p = LIT(p, ",\"peer\":");
        p = putInt(p, r->peer);
        p = r->isSend ? LIT(p, ",\"dir\":\"send\"") : LIT(p, ",\"dir\":\"recv\"");
      }
      if (r->parent == NCCLX_PROFILE_STEP) {
        p = LIT(p, ",\"bytes\":");
        p = putU64(p, r->bytes);
        p = LIT(p, ",\"step\":");
        p = putInt(p, r->step);
      }
      break;
    default:
      p = LIT(p, "\"id\":");
      p = putU64(p, r->seq);
      break;
  }
  if (start != r->startNs) { /* the slice was clipped to its track: keep the true start */
    p = LIT(p, ",\"start_us\":");
    p = putUs(p, toReal(c, r->startNs));
  }
  return r->failed ? LIT(p, ",\"status\":\"failed\"}}") : LIT(p, "}}"); /* no status: ok */
}

static void putHeader(TraceComm* c, TraceBuf* b) {
  tbPrintf(b, "[\n{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":%d,\"args\":{\"name\":\"rank %d (%s pid %d)\"}}",
           c->rank, c->rank, c->host, c->pid);
  tbPrintf(b, ",\n{\"name\":\"process_sort_index\",\"ph\":\"M\",\"pid\":%d,\"args\":{\"sort_index\":%d}}", c->rank,
           c->rank);
  /* What the analyzer needs to place this file; viewers ignore unknown metadata. */
  tbPrintf(b, ",\n{\"name\":\"ncclx_comm\",\"ph\":\"M\",\"pid\":%d,\"args\":{\"format\":\"ncclx-trace-1\","
           "\"commHash\":\"%016llx\",\"commName\":", c->rank, (unsigned long long)c->commHash);
  tbString(b, c->commName);
  tbPrintf(b, ",\"rank\":%d,\"nranks\":%d,\"nhosts\":%d,\"host\":", c->rank, c->nranks, c->nhosts);
  tbString(b, c->host);
  tbPrintf(b, ",\"pid\":%d}}", c->pid);
  c->traceEvents = 3;
}

/* Reads the spool's records back and writes the Chrome trace next to it, through a temporary
 * name. Runs once, at finalize, on the finalizing thread. */
int traceJsonFromSpool(TraceComm* c) {
  char json[TRACE_PATH_MAX + 64], tmp[TRACE_PATH_MAX + 96];
  tracePathFor(c, "trace", "json", json, sizeof(json));
  snprintf(tmp, sizeof(tmp), "%s.tmp%d", json, (int)getpid());
  int in = open(c->spoolPath, O_RDONLY | O_CLOEXEC);
  int out = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  TraceBuf* b = c->outBuf;
  b->len = 0;
  putHeader(c, b);
  enum { CHUNK = 1 << 20 };
  char* chunk = malloc(CHUNK);
  size_t have = 0, off = 0;
  int rc = in >= 0 && out >= 0 && chunk ? 0 : -1;
  /* Skip the spool's two header lines. */
  for (int lines = 0; rc == 0 && lines < 2;) {
    if (off == have) {
      ssize_t n = read(in, chunk, CHUNK);
      if (n <= 0) rc = -1;
      have = n > 0 ? (size_t)n : 0;
      off = 0;
      continue;
    }
    lines += chunk[off++] == '\n';
  }
  for (int eof = 0; rc == 0 && !eof;) {
    if (have - off < 1 + sizeof(TraceRecord) + 1) { /* refill, keeping a partial entry */
      memmove(chunk, chunk + off, have - off);
      have -= off;
      off = 0;
      ssize_t n = read(in, chunk + have, CHUNK - have);
      if (n < 0) rc = -1;
      if (n <= 0) eof = 1;
      else have += (size_t)n;
    }
    while (rc == 0 && off < have) {
      char tag = chunk[off];
      if (tag == 'N') {
        if (have - off < 3 || have - off < 3 + (size_t)(unsigned char)chunk[off + 2]) break;
        off += 3 + (size_t)(unsigned char)chunk[off + 2]; /* names are known in memory */
      } else if (tag == 'R') {
        if (have - off < 1 + sizeof(TraceRecord)) break;
        TraceRecord r;
        memcpy(&r, chunk + off + 1, sizeof(r));
        off += 1 + sizeof(r);
        char* p = tbSpace(b, 2 * RECORD_MAX);
        if (!p) rc = -1;
        else tbCommit(b, putRecord(c, p, &r));
      } else {
        rc = -1; /* not a spool we wrote */
      }
      if (b->len > CHUNK) {
        if (tbWriteFd(out, b) != 0) rc = -1;
        b->len = 0;
      }
    }
  }
  tbPrintf(b, "\n]\n");
  if (rc == 0 && (b->oom || tbWriteFd(out, b) != 0)) rc = -1;
  b->len = 0;
  int saved = errno;
  free(chunk);
  if (in >= 0) close(in);
  if (out >= 0 && close(out) != 0) rc = -1;
  if (rc == 0 && rename(tmp, json) != 0) rc = -1;
  if (rc != 0) {
    unlink(tmp);
    traceLog(&c->env, NCCLX_LOG_WARN, "could not convert %s into %s (%s); the binary trace is kept "
             "(tools/ncclx-analyze merge reads it)", c->spoolPath, json, strerror(saved ? saved : errno));
    return -1;
  }
  unlink(c->spoolPath);
  return 0;
}
