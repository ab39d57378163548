/* ncclxCommDump: the communicator's state as one JSON object, for tools/ncclx-analyze. */
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "comm/comm.h"
#include "util/debug.h"
#include "transport/transport.h"
#include "exec/xfer.h"

#define API __attribute__((visibility("default")))

/* JSON string without quotes or control characters breaking the document. */
static void putString(FILE* f, const char* s) {
  fputc('"', f);
  for (; s && *s; s++) {
    unsigned char c = (unsigned char)*s;
    if (c == '"' || c == '\\') fprintf(f, "\\%c", c);
    else if (c < 0x20) fprintf(f, "\\u%04x", c);
    else fputc(c, f);
  }
  fputc('"', f);
}

/* Reads other threads' progress counters without stopping them: a snapshot, not a lock. */
static void putLiveStep(FILE* f, struct ncclxComm* comm) {
  pthread_mutex_lock(&comm->liveLock);
  struct ncclxXferLive* live = comm->live;
  fprintf(f, ",\n  \"inflight\": [");
  for (int i = 0; live && i < live->n; i++) {
    const ncclxXfer* x = &live->xfers[i];
    struct ncclxComm* owner = x->comm ? x->comm : comm;
    if (owner != comm) continue;
    fprintf(f, "%s\n    {\"peer\": %d, \"dir\": \"%s\", \"bytes\": %zu, \"posted\": %zu, \"done\": %zu, \"transport\": ",
            i ? "," : "", x->peer, x->isSend ? "send" : "recv", x->bytes,
            __atomic_load_n(&x->postedBytes, __ATOMIC_RELAXED),
            __atomic_load_n(&x->doneBytes, __ATOMIC_RELAXED));
    putString(f, x->peer == comm->rank ? "self" : comm->tp[transportFor(comm, x->peer)].net->name);
    fputc('}', f);
  }
  pthread_mutex_unlock(&comm->liveLock);
  fprintf(f, "]");
}

API ncclxResult_t ncclxCommDump(ncclxComm_t comm, const char* path) {
  NCCLX_CHECK(commCheckHandle(comm));
  if (!path || !*path) return ncclxSetError(ncclxInvalidArgument, "ncclxCommDump: path is empty");
  FILE* f = fopen(path, "w");
  if (!f) return ncclxSetError(ncclxSystemError, "ncclxCommDump: cannot write %s", path);
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  fprintf(f, "{\n  \"format\": \"ncclx-dump-1\",\n  \"time\": %.6f,\n  \"comm\": ",
          (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec);
  putString(f, comm->name);
  fprintf(f, ",\n  \"commHash\": \"%016llx\",\n  \"rank\": %d,\n  \"nranks\": %d,\n  \"host\": ",
          (unsigned long long)comm->commHash, comm->rank, comm->nranks);
  putString(f, bootstrapHostname());
  fprintf(f, ",\n  \"pid\": %d,\n  \"collSeq\": %llu,\n  \"p2pSeq\": %llu,\n  \"currentOp\": ", (int)getpid(),
          (unsigned long long)comm->collSeq, (unsigned long long)comm->p2pSeq);
  const char* op = comm->curOpName;
  if (op) putString(f, op);
  else fputs("null", f);
  fprintf(f, ",\n  \"currentOpSeq\": %llu,\n  \"error\": ", op ? (unsigned long long)comm->curOpSeq : 0ull);
  pthread_mutex_lock(&comm->errLock);
  if (atomic_load(&comm->asyncError) != ncclxSuccess) putString(f, comm->lastError);
  else fputs("null", f);
  pthread_mutex_unlock(&comm->errLock);
  putLiveStep(f, comm);
  fprintf(f, "\n}\n");
  int bad = ferror(f);
  if (fclose(f) != 0 || bad) return ncclxSetError(ncclxSystemError, "ncclxCommDump: error writing %s", path);

  if (comm->profiler && comm->profiler->dump) {
    char ppath[4096];
    snprintf(ppath, sizeof(ppath), "%s.profiler", path);
    if (comm->profiler->dump(comm->profilerCtx, ppath) != ncclxSuccess)
      WARN("ncclxCommDump: profiler '%s' could not write %s", comm->profiler->name, ppath);
  }
  return ncclxSuccess;
}
