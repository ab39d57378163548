/* The rules tuner's internal model: one parsed rule, the parser, the name tables and the
 * matcher. Nothing here is exported from the .so (built with -fvisibility=hidden). */
#ifndef NCCLX_TUNER_RULES_H
#define NCCLX_TUNER_RULES_H

#include <stdatomic.h>
#include <stddef.h>

#include "ncclx/tuner.h"

/* A wildcard in the hosts and ranks fields. */
#define RULES_ANY (-1)
/* Protocol field "any": the cheapest runnable protocol of the rule's algorithm. */
#define RULES_PROTO_ANY (-1)
/* Bounds of the chunk and channel fields (0 = leave it to the core). The chunk range is the
 * one [core] chunk_bytes accepts. */
#define RULES_CHUNK_MIN ((size_t)4 << 10)
#define RULES_CHUNK_MAX ((size_t)1 << 30)
#define RULES_CHANNELS_MAX 64
/* Fields of a rule, in order. */
#define RULES_NUM_FIELDS 9

typedef struct {
  int coll;              /* ncclxCollType_t */
  size_t minBytes;       /* inclusive */
  size_t maxBytes;       /* inclusive */
  int algo;              /* ncclxAlgo_t */
  int proto;             /* ncclxProto_t or RULES_PROTO_ANY */
  size_t chunkBytes;     /* 0: the core's default */
  int nChannels;         /* 0: the core's default */
  int nhosts;            /* RULES_ANY or >= 1 */
  int nranks;            /* RULES_ANY or >= 1 */
  char* where;           /* "file:line" or "ini-where (key)", for every message */
  atomic_int logged;     /* the first match has been logged at INFO */
} Rule;

/* ---- names (rules_names.c): a private copy of the core's tables, see tuner.h ---- */
const char* rulesCollName(int coll);
const char* rulesAlgoName(int algo); /* NULL for an index without an algorithm */
const char* rulesProtoName(int proto);
int rulesLookupColl(const char* name);  /* -1 if unknown; case-insensitive */
int rulesLookupAlgo(const char* name);
int rulesLookupProto(const char* name);
/* "a, b, c" lists of the valid names, for error messages. */
void rulesListColls(char* buf, size_t size);
void rulesListAlgos(char* buf, size_t size);
void rulesListProtos(char* buf, size_t size);

/* ---- parsing (rules_parse.c) ---- */
/* Parses one rule's text (comment already removed) into *r (where and logged untouched).
 * Returns 0, or -1 with the reason in err. */
int rulesParse(const char* text, Rule* r, char* err, size_t errSize);
/* Removes a '#' comment and surrounding blanks in place; returns the trimmed start. */
char* rulesStripComment(char* line);

/* ---- matching (rules_match.c) ---- */
/* First rule that matches the query, or NULL (not const: the caller marks it logged). */
Rule* rulesFind(Rule* rules, int n, const ncclxTunerQuery_v1_t* q);
/* The earlier rule that matches every call rule j matches, or NULL. */
const Rule* rulesShadowedBy(const Rule* rules, int j);
/* Forces rule r's choice in costTable (never reviving an IGNORE entry) and passes back its
 * chunk and channels. Returns the protocol forced, or -1 when no protocol of the rule's
 * algorithm can run this call (the table is then unchanged). */
int rulesApply(const Rule* r, float* costTable, size_t* chunkBytes, int* nChannels);

/* ---- logging (rules_log.c) ---- */
/* env->log with "tuner rules: " in front of the message. */
void rulesLog(const ncclxPluginEnv_t* env, ncclxLogLevel_t level, unsigned long subsys,
              const char* fmt, ...) __attribute__((format(printf, 4, 5)));

/* ---- loading (rules_load.c) ---- */
typedef struct {
  Rule* rules;
  int n, cap;
} RuleSet;
/* Reads the [tuner.rules] keys rule<N> (by N) then the file named by `file`, validates
 * every rule and logs each problem at WARN with its file:line. Returns ncclxInvalidUsage
 * when any rule is invalid, the file cannot be read or a key value is bad;
 * ncclxSystemError when out of memory. The set is empty (and freed) on error. */
ncclxResult_t rulesLoad(RuleSet* set, const ncclxPluginEnv_t* env);
void rulesFree(RuleSet* set);

#endif
