/* Online mismatch detection: one bootstrap all-gather of a 40-byte record per collective
 * (see mismatch.h). The bootstrap is used rather than the data path because it exists
 * before any peer connection and carries no user data, so a disagreement is found before
 * a single byte is exchanged on a mismatched call. */
#include "sched/mismatch.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config/config.h"
#include "util/debug.h"

#define TAG_MISMATCH 0x6d6d0001u /* "mm": bootstrap tag of the per-collective exchange */
#define MAX_GROUPS_SHOWN 4

int ncclxMismatchState;

int mismatchReadConfig(void) {
  int on = 0;
  if (ncclxConfigLoad() != ncclxSuccess || ncclxConfigGetBool("core", "check_mismatch", 0, &on) != ncclxSuccess)
    on = 0; /* the configuration error itself was logged and fails communicator init */
  __atomic_store_n(&ncclxMismatchState, on ? 2 : 1, __ATOMIC_RELAXED);
  if (on) INFO(NCCLX_LOG_INIT | NCCLX_LOG_COLL, "check_mismatch: ranks compare every collective's arguments before it runs");
  return on;
}

void mismatchResetConfig(void) { __atomic_store_n(&ncclxMismatchState, 0, __ATOMIC_RELAXED); }

/* What every rank sends: fixed-width fields, no padding, same layout on every rank. */
typedef struct {
  uint64_t seq;
  uint64_t hash;
  uint64_t count;
  int32_t coll, dtype, op, root;
} CallRecord;
_Static_assert(sizeof(CallRecord) == 40, "CallRecord is a wire format");

static int hasOp(int coll) {
  return coll == NCCLX_COLL_ALLREDUCE || coll == NCCLX_COLL_REDUCE || coll == NCCLX_COLL_REDUCESCATTER;
}
static int hasRoot(int coll) { return coll == NCCLX_COLL_BROADCAST || coll == NCCLX_COLL_REDUCE; }
/* Alltoallv counts legitimately differ per rank; a barrier has none. */
static int hasCount(int coll) { return coll != NCCLX_COLL_ALLTOALLV && coll != NCCLX_COLL_BARRIER; }

static CallRecord recordOf(const ncclxCollArgs* a, uint64_t seq) {
  CallRecord r = {.seq = seq,
                  .count = hasCount(a->coll) ? a->count : 0,
                  .coll = (int32_t)a->coll,
                  .dtype = a->coll == NCCLX_COLL_BARRIER ? -1 : (int32_t)a->datatype,
                  .op = hasOp(a->coll) ? (int32_t)a->op : -1,
                  .root = hasRoot(a->coll) ? a->root : -1};
  return r;
}

static uint64_t mix(uint64_t h, uint64_t v) {
  h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
  h ^= h >> 31;
  h *= 0xbf58476d1ce4e5b9ull;
  return h ^ (h >> 29);
}

static uint64_t hashRecord(const CallRecord* r) {
  uint64_t h = mix(0x6e63636c786d6d31ull, (uint64_t)(uint32_t)r->coll);
  h = mix(h, r->count);
  h = mix(h, (uint64_t)(uint32_t)r->dtype);
  h = mix(h, (uint64_t)(uint32_t)r->op);
  return mix(h, (uint64_t)(uint32_t)r->root);
}

uint64_t mismatchHash(const ncclxCollArgs* a) {
  CallRecord r = recordOf(a, 0);
  return hashRecord(&r);
}

/* ---------- the message ---------- */

typedef struct {
  const CallRecord* rec; /* the first member's record */
  int size;
} Group;

static void appendf(char* buf, size_t size, const char* fmt, ...) __attribute__((format(printf, 3, 4)));
static void appendf(char* buf, size_t size, const char* fmt, ...) {
  size_t len = strlen(buf);
  if (len + 1 >= size) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf + len, size - len, fmt, ap);
  va_end(ap);
}

/* "rank 3" or "ranks 0-2, 5": the members of group g. */
static void appendRanks(char* buf, size_t size, const int* groupOf, int n, int g) {
  int count = 0;
  for (int r = 0; r < n; r++) count += groupOf[r] == g;
  appendf(buf, size, "%s", count == 1 ? "rank " : "ranks ");
  int first = 1;
  for (int r = 0; r < n; r++) {
    if (groupOf[r] != g) continue;
    int end = r;
    while (end + 1 < n && groupOf[end + 1] == g) end++;
    appendf(buf, size, "%s%d", first ? "" : ", ", r);
    if (end == r + 1) appendf(buf, size, ", %d", end);
    else if (end > r + 1) appendf(buf, size, "-%d", end);
    first = 0;
    r = end;
  }
}

/* "broadcast (count 262144 float32, root 0)" */
static void appendCall(char* buf, size_t size, const CallRecord* r, uint64_t mySeq) {
  appendf(buf, size, "%s (", ncclxCollName(r->coll));
  const char* sep = "";
  if (hasCount(r->coll)) {
    appendf(buf, size, "count %llu %s", (unsigned long long)r->count, ncclxTypeName((ncclxDataType_t)r->dtype));
    sep = ", ";
  } else if (r->dtype >= 0) {
    appendf(buf, size, "%s", ncclxTypeName((ncclxDataType_t)r->dtype));
    sep = ", ";
  }
  if (r->op >= 0) appendf(buf, size, "%s%s", sep, ncclxOpName((ncclxRedOp_t)r->op)), sep = ", ";
  if (r->root >= 0) appendf(buf, size, "%sroot %d", sep, r->root);
  appendf(buf, size, ")");
  if (r->seq != mySeq) appendf(buf, size, " as its collective #%llu", (unsigned long long)r->seq);
}

/* "the count and the root" */
static void appendDiff(char* buf, size_t size, const CallRecord* a, const CallRecord* b) {
  const char* what[5];
  int n = 0;
  if (a->coll != b->coll) what[n++] = "the collective";
  if (a->count != b->count) what[n++] = "the count";
  if (a->dtype != b->dtype) what[n++] = "the datatype";
  if (a->op != b->op && a->coll == b->coll) what[n++] = "the reduction op";
  if (a->root != b->root && a->coll == b->coll) what[n++] = "the root";
  if (a->seq != b->seq) what[n++] = "the sequence number";
  for (int i = 0; i < n; i++) appendf(buf, size, "%s%s", i == 0 ? "" : i == n - 1 ? " and " : ", ", what[i]);
}

static void describe(char* msg, size_t size, const struct ncclxComm* comm, const CallRecord* all,
                     const int* groupOf, const Group* groups, int ngroups, uint64_t seq) {
  int n = comm->nranks, major = -1;
  for (int g = 0; g < ngroups; g++) {
    int unique = 1;
    for (int h = 0; h < ngroups; h++) unique &= h == g || groups[h].size < groups[g].size;
    if (unique) major = g;
  }
  msg[0] = '\0';
  appendf(msg, size, "mismatched collective #%llu on comm %s (check_mismatch): ", (unsigned long long)seq,
          comm->name);
  int shown = 0;
  for (int g = 0; g < ngroups && shown < MAX_GROUPS_SHOWN; g++) {
    if (g == major) continue;
    appendf(msg, size, "%s", shown ? "; " : "");
    appendRanks(msg, size, groupOf, n, g);
    appendf(msg, size, " called ");
    appendCall(msg, size, groups[g].rec, seq);
    shown++;
  }
  if (ngroups - (major >= 0) > shown) appendf(msg, size, "; and %d more variants", ngroups - (major >= 0) - shown);
  if (major >= 0) {
    appendf(msg, size, " where ");
    appendRanks(msg, size, groupOf, n, major);
    appendf(msg, size, " called ");
    appendCall(msg, size, groups[major].rec, seq);
    const CallRecord* odd = groups[major == 0 ? 1 : 0].rec;
    appendf(msg, size, " (they differ in ");
    appendDiff(msg, size, odd, groups[major].rec);
    appendf(msg, size, ")");
  } else {
    appendf(msg, size, " (no majority: the ranks split into %d groups)", ngroups);
  }
  (void)all;
}

/* ---------- the check ---------- */

ncclxResult_t mismatchCheck(struct ncclxComm* comm, const ncclxCollArgs* a, uint64_t seq) {
  int n = comm->nranks;
  if (n <= 1) return ncclxSuccess;
  CallRecord* all = calloc((size_t)n, sizeof(*all));
  if (!all) return commSetError(comm, ncclxSystemError, "check_mismatch: out of memory for %d records", n);
  CallRecord mine = recordOf(a, seq);
  mine.hash = hashRecord(&mine);
  all[comm->rank] = mine;
  ncclxResult_t res = bootstrapAllGather(comm->bootstrap, all, sizeof(*all), TAG_MISMATCH);
  if (res != ncclxSuccess) {
    res = commFail(comm, res, "check_mismatch: exchanging the arguments of %s #%llu failed: %s",
                   ncclxCollName(a->coll), (unsigned long long)seq, ncclxThreadLastError());
    free(all);
    return res;
  }
  int agree = 1;
  for (int r = 0; r < n && agree; r++) agree = all[r].hash == mine.hash && all[r].seq == seq;
  if (agree) {
    free(all);
    return ncclxSuccess;
  }
  /* Group identical calls; every rank computes the same groups from the same table. */
  int* groupOf = malloc(sizeof(int) * (size_t)n);
  Group* groups = calloc((size_t)n, sizeof(*groups));
  if (!groupOf || !groups) {
    free(all), free(groupOf), free(groups);
    return commSetError(comm, ncclxInvalidUsage, "mismatched collective #%llu (check_mismatch); out of memory "
                        "describing it", (unsigned long long)seq);
  }
  int ngroups = 0;
  for (int r = 0; r < n; r++) {
    int g = 0;
    while (g < ngroups && !(groups[g].rec->hash == all[r].hash && groups[g].rec->seq == all[r].seq)) g++;
    if (g == ngroups) groups[ngroups++].rec = &all[r];
    groups[g].size++;
    groupOf[r] = g;
  }
  char msg[900];
  describe(msg, sizeof(msg), comm, all, groupOf, groups, ngroups, seq);
  free(groupOf), free(groups), free(all);
  /* Every rank saw the same table and fails the same way: no abort notice needed. */
  return commSetError(comm, ncclxInvalidUsage, "%s", msg);
}
