/* Bootstrap views: a child communicator shares its parent's bootstrap state (connections,
 * queues, address table) with its own rank map and a tag space stamped into every header.
 * The state is reference counted by its views. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "bootstrap/bootstrap_internal.h"
#include "util/debug.h"

struct bootstrap* bsViewAlloc(struct bootstrapRoot* r, int rank, int nranks, uint64_t tagSpace) {
  struct bootstrap* b = calloc(1, sizeof(*b));
  if (!b) return NULL;
  b->rootRanks = malloc(sizeof(int) * (size_t)nranks);
  if (!b->rootRanks) {
    free(b);
    return NULL;
  }
  b->root = r;
  b->rank = rank;
  b->nranks = nranks;
  b->tagSpace = tagSpace;
  return b;
}

void bsViewFree(struct bootstrap* b) {
  if (!b) return;
  free(b->rootRanks);
  free(b);
}

ncclxResult_t bootstrapView(struct bootstrap* parent, const int* parentRanks, int nranks, int myRank,
                            uint64_t tagSpace, struct bootstrap** out) {
  if (out == NULL) return ncclxSetError(ncclxInvalidArgument, "bootstrap view: output pointer is NULL");
  *out = NULL;
  if (parent == NULL || parentRanks == NULL)
    return ncclxSetError(ncclxInvalidArgument, "bootstrap view: NULL %s", parent ? "rank list" : "parent");
  if (nranks < 1 || nranks > parent->nranks || myRank < 0 || myRank >= nranks)
    return ncclxSetError(ncclxInvalidArgument, "bootstrap view: %d ranks with my rank %d over a parent of %d ranks",
                         nranks, myRank, parent->nranks);
  if (parentRanks[myRank] != parent->rank)
    return ncclxSetError(ncclxInvalidArgument,
                         "bootstrap view: rank %d of the view maps to parent rank %d, but this is parent rank %d",
                         myRank, parentRanks[myRank], parent->rank);
  if (tagSpace == ROOT_TAG_SPACE)
    return ncclxSetError(ncclxInvalidArgument, "bootstrap view: tag space %llu is reserved for the root",
                         (unsigned long long)tagSpace);
  char* seen = calloc((size_t)parent->nranks, 1);
  if (!seen) return ncclxSetError(ncclxSystemError, "bootstrap view: out of memory");
  for (int i = 0; i < nranks; i++) {
    int p = parentRanks[i];
    if (p < 0 || p >= parent->nranks || seen[p]) {
      free(seen);
      return ncclxSetError(ncclxInvalidArgument, "bootstrap view: entry %d (parent rank %d) is %s", i, p,
                           p < 0 || p >= parent->nranks ? "out of range" : "a duplicate");
    }
    seen[p] = 1;
  }
  free(seen);
  struct bootstrapRoot* r = parent->root;
  struct bootstrap* v = bsViewAlloc(r, myRank, nranks, tagSpace);
  if (!v) return ncclxSetError(ncclxSystemError, "bootstrap view: out of memory");
  for (int i = 0; i < nranks; i++) v->rootRanks[i] = parent->rootRanks[parentRanks[i]];

  pthread_mutex_lock(&r->lock);
  for (struct bootstrap* o = r->views; o; o = o->nextView) {
    if (o->tagSpace != tagSpace) continue;
    pthread_mutex_unlock(&r->lock);
    free(v->rootRanks);
    free(v);
    return ncclxSetError(ncclxInvalidUsage, "bootstrap view: tag space 0x%llx is already used by a live view",
                         (unsigned long long)tagSpace);
  }
  v->nextView = r->views;
  r->views = v;
  r->refs++;
  pthread_mutex_unlock(&r->lock);
  INFO(NCCLX_LOG_BOOTSTRAP, "bootstrap: view 0x%llx of %d ranks, rank %d (root rank %d)", (unsigned long long)tagSpace,
       nranks, myRank, r->rank);
  *out = v;
  return ncclxSuccess;
}

void bootstrapRelease(struct bootstrap* b) {
  if (!b) return;
  struct bootstrapRoot* r = b->root;
  pthread_mutex_lock(&r->lock);
  for (struct bootstrap** p = &r->views; *p; p = &(*p)->nextView)
    if (*p == b) {
      *p = b->nextView;
      break;
    }
  /* Nobody can receive this view's leftovers any more. */
  bsPurgeTagSpace(r, b->tagSpace);
  bsFreeNotes(r, &b->tagSpace);
  int last = --r->refs == 0;
  pthread_mutex_unlock(&r->lock);
  free(b->rootRanks);
  free(b);
  if (last) bsRootFree(r);
}

int bootstrapRank(const struct bootstrap* b) { return b ? b->rank : -1; }
int bootstrapNranks(const struct bootstrap* b) { return b ? b->nranks : 0; }

void bootstrapGetStats(struct bootstrap* b, struct bootstrapStats* out) {
  if (!out) return;
  memset(out, 0, sizeof(*out));
  if (!b) return;
  pthread_mutex_lock(&b->root->lock);
  *out = b->root->stats;
  pthread_mutex_unlock(&b->root->lock);
}
