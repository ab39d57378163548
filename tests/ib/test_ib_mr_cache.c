/* Registration cache: page ranges, hits on covering entries, access levels, reference
 * counts, immediate deregistration by default, idle caching with LRU eviction, merging of
 * overlapping and adjacent ranges, and finalize. Registrations are fake tokens; the
 * deregistration callback records what was released. */
#include <string.h>

#include "ib_mr_cache.h"
#include "ib_test.h"

#define PAGE 4096u

static int deregs;
static uintptr_t lastDereg;
static void fakeDereg(void* arg, void* reg) {
  (void)arg;
  deregs++;
  lastDereg = (uintptr_t)reg;
}

/* What the plugin does: find, else register the miss range (a fake token) and insert. */
static ibMrEntry* acquire(ibMrCache* c, uintptr_t addr, size_t size, int access, int* registered) {
  ibMrEntry* e = ibMrCacheFind(c, (void*)addr, size, access);
  *registered = 0;
  if (e) return e;
  uintptr_t s, t;
  ibMrCacheMissRange(c, (void*)addr, size, access, &s, &t);
  *registered = 1;
  return ibMrCacheInsert(c, s, t, access, (void*)(s ^ 0x5a5a));
}

static void testPageRange(void) {
  ibMrCache c;
  ibMrCacheInit(&c, PAGE, 0, fakeDereg, NULL);
  uintptr_t s, t;
  ibMrPageRange(&c, (void*)(uintptr_t)(10 * PAGE + 5), 1, &s, &t);
  CHECK(s == 10 * PAGE && t == 11 * PAGE);
  ibMrPageRange(&c, (void*)(uintptr_t)(10 * PAGE), PAGE, &s, &t);
  CHECK(s == 10 * PAGE && t == 11 * PAGE);
  ibMrPageRange(&c, (void*)(uintptr_t)(10 * PAGE + PAGE - 1), 2, &s, &t);
  CHECK(s == 10 * PAGE && t == 12 * PAGE);
  ibMrCacheFini(&c);
}

static void testDefaultNoIdle(void) {
  ibMrCache c;
  deregs = 0;
  ibMrCacheInit(&c, PAGE, 0, fakeDereg, NULL);
  int reg;
  ibMrEntry* a = acquire(&c, 100 * PAGE + 8, 3 * PAGE, IB_MR_LOCAL, &reg);
  CHECK(a && reg && a->start == 100 * PAGE && a->end == 104 * PAGE && a->refs == 1);
  /* Inside the same pages: a hit, the count rises. */
  ibMrEntry* b = acquire(&c, 101 * PAGE, 100, IB_MR_LOCAL, &reg);
  CHECK(b == a && !reg && a->refs == 2 && c.hits == 1);
  /* Crossing the end: a miss, no merge with idle caching off. */
  ibMrEntry* d = acquire(&c, 103 * PAGE, 2 * PAGE, IB_MR_LOCAL, &reg);
  CHECK(d && d != a && reg && d->start == 103 * PAGE && d->end == 105 * PAGE);
  /* A remote-write request does not match local-only entries... */
  ibMrEntry* w = acquire(&c, 101 * PAGE, 10, IB_MR_REMOTE_WRITE, &reg);
  CHECK(w && w != a && reg && w->access == IB_MR_REMOTE_WRITE);
  /* ...but a local request is served by a remote-write entry (it is a superset). */
  ibMrEntry* l = acquire(&c, 101 * PAGE, 10, IB_MR_LOCAL, &reg);
  CHECK(!reg && (l == a || l == w));
  CHECK(ibMrCacheOwns(&c, a) && ibMrCacheOwns(&c, d) && !ibMrCacheOwns(&c, (ibMrEntry*)&c));
  /* Releasing to zero deregisters at once. */
  ibMrCacheRelease(&c, l);
  ibMrCacheRelease(&c, b);
  CHECK(deregs == 0 && a->refs == 1);
  ibMrCacheRelease(&c, a);
  CHECK(deregs == 1 && lastDereg == ((100 * PAGE) ^ 0x5a5a) && !ibMrCacheOwns(&c, a));
  ibMrCacheRelease(&c, d);
  ibMrCacheRelease(&c, w);
  CHECK(deregs == 3 && c.n == 0 && c.nidle == 0);
  CHECK(ibMrCacheFini(&c) == 0 && deregs == 3);
}

static void testIdleAndEviction(void) {
  ibMrCache c;
  deregs = 0;
  ibMrCacheInit(&c, PAGE, 2, fakeDereg, NULL);
  int reg;
  ibMrEntry* e1 = acquire(&c, 1000 * PAGE, PAGE, IB_MR_LOCAL, &reg);
  ibMrEntry* e2 = acquire(&c, 2000 * PAGE, PAGE, IB_MR_LOCAL, &reg);
  ibMrEntry* e3 = acquire(&c, 3000 * PAGE, PAGE, IB_MR_LOCAL, &reg);
  ibMrCacheRelease(&c, e1);
  ibMrCacheRelease(&c, e2);
  CHECK(deregs == 0 && c.nidle == 2);
  /* Reuse of an idle entry: no registration. */
  ibMrEntry* again = acquire(&c, 1000 * PAGE + 64, 64, IB_MR_LOCAL, &reg);
  CHECK(again == e1 && !reg && c.nidle == 1);
  ibMrCacheRelease(&c, again); /* e1 idle again, now most recently used */
  ibMrCacheRelease(&c, e3);    /* third idle entry: the least recently used (e2) goes */
  CHECK(deregs == 1 && lastDereg == ((2000 * PAGE) ^ 0x5a5a) && c.nidle == 2 && c.evictions == 1);
  CHECK(!ibMrCacheOwns(&c, e2));
  /* Busy entries are never evicted. */
  ibMrEntry* busy[4];
  for (int i = 0; i < 4; i++) busy[i] = acquire(&c, (uintptr_t)(5000 + 10 * i) * PAGE, PAGE, IB_MR_LOCAL, &reg);
  CHECK(c.n == 6 && c.nidle == 2 && deregs == 1);
  for (int i = 0; i < 4; i++) ibMrCacheRelease(&c, busy[i]);
  CHECK(c.nidle == 2 && deregs == 5);
  CHECK(ibMrCacheFini(&c) == 0 && deregs == 7);
}

static void testMerge(void) {
  ibMrCache c;
  deregs = 0;
  ibMrCacheInit(&c, PAGE, 8, fakeDereg, NULL);
  int reg;
  /* A buffer sent in chunks: each miss registers the union, the older idle pieces go. */
  ibMrEntry* a = acquire(&c, 100 * PAGE, 2 * PAGE, IB_MR_LOCAL, &reg);
  ibMrCacheRelease(&c, a);
  ibMrEntry* b = acquire(&c, 102 * PAGE, 2 * PAGE, IB_MR_LOCAL, &reg); /* adjacent */
  CHECK(reg && b->start == 100 * PAGE && b->end == 104 * PAGE);
  CHECK(deregs == 1 && c.n == 1); /* a was covered by b and idle: deregistered */
  ibMrEntry* d = acquire(&c, 103 * PAGE, 3 * PAGE, IB_MR_LOCAL, &reg); /* overlaps b, b busy */
  CHECK(reg && d->start == 100 * PAGE && d->end == 106 * PAGE && c.n == 2);
  /* b is busy, so it stays until released; then it is redundant and goes at once. */
  ibMrCacheRelease(&c, b);
  CHECK(deregs == 2 && c.n == 1 && c.nidle == 0);
  ibMrCacheRelease(&c, d);
  CHECK(c.nidle == 1);
  /* The whole buffer is one registration now. */
  ibMrEntry* e = acquire(&c, 100 * PAGE + 1, 6 * PAGE - 2, IB_MR_LOCAL, &reg);
  CHECK(e == d && !reg);
  ibMrCacheRelease(&c, e);
  /* Different access levels are not merged; disjoint ranges are not merged. */
  ibMrEntry* w = acquire(&c, 104 * PAGE, 4 * PAGE, IB_MR_REMOTE_WRITE, &reg);
  CHECK(reg && w->start == 104 * PAGE && w->end == 108 * PAGE);
  ibMrEntry* far = acquire(&c, 200 * PAGE, PAGE, IB_MR_LOCAL, &reg);
  CHECK(reg && far->start == 200 * PAGE && far->end == 201 * PAGE);
  /* Finalize reports what is still referenced and deregisters everything. */
  int before = deregs;
  CHECK(ibMrCacheFini(&c) == 2 && deregs == before + 3);
}

static void testCovers(void) {
  ibMrEntry e;
  memset(&e, 0, sizeof(e));
  e.start = 10 * PAGE;
  e.end = 12 * PAGE;
  CHECK(ibMrEntryCovers(&e, (void*)(uintptr_t)(10 * PAGE), 2 * PAGE));
  CHECK(!ibMrEntryCovers(&e, (void*)(uintptr_t)(10 * PAGE), 2 * PAGE + 1));
  CHECK(!ibMrEntryCovers(&e, (void*)(uintptr_t)(10 * PAGE - 1), 2));
  CHECK(ibMrEntryCovers(&e, (void*)(uintptr_t)0, 0));
  CHECK(!ibMrEntryCovers(&e, (void*)(uintptr_t)(UINTPTR_MAX - 5), 10)); /* wraps */
}

int main(void) {
  testPageRange();
  testDefaultNoIdle();
  testIdleAndEviction();
  testMerge();
  testCovers();
  return ibTestResult("test_ib_mr_cache");
}
