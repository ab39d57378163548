/* Memory-registration cache of one device (protection domain), without verbs: a registration
 * is an opaque pointer and deregistering it is a callback, so the rules are unit-tested.
 *
 * - Entries cover page-aligned address ranges [start, end) with an access level. A lookup hits
 *   an entry that covers the whole requested range with at least the requested access.
 * - Entries are reference counted: regMr and every in-flight transfer that registered
 *   internally (NULL mhandle) hold one reference.
 * - An entry whose count drops to zero is deregistered at once when idleMax is 0 (the safe
 *   default: a cached registration keeps pinning the old pages after the application frees
 *   and re-maps the memory). With idleMax > 0, up to idleMax unreferenced entries stay for
 *   reuse, the least recently used is evicted first, and a miss registers the union with
 *   overlapping or adjacent entries so a buffer sent in chunks converges to one registration.
 * - An unreferenced entry fully covered by another is redundant and deregistered.
 * Not thread-safe: the device's lock guards it. */
#ifndef NCCLX_IB_MR_CACHE_H
#define NCCLX_IB_MR_CACHE_H

#include "ib_common.h"

enum { IB_MR_LOCAL = 0, IB_MR_REMOTE_WRITE = 1 }; /* access levels; REMOTE_WRITE >= LOCAL */

typedef struct {
  uintptr_t start, end;
  int access;
  int refs;
  uint64_t lastUse;
  void* reg;  /* the registration (struct ibv_mr*) */
} ibMrEntry;

typedef void (*ibMrDeregFn)(void* arg, void* reg);

typedef struct {
  ibMrEntry** v;
  int n, cap;
  int idleMax, nidle;
  uint64_t tick;
  uintptr_t pageSize;
  ibMrDeregFn dereg;
  void* deregArg;
  uint64_t hits, misses, evictions;
} ibMrCache;

void ibMrCacheInit(ibMrCache* c, size_t pageSize, int idleMax, ibMrDeregFn dereg, void* arg);
/* Deregisters every entry, referenced or not; returns how many were still referenced. */
int ibMrCacheFini(ibMrCache* c);

/* Page-aligned range of [data, data + size). size > 0 and no address overflow required. */
void ibMrPageRange(const ibMrCache* c, const void* data, size_t size, uintptr_t* start,
                   uintptr_t* end);
/* A covering entry with enough access, its count raised; NULL on a miss. */
ibMrEntry* ibMrCacheFind(ibMrCache* c, const void* data, size_t size, int access);
/* On a miss: the range to register (see above). */
void ibMrCacheMissRange(const ibMrCache* c, const void* data, size_t size, int access,
                        uintptr_t* start, uintptr_t* end);
/* Adds a new registration with one reference. NULL when out of memory (then the caller still
 * owns reg). */
ibMrEntry* ibMrCacheInsert(ibMrCache* c, uintptr_t start, uintptr_t end, int access, void* reg);
/* Drops one reference; may deregister the entry or evict idle ones. */
void ibMrCacheRelease(ibMrCache* c, ibMrEntry* e);

/* 1 when e is a live entry of c (to check an mhandle handed back by the core). */
int ibMrCacheOwns(const ibMrCache* c, const ibMrEntry* e);
int ibMrEntryCovers(const ibMrEntry* e, const void* data, size_t size);

#endif
