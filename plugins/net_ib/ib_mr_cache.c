/* Registration cache rules (see ib_mr_cache.h). A flat array: with the default idleMax = 0 it
 * holds only the registrations in use (a few per comm), and idleMax is capped at 4096. */
#include "ib_mr_cache.h"

#include <stdlib.h>
#include <string.h>

void ibMrCacheInit(ibMrCache* c, size_t pageSize, int idleMax, ibMrDeregFn dereg, void* arg) {
  memset(c, 0, sizeof(*c));
  c->pageSize = pageSize ? (uintptr_t)pageSize : 4096;
  c->idleMax = idleMax < 0 ? 0 : idleMax;
  c->dereg = dereg;
  c->deregArg = arg;
}

static void removeAt(ibMrCache* c, int i, int evicted) {
  ibMrEntry* e = c->v[i];
  if (e->refs == 0) c->nidle--;
  if (evicted) c->evictions++;
  if (c->dereg) c->dereg(c->deregArg, e->reg);
  free(e);
  c->v[i] = c->v[--c->n];
}

int ibMrCacheFini(ibMrCache* c) {
  int busy = 0;
  while (c->n > 0) {
    busy += c->v[c->n - 1]->refs > 0;
    removeAt(c, c->n - 1, 0);
  }
  free(c->v);
  c->v = NULL;
  c->cap = 0;
  return busy;
}

void ibMrPageRange(const ibMrCache* c, const void* data, size_t size, uintptr_t* start,
                   uintptr_t* end) {
  uintptr_t a = (uintptr_t)data, mask = c->pageSize - 1;
  *start = a & ~mask;
  *end = (a + size + mask) & ~mask;
}

static int covers(const ibMrEntry* e, uintptr_t s, uintptr_t t, int access) {
  return e->start <= s && t <= e->end && (e->access & access) == access;
}

int ibMrEntryCovers(const ibMrEntry* e, const void* data, size_t size) {
  uintptr_t a = (uintptr_t)data;
  if (size == 0) return 1;
  if (a + size < a) return 0;
  return e->start <= a && a + size <= e->end;
}

ibMrEntry* ibMrCacheFind(ibMrCache* c, const void* data, size_t size, int access) {
  uintptr_t s, t;
  ibMrPageRange(c, data, size, &s, &t);
  ibMrEntry* best = NULL;
  for (int i = 0; i < c->n; i++) {
    ibMrEntry* e = c->v[i];
    if (!covers(e, s, t, access)) continue;
    /* Prefer an entry already in use: idle ones then stay evictable. */
    if (!best || (best->refs == 0 && e->refs > 0)) best = e;
  }
  if (!best) {
    c->misses++;
    return NULL;
  }
  c->hits++;
  if (best->refs++ == 0) c->nidle--;
  best->lastUse = ++c->tick;
  return best;
}

void ibMrCacheMissRange(const ibMrCache* c, const void* data, size_t size, int access,
                        uintptr_t* start, uintptr_t* end) {
  ibMrPageRange(c, data, size, start, end);
  if (c->idleMax == 0) return; /* no reuse expected: do not pay for registering more */
  /* Grow until stable: absorbing one entry may make the range touch another. */
  for (int changed = 1; changed;) {
    changed = 0;
    for (int i = 0; i < c->n; i++) {
      const ibMrEntry* e = c->v[i];
      if (e->access != access || e->end < *start || e->start > *end) continue;
      if (e->start < *start) *start = e->start, changed = 1;
      if (e->end > *end) *end = e->end, changed = 1;
    }
  }
}

static void evictIdle(ibMrCache* c) {
  while (c->nidle > c->idleMax) {
    int lru = -1;
    for (int i = 0; i < c->n; i++)
      if (c->v[i]->refs == 0 && (lru < 0 || c->v[i]->lastUse < c->v[lru]->lastUse)) lru = i;
    if (lru < 0) return;
    removeAt(c, lru, 1);
  }
}

ibMrEntry* ibMrCacheInsert(ibMrCache* c, uintptr_t start, uintptr_t end, int access, void* reg) {
  if (c->n == c->cap) {
    int cap = c->cap ? 2 * c->cap : 16;
    ibMrEntry** v = realloc(c->v, (size_t)cap * sizeof(*v));
    if (!v) return NULL;
    c->v = v;
    c->cap = cap;
  }
  ibMrEntry* e = calloc(1, sizeof(*e));
  if (!e) return NULL;
  e->start = start;
  e->end = end;
  e->access = access;
  e->refs = 1;
  e->lastUse = ++c->tick;
  e->reg = reg;
  /* Idle entries the new one covers are redundant now. */
  for (int i = 0; i < c->n;) {
    if (c->v[i]->refs == 0 && covers(e, c->v[i]->start, c->v[i]->end, c->v[i]->access))
      removeAt(c, i, 1);
    else
      i++;
  }
  c->v[c->n++] = e;
  return e;
}

void ibMrCacheRelease(ibMrCache* c, ibMrEntry* e) {
  int i = 0;
  while (i < c->n && c->v[i] != e) i++;
  if (i == c->n || e->refs <= 0) return; /* not ours or already idle: the caller checks Owns */
  if (--e->refs > 0) return;
  c->nidle++;
  int redundant = 0;
  for (int j = 0; j < c->n && !redundant; j++)
    redundant = j != i && covers(c->v[j], e->start, e->end, e->access);
  if (redundant || c->idleMax == 0) {
    removeAt(c, i, 0);
    return;
  }
  evictIdle(c);
}

int ibMrCacheOwns(const ibMrCache* c, const ibMrEntry* e) {
  for (int i = 0; i < c->n; i++)
    if (c->v[i] == e) return e->refs > 0;
  return 0;
}
