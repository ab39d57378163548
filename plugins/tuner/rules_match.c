/* Which rule applies to a call, which rules can never apply, and what a rule does to the
 * core's cost table. */
#include "rules.h"

static int countMatches(int want, int have) { return want == RULES_ANY || want == have; }

Rule* rulesFind(Rule* rules, int n, const ncclxTunerQuery_v1_t* q) {
  for (int i = 0; i < n; i++) {
    Rule* r = &rules[i];
    if ((int)q->coll == r->coll && q->bytes >= r->minBytes && q->bytes <= r->maxBytes &&
        countMatches(r->nhosts, q->nhosts) && countMatches(r->nranks, q->nranks))
      return r;
  }
  return NULL;
}

/* Rule a matches every call rule b matches: same collective, a's size range covers b's,
 * and a's hosts and ranks are wildcards or equal to b's. */
static int covers(const Rule* a, const Rule* b) {
  return a->coll == b->coll && a->minBytes <= b->minBytes && a->maxBytes >= b->maxBytes &&
         (a->nhosts == RULES_ANY || a->nhosts == b->nhosts) &&
         (a->nranks == RULES_ANY || a->nranks == b->nranks);
}

const Rule* rulesShadowedBy(const Rule* rules, int j) {
  for (int i = 0; i < j; i++)
    if (covers(&rules[i], &rules[j])) return &rules[i];
  return NULL;
}

int rulesApply(const Rule* r, float* costTable, size_t* chunkBytes, int* nChannels) {
  float* row = costTable + (size_t)r->algo * NCCLX_NUM_PROTOS;
  int proto = -1;
  if (r->proto != RULES_PROTO_ANY) {
    if (row[r->proto] >= 0.0f) proto = r->proto;
  } else {
    /* "any": the protocol the core's model already prefers for this algorithm. */
    for (int p = 0; p < NCCLX_NUM_PROTOS; p++)
      if (row[p] >= 0.0f && (proto < 0 || row[p] < row[proto])) proto = p;
  }
  if (proto < 0) return -1; /* never revive an IGNORE entry */
  /* The core takes the first of equal costs; nudge any other free entry (a 1-rank
   * communicator costs 0 for ring) so the rule's choice is the only cheapest one. */
  for (int i = 0; i < NCCLX_NUM_ALGOS * NCCLX_NUM_PROTOS; i++)
    if (costTable[i] == 0.0f) costTable[i] = 1e-3f;
  row[proto] = 0.0f;
  if (r->chunkBytes) *chunkBytes = r->chunkBytes;
  if (r->nChannels) *nChannels = r->nChannels;
  return proto;
}
