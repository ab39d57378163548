/* Wait notes (see waitnote.h). */
#include "comm/waitnote.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bootstrap/bootstrap.h"
#include "util/debug.h"
#include "comm/call_sig.h"

#define WAIT_NOTE_MAGIC 0x4e58574eu /* "NXWN" */
#define WAIT_NOTE_AFTER_SEC 1.0     /* waited this long: tell the peers (a quarter of a shorter timeout) */
#define WAIT_NOTE_SCAN_SEC 0.05     /* compare received notes at most this often */
#define WAIT_NOTE_SEND_SEC 0.2      /* the most one note may take to send */
#define WAIT_NOTE_PEERS 8           /* peers told per check: enough to meet the one that differs */

/* The wire format: fixed-width fields, the same on every rank. */
struct waitNote {
  uint32_t magic;
  int32_t waitingFor; /* the rank the sender waits for, in the comm's numbering */
  uint64_t seq;       /* its call's sequence number (collectives and send/recv count apart) */
  uint64_t bytes;     /* the call's bytes per rank as its messages sign them (xfer.h) */
  int32_t isColl;     /* seq counts collectives (CommFuse and all-to-all-v dynamic included) */
  int32_t sigKind;    /* XFER_SIG_* */
  char op[32];        /* "allreduce" */
  char path[48];      /* "ring/simple", "linear/ll": how this rank runs it */
};
_Static_assert(sizeof(struct waitNote) <= BOOTSTRAP_NOTE_MAX, "a wait note must fit a bootstrap note");

struct waitNotes {
  uint64_t callKey;     /* the call the sent flags belong to */
  unsigned char* sent;  /* per rank: told about callKey */
  double lastScan;
};

static double nowSec(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int inCollective(const struct ncclxComm* comm) {
  return comm->curOpName && !comm->curOpIsP2p;
}

static struct waitNote noteOfCall(const struct ncclxComm* comm, int waitingFor) {
  struct waitNote n;
  memset(&n, 0, sizeof(n));
  n.magic = WAIT_NOTE_MAGIC;
  n.waitingFor = waitingFor;
  n.seq = comm->curOpSeq;
  n.bytes = comm->xferSigBytes;
  n.isColl = inCollective(comm);
  n.sigKind = comm->xferSigKind;
  snprintf(n.op, sizeof(n.op), "%s", comm->curOpName ? comm->curOpName : "");
  if (comm->curPathText)
    snprintf(n.path, sizeof(n.path), "%s", comm->curPathText);
  else if (comm->curAlgo >= 0)
    snprintf(n.path, sizeof(n.path), "%s/%s", ncclxAlgoName(comm->curAlgo), ncclxProtoName(comm->curProto));
  return n;
}

/* "allreduce #51 (4000 bytes per rank, linear/ll)" */
static const char* describeCall(const struct waitNote* n, char* buf, size_t size) {
  char bytes[48] = "sizes per transfer";
  if (n->bytes != (uint64_t)XFER_SIG_PER_TRANSFER) snprintf(bytes, sizeof(bytes), "%llu bytes per rank", (unsigned long long)n->bytes);
  snprintf(buf, size, "%s #%llu (%s%s%s)", n->op[0] ? n->op : "no call", (unsigned long long)n->seq, bytes,
           n->path[0] ? ", " : "", n->path);
  return buf;
}

/* Why two notes of the same call cannot be the same call, or NULL. A rank that finished this
 * call and now waits for us in a later one while we wait for it in this one ran this call
 * differently (a root that only sends, a size on another path): a send it completed was handed
 * to the transport, so what we wait for from it will never come. Only after both waited
 * long, so that data still in flight cannot be taken for a difference. */
static const char* outOfStep(const struct waitNote* mine, const struct waitNote* theirs, int me, double waited,
                             double theirAge, double after) {
  if (!mine->isColl || !theirs->isColl || theirs->seq <= mine->seq || theirs->waitingFor != me) return NULL;
  if (waited < 2 * after || theirAge < after) return NULL;
  return "the ranks ran it differently: counts, datatypes, roots or collectives differ";
}

static const char* disagreement(const struct waitNote* mine, const struct waitNote* theirs) {
  if (!mine->isColl || !theirs->isColl || mine->seq != theirs->seq) return NULL;
  if (strcmp(mine->op, theirs->op) != 0 || mine->sigKind != theirs->sigKind) return "ranks called different collectives";
  int perTransfer = mine->bytes == (uint64_t)XFER_SIG_PER_TRANSFER || theirs->bytes == (uint64_t)XFER_SIG_PER_TRANSFER;
  if (!perTransfer && mine->bytes != theirs->bytes) return "counts or datatypes differ between ranks";
  return NULL;
}

static struct waitNotes* stateOf(struct ncclxComm* comm) {
  if (!comm->waitNotes) {
    struct waitNotes* w = calloc(1, sizeof(*w));
    if (w) w->sent = calloc((size_t)comm->nranks, 1);
    if (!w || !w->sent) {
      free(w);
      return NULL;
    }
    comm->waitNotes = w;
  }
  return comm->waitNotes;
}

static void tellPeers(struct ncclxComm* comm, struct waitNotes* w, const int* peers, int n) {
  uint64_t key = comm->curOpSeq * 2 + (uint64_t)inCollective(comm);
  if (w->callKey != key) {
    memset(w->sent, 0, (size_t)comm->nranks);
    w->callKey = key;
  }
  for (int i = 0, told = 0; i < n && told < WAIT_NOTE_PEERS; i++) {
    int p = peers[i];
    if (p < 0 || p >= comm->nranks || p == comm->rank || w->sent[p]) continue;
    w->sent[p] = 1;
    told++;
    struct waitNote note = noteOfCall(comm, p);
    int e = bootstrapSendNote(comm->bootstrap, p, &note, sizeof(note), WAIT_NOTE_SEND_SEC);
    if (e != 0) INFO(NCCLX_LOG_COLL, "wait note to rank %d not sent (errno %d)", p, e);
  }
}

static int readNote(struct ncclxComm* comm, int peer, struct waitNote* n, double* age) {
  size_t got = bootstrapReadNote(comm->bootstrap, peer, n, sizeof(*n), age);
  if (got != sizeof(*n) || n->magic != WAIT_NOTE_MAGIC) return 0;
  n->op[sizeof(n->op) - 1] = n->path[sizeof(n->path) - 1] = '\0';
  return 1;
}

ncclxResult_t waitNoteCheck(struct ncclxComm* comm, const int* peers, int n, double waitedSec) {
  if (!comm->curOpName || !comm->bootstrap || comm->nranks < 2) return ncclxSuccess;
  double after = WAIT_NOTE_AFTER_SEC;
  if (comm->timeoutSec > 0 && comm->timeoutSec / 4 < after) after = comm->timeoutSec / 4;
  if (waitedSec < after) return ncclxSuccess;
  struct waitNotes* w = stateOf(comm);
  if (!w) return ncclxSuccess; /* out of memory: the timeout still ends the wait */
  tellPeers(comm, w, peers, n);
  double now = nowSec();
  if (now - w->lastScan < WAIT_NOTE_SCAN_SEC) return ncclxSuccess;
  w->lastScan = now;
  struct waitNote mine = noteOfCall(comm, -1), theirs;
  for (int r = 0; r < comm->nranks; r++) {
    double age;
    if (r == comm->rank || !readNote(comm, r, &theirs, &age)) continue;
    char a[160], b[160], who[128];
    const char* late = outOfStep(&mine, &theirs, comm->rank, waitedSec, age, after);
    if (late)
      return commFail(comm, ncclxInvalidUsage, "%s finished collective #%llu and waits for this rank in %s, while this "
                      "rank waits for it in %s (%s?)", commDescribeRank(comm, r, who, sizeof(who)),
                      (unsigned long long)mine.seq, describeCall(&theirs, b, sizeof(b)),
                      describeCall(&mine, a, sizeof(a)), late);
    const char* why = disagreement(&mine, &theirs);
    if (!why) continue;
    return commFail(comm, ncclxInvalidUsage, "ranks disagree on collective #%llu: this rank runs %s, %s runs %s (%s?)",
                    (unsigned long long)mine.seq, describeCall(&mine, a, sizeof(a)),
                    commDescribeRank(comm, r, who, sizeof(who)), describeCall(&theirs, b, sizeof(b)), why);
  }
  return ncclxSuccess;
}

size_t waitNoteDescribe(struct ncclxComm* comm, int peer, char* buf, size_t len, size_t size) {
  struct waitNote n;
  double age;
  if (len >= size || !comm->bootstrap || !readNote(comm, peer, &n, &age)) return len;
  char call[160], who[128];
  int k = snprintf(buf + len, size - len, "; %s said %.0f s ago: in %s, waiting for rank %d",
                   commDescribeRank(comm, peer, who, sizeof(who)), age, describeCall(&n, call, sizeof(call)),
                   n.waitingFor);
  return k < 0 ? len : len + (size_t)k < size ? len + (size_t)k : size - 1;
}

void waitNoteFree(struct ncclxComm* comm) {
  if (!comm->waitNotes) return;
  free(comm->waitNotes->sent);
  free(comm->waitNotes);
  comm->waitNotes = NULL;
}
