/* Wait notes: small unordered messages a rank sends to the ranks it has been waiting for (see
 * waitnote.c for what they say). Only the latest note from each source is kept per view, so a
 * rank that never reads them holds at most one per peer. */
#include <stdlib.h>
#include <string.h>

#include "bootstrap/bootstrap_internal.h"

void bsRecordNote(struct bootstrapRoot* r, struct message* m) {
  pthread_mutex_lock(&r->abortLock);
  struct noteEntry* e = r->notes;
  while (e && !(e->tagSpace == m->tagSpace && e->src == m->src)) e = e->next;
  if (!e && (e = calloc(1, sizeof(*e))) != NULL) {
    e->tagSpace = m->tagSpace;
    e->src = m->src;
    e->next = r->notes;
    r->notes = e;
  }
  if (e) {
    e->size = m->size; /* checkHeader: at most MAX_NOTE_BYTES */
    e->arrived = bsNow();
    memcpy(e->data, m->data, m->size);
  }
  pthread_mutex_unlock(&r->abortLock);
  free(m);
}

void bsFreeNotes(struct bootstrapRoot* r, const uint64_t* tagSpace) {
  pthread_mutex_lock(&r->abortLock);
  for (struct noteEntry** p = &r->notes; *p;) {
    struct noteEntry* e = *p;
    if (tagSpace && e->tagSpace != *tagSpace) {
      p = &e->next;
      continue;
    }
    *p = e->next;
    free(e);
  }
  pthread_mutex_unlock(&r->abortLock);
}

size_t bootstrapReadNote(struct bootstrap* b, int peer, void* note, size_t size, double* ageSec) {
  if (b == NULL || peer < 0 || peer >= b->nranks) return 0;
  struct bootstrapRoot* r = b->root;
  int src = b->rootRanks[peer];
  size_t got = 0;
  pthread_mutex_lock(&r->abortLock);
  for (struct noteEntry* e = r->notes; e; e = e->next) {
    if (e->tagSpace != b->tagSpace || e->src != src) continue;
    got = e->size < size ? e->size : size;
    memcpy(note, e->data, got);
    if (ageSec) *ageSec = bsNow() - e->arrived;
    break;
  }
  pthread_mutex_unlock(&r->abortLock);
  return got;
}
