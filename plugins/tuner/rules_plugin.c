/* The "rules" tuner: forces the algorithm, protocol, chunk size and channel count of the
 * calls that match a user's rule, and leaves every other call to the core's cost model.
 * See docs/tuning.md for the rule format. */
#include <stdio.h>
#include <stdlib.h>

#include "rules.h"

typedef struct {
  RuleSet set;
  /* A copy: the core passes init an env that lives on its stack. The logger and config
   * pointers inside it stay valid for the process. */
  ncclxPluginEnv_t env;
} RulesCtx;

static ncclxResult_t rulesInit(void** ctx, const ncclxTunerCommInfo_v1_t* info,
                               const ncclxPluginEnv_t* env) {
  (void)info; /* rules match on the query's nranks and nhosts, which come with every call */
  if (!ctx || !env || env->version < 1 || !env->log || !env->config) return ncclxInvalidArgument;
  *ctx = NULL;
  RulesCtx* c = calloc(1, sizeof(*c));
  if (!c) return ncclxSystemError;
  ncclxResult_t res = rulesLoad(&c->set, env);
  if (res != ncclxSuccess) {
    free(c);
    return res;
  }
  c->env = *env;
  *ctx = c;
  return ncclxSuccess;
}

static void logMatch(const RulesCtx* c, Rule* r, const ncclxTunerQuery_v1_t* q, int proto) {
  const ncclxPluginEnv_t* env = &c->env;
  if (atomic_load_explicit(&r->logged, memory_order_relaxed)) {
    /* Every later match: straight to the core's logger, which checks the level before it
     * formats anything, so a call with TRACE off costs no formatting. */
    env->log(NCCLX_LOG_TRACE, NCCLX_LOG_TUNING, __FILE__, __LINE__,
             "tuner rules: rule %s matches %s %zu bytes nranks %d nhosts %d: %s/%s", r->where,
             rulesCollName(q->coll), q->bytes, q->nranks, q->nhosts, rulesAlgoName(r->algo),
             proto < 0 ? "(cannot run: default kept)" : rulesProtoName(proto));
    return;
  }
  char what[160];
  snprintf(what, sizeof(what), "%s %zu bytes nranks %d nhosts %d", rulesCollName(q->coll),
           q->bytes, q->nranks, q->nhosts);
  /* The first match of each rule at INFO, every match at TRACE: a training loop makes the
   * same call millions of times. */
  int first = atomic_exchange(&r->logged, 1) == 0;
  ncclxLogLevel_t level = first ? NCCLX_LOG_INFO : NCCLX_LOG_TRACE;
  if (proto < 0)
    rulesLog(env, level, NCCLX_LOG_TUNING,
             "rule %s matches %s, but %s/%s cannot run this call; default choice kept%s",
             r->where, what, rulesAlgoName(r->algo),
             r->proto == RULES_PROTO_ANY ? "any" : rulesProtoName(r->proto),
             first ? " (logged once per rule)" : "");
  else
    rulesLog(env, level, NCCLX_LOG_TUNING, "rule %s matches %s: %s/%s chunk %zu channels %d%s",
             r->where, what, rulesAlgoName(r->algo), rulesProtoName(proto), r->chunkBytes,
             r->nChannels, first ? " (0 = core default; logged once per rule)" : "");
}

/* Always ncclxSuccess: a call without a matching rule simply keeps the core's table. */
static ncclxResult_t rulesGetCollInfo(void* ctx, const ncclxTunerQuery_v1_t* query,
                                      float* costTable, size_t* chunkBytes, int* nChannels) {
  RulesCtx* c = ctx;
  if (!c || !query || !costTable || !chunkBytes || !nChannels) return ncclxSuccess;
  Rule* r = rulesFind(c->set.rules, c->set.n, query);
  if (!r) return ncclxSuccess;
  int proto = rulesApply(r, costTable, chunkBytes, nChannels);
  logMatch(c, r, query, proto);
  return ncclxSuccess;
}

static ncclxResult_t rulesFinalize(void* ctx) {
  RulesCtx* c = ctx;
  if (!c) return ncclxSuccess;
  rulesFree(&c->set);
  free(c);
  return ncclxSuccess;
}

__attribute__((visibility("default"))) const ncclxTuner_v1_t ncclxTunerPlugin_v1 = {
    .name = "rules",
    .abiVersion = NCCLX_TUNER_ABI_VERSION,
    .init = rulesInit,
    .getCollInfo = rulesGetCollInfo,
    .finalize = rulesFinalize,
};
