/* Gathers the rules of one communicator from [tuner.rules]: keys rule<N> in the order of N,
 * then the lines of the file named by `file`. Every problem is logged with its file:line;
 * any invalid rule makes the whole load fail (a half-applied rules file would tune some
 * calls and silently not others). */
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "rules.h"

typedef struct {
  long number;        /* N of rule<N> */
  int order;          /* position in the section, to keep equal numbers stable */
  const char* value;
  const char* where;
  const char* key;
} RuleKey;

static int compareRuleKeys(const void* a, const void* b) {
  const RuleKey *x = a, *y = b;
  if (x->number != y->number) return x->number < y->number ? -1 : 1;
  return x->order - y->order;
}

/* rule<digits> -> its number; -1 for a key that starts with "rule" but is not of that form;
 * -2 for any other key. */
static long ruleNumber(const char* key) {
  if (strncasecmp(key, "rule", 4) != 0) return -2;
  const char* d = key + 4;
  if (!*d || strlen(d) > 9) return -1;
  for (const char* p = d; *p; p++)
    if (!isdigit((unsigned char)*p)) return -1;
  return strtol(d, NULL, 10);
}

static int pushRule(RuleSet* set, const Rule* r, const char* where) {
  if (set->n == set->cap) {
    int cap = set->cap ? 2 * set->cap : 16;
    Rule* grown = realloc(set->rules, (size_t)cap * sizeof(Rule));
    if (!grown) return -1;
    set->rules = grown;
    set->cap = cap;
  }
  Rule* dst = &set->rules[set->n];
  *dst = *r;
  dst->where = strdup(where);
  if (!dst->where) return -1;
  atomic_init(&dst->logged, 0);
  set->n++;
  return 0;
}

/* Parses one rule; a bad one is logged and counted in *errors. -1 only when out of memory. */
static int addRule(RuleSet* set, const ncclxPluginEnv_t* env, const char* text,
                   const char* where, int* errors) {
  Rule r;
  memset(&r, 0, sizeof(r));
  char err[512];
  if (rulesParse(text, &r, err, sizeof(err)) != 0) {
    /* Quote at most 200 characters, so the reason always fits in the message. */
    rulesLog(env, NCCLX_LOG_WARN, NCCLX_LOG_ALL, "%s: invalid rule '%.200s%s': %s", where, text,
             strlen(text) > 200 ? "..." : "", err);
    (*errors)++;
    return 0;
  }
  return pushRule(set, &r, where);
}

/* The rule<N> keys of the section, sorted. Unknown keys are warnings; "rule" keys with a bad
 * number are errors (the user meant a rule that would otherwise be lost). */
static int loadKeys(RuleSet* set, const ncclxPluginEnv_t* env, const char** fileWhere,
                    int* errors) {
  RuleKey* keys = NULL;
  int nkeys = 0, cap = 0;
  const char *key, *value, *where;
  for (int i = 0; env->config->entry(env->section, i, &key, &value, &where); i++) {
    if (strcasecmp(key, "file") == 0) {
      *fileWhere = where;
      continue;
    }
    long number = ruleNumber(key);
    if (number == -2) {
      rulesLog(env, NCCLX_LOG_WARN, NCCLX_LOG_ALL,
               "%s: unknown key '%s' in [tuner.rules] ignored (known: file, rule<N>)", where, key);
      continue;
    }
    if (number == -1) {
      rulesLog(env, NCCLX_LOG_WARN, NCCLX_LOG_ALL,
               "%s: invalid key '%s': a rule key is 'rule' followed by a number (rule1, rule20)",
               where, key);
      (*errors)++;
      continue;
    }
    if (nkeys == cap) {
      cap = cap ? 2 * cap : 16;
      RuleKey* grown = realloc(keys, (size_t)cap * sizeof(*keys));
      if (!grown) {
        free(keys);
        return -1;
      }
      keys = grown;
    }
    keys[nkeys] = (RuleKey){number, nkeys, value ? value : "", where, key};
    nkeys++;
  }
  if (nkeys) qsort(keys, (size_t)nkeys, sizeof(*keys), compareRuleKeys);

  int rc = 0;
  for (int i = 0; i < nkeys && rc == 0; i++) {
    char text[1024], whereKey[512];
    snprintf(text, sizeof(text), "%s", keys[i].value);
    char* body = rulesStripComment(text);
    snprintf(whereKey, sizeof(whereKey), "%s (%s)", keys[i].where, keys[i].key);
    if (!*body) {
      /* An empty value switches a rule off, e.g. NCCLX_TUNER_RULES_RULE3= for one run. */
      rulesLog(env, NCCLX_LOG_INFO, NCCLX_LOG_TUNING, "%s: empty, rule disabled", whereKey);
      continue;
    }
    rc = addRule(set, env, body, whereKey, errors);
  }
  free(keys);
  return rc;
}

/* The rules file: one rule per line, '#' starts a comment, blank lines are skipped. */
static int loadFile(RuleSet* set, const ncclxPluginEnv_t* env, const char* path,
                    const char* fileWhere, int* errors) {
  FILE* f = fopen(path, "r");
  if (!f) {
    rulesLog(env, NCCLX_LOG_WARN, NCCLX_LOG_ALL, "%s: [tuner.rules] file = '%s': cannot open: %s",
             fileWhere, path, strerror(errno));
    (*errors)++;
    return 0;
  }
  char* line = NULL;
  size_t size = 0;
  int rc = 0;
  for (long lineNo = 1; rc == 0 && getline(&line, &size, f) >= 0; lineNo++) {
    char* body = rulesStripComment(line);
    if (!*body) continue;
    char where[4200];
    snprintf(where, sizeof(where), "%s:%ld", path, lineNo);
    rc = addRule(set, env, body, where, errors);
  }
  if (rc == 0 && ferror(f)) {
    rulesLog(env, NCCLX_LOG_WARN, NCCLX_LOG_ALL, "%s: read error: %s", path, strerror(errno));
    (*errors)++;
  }
  free(line);
  fclose(f);
  return rc;
}

/* Rules that can never match are almost always an ordering mistake: say so. */
static void warnShadowed(const RuleSet* set, const ncclxPluginEnv_t* env) {
  for (int j = 1; j < set->n; j++) {
    const Rule* by = rulesShadowedBy(set->rules, j);
    if (by)
      rulesLog(env, NCCLX_LOG_WARN, NCCLX_LOG_ALL,
               "%s: rule never used: the earlier rule at %s matches every call it matches "
               "(first match wins)",
               set->rules[j].where, by->where);
  }
}

void rulesFree(RuleSet* set) {
  for (int i = 0; i < set->n; i++) free(set->rules[i].where);
  free(set->rules);
  set->rules = NULL;
  set->n = set->cap = 0;
}

ncclxResult_t rulesLoad(RuleSet* set, const ncclxPluginEnv_t* env) {
  memset(set, 0, sizeof(*set));
  int errors = 0;
  const char* fileWhere = "[tuner.rules] file";
  if (loadKeys(set, env, &fileWhere, &errors) != 0) goto oom;
  int fromKeys = set->n;
  const char* path = env->config->get(env->section, "file");
  if (path && *path && loadFile(set, env, path, fileWhere, &errors) != 0) goto oom;

  if (errors) {
    rulesLog(env, NCCLX_LOG_WARN, NCCLX_LOG_ALL,
             "%d error(s) in [tuner.rules]%s%s; the rules tuner is not used", errors,
             path && *path ? " or " : "", path && *path ? path : "");
    rulesFree(set);
    return ncclxInvalidUsage;
  }
  warnShadowed(set, env);
  if (set->n == 0)
    rulesLog(env, NCCLX_LOG_WARN, NCCLX_LOG_ALL,
             "no rules (set [tuner.rules] file = PATH or rule1 = ...); every call keeps the "
             "default choice");
  else
    rulesLog(env, NCCLX_LOG_INFO, NCCLX_LOG_TUNING | NCCLX_LOG_INIT,
             "%d rule(s): %d from [tuner.rules] keys, %d from %s", set->n, fromKeys,
             set->n - fromKeys, path && *path ? path : "a file (none set)");
  return ncclxSuccess;

oom:
  rulesLog(env, NCCLX_LOG_WARN, NCCLX_LOG_ALL, "out of memory while loading the rules");
  rulesFree(set);
  return ncclxSystemError;
}
