/* Names of collectives, algorithms and protocols as rules spell them. A plugin cannot call
 * ncclxAlgoName() and friends (it is loaded RTLD_LOCAL and does not link libncclx), so this
 * is a copy of core/src/coll_select.c's tables, indexed by the enums of ncclx/tuner.h. The
 * unit test checks it against the core's. */
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "rules.h"

static const char* const collNames[NCCLX_NUM_COLLS] = {
    [NCCLX_COLL_BROADCAST] = "broadcast",     [NCCLX_COLL_REDUCE] = "reduce",
    [NCCLX_COLL_ALLGATHER] = "allgather",     [NCCLX_COLL_REDUCESCATTER] = "reducescatter",
    [NCCLX_COLL_ALLREDUCE] = "allreduce",     [NCCLX_COLL_ALLTOALL] = "alltoall",
    [NCCLX_COLL_ALLTOALLV] = "alltoallv",     [NCCLX_COLL_BARRIER] = "barrier",
};

static const char* const algoNames[NCCLX_NUM_ALGOS] = {
    [NCCLX_ALGO_RING] = "ring",
    [NCCLX_ALGO_RECURSIVE_DOUBLING] = "recursive_doubling",
    [NCCLX_ALGO_RABENSEIFNER] = "rabenseifner",
    [NCCLX_ALGO_TREE] = "tree",
    [NCCLX_ALGO_BRUCK] = "bruck",
    [NCCLX_ALGO_PAIRWISE] = "pairwise",
    [NCCLX_ALGO_LINEAR] = "linear",
    [NCCLX_ALGO_HIERARCHICAL] = "hierarchical",
};

static const char* const protoNames[NCCLX_NUM_PROTOS] = {
    [NCCLX_PROTO_SIMPLE] = "simple",
    [NCCLX_PROTO_LL] = "ll",
};

static const char* nameAt(const char* const* names, int n, int i) {
  return i >= 0 && i < n ? names[i] : NULL;
}

const char* rulesCollName(int coll) { return nameAt(collNames, NCCLX_NUM_COLLS, coll); }
const char* rulesAlgoName(int algo) { return nameAt(algoNames, NCCLX_NUM_ALGOS, algo); }
const char* rulesProtoName(int proto) { return nameAt(protoNames, NCCLX_NUM_PROTOS, proto); }

static int lookup(const char* const* names, int n, const char* s) {
  for (int i = 0; i < n; i++)
    if (names[i] && strcasecmp(names[i], s) == 0) return i;
  return -1;
}

int rulesLookupColl(const char* s) { return lookup(collNames, NCCLX_NUM_COLLS, s); }
int rulesLookupAlgo(const char* s) { return lookup(algoNames, NCCLX_NUM_ALGOS, s); }
int rulesLookupProto(const char* s) { return lookup(protoNames, NCCLX_NUM_PROTOS, s); }

static void list(const char* const* names, int n, char* buf, size_t size) {
  size_t len = 0;
  if (size) buf[0] = '\0';
  for (int i = 0; i < n && len + 1 < size; i++) {
    if (!names[i]) continue;
    int w = snprintf(buf + len, size - len, "%s%s", len ? ", " : "", names[i]);
    if (w < 0) break;
    len += (size_t)w;
  }
}

void rulesListColls(char* buf, size_t size) { list(collNames, NCCLX_NUM_COLLS, buf, size); }
void rulesListAlgos(char* buf, size_t size) { list(algoNames, NCCLX_NUM_ALGOS, buf, size); }
void rulesListProtos(char* buf, size_t size) { list(protoNames, NCCLX_NUM_PROTOS, buf, size); }
